"""Pallas TPU grouped matmuls: jax's megablox gmm/tgmm kernels, made to agree with lax.

Megablox needs m % tm == 0 and leaves rows outside the local groups uninitialised
(NaN under interpret). Here m is padded up to tm and those rows are zeroed, so results
equal jax.lax.ragged_dot. The tiling is a TpuConfig in the op's own (m, k, n) frame.
"""

from __future__ import annotations

import functools
import importlib

import jax.numpy as jnp

from kernels import common
from kernels.pallas_tpu.config import TpuConfig

# `megablox.gmm` the attribute is the custom_vjp op; we want the kernel module.
_megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def gmm(
  lhs, rhs, group_sizes, *, config: TpuConfig, out_dtype, transpose_rhs=False, group_offset=None, interpret=False
):
  m = lhs.shape[0]
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  out = _megablox.gmm(
    common.pad_rows(lhs, config.tm),
    rhs,
    group_sizes.astype(jnp.int32),
    out_dtype,
    tiling=config.tiling(),
    group_offset=offset,
    transpose_rhs=transpose_rhs,
    interpret=interpret,
  )[:m]
  keep = common.local_row_mask(group_sizes, m, offset, rhs.shape[0])
  return jnp.where(keep[:, None], out, jnp.zeros((), out.dtype))


def tgmm(lhs, rhs, group_sizes, *, num_groups: int, config: TpuConfig, out_dtype, group_offset=None, interpret=False):
  """Per-group lhs^T @ rhs: [m,k] x [m,n] -> [num_groups,k,n]."""
  # Under vmap with group_sizes unbatched, megablox's tgmm leaves the last group's output
  # NaN (interpret mode, jax 0.10.2); batching every operand avoids it.
  impl = functools.partial(_tgmm, num_groups=num_groups, config=config, out_dtype=out_dtype, interpret=interpret)
  offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
  return common.broadcast_vmap(impl, lhs, rhs, group_sizes, offset)


def _tgmm(lhs, rhs, group_sizes, offset, *, num_groups, config, out_dtype, interpret):
  offset = offset.astype(jnp.int32)
  # Zero-padded rows lie past sum(group_sizes), so no group reduces over them.
  lhs_t = common.pad_rows(lhs, config.tm).swapaxes(0, 1)
  return _megablox.tgmm(
    lhs_t,
    common.pad_rows(rhs, config.tm),
    group_sizes.astype(jnp.int32),
    out_dtype,
    tiling=config.tiling(),
    group_offset=offset,
    num_actual_groups=num_groups,
    interpret=interpret,
  )
