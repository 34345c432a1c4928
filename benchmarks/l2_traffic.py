"""Model the HBM bytes the GPU kernels fetch, from their real launch order.

No GPU: this replays the launch orders of the kernels over the real tile schedule
(kernels.common.tile_schedule) through a simple machine:

- `--sms` SMs (132 on an H100 SXM, 148 on a B200: `--device`, below);
- triton (kernels/pallas_gpu): one program per output cell, each SM running as many as its
  shared memory holds (228 KiB per SM, 1 KiB reserved per program, capped at 2: the wgmma
  configs use 8 warps or ~100+ registers per thread), dispatched in launch order to the slot
  that frees first. Group-start row tiles, the banded order of common.launch_cell (drhs:
  kernels.pallas_gpu.tgmm.program_tile, each group's rows reduced from its first row);
- mosaic v2 (kernels/mosaic_gpu, config.default): persistent, one CTA per SM; CTA i takes
  cells i, i + sms, i + 2 sms, ... of common.launch_cell's order over group-start row tiles
  that begin on TMA's 8-row boxes (drhs: cells (group, k tile, n tile), the group slowest,
  common.program_tile within it; each group's rows reduced in block_m steps from its first
  row rounded down to 8);
- tcgen05 (kernels/mosaic_blackwell, config.default, for a B200): mosaic v2's walk (persistent,
  common.launch_cell's order over group-start row tiles on 8-row boxes; drhs the same cells and
  row steps) with its own cell, [128, block_n] a CTA. "tcgen05 pair" is the same kernel with
  cta_pair: two CTAs of a cluster compute one [256, block_n] cell (drhs: 256 of k), each loading
  its own half of the cell's rows (drhs: of lhs's columns) and half of the shared operand's
  columns, so a pair reads a cell's operands once, and the persistent grid is sms / 2 pairs;
- mosaic v1 (the Mosaic GPU kernels before v2, git 0bcb5d4): the same persistent grid over
  aligned tiles, 128x128 tiles with block_k 64 (drhs: 64-row steps into 128x128 tiles),
  walked by band_snake in bands of grid_block_n column blocks (4; drhs 1), spare cells of
  the static tile bound included;
- all running programs advance in lockstep, one phase (a few k steps) at a time;
- an LRU L2 of `--l2` MB over operand blocks: a miss fetches the block from HBM. lhs (drhs:
  lhs and dout) is cut at every tile's first and last row, so tiles that share rows share
  cache entries, exact to the row (group-start tiles start on any row, and a group's last
  tile reads on into the next group's rows, as its TMA box does). Outputs are written once
  and counted as written bytes.

"fetched" is HBM reads plus output writes; "unique" is every operand byte the problem
needs once plus the output. Their ratio is how many times the launch order re-reads data.
It ignores sectors, prefetch, L2 partitioning and L2 hashing: a model to compare orders,
not a prediction of a timing. Compare "HBM ms" (fetched / --bw) with "MMA ms" (FLOPs /
--tflops) to see which bound applies.

After the L2 table, the tile waste of each problem's routing: row tiles issued, aligned,
group-start and group-start on 8-row boxes (Mosaic GPU v2 and tcgen05), against the ideal
sum(rows) / block_m, and the MMA work the extra tiles add; block_m 64 and 128 on an H100, 128
and 256 (tcgen05's cell, one CTA and a pair) on a B200.

`--device` picks the machine and its kernels; each figure can still be set on its own:
- h100 (the default): an H100 SXM, 132 SMs, L2 50 MB and 25 MB (its two partitions), HBM 3.35
  TB/s, MMA 800 TF/s; triton and the Mosaic GPU kernels.
- b200: the figures below, and the tcgen05 kernels (one CTA a cell, and the CTA pair).
  148 SMs, 74 on each of its 2 dies, and an L2 of 126 MB split between the dies (Chips and
  Cheese's measurements, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling",
  https://chipsandcheese.com/p/nvidias-b200-keeping-the-cuda-juggernaut; NVIDIA's product pages
  give no L2 size): replayed whole and as one die's 63 MB, as the H100's 50 and 25 MB.
  HBM3e 8 TB/s (NVIDIA DGX B200: 64 TB/s for its 8 GPUs, https://www.nvidia.com/en-us/data-center/dgx-b200/).
  MMA 2250 TF/s, the dense BF16 Tensor Core peak of an HGX B200 GPU at 1000 W (NVIDIA's
  figures: 4.5 PFLOPS with 2:4 sparsity, half without, as tabulated at
  https://glennklockwood.com/garden/processors/B200; DGX B200's "72 PFLOPS" of FP8 is 8 x 9
  PFLOPS with sparsity, the same rate), where the h100 row takes 800 of its 989 dense.

  python benchmarks/l2_traffic.py                 # default configs, best band, 50 and 25 MB
  python benchmarks/l2_traffic.py --quick         # smaller problems (m / 8), for a quick look
  python benchmarks/l2_traffic.py --kernels mosaic --l2 50
  python benchmarks/l2_traffic.py --device b200   # tcgen05 and tcgen05 pair, 126 and 63 MB
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax.numpy as jnp  # noqa: E402

from kernels import common  # noqa: E402
from kernels.mosaic_blackwell import config as blackwell  # noqa: E402
from kernels.mosaic_gpu import config as mosaic  # noqa: E402
from kernels.mosaic_gpu.gmm import ROW_TILE  # noqa: E402
from kernels.pallas_gpu import config as triton  # noqa: E402

SMEM_PER_SM, SMEM_RESERVED = 228 * 1024, 1024
MAX_PHASES = 16  # phases per program: k steps (drhs: row steps) are merged into at most this many
HOPPER = "NVIDIA H100 80GB HBM3"
B200 = "NVIDIA B200"
ORDERS = ("banded", "snake", "m_fastest", "n_fastest")
MOSAIC_BANDS = mosaic.BAND_RANGE  # group_m and grid_block_n both take [1, 64]
# Mosaic GPU v1 defaults (kernels/mosaic_gpu/config.py at git 0bcb5d4): block_m, block_n, block_k, grid_block_n.
V1_GMM, V1_TGMM = (128, 128, 64, 4), (64, 128, 128, 1)


@dataclasses.dataclass(frozen=True)
class Device:
  """A GPU as `--device` names it: the replay's machine and the kernels it runs (module docstring
  for the sources)."""

  name: str
  sms: int
  l2_mb: tuple[float, ...]  # L2 sizes replayed: the whole L2, then one partition's (die's) half
  hbm_tbs: float
  tflops: float  # MMA TF/s of the compute column
  kernels: tuple[str, ...]
  tile_block_ms: tuple[int, ...]  # row tiles of the tile-waste table


DEVICES = {
  "h100": Device("H100 SXM", 132, (50.0, 25.0), 3.35, 800.0, ("triton", "mosaic"), (64, 128)),
  "b200": Device("B200", 148, (126.0, 63.0), 8.0, 2250.0, ("tcgen05",), (128, 256)),
}


@dataclasses.dataclass(frozen=True)
class Problem:
  name: str
  op: str  # fwd | dlhs | drhs
  m: int
  k: int
  n: int
  g: int
  seed: int = 0

  def group_sizes(self) -> np.ndarray:
    rng = np.random.default_rng(self.seed)
    return rng.multinomial(self.m, np.full(self.g, 1.0 / self.g)).astype(np.int32)


PROBLEMS = [
  Problem("Mixtral 8x7B fwd", "fwd", 8192, 4096, 14336, 8),
  Problem("Mixtral 8x7B dlhs", "dlhs", 8192, 4096, 14336, 8),
  Problem("Mixtral 8x7B drhs", "drhs", 8192, 4096, 14336, 8),
  Problem("DeepSeek-V3 up fwd", "fwd", 131072, 7168, 2048, 256),
  Problem("DeepSeek-V3 up dlhs", "dlhs", 131072, 7168, 2048, 256),
  Problem("DeepSeek-V3 up drhs", "drhs", 131072, 7168, 2048, 256),
  Problem("DeepSeek-V3 down fwd", "fwd", 131072, 2048, 7168, 256),
  Problem("DeepSeek-V3 down dlhs", "dlhs", 131072, 2048, 7168, 256),
  Problem("DeepSeek-V3 down drhs", "drhs", 131072, 2048, 7168, 256),
  Problem("DeepSeek-V3 decode fwd", "fwd", 512, 7168, 2048, 256),
]


@dataclasses.dataclass(frozen=True)
class Kernel:
  """How one kernel walks a problem, in the op's own frame: output tiles of block_m x block_n
  with block_k a step (drhs: block_k x block_n tiles of [k, n], block_m rows a step)."""

  name: str  # triton | mosaic v1 | mosaic v2 | ...
  config: str  # the blocks, as the table prints them
  block_m: int
  block_n: int
  block_k: int
  band: int  # banded: group_m (drhs group_k); snake: grid_block_n
  order: str  # one of ORDERS; m_fastest / n_fastest are global orders over every tile
  group_start: bool  # row tiles from each group's first row, else on the block_m grid
  align: int  # group-start tiles begin at the group's first row rounded down to this (TMA's 8-row boxes)
  persistent: bool  # one program per SM walking cells sm, sm + sms, ...; else one program per cell
  per_sm: int = 1  # programs resident on an SM at once
  ctas: int = 1  # SMs that compute one cell together (tcgen05 cta_pair: 2): a persistent grid of sms / ctas


@dataclasses.dataclass(frozen=True)
class Traffic:
  fetched: int  # HBM bytes: operand reads and output writes
  unique: int  # every operand byte once, and the output
  cells: int  # cells that run MMAs: (row tile, column block), drhs (group, k tile, n tile)


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def programs_per_sm(smem_bytes: int) -> int:
  """Programs of a launched (not persistent) wgmma kernel resident on one SM: as many as its shared
  memory holds, at most 2 (8 warps, or 100+ registers a thread, fill the register file)."""
  return max(1, min(2, SMEM_PER_SM // (smem_bytes + SMEM_RESERVED)))


def triton_kernel(p: Problem, cfg: triton.TritonConfig, dtype: str = "bfloat16") -> Kernel:
  rows, contraction, cols = common.op_dims(p.op, p.m, p.k, p.n)
  c = cfg.clamped(rows, contraction, cols)
  band = c.group_k if p.op == "drhs" else c.group_m
  blocks = f"{c.block_m}x{c.block_k}x{c.block_n} w{c.num_warps} s{c.num_stages}"
  slots = programs_per_sm(c.smem_bytes(p.op, dtype, p.m, p.k, p.n))
  return Kernel("triton", blocks, c.block_m, c.block_n, c.block_k, band, "banded", True, 1, False, slots)


def mosaic_v2(p: Problem) -> Kernel:
  c = mosaic.default(p.op, "bfloat16", p.m, p.k, p.n, p.g, device_kind=HOPPER)
  blocks = f"bm{c.block_m} bn{c.block_n} bk{c.block_k} cs{c.max_concurrent_steps}"
  return Kernel("mosaic v2", blocks, c.block_m, c.block_n, c.block_k, c.group_m, "banded", True, ROW_TILE, True)


def tcgen05(p: Problem, pair: bool = False) -> Kernel:
  """kernels/mosaic_blackwell's default config for a B200 (with cta_pair: the same, two CTAs a
  cell; drhs then takes 256 of k a cell), in the replay's frame: fwd/dlhs block_m is the cell's
  rows (256 for a pair), drhs block_k its rows of k."""
  c = blackwell.default(p.op, "bfloat16", p.m, p.k, p.n, p.g, device_kind=B200)
  if pair:
    c = dataclasses.replace(c, cta_pair=True, block_k=256 if p.op == "drhs" else c.block_k)
  if why := c.valid_for(p.op):
    raise ValueError(f"tcgen05 {c}: {why}")
  block_m = c.block_m if p.op == "drhs" else c.cell(p.op)[0]
  blocks = f"bm{block_m} bn{c.block_n} bk{c.block_k} " + ("pair" if pair else f"cs{c.max_concurrent_steps}")
  name = "tcgen05 pair" if pair else "tcgen05"
  return Kernel(name, blocks, block_m, c.block_n, c.block_k, c.group_m, "banded", True, ROW_TILE, True, ctas=c.ctas)


def mosaic_v1(p: Problem) -> Kernel:
  bm, bn, bk, band = V1_TGMM if p.op == "drhs" else V1_GMM
  if p.op != "drhs" and max(1, p.m // p.g) <= 96:  # v1's decode default, as v2's
    bm = 64
  return Kernel("mosaic v1", f"bm{bm} bn{bn} bk{bk} cs4", bm, bn, bk, band, "snake", False, 1, True)


def band_snake(idx, num_rows: int, num_cols: int, band: int):
  """The (row, col) cell of step `idx` in the v1 Mosaic GPU order (kernels/mosaic_gpu/gmm.py at
  git 0bcb5d4), in NumPy: bands of `band` columns, the column fastest within a band, every
  other band walking its rows bottom-up, the last band possibly narrower."""
  band = max(1, min(band, num_cols))
  per_band = band * num_rows
  b = idx // per_band
  local = idx - b * per_band
  first_col = b * band
  width = np.maximum(np.minimum(band, num_cols - first_col), 1)
  row = local // width
  row = np.where(b % 2 == 0, row, num_rows - 1 - row)
  return row, first_col + local % width


def gmm_cells(p: Problem, kern: Kernel, sizes: np.ndarray):
  """Per cell in launch order: (first lhs row of its row tile, group or -1 for a cell that reads
  nothing (zero fill, spare slot), column block)."""
  rows, _, cols = common.op_dims(p.op, p.m, p.k, p.n)
  num_tiles = common.num_tiles_bound(rows, kern.block_m, p.g)
  seg_starts, seg_ends = common.segment_bounds(jnp.asarray(sizes), rows, jnp.int32(0), p.g)
  sched = common.tile_schedule(
    seg_starts, seg_ends, kern.block_m, num_tiles, group_start=kern.group_start, align=kern.align
  ).to_numpy()
  active = int(sched.active[0])
  ncol = _cdiv(cols, kern.block_n)
  if kern.order == "banded":
    tile, col = common.launch_cell(
      np.arange(active * ncol), sched.tile_segment, sched.segment_first_tile, sched.segment_num_tiles, ncol, kern.band
    )
  elif kern.order == "snake":  # v1 walked the static bound and skipped its spare tiles
    tile, col = band_snake(np.arange(num_tiles * ncol), num_tiles, ncol, kern.band)
  else:
    band = active if kern.order == "m_fastest" else 1
    tile, col = common.program_tile(np.arange(active * ncol), active, ncol, band)
  seg = sched.tile_segment[tile]
  real = (tile < active) & common.is_local(seg, p.g)
  return sched.tile_row_start[tile], np.where(real, seg - 1, -1), col


def tgmm_cells(p: Problem, kern: Kernel):
  """Per cell in launch order: (group, k tile, n tile); the group is the slowest axis."""
  nk, nn = _cdiv(p.k, kern.block_k), _cdiv(p.n, kern.block_n)
  pid = np.arange(p.g * nk * nn)
  grp = pid // (nk * nn)
  local = pid - grp * nk * nn
  walk = band_snake if kern.order == "snake" else common.program_tile
  kb, nb = walk(local, nk, nn, kern.band)
  return grp, kb, nb


class RowPieces:
  """The row axis cut at both ends of every row range the kernel reads: each range is a run of
  whole pieces, and two ranges that overlap share the pieces they overlap."""

  def __init__(self, starts: np.ndarray, ends: np.ndarray):
    self.bounds = np.unique(np.concatenate([starts, ends]))
    self.rows = np.diff(self.bounds)

  def runs(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[first, last) piece of each range."""
    return np.searchsorted(self.bounds, starts), np.searchsorted(self.bounds, ends)


