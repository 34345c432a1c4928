"""fp8 training (kernels.ragged_dot's quantize=): the forward and both gradients on fp8
kernels, against a float64 NumPy emulation of the same recipe (its own quantizer: the same
blocks, the same rounding), by kernels.quant's elementwise bound, and against the f32
jax.lax.ragged_dot and its vjp by the quantization's own bound; plus mutations that must fail."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import gpu_compile_missing, needs_compiler

import kernels
from kernels import quant, registry
from kernels.ragged_dot import train_op

FMT = "float8_e4m3fn:block128"
B = quant.BLOCK
INV_QMAX = np.float32(1 / 448.0)  # quant.quantize: amax times the f32 reciprocal of 448


# --- the emulation ------------------------------------------------------------------------


def _np_quantize(x, axis: int):
  """x (2-D, float32 values) in blocks of 128 along `axis` (1 along the other), as float64
  dequantizable (values, scales per element). The scale is amax * f32(1/448), the value
  x / scale in float32 rounded to e4m3 (ml_dtypes: round to nearest even), as jax's cast."""
  x = np.asarray(x, np.float32)
  xt = x if axis == 1 else x.T
  rows, cols = xt.shape
  pad = -cols % B
  blocks = np.pad(xt, ((0, 0), (0, pad))).reshape(rows, -1, B)
  amax = np.abs(blocks).max(axis=2)
  scale = np.where(amax > 0, amax * INV_QMAX, np.float32(1)).astype(np.float32)
  q = (blocks / scale[:, :, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
  s = np.repeat(scale.astype(np.float64), B, axis=1)
  q, s = q.reshape(rows, -1)[:, :cols], s[:, :cols]
  return (q, s) if axis == 1 else (q.T, s.T)


def _np_quantize_weights(w):
  """w [g, k, n] in 128x128 blocks: (values, scales per element), float64."""
  out_q, out_s = [], []
  for wi in np.asarray(w, np.float32):
    k, n = wi.shape
    blocks = np.pad(wi, ((0, -k % B), (0, -n % B)))
    kb, nb = blocks.shape[0] // B, blocks.shape[1] // B
    amax = np.abs(blocks.reshape(kb, B, nb, B)).max(axis=(1, 3))
    scale = np.where(amax > 0, amax * INV_QMAX, np.float32(1)).astype(np.float32)
    per = np.kron(scale, np.ones((B, B), np.float32))
    q = (blocks / per).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    out_q.append(q[:k, :n])
    out_s.append(per.astype(np.float64)[:k, :n])
  return np.stack(out_q), np.stack(out_s)


def _bounds(sizes, m, offset, g):
  ends = np.minimum(np.cumsum(sizes), m)
  starts = np.concatenate([[0], ends[:-1]])
  return starts[offset : offset + g], ends[offset : offset + g]


def _emulate(x, w, dout, sizes, offset, g):
  """{op: (value, error_scale)} of the recipe in float64: products of the quantized values
  and scales summed exactly; error_scale the root of the sum of the squared products."""
  m = x.shape[0]
  starts, ends = _bounds(sizes, m, offset, g)
  xq, xs = _np_quantize(x, 1)
  dq, ds = _np_quantize(dout, 1)
  wq, ws = _np_quantize_weights(np.asarray(w, np.float32)[offset : offset + g])
  a, d, wd = xq * xs, dq * ds, wq * ws
  k, n = x.shape[1], dout.shape[1]
  out = {op: (np.zeros(shape), np.zeros(shape)) for op, shape in (("fwd", (m, n)), ("dlhs", (m, k)))}
  out["drhs"] = (np.zeros((g, k, n)), np.zeros((g, k, n)))
  for i, (lo, hi) in enumerate(zip(starts, ends)):
    out["fwd"][0][lo:hi] = a[lo:hi] @ wd[i]
    out["fwd"][1][lo:hi] = (a[lo:hi] ** 2) @ (wd[i] ** 2)
    out["dlhs"][0][lo:hi] = d[lo:hi] @ wd[i].T
    out["dlhs"][1][lo:hi] = (d[lo:hi] ** 2) @ (wd[i].T ** 2)
    # 128-token blocks from the group's first row: each quantized on its own rows
    for b0 in range(lo, hi, B):
      b1 = min(b0 + B, hi)
      xq_b, xs_b = _np_quantize(np.asarray(x, np.float32)[b0:b1], 0)
      dq_b, ds_b = _np_quantize(np.asarray(dout, np.float32)[b0:b1], 0)
      xb, db = xq_b * xs_b, dq_b * ds_b
      out["drhs"][0][i] += xb.T @ db
      out["drhs"][1][i] += (xb.T**2) @ (db**2)
  return {op: (v, np.sqrt(s)) for op, (v, s) in out.items()}


def _f32_reference(x, w, dout, sizes, offset, g):
  """{op: (value, sum of |products|)} of the unquantized operands in float64: what the f32
  jax.lax.ragged_dot and its vjp compute, and the size of the terms each output sums."""
  m = x.shape[0]
  starts, ends = _bounds(sizes, m, offset, g)
  a, d = np.asarray(x, np.float64), np.asarray(dout, np.float64)
  wd = np.asarray(w, np.float64)[offset : offset + g]
  k, n = a.shape[1], d.shape[1]
  out = {"fwd": [np.zeros((m, n))] * 2, "dlhs": [np.zeros((m, k))] * 2, "drhs": [np.zeros((g, k, n))] * 2}
  out = {op: [v.copy(), s.copy()] for op, (v, s) in out.items()}
  for i, (lo, hi) in enumerate(zip(starts, ends)):
    for op, p, q in (("fwd", a[lo:hi], wd[i]), ("dlhs", d[lo:hi], wd[i].T)):
      out[op][0][lo:hi], out[op][1][lo:hi] = p @ q, np.abs(p) @ np.abs(q)
    out["drhs"][0][i], out["drhs"][1][i] = a[lo:hi].T @ d[lo:hi], np.abs(a[lo:hi]).T @ np.abs(d[lo:hi])
  return out


# e4m3 keeps 3 mantissa bits: each quantized value within 2^-4 of its own size, a product of
# two within (1 + 2^-4)^2 - 1 < 0.13 of its size; 0.14 covers the result's bf16 rounding too.
QUANTIZATION_BOUND = 0.14


def _within(got, ref, error_scale, contraction, out_dtype) -> np.ndarray:
  tol = quant.tolerance(FMT, contraction, out_dtype)
  return np.abs(np.asarray(got, np.float64) - ref) <= tol.bound(ref, error_scale)


def _problem(seed, m=300, k=200, n=136, sizes=(0, 130, 57, 0, 90), dtype=jnp.bfloat16):
  """Normal x, dout and weights; rows scaled by powers of two per row (outliers within a
  token block). Groups: empty ones, a tail across a block boundary (130), sum < m; k and n
  not multiples of 128."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-4, 5, (m, 1))
  w = rng.standard_normal((len(sizes), k, n)) / np.sqrt(k)
  dout = rng.standard_normal((m, n)) * 2.0 ** rng.integers(-4, 5, (m, 1))
  cast = lambda v: jnp.asarray(v, dtype)
  return cast(x), cast(w), cast(dout), np.asarray(sizes)


def _grads(x, w, dout, sizes, offset, g, backend, interpret, transpose_rhs=False):
  """(out, dlhs, drhs) of kernels.ragged_dot(quantize=FMT) by jax.vjp; weights [g,k,n]."""
  gs = jnp.asarray(sizes, jnp.int32)
  shard = w[offset : offset + g]
  stored = shard.swapaxes(1, 2) if transpose_rhs else shard
  kw = dict(quantize=FMT, backend=backend, interpret=interpret, transpose_rhs=transpose_rhs)
  if offset or g != len(sizes):
    kw["group_offset"] = jnp.int32(offset)
  out, vjp = jax.vjp(lambda a, b: kernels.ragged_dot(a, b, gs, **kw), x, stored)
  dlhs, drhs = vjp(dout.astype(out.dtype))
  drhs = drhs.swapaxes(1, 2) if transpose_rhs else drhs
  return {
    op: np.asarray(v.astype(jnp.float32), np.float64) for op, v in zip(("fwd", "dlhs", "drhs"), (out, dlhs, drhs))
  }


def _check_against_both(got, x, w, dout, sizes, offset, g):
  emu = _emulate(x, w, dout, sizes, offset, g)
  f32 = _f32_reference(x, w, dout, sizes, offset, g)
  contraction = {"fwd": x.shape[1], "dlhs": dout.shape[1], "drhs": x.shape[0]}
  for op in ("fwd", "dlhs", "drhs"):
    ref, scale = emu[op]
    ok = _within(got[op], ref, scale, contraction[op], jnp.bfloat16)
    assert ok.all(), f"{op}: {np.count_nonzero(~ok)} of {ok.size} outside the recipe's bound"
    value, terms = f32[op]
    err = np.abs(got[op] - value)
    assert (err <= QUANTIZATION_BOUND * terms + 1e-30).all(), f"{op}: beyond fp8's bound of the f32 result"


def _interpret(backend):
  """How a backend runs here: XLA compiled; Mosaic GPU in jax's interpreter with its race
  detector on (TMA reads past an array's end as zeros); Pallas Triton interpreted."""
  if backend == "xla":
    return False
  if backend == "mosaic_gpu":
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams(detect_races=True, out_of_bounds_reads="uninitialized", uninitialized_memory="zero")
  return True


def _skip_unless_runs(backend):
  b = registry.get(backend)
  if why := b.unavailable():
    pytest.skip(why)
  unsupported = b.interpret_unsupported() if backend != "xla" else {}
  if why := unsupported.get(f"drhs:{FMT}") or unsupported.get(f"fwd:{FMT}") or unsupported.get("drhs"):
    if backend == "mosaic_gpu":
      pytest.skip(why)
  if b.grad_rhs_quantized is None:
    pytest.skip(f"{backend} has no fp8 weight gradient")


def _races_found() -> bool:
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks

  return gpu_callbacks.get_races().races_found


# --- tests ----------------------------------------------------------------------------------


def test_quantizers_match_the_emulation():
  """quant's quantizers give the emulation's values and scales bit for bit: 1x128 along a
  row, 128x128 weight blocks, and 128-token blocks of one group each (token_blocks), with
  empty groups, sum(group_sizes) < m and a group_offset shard."""
  x, w, dout, sizes = _problem(0)
  q, s = quant.quantize(x, "float8_e4m3fn", (1, B))
  eq, es = _np_quantize(x, 1)
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32), np.float64), eq)
  np.testing.assert_array_equal(np.repeat(np.asarray(s, np.float64), B, axis=1)[:, : x.shape[1]], es)
  rq, rs = quant.quantize_weights(w, "float8_e4m3fn")
  eq, es = _np_quantize_weights(w)
  np.testing.assert_array_equal(np.asarray(rq.astype(jnp.float32), np.float64), eq)
  per = np.repeat(np.repeat(np.asarray(rs, np.float64), B, axis=1), B, axis=2)[:, : w.shape[1], : w.shape[2]]
  np.testing.assert_array_equal(per, es)
  for offset, g in ((0, 5), (1, 3)):
    blocks = quant.token_blocks(jnp.asarray(sizes, jnp.int32), x.shape[0], jnp.int32(offset), g)
    vals, scales = quant.quantize_tokens(x, blocks, "float8_e4m3fn")
    vals, scales = np.asarray(vals.astype(jnp.float32), np.float64), np.asarray(scales, np.float64)
    starts, ends = _bounds(sizes, x.shape[0], offset, g)
    first, count = np.asarray(blocks.first), np.asarray(blocks.count)
    np.testing.assert_array_equal(count, -(-(ends - starts) // B))
    np.testing.assert_array_equal(first, np.cumsum(count) - count)
    for i, (lo, hi) in enumerate(zip(starts, ends)):
      for j, b0 in enumerate(range(lo, hi, B)):
        b1 = min(b0 + B, hi)
        eq, es = _np_quantize(np.asarray(x, np.float32)[b0:b1], 0)
        cols = slice((first[i] + j) * B, (first[i] + j) * B + b1 - b0)
        np.testing.assert_array_equal(vals[:, cols].T, eq)
        np.testing.assert_array_equal(np.broadcast_to(scales[first[i] + j], es.shape), es)
        np.testing.assert_array_equal(vals[:, (first[i] + j) * B + b1 - b0 : (first[i] + j + 1) * B], 0.0)
    assert not vals[:, np.asarray(first[-1] + count[-1]) * B :].any()  # blocks after the groups: zeros


@pytest.mark.parametrize("backend", ["xla", "pallas_gpu"])
@pytest.mark.parametrize("offset, g, transpose_rhs", [(0, 5, False), (1, 3, True)], ids=["all", "shard-nk"])
def test_training_matches_the_recipe(backend, offset, g, transpose_rhs):
  """out, dlhs and drhs of jax.vjp through quantize= against the emulation (by quant's
  bound) and the f32 ragged_dot and its vjp (by fp8's), with empty groups, sum < m, tails
  across block boundaries, k and n off 128; all groups, and a group_offset shard whose
  weights are stored [g, n, k]."""
  _skip_unless_runs(backend)
  x, w, dout, sizes = _problem(1)
  got = _grads(x, w, dout, sizes, offset, g, backend, _interpret(backend), transpose_rhs)
  _check_against_both(got, x, w, dout, sizes, offset, g)


@pytest.mark.mgpu_interpret
def test_mosaic_gpu_training_in_interpreter():
  """The same on mosaic_gpu in jax's Mosaic GPU interpreter, its race detector on: QGMMA
  kernels for fwd (256-deep steps), dlhs (the forward kernel over the weights' [g,k,n]
  layout, read as [n, k] tiles) and drhs (tgmm_quantized)."""
  _skip_unless_runs("mosaic_gpu")
  x, w, dout, sizes = _problem(2)
  got = _grads(x, w, dout, sizes, 1, 3, "mosaic_gpu", _interpret("mosaic_gpu"))
  assert not _races_found()
  _check_against_both(got, x, w, dout, sizes, 1, 3)


def _drhs_with_a_wrong_token_block_fails(backend):
  """A kernel that reads a neighbour's 128-token block is outside the recipe's bound."""
  x, w, dout, sizes = _problem(3, sizes=(200, 0, 180))
  gs = jnp.asarray(sizes, jnp.int32)
  m = x.shape[0]
  blocks = quant.token_blocks(gs, m, None, 3)
  a_t, a_s = quant.quantize_tokens(x, blocks, "float8_e4m3fn")
  b_t, b_s = quant.quantize_tokens(dout, blocks, "float8_e4m3fn")
  cfg = registry.get(backend).default_config("drhs", FMT, m, x.shape[1], dout.shape[1], 3)
  run = registry.get(backend).grad_rhs_quantized
  kw = dict(config=cfg, out_dtype=jnp.float32, interpret=_interpret(backend))
  ref, scale = _emulate(x, w, dout, sizes, 0, 3)["drhs"]
  good = run(a_t, b_t, a_s, b_s, blocks.first, blocks.count, **kw)
  assert _within(good, ref, scale, m, jnp.float32).all()
  # group 2 starts on group 0's last block, which group 0 then misses (as XLA's path, which
  # takes the runs as consecutive, reads it too)
  first, count = blocks.first.at[2].add(-1), blocks.count.at[0].add(-1).at[2].add(1)
  bad = run(a_t, b_t, a_s, b_s, first, count, **kw)
  assert not _within(bad, ref, scale, m, jnp.float32).all()


@pytest.mark.parametrize("backend", ["xla", "pallas_gpu", pytest.param("mosaic_gpu", marks=pytest.mark.mgpu_interpret)])
def test_mutations_fail(backend):
  """What a wrong kernel or recipe would do, each caught by the bound: one expert's scales of
  two k blocks swapped (fwd), dlhs reading the weights' block scales untransposed (k = n, so
  the shapes agree), drhs reading a neighbour's token block."""
  _skip_unless_runs(backend)
  x, w, dout, sizes = _problem(4, k=256, n=256, sizes=(100, 150, 20))
  gs = jnp.asarray(sizes, jnp.int32)
  emu = _emulate(x, w, dout, sizes, 0, 3)
  kw = dict(fmt=FMT, backend=backend, interpret=_interpret(backend), out_dtype=jnp.float32)
  rq, rs = quant.quantize_weights(w, "float8_e4m3fn")
  rs = rs * jnp.asarray(2.0 ** np.random.default_rng(0).integers(-5, 6, rs.shape), jnp.float32)
  wq = rq.astype(jnp.float32) * jnp.repeat(jnp.repeat(rs, B, 1), B, 2)  # weights whose blocks are exact
  emu = _emulate(x, wq, dout, sizes, 0, 3)
  for op, a in (("fwd", x), ("dlhs", dout)):
    ok = train_op(op, a, rq, gs, rhs_scale=rs, **kw)
    assert _within(ok, *emu[op], 256, jnp.float32).all(), op
  swapped = rs.at[1, 0, 0].set(rs[1, 1, 0]).at[1, 1, 0].set(rs[1, 0, 0])
  assert not _within(train_op("fwd", x, rq, gs, rhs_scale=swapped, **kw), *emu["fwd"], 256, jnp.float32).all()
  # dlhs with the block scales not transposed: train_op transposes them, so hand it the
  # transpose to undo it.
  untransposed = train_op("dlhs", dout, rq, gs, rhs_scale=rs.swapaxes(1, 2), **kw)
  assert not _within(untransposed, *emu["dlhs"], 256, jnp.float32).all()
  _drhs_with_a_wrong_token_block_fails(backend)


def test_frozen_fp8_weights():
  """Weights given quantized with their scales (a checkpoint's): only lhs is quantized; the
  lhs gradient is the recipe's dlhs and the weights' cotangents are zeros (constants)."""
  x, w, dout, sizes = _problem(5, sizes=(120, 0, 150))
  gs = jnp.asarray(sizes, jnp.int32)
  rq, rs = quant.quantize_weights(w, "float8_e4m3fn")
  fn = lambda a, q, s: kernels.ragged_dot(a, q, gs, rhs_scale=s, quantize=FMT, backend="xla")
  out, vjp = jax.vjp(fn, x, rq, rs)
  dlhs, dq, ds = vjp(dout)
  emu = _emulate(x, w, dout, sizes, 0, 3)
  for got, op, c in ((out, "fwd", x.shape[1]), (dlhs, "dlhs", dout.shape[1])):
    assert _within(np.asarray(got.astype(jnp.float32)), *emu[op], c, jnp.bfloat16).all(), op
  assert dq.dtype == rq.dtype and not np.asarray(dq.astype(jnp.float32)).any() and not np.asarray(ds).any()


def test_weights_quantized_once_per_step():
  """rhs_quantized (the weights' fp8 copy, made once per optimizer step) gives the very result and
  gradients of quantizing them in the call, the gradient going to the float weights."""
  x, w, dout, sizes = _problem(7, sizes=(100, 0, 170))
  gs = jnp.asarray(sizes, jnp.int32)
  both = quant.training_weights(w, "float8_e4m3fn")
  assert both.other is not None and both.other.shape == (3, w.shape[2], w.shape[1])

  def run(**kw):
    out, vjp = jax.vjp(lambda a, b: kernels.ragged_dot(a, b, gs, quantize=FMT, backend="xla", **kw), x, w)
    return (out, *vjp(dout))

  one = quant.training_weights(w, FMT, both_layouts=False)
  assert one.other is None
  for cached in (both, one):  # with the other layout, and without
    for got, want in zip(run(rhs_quantized=cached), run()):
      np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)))
  grads = jax.grad(
    lambda c: kernels.ragged_dot(x, w, gs, quantize=FMT, backend="xla", rhs_quantized=c).astype(jnp.float32).sum()
  )(both)
  assert not any(np.asarray(t.astype(jnp.float32)).any() for t in jax.tree.leaves(grads))
  # The frame is checked: weights stored [g, n, k] with a copy made for [g, k, n] (square block
  # grids, k = n = 256, give both frames' scales one shape), and a bare tuple.
  w_nk = w[:, :256, :256].swapaxes(1, 2)
  with pytest.raises(ValueError, match="made with transpose_rhs=False"):
    kernels.ragged_dot(
      x[:, :256], w_nk, gs, quantize=FMT, transpose_rhs=True, rhs_quantized=quant.training_weights(w_nk, FMT)
    )
  with pytest.raises(TypeError, match="takes what kernels.quant.training_weights"):
    kernels.ragged_dot(x, w, gs, quantize=FMT, rhs_quantized=(both.values, both.scales))


