"""The Pallas TPU kernels compiled by XLA's real TPU compiler (libtpu), deviceless, on this CPU host.

ragtune.deviceless.aot compiles for a TPU by topology name (v4, v5e, v5p, v6e, v7x): Mosaic lowers each
megablox kernel and XLA's TPU compiler lays out its VMEM and the program's HBM. These tests
read the outcome (ok, VMEM or HBM exhausted, with the compiler's amounts) and the memory
analysis; they say nothing of speed.

Needs the `tpu` extra (libtpu) and JAX_PLATFORMS=cpu (conftest.py sets it on a host with no
accelerator). Skipped where either is missing, except under CI, where that is a failure.
"""

import contextlib
import importlib.util
import itertools
import json
import random

import jax
import jax.numpy as jnp
import pytest
from conftest import compiler_missing, needs_compiler
from jax.experimental import pallas as pl
from typer.testing import CliRunner

import kernels
import kernels.pallas_tpu.qgmm
from kernels import common
from kernels.pallas_tpu import config as tpu
from kernels.pallas_tpu.config import TpuConfig
from ragtune.candidates import prune, search_space
from ragtune.cli.app import app
from ragtune.deviceless import aot
from ragtune.problems import shapes
from ragtune.records import store
from ragtune.run import plan as planning
from ragtune.run.options import SweepOptions

BF16 = "bfloat16"
runner = CliRunner()


_UNAVAILABLE = "no libtpu (pip install -e '.[tpu]')" if importlib.util.find_spec("libtpu") is None else None
pytestmark = needs_compiler(_UNAVAILABLE or compiler_missing("v5e"), "deviceless TPU compile tests")

# shapes/anchors.yaml's problems: Mixtral 8x7B prefill; DeepSeek-V3 decode, prefill up and down.
ANCHORS = {
  "mixtral": (8192, 4096, 14336, 8),
  "dsv3_decode": (512, 7168, 2048, 256),
  "dsv3_up": (131072, 7168, 2048, 256),
  "dsv3_down": (131072, 2048, 7168, 256),
}
# jax's own megablox test shapes, (m, k, n): GROUPED_MATMUL_TESTS in tests/pallas/tpu_gmm_test.py
# of https://github.com/jax-ml/jax (the last one has partial tiles: k and n under 128).
MEGABLOX_TESTS = [
  (128, 128, 128),
  (256, 128, 128),
  (128, 256, 128),
  (128, 128, 256),
  (256, 128, 512),
  (512, 128, 128),
  (512, 2048, 128),
  (128, 8, 16),
]


def test_each_target_names_its_chip():
  for chip in common.CHIPS:
    assert aot.device_kind(chip.name) == chip.device_kinds[0]
    assert common.chip(aot.device_kind(chip.name)) is chip
    facts = prune.target_facts(chip.name)
    assert facts == {"platform": "tpu", "device_kind": chip.device_kinds[0], "memory_bytes": chip.hbm}
    assert aot.target_for_kind(chip.device_kinds[-1]) == chip.name
  assert aot.target_for_kind("NVIDIA H100 80GB HBM3") == "h100"


def test_v7x_by_each_spelling():
  """libtpu names v7x "tpu7x" in a topology and refuses "v7x:2x2x1"; every spelling is the one chip."""
  v7x = common.chip("TPU7x")
  for name, topology in [
    ("v7x", "tpu7x:2x2x1"),
    ("tpu7x", "tpu7x:2x2x1"),
    ("TPU7x:2x2x1", "tpu7x:2x2x1"),
    ("tpu7x:2x2", "tpu7x:2x2"),
    ("v7x:2x2x2", "tpu7x:2x2x2"),
  ]:
    t = aot.resolve_target(name)
    assert (t.name, t.platform, t.spec, t.chip) == ("v7x", "tpu", topology, v7x), name
  assert aot.device_kind("tpu7x:2x2") == aot.device_kind("v7x") == "TPU7x" and aot.target_for_kind("TPU7x") == "v7x"
  assert "v7x" in aot.target_names() and aot.resolve_target("v5e:4x4").spec == "v5e:4x4"


