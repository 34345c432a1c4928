"""Pallas TPU (megablox) config: the (tm, tk, tn) tiling, its fit in VMEM, the default,
and the search space a sweep draws from."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels.backend import GridWork
from kernels.common import itemsize, next_pow2, op_dims, row_tiles

VMEM_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TpuConfig:
  """Pallas TPU (megablox) tiling, in the op's own (m, k, n) frame.

  tm: rows per tile; a multiple of 8 (16 for 16-bit dtypes is best). m is padded to it.
  tk: contraction tile; a multiple of 128. A ragged last tile is masked by megablox.
  tn: output-column tile; a multiple of 128.
  """

  tm: int = 128
  tk: int = 128
  tn: int = 128

  def __post_init__(self):
    if not isinstance(self.tm, int) or self.tm <= 0 or self.tm % 8:
      raise ValueError(f"TpuConfig.tm must be a positive multiple of 8, got {self.tm!r}")
    for name in ("tk", "tn"):
      v = getattr(self, name)
      if not isinstance(v, int) or v <= 0 or v % 128:
        raise ValueError(f"TpuConfig.{name} must be a positive multiple of 128, got {v!r}")

  def vmem_bytes(self, dtype: str) -> int:
    # Double-buffered lhs and rhs tiles, the output tile and an f32 accumulator.
    b = itemsize(dtype)
    return 2 * (self.tm * self.tk + self.tk * self.tn) * b + self.tm * self.tn * (b + 4)

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    return self.vmem_bytes(dtype) <= VMEM_BYTES

  def tiling(self) -> tuple[int, int, int]:
    return (self.tm, self.tk, self.tn)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def default(op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None) -> TpuConfig:
  rows, contraction, cols = op_dims(op, m, k, n)

  def tile(d, choices=(512, 256, 128)):
    for c in choices:
      if d % c == 0:
        return c
    return 128

  tm = min(512, max(8, next_pow2(rows))) if rows < 512 else 512
  return TpuConfig(tm=tm, tk=tile(contraction), tn=tile(cols))


SPACE_TM = (64, 128, 256, 512)
SPACE_TK = (128, 256, 512, 1024)
SPACE_TN = (128, 256, 512, 1024)


def space(op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None) -> list[TpuConfig]:
  rows, contraction, cols = op_dims(op, m, k, n)
  cap = lambda d: max(128, next_pow2(d))
  out = []
  for tm, tk, tn in itertools.product(SPACE_TM, SPACE_TK, SPACE_TN):
    tm = min(tm, max(8, next_pow2(rows)))
    if tk > cap(contraction) or tn > cap(cols):
      continue
    cfg = TpuConfig(tm, tk, tn)
    if cfg.fits(op, dtype, m, k, n):
      out.append(cfg)
  return out


def grid_work(cfg: TpuConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> GridWork:
  """megablox's grid, (n tiles, row tiles of the groups, k tiles) with its gmm and tgmm: a
  row tile per tm rows a group touches (tgmm also visits an empty group once), one dot of
  BlockSpec blocks a step."""
  rows, contraction, cols = op_dims(op, m, k, n)  # drhs: tgmm's [k, n] output tiles, over tm rows a step
  group_tiles, _ = row_tiles(group_sizes, rows, cfg.tm)
  visits = sum(group_tiles) + (group_tiles.count(0) if op == "drhs" else 0)
  steps = -(-cols // cfg.tn) * visits * -(-contraction // cfg.tk)
  reads = cfg.tm * cfg.tk + cfg.tk * cfg.tn
  return GridWork(steps, steps, reads, cfg.tm * cfg.tn, steps, cfg.tm * cfg.tk * cfg.tn)
