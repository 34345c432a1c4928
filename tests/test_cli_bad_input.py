"""Bad input: one clear line naming the file (and key/line), exit != 0, no traceback, nothing written."""

import json

import pytest
from typer.testing import CliRunner

import kernels
from ragtune.cli import app

runner = CliRunner()
GOOD_SHAPE = "shapes:\n  - {m: 16, k: 16, n: 16, g: 2}\n"

YAML_CASES = {
    "malformed": ("shapes: [\n  {m: 1, k: 2\n", "malformed YAML"),
    "empty": ("", "empty shapes file"),
    "non_list_shapes": ("shapes: 5\n", ":1: shapes"),
    "unknown_key": ("dtype: bfloat16\nshapes:\n  - {m: 8, k: 8, n: 8, g: 2, foo: 1}\n", ":3: shapes[0].foo: unknown key"),
    "unknown_top_key": ("shape:\n  - {m: 8, k: 8, n: 8, g: 2}\n", "shape: unknown key"),
    "non_numeric_dim": ("shapes:\n  - {m: 8, k: abc, n: 8, g: 2}\n", ":2: shapes[0].k"),
    "non_positive_dim": ("shapes:\n  - m: 8\n    k: 8\n    n: 0\n    g: 2\n", ":4: shapes[0].n"),
    "unknown_dtype": ("dtype: int8\n" + GOOD_SHAPE, ":1: dtype"),
    "unknown_backend": ("backends: [cuda]\n" + GOOD_SHAPE, ":1: backends[0]"),
    "unknown_op": ("ops: [fwd, bwd]\n" + GOOD_SHAPE, ":1: ops[1]"),
    "sizes_exceed_m": ("shapes:\n  - {m: 10, k: 8, n: 8, g: 2, group_sizes: [6, 5]}\n", "sum to 11, more than m=10"),
    "python_tag": ("shapes: !!python/object/apply:os.system ['touch PWNED']\n", "unsupported YAML tag"),
    "unknown_model": ("models:\n  - {model: gpt-5, tokens: [1]}\n", "unknown model 'gpt-5'"),
    "nothing_to_tune": ("dtype: float32\n", "at least one entry"),
}


def _one_error_line(result):
  lines = [l for l in result.output.strip().splitlines() if l.strip()]
  assert len(lines) == 1, result.output
  assert lines[0].startswith("error: ")
  assert "Traceback" not in result.output
  return lines[0]


@pytest.mark.parametrize("case", list(YAML_CASES))
def test_bad_shapes_file(tmp_path, monkeypatch, case):
  monkeypatch.chdir(tmp_path)
  text, expected = YAML_CASES[case]
  path = tmp_path / "bad.yaml"
  path.write_text(text)
  result = runner.invoke(app, ["sweep", str(path), "-o", str(tmp_path / "out")])
  assert result.exit_code == 2
  line = _one_error_line(result)
  assert str(path) in line and expected in line, line
  assert not (tmp_path / "out").exists(), "no records may be written for bad input"
  assert not (tmp_path / "PWNED").exists()


def test_bad_cli_values(tmp_path):
  path = tmp_path / "ok.yaml"
  path.write_text(GOOD_SHAPE)
  result = runner.invoke(app, ["sweep", str(path), "--backend", "cuda", "-o", str(tmp_path / "out")])
  assert result.exit_code == 2 and "unknown op/backend ['cuda']" in _one_error_line(result)
  assert not (tmp_path / "out").exists()


def test_missing_file_and_empty_results(tmp_path):
  r = runner.invoke(app, ["sweep", str(tmp_path / "nope.yaml")])
  assert r.exit_code == 2 and "no such shapes file" in _one_error_line(r)
  (tmp_path / "empty").mkdir()
  r = runner.invoke(app, ["export-lut", str(tmp_path / "empty")])
  assert r.exit_code == 2 and "no records.jsonl here" in _one_error_line(r)
  (tmp_path / "empty" / "records.jsonl").write_text("")
  r = runner.invoke(app, ["export-lut", str(tmp_path / "empty")])
  assert r.exit_code == 2 and "results file is empty" in _one_error_line(r)


def _lut_text(kind, version=kernels.SCHEMA_VERSION):
  return json.dumps({"schema": "ragtune-lut", "schema_version": version, "device_kind": kind, "entries": [
      {"op": "fwd", "backend": "pallas_gpu", "dtype": "float32", "m": 16, "k": 16, "n": 16, "g": 2,
       "config": {"block_m": 16, "block_k": 16, "block_n": 16, "num_warps": 4, "num_stages": 2}}]})


@pytest.mark.parametrize("text,expected", [
    ("{corrupt", "invalid JSON"),
    (_lut_text(kernels.current_device_kind(), version=7), "schema_version 7 is not supported"),
    (_lut_text("NVIDIA H100 80GB HBM3"), "tuned on 'NVIDIA H100 80GB HBM3'"),
])
def test_verify_refuses_bad_luts(tmp_path, text, expected):
  path = tmp_path / "lut.json"
  path.write_text(text)
  r = runner.invoke(app, ["verify", str(path)])
  assert r.exit_code == 2
  line = _one_error_line(r)
  assert str(path) in line and expected in line


def test_help_has_examples():
  for cmd in ("sweep", "verify", "export-lut", "show", "report"):
    r = runner.invoke(app, [cmd, "--help"])
    assert r.exit_code == 0 and "Example: ragtune" in r.output