def _phase_spans(steps: int, longest: int) -> list[tuple[int, int]]:
  """[first, last) steps of each phase of a program of `steps` steps: the longest program of
  the launch takes at most MAX_PHASES phases, and every phase is as many steps."""
  per_phase = max(1, math.ceil(longest / MAX_PHASES))
  return [(s, min(steps, s + per_phase)) for s in range(0, steps, per_phase)]


def replay(n_programs: int, phases_of, slots: int, persistent: bool, l2_bytes: int) -> int:
  """HBM bytes the programs read through an LRU L2 of l2_bytes. `slots` programs run at once,
  in lockstep, one phase (a list of (block key, bytes)) each a round. Persistent: slot s runs
  programs s, s + slots, ...; else each freed slot takes the next program in launch order."""
  cache: collections.OrderedDict = collections.OrderedDict()
  held, fetched = 0, 0

  def touch(phase):
    nonlocal held, fetched
    for key, size in phase:
      if key in cache:
        cache.move_to_end(key)
        continue
      fetched += size
      cache[key] = size
      held += size
      while held > l2_bytes:
        _, s = cache.popitem(last=False)
        held -= s

  if persistent:
    queues = [collections.deque(range(s, n_programs, slots)) for s in range(slots)]
    current: list[list] = [[] for _ in range(slots)]
    busy = True
    while busy:
      busy = False
      for s in range(slots):
        while not current[s] and queues[s]:  # a program with nothing to read takes no time
          current[s] = phases_of(queues[s].popleft())[::-1]
        if current[s]:
          busy = True
          touch(current[s].pop())
    return fetched
  running: list[list] = []  # per slot: remaining phases of its program, last first
  next_program = 0
  while True:
    while len(running) < slots and next_program < n_programs:
      phases = phases_of(next_program)[::-1]
      next_program += 1
      if phases:
        running.append(phases)
    if not running:
      return fetched
    for phases in running:
      touch(phases.pop())
    # Freed slots take the next programs in launch order before the next phase.
    running = [phases for phases in running if phases]


