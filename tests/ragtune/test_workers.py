"""Worker processes: faults recorded and never exported, timeouts killed, Ctrl-C, the folder lock, devices."""

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragtune import stop
from ragtune.candidates import search_space
from ragtune.cli.app import app
from ragtune.device import ceilings
from ragtune.lut import export
from ragtune.problems import shapes
from ragtune.records import store, summary
from ragtune.run import lock, sweep

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
FAULTS = """
ops: [fwd]
backends: [pallas_gpu]
max_candidates: 7
shapes:
  - {m: 48, k: 32, n: 40, g: 3}
"""


def _env(**extra):
  env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
  return env


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_faulty_candidates_are_recorded_killed_and_never_exported(tmp_path):
  spec, out = tmp_path / "f.yaml", tmp_path / "res"
  spec.write_text(FAULTS)
  t0 = time.time()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "ragtune",
      "sweep",
      str(spec),
      "-o",
      str(out),
      "--builder",
      "fault_builders:build",
      "--timeout",
      "10",
    ],
    cwd=ROOT,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=150,
  )
  assert proc.returncode == 0, proc.stderr
  assert time.time() - t0 < 150, "the sweep ends once its summary is printed"
  rows = store.ResultsStore(out).rows()
  ids = [r.id for r in rows]
  assert len(ids) == len(set(ids)) == 2 + 7, "every baseline and candidate once"
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  cands = search_space.candidates(p, 7)
  by_cand = {r.candidate: r for r in rows}
  status = [by_cand[store.candidate_id(c)].status for c in cands]
  assert status == ["ok", "timeout", "crash", "wrong", "nan", "run_error", "ok"], status
  poisoned = by_cand[store.candidate_id(cands[5])]
  assert "ILLEGAL_ADDRESS" in poisoned.error
  assert by_cand[store.candidate_id(cands[6])].worker_pid != poisoned.worker_pid, (
    "after a fault that can poison a device context, a fresh worker takes over"
  )
  crash = by_cand[store.candidate_id(cands[2])]
  assert "SIGSEGV" in crash.error
  hung = by_cand[store.candidate_id(cands[1])]
  assert "10s" in hung.error and not _alive(hung.worker_pid), "a timed-out computation is stopped"
  # Rows after a fault come from a fresh worker; baselines and the first candidate share one.
  assert by_cand["baseline:xla"].worker_pid == by_cand[store.candidate_id(cands[0])].worker_pid
  assert by_cand[store.candidate_id(cands[3])].worker_pid != hung.worker_pid

  assert "ok=2" in proc.stdout and "crash=1" in proc.stdout and "timeout=1" in proc.stdout
  assert "done fwd pallas_gpu" in proc.stdout and "elapsed" in proc.stdout, "plain progress lines off a terminal"
  (lut,) = export.build_luts(store.load_results([out])).values()
  exported = [e.config for e in lut.entries() if e.backend == "pallas_gpu"]
  assert len(exported) == 1 and exported[0] in (cands[0], cands[6])
  # An xla entry (config {}) sits beside the kernel's where XLA beat every passing config; on a
  # CPU that depends on jax (0.11's interpreter is faster), so the recorded times decide.
  kernel_best = min(by_cand[store.candidate_id(c)].time_s for c in (cands[0], cands[6]))
  xla_won = by_cand["baseline:xla"].time_s < kernel_best
  assert [(e.backend, e.config) for e in lut.entries() if e.backend != "pallas_gpu"] == (
    [("xla", None)] if xla_won else []
  )

  # The device's ceilings were measured once, by a worker, and kept beside the records.
  xla = by_cand["baseline:xla"]
  device = {"device_kind": xla.device_kind, "jax_version": xla.jax_version}
  (entry,) = ceilings.load([out]).values()
  assert entry["matmul_tflops"]["bfloat16"] > 0 and entry["copy_gbps"] > 0
  assert ceilings.missing(out, device, ["bfloat16"]) == set() and ceilings.missing(out, device, ["float32"]) == {
    "float32"
  }


def test_no_passing_candidate_says_why(tmp_path):
  p = shapes.Problem("fwd", "pallas_gpu", "bfloat16", 48, 32, 40, 3, "x", (16, 16, 16))
  cands = search_space.candidates(p, 3)
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": "x"}
  rows = [
    store.make_row(p, store.candidate_id(c), c, s, interpret=True, device=dev)
    for c, s in zip(cands, ["timeout", "timeout", "crash"])
  ]
  (s,) = sweep.summarize([p], rows)
  assert s.best is None and s.why == "no correct candidate: 2 timeout, 1 crash"


