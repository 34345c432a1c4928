"""Mosaic GPU Blackwell (tcgen05) config: its knobs and ranges, the fit in shared and tensor
memory, the defaults, and the search space a sweep draws from.

The kernels (gmm.py, tgmm.py) keep the accumulator in tensor memory (TMEM), double-buffered, so
a cell's epilogue overlaps the next cell's main loop. A CTA's TMEM is 128 lanes (rows) by 512
32-bit columns: two [128, block_n] f32 accumulators take 2 * block_n columns. With cta_pair, two
CTAs of a cluster run one tcgen05 MMA together (cta_group::2): the pair's tile is twice the
rows, and each CTA loads half of the shared operand's columns.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels.backend import GridWork, InterpretCost
from kernels.common import (
  check_int_range,
  gpu_family,
  gpu_smem_limit,
  itemsize,
  narrowed_to_fit,
  op_dims,
  round_up,
  row_tiles,
  tiles_evenly,
)

BLOCK_M = (64, 128)  # fwd/dlhs: 128, the TMEM lanes (tcgen05's M of one CTA); drhs: rows a step
BLOCK_N = (64, 128, 256)
BLOCK_K = (64, 128, 256)  # fwd/dlhs: 64 or 128 a step; drhs: 128, or 256 with cta_pair
STEPS_RANGE = (2, 8)
BAND_RANGE = (1, 64)
TMEM_COLS = 512  # 32-bit columns of a CTA's tensor memory
SWIZZLE_ELEMS = 64  # 16-bit elements in a 128-byte swizzle row: the unit any operand tile is cut in
EPI_TILE = 64  # the epilogue stores [128, 64] column strips through shared memory
ROW_TILE = 8  # rows of a TMA box in the swizzled layout


@dataclasses.dataclass(frozen=True)
class BlackwellConfig:
  """Mosaic GPU Blackwell (tcgen05, TMEM accumulator, warp-specialized) config, in the op's
  own frame.

  block_m:  fwd/dlhs: rows of a CTA's output tile (128: the TMEM lanes); drhs: rows of a
            group reduced per pipeline step (64 or 128).
  block_n:  output columns of a cell (a CTA pair's with cta_pair): 64, 128 or 256.
  block_k:  fwd/dlhs: contraction per pipeline step (64 or 128); drhs: output rows (of k)
            per cell, 128 (256 with cta_pair).
  max_concurrent_steps: TMA pipeline depth (operand stages in flight); 2..8.
  group_m:  band of the group-major launch order (common.launch_cell): this many row tiles
            of one group walk the column blocks together (drhs: k tiles over the n tiles).
  cta_pair: two CTAs of a cluster share each MMA (cta_group::2): the cell is 256 rows
            (fwd/dlhs) or 256 of k (drhs); each CTA loads its own rows of the unshared operand
            and half of the shared operand's columns.
  """

  block_m: int = 128
  block_n: int = 256
  block_k: int = 64
  max_concurrent_steps: int = 4
  group_m: int = 1
  cta_pair: bool = False

  def __post_init__(self):
    for name, allowed in (("block_m", BLOCK_M), ("block_n", BLOCK_N), ("block_k", BLOCK_K)):
      v = getattr(self, name)
      if isinstance(v, bool) or v not in allowed:
        raise ValueError(f"BlackwellConfig.{name} must be one of {allowed}, got {v!r}")
    check_int_range("BlackwellConfig", "max_concurrent_steps", self.max_concurrent_steps, *STEPS_RANGE)
    check_int_range("BlackwellConfig", "group_m", self.group_m, *BAND_RANGE)
    if not isinstance(self.cta_pair, bool):
      raise ValueError(f"BlackwellConfig.cta_pair must be a bool, got {self.cta_pair!r}")

  @property
  def ctas(self) -> int:
    return 2 if self.cta_pair else 1

  def cell(self, op: str) -> tuple[int, int]:
    """(rows, cols) of the output one cell computes (a CTA pair's with cta_pair): fwd/dlhs
    rows of m, drhs rows of k."""
    if op == "drhs":
      return self.block_k, self.block_n
    return self.block_m * self.ctas, self.block_n

  def valid_for(self, op: str) -> str | None:
    """Why this config cannot drive `op`'s kernel, or None."""
    if op == "drhs":
      if self.block_k != 128 * self.ctas:
        return f"drhs takes block_k = {128 * self.ctas} (the TMEM lanes of the cell), got {self.block_k}"
    else:
      if self.block_m != 128:
        return f"fwd/dlhs take block_m = 128 (the TMEM lanes), got {self.block_m}"
      if self.block_k > 128:
        return f"fwd/dlhs take at most 128 of k a step, got block_k={self.block_k}"
    if self.cta_pair and self.block_n < 128:
      return f"a CTA pair splits block_n in two 64-wide halves at least, got block_n={self.block_n}"
    if 2 * self.block_n > TMEM_COLS:
      return f"two accumulators of {self.block_n} columns exceed TMEM's {TMEM_COLS}"
    return None

  def smem_bytes(self, op: str, dtype: str, m: int, k: int, n: int) -> int:
    """Shared memory a CTA allocates: max_concurrent_steps stages of its operand tiles (gmm:
    [block_m, block_k] lhs and [block_k, block_n / ctas] rhs; tgmm: [block_m, block_k / ctas]
    lhs and [block_m, block_n / ctas] dout) and the epilogue's [128, 64] strip in the output
    dtype, priced at 4 bytes (an f32 output, preferred_element_type, takes that). Allocated once
    for the persistent loop."""
    del m, k, n
    b = itemsize(dtype)
    if op == "drhs":
      stage = self.block_m * (self.block_k + self.block_n) // self.ctas
    else:
      stage = self.block_k * (self.block_m + self.block_n // self.ctas)
    return (stage * self.max_concurrent_steps) * b + 128 * EPI_TILE * 4

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    """Whether this config drives `op` and its shared memory fits a block on `device_kind`."""
    return self.valid_for(op) is None and self.smem_bytes(op, dtype, m, k, n) <= gpu_smem_limit(device_kind)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# --- defaults -----------------------------------------------------------------------------

# In the op's own frame. Why: a [128, 256] cell is tcgen05's widest single-CTA MMA (N = 256)
# and fills TMEM with two accumulators (2 x 256 columns); block_k 64 is one 128-byte swizzle row
# of 16-bit elements; four stages (48 KiB each) and the epilogue's strip (32 KiB at most, an
# f32 output) make 224 KiB of the 227 KiB a block may take. A band of 16 row tiles holds a whole
# Mixtral group, as for the Hopper kernel (benchmarks/l2_traffic.py). drhs reduces 64 rows a
# step into a [128, 256] cell. One CTA a cell: cta_pair (cta_group::2) is a searched knob,
# proven by the compiler only until a GPU has checked it (jax's Mosaic GPU interpreter has no
# collective MMA).
_DEFAULTS = {
  "gmm": BlackwellConfig(block_m=128, block_n=256, block_k=64, max_concurrent_steps=4, group_m=16),
  "tgmm": BlackwellConfig(block_m=64, block_n=256, block_k=128, max_concurrent_steps=4, group_m=4),
}


def default(op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None) -> BlackwellConfig:
  cfg = _DEFAULTS["tgmm" if op == "drhs" else "gmm"]
  # A device with less shared memory than B200 gets fewer stages in flight, then narrower tiles.
  return narrowed_to_fit(cfg, (128, 64), STEPS_RANGE[0], lambda c: c.fits(op, dtype, m, k, n, device_kind))


# --- search space -------------------------------------------------------------------------

SPACE_BLOCK_N = (64, 128, 256)
SPACE_BLOCK_K = (64, 128)
SPACE_TGMM_BLOCK_M = (64, 128)
SPACE_STEPS = (2, 3, 4, 5, 6)
SPACE_GROUP_M = (1, 2, 4, 8, 16)
SPACE_PAIR = (False, True)


def space(op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None) -> list[BlackwellConfig]:
  """Configs that drive the op and fit shared memory on `device_kind`, 1-CTA and CTA-pair,
  whose column tiles split the padded dims evenly (a ragged column tile wastes MMA columns; a
  block_k that does not divide k makes the wrapper pad the operands), and whose cell is not
  taller than the problem's rows (a pair's 256-row cell for a decode batch is waste)."""
  rows, contraction, cols = op_dims(op, m, k, n)
  # A CTA pair only where it compiles for a Blackwell GPU: jax's interpreter cannot run its
  # collective MMA ("collective_axis not supported yet", jax 0.12).
  pairs = SPACE_PAIR if gpu_family(device_kind) == "blackwell" else (False,)
  out = []
  for bn, steps, band, pair in itertools.product(SPACE_BLOCK_N, SPACE_STEPS, SPACE_GROUP_M, pairs):
    if op == "drhs":
      for bm in SPACE_TGMM_BLOCK_M:
        cfg = BlackwellConfig(bm, bn, 128 * (2 if pair else 1), steps, band, pair)
        k_pad = round_up(contraction, 64)
        too_big = cfg.block_k > max(128, k_pad) or band > max(1, -(-k_pad // cfg.block_k))
        if tiles_evenly(cols, bn) and not too_big and cfg.fits(op, dtype, m, k, n, device_kind):
          out.append(cfg)
      continue
    for bk in SPACE_BLOCK_K:
      cfg = BlackwellConfig(128, bn, bk, steps, band, pair)
      evenly = tiles_evenly(cols, bn) and (contraction % bk == 0 or bk == 64)
      too_big = cfg.cell(op)[0] > max(128, round_up(rows, 64))
      if evenly and not too_big and cfg.fits(op, dtype, m, k, n, device_kind):
        out.append(cfg)
  return out


def launch_key(cfg: BlackwellConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> BlackwellConfig:
  """A band no wider than the widest group's row tiles (drhs: than the k tiles)."""
  rows, _, _ = op_dims(op, m, k, n)
  cell_rows = cfg.cell(op)[0]
  if op == "drhs":
    widest = -(-round_up(k, 64) // cell_rows)
  else:
    widest = max([t for t in row_tiles(group_sizes, rows, cell_rows, group_start=True, align=ROW_TILE)[0] if t] or [1])
  return dataclasses.replace(cfg, group_m=min(cfg.group_m, widest))


def grid_work(cfg: BlackwellConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> GridWork:
  """gmm.py's and tgmm.py's output cells (the persistent CTAs share them out), after the
  wrappers' padding: rows to 8, columns to a 64-element swizzle row, gmm's k to block_k."""
  rows, contraction, cols = op_dims(op, m, k, n)
  g = len(group_sizes)
  m_pad = round_up(rows, 8)
  cell_rows, cell_cols = cfg.cell(op)
  if op == "drhs":  # cells (group, k tile, n tile); a pipeline step per block_m rows of the group
    k_pad, n_pad = round_up(k, 64), round_up(n, 64)
    tiles = -(-k_pad // cell_rows) * -(-n_pad // cell_cols)
    cells = g * tiles
    out = g * round_up(k_pad, cell_rows) * round_up(n_pad, cell_cols)
    blocks = sum(row_tiles(group_sizes, rows, cfg.block_m, group_start=True, align=ROW_TILE)[0])
    return GridWork(cells, cells, m_pad * (k_pad + n_pad), out, blocks * tiles, cfg.block_m * cell_rows * cell_cols)
  k_pad, n_pad = round_up(contraction, cfg.block_k), round_up(cols, 64)
  col_blocks = -(-n_pad // cell_cols)
  group_tiles, rest = row_tiles(group_sizes, m_pad, cell_rows, group_start=True, align=ROW_TILE)
  cells = (sum(group_tiles) + rest) * col_blocks
  return GridWork(
    steps=cells,
    tile_steps=cells,
    read_elems=m_pad * k_pad + g * k_pad * n_pad,
    write_elems=m_pad * col_blocks * cell_cols,
    inner_steps=sum(group_tiles) * col_blocks * (k_pad // cfg.block_k),
    inner_macs=cell_rows * cfg.block_k * cell_cols,
  )


# jax's Mosaic GPU interpreter (ragtune's estimate of a sweep on a CPU; Backend.interpret_cost),
# which runs these kernels from jax 0.12 on. Fitted by hand to 5 kernels (fwd and drhs, 1 to 18
# cells, 2 to 72 pipeline steps, 2 simulated SMs; 0.1 to 2.1 s a run after the first) on a
# 2-core x86 host under load from other jobs, jax 0.12.0.1 (calibration step 0.22 us): within
# 0.65-1.5x of each. A run costs about 0.09 s, 50 ms a cell and 15 ms a pipeline step; no term
# per multiply-add was left out (the step term holds it). compile: the first call's extra time (trace, lower, build),
# 1.3-2.1 calibration compiles. Much cheaper than the Hopper kernels' figures (mosaic_gpu,
# fitted under jax 0.10.2's interpreter).
# tgmm's three warpgroups, and the four warps the control warpgroup's warp_map runs as threads
# of their own (Backend.interpreter_threads); the interpreter runs CTAs one by one.
INTERPRETER_THREADS = 3 + 4
INTERPRET_COST = InterpretCost(call=4e5, step=0, tile_step=2.3e5, read=0, write=0, mac=0, compile=2.0, inner_step=6.7e4)
