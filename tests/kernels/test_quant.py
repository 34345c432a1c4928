"""Quantized operands (kernels.quant): the scale layouts, the op, the kernels in interpret
mode against the dequantized jax.lax.ragged_dot and float64 NumPy, and the tolerance rule
catching real mistakes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import quant, registry
from kernels.pallas_gpu.config import TritonConfig
from kernels.pallas_tpu.config import TpuConfig

H100 = "NVIDIA H100 80GB HBM3"
FP8 = ("float8_e4m3fn:channelwise", "float8_e4m3fn:block128")


def _operands(fmt, m, k, n, sizes, seed, transpose_rhs=False, row_exp=3, group_exp=6):
  """Quantized normal lhs and rhs, scales times random powers of two per row and group (up
  to 2^row_exp, 2^group_exp either way: outputs whose size differs by 10^4 between experts)."""
  rng = np.random.default_rng(seed)
  g = len(sizes)
  x = jnp.asarray(rng.standard_normal((m, k), np.float32))
  w = jnp.asarray(rng.standard_normal((g, k, n), np.float32) / np.sqrt(k))
  lq, rq, ls, rs = quant.quantize_operands(x, w, fmt)
  ls = ls * jnp.asarray(2.0 ** rng.integers(-row_exp, row_exp + 1, (m, 1)), jnp.float32)
  rs = rs * jnp.asarray(2.0 ** rng.integers(-group_exp, group_exp + 1, (g, 1, 1)), jnp.float32)
  if transpose_rhs:
    rq = rq.swapaxes(1, 2)
  return lq, rq, jnp.asarray(sizes, jnp.int32), ls, rs


def _numpy_reference(lq, rq, sizes, ls, rs, transpose_rhs=False):
  """float64 NumPy: each group's dequantized rows times its dequantized weights; 0 elsewhere."""
  a, b = (np.asarray(t, np.float64) for t in quant.dequantize(lq, rq, ls, rs, transpose_rhs=transpose_rhs))
  if transpose_rhs:
    b = b.swapaxes(1, 2)
  out = np.zeros((a.shape[0], b.shape[2]))
  start = 0
  for i, s in enumerate(np.asarray(sizes)):
    out[start : start + s] = a[start : start + s] @ b[i]
    start += s
  return out


def _judge(out, lq, rq, sizes, ls, rs, fmt, transpose_rhs=False, offset=None):
  """Whether `out` is within quant.tolerance of the dequantized lax reference, and that
  reference is within the same bound of float64 NumPy."""
  args = (lq, rq.swapaxes(1, 2) if transpose_rhs else rq, sizes, ls, rs)
  value, squares = quant.reference_program(*args)()  # quant.reference and error_scale, run once
  ref = np.asarray(value, np.float64)
  scale = np.sqrt(np.asarray(squares, np.float64))
  if offset is not None:  # rows outside the local groups are 0
    ref = np.where(offset[:, None], ref, 0.0)
    scale = np.where(offset[:, None], scale, 0.0)
  tol = quant.tolerance(fmt, lq.shape[1], out.dtype)
  bound = tol.bound(ref, scale)
  got = np.asarray(out.astype(jnp.float32), np.float64)
  if offset is None:
    np64 = _numpy_reference(lq, rq, sizes, ls, rs, transpose_rhs)
    assert np.all(np.abs(ref - np64) <= bound), "the lax reference strays from float64 NumPy"
  return np.abs(got - ref) <= bound


# --- the scale layouts and the op's arguments ---------------------------------------------


def test_scheme_named_by_the_scales_shapes():
  assert quant.scheme_of(5, 300, 200, 3, (5, 1), (3, 1, 200)) == "channelwise"
  assert quant.scheme_of(5, 300, 200, 3, (5, 3), (3, 3, 2)) == "block128"
  with pytest.raises(ValueError, match=r"block128: lhs_scale \[5, 3\] and rhs_scale \[3, 3, 2\]"):
    quant.scheme_of(5, 300, 200, 3, (5, 3), (3, 1, 200))


