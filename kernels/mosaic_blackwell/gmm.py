"""Mosaic GPU Blackwell (tcgen05) grouped matmul: out[rows of group i] = lhs[rows] @ rhs[i].

Layout, in order: the roles, the kernel body, the kernel call. The tile schedule (group-start
row tiles, segments of no local group) and the launch order are common.py's, as for the Hopper
kernel (kernels/mosaic_gpu/gmm.py); what changes on Blackwell is who computes and where the
accumulator lives:

- the accumulator is in tensor memory (TMEM), two [128, block_n] f32 buffers a CTA: a cell's
  epilogue reads one while the MMAs of the next cell write the other, and no register holds it;
- warp-specialized, two warpgroups a CTA: in the first, one warp issues the TMA loads and one
  warp issues tcgen05 MMAs (a single thread issues each, shared memory to TMEM); the second
  warpgroup is the epilogue: TMEM -> registers -> shared memory -> TMA store, in [128, 64]
  strips, the rows of a partial tile by a ladder of power-of-two copies;
- persistent: one CTA (or CTA pair) per SM (pair of SMs) walks the output cells in
  common.launch_cell's group-major order, each role on its own (pipeline_roles): the operand
  ring and the accumulator buffers carry over from cell to cell, so the loads of a cell start
  while the last one is still computing, and its epilogue runs while the next one computes;
- cta_pair: two CTAs of a cluster run each MMA together (cta_group::2). The cell is 256 rows;
  each CTA loads its 128 rows of lhs and half of the rhs tile's columns, the first CTA issues
  the MMAs for both, and each CTA's epilogue stores its own rows;
- rows of no local group (group_offset, rows past sum(group_sizes)) are written as zeros, every
  output row exactly once; k is zero-padded to a multiple of block_k in the wrapper when it is
  not one; transpose_rhs reads [g, n, k] weights and feeds the tiles to the MMA transposed.

Barriers (each waited on by one role, once per completion, so the phases stay in step):
  lhs_loaded/rhs_loaded[slot]  TMA -> MMA warp      a stage's operands are in shared memory
  consumed[slot]               MMA -> TMA warp      the MMAs reading a stage are done
  mma_done[buf]                MMA -> epilogue      a cell's accumulator is complete
  store_done[buf]              epilogue -> MMA warp the epilogue has read the accumulator
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import common, target
from kernels.mosaic_blackwell.config import EPI_TILE, INTERPRETER_THREADS, ROW_TILE, BlackwellConfig
from kernels.mosaic_gpu.gmm import (
  check_inputs,
  interpret_params,
  store_rows,
  swizzle_elems,
  tma_operands,
)

# B200's SM count: the grid when the default device is not a GPU (export for CUDA from a CPU
# host). A persistent grid of any size is correct, only its speed moves.
FALLBACK_NUM_SMS = 148
# CTAs the GPU interpreter simulates (each warpgroup a host thread, so keep it small).
INTERPRET_NUM_SMS = 2
WARPGROUPS = 2  # the control warpgroup (TMA and MMA warps) and the epilogue's
TMA_WARP, MMA_WARP = 0, 1
CONTROL, EPILOGUE, MASK = 0, 1, 2  # warpgroups; tgmm adds MASK
PAIR = "pair"  # the cluster axis of a CTA pair


def num_ctas(interpret=False) -> int:
  """Persistent CTAs to launch: the SM count of the GPU being compiled for."""
  if interpret:
    return INTERPRET_NUM_SMS
  t = target.current()
  return int(t.num_cores) if t.is_gpu and t.num_cores else FALLBACK_NUM_SMS


def operand_transforms(dtype):
  """The shared-memory layout of an operand tile: 8-row, 128-byte swizzled boxes."""
  swizzle = swizzle_elems(dtype)
  return (plgpu.TilingTransform((ROW_TILE, swizzle)), plgpu.SwizzleTransform(128))


def launch(kernel, name, out_type, cfg: BlackwellConfig, interpret, warpgroups: int = WARPGROUPS):
  """plgpu.kernel over the persistent grid: one CTA per SM, or one cluster of two per pair."""
  if interpret and cfg.cta_pair:
    raise NotImplementedError(
      "BlackwellConfig(cta_pair=True) cannot run interpreted: jax's Mosaic GPU interpreter has no "
      "collective (cta_group::2) MMA; a B200 runs it compiled"
    )
  kernel.__name__ = name  # the kernel's name in the machine code and profiles
  ctas = num_ctas(interpret)
  pair = dict(cluster=(2,), cluster_names=(PAIR,)) if cfg.cta_pair else {}
  return plgpu.kernel(
    kernel,
    out_type=out_type,
    grid=(max(1, ctas // cfg.ctas),),
    grid_names=("sm",),
    num_threads=warpgroups,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret_params(interpret, INTERPRETER_THREADS),
    **pair,
  )


def barriers(cfg: BlackwellConfig):
  """The barriers of the module docstring. With cta_pair, the epilogue's store_done is a
  cluster barrier: the first CTA's MMAs write both CTAs' accumulators, so it waits for both
  epilogues. A cluster barrier's num_arrivals counts per CTA (each arrival reaches every CTA
  of the pair, and Mosaic multiplies the count by the CTAs): 1."""
  steps = cfg.max_concurrent_steps
  store_done = (
    plgpu.ClusterBarrier(collective_axes=(PAIR,), num_barriers=2, num_arrivals=1, orders_tensor_core=True)
    if cfg.cta_pair
    else plgpu.Barrier(num_arrivals=1, num_barriers=2, orders_tensor_core=True)
  )
  return dict(
    lhs_loaded=plgpu.Barrier(num_arrivals=1, num_barriers=steps),
    rhs_loaded=plgpu.Barrier(num_arrivals=1, num_barriers=steps),
    consumed=plgpu.Barrier(num_arrivals=1, num_barriers=steps, orders_tensor_core=True),
    mma_done=plgpu.Barrier(num_arrivals=1, num_barriers=2, orders_tensor_core=True),
    store_done=store_done,
  )


class CellIndex(NamedTuple):
  """A cell of the grid, as plgpu.nd_loop's NDLoopInfo gives it: its index in the grid and
  its position among this CTA's cells."""

  index: tuple
  local_index: jax.Array


