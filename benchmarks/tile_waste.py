"""Row tiles a gmm issues, aligned on the block_m grid vs group-start (kernels.common.row_tiles).

Aligned tiles sit on the fixed block_m grid, so a grid block that straddles a group boundary
runs once for each group it touches; group-start tiles begin at each group's first row, so
only a group's last tile is partial. "8-row boxes" are group-start tiles from the first row
rounded down to 8 (TMA's boxes), as the Mosaic GPU kernels (kernels/mosaic_gpu, and the
Blackwell tcgen05 ones, kernels/mosaic_blackwell) issue them. "padded rows" are the rows the
tiles compute beyond the group rows they store: tiles x block_m - rows. block_m 256 is a
tcgen05 CTA pair's cell (cta_pair: two CTAs of 128 rows). No GPU; plain counts on multinomial
routing (seeded, as in shapes/anchors.yaml).

  python benchmarks/tile_waste.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kernels import common  # noqa: E402

# (name, m, g): Mixtral-8x7B prefill [8192,4096]x[8,4096,14336] (mistralai/Mixtral-8x7B-v0.1,
# config.json: num_local_experts 8, top-2 of 4096 tokens) and DeepSeek-V3's up projection
# [131072,7168]x[256,7168,2048] (deepseek-ai/DeepSeek-V3, config.json: n_routed_experts 256,
# num_experts_per_tok 8 of 16384 tokens). The row tiles depend on m and g only.
PROBLEMS = (("Mixtral 8x7B", 8192, 8), ("DeepSeek-V3 up", 131072, 256))
BLOCK_M = (64, 128, 256)
ROW_TILE = 8  # TMA's boxes: kernels/mosaic_gpu and kernels/mosaic_blackwell start a group's tiles on them


def main(seeds: int = 5) -> None:
  print(
    f"{'problem':<16} {'block_m':>7} {'aligned tiles':>13} {'group-start':>11} {'saved':>6} {'8-row boxes':>11} "
    f"{'padded rows: aligned':>20} {'group-start':>11} {'8-row boxes':>11}"
  )
  for name, m, g in PROBLEMS:
    for block_m in BLOCK_M:
      counts = {}
      for kind, group_start, align in (("aligned", False, 1), ("start", True, 1), ("boxes", True, ROW_TILE)):
        tiles = [sum(common.row_tiles(draw(m, g, seed), m, block_m, group_start, align)[0]) for seed in range(seeds)]
        counts[kind] = float(np.mean(tiles))
      aligned, start, boxes = counts["aligned"], counts["start"], counts["boxes"]
      print(
        f"{name:<16} {block_m:>7} {aligned:>13.1f} {start:>11.1f} {1 - start / aligned:>6.1%} {boxes:>11.1f} "
        f"{aligned * block_m - m:>20.0f} {start * block_m - m:>11.0f} {boxes * block_m - m:>11.0f}"
      )
  print(f"(means over {seeds} seeds; every row routed, so no tile of rows past sum(group_sizes))")


def draw(m: int, g: int, seed: int) -> tuple[int, ...]:
  """Multinomial routing of m rows over g experts, as ragtune.problems.shapes.GroupDist draws it."""
  return tuple(int(s) for s in np.random.default_rng(seed).multinomial(m, np.full(g, 1.0 / g)))


if __name__ == "__main__":
  main()
