"""No command overwrites a file it did not write (--force overrides), and a file of the wrong
kind gets an error about that file: each told from the file's content (ragtune.filekind)."""

import csv
import dataclasses
import json

import pytest
from test_report import _results
from typer.testing import CliRunner

from ragtune import paths
from ragtune.cli.app import app
from ragtune.errors import RagtuneError
from ragtune.filekind import Kind, classify
from ragtune.lut import bench
from ragtune.records import store

runner = CliRunner()
HAND_SHAPES = "# mine\nname: mine\nshapes:\n  - {m: 96, k: 64, n: 80, g: 4}\n"
HF_CONFIG = {
  "architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe",
  "hidden_size": 256,
  "moe_intermediate_size": 128,
  "num_experts": 8,
  "num_experts_per_tok": 2,
}


def _error(r) -> str:
  lines = [line for line in r.output.strip().splitlines() if line.strip()]
  assert r.exit_code == 2 and len(lines) == 1 and lines[-1].startswith("error: "), r.output
  return lines[-1]


@pytest.fixture
def res(tmp_path, monkeypatch):
  """A results folder with its LUT (fake-gpu-80gb.json), the cwd a bare folder."""
  monkeypatch.chdir(tmp_path)
  out, _, _ = _results(tmp_path)
  r = runner.invoke(app, ["export-lut", str(out)])
  assert r.exit_code == 0, r.output
  return out


def _refused(r, path, before: bytes, looks: str) -> None:
  line = _error(r)
  assert f"{path}: exists and {looks}" in line and "use --force to replace it" in line, line
  assert path.read_bytes() == before, "the file is intact"


def test_show_csv_refuses_the_records_file_and_a_readme(res, tmp_path):
  records = res / store.RECORDS
  for target, looks in ((records, "is a records file"), (tmp_path / "README.md", "is not a CSV written by")):
    if not target.exists():
      target.write_text("# My project\n\nHours of notes.\n")
    before = target.read_bytes()
    _refused(runner.invoke(app, ["show", str(res), "--csv", str(target)]), target, before, looks)
  assert runner.invoke(app, ["show", str(res)]).exit_code == 0, "the records still read"


def test_show_csv_replaces_its_own_csv_and_anything_with_force(res, tmp_path):
  csv = tmp_path / "best.csv"
  for args in ([], [], ["--all"]):  # the same command again, and its --all table
    r = runner.invoke(app, ["show", str(res), "--csv", str(csv), *args])
    assert r.exit_code == 0, r.output
  assert csv.read_text().startswith("op,backend,dtype,")
  readme = tmp_path / "README.md"
  readme.write_text("notes\n")
  r = runner.invoke(app, ["show", str(res), "--csv", str(readme), "--force"])
  assert r.exit_code == 0 and readme.read_text().startswith("op,backend"), r.output
  assert not list(tmp_path.glob(".*tmp*")), "written atomically"


def test_bench_csv_refuses_the_lut(res, tmp_path):
  lut = res / "fake-gpu-80gb.json"
  shapes = tmp_path / "s.yaml"
  shapes.write_text(HAND_SHAPES)
  before = lut.read_bytes()
  _refused(runner.invoke(app, ["bench", str(shapes), "--csv", str(lut)]), lut, before, "is a ragtune LUT")


def test_bench_csv_replaces_only_its_own_csv(tmp_path):
  own = tmp_path / "bench-smoke.csv"
  bench.write_csv(own, [])
  assert paths.output_file(own, "the --csv file", Kind.BENCH_CSV, force=False) == own
  other = tmp_path / "best.csv"
  other.write_text("op,backend,dtype,shape,best_ms\n")
  with pytest.raises(RagtuneError, match="use --force"):
    paths.output_file(other, "the --csv file", Kind.BENCH_CSV, force=False)
  assert paths.output_file(other, "the --csv file", Kind.BENCH_CSV, force=True) == other


