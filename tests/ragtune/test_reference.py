"""The lax reference computed group by group (kernels.reference, ragtune.device.reference):
equal to jax.lax.ragged_dot and its vjp, kernels.quant's to the dequantized lax.ragged_dot;
memory near the operands' and output's and FLOPs near the problem's at Mixtral's and
DeepSeek-V3 prefill's sizes (XLA's memory analysis of the compiled loop, nothing run), for
the reference, the check and the inputs' draw, within limits.bytes_needed; XLA's own
ragged_dot refused with the bytes it needs where its dense fallback does not fit; and sweep,
verify and bench checking a 256-group problem on a device whose memory holds the operands
many times over but not g times lhs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiler_missing
from typer.testing import CliRunner

import kernels
from kernels import quant
from kernels import reference as kref
from ragtune.cli.app import app
from ragtune.device import measure, numerics, reference, xla_fit
from ragtune.lut import bench
from ragtune.problems import limits
from ragtune.problems.shapes import GroupDist, Problem
from ragtune.records import store
from ragtune.run import devices

runner = CliRunner()
HI = jax.lax.Precision.HIGHEST
NO_H100_COMPILE = compiler_missing("h100")
# (m, k, n, g) of Mixtral-8x7B's prefill up projection and DeepSeek-V3's (shapes/anchors.yaml).
MIXTRAL = (8192, 4096, 14336, 8)
DSV3 = (131072, 7168, 2048, 256)
SIZES = {
  "empty+sum<m": (0, 17, 0, 30, 1, 20),  # 68 of 96 rows routed
  "one-group": (0, 0, 96, 0, 0, 0),
}


def _lax(op, lhs, rhs, dout, gs):
  """jax.lax.ragged_dot, or the cotangent `op` names, in float32 at HIGHEST."""
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  fwd = lambda a, b: jax.lax.ragged_dot(a, b, jnp.asarray(gs, jnp.int32), precision=HI)
  if op == "fwd":
    return np.asarray(fwd(f32(lhs), f32(rhs)))
  _, vjp = jax.vjp(fwd, f32(lhs), f32(rhs))
  return np.asarray(vjp(f32(dout))[0 if op == "dlhs" else 1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_equals_lax_ragged_dot_and_its_vjp(dtype):
  """Fresh random operands, empty groups, rows past sum(group_sizes), one group holding every
  row; the output left on the device."""
  m, k, n = 96, 24, 40
  rng = np.random.default_rng()
  dt = jnp.dtype(dtype)
  for name, sizes in SIZES.items():
    gs = np.asarray(sizes, np.int32)
    lhs, dout = (jnp.asarray(rng.standard_normal(s, np.float32), dt) for s in ((m, k), (m, n)))
    rhs = jnp.asarray(rng.standard_normal((len(gs), k, n), np.float32), dt)
    for op in kernels.common.OPS:
      got = reference.ragged_dot(op, lhs, rhs, dout, gs)
      assert isinstance(got, jax.Array)
      got = np.asarray(got)
      want = _lax(op, lhs, rhs, dout, gs)
      assert got.dtype == np.float32 and got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{name} {op}")
      if op == "drhs":
        assert not got[gs == 0].any(), "an empty group's gradient is 0"
      else:
        assert not got[gs.sum() :].any(), "rows past sum(group_sizes) are 0"


def test_one_compile_per_shape_whatever_the_routing():
  m, k, n, g = 64, 8, 16, 4
  x = {"lhs": jnp.ones((m, k)), "rhs": jnp.ones((g, k, n)), "dout": jnp.ones((m, n))}
  reference.ragged_dot("fwd", *x.values(), np.array([64, 0, 0, 0]))
  before = kref._compiled.cache_info()
  for sizes in ([1, 2, 3, 58], [0, 0, 0, 40], [16, 16, 16, 16]):
    reference.ragged_dot("fwd", *x.values(), np.array(sizes))
  after = kref._compiled.cache_info()
  assert (after.misses, after.hits) == (before.misses, before.hits + 3)


def _dequantized_lax(lq, rq, gs, ls, rs, transpose_rhs):
  """The dequantized operands through lax.ragged_dot (g times the work): the sum and the
  error scale kernels.quant computes group by group."""
  a, b = quant.dequantize(lq, rq, ls, rs, transpose_rhs=transpose_rhs)
  b = b.swapaxes(1, 2) if transpose_rhs else b
  dot = lambda x, w: np.asarray(jax.lax.ragged_dot(x, w, gs, precision=HI))
  return dot(a, b), np.sqrt(dot(a * a, b * b))


@pytest.mark.parametrize(
  ("fmt", "transpose_rhs"),
  [("float8_e4m3fn:channelwise", True), ("float8_e4m3fn:block128", False), ("int8:block128", True)],
)
def test_quantized_equals_the_dequantized_lax_ragged_dot(fmt, transpose_rhs, monkeypatch):
  """kernels.quant.reference and error_scale, and ragtune's quantized reference (one loop for
  both), equal lax.ragged_dot of the dequantized operands, which they never call (it takes
  g times the work and memory)."""
  m, k, n = 80, 200, 136  # k and n off the 128-blocks
  rng = np.random.default_rng()
  lq, rq, ls, rs = quant.quantize_operands(
    rng.standard_normal((m, k), np.float32), rng.standard_normal((3, k, n), np.float32), fmt
  )
  rq = rq.swapaxes(1, 2) if transpose_rhs else rq
  args = (lq, rq, jnp.asarray([30, 0, 41], jnp.int32), ls, rs)
  want, want_scale = _dequantized_lax(*args, transpose_rhs)

  def no_ragged_dot(*a, **kw):
    raise AssertionError("lax.ragged_dot called")

  monkeypatch.setattr(jax.lax, "ragged_dot", no_ragged_dot)
  value, squares = reference.quantized(*args, transpose_rhs=transpose_rhs)
  layout = dict(transpose_rhs=transpose_rhs)
  for v, s in ((value, jnp.sqrt(squares)), (quant.reference(*args, **layout), quant.error_scale(*args, **layout))):
    np.testing.assert_allclose(np.asarray(v), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(np.asarray(s), want_scale, rtol=1e-5)


@pytest.mark.parametrize("dist", ["multinomial", "zipf+empty", "one-group"])
def test_work_is_the_problem_s_even_when_one_group_holds_every_row(dist):
  """DeepSeek-V3 prefill's routings: the rows the tiles compute are within 1.5 m (lax's
  lowering: g m = 256 m), and every routing fills tables of one length (one compile)."""
  m, k, n, g = DSV3
  if dist == "one-group":
    sizes = np.zeros(g, np.int32)
    sizes[7] = m
  else:
    sizes = GroupDist(dist=dist.split("+")[0], seed=3, empty_fraction=0.25 if "empty" in dist else 0.0).draw(m, g)
  p = kref.plan(sizes, m)
  rows = p.count * p.rows
  assert sizes.sum() <= rows <= min(1.5 * m, sizes.sum() + g * p.rows)
  assert p.length == kref.plan(np.full(g, m // g), m).length and p.count <= p.length


def _program(op, m, k, n, g, target=None):
  """The bytes of the reference's compiled loop at these sizes, in bf16 (shapes only, nothing
  run), for this CPU or, deviceless, for `target`; and the bound it must keep: the operands,
  its float32 output and two of one group's weights in float32 (drhs: a tile's product and
  the output's group it adds to)."""
  bf = jnp.bfloat16
  shapes = {"lhs": (m, k), "rhs": (g, k, n), "dout": (m, n)}
  x = {name: jax.ShapeDtypeStruct(s, bf) for name, s in shapes.items()}
  prog = kref.ragged_dot_program(op, x["lhs"], x["rhs"], x["dout"], np.full(g, m // g))
  used = ("lhs", "dout") if op == "drhs" else ("lhs" if op == "fwd" else "dout", "rhs")
  out = {"fwd": m * n, "dlhs": m * k, "drhs": g * k * n}[op]
  bound = sum(2 * int(np.prod(shapes[name])) for name in used) + 4 * out + 8 * k * n + (16 << 20)
  if target is None:
    return reference.program_bytes(prog.compiled), bound
  from ragtune.deviceless import aot

  body = kref.BODIES[op]
  statics = dict(rows=kref.tile_rows(m, g), **({"groups": g} if op == "drhs" else {}))
  operands = [(a.shape, a.dtype) for a in prog.args[: len(used)]]
  table, count = (prog.args[-2].shape, jnp.int32), ((), jnp.int32)
  report = aot.compile_fn(target, functools.partial(body, **statics), *operands, table, count, expect_kernel=False)
  assert report.ok, report.error
  return report.memory.argument + report.memory.output + report.memory.temp, bound


# What the old reference (lax.ragged_dot of the operands cast to f32, HIGHEST) compiled to, from
# XLA's memory analysis of a deviceless H100 build (arguments + output + temporaries, GB):
# Mixtral fwd 2.6, dlhs 6.0, drhs 7.0; DeepSeek-V3 prefill fwd 972, dlhs 294, drhs 1254. The
# loop, its float32 output kept on the device: DeepSeek-V3 prefill fwd 10.5, dlhs 11.8, drhs 17.5
# (the output of drhs, [256,7168,2048] in float32, is 15 GB).
@pytest.mark.parametrize("op", kernels.common.OPS)
@pytest.mark.parametrize("shape", [MIXTRAL, DSV3], ids=["mixtral", "deepseek-v3"])
def test_memory_near_the_operands_at_real_sizes(op, shape):
  """The compiled loop holds the operands, its float32 output and a tile's temporaries, at
  most two of one group's weights in float32. lax's own lowering adds g times lhs
  (DeepSeek-V3 prefill: 481 GB in bf16; Mixtral: 0.5 GB)."""
  need, bound = _program(op, *shape)
  assert need <= bound, (need, bound)


@pytest.mark.skipif(NO_H100_COMPILE is not None, reason=str(NO_H100_COMPILE))
def test_memory_near_the_operands_on_a_deviceless_h100():
  """The same bound where bf16 dots are native: XLA's GPU compiler, for an H100, from this host."""
  for op in kernels.common.OPS:
    need, bound = _program(op, *DSV3, target="h100")
    assert need <= bound, (op, need, bound)


def _temp(compiled) -> int:
  return compiled.memory_analysis().temp_size_in_bytes


def _nbytes(a) -> int:
  return int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize


@pytest.mark.parametrize(
  ("op", "dtype"), [("fwd", "bfloat16"), ("drhs", "bfloat16"), ("fwd", "float8_e4m3fn:block128")]
)
def test_bytes_needed_is_what_the_draw_the_reference_and_the_check_hold(op, dtype):
  """limits.held against XLA's memory analysis (compiled, nothing run) of what each stage of a
  problem's check runs: the inputs' draws, the reference's loop and the check, each operand
  past one step's slice (limits.STEP_ELEMENTS); within 30% over the largest stage."""
  m, k, n, g = 8192, 1024, 2048, 16
  p = Problem(op, "xla", dtype, m, k, n, g, "explicit", (m // g,) * g)
  x = jax.eval_shape(lambda: measure.make_inputs(p))
  inputs = sum(_nbytes(a) for name, a in x.items() if name != "group_sizes")
  specs = tuple(measure.draws(p).values())
  draw = _temp(
    measure._draw_all.lower(jax.random.split(jax.random.key(0), len(specs)), specs, measure.DRAW_CHUNK).compile()
  )
  gs = np.full(g, m // g)
  if "lhs_scale" in x:
    prog = quant.reference_program(x["lhs"], x["rhs"], gs, x["lhs_scale"], x["rhs_scale"], transpose_rhs=True)
  else:
    prog = kref.ragged_dot_program(op, x["lhs"], x["rhs"], x["dout"], gs)
  ref = prog.compiled.memory_analysis().output_size_in_bytes  # the value (and a quantized format's bound)
  out = {"fwd": (m, n), "drhs": (g, k, n)}[op]  # as the kernel gives it: drhs [g, k, n], reshaped in the check
  out_dtype = measure.out_dtype(p)
  atol = jax.ShapeDtypeStruct(out, jnp.float32) if "lhs_scale" in x else jax.ShapeDtypeStruct((), jnp.float32)
  check = numerics._reduce.lower(
    jax.ShapeDtypeStruct(out, jnp.float32),
    jax.ShapeDtypeStruct(out, out_dtype),
    atol,
    jax.ShapeDtypeStruct((), jnp.float32),
    region_grid=(2, 2),
    default_atol="lhs_scale" not in x,
  ).compile()
  stages = {
    "draw": inputs + draw,
    "reference": inputs + ref + _temp(prog.compiled),
    "check": inputs + ref + int(np.prod(out)) * jnp.dtype(out_dtype).itemsize + _temp(check),
  }
  held = limits.held(op, dtype, m, k, n, g)
  for stage, need in stages.items():
    assert need <= held[stage], (stage, need, held)
  assert max(stages.values()) <= limits.bytes_needed(op, dtype, m, k, n, g) <= 1.3 * max(stages.values()), stages


def test_inputs_drawn_a_slice_at_a_time_in_their_dtype(monkeypatch):
  """The same values whatever the slice (make_inputs's values are a problem's, not its
  slicing's), rhs scaled by 1/sqrt(k); at DeepSeek-V3 prefill the draw of rhs holds the
  operand in bf16 and under 0.5 GB more (drawing it in float32 first took 15 GB)."""
  p = Problem("fwd", "xla", "bfloat16", 96, 200, 136, 3, "explicit", (30, 0, 66))
  whole = measure.make_inputs(p)
  monkeypatch.setattr(measure, "DRAW_CHUNK", 7 * 200)
  sliced = measure.make_inputs(p)
  for name, a in whole.items():
    assert a.dtype == sliced[name].dtype and np.array_equal(np.asarray(a), np.asarray(sliced[name])), name
  assert whole["lhs"].dtype == jnp.bfloat16
  assert abs(float(jnp.std(whole["rhs"].astype(jnp.float32))) * 200**0.5 - 1) < 0.05
  assert not np.array_equal(np.asarray(whole["lhs"]), np.asarray(measure.make_inputs(p, salt="other")["lhs"]))
  monkeypatch.undo()
  m, k, n, g = DSV3
  big = Problem("fwd", "xla", "bfloat16", m, k, n, g, "explicit", (m // g,) * g)
  compiled = measure._draw_all.lower(
    jax.random.key(0)[None], (measure.draws(big)["rhs"],), measure.DRAW_CHUNK
  ).compile()
  mem = compiled.memory_analysis()
  assert mem.output_size_in_bytes == 2 * g * k * n and mem.temp_size_in_bytes < 0.5e9, mem


def test_a_reference_over_the_device_memory_is_refused_with_its_bytes(monkeypatch):
  rng = np.random.default_rng()
  x = {
    name: rng.standard_normal(s, np.float32) for name, s in (("lhs", (256, 16)), ("rhs", (4, 16, 8)), ("dout", (8,)))
  }
  x["group_sizes"] = np.full(4, 64, np.int32)
  monkeypatch.setenv(limits.MEMORY_ENV, "10000")
  assert limits.device_memory_bytes() == 10_000
  with pytest.raises(reference.DoesNotFit, match=r"needs [\d,]+ bytes .* more than its 10,000 bytes"):
    measure.reference("fwd", x)
  monkeypatch.setenv(limits.MEMORY_ENV, str(1 << 20))
  want = _lax("fwd", x["lhs"], x["rhs"], x["dout"], x["group_sizes"])
  got = np.asarray(measure.reference("fwd", x).value)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_xla_s_dense_fallback_is_refused_with_the_bytes_it_needs():
  m, k, n, g = 4096, 16, 16, 256
  p = Problem("drhs", "xla", "float32", m, k, n, g, "explicit", (m // g,) * g)
  assert xla_fit.probe_path(p) == "dense"  # jax's own expansion on a CPU
  need = xla_fit.dense_bytes(p)
  assert need == 4 * (m * k + m * n + g * k * n + g * m * (k + n))  # lhs and dout masked per group
  why = xla_fit.refusal(p, need - 1)
  assert why.startswith("does not fit: XLA's ragged_dot compiles here to its dense fallback")
  assert f"needs {need:,} bytes" in why and f"device's {need - 1:,} bytes" in why
  assert xla_fit.refusal(p, need) is None and xla_fit.refusal(p, None) is None


@pytest.mark.skipif(NO_H100_COMPILE is not None, reason=str(NO_H100_COMPILE))
def test_dense_bytes_is_what_xla_s_h100_compile_of_it_needs():
  """DeepSeek-V3 prefill through kernels.xla, built deviceless for an H100: XLA's memory
  analysis and xla_fit.dense_bytes agree within 5% (fwd 491 GB, drhs 628 GB)."""
  from ragtune.deviceless import aot

  m, k, n, g = DSV3
  for op in ("fwd", "drhs"):
    p = Problem(op, "xla", "bfloat16", m, k, n, g, "explicit", (m // g,) * g)
    fn = measure.build_op(p, kernels.registry.REFERENCE, None, False)
    mem = aot.compile_fn("h100", fn, *aot.op_arg_shapes(op, m, k, n, g, p.dtype), expect_kernel=False).memory
    assert 0.95 <= (mem.argument + mem.output + mem.temp) / xla_fit.dense_bytes(p) <= 1.05, (op, mem)


# A 256-group problem with m = 256 n: operands of 0.75 MiB, g times lhs 64 MiB, XLA's dense
# fallback 135 MB; the device is given 8 MiB.
M, K, N, G = 4096, 16, 16, 256
DEVICE = 8 << 20
SPEC = f"""
ops: [drhs]
dtype: float32
backends: [pallas_gpu]
max_candidates: 1
shapes:
  - {{m: {M}, k: {K}, n: {N}, g: {G}}}
"""


@pytest.fixture
def small_device(monkeypatch):
  """DEVICE bytes of device memory, for this process and the workers it starts. The device
  probe is asked once a process (cached): its answer is patched, not asked again."""
  real = devices.probe_devices()
  monkeypatch.setattr(devices, "probe_devices", lambda: dict(real, memory_bytes=DEVICE))
  monkeypatch.setenv(limits.MEMORY_ENV, str(DEVICE))


def test_sweep_verify_and_bench_check_256_groups_on_a_device_smaller_than_g_times_lhs(tmp_path, small_device):
  spec, out = tmp_path / "s.yaml", tmp_path / "results"
  spec.write_text(SPEC)
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  rows = {row.candidate: row for row in store.ResultsStore(out).rows()}
  xla = rows.pop("baseline:xla")
  assert xla.status == "too_big" and "dense fallback" in xla.error and "needs 135,004,160 bytes" in xla.error
  assert all(row.status == "ok" for row in rows.values()), [row.error for row in rows.values()]
  (checked,) = [row for row in rows.values() if not row.baseline]
  assert checked.numerics["rel_error"] < 1e-5, "checked against the reference, not skipped"

  r = runner.invoke(app, ["verify", str(out)])
  assert r.exit_code == 0 and "1 passed, 0 failed" in r.output and "4/4 draws" in r.output, r.output

  sizes = tuple(int(s) for s in GroupDist(dist="zipf", seed=1, empty_fraction=0.25).draw(M, G))
  p = Problem("drhs", "pallas_gpu", "float32", M, K, N, G, "zipf", sizes, "t")
  run = bench.Bench("cpu", False, ("pallas_gpu",), None, None, "", {}, None, 3)
  got = {row.variant: row for row in bench.bench_problem(p, run)}
  assert got[bench.XLA].status.startswith("too_big: does not fit: XLA's ragged_dot") and not got[bench.XLA].failed
  kernel = got["pallas_gpu default [interpret]"]
  assert kernel.status == "ok" and kernel.rel_error < 1e-5, kernel
