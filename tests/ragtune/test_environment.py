"""Failures of the environment stop a sweep before they are recorded; --retry-failed measures
again the rows older versions recorded for them."""

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from ragtune.candidates import search_space
from ragtune.cli.app import app
from ragtune.device import ceilings
from ragtune.problems import shapes
from ragtune.records import store
from ragtune.run import environment

runner = CliRunner()
TESTS = Path(__file__).resolve().parent
TINY = """
ops: [fwd]
backends: [{backend}]
max_candidates: 1
shapes:
  - {{m: 16, k: 16, n: 16, g: 2}}
"""
ABSL = "ModuleNotFoundError: No module named 'absl'"


def _errors(output: str) -> list[str]:
  return [line for line in output.splitlines() if line.startswith("error:")]


def test_errors_are_blamed_on_the_environment_or_the_candidate():
  assert environment.classify(ABSL) is not None
  assert "pip install -e '.[mosaic-gpu]'" in environment.classify(ABSL).fix
  assert environment.classify("ValueError: Only interpret mode is supported on CPU backend.") is not None
  assert environment.classify("ValueError: block_m=48 does not divide 96") is None
  assert environment.classify("") is None
  assert environment.retryable("compile_error", ABSL) and environment.retryable("timeout", "killed")
  assert not environment.retryable("compile_error", "ValueError: too much shared memory")
  assert not environment.retryable("wrong", "max abs error 3.0")


def test_a_missing_module_stops_the_sweep_before_any_row(tmp_path, monkeypatch):
  """The user's report: without absl every Mosaic candidate was recorded as compile_error and the
  sweep exited 0. The check before the first candidate imports the backend's kernel modules."""
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text(TINY.format(backend="mosaic_gpu"))
  real = environment._import_module

  def no_absl(name):
    if name.startswith("kernels.mosaic_gpu."):
      raise ModuleNotFoundError("No module named 'absl'", name="absl")
    return real(name)

  monkeypatch.setattr(environment, "_import_module", no_absl)
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 2, r.output
  (line,) = _errors(r.output)
  assert "No module named 'absl'" in line and "python3 -m pip install -e '.[mosaic-gpu]'" in line, line
  assert not (out / store.RECORDS).exists(), "no rows"


def test_a_missing_module_in_the_workers_stops_the_sweep_before_its_rows(tmp_path, monkeypatch):
  """The guard, where the check up front misses it: the first such row stops the sweep, unrecorded."""
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text(TINY.format(backend="pallas_gpu"))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
  monkeypatch.setattr(ceilings, "missing", lambda *args: set())
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--builder", "fault_builders:missing_module"])
  assert r.exit_code == 2, r.output
  (line,) = _errors(r.output)
  assert "No module named 'absl'" in line and "pip install -e '.[mosaic-gpu]'" in line, line
  rows = store.ResultsStore(out).rows() if (out / store.RECORDS).exists() else []
  assert all(row.baseline for row in rows), "no candidate's row"


def test_no_interpret_on_a_cpu_stops_at_once(tmp_path):
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text(TINY.format(backend="pallas_gpu"))
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--no-interpret"])
  assert r.exit_code == 2, r.output
  (line,) = _errors(r.output)
  assert "cannot compile on this platform" in line and "without --no-interpret" in line, line
  assert not (out / store.RECORDS).exists()


def test_retry_failed_measures_the_environments_rows_again(tmp_path, monkeypatch):
  """The user's report: after installing absl the same command said `complete ... nothing to do`."""
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text(TINY.format(backend="pallas_gpu"))
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  (c,) = search_space.candidates(p, 1)
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": "x"}
  old = [
    store.make_row(p, "baseline:xla", None, "ok", interpret=True, device=dev, time_s=1e-3),
    store.make_row(p, "baseline:dense", None, "ok", interpret=True, device=dev, time_s=1e-3),
    store.make_row(p, store.candidate_id(c), c, "compile_error", interpret=True, device=dev, error=ABSL),
  ]
  out.mkdir()
  (out / store.RECORDS).write_text("".join(json.dumps(row.to_dict()) + "\n" for row in old))
  monkeypatch.setattr(ceilings, "missing", lambda *args: set())
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0 and "complete:" in r.output, r.output
  assert f"once fixed, measure them again with: ragtune sweep {spec} -o {out} --retry-failed" in r.output
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--retry-failed"])
  assert r.exit_code == 0, r.output
  lines = (out / store.RECORDS).read_text().splitlines()
  assert len(lines) == 4, "the old rows stay in the append-only file; one new row"
  rows = store.load_results([out])
  assert len(rows) == 3 and next(row for row in rows if not row.baseline).status == "ok", "the latest record wins"
  assert "once fixed" not in r.output