@pytest.mark.parametrize("anchor", list(ANCHORS))
@pytest.mark.parametrize("target", ["v5e", "v6e", "v7x"])
def test_defaults_compile_fwd_and_vjp(target, anchor):
  """kernels.ragged_dot as a model calls it, forward and vjp, with the chip's compile-verified
  defaults. Every default fits VMEM; a problem whose training step needs more HBM than the
  chip has fails as hbm_oom with the compiler's amounts, and then its forward compiles."""
  m, k, n, g = ANCHORS[anchor]
  mesh, dev = aot.target_mesh(target)
  with jax.set_mesh(mesh):
    choices = kernels.explain((m, k), (g, k, n), jnp.bfloat16, backend="pallas_tpu")
  assert {c.source for c in choices.values()} == {"compile-verified"}, choices
  for op, c in choices.items():
    assert 2 * c.config.vmem_bytes(op, BF16, m, k, n) <= common.chip(dev.device_kind).scoped_vmem, (op, c)
  r = aot.compile_ragged_dot(target, m, k, n, g, BF16, backend="pallas_tpu")
  assert r.outcome in (aot.OK, aot.HBM_OOM), f"{r.outcome}: {r.error}"
  if r.outcome == aot.HBM_OOM:
    assert r.memory.used > r.memory.limit > 0 and "HBM" in r.error, r
    r = aot.compile_ragged_dot(target, m, k, n, g, BF16, backend="pallas_tpu", vjp=False)
    assert r.ok, f"{r.outcome}: {r.error}"
  assert r.memory is not None and r.memory.argument > 0 and r.memory.output > 0, r
  assert r.kernels == () and r.seconds > 0


def _all_tilings():
  rows = (64, 128, 256, 512, 1024)
  return [TpuConfig(*t) for t in itertools.product(rows, tpu.DEFAULT_TILES, tpu.DEFAULT_TILES)]


def _space_draws(n: int = 12, seed: int = 19):
  """n (target, op, anchor, config) drawn with a fixed seed from the TPU search space of the
  anchors, on v5e and v6e."""
  rng = random.Random(seed)
  draws = []
  for i in range(n):
    target = ("v5e", "v6e")[i % 2]
    kind = prune.target_facts(target)["device_kind"]
    anchor = rng.choice(list(ANCHORS))
    op = ("fwd", "dlhs", "drhs")[i % 3]
    draws.append((target, op, anchor, rng.choice(tpu.space(op, BF16, *ANCHORS[anchor][:3], kind))))
  return draws


SPACE_DRAWS = _space_draws()


@pytest.mark.parametrize("chunk", range(4))
def test_search_space_draws_compile_or_overflow_vmem_cleanly(chunk):
  """Candidates drawn from the search space (12 in all, 3 a chunk): each compiles, or fails
  with a clean VMEM verdict naming the compiler's amounts (the static rule cannot see register
  spills). Never another error."""
  for target, op, anchor, cfg in SPACE_DRAWS[chunk::4]:
    m, k, n, g = ANCHORS[anchor]
    r = aot.compile_op(target, "pallas_tpu", op, BF16, m, k, n, g, cfg)
    assert r.outcome in (aot.OK, aot.VMEM_OOM), f"{target} {op} {anchor} {cfg}: {r.outcome}: {r.error}"
    if r.outcome == aot.VMEM_OOM:
      kind = prune.target_facts(target)["device_kind"]
      assert r.memory.used > tpu.vmem_limit(kind) >= cfg.vmem_bytes(op, BF16, m, k, n), (cfg, r.memory)
    print(f"{target} {op} {anchor} {cfg}: {r.outcome} ({r.seconds:.1f}s)")