def test_bench_csv_has_a_column_for_each_row_field(tmp_path):
  """filekind knows bench's CSV by its header; every field of a Row is a column of it, in order."""
  out = tmp_path / "bench.csv"
  bench.write_csv(out, [bench.Row("s", "[8,8]x[2,8,8]", "fwd", "bfloat16", "xla", ms=1.0)])
  header, row = list(csv.reader(out.open()))
  assert header == [f.name for f in dataclasses.fields(bench.Row)] and row[header.index("ms")] == "1.0"
  assert classify(out) == Kind.BENCH_CSV


def test_from_config_replaces_its_own_shape_file_only(tmp_path):
  config = tmp_path / "config.json"
  config.write_text(json.dumps(HF_CONFIG))
  out = tmp_path / "model.yaml"
  for _ in range(2):  # a rerun replaces its own file
    r = runner.invoke(app, ["shapes", "from-config", str(config), "-o", str(out)])
    assert r.exit_code == 0, r.output
  assert classify(out) == Kind.FROM_CONFIG
  hand = tmp_path / "smoke.yaml"
  hand.write_text(HAND_SHAPES)
  r = runner.invoke(app, ["shapes", "from-config", str(config), "-o", str(hand)])
  _refused(r, hand, HAND_SHAPES.encode(), "is a shape file, not a shape file written by")
  r = runner.invoke(app, ["shapes", "from-config", str(config), "-o", str(hand), "--force"])
  assert r.exit_code == 0 and classify(hand) == Kind.FROM_CONFIG, r.output


def test_export_lut_replaces_a_lut_but_no_other_file(res, tmp_path):
  lut = res / "fake-gpu-80gb.json"
  assert classify(lut) == Kind.LUT
  for fmt in ("json", "python", "python"):  # its own LUT and module, again
    r = runner.invoke(app, ["export-lut", str(res), "--format", fmt])
    assert r.exit_code == 0, r.output
  assert classify(res / "fake_gpu_80gb.py") == Kind.LUT_MODULE
  shapes = tmp_path / "shapes.json"
  shapes.write_text(json.dumps({"name": "x", "shapes": [{"m": 96, "k": 64, "n": 80, "g": 4}]}))
  before = shapes.read_bytes()
  _refused(runner.invoke(app, ["export-lut", str(res), "-o", str(shapes)]), shapes, before, "is a shape file")
  lut.write_text("my notes\n")  # a folder's <slug>.json that is no LUT: nothing at all is written
  (res / "fake_gpu_80gb.py").unlink()
  _refused(runner.invoke(app, ["export-lut", str(res), "--format", "python"]), lut, b"my notes\n", "is not a ragtune")
  assert not (res / "fake_gpu_80gb.py").exists()
  assert runner.invoke(app, ["export-lut", str(res), "--force"]).exit_code == 0
  assert classify(lut) == Kind.LUT


def test_report_defaults_to_report_in_the_results_folder_and_replaces_its_own(res, tmp_path):
  for _ in range(2):
    r = runner.invoke(app, ["report", str(res)])
    assert r.exit_code == 0, r.output
  rep = res / "report"
  assert {"best.csv", "rows.csv", "report.md"} <= {p.name for p in rep.iterdir()}
  assert not (tmp_path / "best.csv").exists(), "nothing in the current folder"
  assert classify(rep / "best.csv") == classify(rep / "rows.csv") == Kind.REPORT_CSV
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "report.md").write_text("# My report\n")
  _refused(runner.invoke(app, ["report", str(res), "-o", str(mine)]), mine / "report.md", b"# My report\n", "is not a")
  assert not (mine / "best.csv").exists(), "refused before anything was written"
  assert runner.invoke(app, ["report", str(res), "-o", str(mine), "--force"]).exit_code == 0
  assert classify(mine / "report.md") == Kind.REPORT_MD


