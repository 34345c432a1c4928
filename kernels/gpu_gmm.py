"""Pallas GPU (Triton) grouped matmul: out[rows of group i] = lhs[rows] @ rhs[i].

Layout, in order: tile schedule (group metadata), grid/index mapping, kernel body,
pallas_call. With transpose_rhs the weights are read as [g, n, k] blocks and fed to the
dot transposed, so dlhs never materialises rhs^T.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import group_metadata
from kernels.config import GpuConfig


def _grid(num_tiles: int, num_col_blocks: int, grid_order: str):
  """Launch grid and a function giving (tile, col_block) from program ids.

  Triton walks program axis 0 fastest, so the fastest-varying index goes first.
  """
  if grid_order == "m_fastest":
    return (num_tiles, num_col_blocks), lambda: (pl.program_id(0), pl.program_id(1))
  return (num_col_blocks, num_tiles), lambda: (pl.program_id(1), pl.program_id(0))


def _gmm_kernel(tile_seg_ref, tile_block_ref, active_ref, seg_start_ref, seg_end_ref,
                lhs_ref, rhs_ref, out_ref, *, k, n, g_local, block_m, block_k, block_n,
                transpose_rhs, precision, program_ids):
  t, j = program_ids()
  seg = tile_seg_ref[t]
  is_real = t < active_ref[0]
  is_group = (seg >= 1) & (seg <= g_local)

  row0 = tile_block_ref[t] * block_m
  rows = row0 + jnp.arange(block_m)
  row_mask = (rows >= seg_start_ref[seg]) & (rows < seg_end_ref[seg])
  cols = j * block_n + jnp.arange(block_n)
  out_mask = row_mask[:, None] & (cols < n)[None, :]
  out_block = out_ref.at[pl.ds(row0, block_m), pl.ds(j * block_n, block_n)]

  @pl.when(is_real & is_group)
  def _matmul():
    group = seg - 1

    def step(kb, acc):
      kk = kb * block_k + jnp.arange(block_k)
      k_in = kk < k
      a = plgpu.load(lhs_ref.at[pl.ds(row0, block_m), pl.ds(kb * block_k, block_k)],
                     mask=row_mask[:, None] & k_in[None, :], other=0.0)
      if transpose_rhs:
        b = plgpu.load(rhs_ref.at[group, pl.ds(j * block_n, block_n), pl.ds(kb * block_k, block_k)],
                       mask=(cols < n)[:, None] & k_in[None, :], other=0.0)
      else:
        b = plgpu.load(rhs_ref.at[group, pl.ds(kb * block_k, block_k), pl.ds(j * block_n, block_n)],
                       mask=k_in[:, None] & (cols < n)[None, :], other=0.0)
      return acc + plgpu.dot(a, b, trans_b=transpose_rhs, precision=precision)

    acc = jax.lax.fori_loop(0, pl.cdiv(k, block_k), step, jnp.zeros((block_m, block_n), jnp.float32))
    plgpu.store(out_block, acc.astype(out_ref.dtype), mask=out_mask)

  @pl.when(is_real & jnp.logical_not(is_group))
  def _zero_fill():
    plgpu.store(out_block, jnp.zeros((block_m, block_n), out_ref.dtype), mask=out_mask)


def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, config: GpuConfig,
        out_dtype, transpose_rhs: bool = False, group_offset: jax.Array | None = None,
        precision=None, interpret: bool = False) -> jax.Array:
  """Grouped matmul [m,k] x [g,k,n] (or [g,n,k] with transpose_rhs) -> [m,n].

  group_sizes may be longer than rhs's g (expert parallelism): rhs holds groups
  [group_offset, group_offset + g) and every other row comes out 0.
  """
  m, k = lhs.shape
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  cfg = config.clamped(m, k, n)
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)

  num_tiles = group_metadata.num_tiles_bound(m, cfg.block_m, g_local)
  seg_starts, seg_ends = group_metadata.segment_bounds(group_sizes, m, offset, g_local)
  tile_seg, tile_block, active = group_metadata.tile_schedule(seg_starts, seg_ends, cfg.block_m, num_tiles)

  grid, program_ids = _grid(num_tiles, pl.cdiv(n, cfg.block_n), cfg.grid_order)
  kernel = functools.partial(
      _gmm_kernel, k=k, n=n, g_local=g_local, block_m=cfg.block_m, block_k=cfg.block_k,
      block_n=cfg.block_n, transpose_rhs=transpose_rhs, precision=precision, program_ids=program_ids)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=grid,
      compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
      interpret=interpret,
      name="ragtune_gmm",
  )(tile_seg, tile_block, active, seg_starts, seg_ends, lhs, rhs)
