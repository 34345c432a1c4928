"""Candidate configs per backend, pruned to those that can run for a problem."""

from __future__ import annotations

import itertools
import random

from kernels.config import GpuConfig, TpuConfig, default_config, next_pow2, op_dims
from ragtune.shapes import Problem

GPU_BLOCK_M = (16, 32, 64, 128)
GPU_BLOCK_K = (32, 64, 128)
GPU_BLOCK_N = (32, 64, 128, 256)
GPU_NUM_WARPS = (4, 8)
GPU_NUM_STAGES = (2, 3, 4)
TPU_TM = (64, 128, 256, 512)
TPU_TK = (128, 256, 512, 1024)
TPU_TN = (128, 256, 512, 1024)


def _gpu_space(p: Problem) -> list[GpuConfig]:
  rows, contraction, cols = op_dims(p.op, p.m, p.k, p.n)
  orders = ("m_fastest",) if p.op == "drhs" else ("m_fastest", "n_fastest")  # tgmm ignores it
  out = []
  for bm, bk, bn, w, s, order in itertools.product(GPU_BLOCK_M, GPU_BLOCK_K, GPU_BLOCK_N, GPU_NUM_WARPS,
                                                   GPU_NUM_STAGES, orders):
    if w == 8 and bm * bn < 64 * 128:  # too little work per warp
      continue
    cfg = GpuConfig(bm, bk, bn, w, s, order).clamped(rows, contraction, cols)
    if cfg.fits(p.op, p.dtype, p.m, p.k, p.n):
      out.append(cfg)
  return out


def _tpu_space(p: Problem) -> list[TpuConfig]:
  rows, contraction, cols = op_dims(p.op, p.m, p.k, p.n)
  cap = lambda d: max(128, next_pow2(d))
  out = []
  for tm, tk, tn in itertools.product(TPU_TM, TPU_TK, TPU_TN):
    tm = min(tm, max(8, next_pow2(rows)))
    if tk > cap(contraction) or tn > cap(cols):
      continue
    cfg = TpuConfig(tm, tk, tn)
    if cfg.fits(p.op, p.dtype, p.m, p.k, p.n):
      out.append(cfg)
  return out


def candidates(p: Problem, max_candidates: int | None = None, seed: int = 0) -> list:
  """The default config first, then the rest of the valid space in a fixed shuffled order.

  The order depends only on the problem and seed, so a resumed sweep with the same
  max_candidates picks the same subset.
  """
  if p.backend == "xla":
    return []
  default = default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g)
  space = _gpu_space(p) if p.backend == "pallas_gpu" else _tpu_space(p)
  unique = list(dict.fromkeys(space))
  random.Random(f"{seed}|{p.key}").shuffle(unique)
  ordered = [default] + [c for c in unique if c != default]
  return ordered[:max_candidates] if max_candidates else ordered
