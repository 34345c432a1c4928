"""XLA path: jax.lax.ragged_dot, with transpose_rhs and group_offset added.

lax's own group_offset raises "Unimplemented group_offset support" (jax/_src/lax/lax.py),
so expert parallelism is done by folding the rows of non-local groups
into the first/last local group and zeroing them.

Under vmap, lax batches ragged_dot only when every operand is batched (else "NYI"), so
both ops here broadcast the unbatched operands first (`common.broadcast_vmap`). Reverse-mode
differentiation goes through `kernels.ragged_dot`'s custom_vjp, as custom_vmap has none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import common, quant

_TRANSPOSED_RHS = jax.lax.RaggedDotDimensionNumbers(
  dot_dimension_numbers=(([1], [2]), ([], [])),
  lhs_ragged_dimensions=[0],
  rhs_group_dimensions=[0],
)


def _with_offset(fn, group_offset, **kw):
  """fn(lhs, rhs, group_sizes, group_offset, **kw) as an impl of array arguments only."""
  if group_offset is None:
    return lambda a, b, s: fn(a, b, s, None, **kw), ()
  return lambda a, b, s, o: fn(a, b, s, o, **kw), (jnp.asarray(group_offset, jnp.int32),)


def gmm(lhs, rhs, group_sizes, *, out_dtype, transpose_rhs=False, group_offset=None, precision=None):
  impl, extra = _with_offset(_gmm, group_offset, out_dtype=out_dtype, transpose_rhs=transpose_rhs, precision=precision)
  return common.broadcast_vmap(impl, lhs, rhs, group_sizes, *extra)


def _gmm(lhs, rhs, group_sizes, group_offset, *, out_dtype, transpose_rhs, precision):
  m = lhs.shape[0]
  g_local = rhs.shape[0]
  sizes = group_sizes.astype(jnp.int32)
  keep = None
  if group_offset is not None or sizes.shape[0] != g_local:
    offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
    starts, ends = common.group_row_bounds(sizes, m, offset, g_local)
    local = ends - starts
    # Rows before the shard go to its first group, rows after to its last; zeroed below.
    sizes = local.at[0].add(starts[0]).at[-1].add(m - ends[-1])
    keep = common.local_row_mask(group_sizes, m, offset, g_local)
  if transpose_rhs:
    out = jax.lax.ragged_dot_general(
      lhs, rhs, sizes, _TRANSPOSED_RHS, precision=precision, preferred_element_type=out_dtype
    )
  else:
    out = jax.lax.ragged_dot(lhs, rhs, sizes, precision=precision, preferred_element_type=out_dtype)
  if keep is not None:
    out = jnp.where(keep[:, None], out, jnp.zeros((), out.dtype))
  return out.astype(out_dtype)


_RAGGED_CONTRACTION = jax.lax.RaggedDotDimensionNumbers(
  dot_dimension_numbers=(([0], [0]), ([], [])),
  lhs_ragged_dimensions=[0],
  rhs_group_dimensions=[],
)


def tgmm(lhs, rhs, group_sizes, *, num_groups, out_dtype, group_offset=None, precision=None):
  """Per-group lhs^T @ rhs: [m,k] x [m,n] -> [num_groups,k,n] (ragged contraction)."""
  impl, extra = _with_offset(_tgmm, group_offset, num_groups=num_groups, out_dtype=out_dtype, precision=precision)
  return common.broadcast_vmap(impl, lhs, rhs, group_sizes, *extra)


def _tgmm(lhs, rhs, group_sizes, group_offset, *, num_groups, out_dtype, precision):
  m = lhs.shape[0]
  sizes = group_sizes.astype(jnp.int32)
  sliced = group_offset is not None or sizes.shape[0] != num_groups
  if sliced:
    offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
    starts, ends = common.group_row_bounds(sizes, m, offset, num_groups)
    # Non-local rows form a leading and a trailing pseudo-group, dropped afterwards.
    sizes = jnp.concatenate([starts[:1], ends - starts, (m - ends[-1])[None]])
  out = jax.lax.ragged_dot_general(
    lhs, rhs, sizes, _RAGGED_CONTRACTION, precision=precision, preferred_element_type=jnp.float32
  )
  if sliced:
    out = out[1:-1]
  return out.astype(out_dtype)


def gmm_quantized(
  lhs, rhs, group_sizes, lhs_scale, rhs_scale, *, out_dtype, transpose_rhs=False, group_offset=None, precision=None
):
  """gmm of quantized operands (kernels.quant). Channelwise: the values as bfloat16 (exact
  for float8_e4m3fn and int8) into an f32 ragged_dot, then each row times its token's scale
  and its group's column scales. Block scales vary along k, so they are applied before the
  product: the operands dequantized to f32, at HIGHEST precision."""
  del precision  # set by the scheme
  m, k = lhs.shape
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  if quant.scheme_of(m, k, n, g_local, lhs_scale.shape, rhs_scale.shape) == "channelwise":
    acc = gmm(
      lhs.astype(jnp.bfloat16),
      rhs.astype(jnp.bfloat16),
      group_sizes,
      out_dtype=jnp.float32,
      transpose_rhs=transpose_rhs,
      group_offset=group_offset,
    )
    offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
    # One elementwise fusion with the gather of each row's group's column scales; rows of no
    # local group stay 0 whatever their scales hold.
    cols = rhs_scale[:, 0, :][common.row_groups(group_sizes, m, offset, g_local)]
    keep = common.local_row_mask(group_sizes, m, offset, g_local)
    return jnp.where(keep[:, None], acc * lhs_scale * cols, 0.0).astype(out_dtype)
  a, b = quant.dequantize(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs)
  return gmm(
    a,
    b,
    group_sizes,
    out_dtype=out_dtype,
    transpose_rhs=transpose_rhs,
    group_offset=group_offset,
    precision=jax.lax.Precision.HIGHEST,
  )


def tgmm_quantized(a_t, b_t, a_scale, b_scale, count, *, out_dtype):
  return common.broadcast_vmap(lambda *a: _tgmm_quantized(*a, out_dtype=out_dtype), a_t, b_t, a_scale, b_scale, count)


def _tgmm_quantized(a_t, b_t, a_scale, b_scale, count, *, out_dtype):
  """drhs of a training format (kernels.Backend.grad_rhs_quantized): each 128-token block
  dequantized to f32, then a ragged contraction over the padded token axis at HIGHEST, the
  groups' runs of blocks its groups (consecutive from block 0, as quant.token_blocks lays them
  out) and the blocks after them a dropped last one."""
  num_blocks = a_scale.shape[0]
  a = (a_t.astype(jnp.float32).reshape(a_t.shape[0], num_blocks, -1) * a_scale.T[:, :, None]).reshape(a_t.shape)
  b = (b_t.astype(jnp.float32).reshape(b_t.shape[0], num_blocks, -1) * b_scale.T[:, :, None]).reshape(b_t.shape)
  block = a_t.shape[1] // num_blocks
  sizes = (count * block).astype(jnp.int32)
  sizes = jnp.concatenate([sizes, (a_t.shape[1] - sizes.sum())[None]])
  out = jax.lax.ragged_dot_general(
    a.T, b.T, sizes, _RAGGED_CONTRACTION, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
  )
  return out[:-1].astype(out_dtype)