def _sweep_cmd(spec, out, *flags):
  return [sys.executable, "-m", "ragtune", "sweep", str(spec), "-o", str(out), *flags]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_of_the_process_group_keeps_rows_says_how_to_resume_and_records_no_crash(tmp_path, monkeypatch, sig):
  """Ctrl-C in a terminal, and a batch scheduler's SIGTERM (SLURM's scancel, preemption or time
  limit; Kubernetes' pod deletion), reach every process of the group, the worker included. The
  candidate in flight is not recorded (once, SIGTERM recorded it as the worker's crash); the sweep
  exits 128 + the signal's number with the command that resumes it, which finishes the plan."""
  spec, out, held = tmp_path / "f.yaml", tmp_path / "res", tmp_path / "held"
  spec.write_text(FAULTS.replace("max_candidates: 7", "max_candidates: 2"))
  flags = ["--builder", "fault_builders:hold", "--timeout", "60"]
  proc = subprocess.Popen(
    _sweep_cmd(spec, out, *flags),
    cwd=ROOT,
    env=_env(FAULT_HOLD=str(held)),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,  # its own process group, as a job's
  )
  deadline = time.time() + 300
  while not held.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.1)  # the baselines and candidate [0] are recorded; candidate [1] is in flight
  assert held.exists(), proc.communicate(timeout=60)
  os.killpg(proc.pid, sig)
  t0 = time.time()
  _, err = proc.communicate(timeout=120)
  assert time.time() - t0 < 30, "stopped at once, not after the candidate's 60 s timeout"
  assert proc.returncode == 128 + sig and "resume" in err, err
  resume = next(l for l in err.splitlines() if l.startswith("interrupted:")).split("resume with: ")[1]
  assert shlex.split(resume)[-4:] == ["--timeout", "60", "--builder", "fault_builders:hold"], "every flag given"
  assert "Traceback" not in err and "RuntimeError" not in err, err
  rows = store.ResultsStore(out).rows()
  assert [r.status for r in rows] == ["ok"] * 3, [(r.candidate, r.status, r.error) for r in rows]
  assert not _alive(rows[-1].worker_pid), "no worker left behind"
  assert not (out / lock.HOLDER).exists()
  if sig == signal.SIGINT:
    return
  # The printed command, run again (nothing hangs now), measures the rest, each once.
  words = shlex.split(resume)
  assert words[:2] == ["ragtune", "sweep"]
  monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])  # the workers import fault_builders
  monkeypatch.syspath_prepend(str(TESTS))  # and so does the sweep, to check the --builder
  r = runner.invoke(app, words[1:])
  assert r.exit_code == 0, r.output
  lines = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
  assert len(lines) == len({l["id"] for l in lines}) == 4, "two baselines and two candidates, each once"
  assert all(l["status"] == "ok" for l in lines), [(l["candidate"], l["status"], l["error"]) for l in lines]


