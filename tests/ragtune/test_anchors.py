"""benchmarks/anchors.py on a CPU host: shrunk shapes, the interpreted kernel beside XLA and
dense, a tuned row where a LUT differs from the default, and the target summary."""

import csv
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import jax
import pytest

import kernels

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU host's behaviour")


def _anchors():
  spec = importlib.util.spec_from_file_location("anchors", ROOT / "benchmarks" / "anchors.py")
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod  # its dataclass looks its module up while being defined
  spec.loader.exec_module(mod)
  return mod


def _lut_with(anchors, name, op, **changes):
  """A LUT for this host whose pallas_gpu entry at the shrunk anchor differs from the default."""
  m, k, n, g = anchors.anchor_shape(name, False, 1.0)
  kind = kernels.lut.current_device_kind()
  default = kernels.registry.default_config("pallas_gpu", op, "bfloat16", m, k, n, g, device_kind=kind)
  tuned = dataclasses.replace(default, **changes)
  return kernels.Lut(kind, [kernels.Entry(op, "pallas_gpu", "bfloat16", m, k, n, g, tuned)]), tuned


def test_anchor_run_writes_rows_and_targets(tmp_path, capsys):
  anchors = _anchors()
  lut, tuned = _lut_with(anchors, "dsv3-decode", "fwd", block_n=16)
  lut_file = tmp_path / f"{kernels.device_slug(lut.device_kind)}.json"
  lut_file.write_text(json.dumps(lut.to_dict()))
  out_csv = tmp_path / "anchors.csv"
  assert (
    anchors.main(
      ["--only", "dsv3-decode", "--ops", "fwd", "--lut", str(lut_file), "--samples", "3", "--csv", str(out_csv)]
    )
    == 0
  )
  out = capsys.readouterr().out
  assert "NOTE: CPU host" in out and "timer: wallclock-median" in out
  rows = list(csv.DictReader(out_csv.open()))
  variants = [r["variant"] for r in rows]
  assert variants == [
    "pallas_gpu default [interpret]",
    "pallas_gpu tuned [interpret]",
    "xla ragged_dot",
    "dense matmul, same FLOPs",
  ], variants
  assert all(r["status"] == "ok" and float(r["ms"]) > 0 for r in rows), rows
  assert rows[1]["config"] != rows[0]["config"] and "block_n=16" in rows[1]["config"]
  dense = rows[3]  # its GB/s counts one k x n matrix, not every expert's weights
  assert float(dense["gbps"]) * float(dense["ms"]) < float(rows[2]["gbps"]) * float(rows[2]["ms"])
  assert "dsv3-decode fwd:" in out and "% of copy bandwidth" in out
  assert "lowest speedup vs XLA" in out


def test_bad_anchor_name_is_one_error_line(capsys):
  assert _anchors().main(["--only", "mixtral"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: unknown anchor or op ['mixtral']") and err.count("\n") == 1


def test_summary_takes_the_best_kernel_per_problem_and_flags_failures():
  anchors = _anchors()
  R = anchors.Row
  rows = [
    R("mixtral-8x7b", "s", "fwd", "pallas_gpu default", "", ms=2.0, tflops=500.0, vs_xla=4.0),
    R("mixtral-8x7b", "s", "fwd", "mosaic_gpu default", "", ms=1.0, tflops=1000.0, vs_xla=8.0),
    R("mixtral-8x7b", "s", "fwd", "xla ragged_dot", "", ms=8.0, tflops=125.0, vs_xla=1.0),
    R("dsv3-up", "s", "fwd", "pallas_gpu default", "", ms=4.0, tflops=300.0, vs_xla=2.0),
    R("dsv3-down", "s", "fwd", "pallas_gpu default", "", status="wrong: max err 1.0"),
    R("dsv3-decode", "s", "fwd", "pallas_gpu default", "", ms=1.0, gbps=2000.0, pct_copy_bw=66.0, vs_xla=0.5),
  ]
  lines = anchors.target_summary(rows)
  assert lines[0].startswith("geomean speedup vs XLA over prefill problems: 4.00x")  # sqrt(8 * 2)
  assert lines[1].startswith("lowest speedup vs XLA: 0.50x on dsv3-decode fwd")
  assert lines[2].startswith("mixtral-8x7b fwd: 1000.0 TF/s with mosaic_gpu default")
  assert any(line.startswith("dsv3-decode fwd: 2000 GB/s = 66% of copy bandwidth") for line in lines)
  assert "dsv3-down fwd: no kernel variant passed the check" in lines


def test_anchor_shape_set_sweeps_exactly_the_benchmarked_problems():
  """shapes/anchors.yaml gives the tuned rows: same shapes, ops and group sizes as the benchmark."""
  from ragtune import shapes

  anchors = _anchors()
  problems = shapes.expand(shapes.load_shape_set(ROOT / "shapes" / "anchors.yaml"))
  swept = {(p.op, p.m, p.k, p.n, p.g, p.group_sizes) for p in problems}
  assert {p.backend for p in problems} == {"pallas_gpu", "mosaic_gpu"}
  benched = set()
  for m, k, n, g, _ in anchors.ANCHORS.values():
    sizes = tuple(int(s) for s in shapes.GroupDist(dist="multinomial", seed=0).draw(m, g))
    benched |= {(op, m, k, n, g, sizes) for op in kernels.common.OPS}
  assert swept == benched


def test_bytes_moved_skips_empty_experts_weights_but_drhs_writes_every_group():
  from ragtune import measure
  from ragtune.shapes import Problem

  sizes = (5, 0, 3)
  fwd = Problem("fwd", "pallas_gpu", "bfloat16", 8, 4, 6, 3, "explicit", sizes)
  assert measure.bytes_moved(fwd) == 2 * (2 * 4 * 6 + 8 * 4 + 8 * 6)  # 2 of 3 experts hold rows
  drhs = Problem("drhs", "pallas_gpu", "bfloat16", 8, 4, 6, 3, "explicit", sizes)
  assert measure.bytes_moved(drhs) == 2 * (8 * 4 + 8 * 6 + 3 * 4 * 6)
