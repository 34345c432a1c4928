"""Model the HBM bytes the Pallas GPU kernels fetch, from their real launch order.

No GPU: this replays kernels.pallas_gpu.gmm.program_tile / gpu_tgmm.program_tile (and the real
tile schedule of kernels.common) through a simple machine:

- `--sms` SMs (132 on an H100 SXM), each running as many programs as its shared memory
  holds (228 KiB per SM, 1 KiB reserved per program, capped at 2: the wgmma configs use
  8 warps or ~100+ registers per thread);
- programs dispatched in launch order, each to the slot that frees first; all running
  programs advance in lockstep, one phase (a few k steps) at a time;
- an LRU L2 of `--l2` MB over operand blocks: a miss fetches the block from HBM. Outputs
  are written once and counted as written bytes.

"fetched" is HBM reads plus output writes; "unique" is every operand byte the problem
needs once plus the output. Their ratio is how many times the launch order re-reads data.
It ignores sectors, prefetch, L2 partitioning and L2 hashing: a model to compare orders,
not a prediction of a timing. Compare "HBM ms" (fetched / --bw) with "MMA ms" (FLOPs /
--tflops) to see which bound applies.

  python benchmarks/l2_traffic.py                 # default configs, best band, 50 and 25 MB
  python benchmarks/l2_traffic.py --quick         # smaller problems (m / 8), for a quick look
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
from kernels.pallas_gpu import config as triton  # noqa: E402
from kernels.pallas_gpu import gmm as gpu_gmm  # noqa: E402
from kernels.pallas_gpu import tgmm as gpu_tgmm

SMEM_PER_SM, SMEM_RESERVED = 228 * 1024, 1024
MAX_PHASES = 16  # phases per program: k steps are merged into at most this many


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
  Problem("DeepSeek-V3 decode fwd", "fwd", 512, 7168, 2048, 256),
]


def _ctas_per_sm(cfg: triton.TritonConfig, *dims) -> int:
  smem = cfg.smem_bytes(*dims)
  return max(1, min(2, SMEM_PER_SM // (smem + SMEM_RESERVED)))


def gmm_programs(p: Problem, cfg: triton.TritonConfig, sizes: np.ndarray, order: str = "banded"):
  """Per launch slot in order: (lhs row block or -1 for a zero-fill tile, group, col block).

  order: "banded" is the kernel's (gpu_gmm.launch_cell); "m_fastest" / "n_fastest" are the
  two global orders ragtune used before (every tile of a column block first, or every
  column block of a tile first, over all groups' tiles at once), for comparison."""
  rows, contraction, cols = common.op_dims(p.op, p.m, p.k, p.n)
  c = cfg.clamped(rows, contraction, cols)
  num_tiles = common.num_tiles_bound(rows, c.block_m, p.g)
  seg_starts, seg_ends = common.segment_bounds(jnp.asarray(sizes), rows, jnp.int32(0), p.g)
  sched = common.TileSchedule(
    *(np.asarray(a) for a in common.tile_schedule(seg_starts, seg_ends, c.block_m, num_tiles))
  )
  ncol = -(-cols // c.block_n)
  pid = np.arange(int(sched.active[0]) * ncol)
  if order == "banded":
    tile, col = gpu_gmm.launch_cell(
      pid, sched.tile_segment, sched.segment_first_tile, sched.segment_num_tiles, ncol, c.group_m
    )
  else:
    band = int(sched.active[0]) if order == "m_fastest" else 1
    tile, col = gpu_gmm.program_tile(pid, int(sched.active[0]), ncol, band)
  tile_block = sched.tile_row_start // c.block_m
  seg = sched.tile_segment[tile]
  is_group = (seg >= 1) & (seg <= p.g)
  return c, np.where(is_group, tile_block[tile], -1), seg - 1, col


def simulate(p: Problem, cfg: triton.TritonConfig, *, sms: int, l2_bytes: int, dtype="bfloat16", order: str = "banded"):
  """(HBM bytes fetched incl. output writes, unique bytes) for one op and config."""
  b = common.itemsize(dtype)
  sizes = p.group_sizes()
  rows, contraction, cols = common.op_dims(p.op, p.m, p.k, p.n)
  if p.op == "drhs":
    c = cfg.clamped(rows, contraction, cols)
    nk, nn = -(-p.k // c.block_k), -(-p.n // c.block_n)
    pid = np.arange(p.g * nk * nn)
    grp, kb, nb = gpu_tgmm.program_tile(pid, p.g, nk, nn, c.group_k)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    first = starts // c.block_m
    last = np.where(ends > starts, (ends + c.block_m - 1) // c.block_m, first)
    steps_total = int(max(1, (last - first).max()))
    per_phase = max(1, math.ceil(steps_total / MAX_PHASES))
    # Operand blocks: ("a", row block, k block) of lhs and ("b", row block, n block) of dout.
    a_bytes, b_bytes = c.block_m * c.block_k * b, c.block_m * c.block_n * b

    def program_phases(i):
      g_, k_, n_ = int(grp[i]), int(kb[i]), int(nb[i])
      blocks = range(int(first[g_]), int(last[g_]))
      return [
        [(("a", r, k_), a_bytes) for r in blocks[s : s + per_phase]]
        + [(("b", r, n_), b_bytes) for r in blocks[s : s + per_phase]]
        for s in range(0, len(blocks), per_phase)
      ] or [[]]

    n_programs = len(pid)
    out_bytes = p.g * p.k * p.n * b
    unique = (int(sizes.sum()) * (p.k + p.n)) * b + out_bytes
    slots = _ctas_per_sm(c, p.op, dtype, p.m, p.k, p.n) * sms
  else:
    c, row_block, grp, col = gmm_programs(p, cfg, sizes, order)
    nk = -(-contraction // c.block_k)
    per_phase = max(1, math.ceil(nk / MAX_PHASES))
    a_bytes = c.block_m * c.block_k * per_phase * b
    b_bytes = c.block_k * c.block_n * per_phase * b

    def program_phases(i):
      r = int(row_block[i])
      if r < 0:
        return [[]]  # zero-fill tile: writes only
      g_, col_ = int(grp[i]), int(col[i])
      return [[(("a", r, s), a_bytes), (("b", g_, s, col_), b_bytes)] for s in range(0, nk, per_phase)]

    n_programs = len(row_block)
    out_bytes = rows * cols * b
    used = int((sizes > 0).sum())
    unique = (int(sizes.sum()) * contraction + used * contraction * cols) * b + out_bytes
    slots = _ctas_per_sm(c, p.op, dtype, p.m, p.k, p.n) * sms

  cache: collections.OrderedDict = collections.OrderedDict()
  held, fetched = 0, 0
  running: list[list | None] = []  # per slot: remaining phases of its program
  next_program = 0
  while True:
    while len(running) < slots and next_program < n_programs:
      running.append(program_phases(next_program))
      next_program += 1
    if not running:
      break
    still = []
    for phases in running:
      for key, size in phases.pop(0):
        if key in cache:
          cache.move_to_end(key)
          continue
        fetched += size
        cache[key] = size
        held += size
        while held > l2_bytes:
          _, s = cache.popitem(last=False)
          held -= s
      if phases:
        still.append(phases)
    # Freed slots take the next programs in launch order before the next phase.
    running = still
  return fetched + out_bytes, unique


def default_for(p: Problem, family: str) -> triton.TritonConfig:
  kind = {"hopper": "NVIDIA H100 80GB HBM3", "ampere": "NVIDIA A100-SXM4-80GB"}.get(family, "")
  return triton.default(p.op, "bfloat16", p.m, p.k, p.n, p.g, device_kind=kind)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sms", type=int, default=132)
  ap.add_argument("--l2", type=float, nargs="+", default=[50.0, 25.0], help="L2 sizes in MB")
  ap.add_argument("--bw", type=float, default=3.35, help="HBM TB/s for the implied time")
  ap.add_argument("--tflops", type=float, default=800.0, help="MMA TF/s for the compute time")
  ap.add_argument("--bands", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 1024])
  ap.add_argument("--family", default="hopper", choices=["hopper", "ampere", "other"])
  ap.add_argument("--quick", action="store_true", help="m / 8 on every problem")
  ap.add_argument("--only", default="", help="substring of the problem names to run")
  ap.add_argument(
    "--legacy", action="store_true", help="also model the old global m_fastest / n_fastest orders (fwd and dlhs)"
  )
  args = ap.parse_args(argv)

  print(
    f"L2 traffic model: {args.sms} SMs, LRU L2, HBM {args.bw} TB/s, MMA {args.tflops} TF/s, bf16, "
    f"multinomial group sizes, {args.family} default configs; bands tried: {args.bands}"
  )
  print("ratio = HBM bytes fetched (reads + output writes) / unique bytes; band = group_m (drhs: group_k)")
  header = (
    f"| {'problem':<22} | {'default config':<24} | L2 MB | unique GB | default: band, GB, ratio | "
    f"best band, ratio | worst band, ratio | HBM ms | MMA ms |"
  )
  print(header)
  print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
  t0 = time.perf_counter()
  for p in PROBLEMS:
    if args.only and args.only.lower() not in p.name.lower():
      continue
    if args.quick:
      p = dataclasses.replace(p, m=max(p.g, p.m // 8))
    cfg = default_for(p, args.family)
    knob = "group_k" if p.op == "drhs" else "group_m"
    mma_ms = 2.0 * p.m * p.k * p.n / (args.tflops * 1e12) * 1e3
    blocks = f"{cfg.block_m}x{cfg.block_k}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
    for l2 in args.l2:
      results = {
        band: simulate(p, dataclasses.replace(cfg, **{knob: band}), sms=args.sms, l2_bytes=int(l2 * 1e6))
        for band in sorted(set(args.bands) | {getattr(cfg, knob)})
      }
      unique = results[getattr(cfg, knob)][1]
      ratio = {band: fetched / unique for band, (fetched, _) in results.items()}
      default = getattr(cfg, knob)
      best = min(ratio, key=lambda band: (ratio[band], band))
      worst = max(ratio, key=lambda band: (ratio[band], -band))
      fetched = results[default][0]
      print(
        f"| {p.name:<22} | {blocks:<24} | {l2:>5g} | {unique / 1e9:>9.2f} | "
        f"{f'{default}, {fetched / 1e9:.2f}, {ratio[default]:.2f}x':<24} | {f'{best}, {ratio[best]:.2f}x':<16} | "
        f"{f'{worst}, {ratio[worst]:.2f}x':<17} | {fetched / (args.bw * 1e12) * 1e3:>6.2f} | {mma_ms:>6.2f} |"
      )
      if args.legacy and p.op != "drhs":
        for order in ("m_fastest", "n_fastest"):
          fetched, _ = simulate(p, cfg, sms=args.sms, l2_bytes=int(l2 * 1e6), order=order)
          print(
            f"| {'  old ' + order:<22} | {blocks:<24} | {l2:>5g} | {unique / 1e9:>9.2f} | "
            f"{f'-, {fetched / 1e9:.2f}, {fetched / unique:.2f}x':<24} | {'':<16} | {'':<17} | "
            f"{fetched / (args.bw * 1e12) * 1e3:>6.2f} | {mma_ms:>6.2f} |"
          )
  print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
  main()