class Cell(NamedTuple):
  """What every role needs of one output cell: its pipeline steps (0: no MMA, the epilogue
  stores zeros) and the kernel's own indices (`at`, passed back to its callbacks)."""

  steps: jax.Array
  at: tuple


def pipeline_roles(
  *,
  cfg,
  grid,
  cell,
  load,
  mma,
  epilogue,
  lhs_loaded,
  rhs_loaded,
  consumed,
  mma_done,
  store_done,
  mask=None,
  masked=None,
):
  """The kernel's roles, each walking the CTA's cells of `grid` on its own (nd_loop over the
  SMs): the TMA warp runs ahead into the next cells' loads as far as the ring allows, the MMA
  warp into the next cell's MMAs as far as a free accumulator allows, and the epilogue
  follows. Each carries the ring's position (the pipeline steps it has passed).

  cell(CellIndex) -> Cell; load(at, i, slot, barrier_a, barrier_b) issues step i's copies;
  mma(at, buf, i, slot, consumed, accumulate) its MMAs into accumulator buffer buf;
  epilogue(at, buf, has_acc) stores the cell. mask(at, i, slot), with a third warpgroup:
  it edits step i's lhs tile in shared memory after the load and before the MMA, which
  then waits on `masked` instead of lhs_loaded."""
  ring = cfg.max_concurrent_steps
  wg = lax.axis_index("wg")
  lead = (lax.axis_index(PAIR) == 0) if cfg.cta_pair else True
  pair_axis = PAIR if cfg.cta_pair else None
  # Read here: inside warp_map a kernel may name no axis but the warps'.
  sm, sms = lax.axis_index("sm"), lax.axis_size("sm")
  total = functools.reduce(lambda a, b: a * b, grid)
  count = lax.div(total - sm + sms - 1, sms)  # this CTA's cells

  def walk(body):
    """body(at, steps, done, buf, local_index) for each of this CTA's cells of `grid`, in
    order: cells sm, sm + sms, ... (plgpu.nd_loop's order, written out for warp_map)."""

    def step(local_index, done):
      flat, index = sm + local_index * sms, []
      for dim in reversed(grid):
        index.append(lax.rem(flat, dim))
        flat = lax.div(flat, dim)
      c = cell(CellIndex(tuple(reversed(index)), local_index))
      body(c.at, c.steps, done, lax.rem(local_index, 2), local_index)
      return done + c.steps

    lax.fori_loop(0, count, step, jnp.int32(0))

  @pl.when(wg == CONTROL)
  def _control():
    @plgpu.warp_map
    def _warp(warp):
      @pl.when(warp == TMA_WARP)
      def _tma():
        @walk
        def _(at, steps, done, buf, local_index):
          @pl.loop(0, steps)
          def _step(i):
            s = done + i
            slot = lax.rem(s, ring)

            @pl.when(s >= ring)  # the stage's last MMAs have read it
            def _():
              plgpu.barrier_wait(consumed.at[slot])

            load(at, i, slot, lhs_loaded.at[slot], rhs_loaded.at[slot])

      @pl.when((warp == MMA_WARP) & lead)
      def _mma():
        @walk
        def _(at, steps, done, buf, local_index):
          @pl.when(local_index >= 2)  # the epilogue has read this buffer's last cell
          def _():
            plgpu.barrier_wait(store_done.at[buf])

          @pl.loop(0, steps)
          def _step(i):
            slot = lax.rem(done + i, ring)
            plgpu.barrier_wait((lhs_loaded if mask is None else masked).at[slot])
            plgpu.barrier_wait(rhs_loaded.at[slot])
            mma(at, buf, i, slot, consumed.at[slot], i > 0)

          # Also with no MMA (a cell of zeros): the epilogue waits on every cell's buffer.
          plgpu.tcgen05_commit_arrive(mma_done.at[buf], collective_axis=pair_axis)

  @pl.when(wg == EPILOGUE)
  def _epilogue():
    @walk
    def _(at, steps, done, buf, local_index):
      plgpu.barrier_wait(mma_done.at[buf])
      epilogue(at, buf, steps > 0)
      plgpu.wait_load_tmem()  # the accumulator is read before the MMAs may write it again
      plgpu.barrier_arrive(store_done.at[buf])

  if mask is not None:

    @pl.when(wg == MASK)
    def _mask():
      @walk
      def _(at, steps, done, buf, local_index):
        @pl.loop(0, steps)
        def _step(i):
          slot = lax.rem(done + i, ring)
          plgpu.barrier_wait(lhs_loaded.at[slot])
          mask(at, i, slot)
          plgpu.commit_smem()  # the generic-proxy writes, before the MMA reads the tile
          plgpu.barrier_arrive(masked.at[slot])


