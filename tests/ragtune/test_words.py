"""What users read: counts in the right number, '-' where a table has no value, an output
named as the user knows it."""

import json

from typer.testing import CliRunner

from ragtune.cli.app import app
from ragtune.errors import RagtuneError
from ragtune.problems import shapes
from ragtune.problems.shapes import Problem
from ragtune.records import plots, store
from ragtune.words import count

runner = CliRunner()
DEV = {"device_kind": "cpu", "platform": "cpu", "jax_version": "0.0.1"}


def test_counts_take_the_plural_of_the_noun():
  assert [count(n, "problem") for n in (0, 1, 2)] == ["0 problems", "1 problem", "2 problems"]
  assert [count(n, "LUT entry") for n in (1, 3)] == ["1 LUT entry", "3 LUT entries"]
  assert count(2, "day") == "2 days" and count(2, "child", "children") == "2 children"


def test_no_lut_entry_matches_names_the_entries_in_the_plural():
  entries = [shapes.Problem("fwd", "pallas_gpu", "bfloat16", 16, 16, 16, 2, "x", (8, 8))] * 3
  try:
    shapes.select(entries, ops=["dlhs"], what="LUT entry")
  except RagtuneError as e:
    assert str(e) == "no LUT entry matches --op dlhs (of 3 LUT entries)"
  else:
    raise AssertionError("no error")


def _one_problem(tmp_path):
  """A results folder of one problem with one row: XLA's, timed; no candidate."""
  p = Problem("fwd", "pallas_gpu", "bfloat16", 32, 16, 16, 2, "multinomial(seed=0)", (16, 16))
  row = store.make_row(p, "baseline:xla", None, "ok", interpret=False, device=DEV, time_s=1e-3)
  out = tmp_path / "res"
  out.mkdir()
  (out / store.RECORDS).write_text(json.dumps(row.to_dict()) + "\n")
  return out


def test_show_prints_a_dash_where_there_is_no_value(tmp_path):
  r = runner.invoke(app, ["show", str(_one_problem(tmp_path))])
  assert r.exit_code == 0, r.output
  head, row = r.output.splitlines()[:2]
  assert "best_ms" in head and "xla_ms" in head
  assert "NaN" not in r.output and " - " in row, r.output


def test_report_counts_one_row_as_one(tmp_path, monkeypatch):
  def no_matplotlib():
    raise ImportError("not needed here")

  monkeypatch.setattr(plots, "_pyplot", no_matplotlib)
  out = _one_problem(tmp_path)
  r = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / "rep")])
  assert r.exit_code == 0, r.output
  assert f"wrote {tmp_path / 'rep' / 'best.csv'} (1 row)" in r.output, r.output


def test_bench_names_its_default_csv_as_such(tmp_path, monkeypatch):
  """No --csv given: the error does not speak of one."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.yaml").write_text("name: tiny\nops: [fwd]\nshapes:\n  - {m: 64, k: 32, n: 48, g: 4}\n")
  (tmp_path / "results").mkdir()
  (tmp_path / "results" / "cpu").write_text("a file where the results folder goes")
  r = runner.invoke(app, ["bench", "tiny.yaml"])
  assert r.exit_code == 2, r.output
  assert r.output.strip() == (
    "error: results/cpu/bench-tiny.csv: results/cpu is a file, so it cannot hold bench's default CSV"
  ), r.output