def test_static_vmem_rule_is_a_lower_bound_the_compiler_confirms():
  """Tilings drawn (fixed seed) near the v5e and v6e VMEM bound (fwd and drhs) and v7x's (fwd),
  inside and outside the search space: a tiling the rule prunes never compiles (no false prune), and
  the compiler's need is never under the rule's figure. A kept tiling that still overflows
  (Mosaic spilled registers into VMEM) is counted."""
  rng = random.Random(7)
  m, k, n, g = ANCHORS["mixtral"]
  false_keeps = pruned = 0
  for target, op in [("v5e", "fwd"), ("v6e", "fwd"), ("v5e", "drhs"), ("v6e", "drhs"), ("v7x", "fwd")]:
    limit = tpu.vmem_limit(prune.target_facts(target)["device_kind"])
    near = [c for c in _all_tilings() if 0.75 <= c.vmem_bytes(op, BF16, m, k, n) / limit <= 1.5]
    for cfg in rng.sample(near, 1):
      rule = cfg.vmem_bytes(op, BF16, m, k, n)
      r = aot.compile_op(target, "pallas_tpu", op, BF16, m, k, n, g, cfg)
      assert r.outcome in (aot.OK, aot.VMEM_OOM), f"{target} {op} {cfg}: {r.outcome}: {r.error}"
      if rule > limit:
        pruned += 1
        assert r.outcome == aot.VMEM_OOM, f"false prune: {target} {op} {cfg} compiled, rule {rule} > {limit}"
      if r.outcome == aot.VMEM_OOM:
        assert r.memory.limit == limit and r.memory.used >= rule - (1 << 14), (target, op, cfg, rule, r.memory)
        false_keeps += rule <= limit
  print(f"rule vs compiler: {pruned} pruned, all overflow; {false_keeps} kept that overflow (spills)")
  assert pruned > 0


@pytest.mark.parametrize("i", range(len(MEGABLOX_TESTS)))
def test_megablox_test_shapes_compile_fwd_and_vjp(i):
  """jax's megablox test shapes, through kernels.ragged_dot (pallas_tpu, its defaults), fwd
  and vjp; dtype, rhs layout and chip vary across them."""
  m, k, n = MEGABLOX_TESTS[i]
  g = (1, 2, 4, 7, 16, 32)[i % 6]
  dtype = (BF16, "float32")[i % 2]
  target = ("v5e", "v6e", "v5p", "v4", "v7x")[i % 5]
  dt = jnp.dtype(dtype)
  transpose = i % 3 == 1

  def fn(lhs, rhs, gs, dout):
    f = lambda a, b: kernels.ragged_dot(a, b, gs, backend="pallas_tpu", transpose_rhs=transpose, interpret=False)
    out, pull = jax.vjp(f, lhs, rhs)
    return (out, *pull(dout))

  rhs = (g, n, k) if transpose else (g, k, n)
  r = aot.compile_fn(target, fn, ((m, k), dt), (rhs, dt), ((g,), jnp.int32), ((m, n), dt))
  assert r.ok, f"{target} {(m, k, n, g)} {dtype}: {r.outcome}: {r.error}"


TINY = "ops: [fwd]\nbackends: [pallas_gpu]\nshapes:\n  - {m: 256, k: 256, n: 256, g: 2}\n"


def _plan_compiles_every_candidate(tmp_path, target: str, kind: str):
  """`ragtune plan TINY --target target`: every candidate compiled ok for the chip of `kind`,
  with its memory; (the problem, the compile folder)."""
  spec = tmp_path / "tiny.yaml"
  spec.write_text(TINY)
  out = tmp_path / target.replace(":", "-")
  r = runner.invoke(app, ["plan", str(spec), "--target", target, "-o", str(out), "-j", "2"])
  assert r.exit_code == 0, r.output
  assert f"lists no backend for {kind}; using pallas_tpu" in r.output, r.output
  (p,) = shapes.expand(shapes.load_shape_set(spec), backends=["pallas_tpu"])
  rows = list(prune.compile_rows(out).values())
  assert len(rows) == len(search_space.candidates(p, device_kind=kind)) > 0
  assert all(x["outcome"] == aot.OK and x["device_kind"] == kind and x["memory"]["argument"] for x in rows), rows
  return p, out


