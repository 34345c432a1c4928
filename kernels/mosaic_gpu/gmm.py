"""Mosaic GPU (Hopper TMA + wgmma) grouped matmul: out[rows of group i] = lhs[rows] @ rhs[i].

Layout, in order: tile schedule (group metadata), launch order, kernel body, kernel call.
The design follows jax's `ragged_dot_mgpu` (a persistent grid of one program per SM that
walks the output cells in a snake, a TMA pipeline over k feeding wgmma, and stores of
partial row tiles by a ladder of power-of-two TMA copies), with what a model needs added:

- the row tiles come from common's group metadata segments, so rows of other shards' groups
  (group_offset) and rows past sum(group_sizes) are written as zeros, and every output
  row is written exactly once;
- k is zero-padded to a multiple of block_k in the wrapper, only when it is not one;
- n and m need no padding: TMA reads past an array's end as zeros and clips stores;
- the SM count comes from the device (see num_sms);
- transpose_rhs reads the weights as [g, n, k] tiles and feeds them to wgmma transposed,
  so dlhs never materialises rhs^T.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import common, target
from kernels.mosaic_gpu.config import MosaicConfig

# H100 SXM's SM count: the grid size when the default device is not a GPU (export for
# CUDA from a CPU host). A persistent grid of any size is correct, only its speed moves.
FALLBACK_NUM_SMS = 132
# Programs the GPU interpreter simulates (each is a host thread, so keep it small).
INTERPRET_NUM_SMS = 2
DTYPES = ("bfloat16", "float16")  # wgmma's 16-bit inputs; kernels/mosaic_gpu/__init__.py
ROW_TILE = 8  # rows of a TMA box in the swizzled layout


def check_inputs(*arrays) -> None:
  """The kernels take one 16-bit input dtype; ragged_dot promotes and casts before."""
  names = {jnp.dtype(a.dtype).name for a in arrays}
  if len(names) != 1 or not names <= set(DTYPES):
    raise TypeError(f"Mosaic GPU kernels take inputs of one dtype among {DTYPES}, got {sorted(names)}")


def swizzle_elems(dtype) -> int:
  """Elements in the 128-byte minor dim of a TMA box."""
  return 128 // jnp.dtype(dtype).itemsize


def num_sms(interpret=False) -> int:
  """Persistent programs to launch: the SM count of the GPU being compiled for."""
  if interpret:
    return INTERPRET_NUM_SMS
  t = target.current()
  return int(t.num_cores) if t.is_gpu and t.num_cores else FALLBACK_NUM_SMS


def pad_to_multiple(x: jax.Array, axis: int, multiple: int) -> jax.Array:
  """x zero-padded along `axis` up to a multiple of `multiple` (x itself if it is one)."""
  pad = -x.shape[axis] % multiple
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def out_cols(n: int, block_n: int, interpret) -> int:
  """Columns of the kernel's output array. A GPU's TMA clips a store past the end of an
  array; jax's interpreter drops such a store whole, so interpreted kernels write to an
  output padded to whole column blocks, sliced after."""
  return n + (-n % block_n if interpret else 0)


def store_rows(o_smem, o_gmem, first_row, num_rows, max_rows: int, row0, col0, block_n: int):
  """Copy rows [first_row, first_row + num_rows) of the smem tile to o_gmem[row0 + ...].

  TMA copies need static shapes, so the dynamic row count is stored as its binary digits:
  one copy of 2**i rows for each set bit i of num_rows (num_rows <= max_rows)."""
  start = first_row
  for bit in reversed(range(int(math.log2(max_rows)) + 1)):
    rows = 1 << bit

    @pl.when(num_rows & rows != 0)
    def _copy():
      plgpu.copy_smem_to_gmem(o_smem.at[pl.ds(start, rows)], o_gmem.at[pl.ds(row0 + start, rows), pl.ds(col0, block_n)])

    start = start + (num_rows & rows)


def band_snake(idx, num_rows: int, num_cols: int, band: int):
  """The (row, col) cell of step `idx` when a num_rows x num_cols grid is walked in bands
  of `band` columns: within a band the column varies fastest, every other band walks its
  rows bottom-up (so consecutive bands share the rows at their turn), and the last band
  may be narrower. A bijection from [0, num_rows * num_cols); the same order as
  plgpu.planar_snake(idx, shape, 1, band), with no division by a zero-width tail band
  (which XLA's CPU compiler constant-folds into a SIGFPE in the interpreter)."""
  band = max(1, min(band, num_cols))
  per_band = band * num_rows
  b = idx // per_band
  local = idx - b * per_band
  first_col = b * band
  width = jnp.maximum(jnp.minimum(band, num_cols - first_col), 1)
  row = local // width
  row = jnp.where(b % 2 == 0, row, num_rows - 1 - row)
  return row, first_col + local % width


def _gmm_kernel(
  tile_seg_ref,
  tile_block_ref,
  active_ref,
  seg_start_ref,
  seg_end_ref,
  lhs_gmem,
  rhs_gmem,
  o_gmem,
  *,
  m,
  k,
  g_local,
  num_tiles,
  num_col_blocks,
  cfg: MosaicConfig,
  transpose_rhs,
):
  block_m, block_n, block_k = cfg.block_m, cfg.block_n, cfg.block_k

  @plgpu.nd_loop((num_tiles * num_col_blocks,), collective_axes="sm")
  def _cell(loop_info):
    t, j = band_snake(loop_info.index[0], num_tiles, num_col_blocks, cfg.grid_block_n)
    is_real = t < active_ref[0]  # spare tiles of the static bound store nothing
    seg = tile_seg_ref[t]
    is_group = is_real & (seg >= 1) & (seg <= g_local)
    row0 = tile_block_ref[t] * block_m
    first = jnp.maximum(seg_start_ref[seg], row0)
    last = jnp.minimum(seg_end_ref[seg], row0 + block_m)
    num_rows = jnp.where(is_real, last - first, 0)
    group = jnp.clip(seg - 1, 0, g_local - 1)

    def acc_scope(acc_ref):
      @pl.when(is_group)  # other segments' rows stay 0: the accumulator starts at 0
      def _matmul():
        def step(_, lhs_smem, rhs_smem):
          rhs_tile = rhs_smem.T if transpose_rhs else rhs_smem  # read transposed; wgmma supports it for 16-bit
          plgpu.wgmma(acc_ref, lhs_smem, rhs_tile)
          # Keep one wgmma in flight: the previous step's is done before delay_release=1
          # lets the pipeline refill its buffers (jax's pipelining docs pair the two).
          plgpu.wgmma_wait(1)

        rhs_shape = (block_n, block_k) if transpose_rhs else (block_k, block_n)
        rhs_index = (lambda kb: (j, kb)) if transpose_rhs else (lambda kb: (kb, j))
        plgpu.emit_pipeline(
          step,
          grid=(k // block_k,),
          in_specs=[
            plgpu.BlockSpec((block_m, block_k), lambda kb: (tile_block_ref[t], kb), delay_release=1),
            plgpu.BlockSpec(rhs_shape, rhs_index, delay_release=1),
          ],
          max_concurrent_steps=cfg.max_concurrent_steps,
        )(lhs_gmem, rhs_gmem.at[group])

      return acc_ref[...]

    acc = pl.run_scoped(acc_scope, plgpu.ACC((block_m, block_n)))

    @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((block_m, block_n), o_gmem.dtype))
    def _store(o_smem):
      o_smem[...] = acc.astype(o_smem.dtype)
      plgpu.commit_smem()
      store_rows(o_smem, o_gmem, first - row0, num_rows, min(block_m, m), row0, j * block_n, block_n)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)


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
) -> jax.Array:
  """Grouped matmul [m,k] x [g,k,n] (or [g,n,k] with transpose_rhs) -> [m,n].

  lhs and rhs must share a 16-bit dtype (the ragged_dot wrapper casts them). rhs holds
  groups [group_offset, group_offset + g) of group_sizes; every other row comes out 0.
  precision is accepted for a uniform signature: wgmma on 16-bit inputs has one.
  interpret: False, True (the GPU interpreter with default params) or InterpretGPUParams.
  """
  del precision
  check_inputs(lhs, rhs)
  m, k = lhs.shape
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  cfg = config
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)

  # TMA tiles global memory in [8, 128-byte] boxes, so both dims of every operand must be
  # multiples of those; a ragged last k step would also add another tile's columns. Pad
  # with zeros, only the dims that need it (model shapes rarely do, but for m).
  lhs = pad_to_multiple(pad_to_multiple(lhs, 0, ROW_TILE), 1, cfg.block_k)
  rhs = pad_to_multiple(rhs, 2 if transpose_rhs else 1, cfg.block_k)
  # n: a multiple of the 128-byte row in the rhs tiles and in the output's.
  rhs = pad_to_multiple(rhs, 1 if transpose_rhs else 2, swizzle_elems(rhs.dtype))
  m_pad, n_pad = lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2]

  # Rows m..m_pad are past sum(group_sizes): the zero segment after the groups.
  num_tiles = common.num_tiles_bound(m_pad, cfg.block_m, g_local)
  seg_starts, seg_ends = common.segment_bounds(group_sizes, m_pad, offset, g_local)
  sched = common.tile_schedule(seg_starts, seg_ends, cfg.block_m, num_tiles)

  kernel = functools.partial(
    _gmm_kernel,
    m=m_pad,
    k=lhs.shape[1],
    g_local=g_local,
    num_tiles=num_tiles,
    num_col_blocks=pl.cdiv(n_pad, cfg.block_n),
    cfg=cfg,
    transpose_rhs=transpose_rhs,
  )
  kernel.__name__ = "ragtune_mgpu_gmm"  # the kernel's name in the machine code and profiles
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((m_pad, out_cols(n_pad, cfg.block_n, interpret)), out_dtype),
    grid=(num_sms(interpret),),
    grid_names=("sm",),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret_params(interpret),
  )
  out = call(sched.tile_segment, sched.tile_row_block, sched.active, seg_starts, seg_ends, lhs, rhs)
  return out[:m, :n]


def interpret_params(interpret):
  if interpret is True:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    # TMA reads past an array's end as zeros: the interpreter does that with these two.
    return InterpretGPUParams(out_of_bounds_reads="uninitialized", uninitialized_memory="zero")
  return interpret or None
