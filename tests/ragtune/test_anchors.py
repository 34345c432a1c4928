"""benchmarks/anchors.py: `ragtune bench shapes/anchors.yaml` for the chosen anchors, then the
gap to our targets, read back from the bench's CSV."""

import csv
from pathlib import Path

import jax
import pytest
from conftest import load_benchmark

import kernels
from ragtune.lut import bench

ROOT = Path(__file__).resolve().parents[2]


def _anchors():
  return load_benchmark("anchors")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU host's behaviour")
def test_anchor_run_benches_only_the_chosen_anchor_and_op(tmp_path, capsys):
  out_csv = tmp_path / "anchors.csv"
  assert _anchors().main(["--only", "dsv3-decode", "--op", "fwd", "--samples", "3", "--csv", str(out_csv)]) == 0
  out = capsys.readouterr().out
  assert "none is timed" in out and "nothing timed (a CPU host times nothing)" in out
  rows = list(csv.DictReader(out_csv.open()))
  assert {(r["op"], r["shape"]) for r in rows} == {("fwd", "[32,224]x[8,224,64]")}  # dsv3-decode, shrunk
  assert all(r["status"] == "ok" for r in rows), rows


def test_bad_anchor_name_is_one_error_line(capsys):
  assert _anchors().main(["--only", "mixtral"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: unknown anchor ['mixtral']") and err.count("\n") == 1


def _row(anchor, variant, **numbers):
  m, k, n, g, _ = _anchors().ANCHORS[anchor]
  return bench.Row("s", f"[{m},{k}]x[{g},{k},{n}]", "fwd", "bfloat16", variant, **numbers)


def test_summary_takes_the_best_kernel_per_problem_and_flags_failures(tmp_path):
  anchors = _anchors()
  rows = [
    _row("mixtral-8x7b", "pallas_gpu default", ms=2.0, tflops=500.0, vs_xla=4.0),
    _row("mixtral-8x7b", "LUT: mosaic_gpu (exact)", ms=1.0, tflops=1000.0, vs_xla=8.0),
    _row("mixtral-8x7b", bench.XLA, ms=8.0, tflops=125.0, vs_xla=1.0),
    _row("dsv3-up", "pallas_gpu default", ms=4.0, tflops=300.0, vs_xla=2.0),
    _row("dsv3-down", "pallas_gpu default", status="wrong: max err 1.0"),
    _row("dsv3-decode", "pallas_gpu default", ms=1.0, gbps=2000.0, pct_copy_bw=66.0, vs_xla=0.5),
  ]
  bench.write_csv(tmp_path / "rows.csv", rows)  # the wrapper reads the bench's rows back from its CSV
  lines = anchors.target_summary(anchors.read_rows(tmp_path / "rows.csv"))
  assert lines[0].startswith("geomean speedup vs XLA over prefill problems: 4.00x")  # sqrt(8 * 2)
  assert lines[1].startswith("lowest speedup vs XLA: 0.50x on dsv3-decode fwd")
  assert lines[2].startswith("mixtral-8x7b fwd: 1000.0 TF/s with LUT: mosaic_gpu (exact)")
  assert any(line.startswith("dsv3-decode fwd: 2000 GB/s = 66% of copy bandwidth") for line in lines)
  assert "dsv3-down fwd: no kernel variant passed the check and was timed" in lines


def test_anchor_shape_set_sweeps_exactly_the_benchmarked_problems():
  """shapes/anchors.yaml is what the wrapper benches: same shapes, ops and group sizes as ANCHORS."""
  from ragtune.problems import shapes

  anchors = _anchors()
  problems = shapes.expand(shapes.load_shape_set(ROOT / "shapes" / "anchors.yaml"))
  swept = {(p.op, p.m, p.k, p.n, p.g, p.group_sizes) for p in problems}
  assert {p.backend for p in problems} == {"pallas_gpu", "mosaic_gpu", "mosaic_blackwell"}
  benched = set()
  for m, k, n, g, _ in anchors.ANCHORS.values():
    sizes = tuple(int(s) for s in shapes.GroupDist(dist="multinomial", seed=0).draw(m, g))
    benched |= {(op, m, k, n, g, sizes) for op in kernels.common.OPS}
  assert swept == benched


def test_bytes_moved_skips_empty_experts_weights_but_drhs_writes_every_group():
  from ragtune.device import measure
  from ragtune.problems.shapes import Problem

  sizes = (5, 0, 3)
  fwd = Problem("fwd", "pallas_gpu", "bfloat16", 8, 4, 6, 3, "explicit", sizes)
  assert measure.bytes_moved(fwd) == 2 * (2 * 4 * 6 + 8 * 4 + 8 * 6)  # 2 of 3 experts hold rows
  drhs = Problem("drhs", "pallas_gpu", "bfloat16", 8, 4, 6, 3, "explicit", sizes)
  assert measure.bytes_moved(drhs) == 2 * (8 * 4 + 8 * 6 + 3 * 4 * 6)
