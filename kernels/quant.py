"""Quantized operands: their scale layouts, a quantizer, the dequantized reference and the
rule a kernel's result is judged by.

lhs and rhs hold float8_e4m3fn (or int8) values; float32 scales say what each stands for.
The scales' shapes name the scheme (always in the [g, k, n] frame, also with transpose_rhs):

  channelwise  lhs_scale [m, 1]             one per token (row)
               rhs_scale [g, 1, n]          one per expert and output column
  block128     lhs_scale [m, ceil(k/128)]   one per 1x128 block of a row along k
               rhs_scale [g, ceil(k/128), ceil(n/128)]   one per 128x128 (k x n) block

and the result is, for the rows of group i,

  out[r, c] = sum_k (lhs[r, k] * lhs_scale[r, k // 128]) * (rhs[i, k, c] * rhs_scale[i, k // 128, c // 128])

(channelwise: index 0 in place of k // 128, and c in place of c // 128). DeepSeek-V3 ships its
weights with 128x128 block scales and quantizes activations per 1x128 block (arXiv:2412.19437,
section 3.3); vLLM's fp8 w8a8 MoE kernels take the channelwise (per-token x per-channel) form.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels import common
from kernels import reference as kref
from kernels.common import QUANT_DTYPES, SCHEMES, TRAINING_FORMATS, element_dtype, scheme

BLOCK = 128  # the block128 scheme's block along k and n
# Largest finite magnitude of each element dtype: what a quantizer maps a block's amax to.
QMAX = {"float8_e4m3fn": 448.0, "int8": 127.0}


def tile_violation(fmt: str, block_k: int, block_n: int) -> str:
  """Why a kernel's [block_k, block_n] rhs tile cannot carry the format's scales, or "".
  Block scales are applied per contraction step with one rhs scale a tile, so a step and a
  tile's columns must stay within one 128-block (a power-of-two block does if it is <= 128):
  the tuned-block-size-versus-scales mismatch that MoE tuners have shipped silently."""
  if scheme(fmt) == "block128" and (block_k > BLOCK or block_n > BLOCK or BLOCK % block_k or BLOCK % block_n):
    return f"block scales need block_k and block_n dividing {BLOCK}, got block_k={block_k}, block_n={block_n}"
  return ""


def scale_shapes(scheme_name: str, m: int, k: int, n: int, g: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(lhs_scale shape, rhs_scale shape) of a scheme on the problem [m,k] x [g,k,n]."""
  kb, nb = -(-k // BLOCK), -(-n // BLOCK)
  if scheme_name == "channelwise":
    return (m, 1), (g, 1, n)
  if scheme_name == "block128":
    return (m, kb), (g, kb, nb)
  raise ValueError(f"scale scheme must be one of {SCHEMES}, got {scheme_name!r}")


def scheme_of(m: int, k: int, n: int, g: int, lhs_scale_shape, rhs_scale_shape) -> str:
  """The scheme the scales' shapes name, or a ValueError that says what they should be."""
  got = (tuple(lhs_scale_shape), tuple(rhs_scale_shape))
  for name in SCHEMES:
    if got == scale_shapes(name, m, k, n, g):
      return name
  want = "; ".join(
    f"{name}: lhs_scale {list(ls)} and rhs_scale {list(rs)}"
    for name in SCHEMES
    for ls, rs in [scale_shapes(name, m, k, n, g)]
  )
  raise ValueError(
    f"lhs_scale {list(got[0])} and rhs_scale {list(got[1])} name no scale scheme for [m,k]x[g,k,n] = "
    f"[{m},{k}]x[{g},{k},{n}] (scales are in the [g,k,n] frame, also with transpose_rhs); expected {want}"
  )


def check(lhs, rhs, lhs_scale, rhs_scale, *, transpose_rhs: bool = False) -> str:
  """The format ('float8_e4m3fn:block128', ...) of quantized operands, or a clear error."""
  if (lhs_scale is None) != (rhs_scale is None):
    given, missing = ("lhs_scale", "rhs_scale") if rhs_scale is None else ("rhs_scale", "lhs_scale")
    raise ValueError(f"{given} given without {missing}: quantized operands need both scales")
  names = {jnp.dtype(lhs.dtype).name, jnp.dtype(rhs.dtype).name}
  if len(names) != 1 or not names <= set(QUANT_DTYPES):
    raise TypeError(f"with scales, lhs and rhs must both be one of {QUANT_DTYPES}, got {lhs.dtype} x {rhs.dtype}")
  for name, s in (("lhs_scale", lhs_scale), ("rhs_scale", rhs_scale)):
    if not jnp.issubdtype(s.dtype, jnp.floating):
      raise TypeError(f"{name} must be a float32 array, got dtype {s.dtype}")
  m, k = lhs.shape
  g = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  return f"{names.pop()}:{scheme_of(m, k, n, g, lhs_scale.shape, rhs_scale.shape)}"


def _expand(scale: jax.Array, axis: int, size: int) -> jax.Array:
  """A per-block scale repeated over its block's elements along `axis`, `size` of them in
  all; a scale already per element, or one for the whole axis, broadcasts as it is."""
  if scale.shape[axis] in (1, size):
    return scale
  return jnp.repeat(scale, BLOCK, axis=axis, total_repeat_length=scale.shape[axis] * BLOCK).take(
    jnp.arange(size), axis=axis
  )


def dequantize(lhs, rhs, lhs_scale, rhs_scale, *, transpose_rhs: bool = False) -> tuple[jax.Array, jax.Array]:
  """(lhs, rhs) in float32, each element times its scale; rhs keeps its layout."""
  k = lhs.shape[1]
  ls = _expand(lhs_scale.astype(jnp.float32), 1, k)
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  rs = _expand(_expand(rhs_scale.astype(jnp.float32), 1, k), 2, n)
  if transpose_rhs:
    rs = rs.swapaxes(1, 2)
  return lhs.astype(jnp.float32) * ls, rhs.astype(jnp.float32) * rs


def quantize(x: jax.Array, dtype: str, block: tuple[int | None, ...]) -> tuple[jax.Array, jax.Array]:
  """(values, float32 scales) of x with one scale per block: `block` gives each axis's block
  length, None for the whole axis (e.g. (1, None) per row; (None, 128, 128) per expert and
  128x128 block). A block's amax maps to the dtype's largest value (QMAX); an all-zero block
  gets scale 1; scale = amax * float32(1 / QMAX). Round to nearest: float8 by its cast, int8
  by rounding and clipping."""
  if dtype not in QMAX:
    raise ValueError(f"quantize takes an element dtype of {tuple(QMAX)}, got {dtype!r}")
  qmax = QMAX[dtype]
  x = x.astype(jnp.float32)
  blocks = tuple(size if b is None else b for size, b in zip(x.shape, block))
  padded = jnp.pad(x, [(0, -size % b) for size, b in zip(x.shape, blocks)])
  split = sum(((size // b, b) for size, b in zip(padded.shape, blocks)), ())  # (blocks, within) per axis
  amax = jnp.abs(padded).reshape(split).max(axis=tuple(range(1, 2 * x.ndim, 2)))
  # amax times the f32 reciprocal, written out: XLA turns a division by a constant into that
  # product anyway (amax / 448 came out 1 ulp off), so the rule is the one every backend runs.
  scale = jnp.where(amax > 0, amax * np.float32(1 / qmax), 1.0).astype(jnp.float32)
  per_elem = scale.reshape(sum(((s, 1) for s in scale.shape), ()))
  q = (padded.reshape(split) / per_elem).reshape(padded.shape)[tuple(slice(0, size) for size in x.shape)]
  q = jnp.clip(jnp.round(q), -qmax, qmax).astype(dtype) if dtype == "int8" else q.astype(dtype)
  return q, scale


def quantize_operands(lhs, rhs, fmt: str) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(lhs, rhs, lhs_scale, rhs_scale) of float lhs [m,k] and rhs [g,k,n] in the format
  'float8_e4m3fn:channelwise' (etc.), with the scales' shapes of that scheme."""
  dtype, name = element_dtype(fmt), scheme(fmt)
  if dtype not in QUANT_DTYPES or name not in SCHEMES:
    raise ValueError(f"format must be one of '<{'|'.join(QUANT_DTYPES)}>:<{'|'.join(SCHEMES)}>', got {fmt!r}")
  lhs_block, rhs_block = operand_blocks(fmt)
  (lq, ls), (rq, rs) = quantize(lhs, dtype, lhs_block), quantize(rhs, dtype, rhs_block)
  return lq, rq, ls, rs


def operand_blocks(fmt: str) -> tuple[tuple[int | None, ...], tuple[int | None, ...]]:
  """quantize's blocks of lhs [m,k] and rhs [g,k,n] in the format's scheme: one row (one
  expert) at a time, so operands may be quantized a slice of rows (of experts) at a time."""
  if scheme(fmt) == "channelwise":
    return (1, None), (1, None, 1)
  return (1, BLOCK), (1, BLOCK, BLOCK)


def _quantized(lhs, rhs, lhs_scale, rhs_scale, table, count, *, rows: int, transpose_rhs: bool):
  """kernels.reference's loop for quantized operands, each tile and its group's weights
  dequantized: the products' sum and the sum of their squares (error_scale's before its root)."""
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  contract = (1, 1 if transpose_rhs else 0)

  def step(j, outs, lhs, rhs, lhs_scale, rhs_scale):
    ts, lo, hi, grp = kref.tile(table, j)
    x = jax.lax.dynamic_slice_in_dim(lhs, ts, rows, 0)
    xs = jax.lax.dynamic_slice_in_dim(lhs_scale, ts, rows, 0)
    w = jax.lax.dynamic_index_in_dim(rhs, grp, 0, keepdims=True)
    ws = jax.lax.dynamic_index_in_dim(rhs_scale, grp, 0, keepdims=True)
    a, b = dequantize(x, w, xs, ws, transpose_rhs=transpose_rhs)
    keep = kref.mask(ts, lo, hi, rows)
    new = []
    for acc, (p, q) in zip(outs, ((a, b[0]), (a * a, b[0] * b[0]))):
      y = kref.dot(p, q, contract)
      cur = jax.lax.dynamic_slice_in_dim(acc, ts, rows, 0)
      new.append(jax.lax.dynamic_update_slice_in_dim(acc, jnp.where(keep, y, cur), ts, 0))
    return tuple(new)

  zeros = jnp.zeros((lhs.shape[0], n), jnp.float32)
  return kref.loop(count, (zeros, zeros), (lhs, rhs, lhs_scale, rhs_scale), step)


def reference_program(lhs, rhs, group_sizes, lhs_scale, rhs_scale, *, transpose_rhs: bool = False) -> kref.Program:
  """The compiled loop (not run) whose outputs are the dequantized products' sum and the sum
  of their squares, group by group (kernels.reference): reference and error_scale in one."""
  m = lhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  operands = (lhs, rhs, lhs_scale, rhs_scale)
  return kref.program(_quantized, operands, group_sizes, m, ((m, n), (m, n)), transpose_rhs=transpose_rhs)


def reference(lhs, rhs, group_sizes, lhs_scale, rhs_scale, *, transpose_rhs: bool = False) -> jax.Array:
  """float32 jax.lax.ragged_dot, at HIGHEST precision, of the dequantized operands, computed
  group by group (kernels.reference); group_sizes must be concrete. With error_scale too, run
  reference_program once: each of the two runs it whole."""
  args = (lhs, rhs, group_sizes, lhs_scale, rhs_scale)
  return reference_program(*args, transpose_rhs=transpose_rhs)()[0]


def error_scale(lhs, rhs, group_sizes, lhs_scale, rhs_scale, *, transpose_rhs: bool = False) -> jax.Array:
  """sqrt(sum_k (a[r,k] * b[k,c])^2) of the dequantized operands, per output element: the
  size of the terms an output sums, which its accumulation error grows with. Computed group
  by group (kernels.reference); group_sizes must be concrete."""
  args = (lhs, rhs, group_sizes, lhs_scale, rhs_scale)
  return jnp.sqrt(reference_program(*args, transpose_rhs=transpose_rhs)()[1])


# Unit roundoff of the accumulation of products of each element dtype. Hopper's fp8 tensor
# cores keep about 14 bits of the running sum (DeepSeek-V3 technical report, arXiv:2412.19437,
# section 3.3.2), so float8 is judged by that wherever it runs. int8 products sum exactly in
# int32 (or within f32's 24 bits); scaling then rounds once in f32.
ACCUMULATION_ROUNDOFF = {"float8_e4m3fn": 2.0**-14, "int8": 2.0**-24}
# Unit roundoff of the output's rounding.
OUTPUT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}


@dataclasses.dataclass(frozen=True)
class Tolerance:
  """|out - ref| <= rtol * |ref| + gamma * error_scale, elementwise.

  rtol = 2 u_out: the output's rounding, u_out its dtype's unit roundoff (bf16 2^-8).
  gamma = 4 sqrt(k) u_acc: accumulation of k products rounded at u_acc each, as a
      probabilistic bound (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019: error ~
      sqrt(k) u times the terms' size; 4 for the tail), u_acc the element dtype's
      ACCUMULATION_ROUNDOFF, at least f32's 2^-24 (the reference's own).
  Both sides use the same quantized values and scales, so the values' own rounding (fp8's 3
  mantissa bits) is not in the error: a kernel that drops a k block, misreads a scale or
  crosses a group is off by a share of error_scale far above gamma (for k = 7168, gamma is
  2.1% and one missing 128-block of k is off by ~13%).
  """

  rtol: float
  gamma: float

  def bound(self, ref, scale):
    return self.rtol * np.abs(np.asarray(ref, np.float64)) + self.gamma * np.asarray(scale, np.float64)


def tolerance(fmt: str, k: int, out_dtype) -> Tolerance:
  u_out = OUTPUT_ROUNDOFF[jnp.dtype(out_dtype).name]
  u_acc = max(ACCUMULATION_ROUNDOFF[element_dtype(fmt)], 2.0**-24)
  return Tolerance(rtol=2 * u_out, gamma=4 * math.sqrt(k) * u_acc)


# --- training: the three matmuls of a linear in fp8 (DeepSeek-V3's recipe) ----------------
#
# fwd   x [m,k] in 1x128 blocks along k,  w [g,k,n] in 128x128 blocks
# dlhs  dout [m,n] in 1x128 blocks along n, w's blocks read transposed ([g,n,k] frame)
# drhs  x and dout in 128x1 blocks along the tokens, per group (token_blocks)
#
# The weight gradient contracts over tokens, so its scales must be constant along 128 tokens
# of one group: a block that straddled two groups' rows would give both the scale of the
# larger values. So each local group's rows are moved to a 128-aligned run of a padded token
# axis (zeros after its last row), as DeepGEMM's k-grouped weight-gradient kernels take them:
# a group's blocks hold its rows only, and a kernel steps over whole 128-token blocks with no
# row mask. The padding costs at most 127 rows a group.


class TokenBlocks(NamedTuple):
  """Where each local group's rows lie on the padded token axis of token_blocks.

  first: int32 [g], the group's first 128-token block; count: int32 [g], its blocks
  (ceil(rows / 128), 0 for an empty group); source: int32 [T], the row of x each padded
  position takes, or m for a zero (padding, rows of no local group, rows past the groups)."""

  first: jax.Array
  count: jax.Array
  source: jax.Array


def num_token_blocks(m: int, g: int) -> int:
  """A static bound on sum(ceil(rows_i / 128)) over g groups of m rows: each group wastes
  less than one block."""
  return -(-m // BLOCK) + g


def token_blocks(group_sizes, m: int, group_offset, g_local: int) -> TokenBlocks:
  """The padded token axis (num_token_blocks(m, g_local) blocks of 128) of the local groups
  [group_offset, group_offset + g_local) of group_sizes."""
  offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
  starts, ends = common.group_row_bounds(group_sizes, m, offset, g_local)
  rows = ends - starts
  count = (rows + BLOCK - 1) // BLOCK
  done = jnp.cumsum(count)
  first = (done - count).astype(jnp.int32)
  pos = jnp.arange(BLOCK * num_token_blocks(m, g_local), dtype=jnp.int32)
  grp = jnp.minimum(jnp.searchsorted(done, pos // BLOCK, side="right", method="scan_unrolled"), g_local - 1)
  within = pos - first[grp] * BLOCK
  source = jnp.where((within >= 0) & (within < rows[grp]), starts[grp] + within, m)
  return TokenBlocks(first, count.astype(jnp.int32), source.astype(jnp.int32))


def quantize_tokens(x: jax.Array, blocks: TokenBlocks, dtype: str) -> tuple[jax.Array, jax.Array]:
  """x [m, c] on the padded token axis, quantized in 128x1 blocks along it: (values [c, T],
  tokens contiguous, the k-major operand an 8-bit MMA reads; float32 scales [T / 128, c]).
  One gather, an amax and a cast in XLA: x read, 1 byte an element written, plus the scales."""
  padded = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])[blocks.source]
  q, s = quantize(padded, dtype, (BLOCK, 1))
  return q.T, s


def quantize_weights(w: jax.Array, dtype: str, *, transpose_rhs: bool = False) -> tuple[jax.Array, jax.Array]:
  """w [g,k,n] (or [g,n,k]) in 128x128 blocks: values in w's layout, scales in the [g,k,n]
  frame (kernels.quant's convention for rhs_scale)."""
  q, s = quantize(w, dtype, (1, BLOCK, BLOCK))
  return q, s.swapaxes(1, 2) if transpose_rhs else s


@functools.partial(
  jax.tree_util.register_dataclass, data_fields=["values", "scales", "other"], meta_fields=["transpose_rhs"]
)
@dataclasses.dataclass(frozen=True)
class TrainingWeights:
  """Weights quantized for fp8 training (training_weights), what ragged_dot's rhs_quantized
  takes: values in the weights' layout ([g,n,k] with transpose_rhs), scales in the [g,k,n]
  frame, `other` the same values in the other layout, or None. transpose_rhs is kept (a static
  field) because square block grids make the two frames' scales the same shape."""

  values: jax.Array
  scales: jax.Array
  other: jax.Array | None
  transpose_rhs: bool


def training_weights(
  w: jax.Array, dtype: str = "float8_e4m3fn", *, transpose_rhs: bool = False, both_layouts: bool = True
) -> TrainingWeights:
  """w [g,k,n] (or [g,n,k] with transpose_rhs) in 128x128 blocks, as fp8 training's fwd and
  dlhs read it; dtype the element dtype or the training format. A backend that reads fp8
  weights k-major only (Backend.k_major_fp8: mosaic_gpu) takes [g,n,k] for the forward and
  [g,k,n] for dlhs, and with both_layouts both come from one pass (XLA writes them in one
  fusion: on DeepSeek-V3 up's weights of 8 experts 712 MB moved, where one layout and a copy of
  it move 830 MB, read from the program built for an H100). Where the backends read either
  layout (pallas_gpu, xla), both_layouts=False saves the second copy's byte a weight."""
  q, s = quantize_weights(w, element_dtype(dtype), transpose_rhs=transpose_rhs)
  return TrainingWeights(q, s, q.swapaxes(1, 2) if both_layouts else None, bool(transpose_rhs))


def check_training_format(fmt: str) -> str:
  """fmt, or a ValueError naming the formats ragged_dot trains in."""
  if fmt not in TRAINING_FORMATS:
    why = (
      "; channelwise scales cannot be carried through dlhs (its contraction is over n, along which a per-column "
      "weight scale varies)"
      if scheme(str(fmt)) == "channelwise"
      else ""
    )
    raise ValueError(
      f"quantize= takes one of {TRAINING_FORMATS} (DeepSeek-V3's recipe: 1x128 activation and 128x128 weight "
      f"blocks), got {fmt!r}{why}"
    )
  return fmt