def test_bad_calls_say_what_to_do():
  x, w, _, sizes = _problem(6, m=16, k=128, n=128, sizes=(8, 8))
  gs = jnp.asarray(sizes, jnp.int32)
  with pytest.raises(ValueError, match="channelwise scales cannot be carried"):
    kernels.ragged_dot(x, w, gs, quantize="float8_e4m3fn:channelwise")
  with pytest.raises(ValueError, match="quantizes lhs itself"):
    kernels.ragged_dot(x, w, gs, quantize=FMT, lhs_scale=jnp.ones((16, 1)))
  with pytest.raises(TypeError, match="float dtype"):
    kernels.ragged_dot(x.astype(jnp.int8), w, gs, quantize=FMT)
  with pytest.raises(TypeError, match="rhs_scale"):
    kernels.ragged_dot(x, w, gs, quantize=FMT, rhs_scale=jnp.ones((2, 1, 1)))
  with pytest.raises(TypeError, match="rhs_quantized takes"):
    kernels.ragged_dot(x, w, gs, quantize=FMT, rhs_quantized=quant.training_weights(w[:1], "float8_e4m3fn"))
  with pytest.raises(ValueError, match="pass quantize= too"):
    kernels.ragged_dot(x, w, gs, rhs_quantized=quant.quantize_weights(w, "float8_e4m3fn"))
  with pytest.raises(TypeError, match="runs float8_e4m3fn:block128 forward only|supports lhs/rhs dtypes"):
    kernels.ragged_dot(x, w, gs, quantize=FMT, backend="mosaic_blackwell")


