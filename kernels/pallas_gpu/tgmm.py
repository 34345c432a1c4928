"""Pallas GPU (Triton) transposed grouped matmul: out[i] = lhs[rows of i]^T @ rhs[rows of i].

This is the weight gradient of gmm: lhs [m,k], rhs (dout) [m,n] -> [g,k,n]. Each
program owns one (group, k block, n block) output tile and reduces over only that
group's rows, in steps of block_m from its first row, so only the last step is partial and
an empty group runs no step and stores zeros.

tgmm_quantized is its fp8 training form (DeepSeek-V3's recipe, kernels.quant's "training"
section): the groups' rows come on quant.token_blocks' padded token axis, tokens contiguous
(the k-major operands of an 8-bit MMA), in whole 128-token blocks with a scale per block and
column. A step's fp8 product is scaled and added to an f32 accumulator (promotion per step).

Launch order (program_tile): the group is the slowest axis, so the programs in flight
share one group's rows of lhs and dout, which then stay in L2; within a group the
(k block, n block) cells follow gmm's banded order with its own band, group_k.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import common, quant
from kernels.common import program_tile as gmm_program_tile
from kernels.pallas_gpu.config import TritonConfig, token_step_violation
from kernels.pallas_gpu.gmm import load, mask_2d
from kernels.pallas_gpu.upstream import warn_deprecated_once


def program_tile(pid, num_groups, num_k_blocks, num_n_blocks, group_k):
  """The (group, k_block, n_block) that launch slot `pid` computes.

  The group is the slowest axis; within it, (k block, n block) follow
  gmm.program_tile with bands of group_k k blocks. A bijection from
  [0, num_groups * num_k_blocks * num_n_blocks) onto the cells; integer arithmetic only.
  """
  per_group = num_k_blocks * num_n_blocks
  group = pid // per_group
  kb, nb = gmm_program_tile(pid - group * per_group, num_k_blocks, num_n_blocks, group_k)
  return group, kb, nb


def _tgmm_kernel(
  start_ref, end_ref, lhs_ref, rhs_ref, out_ref, *, k, n, num_groups, block_m, block_k, block_n, group_k, precision
):
  group, kb, nb = program_tile(pl.program_id(0), num_groups, pl.cdiv(k, block_k), pl.cdiv(n, block_n), group_k)
  start, end = start_ref[group], end_ref[group]
  k_in = (kb * block_k + jnp.arange(block_k) < k) if k % block_k else None
  n_in = (nb * block_n + jnp.arange(block_n) < n) if n % block_n else None

  def step(i, acc, row_mask):
    rows = pl.ds(start + i * block_m, block_m)
    a = load(lhs_ref.at[rows, pl.ds(kb * block_k, block_k)], mask_2d(row_mask, k_in, (block_m, block_k)))
    b = load(rhs_ref.at[rows, pl.ds(nb * block_n, block_n)], mask_2d(row_mask, n_in, (block_m, block_n)))
    return acc + plgpu.dot(a, b, trans_a=True, precision=precision)

  # Steps from the group's first row: the full ones read only the group's rows (no row mask);
  # the partial last one, if any, masks the rows of the next group and those past m. A cond
  # rather than a second loop: the loop would be pipelined again (+20 registers on H100).
  full = (end - start) // block_m
  acc = jax.lax.fori_loop(0, full, lambda i, acc: step(i, acc, None), jnp.zeros((block_k, block_n), jnp.float32))
  last_rows = start + full * block_m + jnp.arange(block_m)
  acc = jax.lax.cond(start + full * block_m < end, lambda a: step(full, a, last_rows < end), lambda a: a, acc)
  plgpu.store(
    out_ref.at[group, pl.ds(kb * block_k, block_k), pl.ds(nb * block_n, block_n)],
    acc.astype(out_ref.dtype),
    mask=mask_2d(k_in, n_in, (block_k, block_n)),
  )


def tgmm(
  lhs: jax.Array,
  rhs: jax.Array,
  group_sizes: jax.Array,
  *,
  num_groups: int,
  config: TritonConfig,
  out_dtype,
  group_offset: jax.Array | None = None,
  precision=None,
  interpret: bool = False,
) -> jax.Array:
  """Per-group lhs^T @ rhs: [m,k] x [m,n] -> [num_groups,k,n] for groups
  [group_offset, group_offset + num_groups)."""
  warn_deprecated_once()
  m, k = lhs.shape
  n = rhs.shape[1]
  # config is in the drhs frame (m, k, n): block_m steps over rows, block_k/n tile the output.
  cfg = config.clamped(m, k, n)
  offset = jnp.zeros((), jnp.int32) if group_offset is None else group_offset.astype(jnp.int32)
  starts, ends = common.group_row_bounds(group_sizes, m, offset, num_groups)
  kernel = functools.partial(
    _tgmm_kernel,
    k=k,
    n=n,
    num_groups=num_groups,
    block_m=cfg.block_m,
    block_k=cfg.block_k,
    block_n=cfg.block_n,
    group_k=cfg.group_k,
    precision=precision,
  )
  return pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
    grid=(num_groups * pl.cdiv(k, cfg.block_k) * pl.cdiv(n, cfg.block_n),),
    compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
    interpret=interpret,
    name="ragtune_tgmm",
  )(starts, ends, lhs, rhs)


def _tgmm_quantized_kernel(
  first_ref, count_ref, a_ref, b_ref, as_ref, bs_ref, out_ref, *, ka, kb, num_groups, block_m, block_k, block_n, group_k
):
  group, i, j = program_tile(pl.program_id(0), num_groups, pl.cdiv(ka, block_k), pl.cdiv(kb, block_n), group_k)
  first = first_ref[group]
  a_cols = pl.ds(i * block_k, block_k)
  b_cols = pl.ds(j * block_n, block_n)
  a_in = (i * block_k + jnp.arange(block_k) < ka) if ka % block_k else None
  b_in = (j * block_n + jnp.arange(block_n) < kb) if kb % block_n else None

  def step(s, acc):
    # No token mask: a group's blocks hold its rows, then zeros (quant.token_blocks).
    tokens = pl.ds(first * quant.BLOCK + s * block_m, block_m)
    a = load(a_ref.at[a_cols, tokens], mask_2d(a_in, None, (block_k, block_m)))
    b = load(b_ref.at[b_cols, tokens], mask_2d(b_in, None, (block_n, block_m)))
    part = jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    q = first + (s * block_m) // quant.BLOCK
    a_scale = load(as_ref.at[q, a_cols], a_in)
    b_scale = load(bs_ref.at[q, b_cols], b_in)
    return acc + part * (a_scale[:, None] * b_scale[None, :])

  steps = count_ref[group] * (quant.BLOCK // block_m)
  acc = jax.lax.fori_loop(0, steps, step, jnp.zeros((block_k, block_n), jnp.float32))
  plgpu.store(
    out_ref.at[group, a_cols, b_cols], acc.astype(out_ref.dtype), mask=mask_2d(a_in, b_in, (block_k, block_n))
  )


def tgmm_quantized(
  a_t: jax.Array,
  b_t: jax.Array,
  a_scale: jax.Array,
  b_scale: jax.Array,
  first: jax.Array,
  count: jax.Array,
  *,
  config: TritonConfig,
  out_dtype,
  interpret: bool = False,
) -> jax.Array:
  """drhs of an fp8 training format (kernels.Backend.grad_rhs_quantized): a_t [ka, T] and b_t
  [kb, T] on quant.token_blocks' padded token axis, f32 scales [T/128, ka] and [T/128, kb]
  -> [g, ka, kb], where out[i] sums over the 128-token blocks j in [first[i], first[i] + count[i])
  (a_t[:, j] @ b_t[:, j]^T) * a_scale[j][:, None] * b_scale[j][None, :]."""
  warn_deprecated_once()
  ka, t = a_t.shape
  kb = b_t.shape[0]
  g = first.shape[0]
  if t % quant.BLOCK or b_t.shape[1] != t:
    raise ValueError(f"a_t [{ka}, {t}] and b_t {list(b_t.shape)} need one token axis of whole {quant.BLOCK}-blocks")
  want = ((t // quant.BLOCK, ka), (t // quant.BLOCK, kb))
  if (a_scale.shape, b_scale.shape) != want:
    raise ValueError(f"a_scale {list(a_scale.shape)} and b_scale {list(b_scale.shape)}: expected {want}")
  # The drhs frame (tokens, ka, kb): block_m steps over tokens, block_k/n tile the output.
  cfg = config.clamped(t, ka, kb)
  if why := token_step_violation(cfg.block_m):
    raise ValueError(f"TritonConfig {cfg}: {why}")
  kernel = functools.partial(
    _tgmm_quantized_kernel,
    ka=ka,
    kb=kb,
    num_groups=g,
    block_m=cfg.block_m,
    block_k=cfg.block_k,
    block_n=cfg.block_n,
    group_k=cfg.group_k,
  )
  return pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((g, ka, kb), out_dtype),
    grid=(g * pl.cdiv(ka, cfg.block_k) * pl.cdiv(kb, cfg.block_n),),
    compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
    interpret=interpret,
    name="ragtune_tgmm_quantized",
  )(first.astype(jnp.int32), count.astype(jnp.int32), a_t, b_t, a_scale, b_scale)
