"""Pallas GPU (Triton) transposed grouped matmul: out[i] = lhs[rows of i]^T @ rhs[rows of i].

This is the weight gradient of gmm: lhs [m,k], rhs (dout) [m,n] -> [g,k,n]. Each
program owns one (group, k block, n block) output tile and reduces over only that
group's rows, so an empty group runs zero loop iterations and stores zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import group_metadata
from kernels.config import GpuConfig


def _tgmm_kernel(start_ref, end_ref, lhs_ref, rhs_ref, out_ref, *, k, n, block_m, block_k,
                 block_n, precision):
  group, kb, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, end = start_ref[group], end_ref[group]
  ks = kb * block_k + jnp.arange(block_k)
  ns = nb * block_n + jnp.arange(block_n)
  k_in, n_in = ks < k, ns < n

  def step(mb, acc):
    rows = mb * block_m + jnp.arange(block_m)
    in_group = (rows >= start) & (rows < end)
    a = plgpu.load(lhs_ref.at[pl.ds(mb * block_m, block_m), pl.ds(kb * block_k, block_k)],
                   mask=in_group[:, None] & k_in[None, :], other=0.0)
    b = plgpu.load(rhs_ref.at[pl.ds(mb * block_m, block_m), pl.ds(nb * block_n, block_n)],
                   mask=in_group[:, None] & n_in[None, :], other=0.0)
    return acc + plgpu.dot(a, b, trans_a=True, precision=precision)

  first = start // block_m
  last = jnp.where(end > start, (end + block_m - 1) // block_m, first)
  acc = jax.lax.fori_loop(first, last, step, jnp.zeros((block_k, block_n), jnp.float32))
  plgpu.store(out_ref.at[group, pl.ds(kb * block_k, block_k), pl.ds(nb * block_n, block_n)],
              acc.astype(out_ref.dtype), mask=k_in[:, None] & n_in[None, :])


def tgmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, num_groups: int,
         config: GpuConfig, out_dtype, group_offset: jax.Array | None = None,
         precision=None, interpret: bool = False) -> jax.Array:
  """Per-group lhs^T @ rhs: [m,k] x [m,n] -> [num_groups,k,n] for groups
  [group_offset, group_offset + num_groups)."""
  m, k = lhs.shape
  n = rhs.shape[1]
  # config is in the drhs frame (m, k, n): block_m steps over rows, block_k/n tile the output.
  cfg = config.clamped(m, k, n)
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  starts, ends = group_metadata.group_row_bounds(group_sizes, m, offset, num_groups)
  kernel = functools.partial(_tgmm_kernel, k=k, n=n, block_m=cfg.block_m, block_k=cfg.block_k,
                             block_n=cfg.block_n, precision=precision)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
      grid=(num_groups, pl.cdiv(k, cfg.block_k), pl.cdiv(n, cfg.block_n)),
      compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
      interpret=interpret,
      name="ragtune_tgmm",
  )(starts, ends, lhs, rhs)
