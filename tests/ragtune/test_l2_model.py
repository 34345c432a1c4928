"""benchmarks/l2_traffic.py (the launch-order replay, its Mosaic GPU and tcgen05 kernels, the tile
waste) and benchmarks/gemm_model.py (the analytic model), on problems small enough to replay in a
second."""

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
  sys.path.insert(0, str(ROOT / "benchmarks"))  # gemm_model imports l2_traffic as a sibling
  spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod
  spec.loader.exec_module(mod)
  return mod


l2 = _load("l2_traffic")
gemm_model = _load("gemm_model")
TINY = l2.Problem("tiny", "fwd", 2048, 512, 2048, 4)


def test_band_snake_walks_bands_of_columns_and_every_other_band_bottom_up():
  rows, cols, band = 3, 5, 2
  walk = [tuple(int(x) for x in rc) for rc in zip(*l2.band_snake(np.arange(rows * cols), rows, cols, band))]
  assert walk == [
    (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1),  # band 0, rows top-down, the column fastest
    (2, 2), (2, 3), (1, 2), (1, 3), (0, 2), (0, 3),  # band 1, bottom-up
    (0, 4), (1, 4), (2, 4),  # the narrower last band
  ]  # fmt: skip
  for r, c, b in itertools.product(range(1, 6), range(1, 6), range(1, 7)):
    cells = sorted(zip(*(a.tolist() for a in l2.band_snake(np.arange(r * c), r, c, b))))
    assert cells == list(itertools.product(range(r), range(c)))


def test_a_persistent_grid_gives_slot_s_the_programs_s_plus_multiples_of_the_slots():
  def run(persistent: bool) -> list[int]:
    started = []

    def phases_of(i):
      started.append(i)
      return [[(("x", i, s), 1)] for s in range(3 if i == 0 else 1)]  # program 0 runs 3 phases

    assert l2.replay(5, phases_of, 2, persistent, l2_bytes=100) == 7
    return started

  assert run(persistent=True) == [0, 1, 3, 2, 4]  # slot 0 owns 0, 2, 4 and is busy with 0 for 3 phases
  assert run(persistent=False) == [0, 1, 2, 3, 4]  # a freed slot takes the next program


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_an_l2_that_holds_everything_fetches_each_byte_once(op):
  """Cache entries are exact to the row: group-start tiles that start mid-block and read on into
  the next group share rows with their neighbours instead of fetching them again."""
  p = dataclasses.replace(TINY, op=op)
  kernels = (l2.mosaic_v1(p), l2.mosaic_v2(p), l2.triton_kernel(p, l2.default_for(p, "hopper")))
  for kern in kernels + (l2.tcgen05(p), l2.tcgen05(p, pair=True)):
    t = l2.simulate(p, kern, sms=8, l2_bytes=10**12)
    assert t.fetched == t.unique, kern.name
    small = l2.simulate(p, kern, sms=8, l2_bytes=64 * 1024)
    assert small.fetched > small.unique, kern.name


