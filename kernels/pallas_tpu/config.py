"""Pallas TPU (megablox) config: the (tm, tk, tn) tiling, the VMEM it plans for on each TPU
generation (kernels.common.CHIPS), the static VMEM rule, the compile-verified defaults, and
the search space a sweep draws from."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels.backend import GridWork
from kernels.common import CHIPS, chip, element_dtype, itemsize, next_pow2, op_dims, row_tiles, scheme

# No known chip (the CPU interpreter, a newer TPU): the smallest scoped VMEM of those above.
SAFE_VMEM = min(c.scoped_vmem for c in CHIPS)


def sublane_rows(dtype: str) -> int:
  """Rows of one VMEM tile of a dtype (8 of 32-bit; 16-bit and 8-bit values pack 2 and 4 a row)."""
  return 8 * (4 // itemsize(dtype))


def vmem_limit(device_kind: str | None) -> int:
  c = chip(device_kind)
  return c.scoped_vmem if c else SAFE_VMEM


@dataclasses.dataclass(frozen=True)
class TpuConfig:
  """Pallas TPU (megablox) tiling, in the op's own (m, k, n) frame.

  tm: rows per tile; a multiple of 8 (16 for 16-bit dtypes is best), and of 32 for 8-bit ones
      unless one tile covers m (layout_violation). m is padded to it.
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

  def vmem_bytes(self, op: str, dtype: str, m: int, k: int, n: int) -> int:
    """The static VMEM rule, for the forward problem (m, k, n): the Pallas pipeline
    double-buffers the two input tiles and the output tile, and megablox adds an f32
    accumulator of the output tile. gmm: [tm, tk] x [tk, tn] -> [tm, tn], its accumulator
    dropped by XLA when one k tile covers the contraction; tgmm (drhs): [tk, tm] x [tm, tn] ->
    [tk, tn], accumulated over the rows always. A quantized format (qgmm.py, forward only):
    1-byte input tiles, a bf16 output tile (as tuned; an f32 output's tile is twice that, which
    a tiling at the bound may lack, where the defaults keep half the VMEM free) and the
    accumulator as gmm's (int32 or f32). The scale blocks ([tm, tk/128] and [tk/128, tn/128]
    at most) are left out: libtpu's figure counted them in some overflows and not in others.
    A lower bound: where Mosaic's register allocator spills, its spill slots take VMEM too,
    which no rule of the tiles foresees (tests/ragtune/test_aot_tpu.py measures both against
    the compiler)."""
    b = itemsize(dtype)
    _, contraction, _ = op_dims(op, m, k, n)
    if scheme(dtype):
      out = self.tm * self.tn
      acc = out if contraction > self.tk else 0
      return 2 * (self.tk * (self.tm + self.tn) * b + 2 * out) + 4 * acc
    if op == "drhs":
      inputs, out, acc = self.tm * (self.tk + self.tn), self.tk * self.tn, self.tk * self.tn
    else:
      out = self.tm * self.tn
      inputs, acc = self.tk * (self.tm + self.tn), out if contraction > self.tk else 0
    return 2 * (inputs + out) * b + 4 * acc

  def layout_violation(self, dtype: str, m: int) -> str:
    """Why Mosaic cannot cut an 8-bit lhs [m, k] into [tm, tk] blocks, or "": a block's rows
    must be a multiple of an 8-bit VMEM tile's 32 rows unless one block covers the padded
    rows. libtpu 0.0.42 (jax 0.10) refuses others (E2002
    "CompileTimeMosaicMisalignedBlockAndTiling"); 0.0.50 (jax 0.12) lays a 16-row int8 block
    out, but the rule keeps to the older one on both. (16-bit blocks of 8 rows compile on
    both: no rule for them.)"""
    rows = sublane_rows(dtype)
    if itemsize(dtype) == 1 and self.tm % rows and m > self.tm:
      return f"tm={self.tm} is no multiple of the {rows} rows of a {element_dtype(dtype)} VMEM tile, and m={m} > tm"
    return ""

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    if op != "drhs" and self.layout_violation(dtype, m):
      return False
    return self.vmem_bytes(op, dtype, m, k, n) <= vmem_limit(device_kind)

  def tiling(self) -> tuple[int, int, int]:
    return (self.tm, self.tk, self.tn)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# --- defaults -------------------------------------------------------------------------------

# The default's rule, for a chip ragtune knows (DEFAULT_RULE): tm follows the rows per group,
# since a group's last row tile is partial (decode: 8-128 rows; prefill: 512); then of the
# power-of-two (tk, tn) up to the dims, the largest tk*tn (ties: the squarer, then the wider
# tn) whose static VMEM is at most half the chip's scoped VMEM, the other half left as headroom. The tests
# compile them for each chip (tests/ragtune/test_aot_tpu.py): compile-verified, not tuned.
DEFAULT_TM_MAX = 512
DEFAULT_TILES = (128, 256, 512, 1024, 2048, 4096)


def default(op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None) -> TpuConfig:
  rows, contraction, cols = op_dims(op, m, k, n)
  sublanes = sublane_rows(dtype)
  per_group = -(-rows // max(g, 1))
  tm = min(DEFAULT_TM_MAX, max(sublanes, next_pow2(per_group)), max(8, next_pow2(rows)))
  budget = vmem_limit(device_kind) // 2
  best = TpuConfig(tm, 128, 128)
  for tk, tn in itertools.product(DEFAULT_TILES, DEFAULT_TILES):
    if tk > _cap(contraction) or tn > _cap(cols):
      continue
    cfg = TpuConfig(tm, tk, tn)
    if cfg.vmem_bytes(op, dtype, m, k, n) <= budget and _rank(cfg) > _rank(best):
      best = cfg
  return best


def _cap(d: int) -> int:
  """The widest k or n tile worth having for a dim of d: a 128-lane multiple past d is waste."""
  return max(128, next_pow2(d))


def _rank(cfg: TpuConfig) -> tuple[int, int, int]:
  return (cfg.tk * cfg.tn, -abs(cfg.tk.bit_length() - cfg.tn.bit_length()), cfg.tn)


def default_source(device_kind: str | None) -> str:
  """How `default` chose for this device: 'compile-verified' on a chip ragtune compiles its
  defaults for, else 'heuristic'."""
  return "compile-verified" if chip(device_kind) else "heuristic"


# --- search space ---------------------------------------------------------------------------

SPACE_TM = (64, 128, 256, 512)
SPACE_TK = (128, 256, 512, 1024, 2048)
SPACE_TN = (128, 256, 512, 1024, 2048)


def space(op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None) -> list[TpuConfig]:
  rows, contraction, cols = op_dims(op, m, k, n)
  out = []
  for tm, tk, tn in itertools.product(SPACE_TM, SPACE_TK, SPACE_TN):
    tm = min(tm, max(8, next_pow2(rows)))
    if tk > _cap(contraction) or tn > _cap(cols):
      continue
    cfg = TpuConfig(tm, tk, tn)
    if cfg.fits(op, dtype, m, k, n, device_kind) and cfg not in out:
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