def cta_rows(seg_start, seg_end, row0, cta, block_m: int):
  """(first row, lo, rows): a CTA's block_m rows of the cell at row0 start at row0 + cta *
  block_m, and it stores rows [lo, lo + rows) of them, those of the cell's segment [seg_start,
  seg_end). The other rows are a neighbour's (before the segment, or past its end)."""
  first = row0 + cta * block_m
  lo = jnp.clip(seg_start - first, 0, block_m)
  return first, lo, jnp.clip(seg_end - first, 0, block_m) - lo


def store_strips(acc_tmem, has_acc, out_smem, o_gmem, *, row0, lo, rows, col0, n, cols: int):
  """Store the cell's [128, cols] accumulator (zeros when not has_acc) to
  o_gmem[row0 + [lo, lo + rows), col0 + ...], in [128, 64] strips through out_smem; strips
  that start at or past n are not stored.

  A strip's rows go out as several TMA copies (store_rows), one bulk group, all reading
  out_smem, the one strip buffer; the next strip overwrites it, so first every copy in flight
  must have read it: wait 0 (reads only). Wait 1, which the Hopper epilogue's two slots allow,
  would leave the last strip's own group reading the buffer being overwritten, on the GPU as in
  the interpreter. Its tensor-memory load is issued before that wait, so the wait overlaps it."""
  out_dtype = o_gmem.dtype
  for e in range(cols // EPI_TILE):
    strip = pl.ds(e * EPI_TILE, EPI_TILE)

    @pl.when(has_acc)
    def _load():
      value = plgpu.async_load_tmem(acc_tmem.at[:, strip], layout=plgpu.Layout.TCGEN05).astype(out_dtype)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last strip's copies have read out_smem
      out_smem[...] = value

    @pl.when(jnp.logical_not(has_acc))
    def _zeros():
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      out_smem[...] = jnp.zeros(out_smem.shape, out_dtype)

    plgpu.commit_smem()
    strip_rows = jnp.where(col0 + e * EPI_TILE < n, rows, 0)
    store_rows(out_smem, o_gmem, lo, strip_rows, out_smem.shape[0], row0, col0 + e * EPI_TILE, EPI_TILE)
    plgpu.commit_smem_to_gmem_group()


def _gmm_kernel(
  cell_tile_ref,
  cell_col_ref,
  sched_ref,
  lhs_gmem,
  rhs_gmem,
  o_gmem,
  *,
  layout: common.ScheduleLayout,
  n,
  k,
  g_local,
  num_col_blocks,
  cfg: BlackwellConfig,
  transpose_rhs,
):
  block_m, block_n, block_k = cfg.block_m, cfg.block_n, cfg.block_k
  cell_rows = block_m * cfg.ctas
  cta_cols = block_n // cfg.ctas  # the rhs columns this CTA loads
  k_steps = k // block_k
  dtype = lhs_gmem.dtype
  transforms = operand_transforms(dtype)
  cta = lax.axis_index(PAIR) if cfg.cta_pair else 0
  rhs_tile_shape = (cta_cols, block_k) if transpose_rhs else (block_k, cta_cols)
  tables = layout.tables(sched_ref)  # common.SCHEDULE_TABLES; tile rows in TMA boxes

  @functools.partial(
    pl.run_scoped,
    lhs_smem=plgpu.SMEM((cfg.max_concurrent_steps, block_m, block_k), dtype, transforms=transforms),
    rhs_smem=plgpu.SMEM((cfg.max_concurrent_steps, *rhs_tile_shape), dtype, transforms=transforms),
    out_smem=plgpu.SMEM((block_m, EPI_TILE), o_gmem.dtype),
    acc_tmem=plgpu.TMEM((block_m, 2 * block_n), jnp.float32, collective=cfg.cta_pair),
    **barriers(cfg),
    collective_axes="wg",
  )
  def _scope(lhs_smem, rhs_smem, out_smem, acc_tmem, **bars):
    def cell(c: CellIndex) -> Cell:
      # lax only: the TMA and MMA warps run this under warp_map, which lowers no jit (jnp's
      # clip, where, // and % are jitted), so the launch order comes as a table (cell_tile).
      flat = c.index[0]
      t, j = cell_tile_ref[flat], cell_col_ref[flat]
      # A tile starts at its segment's first row rounded down to a TMA box (8 rows): the rows
      # before the segment are a neighbour's. Only a segment's last tile ends before cell_rows.
      seg, row0 = tables["tile_segment"][t], tables["tile_row"][t] * ROW_TILE
      is_group = common.is_local(seg, g_local)
      group = lax.max(lax.min(seg - 1, g_local - 1), 0)
      return Cell(is_group.astype(jnp.int32) * k_steps, (seg, row0, group, j))

    def accumulator(buf):
      return acc_tmem.at[:, pl.ds(buf * block_n, block_n)]

    def load(at, i, slot, lhs_barrier, rhs_barrier):
      _, row0, group, j = at
      ks = pl.ds(i * block_k, block_k)
      cols = pl.ds(j * block_n, block_n)
      rhs = rhs_gmem.at[group, cols, ks] if transpose_rhs else rhs_gmem.at[group, ks, cols]
      pair = dict(collective_axes=PAIR) if cfg.cta_pair else {}
      plgpu.copy_gmem_to_smem(
        lhs_gmem.at[pl.ds(row0, cell_rows), ks],
        lhs_smem.at[slot],
        lhs_barrier,
        leader_tracked=plgpu.CopyPartition.PARTITIONED(0) if cfg.cta_pair else None,
        **pair,
      )
      plgpu.copy_gmem_to_smem(
        rhs,
        rhs_smem.at[slot],
        rhs_barrier,
        leader_tracked=plgpu.CopyPartition.PARTITIONED(0 if transpose_rhs else 1) if cfg.cta_pair else None,
        **pair,
      )

    def mma(at, buf, i, slot, consumed, accumulate):
      b = rhs_smem.at[slot].T if transpose_rhs else rhs_smem.at[slot]
      plgpu.tcgen05_mma(
        accumulator(buf),
        lhs_smem.at[slot],
        b,
        consumed,
        accumulate=accumulate,
        collective_axis=PAIR if cfg.cta_pair else None,
      )

    def epilogue(at, buf, has_acc):
      seg, row0, _, j = at
      my_row0, lo, rows = cta_rows(tables["segment_start"][seg], tables["segment_end"][seg], row0, cta, block_m)
      store_strips(
        accumulator(buf), has_acc, out_smem, o_gmem, row0=my_row0, lo=lo, rows=rows, col0=j * block_n, n=n, cols=block_n
      )

    pipeline_roles(
      cfg=cfg,
      grid=(tables["active"][0] * num_col_blocks,),
      cell=cell,
      load=load,
      mma=mma,
      epilogue=epilogue,
      **bars,
    )

  plgpu.wait_smem_to_gmem(0)  # every store done before the kernel exits


def gmm(
  lhs: jax.Array,
  rhs: jax.Array,
  group_sizes: jax.Array,
  *,
  config: BlackwellConfig,
  out_dtype,
  transpose_rhs: bool = False,
  group_offset: jax.Array | None = None,
  precision=None,
  interpret=False,
) -> jax.Array:
  """Grouped matmul [m,k] x [g,k,n] (or [g,n,k] with transpose_rhs) -> [m,n].

  lhs and rhs must share a 16-bit dtype (the ragged_dot wrapper casts them). rhs holds
  groups [group_offset, group_offset + g) of group_sizes; every other row comes out 0.
  precision is accepted for a uniform signature: tcgen05 on 16-bit inputs has one.
  interpret: False, True (the GPU interpreter with default params) or InterpretGPUParams.
  """
  del precision
  check_inputs(lhs, rhs)
  if why := config.valid_for("fwd"):
    raise ValueError(f"BlackwellConfig {config} cannot drive gmm: {why}")
  cfg = config
  m = lhs.shape[0]
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  lhs, rhs, sched = tma_operands(
    lhs, rhs, group_sizes, group_offset, block_k=cfg.block_k, tile_rows=cfg.cell("fwd")[0], transpose_rhs=transpose_rhs
  )
  m_pad, n_pad = lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2]
  num_col_blocks = pl.cdiv(n_pad, cfg.block_n)
  kernel = functools.partial(
    _gmm_kernel,
    layout=sched.layout,
    n=n_pad,
    k=lhs.shape[1],
    g_local=g_local,
    num_col_blocks=num_col_blocks,
    cfg=cfg,
    transpose_rhs=transpose_rhs,
  )
  out_type = jax.ShapeDtypeStruct((m_pad, n_pad), out_dtype)
  # The launch order (common.launch_cell) of every cell the grid may hold, as tables.
  cells = jnp.arange(sched.tile_segment.shape[0] * num_col_blocks, dtype=jnp.int32)
  cell_tile, cell_col = common.launch_cell(
    cells, sched.tile_segment, sched.segment_first_tile, sched.segment_num_tiles, num_col_blocks, cfg.group_m
  )
  out = launch(kernel, "ragtune_tcgen05_gmm", out_type, cfg, interpret)(
    cell_tile.astype(jnp.int32),
    cell_col.astype(jnp.int32),
    sched.packed,
    lhs,
    rhs,
  )
  return out[:m, :n]