def test_quantize_keeps_values_within_the_formats_rounding():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((7, 300), np.float32))
  w = jnp.asarray(rng.standard_normal((2, 300, 130), np.float32))
  for fmt, rel in (("float8_e4m3fn:block128", 2.0**-4), ("int8:channelwise", 1 / 127)):
    lq, rq, ls, rs = quant.quantize_operands(x, w, fmt)
    a, b = quant.dequantize(lq, rq, ls, rs)
    # Within half a step of each block's scale: fp8's 3 mantissa bits, int8's amax/127.
    assert float(jnp.max(jnp.abs(a - x) / jnp.max(jnp.abs(x)))) <= rel
    assert float(jnp.max(jnp.abs(b - w) / jnp.max(jnp.abs(w)))) <= rel


def test_op_refuses_what_it_cannot_compute():
  lq, rq, gs, ls, rs = _operands("float8_e4m3fn:block128", 16, 256, 128, [10, 6], 0)
  with pytest.raises(TypeError, match="need lhs_scale and rhs_scale"):
    kernels.ragged_dot(lq, rq, gs)
  with pytest.raises(ValueError, match="lhs_scale given without rhs_scale"):
    kernels.ragged_dot(lq, rq, gs, lhs_scale=ls)
  with pytest.raises(TypeError, match="must both be one of"):
    kernels.ragged_dot(lq.astype(jnp.bfloat16), rq, gs, lhs_scale=ls, rhs_scale=rs)
  with pytest.raises(ValueError, match="name no scale scheme"):
    kernels.ragged_dot(lq, rq, gs, lhs_scale=ls[:, :1], rhs_scale=rs)
  with pytest.raises(TypeError, match="backend 'mosaic_blackwell' supports"):
    kernels.ragged_dot(lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend="mosaic_blackwell")
  # Forward only: a gradient says so instead of differentiating through fp8.
  f = lambda a: kernels.ragged_dot(a, rq, gs, lhs_scale=ls, rhs_scale=rs).astype(jnp.float32).sum()
  with pytest.raises(NotImplementedError, match="forward only"):
    jax.grad(f)(lq)


def test_auto_picks_a_backend_that_computes_the_format():
  """fp8 on Hopper: mosaic_gpu's fp8 wgmma, though pallas_gpu ranks above it for 16-bit
  operands; on Blackwell, pallas_gpu (mosaic_gpu is Hopper's, mosaic_blackwell takes no fp8)."""
  for fmt in FP8:
    assert registry.auto_backend("gpu", H100, fmt) == "mosaic_gpu"
    assert registry.auto_backend("gpu", "NVIDIA B200", fmt) == "pallas_gpu"
    assert fmt in registry.get("xla").dtypes
  assert registry.auto_backend("gpu", H100, "bfloat16") == registry.auto_backend("gpu", H100) == "pallas_gpu"
  assert registry.auto_backend("gpu", H100, "int8:channelwise") == "xla"
  # A TPU: pallas_tpu's qgmm where the chip's MXU takes the values (v4's takes no 8-bit ones).
  for fmt in ("float8_e4m3fn:block128", "int8:channelwise"):
    assert (
      registry.auto_backend("tpu", "TPU v5 lite", fmt) == registry.auto_backend("tpu", "TPU7x", fmt) == "pallas_tpu"
    )
    assert registry.auto_backend("tpu", "TPU v4", fmt) == "xla"


def test_triton_config_rules_for_scales():
  cfg = TritonConfig(128, 64, 256, 8, 3)
  assert quant.tile_violation("float8_e4m3fn:block128", 64, 256)
  assert not quant.tile_violation("float8_e4m3fn:channelwise", 64, 256)
  assert not cfg.fits("fwd", "float8_e4m3fn:block128", 8192, 4096, 14336, H100)
  assert cfg.fits("fwd", "float8_e4m3fn:channelwise", 8192, 4096, 14336, H100)
  assert not cfg.fits("dlhs", "float8_e4m3fn:channelwise", 8192, 4096, 14336, H100)  # forward only
  b = registry.get("pallas_gpu")
  assert b.space("dlhs", "float8_e4m3fn:channelwise", 8192, 4096, 14336, H100) == []
  # the training format's dlhs is the forward kernel over transposed weights: the forward's rule
  dlhs = b.space("dlhs", "float8_e4m3fn:block128", 8192, 4096, 14336, H100)
  assert dlhs and all(not quant.tile_violation("float8_e4m3fn:block128", c.block_k, c.block_n) for c in dlhs)
  for fmt in FP8:
    space = b.space("fwd", fmt, 8192, 4096, 14336, H100)
    assert space and all(c.fits("fwd", fmt, 8192, 4096, 14336, H100) for c in space)
    assert (
      {c.block_k for c in space} >= {128, 256}
      if fmt.endswith("channelwise")
      else {c.block_k for c in space} <= {64, 128}
    )
    d = b.default_config("fwd", fmt, 8192, 4096, 14336, 8, H100)
    assert d.fits("fwd", fmt, 8192, 4096, 14336, H100)