def test_plan_target_tpu_compiles_every_candidate_and_a_sweep_skips_the_rejected(tmp_path, monkeypatch):
  p, out = _plan_compiles_every_candidate(tmp_path, "v5e", "TPU v5 lite")

  # A tiling the rule would never propose, compiled as a candidate: the compiler rejects it,
  # and a sweep on that chip (jax's other spelling of its kind) skips it with the reason.
  huge = TpuConfig(256, 2048, 4096)
  assert not huge.fits("fwd", BF16, 256, 256, 256, "TPU v5 lite")
  real = search_space.candidates
  monkeypatch.setattr(search_space, "candidates", lambda q, **kw: [*real(q, **kw), huge])
  counts = prune.run([p], "v5e", out, jobs=1, log=lambda msg: None)
  assert counts == {aot.VMEM_OOM: 1}, counts
  (why,) = prune.rejected(out, "TPU v5e", p).values()
  assert "vmem_oom" in why.reason and "MiB of 16.00 MiB scoped VMEM" in why.reason, why
  opts = SweepOptions(out_dir=out, budget=100, device_kind="TPU v5e", platform="tpu", interpret=False)
  task, _, _ = planning.make_task(p, opts, {}, [])
  assert task.rejected == 1 and store.candidate_id(huge) not in task.configs


def test_plan_and_verify_target_v7x(tmp_path):
  """v7x end to end: plan compiles every candidate for it (libtpu's spelling of the target),
  and verify compiles a LUT's entries, failing the one over its 32 MiB scoped VMEM."""
  _plan_compiles_every_candidate(tmp_path, "tpu7x:2x2x1", "TPU7x")

  m, k, n, g = ANCHORS["mixtral"]
  entries = [
    kernels.Entry("fwd", "pallas_tpu", BF16, m, k, n, g, tpu.default("fwd", BF16, m, k, n, g, "TPU7x")),
    kernels.Entry("dlhs", "pallas_tpu", BF16, m, k, n, g, TpuConfig(1024, 2048, 2048)),  # 40 MiB by the rule
  ]
  path = tmp_path / "lut.json"
  path.write_text(json.dumps(kernels.Lut("TPU7x", entries).to_dict()))
  r = runner.invoke(app, ["verify", str(path), "--target", "v7x", "-j", "2"], terminal_width=220)
  assert r.exit_code == 1, r.output
  assert "FAILED vmem_oom" in r.output and "of 32.00 MiB scoped VMEM" in r.output, r.output
  assert "compiled 2 of 2 entries for v7x" in r.output and "1 ok, 1 failed" in r.output, r.output


def test_compile_command_prints_the_tpu_table(tmp_path):
  spec = tmp_path / "tiny.yaml"
  spec.write_text(TINY)
  r = runner.invoke(app, ["compile", str(spec), "--target", "v6e"], terminal_width=220)
  assert r.exit_code == 0, r.output
  assert "TPU v6 lite" in r.output and "pallas_tpu" in r.output and " ok " in r.output, r.output


