"""Mosaic GPU (Hopper TMA + wgmma) grouped matmul: out[rows of group i] = lhs[rows] @ rhs[i].

Layout, in order: tile schedule (group metadata), launch order, kernel body, kernel call.
Warp-specialized, as jax's `hopper_matmul_mgpu` (the design of CUTLASS's Hopper kernels):

- three warpgroups a CTA: a producer that only issues the TMA loads (its registers cut to 40
  by setmaxnreg) and two consumers that split the CTA's output tile (MosaicConfig.
  consumer_tile) and run wgmma on it, each keeping one wgmma in flight;
- persistent: one CTA per SM walks the output cells in common.launch_cell's group-major
  order (a band of one group's row tiles walks the column blocks while its lhs rows stay in
  L2). The pipeline's buffers are allocated once, so the producer loads the next cell's
  operands while the consumers store this one's tile;
- group-start row tiles (common.tile_schedule): a group's first tile starts at its first
  row (rounded down to a TMA box of 8 rows), so only its last tile is partial; rows of other
  shards' groups (group_offset) and rows past sum(group_sizes) are written as zeros, every
  output row exactly once;
- narrow_tail (MosaicConfig): a 128-row cell whose rows to store all lie in its first 64 (a
  group's short last tile, or a short group, counted from the tile's first row) runs as a
  64-row cell, the two consumers splitting its columns (64 x block_n/2 each), so a partial
  last tile costs about its rows (computed_rows; counted
  by benchmarks/tile_waste.py). The same pipeline runs either way: its buffers, barriers and
  steps, the producer loading the tile's block_m rows;
- the epilogue stores [64, 64] sub-tiles through two shared-memory slots per consumer (fp8:
  one), by TMA, rows of a partial tile by a ladder of power-of-two copies;
- k is zero-padded to a multiple of block_k in the wrapper (block128: of its 128-block), only
  when it is not one; TMA reads past an array's end as zeros;
- transpose_rhs reads the weights as [g, n, k] tiles and feeds them to wgmma transposed,
  so dlhs never materialises rhs^T;
- fp8 (kernels.quant): channelwise scales multiply the f32 accumulator in the epilogue;
  128x128 block scales are promoted per k step, as DeepGEMM does: each 128-deep step's wgmma
  goes into a fresh step accumulator, which is waited for and added into the f32 main one
  (a value carried by the pipeline) times its rows' and its expert's block scales, a
  128-column block at a time (a 64x256 consumer share: two halves through one step
  accumulator). The rows' scales come by TMA with the step's operands, the expert's from
  global memory. With block_k 256 a step holds two k blocks, each in a step accumulator of its
  own: both wgmmas are issued, then the first block is promoted while the second's runs
  (overlapped_step; docs/quantization.md says why not across steps).
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import common, quant, target
from kernels.backend import host_cores, pool_env
from kernels.mosaic_gpu.config import (
  CONSUMERS,
  EPI_TILE,
  FP8_FORMATS,
  FP8_PAIR_K,
  INTERPRETER_THREADS,
  WGMMA_M,
  MosaicConfig,
  epilogue_slots,
  k_multiple,
  pipeline_registers,
)

# H100 SXM's SM count: the grid size when the default device is not a GPU (export for
# CUDA from a CPU host). A persistent grid of any size is correct, only its speed moves.
FALLBACK_NUM_SMS = 132
# Programs the GPU interpreter simulates (each is a host thread, so keep it small).
INTERPRET_NUM_SMS = 2
DTYPES = ("bfloat16", "float16")  # wgmma's 16-bit inputs; kernels/mosaic_gpu/__init__.py
ROW_TILE = 8  # rows of a TMA box in the swizzled layout


def check_inputs(*arrays, allowed: tuple[str, ...] = DTYPES) -> None:
  """The kernels take one input dtype of `allowed` (16-bit ones; ragged_dot promotes and casts before)."""
  names = {jnp.dtype(a.dtype).name for a in arrays}
  if len(names) != 1 or not names <= set(allowed):
    raise TypeError(f"Mosaic GPU kernels take inputs of one dtype among {allowed}, got {sorted(names)}")


def swizzle_elems(dtype) -> int:
  """Elements in the 128-byte minor dim of a TMA box."""
  return 128 // jnp.dtype(dtype).itemsize


def num_sms(interpret=False) -> int:
  """Persistent programs to launch: the SM count of the GPU being compiled for."""
  if interpret:
    return INTERPRET_NUM_SMS
  t = target.current()
  return int(t.num_cores) if t.is_gpu and t.num_cores else FALLBACK_NUM_SMS


# plgpu.load of a whole ref: jax 0.10 takes an index argument (() for all of it), 0.12 none.
_LOAD_TAKES_INDEX = "idx" in inspect.signature(plgpu.load).parameters


def load_whole(ref, layout):
  """All of `ref` in registers, in `layout`."""
  return plgpu.load(ref, (), layout=layout) if _LOAD_TAKES_INDEX else plgpu.load(ref, layout=layout)


def pad_to_multiple(x: jax.Array, axis: int, multiple: int) -> jax.Array:
  """x zero-padded along `axis` up to a multiple of `multiple` (x itself if it is one)."""
  pad = -x.shape[axis] % multiple
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def tile_bounds(tables, t, block_m: int):
  """(segment, first row, lead, end) of scheduled tile t (a traced scalar in the kernel, a
  vector of tiles over a NumPy schedule): the tile covers rows first + [0, block_m) and stores
  [first + lead, first + end), its segment's. Tiles start at their segment's first row rounded
  down to a TMA box (8 rows), so lead > 0 (the rows of a neighbour) only on a segment's first
  tile, and only a segment's last tile ends before block_m."""
  seg = tables["tile_segment"][t]
  row0 = tables["tile_row"][t] * ROW_TILE
  lead = jnp.maximum(tables["segment_start"][seg] - row0, 0)
  end = jnp.minimum(tables["segment_end"][seg] - row0, block_m)
  return seg, row0, lead, end