def test_report_of_a_records_file_writes_beside_it(res):
  r = runner.invoke(app, ["report", str(res / store.RECORDS)])
  assert r.exit_code == 0 and (res / "report" / "report.md").is_file(), r.output


# --- the wrong kind of file ------------------------------------------------------------


def test_classify_tells_each_kind_from_its_content(res, tmp_path):
  config = tmp_path / "config.json"
  config.write_text(json.dumps(HF_CONFIG))
  hand = tmp_path / "anything.txt"  # the name says nothing
  hand.write_text(HAND_SHAPES)
  assert classify(res) == Kind.RESULTS
  assert classify(res / store.RECORDS) == Kind.RECORDS
  assert classify(res / "fake-gpu-80gb.json") == Kind.LUT
  assert classify(config) == Kind.HF_CONFIG
  assert classify(hand) == Kind.SHAPES
  assert classify(tmp_path / "none") == Kind.MISSING
  assert classify(tmp_path) == Kind.FOLDER


def test_export_lut_of_a_records_file_writes_the_lut_beside_it(res):
  (res / "fake-gpu-80gb.json").unlink()
  r = runner.invoke(app, ["export-lut", str(res / store.RECORDS)])
  assert r.exit_code == 0 and classify(res / "fake-gpu-80gb.json") == Kind.LUT, r.output


def test_verify_of_a_records_file_says_so(res):
  line = _error(runner.invoke(app, ["verify", str(res / store.RECORDS)]))
  assert f"{res / store.RECORDS}: is a records file" in line and "not a LUT file or a results folder" in line, line
  assert f"its results folder is {res}" in line


def test_sweep_of_a_lut_or_a_model_config_says_so(res, tmp_path):
  lut = res / "fake-gpu-80gb.json"
  line = _error(runner.invoke(app, ["sweep", str(lut), "-o", str(tmp_path / "out")]))
  assert line == f"error: {lut}: is a ragtune LUT, not a shape file", line
  config = tmp_path / "qwen.json"
  config.write_text(json.dumps(HF_CONFIG))
  line = _error(runner.invoke(app, ["sweep", str(config), "-o", str(tmp_path / "out")]))
  assert f"{config}: is a Hugging Face model config, not a shape file" in line
  assert f"`ragtune shapes from-config {config} -o FILE.yaml`" in line
  assert not (tmp_path / "out").exists()


def test_show_and_export_of_a_lut_or_a_shape_file_say_so(res, tmp_path):
  lut = res / "fake-gpu-80gb.json"
  shapes = tmp_path / "s.yaml"
  shapes.write_text(HAND_SHAPES)
  for cmd in ("show", "export-lut", "report"):
    line = _error(runner.invoke(app, [cmd, str(lut)]))
    assert line == f"error: {lut}: is a ragtune LUT, not a results folder or its records.jsonl", line
  line = _error(runner.invoke(app, ["show", str(shapes)]))
  assert line == f"error: {shapes}: is a shape file, not a results folder or its records.jsonl", line


def test_from_config_of_a_shape_file_or_a_lut_says_so(res, tmp_path):
  shapes = tmp_path / "s.yaml"
  shapes.write_text(HAND_SHAPES)
  for path, kind in ((shapes, "a shape file"), (res / "fake-gpu-80gb.json", "a ragtune LUT")):
    line = _error(runner.invoke(app, ["shapes", "from-config", str(path)]))
    assert line == f"error: {path}: is {kind}, not a model's config.json", line


def test_a_lut_past_the_first_64_kib_is_still_a_lut(res):
  lut = res / "fake-gpu-80gb.json"
  data = json.loads(lut.read_text())
  lut.write_text(json.dumps({**data, "note": "x" * 70_000}, indent=1))
  assert lut.stat().st_size > 70_000 and classify(lut) == Kind.LUT
  assert runner.invoke(app, ["export-lut", str(res)]).exit_code == 0, "export-lut replaces it"