def test_second_sweep_into_a_locked_folder_stops_at_once_naming_the_holder(tmp_path):
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text("backends: [xla]\nshapes:\n  - {m: 16, k: 16, n: 16, g: 2}\n")
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from ragtune.run.lock import sweep_lock\n"
      f"with sweep_lock({str(out)!r}):\n  print('held', flush=True); time.sleep(60)",
    ],
    cwd=ROOT,
    env=_env(),
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    t0 = time.time()
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
    assert r.exit_code == 2 and time.time() - t0 < 10
    lines = [l for l in r.output.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and "--wait" in lines[0], r.output
    assert not (out / store.RECORDS).exists(), "nothing written"
    # --wait waits for the holder; once it is gone (even killed) the lock is free again.
    threading.Timer(1.0, holder.kill).start()
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--wait"])
    assert r.exit_code == 0 and "waiting for the sweep" in r.output and f"pid {holder.pid}" in r.output, r.output
    assert len(store.ResultsStore(out).rows()) == 2
  finally:
    holder.kill()
    holder.wait()


def test_sweep_wait_prints_its_plan_once_it_holds_the_folder(tmp_path, monkeypatch):
  """While it waits, the sweep that holds the folder records rows; the plan printed counts
  them: it is printed under the lock, not before the wait."""
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text("backends: [xla]\nshapes:\n  - {m: 16, k: 16, n: 16, g: 2}\n")
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": "x"}
  rows = [
    store.make_row(p, b, None, "ok", interpret=False, device=dev, time_s=1e-3)
    for b in ("baseline:xla", "baseline:dense")
  ]
  holding, waiting = threading.Event(), threading.Event()
  holder_text = lock._holder
  monkeypatch.setattr(lock, "_holder", lambda d: (waiting.set(), holder_text(d))[1])  # said just before it waits

  def other_sweep():
    with lock.sweep_lock(out):
      holding.set()
      assert waiting.wait(120), "the sweep never waited"
      for row in rows:
        store.ResultsStore(out).append(row)

  other = threading.Thread(target=other_sweep)
  other.start()
  try:
    assert holding.wait(30)
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--wait"])
  finally:
    waiting.set()
    other.join()
  assert r.exit_code == 0, r.output
  lines = r.output.splitlines()
  wait_line = next(i for i, l in enumerate(lines) if l.startswith("waiting for the sweep"))
  plan_line = next(i for i, l in enumerate(lines) if "measurements to do" in l)
  assert (
    wait_line < plan_line
    and lines[plan_line] == "1 problem, 0 measurements to do (candidates and the 2 baselines per problem)"
  ), r.output
  assert len(store.ResultsStore(out).rows()) == 2, "nothing measured twice"


def test_duplicate_ids_are_read_once_the_latest_winning(tmp_path):
  """An id met twice (a row measured again by sweep --retry-failed): its latest record counts."""
  p = shapes.Problem("fwd", "pallas_gpu", "bfloat16", 48, 32, 40, 3, "x", (16, 16, 16))
  (c,) = search_space.candidates(p, 1)
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": "x"}
  first = store.make_row(p, store.candidate_id(c), c, "ok", interpret=True, device=dev, time_s=1e-3)
  second = dataclasses.replace(first, time_s=5e-4)
  (tmp_path / store.RECORDS).write_text(json.dumps(first.to_dict()) + "\n" + json.dumps(second.to_dict()) + "\n")
  rows = store.load_results([tmp_path])
  assert len(rows) == 1 and rows[0].time_s == 5e-4
  r = runner.invoke(app, ["show", str(tmp_path), "--all"])
  assert r.exit_code == 0 and r.output.count(" ok ") == 1, r.output


def test_two_devices_cover_every_problem_once_within_the_budget(tmp_path):
  spec, out = tmp_path / "d.yaml", tmp_path / "res"
  spec.write_text(
    "ops: [fwd]\nbackends: [pallas_gpu]\nmax_candidates: 1\nshapes:\n"
    "  - {m: 32, k: 32, n: 32, g: 2}\n  - {m: 48, k: 32, n: 32, g: 3}\n  - {m: 40, k: 32, n: 32, g: 2}\n"
  )
  problems = shapes.expand(shapes.load_shape_set(spec))
  opts = sweep.SweepOptions(out_dir=out, interpret=True, budget=2, devices=(0, 1), ceilings=False)
  sweep.run_sweep(problems, opts)
  rows = store.ResultsStore(out).rows()
  ids = [r.id for r in rows]
  assert len(ids) == len(set(ids)) == 3 * (2 + 2), "baselines + a budget of 2 candidates, once each"
  assert {r.problem.key for r in rows} == {p.key for p in problems}
  assert {r.device_index for r in rows} == {0, 1}, "both workers took problems"
  for p in problems:  # one problem's baselines and candidates come from one worker
    assert len({r.worker_pid for r in rows if r.problem.key == p.key}) == 1


def test_the_live_bar_keeps_elapsed_and_eta_whole_at_100_columns():
  """A long problem label and best text are cut with an ellipsis; the times never are."""
  from rich.console import Console
  from rich.progress import Progress

  from ragtune.run import progress

  p = shapes.Problem("dlhs", "mosaic_blackwell", "float8_e4m3fn:block128", 8192, 7168, 2048, 256, "x", (32,) * 256)
  for width, best in ((100, True), (100, False), (80, True)):
    term = Console(width=width, force_terminal=True, color_system=None, record=True)
    bar = Progress(*progress.bar_columns(best=best), console=term, auto_refresh=False)
    rp = progress.RichProgress(bar, term)
    rp.start(822, 0)
    rp.problem(p)
    bar.update(rp.task, advance=5, best="best 1.234 ms (123.4 TF/s)" if best else "")
    term.print(bar.make_tasks_table(bar.tasks))
    (line,) = term.export_text().splitlines()
    assert len(line) <= width and "5/822" in line, line
    assert re.search(r" \d+:\d\d:\d\d eta (-:--:--|\d+:\d\d:\d\d)( |$)", line), f"elapsed and ETA whole: {line!r}"
    assert "…" in line and line.startswith("dlhs mosaic_bla"), "the label is cut, not the times"


def test_plain_progress_prints_every_30s_and_per_problem():
  from ragtune.run import progress

  now, lines = [0.0], []
  pp = progress.PlainProgress(lines.append, clock=lambda: now[0])
  p = shapes.Problem("fwd", "pallas_gpu", "bfloat16", 48, 32, 40, 3, "x", (16, 16, 16))
  pp.start(10, 0)
  pp.problem(p)
  now[0] = 5.0
  (c,) = search_space.candidates(p, 1)
  best = store.make_row(p, store.candidate_id(c), c, "ok", interpret=True, device={"device_kind": "cpu"}, time_s=2e-3)
  pp.row(best, best)
  pp.tick()
  assert lines == [], "nothing new within 30 s"
  now[0] = 31.0
  pp.tick()  # the sweep's heartbeat, even while one candidate runs long
  assert len(lines) == 1 and "0:31 elapsed" in lines[0] and "eta 4:39" in lines[0] and "best 2 ms" in lines[0], lines
  now[0] = 40.0
  pp.problem_done(summary.ProblemSummary(p, "cpu", {"timeout": 3}))
  assert len(lines) == 2 and "no correct candidate: 3 timeout" in lines[1]


def _a_candidate_that_kills_its_worker(tmp_path, monkeypatch, sig: str):
  """(problems, options) of a sweep whose every worker dies of `sig` in its first row
  (tests/ragtune/segv_in_worker.py)."""
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
  monkeypatch.setenv("FAULT_SIGNAL", sig)
  monkeypatch.syspath_prepend(str(TESTS))
  spec = tmp_path / "s.yaml"
  spec.write_text(FAULTS.replace("max_candidates: 7", "max_candidates: 1"))
  problems = shapes.expand(shapes.load_shape_set(spec))
  opts = sweep.SweepOptions(
    out_dir=tmp_path / "res",
    interpret=True,
    max_candidates=1,
    timeout_s=60,
    builder="segv_in_worker:build",
    ceilings=False,
  )
  return problems, opts


def test_a_problem_that_kills_every_worker_is_recorded_and_the_sweep_ends(tmp_path, monkeypatch):
  problems, opts = _a_candidate_that_kills_its_worker(tmp_path, monkeypatch, "SIGSEGV")
  (s,) = sweep.run_sweep(problems, opts)
  rows = store.ResultsStore(tmp_path / "res").rows()
  assert [r.status for r in rows] == ["crash"] * 3, "two baselines and the candidate, once each"
  assert all("SIGSEGV" in r.error and "inputs and reference" in r.error for r in rows)
  assert s.why == "no correct candidate: 1 crash"


def test_a_worker_killed_by_sigterm_alone_is_its_crash_and_the_sweep_goes_on(tmp_path, monkeypatch):
  """SIGTERM that reaches a worker and not its sweep (an out-of-memory killer's, a kill of one
  pid) is that worker's death: recorded as a crash, so a resumed sweep does not meet it again as
  a stop. The sweep's own SIGTERM within stop.STOP_GRACE_S makes it the sweep's stop instead
  (test_stop.py; the process group's, above)."""
  monkeypatch.setattr(stop, "STOP_GRACE_S", 0.2)
  problems, opts = _a_candidate_that_kills_its_worker(tmp_path, monkeypatch, "SIGTERM")
  (s,) = sweep.run_sweep(problems, opts)
  rows = store.ResultsStore(tmp_path / "res").rows()
  assert [r.status for r in rows] == ["crash"] * 3, "two baselines and the candidate, once each"
  assert all("SIGTERM" in r.error for r in rows), [r.error for r in rows]
  assert s.why == "no correct candidate: 1 crash"
  assert not (tmp_path / "res" / lock.HOLDER).exists()