@needs_compiler(gpu_compile_missing(), "deviceless compile tests")
@pytest.mark.parametrize(
  ("target", "backend", "mma", "inputs"),
  [
    ("h100", "mosaic_gpu", "wgmma", "e4m3"),  # QGMMA for all three
    ("h100", "pallas_gpu", "mma.sync", "f16"),  # Triton on Hopper: fp8 converted to f16 (test_quantized.py says why)
    ("b200", "pallas_gpu", "tcgen05", "f8f6f4"),  # Triton on Blackwell: fp8 tcgen05
  ],
)
def test_training_kernels_compile(target, backend, mma, inputs):
  """jax.vjp through quantize= built for the GPU without one (DeepSeek-V3 up's per-device
  shape): three matmul kernels (fwd, dlhs, drhs), each on the MMA the backend is known to use
  on that GPU, and four single-pass quantizers; no spill, no spill in a loop, wgmma not
  serialized, setmaxnreg within the pool."""
  if why := registry.get(backend).unavailable():
    pytest.skip(why)
  from ragtune.deviceless import aot

  m, k, n, g = 8192, 7168, 2048, 8

  def fn(x, w, gs, dout):
    call = lambda a, b: kernels.ragged_dot(a, b, gs, quantize=FMT, backend=backend, interpret=False)
    out, vjp = jax.vjp(call, x, w)
    return out, vjp(dout)

  bf = jnp.bfloat16
  report = aot.compile_fn(target, fn, ((m, k), bf), ((g, k, n), bf), ((g,), jnp.int32), ((m, n), bf))
  assert report.ok, f"{report.outcome}: {report.error}"
  passes = [r for r in report.kernels if r.name.startswith("ragtune_quantize")]
  matmuls = [r for r in report.kernels if r not in passes]
  assert len(matmuls) == 3, [r.name for r in report.kernels]
  # the activation passes as single-pass kernels (registry.activation_quantizer): x and dout
  # in 1x128 blocks, and in 128-token blocks
  assert (
    sorted(re.sub(r"__\d+$", "", r.name) for r in passes)
    == ["ragtune_quantize_rows"] * 2 + ["ragtune_quantize_token_blocks"] * 2
  )
  for r in report.kernels:
    assert r.spill_bytes == 0 and r.loop_spills == 0 and not r.serialized_wgmma, r
    assert (r.setmaxnreg_demand or 0) <= (r.register_pool or 0), r
  for r in matmuls:
    assert r.mma == mma and r.mma_inputs == inputs, r


