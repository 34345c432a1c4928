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
# One warpgroup holds the f32 accumulator: 128 threads x at most 192 values leaves room
# in the 255 registers a thread has (unmeasured here; jax's own sweep stops at 192x192).
MOSAIC_MAX_ACC = 128 * 192
TPU_TM = (64, 128, 256, 512)
TPU_TK = (128, 256, 512, 1024)
TPU_TN = (128, 256, 512, 1024)


def _gpu_config_ok(cfg: GpuConfig, out_rows: int, out_cols: int) -> bool:
  """Whether a (clamped) config can be fast, from what it compiles to on sm_90a (README:
  "What the kernels compile to"). Output tiles of 64x64 or more need 4+ warps: with
  fewer they spill (2 warps at 128 wide: ~12 KB per thread) and leave wgmma for mma.sync.
  8 warps need 128x64 outputs or more to give each warp its own work; block_n 256 only
  pays with 8 warps (an [x, 256] f32 accumulator on 4 warps spills). More than 128 f32
  accumulator values per thread spill (256x128 on 4 warps, 256x256 on 8: 1-2 KB/thread)."""
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
