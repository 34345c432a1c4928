"""Rows the grouped-matmul kernels compute against the rows they store, on multinomial routing.

A group's row tiles start at its first row (rounded down to TMA's 8-row boxes on the Mosaic
kernels), so only its last tile is partial, and that tile still runs its whole block_m rows
through the MMA. This counts, with the kernels' own code, what each default computes:

- mosaic_gpu fwd and dlhs (one gmm kernel, the same rows): the tiles of gmm.row_schedule and,
  per tile, gmm.computed_rows (64 for a tile whose rows fit in them, under narrow_tail), the
  functions the kernel itself runs; "before" is the same default with narrow_tail off;
- mosaic_gpu drhs: tgmm.group_steps, the block_m-row reduction steps each group takes (a
  group's last step is partly masked, still a full wgmma K);
- mosaic_blackwell and pallas_gpu fwd/dlhs: their schedules' tiles (common.row_tiles, as their
  grid_work counts them), block_m rows each (block_m 256 is a tcgen05 CTA pair's cell).

ratio = rows computed / rows stored; a problem's MMA work is that much above 2 m k n. The
column blocks multiply both alike, so the ratio is the cells'. A second table counts row tiles
on the fixed block_m grid (a grid block that straddles a group boundary runs once for each
group it touches) against group-start tiles, and those on 8-row boxes. Means over 5 seeds
(seed 0 is shapes/anchors.yaml's routing). No GPU; counts, not timings.

  python benchmarks/tile_waste.py
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels  # noqa: E402
from kernels import common  # noqa: E402
from kernels.mosaic_blackwell import config as blackwell  # noqa: E402
from kernels.mosaic_gpu import config as mosaic  # noqa: E402
from kernels.mosaic_gpu import gmm as mosaic_gmm  # noqa: E402
from kernels.mosaic_gpu import tgmm as mosaic_tgmm  # noqa: E402
from kernels.pallas_gpu import config as triton  # noqa: E402

# (name, m, k, n, g): Mixtral-8x7B prefill [8192,4096]x[8,4096,14336] (mistralai/Mixtral-8x7B-v0.1,
# config.json: num_local_experts 8, top-2 of 4096 tokens) and DeepSeek-V3's up and down
# projections (deepseek-ai/DeepSeek-V3, config.json: n_routed_experts 256, num_experts_per_tok
# 8 of 16384 tokens, moe_intermediate_size 2048). The rows depend on m and g only.
PROBLEMS = (
  ("Mixtral 8x7B", 8192, 4096, 14336, 8),
  ("DeepSeek-V3 up", 131072, 7168, 2048, 256),
  ("DeepSeek-V3 down", 131072, 2048, 7168, 256),
)
H100, B200 = "NVIDIA H100 80GB HBM3", "NVIDIA B200"
BF16 = "bfloat16"
SEEDS = 5


@dataclasses.dataclass(frozen=True)
class Count:
  kernel: str
  ops: str
  config: str
  stored: float  # rows routed to the groups (means over the seeds)
  computed: float  # rows the kernel's MMA runs over them

  @property
  def ratio(self) -> float:
    return self.computed / self.stored


def draw(m: int, g: int, seed: int) -> np.ndarray:
  """Multinomial routing of m rows over g experts, as ragtune.problems.shapes.GroupDist draws it."""
  return np.random.default_rng(seed).multinomial(m, np.full(g, 1.0 / g))


def mosaic_gpu_rows(sizes: np.ndarray, m: int, cfg: kernels.MosaicConfig) -> int:
  """Rows mosaic_gpu's gmm (fwd and dlhs) runs wgmma on: gmm.py's schedule and per-tile rule."""
  return int(mosaic_gmm.host_tiles(sizes, common.round_up(m, mosaic_gmm.ROW_TILE), len(sizes), cfg)[2].sum())


def tgmm_rows(sizes: np.ndarray, block_m: int) -> int:
  """Rows mosaic_gpu's tgmm reduces: each group's block_m-row steps (tgmm.group_steps)."""
  ends = np.cumsum(sizes)
  _, steps = mosaic_tgmm.group_steps(jnp.asarray(ends - sizes), jnp.asarray(ends), block_m)
  return int(np.sum(steps)) * block_m


def tiled_rows(sizes: np.ndarray, m: int, block_m: int, align: int) -> int:
  """Rows of a kernel whose every group-start tile computes block_m rows (common.row_tiles)."""
  return sum(common.row_tiles(sizes.tolist(), m, block_m, group_start=True, align=align)[0]) * block_m


def counts(m: int, k: int, n: int, g: int, seeds: int = SEEDS) -> list[Count]:
  draws = [draw(m, g, s) for s in range(seeds)]
  mean = lambda f: float(np.mean([f(d) for d in draws]))
  stored = mean(lambda d: int(d.sum()))
  gmm_cfg = mosaic.default("fwd", BF16, m, k, n, g, H100)
  dlhs_cfg = mosaic.default("dlhs", BF16, m, k, n, g, H100)
  assert (gmm_cfg.block_m, gmm_cfg.narrow_tail) == (dlhs_cfg.block_m, dlhs_cfg.narrow_tail)
  off = dataclasses.replace(gmm_cfg, narrow_tail=False)
  tgmm_cfg = mosaic.default("drhs", BF16, m, k, n, g, H100)
  bw = blackwell.default("fwd", BF16, m, k, n, g, B200)
  bw_rows = bw.cell("fwd")[0]
  tri = triton.default("fwd", BF16, m, k, n, g, H100)
  tag = lambda c: f"bm{c.block_m} narrow_tail {'on' if c.narrow_tail_applies('fwd', BF16) else 'off'}"
  return [
    Count("mosaic_gpu (before)", "fwd, dlhs", tag(off), stored, mean(lambda d: mosaic_gpu_rows(d, m, off))),
    Count("mosaic_gpu", "fwd, dlhs", tag(gmm_cfg), stored, mean(lambda d: mosaic_gpu_rows(d, m, gmm_cfg))),
    Count("mosaic_gpu", "drhs", f"steps of {tgmm_cfg.block_m}", stored, mean(lambda d: tgmm_rows(d, tgmm_cfg.block_m))),
    Count(
      "mosaic_blackwell",
      "fwd, dlhs",
      f"cell {bw_rows} rows",
      stored,
      mean(lambda d: tiled_rows(d, m, bw_rows, mosaic_gmm.ROW_TILE)),
    ),
    Count("pallas_gpu", "fwd, dlhs", f"bm{tri.block_m}", stored, mean(lambda d: tiled_rows(d, m, tri.block_m, 1))),
  ]


def main() -> None:
  print("| problem | kernel | ops | default | rows stored | rows computed | ratio |")
  print("|---|---|---|---|---|---|---|")
  for name, m, k, n, g in PROBLEMS:
    for c in counts(m, k, n, g):
      print(f"| {name} | {c.kernel} | {c.ops} | {c.config} | {c.stored:,.0f} | {c.computed:,.0f} | {c.ratio:.3f} |")
  print(f"(means over {SEEDS} seeds of multinomial routing; every row routed)\n")
  print(
    "| problem | block_m | aligned tiles | group-start | saved | 8-row boxes | padded rows: aligned | group-start |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for name, m, _, _, g in PROBLEMS[:2]:  # DeepSeek-V3 down has up's rows
    for block_m in (64, 128, 256):
      tiles = {
        kind: float(
          np.mean([sum(common.row_tiles(draw(m, g, s).tolist(), m, block_m, start, align)[0]) for s in range(SEEDS)])
        )
        for kind, start, align in (("aligned", False, 1), ("start", True, 1), ("boxes", True, mosaic_gmm.ROW_TILE))
      }
      aligned, start = tiles["aligned"], tiles["start"]
      print(
        f"| {name} | {block_m} | {aligned:.1f} | {start:.1f} | {1 - start / aligned:.1%} | {tiles['boxes']:.1f} | "
        f"{aligned * block_m - m:,.0f} | {start * block_m - m:,.0f} |"
      )


if __name__ == "__main__":
  main()
