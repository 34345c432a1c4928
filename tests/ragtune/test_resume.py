"""The command a sweep prints always finishes that sweep, whatever ran in the folder between;
an edited shapes file gets a command that works. Measured by a fake pool: every item ok."""

import shlex
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragtune import stop
from ragtune.cli.app import app
from ragtune.records import store
from ragtune.run import lock, pool, resume

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "shapes" / "smoke.yaml"


def _measure_all(self, tasks):
  """Pool.run without workers: every baseline and candidate is recorded ok at once."""
  for t in tasks:
    while t.pending:
      for cid, cfg in list(t.pending):
        row = store.make_row(
          t.p, cid, cfg, "ok", interpret=True, device={"device_kind": self.opts.device_kind}, time_s=1e-3
        )
        self._write(t, row)
      t.pending = t.next_batch()


def _ctrl_c(self, tasks):
  """Ctrl-C once the first problem's rows are written."""
  _measure_all(self, tasks[:1])
  stop.handler(signal.SIGINT, None)


def _printed_command(output: str) -> list[str]:
  (line,) = [line for line in output.splitlines() if line.startswith("interrupted:")]
  words = shlex.split(line.split("resume with: ")[1])
  assert words[:2] == ["ragtune", "sweep"]
  return words[1:]


def _sweep(mp, run, args):
  mp.setattr(pool.Pool, "run", run)
  return runner.invoke(app, args)


def test_the_printed_command_finishes_the_sweep_after_a_narrow_check(tmp_path, monkeypatch):
  """The user's sequence: Ctrl-C a sweep of smoke.yaml, a narrow check in the same folder, then
  the printed command said `complete ... nothing to do` with 17 of 36 rows done."""
  out = tmp_path / "D"
  r = _sweep(monkeypatch, _ctrl_c, ["sweep", str(SMOKE), "-o", str(out)])
  assert r.exit_code == 130, r.output
  printed = _printed_command(r.output)
  assert printed == ["sweep", str(SMOKE), "-o", str(out)]
  assert len(store.ResultsStore(out).rows()) == 6, "one problem of six"
  narrow = ["--op", "drhs", "--shape", "120,48,64", "--max-candidates", "1"]
  r = _sweep(monkeypatch, _measure_all, ["sweep", str(SMOKE), "-o", str(out), *narrow])
  assert r.exit_code == 0, r.output
  kept = f"keeps that one for: ragtune sweep {SMOKE} -o {out}"
  narrow_output = r.output
  r = _sweep(monkeypatch, _measure_all, printed)
  assert r.exit_code == 0 and "complete:" not in r.output, r.output
  assert len({row.id for row in store.ResultsStore(out).rows()}) == 36, "every row of the sweep"
  assert kept in narrow_output, "the narrow check says which sweep it leaves stored"
  # A complete sweep, with a per-host option, stores nothing: the folder's options stay the sweep's.
  stored = (out / resume.SWEEPS).read_text()
  r = _sweep(monkeypatch, lambda self, tasks: pytest.fail("nothing to do"), [*printed, "--devices", "1"])
  assert r.exit_code == 0 and "complete:" in r.output, r.output
  assert (out / resume.SWEEPS).read_text() == stored and '"devices": null' in stored


def test_the_command_suggested_for_an_edited_shapes_file_works(tmp_path, monkeypatch):
  """The user's loop: after Ctrl-C and a shape added, the error named the command that had just failed."""
  spec, out = tmp_path / "s.yaml", tmp_path / "D"
  spec.write_text(SMOKE.read_text())
  r = _sweep(monkeypatch, _ctrl_c, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 130, r.output
  done = store.ResultsStore(out).rows()
  spec.write_text(SMOKE.read_text() + "  - {m: 64, k: 32, n: 48, g: 2}\n")
  r = _sweep(monkeypatch, _measure_all, _printed_command(r.output))
  assert r.exit_code == 2, r.output
  (line,) = r.output.strip().splitlines()
  suggested = shlex.split(line.split("run: ")[-1])
  assert suggested[:2] == ["ragtune", "sweep"]
  r = _sweep(monkeypatch, _measure_all, suggested[1:])
  assert r.exit_code == 0, r.output
  rows = store.ResultsStore(out).rows()
  assert rows[: len(done)] == done and len({row.id for row in rows}) == 9 * 6, (
    "the rows done kept, the new shape's added"
  )
  r = _sweep(monkeypatch, lambda self, tasks: pytest.fail("nothing to do"), ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0 and "complete:" in r.output, r.output


def test_a_sweep_refused_by_the_lock_prints_no_plan(tmp_path):
  spec, out = tmp_path / "s.yaml", tmp_path / "D"
  spec.write_text(SMOKE.read_text())
  with lock.sweep_lock(out):
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 2, r.output
  assert "another sweep is writing here" in r.output
  assert "measurements to do" not in r.output and "problems from" not in r.output, r.output


def test_one_problem_is_one_problem(tmp_path, monkeypatch):
  spec, out = tmp_path / "s.yaml", tmp_path / "D"
  spec.write_text("ops: [fwd]\nbackends: [pallas_gpu]\nmax_candidates: 1\nshapes:\n  - {m: 24, k: 32, n: 32, g: 2}\n")
  r = _sweep(monkeypatch, _measure_all, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  assert f"1 problem from {spec}" in r.output and "1 problem, 3 measurements to do" in r.output, r.output
  assert "1 problems" not in r.output and "(1 worker," in r.output
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert "(1 problem); nothing to do" in r.output, r.output
