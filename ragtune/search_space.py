"""Candidate configs per backend, pruned to those that can run for a problem."""

from __future__ import annotations

import dataclasses
import itertools
import random

from kernels import backends
from kernels.config import GpuConfig, MosaicConfig, TpuConfig, default_config, next_pow2, op_dims
from kernels.lut import current_device_kind
from ragtune.shapes import Problem

# gmm (fwd, dlhs): block_m rows, block_k contraction step, block_n columns.
GPU_BLOCK_M = (16, 32, 64, 128)
GPU_BLOCK_K = (32, 64, 128)
GPU_BLOCK_N = (32, 64, 128, 256)
GPU_NUM_WARPS = (2, 4, 8)
GPU_NUM_STAGES = (2, 3, 4, 5)
GPU_GROUP_M = (1, 4, 16, 64)
# tgmm (drhs): block_m is the step over a group's rows, [block_k, block_n] the output tile.
TGMM_BLOCK_M = (32, 64, 128)
TGMM_BLOCK_K = (64, 128, 256)
TGMM_BLOCK_N = (64, 128, 256)
TGMM_GROUP_K = (1, 4, 16, 64)
# Mosaic GPU: [block_m, block_n] output tiles (drhs: [block_k, block_n]); pipeline depth;
# snake band width in column blocks.
MOSAIC_BLOCK_M = (64, 128, 192, 256)
MOSAIC_BLOCK_N = (64, 128, 192, 256)
MOSAIC_BLOCK_K = (64, 128)
MOSAIC_TGMM_BLOCK_M = (64, 128, 256)
MOSAIC_STEPS = (2, 3, 4, 5, 6)
MOSAIC_GRID_BLOCK_N = (1, 2, 4, 8, 16)
# One warpgroup holds the f32 accumulator: 128 threads x at most 192 values. Compiled for
# H100: 192x128 is clean at 226 registers; 128x256, 256x128 and larger spill 0.5-1.6 KB a
# thread (tests/test_aot_compile.py::test_each_pruning_rule_against_the_compiler).
MOSAIC_MAX_ACC = 128 * 192
TPU_TM = (64, 128, 256, 512)
TPU_TK = (128, 256, 512, 1024)
TPU_TN = (128, 256, 512, 1024)


def _gpu_config_ok(cfg: GpuConfig, out_rows: int, out_cols: int) -> bool:
  """Whether a (clamped) config can be fast. Each rule was checked against XLA's real
  compiler for H100 (tests/test_aot_compile.py::test_each_pruning_rule_against_the_compiler):
  1. At most 128 f32 accumulator values per thread: more spill (128x128 on 2 warps
     ~6.8 KB/thread, 128x256 on 4 warps 1 KB, a 256x256 drhs tile on 8 warps 0.6 KB).
  2. Output tiles of 64x64 or more need 4+ warps: with 2 there is no warpgroup, so no
     wgmma (mma.sync only).
  3. 8 warps need 128x64 outputs or more. This one is speed, not compilation (such tiles
     compile clean): two warpgroups on a tile one covers each get half a 64-row wgmma's
     work. It keeps ~120 configs a problem (Mixtral fwd) out of the timing budget.
  4. block_n 256 needs 8 warps. Also economy, not compilation: 64x256 on 4 warps compiles
     to m64n256 wgmma with no spill (128x256 on 4 warps is rule 1's). Admitting them adds
     ~30 configs a problem, and on tests/test_search_strategy.py's synthetic surfaces the
     budgeted search then finds the optimum within 3% on 25 of 30 seeds instead of 30:
     admit them once GPU timings show 64-row tiles pay (DeepSeek-V3's group boundaries)."""
  tile = out_rows * out_cols
  if tile > 128 * 32 * cfg.num_warps:
    return False
  if cfg.num_warps < 4 and tile >= 64 * 64:
    return False
  if cfg.num_warps == 8 and tile < 64 * 128:
    return False
  if cfg.block_n == 256 and cfg.num_warps < 8:
    return False
  return True


