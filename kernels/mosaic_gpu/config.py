"""Mosaic GPU config: its knobs and ranges, the fit in shared memory, the defaults, and
the search space a sweep draws from."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels.backend import GridWork
from kernels.common import check_int_range, gpu_smem_limit, itemsize, op_dims, row_tiles

BLOCK_MN = (64, 128, 192, 256)
BLOCK_K = (64, 128)
STEPS_RANGE = (2, 8)
BAND_RANGE = (1, 64)


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """Mosaic GPU (Hopper TMA + wgmma) kernel config, in the op's own frame.

  block_m:  fwd/dlhs: rows per output tile (a multiple of 64: one wgmma per warpgroup
            row of 64); drhs: rows of a group reduced per pipeline step. One of 64, 128,
            192, 256.
  block_n:  output columns per tile; one of 64, 128, 192, 256 (a wgmma N; the f32
            accumulator holds block_m x block_n in registers of one warpgroup).
  block_k:  fwd/dlhs: contraction per pipeline step; drhs: output rows (of k) per tile.
            64 or 128 (64 16-bit elements are one 128-byte swizzle row; a drhs output tile
            needs 64 rows per warpgroup).
            k is zero-padded to a multiple of block_k only when it is not one already.
  max_concurrent_steps: TMA pipeline depth (operand tiles in flight); 2..8.
  grid_block_n: width, in column blocks, of the band the persistent grid snakes through
            (plgpu.planar_snake): the programs in flight share a band's weight columns and
            rows. In [1, 64].

  Shared memory: max_concurrent_steps stages of the two operand tiles plus one output
  tile; see smem_bytes. Blocks are not clamped to the shape: TMA reads past the end of an
  array as zeros and clips stores, so any block is valid for any shape that fits.
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 1

  def __post_init__(self):
    for name, allowed in (("block_m", BLOCK_MN), ("block_n", BLOCK_MN), ("block_k", BLOCK_K)):
      v = getattr(self, name)
      if isinstance(v, bool) or v not in allowed:
        raise ValueError(f"MosaicConfig.{name} must be one of {allowed}, got {v!r}")
    check_int_range("MosaicConfig", "max_concurrent_steps", self.max_concurrent_steps, *STEPS_RANGE)
    check_int_range("MosaicConfig", "grid_block_n", self.grid_block_n, *BAND_RANGE)

  def smem_bytes(self, op: str, dtype: str, m: int, k: int, n: int) -> int:
    """Shared memory the kernel allocates: max_concurrent_steps stages of the operand
    tiles (gmm: [block_m, block_k] lhs and [block_k, block_n] rhs; tgmm: [block_m,
    block_k] lhs and [block_m, block_n] dout) and one output tile ([block_m, block_n];
    tgmm [block_k, block_n]) in the output dtype, taken as `dtype`. Stages beyond the
    gmm pipeline's static length are not allocated, as emit_pipeline shrinks them;
    tgmm's pipeline length is a group's row count, dynamic, so it always takes all."""
    _, contraction, _ = op_dims(op, m, k, n)
    b = itemsize(dtype)
    if op == "drhs":
      steps = self.max_concurrent_steps
      stage = self.block_m * (self.block_k + self.block_n)
      out = self.block_k * self.block_n
    else:
      steps = -(-contraction // self.block_k)
      stage = self.block_k * (self.block_m + self.block_n)
      out = self.block_m * self.block_n
    return (stage * max(1, min(self.max_concurrent_steps, steps)) + out) * b

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    """Whether this config's shared memory fits a block on a device of this kind."""
    return self.smem_bytes(op, dtype, m, k, n) <= gpu_smem_limit(device_kind)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


ABBREV = {"block_m": "bm", "block_k": "bk", "block_n": "bn", "max_concurrent_steps": "cs", "grid_block_n": "gn"}


# --- defaults -----------------------------------------------------------------------------

# In the op's own frame. Why: one warpgroup holds the f32 accumulator in registers, and
# 128x128 is the largest tile it holds without spilling (128 values per thread); block_k
# 64 is one 128-byte swizzle row of 16-bit elements. Four stages in flight (~160 KiB of
# shared memory with the output tile) hide HBM latency on Hopper. Few rows per group
# (decode) take 64-row tiles, so less of each tile is wasted on rows of a neighbouring
# group. drhs reduces 64 rows a step into a [128, 128] tile of [k, n].
_DEFAULTS = {
  "gmm": MosaicConfig(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=4),
  "tgmm": MosaicConfig(block_m=64, block_n=128, block_k=128, max_concurrent_steps=4, grid_block_n=1),
}


def default(op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None) -> MosaicConfig:
  cfg = _DEFAULTS["tgmm" if op == "drhs" else "gmm"]
  if op != "drhs" and max(1, m // max(1, g)) <= 96:
    cfg = dataclasses.replace(cfg, block_m=64)
  # A device with less shared memory than Hopper gets fewer stages in flight.
  while cfg.max_concurrent_steps > STEPS_RANGE[0] and not cfg.fits(op, dtype, m, k, n, device_kind):
    cfg = dataclasses.replace(cfg, max_concurrent_steps=cfg.max_concurrent_steps - 1)
  return cfg


# --- search space -------------------------------------------------------------------------

# [block_m, block_n] output tiles (drhs: [block_k, block_n]); pipeline depth; snake band
# width in column blocks.
SPACE_BLOCK_M = (64, 128, 192, 256)
SPACE_BLOCK_N = (64, 128, 192, 256)
SPACE_BLOCK_K = (64, 128)
SPACE_TGMM_BLOCK_M = (64, 128, 256)
SPACE_STEPS = (2, 3, 4, 5, 6)
SPACE_GRID_BLOCK_N = (1, 2, 4, 8, 16)
# One warpgroup holds the f32 accumulator: 128 threads x at most 192 values. Compiled for
# H100: 192x128 is clean at 226 registers; 128x256, 256x128 and larger spill 0.5-1.6 KB a
# thread (tests/ragtune/test_aot_compile.py::test_each_pruning_rule_against_the_compiler).
MAX_ACC = 128 * 192


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def _tiles_evenly(dim: int, block: int) -> bool:
  """Whether `block` splits `dim` (rounded up to the 64-element TMA swizzle row the kernel
  pads to) into whole tiles; 64 always does."""
  return block == 64 or _round_up(dim, 64) % block == 0


def space(op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None) -> list[MosaicConfig]:
  """Configs that fit shared memory on `device_kind`, keep the accumulator in registers,
  and tile the dims evenly: a ragged column tile wastes a wgmma, and a block_k that does
  not divide k makes the wrapper pad (copy) the operands."""
  rows, contraction, cols = op_dims(op, m, k, n)
  first = SPACE_TGMM_BLOCK_M if op == "drhs" else SPACE_BLOCK_M
  out = []
  for bm, bn, bk, steps, band in itertools.product(
    first, SPACE_BLOCK_N, SPACE_BLOCK_K, SPACE_STEPS, SPACE_GRID_BLOCK_N
  ):
    cfg = MosaicConfig(bm, bn, bk, steps, band)
    if op == "drhs":  # block_m steps over rows; [block_k, block_n] tiles the [k, n] output
      tile, evenly = bk * bn, _tiles_evenly(contraction, bk) and _tiles_evenly(cols, bn)
    else:
      tile = bm * bn
      evenly = _tiles_evenly(cols, bn) and (contraction % bk == 0 or bk == 64)
    too_big = bm > max(64, _round_up(rows, 64)) or band > max(1, -(-cols // bn))
    if tile <= MAX_ACC and evenly and not too_big and cfg.fits(op, dtype, m, k, n, device_kind):
      out.append(cfg)
  return out


def launch_key(cfg: MosaicConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> MosaicConfig:
  """A snake band no wider than the column blocks."""
  _, _, cols = op_dims(op, m, k, n)
  return dataclasses.replace(cfg, grid_block_n=min(cfg.grid_block_n, -(-cols // cfg.block_n)))


def grid_work(cfg: MosaicConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> GridWork:
  """gmm.py's and tgmm.py's output cells (the persistent programs share them out), after the
  wrappers' padding: rows to 8, columns to a 64-element swizzle row, gmm's k to block_k."""
  rows, contraction, cols = op_dims(op, m, k, n)
  g = len(group_sizes)
  m_pad = _round_up(rows, 8)
  if op == "drhs":  # cells (group, k tile, n tile); a pipeline step per row block of the group
    k_pad, n_pad = _round_up(k, 64), _round_up(n, 64)
    tiles = -(-k_pad // cfg.block_k) * -(-n_pad // cfg.block_n)
    steps = g * tiles
    out = g * _round_up(k_pad, cfg.block_k) * _round_up(n_pad, cfg.block_n)
    blocks = sum(row_tiles(group_sizes, rows, cfg.block_m)[0])
    return GridWork(steps, steps, m_pad * (k_pad + n_pad), out, blocks * tiles, cfg.block_m * cfg.block_k * cfg.block_n)
  k_pad, n_pad = _round_up(contraction, cfg.block_k), _round_up(cols, 64)
  col_blocks = -(-n_pad // cfg.block_n)
  group_tiles, rest = row_tiles(group_sizes, m_pad, cfg.block_m)
  return GridWork(
    steps=(-(-m_pad // cfg.block_m) + g + 1) * col_blocks,
    tile_steps=(sum(group_tiles) + rest) * col_blocks,
    read_elems=m_pad * k_pad + g * k_pad * n_pad,
    write_elems=m_pad * col_blocks * cfg.block_n,
    inner_steps=sum(group_tiles) * col_blocks * (k_pad // cfg.block_k),
    inner_macs=cfg.block_m * cfg.block_k * cfg.block_n,
  )