def computed_rows(end, block_m: int, narrow_tail: bool):
  """Rows a group's tile runs wgmma on, given its `end` (tile_bounds): all block_m, or 64 for a
  tile whose rows fit in them under narrow_tail (MosaicConfig.narrow_tail_applies)."""
  return jnp.where(narrow_tail & (end <= WGMMA_M), WGMMA_M, block_m)


def host_tiles(group_sizes, m_pad: int, g_local: int, cfg: MosaicConfig, group_offset: int = 0):
  """On the host, each scheduled tile's (segment, end, rows its wgmma computes: 0 for a tile
  of no local group), as NumPy arrays: the kernel's own schedule and rules (row_schedule,
  tile_bounds, computed_rows), for counts and tests."""
  sizes = jnp.asarray(group_sizes, jnp.int32)
  sched = row_schedule(sizes, jnp.int32(group_offset), m_pad, g_local, cfg.block_m).to_numpy()
  tables = sched.layout.tables(sched.packed)
  seg, _, _, end = tile_bounds(tables, np.arange(int(tables["active"][0])), cfg.block_m)
  rows = computed_rows(end, cfg.block_m, cfg.narrow_tail_applies("fwd"))
  seg = np.asarray(seg)
  return seg, np.asarray(end), np.where(common.is_local(seg, g_local), np.asarray(rows), 0)


class Share(NamedTuple):
  """One consumer warpgroup's share of a cell: rows x cols of the output tile from (row0, col0)
  (traced where they depend on the warpgroup)."""

  rows: int
  cols: int
  row0: Any
  col0: Any


def store_rows(src_smem, dst_gmem, first, num_rows, max_rows: int, row0, col0, cols: int):
  """Copy rows [first, first + num_rows) of the smem tile to dst_gmem[row0 + ..., col0 +
  [0, cols)].

  TMA copies need static shapes, so the dynamic row count is stored as its binary digits:
  one copy of 2**i rows for each set bit i of num_rows (num_rows <= max_rows). The copies
  join the calling thread's open group: the caller commits it (num_rows 0 leaves it empty, a
  group jax's interpreter, which counts copies, does not see: see _gmm_kernel's epilogue)."""
  start = first
  for bit in reversed(range(int(math.log2(max_rows)) + 1)):
    rows = 1 << bit

    @pl.when(num_rows & rows != 0)
    def _copy():
      plgpu.copy_smem_to_gmem(
        src_smem.at[pl.ds(start, rows)],
        dst_gmem.at[pl.ds(row0 + start, rows), pl.ds(col0, cols)],
        commit_group=False,
      )

    start = start + (num_rows & rows)