def simulate(p: Problem, kern: Kernel, *, sms: int, l2_bytes: int, dtype: str = "bfloat16") -> Traffic:
  """The HBM traffic of one op run by `kern`."""
  b = common.itemsize(dtype)
  sizes = p.group_sizes()
  rows, contraction, cols = common.op_dims(p.op, p.m, p.k, p.n)
  if p.op == "drhs":
    grp, kb, nb = tgmm_cells(p, kern)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # Each group's row steps: block_m rows from its first row (rounded down to align), or the
    # block_m grid blocks it touches.
    steps = [
      np.arange(s // kern.align * kern.align, e, kern.block_m)
      if kern.group_start
      else np.arange(s // kern.block_m, _cdiv(e, kern.block_m)) * kern.block_m
      for s, e in zip(starts.tolist(), ends.tolist())
    ]
    step_starts = np.concatenate(steps)
    step_ends = np.minimum(step_starts + kern.block_m, rows)
    pieces = RowPieces(step_starts, step_ends)
    lo, hi = pieces.runs(step_starts, step_ends)
    piece_rows = pieces.rows.tolist()
    # Per group, per phase: the pieces its row steps read.
    group_phases, at, longest = [], 0, max(1, max(len(st) for st in steps))
    for st in steps:
      group_phases.append(
        [
          [i for j in range(at + a, at + z) for i in range(int(lo[j]), int(hi[j]))]
          for a, z in _phase_spans(len(st), longest)
        ]
      )
      at += len(st)

    def phases_of(i):
      g_, k_, n_ = int(grp[i]), int(kb[i]), int(nb[i])
      bk = min(kern.block_k, p.k - k_ * kern.block_k) * b
      bn = min(kern.block_n, p.n - n_ * kern.block_n) * b
      return [
        [(("a", x, k_), piece_rows[x] * bk) for x in phase] + [(("b", x, n_), piece_rows[x] * bn) for x in phase]
        for phase in group_phases[g_]
      ]

    n_programs = len(grp)
    cells = int((sizes > 0).sum()) * _cdiv(p.k, kern.block_k) * _cdiv(p.n, kern.block_n)
    out_bytes = p.g * p.k * p.n * b
    unique = (int(sizes.sum()) * (p.k + p.n)) * b + out_bytes
  else:
    row_start, grp, col = gmm_cells(p, kern, sizes)
    real = grp >= 0
    row_end = np.minimum(row_start + kern.block_m, rows)
    pieces = RowPieces(row_start[real], row_end[real])
    lo, hi = pieces.runs(np.where(real, row_start, 0), np.where(real, row_end, 0))
    piece_rows = pieces.rows.tolist()
    nk = _cdiv(contraction, kern.block_k)
    spans = _phase_spans(nk, nk)
    phase_k = [(min(z * kern.block_k, contraction) - a * kern.block_k) * b for a, z in spans]

    def phases_of(i):
      g_ = int(grp[i])
      if g_ < 0:
        return []  # zero fill or a spare slot: writes only
      c_ = int(col[i])
      bn = min(kern.block_n, cols - c_ * kern.block_n)
      run = range(int(lo[i]), int(hi[i]))
      return [
        [(("a", x, s), piece_rows[x] * kb_bytes) for x in run] + [(("b", g_, s, c_), kb_bytes * bn)]
        for s, kb_bytes in enumerate(phase_k)
      ]

    n_programs = len(grp)
    cells = int(real.sum())
    out_bytes = rows * cols * b
    used = int((sizes > 0).sum())
    unique = (int(sizes.sum()) * contraction + used * contraction * cols) * b + out_bytes
  slots = max(1, sms // kern.ctas) if kern.persistent else sms * kern.per_sm
  fetched = replay(n_programs, phases_of, slots, kern.persistent, l2_bytes)
  return Traffic(fetched + out_bytes, unique, cells)


def default_for(p: Problem, family: str) -> triton.TritonConfig:
  kind = {"hopper": HOPPER, "ampere": "NVIDIA A100-SXM4-80GB"}.get(family, "")
  return triton.default(p.op, "bfloat16", p.m, p.k, p.n, p.g, device_kind=kind)


def kernels_for(p: Problem, names: list[str], family: str) -> list[Kernel]:
  """The kernels `names` picks (triton, mosaic, tcgen05), each with its default config."""
  out = [triton_kernel(p, default_for(p, family))] if "triton" in names else []
  out += [mosaic_v1(p), mosaic_v2(p)] if "mosaic" in names else []
  return out + ([tcgen05(p), tcgen05(p, pair=True)] if "tcgen05" in names else [])


@dataclasses.dataclass(frozen=True)
class TileWaste:
  block_m: int
  rows: int  # rows routed to the groups
  aligned: int  # row tiles on the block_m grid, one more per group boundary inside a tile
  group_start: int  # row tiles from each group's first row
  boxed: int  # group-start tiles from the first row rounded down to ROW_TILE (Mosaic GPU v2)

  @property
  def ideal(self) -> float:
    return self.rows / self.block_m

  def extra_pct(self, tiles: int) -> float:
    """MMA work the tiles add over the ideal, in %."""
    return 100.0 * (tiles / self.ideal - 1.0)


def tile_waste(sizes: np.ndarray, m: int, block_m: int) -> TileWaste:
  count = lambda group_start, align=1: sum(common.row_tiles(sizes.tolist(), m, block_m, group_start, align)[0])
  return TileWaste(block_m, int(sizes.sum()), count(False), count(True), count(True, ROW_TILE))


def _table(header: str) -> None:
  print(header)
  print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")


def print_tile_waste(problems: list[Problem], block_ms=(64, 128)) -> None:
  print("\nTile waste: row tiles issued against the ideal sum(rows) / block_m, and the MMA work they add")
  _table(
    f"| {'routing (multinomial)':<36} | block_m | ideal tiles | aligned: tiles, +MMA | group-start: tiles, +MMA | "
    f"8-row boxes: tiles, +MMA |"
  )
  seen = set()
  for p in problems:
    if (p.m, p.g, p.seed) in seen:
      continue
    seen.add((p.m, p.g, p.seed))
    label = f"{p.name.rsplit(' ', 1)[0]} m={p.m} g={p.g}"
    for bm in block_ms:
      w = tile_waste(p.group_sizes(), p.m, bm)
      print(
        f"| {label:<36} | {bm:>7} | {w.ideal:>11.1f} | {f'{w.aligned}, +{w.extra_pct(w.aligned):.1f}%':<20} | "
        f"{f'{w.group_start}, +{w.extra_pct(w.group_start):.1f}%':<24} | "
        f"{f'{w.boxed}, +{w.extra_pct(w.boxed):.1f}%':<24} |"
      )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument(
    "--device", default="h100", choices=sorted(DEVICES), help="the machine's figures and kernels (module docstring)"
  )
  ap.add_argument("--sms", type=int, default=None, help="default: the device's")
  ap.add_argument("--l2", type=float, nargs="+", default=None, help="L2 sizes in MB; default: the device's")
  ap.add_argument("--bw", type=float, default=None, help="HBM TB/s for the implied time; default: the device's")
  ap.add_argument("--tflops", type=float, default=None, help="MMA TF/s for the compute time; default: the device's")
  ap.add_argument("--bands", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 1024])
  ap.add_argument("--family", default="hopper", choices=["hopper", "ampere", "other"], help="triton's defaults")
  ap.add_argument(
    "--kernels",
    nargs="+",
    default=None,
    choices=["triton", "mosaic", "tcgen05"],
    help="mosaic: v1 and v2; tcgen05: one CTA and a CTA pair; default: the device's",
  )
  ap.add_argument("--quick", action="store_true", help="m / 8 on every problem")
  ap.add_argument("--only", default="", help="substring of the problem names to run")
  ap.add_argument(
    "--legacy", action="store_true", help="also model the old global m_fastest / n_fastest orders (triton fwd and dlhs)"
  )
  args = ap.parse_args(argv)
  dev = DEVICES[args.device]
  for name, value in (("sms", dev.sms), ("l2", list(dev.l2_mb)), ("bw", dev.hbm_tbs), ("tflops", dev.tflops)):
    if getattr(args, name) is None:
      setattr(args, name, value)
  args.kernels = args.kernels or list(dev.kernels)
  label = "" if args.device == "h100" else f" ({dev.name})"
  family = f"{args.family} triton defaults; " if "triton" in args.kernels else ""

  print(
    f"L2 traffic model{label}: {args.sms} SMs, LRU L2, HBM {args.bw} TB/s, MMA {args.tflops} TF/s, bf16, "
    f"multinomial group sizes, {family}bands tried: {args.bands} (mosaic: those <= 64)"
  )
  print(
    "ratio = HBM bytes fetched (reads + output writes) / unique bytes; "
    "band = group_m (drhs: group_k), mosaic v1: grid_block_n"
  )
  kw = len("tcgen05 pair") if "tcgen05" in args.kernels else 9  # the kernel column
  _table(
    f"| {'problem':<22} | {'kernel':<{kw}} | {'default config':<24} | L2 MB | unique GB | default: band, GB, ratio | "
    f"best band, ratio | worst band, ratio | HBM ms | MMA ms |"
  )
  t0 = time.perf_counter()
  problems = [p for p in PROBLEMS if args.only.lower() in p.name.lower()]
  if args.quick:
    problems = [dataclasses.replace(p, m=max(p.g, p.m // 8)) for p in problems]
  for p in problems:
    mma_ms = 2.0 * p.m * p.k * p.n / (args.tflops * 1e12) * 1e3
    for kern in kernels_for(p, args.kernels, args.family):
      bands = {b for b in args.bands if kern.persistent is False or b <= MOSAIC_BANDS[1]} | {kern.band}
      for l2 in args.l2:
        l2_bytes = int(l2 * 1e6)
        results = {
          b: simulate(p, dataclasses.replace(kern, band=b), sms=args.sms, l2_bytes=l2_bytes) for b in sorted(bands)
        }
        unique = results[kern.band].unique
        ratio = {b: r.fetched / unique for b, r in results.items()}
        best = min(ratio, key=lambda b: (ratio[b], b))
        worst = max(ratio, key=lambda b: (ratio[b], -b))
        fetched = results[kern.band].fetched
        print(
          f"| {p.name:<22} | {kern.name:<{kw}} | {kern.config:<24} | {l2:>5g} | {unique / 1e9:>9.2f} | "
          f"{f'{kern.band}, {fetched / 1e9:.2f}, {ratio[kern.band]:.2f}x':<24} | "
          f"{f'{best}, {ratio[best]:.2f}x':<16} | {f'{worst}, {ratio[worst]:.2f}x':<17} | "
          f"{fetched / (args.bw * 1e12) * 1e3:>6.2f} | {mma_ms:>6.2f} |"
        )
        if args.legacy and kern.name == "triton" and p.op != "drhs":
          for order in ("m_fastest", "n_fastest"):
            fetched = simulate(p, dataclasses.replace(kern, order=order), sms=args.sms, l2_bytes=l2_bytes).fetched
            print(
              f"| {'  old ' + order:<22} | {kern.name:<{kw}} | {kern.config:<24} | {l2:>5g} | {unique / 1e9:>9.2f} | "
              f"{f'-, {fetched / 1e9:.2f}, {fetched / unique:.2f}x':<24} | {'':<16} | {'':<17} | "
              f"{fetched / (args.bw * 1e12) * 1e3:>6.2f} | {mma_ms:>6.2f} |"
            )
  print_tile_waste(problems, dev.tile_block_ms)
  print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
  main()
