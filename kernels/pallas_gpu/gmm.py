"""Pallas GPU (Triton) grouped matmul: out[rows of group i] = lhs[rows] @ rhs[i].

Layout, in order: tile schedule (group metadata), launch order (program_tile), kernel
body, pallas_call. Row tiles are group-start (common.tile_schedule): a group's first tile
starts at its first row, so only its last tile is partial. With transpose_rhs the weights
are read as [g, n, k] blocks and fed to the dot transposed, so dlhs never materialises rhs^T.

Launch order is what bounds this kernel on a big problem: it decides how often lhs and
the weights travel from HBM through L2. It is common.launch_cell's group-major order, in
bands of `group_m` row tiles; benchmarks/l2_traffic.py models the bytes it fetches.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import common, quant
from kernels.common import launch_cell, program_tile  # noqa: F401  (re-exported: tests and benchmarks)
from kernels.pallas_gpu.config import TritonConfig
from kernels.pallas_gpu.upstream import warn_deprecated_once


def mask_2d(row_ok, col_ok, shape):
  """row_ok[:, None] & col_ok[None, :] of `shape`; None (no mask) when both are None,
  and a None side counts as all in bounds."""
  if row_ok is None and col_ok is None:
    return None
  row_ok = jnp.ones((shape[0],), jnp.bool_) if row_ok is None else row_ok
  col_ok = jnp.ones((shape[1],), jnp.bool_) if col_ok is None else col_ok
  return row_ok[:, None] & col_ok[None, :]


def load(ref, mask):
  return plgpu.load(ref, mask=mask, other=None if mask is None else 0.0)


def _gmm_kernel(
  sched_ref,
  lhs_ref,
  rhs_ref,
  *refs,
  layout: common.ScheduleLayout,
  scales,
  m,
  k,
  n,
  g_local,
  block_m,
  block_k,
  block_n,
  num_col_blocks,
  group_m,
  transpose_rhs,
  precision,
):
  # Quantized operands (kernels.quant) bring their scales: channelwise lhs [m] and rhs
  # [g, n], applied to the accumulator once; block128 lhs [k/128, m] (transposed, so a
  # step reads a contiguous row) and rhs [g, k/128, n/128], applied to each step's product.
  *scale_refs, out_ref = refs
  tables = layout.tables(sched_ref)  # common.SCHEDULE_TABLES
  pid = pl.program_id(0)
  is_real = pid < tables["active"][0] * num_col_blocks  # spare launch slots return at once
  tile_seg = tables["tile_segment"]
  cell = jnp.where(is_real, pid, 0)
  t, j = launch_cell(cell, tile_seg, tables["segment_first_tile"], tables["segment_num_tiles"], num_col_blocks, group_m)
  seg = tile_seg[t]
  is_group = common.is_local(seg, g_local)

  row0 = tables["tile_row"][t]
  rows = row0 + jnp.arange(block_m)
  cols = j * block_n + jnp.arange(block_n)
  # The store drops the rows of the next segment (and those past m); they are computed from
  # this segment's weights. Loads mask only what can fall outside the arrays: rows for any m,
  # since a tile may start anywhere, k and n only when not a multiple of their block.
  row_mask = rows < tables["segment_end"][seg]
  rows_in = rows < m
  cols_in = (cols < n) if n % block_n else None
  out_mask = mask_2d(row_mask, cols_in, (block_m, block_n))
  out_block = out_ref.at[pl.ds(row0, block_m), pl.ds(j * block_n, block_n)]

  @pl.when(is_real & is_group)
  def _matmul():
    group = seg - 1

    def step(kb, acc):
      k_in = (kb * block_k + jnp.arange(block_k) < k) if k % block_k else None
      a = load(
        lhs_ref.at[pl.ds(row0, block_m), pl.ds(kb * block_k, block_k)], mask_2d(rows_in, k_in, (block_m, block_k))
      )
      if transpose_rhs:
        b = load(
          rhs_ref.at[group, pl.ds(j * block_n, block_n), pl.ds(kb * block_k, block_k)],
          mask_2d(cols_in, k_in, (block_n, block_k)),
        )
      else:
        b = load(
          rhs_ref.at[group, pl.ds(kb * block_k, block_k), pl.ds(j * block_n, block_n)],
          mask_2d(k_in, cols_in, (block_k, block_n)),
        )
      if not scales:
        return acc + plgpu.dot(a, b, trans_b=transpose_rhs, precision=precision)
      part = jax.lax.dot_general(
        a, b, (((1,), (1 if transpose_rhs else 0,)), ((), ())), preferred_element_type=jnp.float32
      )
      if scales == "block128":
        ls_ref, rs_ref = scale_refs
        kq = kb * block_k // quant.BLOCK
        row_scale = load(ls_ref.at[kq, pl.ds(row0, block_m)], rows_in)
        part = part * (row_scale[:, None] * rs_ref[group, kq, j * block_n // quant.BLOCK])
      return acc + part

    acc = jax.lax.fori_loop(0, pl.cdiv(k, block_k), step, jnp.zeros((block_m, block_n), jnp.float32))
    if scales == "channelwise":
      ls_ref, rs_ref = scale_refs
      row_scale = load(ls_ref.at[pl.ds(row0, block_m)], rows_in)
      col_scale = load(rs_ref.at[group, pl.ds(j * block_n, block_n)], cols_in)
      acc = acc * row_scale[:, None] * col_scale[None, :]
    plgpu.store(out_block, acc.astype(out_ref.dtype), mask=out_mask)

  @pl.when(is_real & jnp.logical_not(is_group))
  def _zero_fill():
    plgpu.store(out_block, jnp.zeros((block_m, block_n), out_ref.dtype), mask=out_mask)


def gmm(
  lhs: jax.Array,
  rhs: jax.Array,
  group_sizes: jax.Array,
  *,
  config: TritonConfig,
  out_dtype,
  transpose_rhs: bool = False,
  group_offset: jax.Array | None = None,
  precision=None,
  interpret: bool = False,
  lhs_scale: jax.Array | None = None,
  rhs_scale: jax.Array | None = None,
) -> jax.Array:
  """Grouped matmul [m,k] x [g,k,n] (or [g,n,k] with transpose_rhs) -> [m,n].

  group_sizes may be longer than rhs's g (expert parallelism): rhs holds groups
  [group_offset, group_offset + g) and every other row comes out 0.
  lhs_scale, rhs_scale: the scales of quantized operands (kernels.quant).
  """
  warn_deprecated_once()
  m, k = lhs.shape
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  cfg = config.clamped(m, k, n)
  scale_args, scales = (), ""
  if lhs_scale is not None:
    fmt = quant.check(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs)
    if why := quant.tile_violation(fmt, cfg.block_k, cfg.block_n):
      raise ValueError(f"TritonConfig {cfg} on {fmt}: {why}")
    scales = common.scheme(fmt)
    if scales == "channelwise":
      scale_args = (lhs_scale[:, 0], rhs_scale[:, 0, :])
    else:
      scale_args = (lhs_scale.T, rhs_scale)
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)

  num_tiles = common.num_tiles_bound(m, cfg.block_m, g_local)  # bounds group-start tiles too
  seg_starts, seg_ends = common.segment_bounds(group_sizes, m, offset, g_local)
  sched = common.tile_schedule(seg_starts, seg_ends, cfg.block_m, num_tiles, group_start=True)

  num_col_blocks = pl.cdiv(n, cfg.block_n)
  kernel = functools.partial(
    _gmm_kernel,
    layout=sched.layout,
    m=m,
    k=k,
    n=n,
    g_local=g_local,
    block_m=cfg.block_m,
    block_k=cfg.block_k,
    block_n=cfg.block_n,
    num_col_blocks=num_col_blocks,
    group_m=cfg.group_m,
    transpose_rhs=transpose_rhs,
    precision=precision,
    scales=scales,
  )
  return pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
    grid=(num_tiles * num_col_blocks,),
    compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
    interpret=interpret,
    name="ragtune_gmm",
  )(sched.packed, lhs, rhs, *scale_args)
