"""Pallas TPU grouped matmul of quantized operands: int8 or float8_e4m3fn values with float32
scales (kernels.quant's channelwise and block128 schemes), forward only.

megablox's grid and group metadata (jax's ops/tpu/megablox/gmm.py), with the scales in the
kernel: one (tm, tk, tn) step dots an 8-bit [tm, tk] lhs tile into a [tk, tn] rhs tile.
- channelwise: the step's dot accumulates in int32 (int8) or f32 (fp8) across k, and the last
  k step scales the accumulator once, row scale times column scale, before the store.
- block128: the scales change every 128 of k, so each 128-deep slice of a step is its own dot,
  whose f32 product is scaled (its rows' scales times the expert's scale for each column) and
  added into an f32 accumulator, as the GPU kernels do. tk and tn are multiples of 128, so a
  tile always carries whole scale blocks.

Which MXU path a chip takes (kernels.common.TpuChip.mxu): an int8 one on v5e, v5p and v6e, an
fp8 one on v7x; the other dtype Mosaic converts to bfloat16 on its way in; v4 takes neither.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import common, quant
from kernels.pallas_tpu.config import TpuConfig

_megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def _tiles(x: int, t: int) -> tuple[int, int]:
  """(tiles of t covering x, the last tile's length or 0 when whole)."""
  return -(-x // t), x % t


def _scale_operands(fmt, lhs_scale, rhs_scale, *, m_pad, tk, tn, tiles_k, tiles_n):
  """The scales laid out as the kernel's blocks take them.

  channelwise: lhs [m_pad, 1], rhs [g, 1, n].
  block128: a grid step's scales in a block of their own (a block's last two dims must be
  whole array dims where they are not (8, 128)-aligned): lhs [tiles_k, m_pad, tk/128] and
  rhs [g, tiles_k, tiles_n, tk/128, tn/128]. Blocks past k and n get scale 0 (their values
  are masked to 0, or never stored)."""
  extra_rows = m_pad - lhs_scale.shape[0]
  if common.scheme(fmt) == "channelwise":
    return jnp.pad(lhs_scale, ((0, extra_rows), (0, 0))), rhs_scale
  sub, cols = tk // quant.BLOCK, tn // quant.BLOCK
  g, kb, nb = rhs_scale.shape
  ls = jnp.pad(lhs_scale, ((0, extra_rows), (0, tiles_k * sub - kb)))
  ls = ls.reshape(m_pad, tiles_k, sub).transpose(1, 0, 2)
  rs = jnp.pad(rhs_scale, ((0, 0), (0, tiles_k * sub - kb), (0, tiles_n * cols - nb)))
  rs = rs.reshape(g, tiles_k, sub, tiles_n, cols).transpose(0, 1, 3, 2, 4)
  return ls, rs


def qgmm(
  lhs,
  rhs,
  group_sizes,
  lhs_scale,
  rhs_scale,
  *,
  config: TpuConfig,
  out_dtype,
  transpose_rhs: bool = False,
  group_offset=None,
  interpret: bool = False,
):
  """[m,k] x [g,k,n] (or [g,n,k] with transpose_rhs) -> [m,n] of quantized operands; rows
  outside the local groups [group_offset, group_offset + g) come out 0."""
  fmt = quant.check(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs)
  if jnp.dtype(out_dtype) not in (jnp.bfloat16, jnp.float32):
    # Mosaic has no float16 store ("Invalid vector type for load", libtpu 0.0.42)
    raise TypeError(f"pallas_tpu writes a quantized product as bfloat16 or float32, not {jnp.dtype(out_dtype).name}")
  m, k = lhs.shape
  if why := config.layout_violation(fmt, m):
    raise ValueError(f"TpuConfig {config} on {fmt}: {why}")
  g_local = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  tm, tk, tn = config.tiling()
  tiles_k, k_rem = _tiles(k, tk)
  tiles_n, _ = _tiles(n, tn)
  m_pad = -(-m // tm) * tm
  blockwise = common.scheme(fmt) == "block128"
  sub = tk // quant.BLOCK
  # int8 products sum exactly in int32 across k (channelwise); block scales need f32 per slice.
  acc_dtype = jnp.int32 if jnp.dtype(lhs.dtype) == jnp.int8 else jnp.float32
  step_dtype = acc_dtype
  if blockwise:
    acc_dtype = jnp.float32

  offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
  metadata, num_active_tiles = _megablox.make_group_metadata(
    group_sizes=group_sizes.astype(jnp.int32),
    m=m_pad,
    tm=tm,
    start_group=offset,
    num_nonzero_groups=g_local,
    visit_empty_groups=False,
  )
  ls, rs = _scale_operands(
    fmt,
    lhs_scale.astype(jnp.float32),
    rhs_scale.astype(jnp.float32),
    m_pad=m_pad,
    tk=tk,
    tn=tn,
    tiles_k=tiles_k,
    tiles_n=tiles_n,
  )
  contract = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))

  def kernel(meta, group_offset, lhs_ref, rhs_ref, ls_ref, rs_ref, out_ref, acc_ref):
    group_offsets, group_ids, m_tile_ids = meta
    grid_id, k_i = pl.program_id(1), pl.program_id(2)

    @pl.when(k_i == 0)
    def _zero():
      acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(last: bool):
      x, w = lhs_ref[...], rhs_ref[...]
      if last and k_rem:  # past k the block holds whatever lies there: zero it (via f32, as megablox)
        x = _mask_k(x, 1, k_rem)
        w = _mask_k(w, 1 if transpose_rhs else 0, k_rem)
      if not blockwise:
        acc_ref[...] += jax.lax.dot_general(x, w, contract, preferred_element_type=acc_dtype)
      else:
        rs = rs_ref[...]
        for j in range(sub):
          ks = slice(j * quant.BLOCK, (j + 1) * quant.BLOCK)
          xs, ws = x[:, ks], (w[:, ks] if transpose_rhs else w[ks, :])
          part = jax.lax.dot_general(xs, ws, contract, preferred_element_type=step_dtype).astype(jnp.float32)
          part = part * ls_ref[:, j : j + 1]
          # Each 128 columns times their block's scale: the scales stay one per block (no
          # per-column copy of them in HBM).
          for c in range(tn // quant.BLOCK):
            cs = slice(c * quant.BLOCK, (c + 1) * quant.BLOCK)
            acc_ref[:, cs] += part[:, cs] * rs[j : j + 1, c : c + 1]
      if last:
        y = acc_ref[...].astype(jnp.float32)
        if not blockwise:
          y = y * ls_ref[...] * rs_ref[...]
        group = group_ids[grid_id]
        rows = jax.lax.broadcasted_iota(jnp.int32, (tm, tn), 0) + m_tile_ids[grid_id] * tm
        mine = (rows >= group_offsets[group]) & (rows < group_offsets[group + 1])
        # An m tile shared by two groups is stored once per group: keep the other group's rows.
        out_ref[...] = jax.lax.select(mine, y, out_ref[...].astype(jnp.float32)).astype(out_ref.dtype)

    jax.lax.cond(k_i == tiles_k - 1, lambda: accumulate(True), lambda: accumulate(False))

  # --- index maps: grid (n tile, active m tile of a group, k tile), as megablox's gmm ---
  def lhs_map(n_i, grid_id, k_i, meta, group_offset):
    return meta[2][grid_id], k_i

  def rhs_map(n_i, grid_id, k_i, meta, group_offset):
    expert = meta[1][grid_id] - group_offset[0]
    return (expert, n_i, k_i) if transpose_rhs else (expert, k_i, n_i)

  def out_map(n_i, grid_id, k_i, meta, group_offset):
    return meta[2][grid_id], n_i

  if blockwise:
    ls_spec = pl.BlockSpec((None, tm, sub), lambda n_i, grid_id, k_i, meta, go: (k_i, meta[2][grid_id], 0))
    rs_spec = pl.BlockSpec(
      (None, None, None, sub, tn // quant.BLOCK),
      lambda n_i, grid_id, k_i, meta, go: (meta[1][grid_id] - go[0], k_i, n_i, 0, 0),
    )
  else:
    ls_spec = pl.BlockSpec((tm, 1), lambda n_i, grid_id, k_i, meta, go: (meta[2][grid_id], 0))
    rs_spec = pl.BlockSpec((None, 1, tn), lambda n_i, grid_id, k_i, meta, go: (meta[1][grid_id] - go[0], 0, n_i))
  rhs_block = (None, tn, tk) if transpose_rhs else (None, tk, tn)

  out_dtype = jnp.dtype(out_dtype)
  cost = pl.CostEstimate(
    flops=2 * m * k * n,
    transcendentals=0,
    bytes_accessed=lhs.size * lhs.dtype.itemsize * tiles_n + rhs.size * rhs.dtype.itemsize + m * n * out_dtype.itemsize,
  )
  out = pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((m_pad, n), out_dtype),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      in_specs=[
        pl.BlockSpec((tm, tk), lhs_map),
        pl.BlockSpec(rhs_block, rhs_map),
        ls_spec,
        rs_spec,
      ],
      out_specs=pl.BlockSpec((tm, tn), out_map),
      grid=(tiles_n, num_active_tiles, tiles_k),
      scratch_shapes=[pltpu.VMEM((tm, tn), acc_dtype)],
    ),
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
    interpret=interpret,
    cost_estimate=cost,
    name="ragtune_qgmm",
  )(metadata, offset[None], common.pad_rows(lhs, tm), rhs, ls, rs)[:m]
  keep = common.local_row_mask(group_sizes, m, offset, g_local)
  return jnp.where(keep[:, None], out, jnp.zeros((), out.dtype))


def _mask_k(x, dim: int, k_rem: int):
  iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, dim)
  return jnp.where(iota < k_rem, x.astype(jnp.float32), 0).astype(x.dtype)