def _max_segment_tiles(p: Problem, block_m: int) -> int:
  """Most row tiles any group spans: a launch band (group_m) wider than this is the same
  order as one exactly this wide."""
  ends = list(itertools.accumulate(p.group_sizes))
  starts = [0] + ends[:-1]
  return max([(e + block_m - 1) // block_m - s // block_m for s, e in zip(starts, ends) if e > s] or [1])


def launch_key(cfg, p: Problem):
  """What `cfg` launches on `p`: blocks clamped to the shape, and a gmm band no wider
  than the widest group (drhs: than the k blocks); a Mosaic snake band no wider than the
  column blocks. Configs with the same key run the same kernel the same way."""
  if isinstance(cfg, MosaicConfig):
    _, _, cols = op_dims(p.op, p.m, p.k, p.n)
    return dataclasses.replace(cfg, grid_block_n=min(cfg.grid_block_n, -(-cols // cfg.block_n)))
  if not isinstance(cfg, GpuConfig):
    return cfg
  cfg = cfg.clamped(*op_dims(p.op, p.m, p.k, p.n))
  if p.op == "drhs":
    return dataclasses.replace(cfg, group_k=min(cfg.group_k, -(-p.k // cfg.block_k)))
  return dataclasses.replace(cfg, group_m=min(cfg.group_m, _max_segment_tiles(p, cfg.block_m)))


def _gpu_space(p: Problem, device_kind: str | None) -> list[GpuConfig]:
  rows, contraction, cols = op_dims(p.op, p.m, p.k, p.n)
  if p.op == "drhs":
    grid = itertools.product(TGMM_BLOCK_M, TGMM_BLOCK_K, TGMM_BLOCK_N, GPU_NUM_WARPS, GPU_NUM_STAGES,
                             (GpuConfig.group_m,), TGMM_GROUP_K)
  else:
    grid = itertools.product(GPU_BLOCK_M, GPU_BLOCK_K, GPU_BLOCK_N, GPU_NUM_WARPS, GPU_NUM_STAGES,
                             GPU_GROUP_M, (GpuConfig.group_k,))
  out = []
  for bm, bk, bn, w, s, gm, gk in grid:
    cfg = GpuConfig(bm, bk, bn, w, s, group_m=gm, group_k=gk).clamped(rows, contraction, cols)
    out_rows, out_cols = (cfg.block_k, cfg.block_n) if p.op == "drhs" else (cfg.block_m, cfg.block_n)
    if _gpu_config_ok(cfg, out_rows, out_cols) and cfg.fits(p.op, p.dtype, p.m, p.k, p.n, device_kind):
      out.append(cfg)
  return out


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def _tiles_evenly(dim: int, block: int) -> bool:
  """Whether `block` splits `dim` (rounded up to the 64-element TMA swizzle row the kernel
  pads to) into whole tiles; 64 always does."""
  return block == 64 or _round_up(dim, 64) % block == 0


def _mosaic_space(p: Problem, device_kind: str | None) -> list[MosaicConfig]:
  """Mosaic GPU configs that fit shared memory on `device_kind`, keep the accumulator in
  registers, and tile the dims evenly: a ragged column tile wastes a wgmma, and a block_k
  that does not divide k makes the wrapper pad (copy) the operands."""
  rows, contraction, cols = op_dims(p.op, p.m, p.k, p.n)
  if p.op == "drhs":  # block_m steps over rows; [block_k, block_n] tiles the [k, n] output
    grid = itertools.product(MOSAIC_TGMM_BLOCK_M, MOSAIC_BLOCK_N, MOSAIC_BLOCK_K, MOSAIC_STEPS,
                             MOSAIC_GRID_BLOCK_N)
  else:
    grid = itertools.product(MOSAIC_BLOCK_M, MOSAIC_BLOCK_N, MOSAIC_BLOCK_K, MOSAIC_STEPS,
                             MOSAIC_GRID_BLOCK_N)
  out = []
  for bm, bn, bk, steps, band in grid:
    cfg = MosaicConfig(bm, bn, bk, steps, band)
    if p.op == "drhs":
      tile, evenly = bk * bn, _tiles_evenly(contraction, bk) and _tiles_evenly(cols, bn)
      too_big = bm > max(64, _round_up(rows, 64))
    else:
      tile = bm * bn
      evenly = _tiles_evenly(cols, bn) and (contraction % bk == 0 or bk == 64)
      too_big = bm > max(64, _round_up(rows, 64))
    too_big = too_big or band > max(1, -(-cols // bn))
    if tile <= MOSAIC_MAX_ACC and evenly and not too_big and cfg.fits(p.op, p.dtype, p.m, p.k, p.n, device_kind):
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


def candidates(p: Problem, max_candidates: int | None = None, seed: int = 0,
               device_kind: str | None = None) -> list:
  """The default config first, then the rest of the valid space in a fixed shuffled order.

  device_kind: the device being tuned (default: this host's first device); it bounds
  shared memory and picks the default. The order depends only on the problem and seed, so
  a resumed sweep with the same max_candidates picks the same subset.
  """
  if backends.get(p.backend).config_type is None:
    return []
  if device_kind is None:
    device_kind = current_device_kind()
  default = default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=device_kind)
  space = SPACES[p.backend](p, device_kind)
  unique = list(dict.fromkeys(space))
  random.Random(f"{seed}|{p.key}").shuffle(unique)
  ordered, seen = [], set()
  for cfg in [default] + unique:  # one config per distinct launch, the default first
    key = launch_key(cfg, p)
    if key not in seen:
      seen.add(key)
      ordered.append(cfg)
  return ordered[:max_candidates] if max_candidates else ordered


# The candidate space of each backend with knobs in kernels.backends.REGISTRY.
SPACES = {
    "pallas_gpu": _gpu_space,
    "mosaic_gpu": _mosaic_space,
    "pallas_tpu": lambda p, device_kind: _tpu_space(p),
}