# --- the kernels against the references ---------------------------------------------------

# (m, k, n, sizes): k off the 128-blocks, n off the kernel's columns, empty groups, rows past
# sum(group_sizes), one group taking all the routed rows.
CASES = {
  "ragged": (72, 200, 160, [30, 0, 25, 7]),
  "empty-tail": (48, 256, 130, [0, 0, 20]),  # and one group taking every routed row
  "k128": (40, 128, 256, [25, 15]),  # one k block: block128's lhs_scale is [m, 1] as channelwise's
}


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["pallas_gpu", "xla"])
def test_quantized_conformance(backend, case, fmt):
  m, k, n, sizes = CASES[case]
  for transpose_rhs in (False, True) if case == "ragged" else (False,):  # one layout is enough elsewhere
    lq, rq, gs, ls, rs = _operands(fmt, m, k, n, sizes, seed=len(case), transpose_rhs=transpose_rhs)
    cfg = TritonConfig(32, 64, 64, 4, 2) if backend == "pallas_gpu" else None
    out = kernels.ragged_dot(
      lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend=backend, config=cfg, transpose_rhs=transpose_rhs
    )
    assert out.dtype == jnp.bfloat16
    assert _judge(out, lq, rq, gs, ls, rs, fmt, transpose_rhs).all()
    assert not np.any(np.asarray(out[sum(sizes) :], np.float32))


@pytest.mark.parametrize("fmt", ["int8:channelwise", "int8:block128"])
def test_int8_on_xla(fmt):
  m, k, n, sizes = CASES["ragged"]
  lq, rq, gs, ls, rs = _operands(fmt, m, k, n, sizes, seed=3)
  out = kernels.ragged_dot(lq, rq, gs, lhs_scale=ls, rhs_scale=rs, preferred_element_type=jnp.float32)
  assert out.dtype == jnp.float32
  assert _judge(out, lq, rq, gs, ls, rs, fmt).all()


@pytest.mark.parametrize("fmt", FP8)
def test_adversarial_scales(fmt):
  """Tiny and huge scales (1e-6 to 1e4 times the quantizer's) and per-group outliers of
  2^+-12: each output is judged by its own terms' size, so a small group's error is not
  hidden behind a large one's."""
  m, k, n, sizes = CASES["ragged"]
  lq, rq, gs, ls, rs = _operands(fmt, m, k, n, sizes, seed=5, group_exp=12)
  for factor in (1e-6, 1e4):
    out = kernels.ragged_dot(
      lq, rq, gs, lhs_scale=ls * factor, rhs_scale=rs, backend="pallas_gpu", config=TritonConfig(16, 32, 32, 4, 2)
    )
    assert _judge(out, lq, rq, gs, ls * factor, rs, fmt).all()


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize(
  "backend,config",
  [("pallas_gpu", TritonConfig(16, 64, 32, 4, 2)), ("pallas_tpu", TpuConfig(32, 128, 128))],
)
def test_group_offset(fmt, backend, config):
  """Expert parallelism: rhs and its scales hold groups [1, 3) of 4; other rows come out 0."""
  m, k, n, sizes = 64, 160, 96, [10, 20, 0, 30]
  lq, rq, gs, ls, rs = _operands(fmt, m, k, n, sizes, seed=7)
  kw = dict(group_offset=1, backend=backend, config=config)
  out = kernels.ragged_dot(lq, rq[1:3], gs, lhs_scale=ls, rhs_scale=rs[1:3], **kw)
  local = np.zeros(m, bool)
  local[10:30] = True
  full = kernels.ragged_dot(lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend="xla")
  want = np.where(local[:, None], np.asarray(full, np.float32), 0.0)
  np.testing.assert_array_equal(np.asarray(out, np.float32)[~local], 0.0)
  assert _judge(out, lq, rq, gs, ls, rs, fmt, offset=local)[local].all()
  np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=1e-3 * np.abs(want).max())
  # f32 output, and (on the TPU kernel) int8 values too
  if backend == "pallas_tpu":
    lq, rq, gs, ls, rs = _operands("int8:" + fmt.split(":")[1], m, k, n, sizes, seed=8)
    out = kernels.ragged_dot(lq, rq[1:3], gs, lhs_scale=ls, rhs_scale=rs[1:3], preferred_element_type=jnp.float32, **kw)
    assert out.dtype == jnp.float32 and not np.any(np.asarray(out)[~local])
    assert _judge(out, lq, rq, gs, ls, rs, "int8:" + fmt.split(":")[1], offset=local)[local].all()


