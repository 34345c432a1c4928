"""sweep -> verify -> export-lut -> kernels.load_lut -> ragged_dot, plus resume, bad candidates, merging."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import entry_config, entry_pick, selected_config
from typer.testing import CliRunner

import kernels
from ragtune import provenance, stop
from ragtune.cli.app import app
from ragtune.device import ceilings
from ragtune.lut import export
from ragtune.problems import shapes
from ragtune.records import store
from ragtune.run import pool, resume, sweep

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
TINY = """
ops: [fwd, drhs]
backends: [pallas_gpu]
max_candidates: 2
shapes:
  - {m: 48, k: 32, n: 40, g: 3}
"""


def _ops_where_xla_wins(rows):
  """Ops whose XLA baseline beat every passing kernel config; export-lut gives each an xla entry.
  On a CPU which side wins depends on jax and the host (jax 0.11's interpreter beats XLA on
  some tiny problems), so the rows decide."""
  ok = [r for r in rows if r.ok]
  wins = set()
  for op in {r.problem.op for r in ok}:
    xla = min(r.time_s for r in ok if r.problem.op == op and r.baseline == "xla")
    kernel = min(r.time_s for r in ok if r.problem.op == op and not r.baseline)
    if xla < kernel:
      wins.add(op)
  return wins


def test_whole_pipeline_reaches_ragged_dot(tmp_path):
  spec = tmp_path / "tiny.yaml"
  spec.write_text(TINY)
  out, luts = tmp_path / "results", tmp_path / "luts"
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  assert "sweep summary" in r.output and "interpret mode" in r.output
  rows = store.ResultsStore(out).rows()
  assert {r.candidate for r in rows} >= {"baseline:xla", "baseline:dense"}
  assert all(r.status == "ok" for r in rows), [r.error for r in rows]
  made_with = provenance.for_device(jax.devices()[0])  # what the workers read (on a CPU: the host part)
  assert all(r.versions == made_with and r.jax_version == made_with.jax == jax.__version__ for r in rows)
  assert made_with.ragtune and made_with.jaxlib
  xla_wins = _ops_where_xla_wins(rows)
  expected = sorted([(op, "pallas_gpu") for op in ("fwd", "drhs")] + [(op, "xla") for op in xla_wins])

  r = runner.invoke(app, ["verify", str(out), "--full"])
  assert r.exit_code == 0, r.output
  # Each kernel's entry, and an xla entry where XLA beat the (interpreted) kernel.
  assert (
    f"{len(expected)} passed, 0 failed" in r.output
    and "NumericsResult(PASS)" in r.output
    and "regions (2x2)" in r.output
  )

  r = runner.invoke(app, ["export-lut", str(out), "-o", str(luts), "--format", "python"])
  assert r.exit_code == 0, r.output
  lut_file = luts / f"{kernels.device_slug(kernels.lut.current_device_kind())}.json"
  data = json.loads(lut_file.read_text())
  assert data["schema"] == "ragtune-lut"
  assert data["exported_with"] == provenance.host().to_dict() and data["tuned_with"] == made_with.to_dict()
  assert not any("versions" in e for e in data["entries"]), "one jax: nothing per entry"
  assert sorted((e["op"], e["backend"]) for e in data["entries"]) == expected
  fwd = next(e for e in data["entries"] if e["op"] == "fwd" and e["backend"] == "pallas_gpu")
  assert fwd["baselines"]["xla_s"] > 0 and fwd["speedup_vs_xla"] > 0

  lut = kernels.load_lut(luts)
  chosen = selected_config("fwd", "pallas_gpu", 48, 32, 40, 3, jnp.bfloat16)
  assert chosen == kernels.registry.config_from_dict("pallas_gpu", fwd["config"])
  assert chosen == entry_config(lut.query("fwd", 48, 32, 40, 3, "bfloat16", backend="pallas_gpu"))
  assert entry_pick(lut.query("fwd", 48, 32, 40, 3, "bfloat16")) == (
    ("xla", None) if "fwd" in xla_wins else ("pallas_gpu", chosen)
  )
  jaxpr = str(
    jax.make_jaxpr(lambda a, b, g: kernels.ragged_dot(a, b, g, backend="pallas_gpu"))(
      jnp.ones((48, 32), jnp.bfloat16), jnp.ones((3, 32, 40), jnp.bfloat16), jnp.array([10, 20, 18], jnp.int32)
    )
  )
  assert f"num_warps={chosen.num_warps}" in jaxpr and f"num_stages={chosen.num_stages}" in jaxpr

  # The python-format LUT works with kernels alone.
  py = subprocess.run(
    [
      sys.executable,
      "-c",
      f"import sys; sys.path.insert(0, {str(luts)!r}); import {lut_file.stem.replace('-', '_')} as m; "
      "print(len(m.load()))",
    ],
    capture_output=True,
    text=True,
    cwd=ROOT,
  )
  assert py.returncode == 0 and py.stdout.strip() == str(len(expected)), py.stderr

  r = runner.invoke(app, ["show", str(out), "--csv", str(tmp_path / "best.csv")])
  assert r.exit_code == 0 and (tmp_path / "best.csv").exists()


def _problems(text, tmp_path):
  spec = tmp_path / "s.yaml"
  spec.write_text(text)
  return shapes.expand(shapes.load_shape_set(spec))


RESUME = """
ops: [fwd, dlhs, drhs]
backends: [pallas_gpu]
max_candidates: 5
shapes:
  - {m: 40, k: 32, n: 32, g: 2}