def test_verify_target_compiles_a_tpu_luts_entries(tmp_path):
  m, k, n, g = 8192, 4096, 14336, 8
  kind = "TPU v6 lite"
  good = tpu.default("fwd", BF16, m, k, n, g, kind)
  entries = [
    kernels.Entry("fwd", "pallas_tpu", BF16, m, k, n, g, good),
    kernels.Entry("dlhs", "pallas_tpu", BF16, m, k, n, g, TpuConfig(1024, 2048, 2048)),
    kernels.Entry("drhs", "xla", BF16, m, k, n, g, None),
  ]
  path = tmp_path / "lut.json"
  path.write_text(json.dumps(kernels.Lut(kind, entries).to_dict()))
  r = runner.invoke(app, ["verify", str(path), "--target", "v6e", "-j", "2"], terminal_width=220)
  assert r.exit_code == 1, r.output
  assert "compiles" in r.output and "FAILED vmem_oom" in r.output and "no kernel of its own" in r.output, r.output
  assert "compiled 2 of 3 entries for v6e" in r.output and "1 ok, 1 failed" in r.output, r.output
  r = runner.invoke(app, ["verify", str(path), "--target", "v5e"])
  assert r.exit_code != 0 and "tuned on 'TPU v6 lite' but --target v5e compiles for 'TPU v5 lite'" in r.output
  # auto: the LUT's own chip, under another of jax's spellings of its kind.
  path.write_text(json.dumps(kernels.Lut("TPU v6e", entries[:1]).to_dict()))
  r = runner.invoke(app, ["verify", str(path), "--target", "auto"], terminal_width=220)
  assert r.exit_code == 0 and "compiled 1 of 1 entry for v6e" in r.output, r.output


def test_explain_says_which_default_it_used():
  with jax.set_mesh(aot.target_mesh("v6e")[0]):
    c = kernels.explain((8192, 4096), (8, 4096, 14336), jnp.bfloat16, backend="pallas_tpu")["fwd"]
  assert c.source == "compile-verified" and c.config == tpu.default("fwd", BF16, 8192, 4096, 14336, 8, "TPU v6 lite")
  assert "compile-verified" in str(c)
  cpu = kernels.explain((8192, 4096), (8, 4096, 14336), jnp.bfloat16, backend="pallas_tpu")["fwd"]
  assert cpu.source == "heuristic"


def test_hbm_oom_names_the_amounts():
  r = aot.compile_ragged_dot("v5e", 65536, 7168, 2048, 256, BF16, backend="pallas_tpu")
  assert r.outcome == aot.HBM_OOM, r
  assert r.memory.used > r.memory.limit and 15 << 30 < r.memory.limit <= 16 << 30, r.memory
  assert r.error.startswith("out of HBM: needs "), r.error


