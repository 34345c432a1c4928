"""Mosaic GPU (Hopper TMA + wgmma) transposed grouped matmul: out[i] = a[rows of i]^T @ b[rows of i].

This is the weight gradient of gmm.py: lhs [m,k], dout [m,n] -> [g,k,n] (with
transpose_rhs, dout [m,n], lhs [m,k] -> [g,n,k]). Layout, in order: a group's row steps,
the kernel body, the kernel call.

The kernel is warp-specialized, as jax's `hopper_matmul_mgpu`: one program per SM walks
the output cells (group, a tile, b tile), group by group, and in each cell a producer
warpgroup streams the group's rows of a and b into shared memory by TMA while two
consumer warpgroups each reduce half of the a tile's columns (the output tile's rows)
with wgmma, reading a transposed from shared memory. What it adds, so it means what
`kernels.ragged_dot` means:

- row steps start at each group's first row (rounded down to 8, see group_steps), so only
  a group's last step holds rows of the next group; rows of a neighbour in a step are
  zeroed in shared memory before the wgmma reads them;
- group_offset: the cells cover the local groups [group_offset, group_offset + g) only;
- an empty group runs no pipeline step and stores a zero tile;
- any m and k, n: TMA reads past an array's end as zeros; output sub-tiles that start past
  the 64-padded extent are not stored;
- the pipeline's buffers are allocated once, so the producer loads the next cell's rows
  while the consumers store the last cell's tile.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import common, quant
from kernels.mosaic_gpu.config import CONSUMERS, EPI_TILE, WGMMA_M, pipeline_registers
from kernels.mosaic_gpu.gmm import (
  ROW_TILE,
  check_inputs,
  interpret_params,
  load_whole,
  num_sms,
  pad_to_multiple,
  swizzle_elems,
)


def group_steps(start, end, block_m: int):
  """(first row, pipeline steps) that reduce a group's rows [start, end) in block_m-row steps.

  The first step starts at the group's first row rounded down to ROW_TILE: Mosaic tiles a
  TMA copy's global rows in 8-row boxes, so a box cannot start between them. Its rows
  before `start` (at most 7) and the last step's rows from `end` on are masked. An empty
  group takes no step."""
  first = start // ROW_TILE * ROW_TILE
  steps = jnp.where(end > start, (end - first + block_m - 1) // block_m, 0)
  return first, steps


def _tgmm_kernel(
  start_ref,
  end_ref,
  a_gmem,
  b_gmem,
  o_gmem,
  *,
  num_groups: int,
  block_m: int,
  tile_a: int,
  tile_b: int,
  split_b: bool,
  group_m: int,
  max_concurrent_steps: int,
):
  m, ka = a_gmem.shape
  kb = b_gmem.shape[1]
  tiles_a, tiles_b = pl.cdiv(ka, tile_a), pl.cdiv(kb, tile_b)
  # Each consumer owns half of the split operand's columns: half of the output tile's rows
  # (a) or columns (b).
  own = (tile_b if split_b else tile_a) // CONSUMERS
  acc_shape = (tile_a, own) if split_b else (own, tile_b)
  swizzle = swizzle_elems(a_gmem.dtype)
  transforms = (plgpu.TilingTransform((ROW_TILE, swizzle)), plgpu.SwizzleTransform(128))

  def get_pipeline(body, compute_context, steps, ai, bi):
    return plgpu.emit_pipeline_warp_specialized(
      body,
      grid=(steps,),
      memory_registers=pipeline_registers("tgmm"),
      in_specs=[
        plgpu.BlockSpec((block_m, tile_a), lambda i: (i, ai), transforms=transforms, delay_release=1),
        plgpu.BlockSpec((block_m, tile_b), lambda i: (i, bi), transforms=transforms, delay_release=1),
      ],
      wg_axis="wg",
      num_compute_wgs=CONSUMERS,
      max_concurrent_steps=max_concurrent_steps,
      compute_context=compute_context,
    )

  # The allocation depends on the block shapes only; a static grid of max_concurrent_steps
  # steps keeps every stage (a shorter one would shrink them).
  ignore = lambda *_, **__: None
  allocs = get_pipeline(ignore, ignore, max_concurrent_steps, 0, 0).get_allocations(a_gmem, b_gmem)

  def cell(wg, group, ai, bi, pipeline_allocs, out_smem, drained):
    cols = pl.ds(wg * own, own)
    start, end = start_ref[group], end_ref[group]
    first, steps = group_steps(start, end, block_m)
    mask_first = start != first
    mask_last = (end - first) % block_m != 0

    def step(idx, a_smem, b_smem, acc_ref):
      i = idx[0]
      a_tile, b_tile = (a_smem, b_smem.at[:, cols]) if split_b else (a_smem.at[:, cols], b_smem)
      owned = b_tile if split_b else a_tile

      # Rows of a neighbouring group are zeroed in the consumer's own columns (the other
      # operand's rows then multiply zeros), so the two consumers never write the same bytes.
      @pl.when((mask_first & (i == 0)) | (mask_last & (i == steps - 1)))
      def _mask():
        rows = first + i * block_m + lax.broadcasted_iota(jnp.int32, (block_m, own), 0)
        keep = (rows >= start) & (rows < end)
        owned[...] = jnp.where(keep, owned[...], jnp.zeros((), owned.dtype))
        plgpu.commit_smem()

      plgpu.wgmma(acc_ref, a_tile.T, b_tile)
      plgpu.wgmma_wait(1)  # step i-1's buffers are released next (delay_release=1)
      return acc_ref

    # An empty group's cell (0 steps) loads nothing and touches no barrier: consumers that
    # wait on no load could otherwise arrive on `drained` for two cells before the
    # producer waits once.
    def compute_context(eval_pipeline):
      @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC(acc_shape, jnp.float32))
      def _acc_scope(acc_ref):
        eval_pipeline(acc_ref)
        plgpu.wgmma_wait(0)

        @pl.when(steps > 0)
        def _arrive():
          plgpu.barrier_arrive(drained)

        row0, col0 = ai * tile_a, bi * tile_b
        if split_b:
          col0 = col0 + wg * own
        else:
          row0 = row0 + wg * own
        _store(acc_ref[...].astype(o_gmem.dtype), out_smem.at[wg], o_gmem.at[group], row0, col0, ka, kb)

    get_pipeline(step, compute_context, steps, ai, bi)(
      a_gmem.at[pl.ds(first, m)], b_gmem.at[pl.ds(first, m)], allocations=pipeline_allocs
    )
    return steps

  _over_cells(allocs, o_gmem.dtype, num_groups, tiles_a, tiles_b, group_m, cell)


def _over_cells(allocs, out_dtype, num_groups: int, tiles_a: int, tiles_b: int, group_m: int, cell):
  """The persistent loop both tgmm kernels run: the output cells (group, a tile, b tile) shared
  out over the SMs, group by group, within a group in bands of group_m a tiles
  (common.program_tile); `cell(wg, group, ai, bi, pipeline_allocs, out_smem, drained)` runs
  a cell's pipeline and returns its step count. The pipeline's buffers are allocated once, so
  the producer loads the next cell's steps while the consumers store the last cell's tile."""
  out_transforms = (plgpu.TilingTransform((ROW_TILE, swizzle_elems(out_dtype))), plgpu.SwizzleTransform(128))

  @functools.partial(
    pl.run_scoped,
    pipeline_allocs=allocs,
    out_smem=plgpu.SMEM((CONSUMERS, 2, EPI_TILE, EPI_TILE), out_dtype, transforms=out_transforms),
    # The consumers arrive once their last wgmma of a cell is done: the pipeline may hold
    # buffers of its last step (delay_release), so the producer waits on this before it
    # loads the next cell's first steps into those buffers.
    drained=plgpu.Barrier(num_arrivals=CONSUMERS),
    collective_axes="wg",
  )
  def _scope(pipeline_allocs, out_smem, drained):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop((num_groups, tiles_a * tiles_b), collective_axes="sm")
    def _cell(loop_info):
      group = loop_info.index[0]
      ai, bi = common.program_tile(loop_info.index[1], tiles_a, tiles_b, group_m)
      steps = cell(wg, group, ai, bi, pipeline_allocs, out_smem, drained)

      @pl.when((wg == CONSUMERS) & (steps > 0))
      def _wait_drained():
        plgpu.barrier_wait(drained)

  plgpu.wait_smem_to_gmem(0)  # every output tile is written before the kernel ends


def _store(acc, slots, o_gmem, row0, col0, rows: int, cols: int):
  """acc [r, c] to o_gmem[row0 + ..., col0 + ...] by TMA, in [64, 64] sub-tiles through two
  shared-memory slots used in turn; sub-tiles that start at or past (rows, cols) are skipped
  (both are multiples of 64, so a sub-tile is all in or all out)."""
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last cell's copies have read the slots
  issued = jnp.int32(0)
  for r in range(acc.shape[0] // EPI_TILE):
    for c in range(acc.shape[1] // EPI_TILE):
      row, col = row0 + r * EPI_TILE, col0 + c * EPI_TILE
      inside = (row < rows) & (col < cols)
      slot = slots.at[issued % 2]

      @pl.when(inside)
      def _copy():
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # the copy before last read this slot
        slot[...] = acc[r * EPI_TILE : (r + 1) * EPI_TILE, c * EPI_TILE : (c + 1) * EPI_TILE]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(slot, o_gmem.at[pl.ds(row, EPI_TILE), pl.ds(col, EPI_TILE)])

      issued = issued + inside.astype(jnp.int32)


def tgmm(
  a: jax.Array,
  b: jax.Array,
  group_sizes: jax.Array,
  *,
  num_groups: int,
  block_m: int,
  tile_a: int,
  tile_b: int,
  group_m: int,
  max_concurrent_steps: int,
  out_dtype,
  split_b: bool = False,
  group_offset: jax.Array | None = None,
  interpret=False,
) -> jax.Array:
  """Per-group a^T @ b: [m,ka] x [m,kb] -> [num_groups,ka,kb] for the groups
  [group_offset, group_offset + num_groups) of group_sizes. An output tile is
  [tile_a, tile_b]; each of the two consumer warpgroups makes [tile_a / 2, tile_b] of it
  ([tile_a, tile_b / 2] with split_b), and block_m rows are reduced per pipeline step.
  Within a group, bands of group_m a tiles walk the b tiles (common.program_tile). a and b
  share a 16-bit dtype."""
  check_inputs(a, b)
  own = (tile_b if split_b else tile_a) // CONSUMERS
  if own % EPI_TILE:
    raise ValueError(f"each consumer warpgroup needs a multiple of {EPI_TILE} output rows or columns, got {own}")
  m, ka = a.shape
  kb = b.shape[1]
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  starts, ends = common.group_row_bounds(group_sizes, m, offset, num_groups)
  # TMA boxes are [8, 128 bytes]: zero-pad columns to 128 bytes and rows (past every group)
  # to 8, and to one step at least, so no box is larger than its array.
  rows = max(-(-m // ROW_TILE) * ROW_TILE, block_m)
  a = pad_to_multiple(pad_to_multiple(a, 1, swizzle_elems(a.dtype)), 0, rows)
  b = pad_to_multiple(pad_to_multiple(b, 1, swizzle_elems(b.dtype)), 0, rows)
  kernel = functools.partial(
    _tgmm_kernel,
    num_groups=num_groups,
    block_m=block_m,
    tile_a=tile_a,
    tile_b=tile_b,
    split_b=split_b,
    group_m=group_m,
    max_concurrent_steps=max_concurrent_steps,
  )
  kernel.__name__ = "ragtune_mgpu_tgmm"  # the kernel's name in the machine code and profiles
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((num_groups, a.shape[1], b.shape[1]), out_dtype),
    grid=(num_sms(interpret),),
    grid_names=("sm",),
    num_threads=CONSUMERS + 1,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret_params(interpret),
  )
  return call(starts, ends, a, b)[:, :ka, :kb]


# --- fp8 training: the weight gradient in 128-token blocks (kernels.quant.token_blocks) ----


def _tgmm_quantized_kernel(
  first_ref,
  count_ref,
  a_gmem,
  b_gmem,
  as_gmem,
  bs_gmem,
  o_gmem,
  *,
  num_groups: int,
  tile_a: int,
  tile_b: int,
  group_m: int,
  max_concurrent_steps: int,
):
  # a_gmem [ka, T] and b_gmem [kb, T]: tokens contiguous, the k-major A and B an 8-bit wgmma
  # takes (it reads no transposed tile). as_gmem [T/128, ka], bs_gmem [T/128, kb]: a step's
  # scales, one per column of each, for its 128 tokens.
  ka, kb = a_gmem.shape[0], b_gmem.shape[0]
  tiles_a, tiles_b = pl.cdiv(ka, tile_a), pl.cdiv(kb, tile_b)
  own = tile_a // CONSUMERS  # each consumer: 64 rows of the output tile, all its columns
  transforms = (plgpu.TilingTransform((ROW_TILE, quant.BLOCK)), plgpu.SwizzleTransform(128))

  def get_pipeline(body, compute_context, steps, first, ai, bi):
    # delay_release 0: a step's product is waited for and promoted before the next step, so its
    # buffers are free once it ends.
    return plgpu.emit_pipeline_warp_specialized(
      body,
      grid=(steps,),
      memory_registers=pipeline_registers("tgmm"),
      in_specs=[
        plgpu.BlockSpec((tile_a, quant.BLOCK), lambda i: (ai, first + i), transforms=transforms, delay_release=0),
        plgpu.BlockSpec((tile_b, quant.BLOCK), lambda i: (bi, first + i), transforms=transforms, delay_release=0),
        plgpu.BlockSpec((1, tile_a), lambda i: (first + i, ai), delay_release=0),
        plgpu.BlockSpec((1, tile_b), lambda i: (first + i, bi), delay_release=0),
      ],
      wg_axis="wg",
      num_compute_wgs=CONSUMERS,
      max_concurrent_steps=max_concurrent_steps,
      compute_context=compute_context,
    )

  ignore = lambda *_, **__: None
  allocs = get_pipeline(ignore, ignore, max_concurrent_steps, 0, 0, 0).get_allocations(a_gmem, b_gmem, as_gmem, bs_gmem)

  def cell(wg, group, ai, bi, pipeline_allocs, out_smem, drained):
    rows = pl.ds(wg * own, own)
    first, steps = first_ref[group], count_ref[group]

    def step(_, a_smem, b_smem, as_smem, bs_smem, carry):
      """This block's product into a fresh step accumulator, waited for, then added into the
      main one times its rows' and columns' scales (promotion, as the forward's block128)."""

      def product(step_ref):
        plgpu.wgmma(step_ref, a_smem.at[rows], b_smem.T)
        return step_ref[...]  # waits for it

      prod = pl.run_scoped(product, plgpu.ACC((own, tile_b), jnp.float32))
      row_scale = load_whole(as_smem.at[0, rows], plgpu.Layout.WGMMA.reduce(1))
      col_scale = load_whole(bs_smem.at[0], plgpu.Layout.WGMMA.reduce(0))
      prod = prod * lax.broadcast_in_dim(row_scale, prod.shape, [0])
      (acc,) = carry
      acc = acc + prod * lax.broadcast_in_dim(col_scale, prod.shape, [1])
      # The scales' reads are the generic proxy's; the producer's next TMA into these buffers
      # is the async proxy's: fenced before the buffers are released.
      plgpu.commit_smem()
      return (acc,)

    def compute_context(run_pipeline):
      zeros = plgpu.layout_cast(jnp.zeros((own, tile_b), jnp.float32), plgpu.Layout.WGMMA)
      (acc,) = run_pipeline((zeros,))

      @pl.when(steps > 0)
      def _arrive():
        plgpu.barrier_arrive(drained)

      _store(acc.astype(o_gmem.dtype), out_smem.at[wg], o_gmem.at[group], ai * tile_a + wg * own, bi * tile_b, ka, kb)

    get_pipeline(step, compute_context, steps, first, ai, bi)(
      a_gmem, b_gmem, as_gmem, bs_gmem, allocations=pipeline_allocs
    )
    return steps

  _over_cells(allocs, o_gmem.dtype, num_groups, tiles_a, tiles_b, group_m, cell)


def tgmm_quantized(
  a_t: jax.Array,
  b_t: jax.Array,
  a_scale: jax.Array,
  b_scale: jax.Array,
  first: jax.Array,
  count: jax.Array,
  *,
  tile_a: int,
  tile_b: int,
  group_m: int,
  max_concurrent_steps: int,
  out_dtype,
  interpret=False,
) -> jax.Array:
  """The weight gradient of fp8 training (kernels.Backend.grad_rhs_quantized): a_t [ka, T] and
  b_t [kb, T] float8_e4m3fn on quant.token_blocks' padded token axis, a_scale [T/128, ka] and
  b_scale [T/128, kb] -> [g, ka, kb], group i the sum over its 128-token blocks [first[i],
  first[i] + count[i]) of a_t's block times b_t's transposed, times the block's scales.
  Output tiles [tile_a, tile_b]; each consumer makes [tile_a / 2, tile_b] of it, a step per
  128-token block."""
  check_inputs(a_t, b_t, allowed=("float8_e4m3fn",))
  if tile_a != CONSUMERS * WGMMA_M or tile_b not in (EPI_TILE, quant.BLOCK):
    raise ValueError(
      f"the fp8 weight gradient takes [{CONSUMERS * WGMMA_M}, 64 or 128] output tiles (a main and a step "
      f"accumulator a consumer), got [{tile_a}, {tile_b}]"
    )
  ka, kb = a_t.shape[0], b_t.shape[0]
  num_groups = first.shape[0]
  # No TMA box larger than its array; sub-tiles are stored whole (64x64), so pad to 64 at least.
  ka_pad, kb_pad = max(-(-ka // EPI_TILE) * EPI_TILE, tile_a), max(-(-kb // EPI_TILE) * EPI_TILE, tile_b)
  a_t, a_scale = pad_to_multiple(a_t, 0, ka_pad), pad_to_multiple(a_scale.astype(jnp.float32), 1, ka_pad)
  b_t, b_scale = pad_to_multiple(b_t, 0, kb_pad), pad_to_multiple(b_scale.astype(jnp.float32), 1, kb_pad)
  kernel = functools.partial(
    _tgmm_quantized_kernel,
    num_groups=num_groups,
    tile_a=tile_a,
    tile_b=tile_b,
    group_m=group_m,
    max_concurrent_steps=max_concurrent_steps,
  )
  kernel.__name__ = "ragtune_mgpu_tgmm_fp8"
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((num_groups, ka_pad, kb_pad), out_dtype),
    grid=(num_sms(interpret),),
    grid_names=("sm",),
    num_threads=CONSUMERS + 1,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret_params(interpret),
  )
  return call(first.astype(jnp.int32), count.astype(jnp.int32), a_t, b_t, a_scale, b_scale)[:, :ka, :kb]