def test_the_docs_training_snippets_run():
  """docs/quantization.md's training snippets, as printed, in one namespace (on this host auto
  runs XLA's path)."""
  from pathlib import Path

  text = (Path(__file__).resolve().parents[2] / "docs" / "quantization.md").read_text()
  section = text[text.index("## Training in fp8") :]
  snippets = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(snippets) == 2
  scope: dict = {}
  for code in snippets:
    exec(compile(code, "docs/quantization.md", "exec"), scope)
  assert scope["dx"].shape == (512, 256) and scope["dw"].shape == (4, 256, 384)
  assert np.isfinite(float(scope["loss"])) and scope["y"].shape == (512, 384)


def test_vmap_of_the_training_gradient():
  """jax.vmap of jax.grad through quantize= (XLA's path) is each example's gradient."""
  x, w, dout, _ = _problem(8, m=64, k=128, n=136, sizes=(30, 20))
  xs, ws = jnp.stack([x, x[::-1]]), jnp.stack([w, w * 2])
  gss = jnp.asarray([[30, 20], [10, 40]], jnp.int32)

  def loss(a, b, gs):
    return jnp.sum(kernels.ragged_dot(a, b, gs, quantize=FMT, backend="xla").astype(jnp.float32) ** 2)

  batched = jax.vmap(jax.grad(loss, argnums=(0, 1)))(xs, ws, gss)
  for i in range(2):
    one = jax.grad(loss, argnums=(0, 1))(xs[i], ws[i], gss[i])
    for got, want in zip(batched, one):
      np.testing.assert_allclose(np.asarray(got[i], np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-2)