def test_v7x_hbm_is_half_the_chips():
  """A v7x device is one of its chip's two TensorCores: the compiler's HBM bound (94.75 GiB
  on libtpu 0.0.42, 94.74 on 0.0.50) is a little under half the chip's 192 GiB."""
  r = aot.compile_fn("v7x", lambda x: x * 2 + 1, (((100 << 30) // 8,), jnp.float32))  # f32 in and out: 100 GiB
  assert r.outcome == aot.HBM_OOM and r.memory.used == 100 << 30, r
  assert 94 << 30 < r.memory.limit < common.chip("TPU7x").hbm, r.memory


# --- quantized operands (kernels/pallas_tpu/qgmm.py) ---------------------------------------

# DeepSeek-V3 under 32-way expert parallelism (shapes/tpu_quant.yaml): decode up and down.
DSV3_EP32_DECODE = [(16, 7168, 2048, 8), (16, 2048, 7168, 8)]
# Per chip, the formats its MXU takes natively, and one it takes converted to bf16.
QUANT_TARGETS = {
  "v5e": ("int8:channelwise", "int8:block128", "float8_e4m3fn:block128"),
  "v6e": ("int8:channelwise", "int8:block128", "float8_e4m3fn:channelwise"),
  "v7x": ("float8_e4m3fn:channelwise", "float8_e4m3fn:block128", "int8:block128"),
}


@pytest.mark.parametrize("target", list(QUANT_TARGETS))
def test_quantized_defaults_compile(target):
  """kernels.ragged_dot with scales, as a serving model calls it, with the chip's
  compile-verified defaults: DeepSeek-V3's decode shapes in each format, and Mixtral's
  prefill in the chip's channelwise one. (Each default's tiles in VMEM: test_tpu_quantized.)"""
  mesh, dev = aot.target_mesh(target)
  cases = [(shape, fmt) for fmt in QUANT_TARGETS[target] for shape in DSV3_EP32_DECODE[: 1 + fmt.endswith("block128")]]
  cases.append((ANCHORS["mixtral"], QUANT_TARGETS[target][0]))
  for (m, k, n, g), fmt in cases:
    with jax.set_mesh(mesh):
      choice = kernels.explain((m, k), (g, k, n), fmt, backend="pallas_tpu")["fwd"]
    assert choice.source == "compile-verified", choice
    assert 2 * choice.config.vmem_bytes("fwd", fmt, m, k, n) <= common.chip(dev.device_kind).scoped_vmem
    r = aot.compile_ragged_dot(target, m, k, n, g, fmt, backend="pallas_tpu")
    assert r.ok, f"{target} {fmt} {(m, k, n, g)} {choice.config}: {r.outcome}: {r.error}"
    assert r.memory.argument > k * n * g  # the 8-bit weights and their scales


def test_quantized_vmem_rule_and_tile_rows_are_the_compilers():
  """The VMEM rule on 8-bit formats: a tiling it prunes overflows with the compiler's need at
  least the rule's figure; one it keeps near the bound compiles. Mosaic's 8-bit VMEM tile of
  32 rows: tm=16 over m > 16 is refused (E2002), as layout_violation says."""
  m, k, n, g = ANCHORS["mixtral"]
  for target, fmt, cfg, fits in [
    ("v5e", "int8:channelwise", TpuConfig(1024, 4096, 1024), False),
    ("v5e", "float8_e4m3fn:block128", TpuConfig(64, 2048, 4096), False),
    ("v5e", "int8:channelwise", TpuConfig(512, 4096, 1024), True),
  ]:
    kind = prune.target_facts(target)["device_kind"]
    assert cfg.fits("fwd", fmt, m, k, n, kind) == fits
    r = aot.compile_op(target, "pallas_tpu", "fwd", fmt, m, k, n, g, cfg)
    if fits:
      assert r.ok, f"{target} {fmt} {cfg}: {r.outcome}: {r.error}"
    else:
      assert r.outcome == aot.VMEM_OOM, f"{target} {fmt} {cfg}: {r.outcome}: {r.error}"
      assert r.memory.used >= cfg.vmem_bytes("fwd", fmt, m, k, n) > tpu.vmem_limit(kind), (cfg, r.memory)
  assert TpuConfig(16, 512, 512).layout_violation("int8:channelwise", m)
  r = aot.compile_fn(
    "v6e",
    lambda a, b, s, ls, rs: kernels.pallas_tpu.qgmm.qgmm(
      a, b, s, ls, rs, config=TpuConfig(32, 512, 512), out_dtype=jnp.bfloat16, interpret=False
    ),
    ((256, 1024), jnp.int8),
    ((2, 1024, 512), jnp.int8),
    ((2,), jnp.int32),
    ((256, 1), jnp.float32),
    ((2, 1, 512), jnp.float32),
  )
  assert r.ok, r.error
  # libtpu 0.0.42 (jax 0.10) refuses a 16-row block of int8; 0.0.50 (jax 0.12) lays it out.
  # The rule keeps to the older one: it costs only 16-row int8 tiles over more rows.
  refused = contextlib.nullcontext() if jax.__version_info__ >= (0, 12) else pytest.raises(Exception, match="E2002")
  with refused:
    with jax.set_mesh(aot.target_mesh("v6e")[0]):
      specs = [jax.ShapeDtypeStruct(s, d) for s, d in [((256, 1024), jnp.int8), ((2, 1024, 512), jnp.int8)]]
      jax.jit(
        lambda a, b: pl.pallas_call(  # a [16, 512] block of an int8 [256, 1024] array
          lambda x, w, o: o.__setitem__(..., jnp.dot(x[...], w[...], preferred_element_type=jnp.int32)),
          out_shape=jax.ShapeDtypeStruct((256, 512), jnp.int32),
          grid=(16,),
          in_specs=[pl.BlockSpec((16, 1024), lambda i: (i, 0)), pl.BlockSpec((None, 1024, 512), lambda i: (0, 0, 0))],
          out_specs=pl.BlockSpec((16, 512), lambda i: (i, 0)),
        )(a, b)
      ).lower(*specs).compile()


def test_plan_target_compiles_a_quantized_space_and_v4_is_refused(tmp_path):
  spec = tmp_path / "q.yaml"
  spec.write_text("dtype: int8\nscales: block128\nops: [fwd]\nbackends: [pallas_tpu]\nshapes:\n")
  spec.write_text(spec.read_text() + "  - {m: 256, k: 512, n: 384, g: 2}\n")
  r = runner.invoke(app, ["plan", str(spec), "--target", "v7x", "-o", str(tmp_path / "v7x"), "-j", "2"])
  assert r.exit_code == 0, r.output
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  rows = list(prune.compile_rows(tmp_path / "v7x").values())
  assert len(rows) == len(search_space.candidates(p, device_kind="TPU7x")) > 0
  assert all(x["outcome"] == aot.OK for x in rows), rows
  r = runner.invoke(app, ["plan", str(spec), "--target", "v4", "-o", str(tmp_path / "v4")])
  assert r.exit_code != 0 and "TPU v4 (v4) has no int8 matmul" in r.output, r.output


_LLO_PROBE = """
import glob, json, os, re, sys
import jax, jax.numpy as jnp
from kernels.pallas_tpu.config import TpuConfig
from kernels.pallas_tpu.qgmm import qgmm
from ragtune.deviceless import aot
found = {}
for target in ("v4", "v5e", "v5p", "v6e", "v7x"):
  for dtype in ("int8", "float8_e4m3fn"):
    before = set(glob.glob(os.path.join(sys.argv[1], "*finalize-llo*")))
    f = lambda a, b, s, ls, rs: qgmm(a, b, s, ls, rs, config=TpuConfig(32, 256, 256), out_dtype=jnp.bfloat16)
    r = aot.compile_fn(target, f, ((64, 256), dtype), ((2, 256, 256), dtype), ((2,), jnp.int32),
                       ((64, 2), jnp.float32), ((2, 2, 2), jnp.float32))
    if not r.ok:
      found[f"{target} {dtype}"] = "refused" if "Unsupported matmul RHS type" in r.error else r.error
      continue
    new = set(glob.glob(os.path.join(sys.argv[1], "*finalize-llo*"))) - before
    text = "".join(open(p).read() for p in new)
    found[f"{target} {dtype}"] = sorted(set(re.findall(r"matmul_data_format<([a-z0-9_]+)>", text)))
print(json.dumps(found))
"""


def test_the_mxu_path_is_the_llos(tmp_path):
  """common.TpuChip.mxu against the compiler: the matmul data format of the LLO Mosaic
  lowers qgmm's dots to (libtpu's --xla_mosaic_dump_to, set before libtpu loads, so in a
  process of its own). NATIVE: s8 for int8, e4m3b for fp8; TO_BF16: bf16, or a conversion
  to it on the way in."""
  import os
  import subprocess
  import sys

  env = {**os.environ, "LIBTPU_INIT_ARGS": f"--xla_mosaic_dump_to={tmp_path}", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", _LLO_PROBE, str(tmp_path)], env=env, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  found = json.loads(out.stdout.strip().splitlines()[-1])
  native = {"int8": ["s8"], "float8_e4m3fn": ["e4m3b"]}
  assert len(found) == 2 * len(common.CHIPS), found
  for key, formats in found.items():
    target, dtype = key.split()
    path = common.chip(aot.device_kind(target)).mxu_path(dtype)
    if not path:
      assert formats == "refused", (key, formats)
    elif path == common.NATIVE:
      assert formats == native[dtype], (key, formats)
    else:
      assert path == common.TO_BF16 and formats and all(f == "bf16" or f.endswith("_to_bf16") for f in formats), (
        key,
        formats,
      )