"""


def test_resume_after_kill_loses_and_repeats_nothing(tmp_path):
  spec = tmp_path / "r.yaml"
  spec.write_text(RESUME)
  out = tmp_path / "res"
  records = out / "records.jsonl"
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(
    [sys.executable, "-m", "ragtune", "sweep", str(spec), "-o", str(out)],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 120
  while time.time() < deadline:
    if records.exists() and records.read_text().count("\n") >= 4:
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  before = [json.loads(l) for l in records.read_text().splitlines() if l.strip()]
  total = 3 * (2 + 5)
  assert 4 <= len(before) < total, "the sweep must be killed mid-run"

  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  assert f"resuming: skipping {len(before)} measurements already in the results file" in r.output
  after = store.ResultsStore(out).rows()
  ids = [row.id for row in after]
  assert len(ids) == len(set(ids)) == total
  assert [row.to_dict() for row in after[: len(before)]] == before, "finished rows are kept as they were"


def test_a_flagged_sweep_stopped_by_ctrl_c_resumes_exactly_from_the_bare_command(tmp_path, monkeypatch):
  """The user's report: pasting the old hint ran the file's whole plan. The line Ctrl-C leaves
  names every flag, and the bare command runs what is left of the flagged plan and no more."""
  spec, out = tmp_path / "r.yaml", tmp_path / "res"
  spec.write_text(RESUME.replace("  - {m: 40", "  - {m: 48, k: 32, n: 40, g: 3}\n  - {m: 40"))
  flags = ["--op", "fwd", "--shape", "40,32,32", "--max-candidates", "1", "--timeout", "60"]
  # Ctrl-C as the pool starts; then one row of the plan is recorded, as if measured before it.
  monkeypatch.setattr(pool.Pool, "run", lambda self, tasks: stop.handler(signal.SIGINT, None))
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), *flags])
  assert r.exit_code == 130, r.output
  (line,) = [line for line in r.output.splitlines() if line.startswith("interrupted:")]
  assert shlex.split(line.split("resume with: ")[1]) == ["ragtune", "sweep", str(spec), "-o", str(out), *flags]
  monkeypatch.undo()
  (p,) = shapes.select(_problems(RESUME, tmp_path), ops=["fwd"])
  first = store.make_row(p, "baseline:dense", None, "ok", interpret=True, device={"device_kind": "cpu"}, time_s=1e-3)
  store.ResultsStore(out).append(first)
  monkeypatch.setattr(ceilings, "missing", lambda *args: set())  # not this test's business; saves seconds

  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  assert f"with its options {shlex.join(flags)} ({out / resume.SWEEPS})" in r.output
  assert "resuming: skipping 1 measurement already in the results file" in r.output
  rows = store.ResultsStore(out).rows()
  assert rows[0] == first and len({row.id for row in rows}) == len(rows) == 2 + 1, "the flagged plan, not 2*3*(2+5)"
  assert {row.problem.key for row in rows} == {p.key}
  # Finished, it stays finished: the bare command has nothing to do; --defaults is the file's own plan.
  _assert_complete(spec, out, flags, rows)
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--defaults", "--dry-run"])
  assert r.exit_code == 0 and "6 problems, 39 measurements to do" in r.output, r.output


def _assert_complete(spec, out, flags, rows):
  """The bare command on a finished sweep: one line says it is complete and how to widen it,
  exit 0, and no worker starts (the pool would fail the test) nor is anything written."""
  stored = (out / resume.SWEEPS).read_text()
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(pool.Pool, "run", lambda self, tasks: pytest.fail("a worker started for a finished sweep"))
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  assert f"finished ({out / resume.SWEEPS})" in r.output and "complete: every row of the sweep of " in r.output
  assert f"with {shlex.join(flags)} is in {out / store.RECORDS}" in r.output
  assert r.output.rstrip().endswith(f"run the file's own plan: ragtune sweep {spec} -o {out} --defaults"), r.output
  assert store.ResultsStore(out).rows() == rows and (out / resume.SWEEPS).read_text() == stored


def test_a_finished_sweep_stays_finished(tmp_path, monkeypatch):
  """The user's report: a flagged sweep finished, and the bare command then planned the file's
  every op and candidate. Now it says the sweep is complete; a changed file is measured
  with the stored options, and options given run as given."""
  spec, out = tmp_path / "r.yaml", tmp_path / "res"
  spec.write_text(RESUME)
  monkeypatch.setattr(ceilings, "missing", lambda *args: set())  # not this test's business; saves seconds
  flags = ["--op", "fwd", "--max-candidates", "1"]
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), *flags])
  assert r.exit_code == 0, r.output
  rows = store.ResultsStore(out).rows()
  assert len(rows) == 1 + 2, "one candidate and two baselines"
  _assert_complete(spec, out, flags, rows)
  spec.write_text(RESUME + "  - {m: 24, k: 32, n: 32, g: 2}\n")
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--dry-run"])
  assert r.exit_code == 0 and "the file changed since: measuring what those options select in it now" in r.output
  assert "2 problems, 3 measurements to do" in r.output, r.output
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--op", "drhs", "--dry-run"])
  assert r.exit_code == 0 and "finished (" not in r.output and "2 problems, 14 measurements to do" in r.output, r.output


def test_options_given_run_as_given_and_a_changed_file_is_refused(tmp_path):
  spec, out = tmp_path / "r.yaml", tmp_path / "res"
  spec.write_text(RESUME)
  resume.save(out, spec, resume.SweepFlags(ops=("fwd",), max_candidates=1), finished=False)
  stored = (out / resume.SWEEPS).read_text()
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--max-candidates", "2", "--dry-run"])
  assert r.exit_code == 0, r.output
  assert "this command runs as given (--op fwd dropped, --max-candidates 1 -> --max-candidates 2)" in r.output
  assert "3 problems, 12 measurements to do" in r.output
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--dry-run"])
  assert "1 problem, 3 measurements to do" in r.output, "the bare command: the stored options"
  spec.write_text(RESUME.replace("m: 40", "m: 56"))
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 2, r.output
  (line,) = r.output.strip().splitlines()
  assert line.startswith(f"error: {spec} changed since the unfinished sweep in {out} began") and line.endswith(
    f"run: ragtune sweep {spec} -o {out} --op fwd --max-candidates 1"
  )
  assert (out / resume.SWEEPS).read_text() == stored and not (out / store.RECORDS).exists(), "nothing written"
  (out / resume.SWEEPS).write_text("{")
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 2 and r.output.startswith(f"error: {out / resume.SWEEPS}: unreadable stored sweep options")


def test_merging_folders_is_order_independent(tmp_path):
  problems = _problems(TINY, tmp_path)
  for name in ("a", "b"):
    sweep.run_sweep(problems, sweep.SweepOptions(out_dir=tmp_path / name, interpret=True, max_candidates=2))
  ab = export.build_luts(store.load_results([tmp_path / "a", tmp_path / "b"]))
  ba = export.build_luts(store.load_results([tmp_path / "b", tmp_path / "a"]))
  strip = lambda luts: {k: [e.to_dict() for e in v.entries()] for k, v in luts.items()}
  assert strip(ab) == strip(ba)
  (lut,) = ab.values()
  rows = store.load_results([tmp_path / "a", tmp_path / "b"])
  assert len(lut) == 2 + len(_ops_where_xla_wins(rows))  # each op's kernel, and xla where it won
