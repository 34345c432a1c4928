"""Pallas GPU (Triton) fp8 quantizers for training (kernels.quant's "training" section): one pass
over x each, bit-identical to kernels.quant's XLA versions.

quantize_rows         x [m, c] in 1x128 blocks along c: quant.quantize(x, dtype, (1, 128)).
quantize_token_blocks x [m, c] on quant.token_blocks' padded token axis, 128x1 blocks along it,
                      stored transposed: quant.quantize_tokens(x, blocks, dtype).

XLA runs each as several kernels (an amax reduce, then a convert that reads x again; the token
form gathers first), moving ~1.7x the bytes of one pass. Here a program loads its tile once,
reduces, scales, converts and stores.

Bit-identity: the scale is amax * f32(1/448) (one rounding, as XLA's), the value x / scale
in f32, cast to e4m3 rounding to nearest even (cvt.rn.satfinite on Hopper, as XLA's). The
division is a plain `/` on purpose, for it is compiled as XLA compiles quant.quantize's: for
NVIDIA GPUs both Triton and XLA (-nvptx-prec-divf32=1) emit div.full.f32 (up to 2 ulp off),
and on the CPU (interpret=True) XLA rewrites both into x * (1 / scale). Quotients an ulp from
an e4m3 rounding boundary are common (random bf16 blocks put 1-2% there), so any other division
would differ.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import quant
from kernels.pallas_gpu.gmm import load, mask_2d
from kernels.pallas_gpu.upstream import warn_deprecated_once

B = quant.BLOCK
DTYPES = ("float8_e4m3fn",)


def _check_dtype(dtype) -> str:
  name = jnp.dtype(dtype).name if not isinstance(dtype, str) else dtype
  if name not in DTYPES:
    raise ValueError(f"the Pallas Triton quantizers produce one of {DTYPES}, got {name!r} (quant.quantize takes int8)")
  return name


def _check_block(name: str, size: int) -> None:
  if size < 1 or size & (size - 1):
    raise ValueError(f"{name} must be a power of two (a Triton block's shape), got {size}")


def _scale(amax):
  return jnp.where(amax > 0, amax * np.float32(1 / quant.QMAX["float8_e4m3fn"]), np.float32(1.0))


def _rows_kernel(x_ref, q_ref, s_ref, *, m, c, block_rows):
  j, i = pl.program_id(0), pl.program_id(1)  # column blocks fastest: programs in flight stream whole rows of x
  rows_in = (i * block_rows + jnp.arange(block_rows) < m) if m % block_rows else None
  cols_in = (j * B + jnp.arange(B) < c) if c % B else None
  mask = mask_2d(rows_in, cols_in, (block_rows, B))
  tile = pl.ds(i * block_rows, block_rows), pl.ds(j * B, B)
  # masked elements load as 0, which leaves the amax of a partial last block its real elements'
  x = load(x_ref.at[tile], mask).astype(jnp.float32)
  scale = _scale(jnp.max(jnp.abs(x), axis=1))
  q = x / scale[:, None]
  plgpu.store(q_ref.at[tile], q.astype(q_ref.dtype), mask=mask)
  plgpu.store(s_ref.at[pl.ds(i * block_rows, block_rows), j], scale, mask=rows_in)


def quantize_rows(
  x: jax.Array, dtype="float8_e4m3fn", *, block_rows: int = 32, num_warps: int = 4, interpret: bool = False
) -> tuple[jax.Array, jax.Array]:
  """(q [m, c], float32 scale [m, ceil(c/128)]) of x [m, c] in 1x128 blocks along c, exactly
  quant.quantize(x, dtype, (1, 128)). One program per (block_rows rows, 128 columns) tile."""
  dtype = _check_dtype(dtype)
  _check_block("block_rows", block_rows)
  warn_deprecated_once()
  m, c = x.shape
  kb = pl.cdiv(c, B)
  kernel = functools.partial(_rows_kernel, m=m, c=c, block_rows=block_rows)
  return pl.pallas_call(
    kernel,
    out_shape=(jax.ShapeDtypeStruct((m, c), jnp.dtype(dtype)), jax.ShapeDtypeStruct((m, kb), jnp.float32)),
    grid=(kb, pl.cdiv(m, block_rows)),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="ragtune_quantize_rows",
  )(x)


def _token_kernel(source_ref, x_ref, q_ref, s_ref, *, m, c, block_cols):
  b, j = pl.program_id(0), pl.program_id(1)
  # A token block holds one group's consecutive rows, then padding (source == m): its real rows
  # are [min(source), +valid), and an all-padding block loads nothing (valid == 0).
  src = source_ref[pl.ds(b * B, B)]
  start = jnp.min(src)
  valid = jnp.sum((src < m).astype(jnp.int32))
  cols = pl.ds(j * block_cols, block_cols)
  cols_in = (j * block_cols + jnp.arange(block_cols) < c) if c % block_cols else None
  mask = mask_2d(jnp.arange(B) < valid, cols_in, (B, block_cols))
  x = load(x_ref.at[pl.ds(start, B), cols], mask).astype(jnp.float32)
  scale = _scale(jnp.max(jnp.abs(x), axis=0))
  q = (x / scale[None, :]).astype(q_ref.dtype)
  plgpu.store(q_ref.at[cols, pl.ds(b * B, B)], q.T, mask=mask_2d(cols_in, None, (block_cols, B)))
  plgpu.store(s_ref.at[b, cols], scale, mask=cols_in)


def quantize_token_blocks(
  x: jax.Array,
  blocks: quant.TokenBlocks,
  dtype="float8_e4m3fn",
  *,
  block_cols: int = 64,
  num_warps: int = 4,
  interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """(q [c, T], float32 scale [T/128, c]) of x [m, c] on the padded token axis of `blocks`
  (quant.token_blocks) in 128x1 blocks along it, exactly quant.quantize_tokens(x, blocks,
  dtype). One program per (128-token block, block_cols columns): it loads the block's rows of
  x, contiguous in x, and stores its tile transposed (tokens contiguous)."""
  dtype = _check_dtype(dtype)
  _check_block("block_cols", block_cols)
  warn_deprecated_once()
  m, c = x.shape
  (t,) = blocks.source.shape
  if t % B:
    raise ValueError(f"blocks.source must cover whole {B}-token blocks, got {t} positions")
  kernel = functools.partial(_token_kernel, m=m, c=c, block_cols=block_cols)
  return pl.pallas_call(
    kernel,
    out_shape=(jax.ShapeDtypeStruct((c, t), jnp.dtype(dtype)), jax.ShapeDtypeStruct((t // B, c), jnp.float32)),
    grid=(t // B, pl.cdiv(c, block_cols)),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="ragtune_quantize_token_blocks",
  )(blocks.source.astype(jnp.int32), x)
