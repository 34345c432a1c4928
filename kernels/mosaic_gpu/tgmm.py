"""Mosaic GPU (Hopper TMA + wgmma) transposed grouped matmul: out[i] = a[rows of i]^T @ b[rows of i].

This is the weight gradient of gmm.py: lhs [m,k], dout [m,n] -> [g,k,n] (with
transpose_rhs, dout [m,n], lhs [m,k] -> [g,n,k]). Layout, in order: group row ranges
(group metadata), launch order, kernel body, kernel call.

Like jax's `transposed_ragged_dot_mgpu`, a persistent grid walks (group, output tile)
cells, and each cell runs a TMA pipeline over only its group's row blocks into a wgmma
whose A operand is the a tile read transposed from shared memory. Unlike it:

- any m and n: rows of a group's first and last block that belong to a neighbour are
  zeroed in shared memory before the wgmma reads them; ragged output tiles rely on TMA
  reading zeros past an array's end and clipping stores;
- group_offset: the cells cover the local groups [group_offset, group_offset + g) only;
- an empty group runs no pipeline step and stores a zero tile;
- the SM count comes from the device; no test-only imports.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import common
from kernels.mosaic_gpu.gmm import (
  ROW_TILE,
  band_snake,
  check_inputs,
  interpret_params,
  num_sms,
  out_cols,
  pad_to_multiple,
  swizzle_elems,
)


def group_row_blocks(start, end, block_m):
  """(first row block, number of row blocks) a group's rows [start, end) touch; 0 if empty."""
  first = start // block_m
  count = jnp.where(end > start, (end + block_m - 1) // block_m - first, 0)
  return first, count


def _tgmm_kernel(
  start_ref,
  end_ref,
  a_gmem,
  b_gmem,
  o_gmem,
  *,
  num_groups,
  block_m,
  tile_a,
  tile_b,
  grid_a,
  grid_b,
  grid_block_n,
  max_concurrent_steps,
):

  @plgpu.nd_loop((num_groups, grid_a * grid_b), collective_axes="sm")
  def _cell(loop_info):
    group = loop_info.index[0]
    ai, bi = band_snake(loop_info.index[1], grid_a, grid_b, grid_block_n)
    start, end = start_ref[group], end_ref[group]
    first, count = group_row_blocks(start, end, block_m)

    def acc_scope(acc_ref):
      def step(idx, a_smem, b_smem):
        row_block = first + idx[0]

        # Only a group's edge blocks hold a neighbour's rows; zero them in a (b's rows
        # then multiply zeros) before the wgmma reads the tile.
        @pl.when((idx[0] == 0) | (idx[0] == count - 1))
        def _mask_edges():
          rows = row_block * block_m + jax.lax.broadcasted_iota(jnp.int32, (block_m, tile_a), 0)
          keep = (rows >= start) & (rows < end)
          a_smem[...] = jnp.where(keep, a_smem[...], jnp.zeros((), a_smem.dtype))
          plgpu.commit_smem()

        plgpu.wgmma(acc_ref, a_smem.T, b_smem)
        plgpu.wgmma_wait(1)  # step s-1's buffers are refilled next (delay_release=1)

      @pl.when(count > 0)
      def _reduce():
        plgpu.emit_pipeline(
          step,
          grid=(count,),
          in_specs=[
            plgpu.BlockSpec((block_m, tile_a), lambda i: (first + i, ai), delay_release=1),
            plgpu.BlockSpec((block_m, tile_b), lambda i: (first + i, bi), delay_release=1),
          ],
          max_concurrent_steps=max_concurrent_steps,
        )(a_gmem, b_gmem)

      return acc_ref[...]

    acc = pl.run_scoped(acc_scope, plgpu.ACC((tile_a, tile_b)))

    @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((tile_a, tile_b), o_gmem.dtype))
    def _store(o_smem):
      o_smem[...] = acc.astype(o_smem.dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[group, pl.ds(ai * tile_a, tile_a), pl.ds(bi * tile_b, tile_b)])
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def tgmm(
  a: jax.Array,
  b: jax.Array,
  group_sizes: jax.Array,
  *,
  num_groups: int,
  block_m: int,
  tile_a: int,
  tile_b: int,
  grid_block_n: int,
  max_concurrent_steps: int,
  out_dtype,
  group_offset: jax.Array | None = None,
  interpret=False,
) -> jax.Array:
  """Per-group a^T @ b: [m,ka] x [m,kb] -> [num_groups,ka,kb] for the groups
  [group_offset, group_offset + num_groups) of group_sizes; an output tile is
  [tile_a, tile_b] and block_m rows are reduced per pipeline step. a and b share a 16-bit
  dtype."""
  check_inputs(a, b)
  m, ka = a.shape
  kb = b.shape[1]
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  starts, ends = common.group_row_bounds(group_sizes, m, offset, num_groups)
  # TMA boxes are [8, 128 bytes]: pad rows (past every group) and columns to them.
  a = pad_to_multiple(pad_to_multiple(a, 0, ROW_TILE), 1, swizzle_elems(a.dtype))
  b = pad_to_multiple(pad_to_multiple(b, 0, ROW_TILE), 1, swizzle_elems(b.dtype))
  ka_pad, kb_pad = a.shape[1], b.shape[1]
  kernel = functools.partial(
    _tgmm_kernel,
    num_groups=num_groups,
    block_m=block_m,
    tile_a=tile_a,
    tile_b=tile_b,
    grid_a=pl.cdiv(ka_pad, tile_a),
    grid_b=pl.cdiv(kb_pad, tile_b),
    grid_block_n=grid_block_n,
    max_concurrent_steps=max_concurrent_steps,
  )
  kernel.__name__ = "ragtune_mgpu_tgmm"  # the kernel's name in the machine code and profiles
  out_shape = (num_groups, out_cols(ka_pad, tile_a, interpret), out_cols(kb_pad, tile_b, interpret))
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
    grid=(num_sms(interpret),),
    grid_names=("sm",),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret_params(interpret),
  )
  return call(starts, ends, a, b)[:, :ka, :kb]