@pytest.mark.parametrize("fmt", FP8)
def test_the_bound_catches_a_misread_scale(fmt):
  """The rule fails a kernel that reads one k block's scale wrong, or a neighbour group's:
  the check is not loose enough to pass them."""
  m, k, n, sizes = 64, 512, 128, [32, 32]
  lq, rq, gs, ls, rs = _operands(fmt, m, k, n, sizes, seed=9, group_exp=0, row_exp=0)
  if fmt.endswith("block128"):
    wrong = rs.at[:, 1].multiply(1.5)  # one of 4 k blocks' scales off by half
  else:
    wrong = rs[::-1]  # the groups' column scales swapped
  out = kernels.ragged_dot(
    lq, rq, gs, lhs_scale=ls, rhs_scale=wrong, backend="pallas_gpu", config=TritonConfig(32, 64, 64, 4, 2)
  )
  assert not _judge(out, lq, rq, gs, ls, rs, fmt).all()
  right = kernels.ragged_dot(
    lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend="pallas_gpu", config=TritonConfig(32, 64, 64, 4, 2)
  )
  assert _judge(right, lq, rq, gs, ls, rs, fmt).all()


def test_kernel_refuses_a_tile_its_scales_cannot_follow():
  lq, rq, gs, ls, rs = _operands("float8_e4m3fn:block128", 16, 256, 512, [16], 0)
  with pytest.raises(ValueError, match="block scales need block_k and block_n dividing 128"):
    kernels.ragged_dot(
      lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend="pallas_gpu", config=TritonConfig(16, 64, 256, 8, 2)
    )


def test_a_lut_refuses_a_quantized_gradient_entry():
  """Gradient entries only for a training format (fp8 block128), not for a serving one."""
  entry = {
    "op": "dlhs",
    "backend": "xla",
    "dtype": "float8_e4m3fn:channelwise",
    "m": 8,
    "k": 8,
    "n": 8,
    "g": 1,
    "config": {},
  }
  data = {"schema": kernels.lut.SCHEMA, "schema_version": kernels.lut.SCHEMA_VERSION, "device_kind": "cpu"}
  with pytest.raises(kernels.LutError, match="forward only"):
    kernels.Lut.from_dict({**data, "entries": [entry]})
  trained = {**entry, "dtype": "float8_e4m3fn:block128"}
  assert kernels.Lut.from_dict({**data, "entries": [trained]}).entries()[0].op == "dlhs"


def test_a_lut_entry_is_keyed_by_format():
  """An fp8 entry serves fp8 calls of its format only; bf16 calls keep their heuristic."""
  entry = kernels.Entry("fwd", "pallas_gpu", "float8_e4m3fn:block128", 64, 256, 128, 2, TritonConfig(16, 64, 64, 4, 2))
  table = kernels.Lut("cpu", [entry])
  assert kernels.Lut.from_dict(table.to_dict()).entries() == [entry]
  with kernels.use_lut(table):
    got = kernels.explain((64, 256), (2, 256, 128), "float8_e4m3fn:block128", backend="pallas_gpu")
    assert set(got) == {"fwd"} and got["fwd"].source == "lut-exact" and got["fwd"].config == entry.config
    other = kernels.explain((64, 256), (2, 256, 128), "float8_e4m3fn:channelwise", backend="pallas_gpu")
    assert other["fwd"].source == "heuristic"
    assert kernels.explain((64, 256), (2, 256, 128), jnp.bfloat16, backend="pallas_gpu")["fwd"].source == "heuristic"
