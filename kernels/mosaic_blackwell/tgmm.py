"""Mosaic GPU Blackwell (tcgen05) transposed grouped matmul: out[i] = a[rows of i]^T @ b[rows of i].

The weight gradient of gmm.py: lhs [m,k], dout [m,n] -> [g,k,n] (with transpose_rhs, dout
[m,n], lhs [m,k] -> [g,n,k]). The roles, barriers and TMEM accumulator are gmm.py's
(pipeline_roles); what differs:

- a cell is (group, a tile, b tile) of the output, walked group by group, a band of group_m a
  tiles over the b tiles (common.program_tile); its pipeline steps are block_m of the group's
  rows each, from the group's first row rounded down to 8 (a TMA box), so only a group's first
  and last steps hold a neighbour's rows;
- the MMA reads a's tile transposed from shared memory ([block_m, 128] as [128, block_m]):
  the cell's rows are a's columns, 128 a CTA, the TMEM lanes;
- a third warpgroup zeroes a neighbour's rows of a's tile in shared memory (first and last
  steps only) before the MMA reads it; the rows of b then multiply zeros;
- an empty group runs no step and stores a zero tile; output strips past the 64-padded
  extent are not stored.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import common
from kernels.mosaic_blackwell.config import EPI_TILE, ROW_TILE, SWIZZLE_ELEMS, BlackwellConfig
from kernels.mosaic_blackwell.gmm import (
  PAIR,
  Cell,
  CellIndex,
  barriers,
  launch,
  operand_transforms,
  pipeline_roles,
  store_strips,
)
from kernels.mosaic_gpu.gmm import check_inputs, pad_to_multiple

LANES = 128  # TMEM lanes: a CTA's rows of the output cell (columns of a)


def group_steps(start, end, block_m: int):
  """(first row, pipeline steps) that reduce a group's rows [start, end) in block_m-row steps,
  from its first row rounded down to a TMA box; an empty group takes no step. lax only (rows
  are not negative): the warps run it under warp_map, which lowers no jit."""
  first = lax.div(start, ROW_TILE) * ROW_TILE
  steps = (end > start).astype(jnp.int32) * lax.div(end - first + block_m - 1, block_m)
  return first, steps


def _tgmm_kernel(
  tile_a_ref, tile_b_ref, start_ref, end_ref, a_gmem, b_gmem, o_gmem, *, num_groups: int, cfg: BlackwellConfig
):
  block_m, block_n = cfg.block_m, cfg.block_n
  cell_a = LANES * cfg.ctas  # a columns (output rows) of a cell
  cta_b = block_n // cfg.ctas  # b columns this CTA loads
  m, ka = a_gmem.shape
  kb = b_gmem.shape[1]
  cells = tile_a_ref.shape[0]  # a group's cells: the wrapper's tables hold its banded order
  dtype = a_gmem.dtype
  transforms = operand_transforms(dtype)
  cta = lax.axis_index(PAIR) if cfg.cta_pair else 0
  steps_ring = cfg.max_concurrent_steps
  bars = barriers(cfg)
  # The MMA (the first CTA's, with cta_pair) waits until every CTA has masked its a tile.
  bars["masked"] = (
    plgpu.ClusterBarrier(collective_axes=(PAIR,), num_barriers=steps_ring, num_arrivals=1)  # per CTA
    if cfg.cta_pair
    else plgpu.Barrier(num_arrivals=1, num_barriers=steps_ring)
  )

  @functools.partial(
    pl.run_scoped,
    a_smem=plgpu.SMEM((steps_ring, block_m, LANES), dtype, transforms=transforms),
    b_smem=plgpu.SMEM((steps_ring, block_m, cta_b), dtype, transforms=transforms),
    out_smem=plgpu.SMEM((LANES, EPI_TILE), o_gmem.dtype),
    acc_tmem=plgpu.TMEM((LANES, 2 * block_n), jnp.float32, collective=cfg.cta_pair),
    **bars,
    collective_axes="wg",
  )
  def _scope(a_smem, b_smem, out_smem, acc_tmem, **bars):
    def cell(c: CellIndex) -> Cell:
      group = c.index[0]
      ai, bi = tile_a_ref[c.index[1]], tile_b_ref[c.index[1]]
      start, end = start_ref[group], end_ref[group]
      first, steps = group_steps(start, end, block_m)
      return Cell(steps, (group, ai, bi, start, end, first))

    def accumulator(buf):
      return acc_tmem.at[:, pl.ds(buf * block_n, block_n)]

    def load(at, i, slot, a_barrier, b_barrier):
      _, ai, bi, _, _, first = at
      rows = pl.ds(first + i * block_m, block_m)
      # a: each CTA its own columns, on its own barrier (its mask warpgroup waits on it).
      plgpu.copy_gmem_to_smem(a_gmem.at[rows, pl.ds(ai * cell_a + cta * LANES, LANES)], a_smem.at[slot], a_barrier)
      pair = dict(collective_axes=PAIR, leader_tracked=plgpu.CopyPartition.PARTITIONED(1)) if cfg.cta_pair else {}
      plgpu.copy_gmem_to_smem(b_gmem.at[rows, pl.ds(bi * block_n, block_n)], b_smem.at[slot], b_barrier, **pair)

    def mask(at, i, slot):
      _, _, _, start, end, first = at

      @pl.when((first < start) & (i == 0) | (first + (i + 1) * block_m > end))
      def _():
        rows = first + i * block_m + lax.broadcasted_iota(jnp.int32, (block_m, LANES), 0)
        tile = a_smem.at[slot]
        tile[...] = jnp.where((rows >= start) & (rows < end), tile[...], jnp.zeros((), dtype))

    def mma(at, buf, i, slot, consumed, accumulate):
      plgpu.tcgen05_mma(
        accumulator(buf),
        a_smem.at[slot].T,
        b_smem.at[slot],
        consumed,
        accumulate=accumulate,
        collective_axis=PAIR if cfg.cta_pair else None,
      )

    def epilogue(at, buf, has_acc):
      group, ai, bi = at[:3]
      row0 = ai * cell_a + cta * LANES
      rows = jnp.clip(ka - row0, 0, LANES)
      store_strips(
        accumulator(buf),
        has_acc,
        out_smem,
        o_gmem.at[group],
        row0=row0,
        lo=0,
        rows=rows,
        col0=bi * block_n,
        n=kb,
        cols=block_n,
      )

    pipeline_roles(
      cfg=cfg,
      grid=(num_groups, cells),
      cell=cell,
      load=load,
      mma=mma,
      epilogue=epilogue,
      mask=mask,
      **bars,
    )

  plgpu.wait_smem_to_gmem(0)  # every output tile is written before the kernel ends


def tgmm(
  a: jax.Array,
  b: jax.Array,
  group_sizes: jax.Array,
  *,
  num_groups: int,
  config: BlackwellConfig,
  out_dtype,
  group_offset: jax.Array | None = None,
  interpret=False,
) -> jax.Array:
  """Per-group a^T @ b: [m,ka] x [m,kb] -> [num_groups,ka,kb] for the groups
  [group_offset, group_offset + num_groups) of group_sizes. A cell is [128, block_n] of the
  output ([256, block_n] with cta_pair); block_m rows are reduced per pipeline step. a and b
  share a 16-bit dtype."""
  check_inputs(a, b)
  if why := config.valid_for("drhs"):
    raise ValueError(f"BlackwellConfig {config} cannot drive tgmm: {why}")
  m, ka = a.shape
  kb = b.shape[1]
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  starts, ends = common.group_row_bounds(group_sizes, m, offset, num_groups)
  # TMA boxes are [8, 128 bytes]: zero-pad columns to 128 bytes and rows (past every group) to
  # 8, and to one step at least, so no box is larger than its array.
  rows = max(-(-m // ROW_TILE) * ROW_TILE, config.block_m)
  a = pad_to_multiple(pad_to_multiple(a, 1, SWIZZLE_ELEMS), 0, rows)
  b = pad_to_multiple(pad_to_multiple(b, 1, SWIZZLE_ELEMS), 0, rows)
  kernel = functools.partial(_tgmm_kernel, num_groups=num_groups, cfg=config)
  out_type = jax.ShapeDtypeStruct((num_groups, a.shape[1], b.shape[1]), out_dtype)
  # A group's cells in banded order (common.program_tile), as tables.
  tiles_a, tiles_b = -(-a.shape[1] // (128 * config.ctas)), -(-b.shape[1] // config.block_n)
  tile_a, tile_b = common.program_tile(np.arange(tiles_a * tiles_b), tiles_a, tiles_b, config.group_m)
  call = launch(kernel, "ragtune_tcgen05_tgmm", out_type, config, interpret, warpgroups=3)
  out = call(jnp.asarray(tile_a, jnp.int32), jnp.asarray(tile_b, jnp.int32), starts, ends, a, b)
  return out[:, :ka, :kb]