def test_v2_walks_group_start_tiles_in_group_major_bands():
  kern = l2.mosaic_v2(TINY)
  sizes = TINY.group_sizes()
  row_start, group, col = l2.gmm_cells(TINY, kern, sizes)
  starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  assert list(group) == sorted(group), "groups in row order"
  first = starts // l2.ROW_TILE * l2.ROW_TILE  # on TMA's 8-row boxes
  assert all(row_start[group == g].min() == first[g] for g in range(TINY.g)), "a group's first tile at its first row"
  ncol = -(-TINY.n // kern.block_n)
  assert len(col) == l2.tile_waste(sizes, TINY.m, kern.block_m).boxed * ncol


def test_tile_waste_counts_aligned_and_group_start_tiles():
  w = l2.tile_waste(np.array([70, 60, 126]), 256, 64)
  # aligned: [0,70) blocks 0-1, [70,130) blocks 1-2, [130,256) blocks 2-3; group-start: 2 + 1 + 2
  assert (w.aligned, w.group_start, w.ideal) == (6, 5, 4.0)
  assert w.boxed == 6  # the middle group's tiles start at row 64, not 70: its 60 rows span 66, 2 tiles
  assert (w.extra_pct(w.aligned), w.extra_pct(w.group_start)) == (50.0, 25.0)


def test_a_cta_pair_fetches_the_weights_once_per_256_rows():
  """One group of 512 rows, one k step and one column block, through an L2 that keeps nothing:
  one CTA a cell runs 4 cells of 128 rows and fetches the [64, 256] weight tile 4 times, a CTA
  pair 2 cells of 256 rows and fetches it twice; both fetch each lhs row once."""
  p = l2.Problem("one group", "fwd", 512, 64, 256, 1)
  lhs, rhs, out = 512 * 64 * 2, 64 * 256 * 2, 512 * 256 * 2
  one, pair = l2.tcgen05(p), l2.tcgen05(p, pair=True)
  assert (one.block_m, one.ctas, pair.block_m, pair.ctas) == (128, 1, 256, 2)
  for kern, cells in ((one, 4), (pair, 2)):
    for sms in (148, 1):  # one SM still runs a pair's cells (a grid of max(1, sms // 2) pairs)
      t = l2.simulate(p, kern, sms=sms, l2_bytes=1)
      assert (t.cells, t.fetched, t.unique) == (cells, lhs + cells * rhs + out, lhs + rhs + out), kern.name


def test_a_256_row_cell_doubles_the_waste_of_groups_under_128_rows():
  w128, w256 = (l2.tile_waste(np.array([70, 60, 126]), 256, bm) for bm in (128, 256))
  # On 8-row boxes the groups take rows [0,70), [64,130), [128,256): one tile each at either size.
  assert (w128.boxed, w256.boxed) == (3, 3)
  assert (w128.extra_pct(w128.boxed), w256.extra_pct(w256.boxed)) == (50.0, 200.0)


def test_the_model_bounds_each_kernel_and_counts_smem_per_warpgroup():
  preds = {d.kernel.name: gemm_model.predict(TINY, d, fill_s=1e-6) for d in gemm_model.designs(TINY)}
  assert set(preds) == {"mosaic v2", "mosaic v1", "triton", "tokamax mosaic", "tokamax triton"}
  useful = 2.0 * TINY.m * TINY.k * TINY.n
  for r in preds.values():
    assert r.time_s >= max(r.hbm_s, r.mma_s + r.overhead_s) - 1e-12
    assert r.tflops * 1e12 * r.time_s == pytest.approx(useful)
    assert r.tflops <= gemm_model.PEAK_FLOPS / 1e12 / (1 + r.waste_pct / 100) + 1e-9
  # One 64x64 warpgroup reads (64 + 64) / 64^2 bytes of smem per MMA; a 64x256 one (64 + 256) / (64 * 256).
  assert preds["tokamax mosaic"].smem_pct / preds["mosaic v2"].smem_pct == pytest.approx(1.6)
  assert preds["mosaic v2"].overhead_s == 0 < preds["mosaic v1"].overhead_s


def test_the_model_says_it_is_a_model(capsys, monkeypatch):
  monkeypatch.setattr(gemm_model, "ANCHORS", [TINY])
  assert gemm_model.main([]) == 0
  out = capsys.readouterr().out
  assert "a model, not a measurement" in out
  assert sum(line.startswith("| tiny ") for line in out.splitlines()) == 5


def test_the_b200_model_reads_less_smem_with_a_cta_pair(capsys, monkeypatch):
  b200 = gemm_model.B200
  preds = {
    d.kernel.name: gemm_model.predict(TINY, d, fill_s=1e-6, gpu=b200) for d in gemm_model.blackwell_designs(TINY)
  }
  assert set(preds) == {"tcgen05", "tcgen05 pair"}
  useful = 2.0 * TINY.m * TINY.k * TINY.n
  for r in preds.values():
    assert r.overhead_s == 0 and r.time_s >= max(r.hbm_s, r.mma_s) - 1e-12
    assert r.tflops * 1e12 * r.time_s == pytest.approx(useful)
    assert r.tflops <= b200.peak_flops / 1e12 / (1 + r.waste_pct / 100) + 1e-9
  # Per unit of k at 8192 FLOP/clk: one CTA's 128x256 MMA reads (128 + 256) x 2 B in 8 clocks, 96
  # of the port's 128 B/clk; in a pair each SM reads its 128 rows and 128 of the 256 columns.
  assert (preds["tcgen05"].smem_pct, preds["tcgen05 pair"].smem_pct) == (pytest.approx(75.0), pytest.approx(50.0))
  monkeypatch.setattr(gemm_model, "ANCHORS", [TINY])
  assert gemm_model.main(["--device", "b200"]) == 0
  out = capsys.readouterr().out
  assert "a model, not a measurement" in out and "B200" in out
  assert sum(line.startswith("| tiny ") for line in out.splitlines()) == 2


def test_the_block128_model_times_promotion_by_phase_and_hides_the_first_block_of_a_pair(capsys, monkeypatch):
  """Two 64x128 consumers: one consumer's k block is T = 256 clocks of fp8 MMA (2 x 64 x 128 x
  128 FLOP at 8192 a clock), its promotion F = 64 FMA clocks plus the latency L. In phase, the
  serial kernel takes 2 T + 2 F + L a block, the overlapped one (256-deep steps) hides the
  first block's promotion under the second's wgmmas: 2 T + (2 F + L) / 2. Staggered, each
  consumer's promotion hides under the other's step until it outlasts it."""
  p = dataclasses.replace(TINY, k=1024)
  fp8, serial, tri, bf16 = gemm_model.block128_designs(p)
  assert (fp8.kernel.name, fp8.wg_rows, fp8.wg_cols, fp8.promoted, fp8.overlapped) == (
    "mosaic b128",
    64,
    128,
    True,
    True,
  )
  assert (serial.kernel.name, serial.kernel.block_k, serial.overlapped) == ("b128 serial", 128, False)
  assert not tri.promoted and tri.rate == 1 and bf16.dtype == "bfloat16"

  def mma(d, latency=0.0, phase="in-phase"):
    return gemm_model.predict(p, d, fill_s=1e-6, promote_latency_clk=latency, phase=phase).mma_s

  # 8192 FLOP a clock is the peak rounded: 989.4 TF/s x 2 / 132 SMs / 1.83 GHz
  no_promotion = mma(dataclasses.replace(fp8, promoted=False))
  assert mma(serial) == pytest.approx(no_promotion * (512 + 128) / 512, rel=1e-3)
  assert mma(fp8) == pytest.approx(no_promotion * (512 + 64) / 512, rel=1e-3)
  assert mma(serial, 100) / mma(serial) == pytest.approx((640 + 100) / 640, rel=1e-3)
  assert mma(fp8, 100) / mma(fp8) == pytest.approx((576 + 50) / 576, rel=1e-3)
  assert mma(serial, 0, "staggered") == pytest.approx(mma(serial, 191, "staggered")) == pytest.approx(no_promotion)
  assert mma(serial, 192 + 256, "staggered") == pytest.approx(no_promotion * 1.5, rel=1e-3)
  assert mma(fp8, 447, "staggered") == pytest.approx(no_promotion)  # T + (F + L) / 2 <= 2 T up to L = 448
  assert mma(fp8, 449, "staggered") > no_promotion * 1.0005
  assert mma(fp8, 2 * (512 - 32), "staggered") == pytest.approx(no_promotion * 1.5, rel=1e-3)
  with pytest.raises(ValueError, match="phase"):
    mma(fp8, phase="sideways")
  assert gemm_model.predict(p, fp8, fill_s=1e-6).tflops > gemm_model.predict(p, bf16, fill_s=1e-6).tflops
  monkeypatch.setattr(gemm_model, "ANCHORS", [TINY])
  assert gemm_model.main(["--dtype", "float8_e4m3fn:block128"]) == 0
  out = capsys.readouterr().out
  assert "a model, not a measurement" in out and sum(line.startswith("| tiny ") for line in out.splitlines()) == 4


tile_waste = _load("tile_waste")


def _narrow_by_hand(sizes, block_m=128):
  """Rows a 128-row gmm computes with narrow_tail, from the sizes alone: each group's tiles start
  at its first row rounded down to 8, and a last tile of 64 rows or fewer computes 64."""
  rows, start = 0, 0
  for size in sizes:
    if size:
      span = size + start % 8
      tiles = -(-span // block_m)
      rows += (tiles - 1) * block_m + (64 if span - (tiles - 1) * block_m <= 64 else block_m)
    start += size
  return rows


@pytest.mark.parametrize("m, g, seed", [(8192, 8, 0), (4096, 64, 1), (1000, 13, 2)])
def test_tile_waste_counts_the_rows_the_kernel_computes(m, g, seed):
  """tile_waste runs gmm.py's own schedule and per-tile rule; the same count from the sizes by
  hand, and without narrow_tail every tile's 128 rows (common.row_tiles on 8-row boxes)."""
  sizes = tile_waste.draw(m, g, seed)
  cfg = l2.mosaic.MosaicConfig(128, 256, 64, narrow_tail=True)
  assert tile_waste.mosaic_gpu_rows(sizes, m, cfg) == _narrow_by_hand(sizes.tolist())
  off = dataclasses.replace(cfg, narrow_tail=False)
  assert tile_waste.mosaic_gpu_rows(sizes, m, off) == tile_waste.tiled_rows(sizes, m, 128, 8)
  # A config it does not apply to (halves of 32 columns) computes whole tiles.
  bn64 = l2.mosaic.MosaicConfig(128, 64, 64, narrow_tail=True)
  assert tile_waste.mosaic_gpu_rows(sizes, m, bn64) == tile_waste.tiled_rows(sizes, m, 128, 8)


def test_narrow_tail_meets_the_tile_waste_targets_on_the_anchors():
  """Rows computed / rows stored on multinomial routing (seed 0), the H100 default: DeepSeek-V3
  (256 experts) <= 1.08 where 128-row cells took 1.137; Mixtral <= 1.04 where they took 1.069."""
  for m, k, n, g, target, before in ((131072, 7168, 2048, 256, 1.08, 1.13), (8192, 4096, 14336, 8, 1.04, 1.06)):
    by = {(c.kernel, c.ops): c for c in tile_waste.counts(m, k, n, g, seeds=1)}
    now, old = by["mosaic_gpu", "fwd, dlhs"], by["mosaic_gpu (before)", "fwd, dlhs"]
    assert now.ratio <= target < before <= old.ratio, by


def test_the_model_prices_narrow_cells_at_their_rows():
  v2 = gemm_model.designs(TINY)[0]
  assert v2.kernel.name == "mosaic v2" and v2.narrow_tail
  on = gemm_model.predict(TINY, v2, fill_s=1e-6)
  off = gemm_model.predict(TINY, dataclasses.replace(v2, narrow_tail=False), fill_s=1e-6)
  assert on.narrow > 0 == off.narrow and on.cells == off.cells
  cell_share = on.narrow / on.cells * 64 / 128  # of the MMA work, what the narrow cells save
  assert on.waste_pct == pytest.approx(off.waste_pct - 100 * cell_share * (1 + off.waste_pct / 100), rel=1e-9)
  assert on.time_s <= off.time_s and 0 < on.of_dense <= 1.0 + 1e-9