def _gmm_kernel(
  sched_ref,
  steps_ref,
  lhs_gmem,
  rhs_gmem,
  *refs,
  layout: common.ScheduleLayout,
  n,
  g_local,
  num_col_blocks,
  cfg: MosaicConfig,
  transpose_rhs,
  scales,
  interpreted=False,
):
  # fp8 operands bring their scales (kernels.quant), f32. channelwise: lhs [m_pad] and rhs
  # [g, n_pad], applied to the accumulator in the epilogue. block128: lhs [k / 128, m_pad]
  # (transposed, so a step's rows are one TMA box) and rhs [g, k / 128, n_pad / 128], applied
  # per k step as the step's result is promoted into the main accumulator.
  *scale_gmem, o_gmem = refs
  scaled, promoted = scales is not None, scales == "block128"
  block_m, block_n, block_k = cfg.block_m, cfg.block_n, cfg.block_k
  wg_rows, wg_cols, split_rows = cfg.consumer_tile("fwd")
  # block128 promotes each of a consumer's 128-column blocks on its own (a 64x256 share: two
  # halves, one step accumulator of 64x128 reused), each with its block's scale; the main
  # accumulator is carried as those pieces.
  pieces = wg_cols // quant.BLOCK if promoted and wg_cols > quant.BLOCK else 1
  piece_cols = wg_cols // pieces
  # A 256-deep block128 step runs its two k blocks through two step accumulators, each
  # promoted while the other's wgmma runs (overlapped_step).
  overlapped = promoted and block_k == FP8_PAIR_K
  # narrow_tail: a cell whose rows all lie in its first 64 runs as a 64-row one, each consumer
  # taking those rows and half the columns (MosaicConfig.narrow_tail_applies).
  narrow_tail = cfg.narrow_tail_applies("fwd", jnp.dtype(lhs_gmem.dtype).name)
  out_dtype = o_gmem.dtype
  swizzle = swizzle_elems(lhs_gmem.dtype)  # 64 16-bit or 128 8-bit elements: 128 bytes
  transforms = (plgpu.TilingTransform((ROW_TILE, swizzle)), plgpu.SwizzleTransform(128))
  # delay_release=1: a step's buffers go back to the producer only after the next step's
  # wgmma is issued, so each consumer keeps one wgmma in flight (wgmma_wait(1) below).
  # Promotion reads each step's results before the next step: its buffers are free then.
  release = 0 if promoted else 1
  lhs_spec = plgpu.BlockSpec((block_m, block_k), lambda kb: (0, kb), transforms=transforms, delay_release=release)
  if transpose_rhs:
    rhs_spec = plgpu.BlockSpec((block_n, block_k), lambda kb: (0, kb), transforms=transforms, delay_release=release)
  else:
    rhs_spec = plgpu.BlockSpec((block_k, block_n), lambda kb: (kb, 0), transforms=transforms, delay_release=release)
  in_specs = [lhs_spec, rhs_spec]
  if promoted:  # a step's row scales arrive with its operands
    in_specs.append(plgpu.BlockSpec((block_k // quant.BLOCK, block_m), lambda kb: (kb, 0), delay_release=release))

  # The k loop's trip count, ceil(k / block_k), read at run time: as a compile-time constant, ptxas
  # spilled the consumers' loop at some counts and not at others (6, 8, 9 and 12 steps spilled
  # 8-48 B a thread, 10, 14 and 16 none; deviceless ptxas, jax 0.10.2); read, at none.
  k_steps = steps_ref[0]

  def pipeline(body, compute_context):
    return plgpu.emit_pipeline_warp_specialized(
      body,
      grid=(k_steps,),
      memory_registers=pipeline_registers("gmm"),
      in_specs=in_specs,
      wg_axis="wg",
      num_compute_wgs=CONSUMERS,
      max_concurrent_steps=cfg.max_concurrent_steps,
      compute_context=compute_context,
    )

  def rhs_tile(group, j):
    cols = pl.ds(j * block_n, block_n)
    return rhs_gmem.at[group, cols, :] if transpose_rhs else rhs_gmem.at[group, :, cols]

  # Allocated once for the persistent loop: the producer starts a cell's loads while the
  # consumers still store the previous cell's tile. The allocation takes the block shapes
  # from the specs and only the dtypes from the refs: whole refs, since a block-sized slice
  # of an operand smaller than the block (m or n below it) is out of bounds.
  ignore = lambda *_, **__: None
  allocations = pipeline(ignore, ignore).get_allocations(lhs_gmem, rhs_gmem.at[0], *scale_gmem[:1] if promoted else ())

  # Before a sub-tile reuses a slot, its previous store must have read it: with two slots,
  # all but the last bulk group (wait 1). The fp8 kernel waits for all of them (wait 0): each
  # consumer's 64x256 tile reuses its slots within a cell, and jax's interpreter counts every
  # copy of a store's ladder as its own group, so a wait for all but one would not cover the
  # slot there (its race detector says so). One slot a sub-tile instead spilled (ptxas).
  reuse_wait = 0 if scaled else 1
  out_slots = epilogue_slots(scaled)
  # Each consumer's channelwise row and column scales, loaded by TMA in its epilogue.
  scale_scratch = (
    dict(
      scale_smem=(plgpu.SMEM((CONSUMERS, wg_rows), jnp.float32), plgpu.SMEM((CONSUMERS, wg_cols), jnp.float32)),
      scale_bar=plgpu.Barrier(num_arrivals=2, num_barriers=CONSUMERS),  # both copies arrive on it
    )
    if scales == "channelwise"
    else {}
  )

  @functools.partial(
    pl.run_scoped,
    allocations=allocations,
    out_smem=plgpu.SMEM((CONSUMERS, out_slots, EPI_TILE, EPI_TILE), out_dtype),
    # The pipeline releases no buffer of a cell's last step (delay_release), so the consumers
    # arrive here once their last wgmma is done, and the producer waits for it before it
    # loads the next cell into those buffers.
    drained=plgpu.Barrier(num_arrivals=CONSUMERS),
    collective_axes="wg",
    **scale_scratch,
  )
  def _scope(allocations, out_smem, drained, scale_smem=None, scale_bar=None):
    tables = layout.tables(sched_ref)  # common.SCHEDULE_TABLES; tile rows in TMA boxes
    tile_seg = tables["tile_segment"]
    wg = jax.lax.axis_index("wg")
    wg_row0 = wg * wg_rows if split_rows else 0
    wg_col0 = 0 if split_rows else wg * wg_cols
    wide = Share(wg_rows, wg_cols, wg_row0, wg_col0)
    half = block_n // CONSUMERS
    tail = Share(WGMMA_M, half, 0, wg * half)  # narrow_tail's share of a 64-row cell

    @plgpu.nd_loop((tables["active"][0] * num_col_blocks,), collective_axes="sm")
    def _cell(loop_info):
      t, j = common.launch_cell(
        loop_info.index[0],
        tile_seg,
        tables["segment_first_tile"],
        tables["segment_num_tiles"],
        num_col_blocks,
        cfg.group_m,
      )
      seg, row0, lead, end = tile_bounds(tables, t, block_m)
      is_group = common.is_local(seg, g_local)
      group = jnp.clip(seg - 1, 0, g_local - 1)

      def scale(acc):
        """acc times its rows' and its group's columns' scales, read by TMA into this
        consumer's smem and broadcast from the wgmma layout's row and column vectors."""
        (ls_gmem, rs_gmem), (ls_smem, rs_smem) = scale_gmem, scale_smem
        plgpu.copy_gmem_to_smem(ls_gmem.at[pl.ds(row0 + wg_row0, wg_rows)], ls_smem.at[wg], scale_bar.at[wg])
        cols = pl.ds(j * block_n + wg_col0, wg_cols)
        plgpu.copy_gmem_to_smem(rs_gmem.at[group, cols], rs_smem.at[wg], scale_bar.at[wg])
        plgpu.barrier_wait(scale_bar.at[wg])
        row_scale = load_whole(ls_smem.at[wg], plgpu.Layout.WGMMA.reduce(1))
        col_scale = load_whole(rs_smem.at[wg], plgpu.Layout.WGMMA.reduce(0))
        acc = acc * jax.lax.broadcast_in_dim(row_scale, acc.shape, [0])
        return acc * jax.lax.broadcast_in_dim(col_scale, acc.shape, [1])

      def epilogue(acc, share=wide):
        """Store this consumer's share ([64, 64] sub-tiles through its smem slots), given as
        its column pieces (a tuple of equal widths); acc None stores zeros (rows of no local
        group).

        Before sub-tile s writes slot s % 2, the store of sub-tile s - 2 must have read it
        (fp8, one slot: every store before each sub-tile, wait 0).
        Each sub-tile commits one bulk group, so on the GPU that is all but the last group
        (wait 1). A sub-tile with no row to store (past the padded n, or past its segment's
        rows) commits an empty group: PTX counts it, jax's interpreter (which counts copies
        and ignores commits) does not, and there wait 1 would leave sub-tile s - 2's last
        copy in flight. So after such a sub-tile the consumer also waits for every store
        (wait 0): on the GPU the same wait, the one group wait 1 leaves being the empty one."""
        sub_cols = share.cols // EPI_TILE
        width = share.cols // len(acc) if acc is not None else share.cols
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last cell's copies have read the slots
        prev_rows = None
        for ei in range(share.rows // EPI_TILE):
          for ej in range(sub_cols):
            slot = (ei * sub_cols + ej) % out_slots
            col0 = j * block_n + share.col0 + ej * EPI_TILE
            base = share.row0 + ei * EPI_TILE
            lo = jnp.clip(lead - base, 0, EPI_TILE)
            rows = jnp.clip(end - base, 0, EPI_TILE) - lo
            rows = jnp.where(col0 < n, rows, 0)  # a sub-tile past the padded n stores nothing
            plgpu.wait_smem_to_gmem(reuse_wait, wait_read_only=True)  # this slot's previous store has read it
            if reuse_wait and ei * sub_cols + ej >= 2:  # the first two: the wait 0 above; fp8 waits 0

              @pl.when(prev_rows == 0)
              def _after_empty():
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)

            if acc is None:
              out_smem[wg, slot] = jnp.zeros((EPI_TILE, EPI_TILE), out_dtype)
            else:
              piece, c0 = acc[ej * EPI_TILE // width], ej * EPI_TILE % width
              out_smem[wg, slot] = piece[ei * EPI_TILE : (ei + 1) * EPI_TILE, c0 : c0 + EPI_TILE]
            plgpu.commit_smem()
            store_rows(out_smem.at[wg, slot], o_gmem, lo, rows, EPI_TILE, row0 + base, col0, EPI_TILE)
            plgpu.commit_smem_to_gmem_group()
            prev_rows = rows

      def compute_context(share):
        def context(run_pipeline):
          @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((share.rows, share.cols), jnp.float32))
          def _acc_scope(acc_ref):
            run_pipeline(acc_ref)
            plgpu.wgmma_wait(0)
            plgpu.barrier_arrive(drained)
            acc = acc_ref[...]
            epilogue(((scale(acc) if scales == "channelwise" else acc).astype(out_dtype),), share)

        return context

      def promoting_context(run_pipeline):
        zeros = plgpu.layout_cast(jnp.zeros((wg_rows, piece_cols), jnp.float32), plgpu.Layout.WGMMA)
        acc = run_pipeline((zeros,) * pieces)
        plgpu.barrier_arrive(drained)
        epilogue(tuple(piece.astype(out_dtype) for piece in acc))

      def operands(lhs_smem, rhs_smem, share=wide, col0=0, cols=None, ks=None):
        """wgmma's A and B for columns [col0, col0 + cols) of a consumer's share (all of them),
        over the step's k, or its slice `ks`."""
        cols = share.cols if cols is None else cols
        a = lhs_smem if share.rows == block_m else lhs_smem.at[pl.ds(share.row0, share.rows)]
        whole = cols == block_n
        if transpose_rhs:  # [n, k] tiles are k-major: the only B an 8-bit wgmma takes
          b = rhs_smem if whole else rhs_smem.at[pl.ds(share.col0 + col0, cols)]
        else:
          b = rhs_smem if whole else rhs_smem.at[:, pl.ds(share.col0 + col0, cols)]
        if ks is not None:
          a, b = a.at[:, ks], (b.at[:, ks] if transpose_rhs else b.at[ks, :])
        return a, b.T if transpose_rhs else b

      def mma(share):
        def body(_, lhs_smem, rhs_smem, acc_ref):
          plgpu.wgmma(acc_ref, *operands(lhs_smem, rhs_smem, share))
          plgpu.wgmma_wait(1)
          return acc_ref

        return body

      def promote(idx, lhs_smem, rhs_smem, ls_smem, acc):
        """acc's pieces + this k block's product times its scales: the rows' (from the step's
        TMA box) times the group's for the piece's 128-column block (read from global memory
        while the wgmma runs). A piece at a time: its wgmma into the step accumulator, wait,
        add. Columns past n read the last block's scale; they are not stored."""
        (kb,) = idx
        rs_gmem = scale_gmem[1]
        col_scales = []
        for h in range(pieces):
          col_block = jnp.minimum((j * block_n + wg_col0 + h * piece_cols) // quant.BLOCK, rs_gmem.shape[2] - 1)
          col_scales.append(rs_gmem[group, kb, col_block])
        row_scale, out = None, []
        for h in range(pieces):
          signs = None
          if h:
            # A later piece's step accumulator starts from zeros that depend on the previous
            # piece's promotion: the sign bits of its new values (exactly +-0 whatever they
            # hold). Without them ptxas issues this wgmma before that promotion is done,
            # holding two step accumulators (88 registers), and a 64x256 consumer spills
            # 48 B a thread around its k loop (deviceless ptxas, jax 0.10.2 and 0.12).
            bits = jax.lax.bitcast_convert_type(out[-1], jnp.int32) & jnp.int32(-(2**31))
            signs = jax.lax.bitcast_convert_type(bits, jnp.float32)

          def step(step_ref, h=h, signs=signs):
            if signs is not None and not interpreted:
              step_ref[...] = signs
            plgpu.wgmma(step_ref, *operands(lhs_smem, rhs_smem, wide, h * piece_cols, piece_cols))
            return step_ref[...]  # waits for it

          product = pl.run_scoped(step, plgpu.ACC((wg_rows, piece_cols), jnp.float32))
          if signs is not None and interpreted:  # jax's interpreter stores into no accumulator ref: the same sum
            product = product + signs
          if row_scale is None:
            row_scale = load_whole(ls_smem.at[0, pl.ds(wg_row0, wg_rows)], plgpu.Layout.WGMMA.reduce(1))
          out.append(acc[h] + product * jax.lax.broadcast_in_dim(row_scale * col_scales[h], product.shape, [0]))
        # The row scales' read is the generic proxy's; the producer's next TMA into this slot is
        # the async proxy's, so the read is fenced before the slot is released (PTX,
        # fence.proxy.async).
        plgpu.commit_smem()
        return tuple(out)

      def block_scale(kb, h, ls_smem):
        """k block kb's scales as one vector over the consumer's rows: its rows' (row h of the
        step's TMA box) times the group's for the share's 128-column block (an overlapped
        share lies in one). A k block past k (the padding of an odd count) and columns past n
        read the last block's scale: their products are zeros, or are not stored."""
        rs_gmem = scale_gmem[1]
        kb = jnp.minimum(kb, rs_gmem.shape[1] - 1)
        col_block = jnp.minimum((j * block_n + wg_col0) // quant.BLOCK, rs_gmem.shape[2] - 1)
        row_scale = load_whole(ls_smem.at[h, pl.ds(wg_row0, wg_rows)], plgpu.Layout.WGMMA.reduce(1))
        return row_scale * rs_gmem[group, kb, col_block]

      def overlapped_step(idx, lhs_smem, rhs_smem, ls_smem, acc):
        """A 256-deep step: its two 128-deep k blocks' wgmmas issued back to back, each into a
        step accumulator of its own; then a wait for the first (all but the newest wgmma) and
        its promotion while the second's wgmma runs, and a wait for the second and its
        promotion. The scales are read before the wgmmas are issued.

        Nothing runs past the step: with the second block's wgmma left running into the next
        step (each step's promotion behind the next step's wgmma), ptxas serialized every wgmma
        of the kernel (C7514, deviceless, jax 0.10.2), whether the last block was promoted
        after the loop or in its last step."""
        (kb,) = idx
        scales = [block_scale(2 * kb + h, h, ls_smem) for h in range(2)]

        def halves(first, second):
          for h, step_ref in enumerate((first, second)):
            plgpu.wgmma(step_ref, *operands(lhs_smem, rhs_smem, ks=pl.ds(h * quant.BLOCK, quant.BLOCK)))
          (main,) = acc
          for h, (step_ref, wait_n) in enumerate(((first, 1), (second, 0))):
            product = plgpu.wgmma_accumulator_load(step_ref, wait_n=wait_n)
            main = main + product * jax.lax.broadcast_in_dim(scales[h], product.shape, [0])
          return main

        step_acc = plgpu.ACC((wg_rows, wg_cols), jnp.float32)
        main = pl.run_scoped(halves, step_acc, step_acc)
        plgpu.commit_smem()  # the row scales' read, fenced before the slot is released (promote)
        return (main,)

      @pl.when(is_group)
      def _matmul():
        operands_gmem = (lhs_gmem.at[pl.ds(row0, block_m), :], rhs_tile(group, j))
        if overlapped:
          ls_gmem = scale_gmem[0].at[:, pl.ds(row0, block_m)]
          pipeline(overlapped_step, promoting_context)(*operands_gmem, ls_gmem, allocations=allocations)
        elif promoted:
          ls_gmem = scale_gmem[0].at[:, pl.ds(row0, block_m)]
          pipeline(promote, promoting_context)(*operands_gmem, ls_gmem, allocations=allocations)
        elif narrow_tail:
          # The same pipeline (its buffers, barriers and steps) either way: the producer loads
          # the tile's block_m rows, and a narrow cell's consumers read the first 64.
          narrow = computed_rows(end, block_m, True) == WGMMA_M
          for share, when in ((tail, narrow), (wide, jnp.logical_not(narrow))):
            pl.when(when)(
              functools.partial(pipeline(mma(share), compute_context(share)), *operands_gmem, allocations=allocations)
            )
        else:
          pipeline(mma(wide), compute_context(wide))(*operands_gmem, allocations=allocations)

        @pl.when(wg == CONSUMERS)
        def _wait_drained():
          plgpu.barrier_wait(drained)

      @pl.when(jnp.logical_not(is_group) & (wg < CONSUMERS))
      def _zeros():
        epilogue(None)

  plgpu.wait_smem_to_gmem(0)  # every store done before the kernel exits


def tma_operands(lhs, rhs, group_sizes, group_offset, *, block_k: int, tile_rows: int, transpose_rhs: bool):
  """(lhs, rhs, schedule) of a gmm kernel fed by TMA over group-start row tiles of tile_rows
  rows (common.tile_schedule, its tile rows in TMA boxes of 8).

  TMA tiles global memory in [8, 128-byte] boxes, so both dims of every operand must be
  multiples of those; a ragged last k step would also add another tile's columns. The
  operands are zero-padded, only the dims that need it (model shapes rarely do, but for m):
  rows to 8, k to block_k, n to the 128-byte row of the rhs tiles and the output's. Rows
  m..m_pad are past sum(group_sizes): the zero segment after the groups."""
  g_local = rhs.shape[0]
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  lhs = pad_to_multiple(pad_to_multiple(lhs, 0, ROW_TILE), 1, block_k)
  rhs = pad_to_multiple(rhs, 2 if transpose_rhs else 1, block_k)
  rhs = pad_to_multiple(rhs, 1 if transpose_rhs else 2, swizzle_elems(rhs.dtype))
  return lhs, rhs, row_schedule(group_sizes, offset, lhs.shape[0], g_local, tile_rows)


def row_schedule(group_sizes, group_offset, m_pad: int, g_local: int, tile_rows: int) -> common.TileSchedule:
  """The group-start row tiles of tile_rows rows over m_pad rows (a multiple of 8), their rows
  in TMA boxes of 8: which tile each cell of gmm's persistent loop computes."""
  num_tiles = common.num_tiles_bound(m_pad, tile_rows, g_local)
  seg_starts, seg_ends = common.segment_bounds(group_sizes, m_pad, group_offset, g_local)
  return common.tile_schedule(seg_starts, seg_ends, tile_rows, num_tiles, group_start=True, align=ROW_TILE)


def gmm(
  lhs: jax.Array,
  rhs: jax.Array,
  group_sizes: jax.Array,
  *,
  config: MosaicConfig,
  out_dtype,
  transpose_rhs: bool = False,
  group_offset: jax.Array | None = None,
  precision=None,
  interpret=False,
  lhs_scale: jax.Array | None = None,
  rhs_scale: jax.Array | None = None,
) -> jax.Array:
  """Grouped matmul [m,k] x [g,k,n] (or [g,n,k] with transpose_rhs) -> [m,n].

  lhs and rhs must share a 16-bit dtype (the ragged_dot wrapper casts them), or be
  float8_e4m3fn with channelwise or block128 lhs_scale and rhs_scale (kernels.quant). An 8-bit wgmma
  takes its B k-major only, so fp8 weights are read as [g, n, k]: stored so (transpose_rhs,
  as a checkpoint's nn.Linear weights are), or transposed here, a copy of the weights.
  rhs holds groups [group_offset, group_offset + g) of group_sizes; every other row comes out 0.
  precision is accepted for a uniform signature: wgmma has one precision per input type.
  interpret: False, True (the GPU interpreter with default params) or InterpretGPUParams.
  """
  del precision
  scales = None
  m, k = lhs.shape
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  fmt = lhs.dtype
  if lhs_scale is not None or rhs_scale is not None:
    fmt = quant.check(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs)
    if fmt not in FP8_FORMATS:
      raise TypeError(f"Mosaic GPU kernels take quantized operands as {FP8_FORMATS}, got {fmt}")
    check_inputs(lhs, rhs, allowed=("float8_e4m3fn",))
    scales = common.scheme(fmt)
    if not transpose_rhs:
      rhs, transpose_rhs = rhs.swapaxes(1, 2), True
  else:
    check_inputs(lhs, rhs)
  if why := config.valid_for("fwd", fmt):
    raise ValueError(f"MosaicConfig {config} cannot drive gmm: {why}")
  cfg = config
  lhs, rhs, sched = tma_operands(
    lhs,
    rhs,
    group_sizes,
    group_offset,
    block_k=k_multiple(cfg.block_k, fmt),
    tile_rows=cfg.block_m,
    transpose_rhs=transpose_rhs,
  )
  m_pad, n_pad = lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2]
  scale_args = ()
  if scales == "channelwise":  # padded as the operands: rows past m and columns past n scale zeros
    scale_args = (pad_to_multiple(lhs_scale[:, 0], 0, m_pad), pad_to_multiple(rhs_scale[:, 0, :], 1, n_pad))
  elif scales == "block128":  # k and n are padded within their last 128-block
    scale_args = (pad_to_multiple(lhs_scale.T.astype(jnp.float32), 1, m_pad), rhs_scale.astype(jnp.float32))

  kernel = functools.partial(
    _gmm_kernel,
    layout=sched.layout,
    n=n_pad,
    g_local=g_local,
    num_col_blocks=pl.cdiv(n_pad, cfg.block_n),
    cfg=cfg,
    transpose_rhs=transpose_rhs,
    scales=scales,
    interpreted=bool(interpret),
  )
  kernel.__name__ = "ragtune_mgpu_gmm"  # the kernel's name in the machine code and profiles
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((m_pad, n_pad), out_dtype),
    grid=(num_sms(interpret),),
    grid_names=("sm",),
    num_threads=CONSUMERS + 1,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret_params(interpret),
  )
  steps = jnp.full((1,), pl.cdiv(lhs.shape[1], cfg.block_k), jnp.int32)
  out = call(sched.packed, steps, lhs, rhs, *scale_args)
  return out[:m, :n]


_pool_warned = False


def _warn_small_pool(blocking: int) -> None:
  """Once a process: where XLA:CPU's intra-op pool is too small for the interpreter to run a
  kernel of `blocking` interpreter_threads."""
  global _pool_warned
  env = pool_env(blocking, host_cores())
  if env and not _pool_warned:
    _pool_warned = True
    setting = " ".join(f"{k}={v}" for k, v in env.items())
    warnings.warn(
      f"jax's Mosaic GPU interpreter can deadlock on {host_cores()} cores: start the process with "
      f"{setting} (see kernels.registry.interpreter_env)",
      RuntimeWarning,
      stacklevel=4,
    )


def interpret_params(interpret, blocking: int = INTERPRETER_THREADS):
  if interpret:
    _warn_small_pool(blocking)
  if interpret is True:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    # TMA reads past an array's end as zeros: the interpreter does that with these two.
    return InterpretGPUParams(out_of_bounds_reads="uninitialized", uninitialized_memory="zero")
  return interpret or None
