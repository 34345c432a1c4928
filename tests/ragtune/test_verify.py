"""verify: one line per entry, reports only for failures, filters, a per-draw timeout that kills."""

import dataclasses
import json
import os
import signal
import time

import jax
import jaxlib
import pytest
from typer.testing import CliRunner

import kernels
from ragtune import stop
from ragtune.cli.app import app
from ragtune.device import measure
from ragtune.lut import verify
from ragtune.problems import shapes
from ragtune.run import child

runner = CliRunner()
KIND = kernels.lut.current_device_kind()
G = kernels.TritonConfig


def _write_lut(path, entries):
  path.write_text(json.dumps(kernels.Lut(KIND, entries).to_dict()))
  return path


def _entries():
  return [
    kernels.Entry("fwd", "pallas_gpu", "float32", 40, 32, 24, 3, G(16, 16, 16, 4, 2)),
    kernels.Entry("drhs", "pallas_gpu", "float32", 40, 32, 24, 3, G(16, 16, 16, 4, 2)),
    kernels.Entry("dlhs", "pallas_gpu", "float32", 24, 16, 32, 2, G(16, 16, 32, 4, 2)),
  ]


def test_one_line_per_entry_and_filters(tmp_path):
  lut = _write_lut(tmp_path / "lut.json", _entries())
  r = runner.invoke(app, ["verify", str(lut)])
  assert r.exit_code == 0, r.output
  lines = [l for l in r.output.splitlines() if l.startswith("[")]
  assert len(lines) == 3 and all("PASS" in l and "4/4 draws" in l and "worst rel" in l for l in lines), r.output
  assert "NumericsResult" not in r.output, "reports are for failures or --full only"
  assert "warning" not in r.output, "a LUT that names no versions gets no version warning"
  assert len(r.output.strip().splitlines()) <= 5  # notice, 3 entries, total

  r = runner.invoke(app, ["verify", str(lut), "--op", "drhs,fwd", "--shape", "40,32,24", "--full"])
  assert r.exit_code == 0, r.output
  assert "verified 2 entries" in r.output and r.output.count("NumericsResult(PASS)") == 8
  r = runner.invoke(app, ["verify", str(lut), "--op", "dlhs", "--shape", "40,32,24"])
  assert r.exit_code == 2 and "error: no LUT entry matches --op dlhs --shape 40,32,24" in r.output
  for bad, msg in (("--shape=1,2", "expected three positive integers"), ("--op=bwd", "unknown op")):
    r = runner.invoke(app, ["verify", str(lut), bad])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def test_a_lut_tuned_under_another_jax_is_verified_after_one_warning(tmp_path):
  path = tmp_path / "lut.json"
  lut = kernels.Lut(
    KIND, _entries()[:1], meta={"tuned_with": {"ragtune": "0.1.0", "jax": "0.4.35", "jaxlib": "0.4.35"}}
  )
  path.write_text(json.dumps(lut.to_dict()))
  r = runner.invoke(app, ["verify", str(path)])
  assert r.exit_code == 0, r.output
  lines = r.output.splitlines()
  (warning,) = [l for l in lines if l.startswith("warning:")]
  assert warning == (
    f"warning: {path}: tuned under jax 0.4.35, jaxlib 0.4.35, verified under jax {jax.__version__}, "
    f"jaxlib {jaxlib.__version__}; its timings may not hold here"
  )
  (entry,) = [i for i, l in enumerate(lines) if l.startswith("[")]
  assert lines.index(warning) < entry and "PASS" in lines[entry] and "1 passed, 0 failed" in r.output

  # A LUT from before `tuned_with` names each entry's jax only; the running jax gets no warning.
  old = [dataclasses.replace(e, extra={"jax_version": "0.4.35"}) for e in _entries()]
  assert verify.version_warning(kernels.Lut(KIND, old), old, "old.json") == (
    f"old.json: tuned under jax 0.4.35, verified under jax {jax.__version__}, jaxlib {jaxlib.__version__}; "
    "its timings may not hold here"
  )
  here = kernels.Lut(KIND, _entries(), meta={"tuned_with": {"jax": jax.__version__, "jaxlib": jaxlib.__version__}})
  assert verify.version_warning(here, here.entries(), "here.json") is None


def test_failure_prints_its_report(monkeypatch):
  build = measure.build_op
  monkeypatch.setattr(measure, "build_op", lambda *a: lambda *x: build(*a)(*x) * 1.1)
  monkeypatch.setattr(verify, "_compiled", {})  # the wrong op is not left for the next test
  e = _entries()[0]
  res = verify.verify_entry(e, interpret=True)  # in this process: no timeout, no worker
  assert not res.passed and res.n_passed == 0 and {d.status for d in res.draws} == {"wrong"}
  report = "\n".join(verify.entry_report(res, full=False))
  assert report.count("NumericsResult(FAIL)") == 4 and "regions (2x2)" in report
  assert "FAIL" in verify.entry_line(1, 1, res) and "(wrong)" in verify.entry_line(1, 1, res)


def test_draws_operands_on_the_device_unlike_the_sweep(monkeypatch):
  """Each draw's operands come from measure.make_inputs (jax.random on the device, as a sweep
  draws them) with a salt of its own, never from the host: drawn with NumPy, DeepSeek-V3's
  weights overran a draw's timeout on an H200 before its kernel ran."""
  salts = []
  make = measure.make_inputs
  monkeypatch.setattr(measure, "make_inputs", lambda p, salt="inputs": salts.append(salt) or make(p, salt=salt))
  monkeypatch.setattr(verify, "_compiled", {})  # an op another test built stays out
  e = _entries()[0]
  res = verify.verify_entry(e, seed=7, interpret=True)
  assert res.passed and salts == ["verify7"] * 4
  p = shapes.Problem(e.op, e.backend, e.dtype, e.m, e.k, e.n, e.g, "x", (e.m, 0, 0))
  x = verify.fresh_inputs(p, 7)
  assert all(isinstance(v, jax.Array) for v in x.values())
  assert float(abs(x["lhs"] - make(p)["lhs"]).max()) > 0  # not the sweep's operands


def test_timed_out_draw_is_killed(tmp_path):
  # Interpret mode runs ~20k tiny programs for this shape: far longer than the timeout.
  slow = kernels.Entry("fwd", "pallas_gpu", "float32", 2048, 256, 2048, 4, G(16, 16, 16, 1, 1))
  with verify.DrawRunner(timeout=1.5) as draws:
    draws._start()
    pid = draws._child.pid
    t0 = time.perf_counter()
    res = verify.verify_entry(slow, interpret=True, runner=draws)
    took = time.perf_counter() - t0
    assert [d.status for d in res.draws] == ["timeout", "skipped", "skipped", "skipped"]
    assert "did not finish within 1.5s" in res.draws[0].error
    assert took < 10, took
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)  # the worker was killed and reaped, not left computing

  lut = _write_lut(tmp_path / "lut.json", [slow, _entries()[0]])
  # The slow entry runs ~45 s; 10 s leaves the small entry's compiles (its kernel, the reference
  # and the check) room on a busy host.
  r = runner.invoke(app, ["verify", str(lut), "--timeout", "10"])
  assert r.exit_code == 1, r.output
  assert "FAIL fwd" in r.output and "(skipped, timeout)" in r.output and "did not finish within 10s" in r.output
  assert "1 passed, 1 failed" in r.output, "the next entry gets a fresh worker"


def test_select_is_shared_with_sweep():
  spec = shapes.ShapeSet.model_validate(
    {
      "ops": ["fwd", "dlhs"],
      "shapes": [{"m": 8, "k": 8, "n": 8, "g": 2}],
      "models": [{"model": "olmoe-1b-7b", "tokens": [2]}, {"model": "mixtral-8x7b", "tokens": [2]}],
    }
  )
  probs = shapes.expand(spec)
  olmoe = shapes.select(probs, models=["OLMoE-1B-7B"])
  assert len(olmoe) == 4 and all(p.source.startswith("olmoe-1b-7b:") for p in olmoe)
  up = shapes.select(probs, ops=["fwd"], shapes=["16,2048,1024"], models=["olmoe-1b-7b"])
  assert [(p.op, p.m, p.k, p.n) for p in up] == [("fwd", 16, 2048, 1024)]
  with pytest.raises(shapes.RagtuneError, match="unknown model; presets"):
    shapes.select(probs, models=["gpt-5"])
  assert shapes.select(_entries(), ops=["dlhs"], what="LUT entry") == [_entries()[2]]


def test_sweep_selectors(tmp_path):
  spec = tmp_path / "two.yaml"
  spec.write_text(
    "ops: [fwd, drhs]\nmax_candidates: 1\nshapes:\n  - {m: 24, k: 16, n: 16, g: 2}\n"
    "  - {m: 40, k: 16, n: 32, g: 2}\nmodels:\n  - {model: olmoe-1b-7b, tokens: [2]}\n"
  )
  out = tmp_path / "res"
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--op", "fwd", "--shape", "40,16,32"])
  assert r.exit_code == 0, r.output
  rows = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
  assert {(r["op"], r["m"], r["k"], r["n"]) for r in rows} == {("fwd", 40, 16, 32)}
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "none"), "--model", "mixtral-8x7b"])
  assert r.exit_code == 2 and "error: no problem matches --model mixtral-8x7b" in r.output
  assert not (tmp_path / "none").exists()


def test_ctrl_c_kills_the_worker_at_once():
  t0 = time.perf_counter()
  with pytest.raises(KeyboardInterrupt):
    with verify.DrawRunner(timeout=60) as draws:
      draws._start()
      pid = draws._child.pid
      draws._child.send(("draw", _entries()[0], "multinomial", [20, 10, 10], 0, True))  # a draw in flight
      raise KeyboardInterrupt
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)
  assert draws._child is None and time.perf_counter() - t0 < 30


def test_sigterm_that_kills_the_draw_process_is_a_stop_not_a_failed_entry(tmp_path, monkeypatch):
  """A scheduler's SIGTERM reaches verify's draw process, and verify itself: verify stops with
  its one line and exit 143, and reports no entry as failed for it. The draw process killed
  alone (an out-of-memory killer) is that draw's failure, and verify goes on."""
  lut = _write_lut(tmp_path / "lut.json", _entries())
  send = child.Child.send
  also_verify = [True]

  def send_then_sigterm(self, msg):
    send(self, msg)
    if msg[0] == "draw":
      os.kill(self.pid, signal.SIGTERM)
      if also_verify[0]:
        os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(child.Child, "send", send_then_sigterm)
  r = runner.invoke(app, ["verify", str(lut)])
  assert r.exit_code == 143, r.output
  assert r.output.strip().splitlines()[-1].startswith("interrupted: verify stopped before its last entry"), r.output
  assert "FAIL" not in r.output and "error" not in r.output, r.output
  monkeypatch.setattr(stop, "STOP_GRACE_S", 0.2)
  also_verify[0] = False
  r = runner.invoke(app, ["verify", str(lut)])
  assert r.exit_code == 1 and "FAIL" in r.output and "SIGTERM" in r.output, r.output


def test_ctrl_c_says_interrupted_as_sweep_and_bench_do(tmp_path, monkeypatch):
  """The user's report: verify exited 130 on Ctrl-C without the "interrupted" line."""
  lut = _write_lut(tmp_path / "lut.json", _entries())

  def ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(verify, "verify_entry", ctrl_c)
  r = runner.invoke(app, ["verify", str(lut)])
  assert r.exit_code == 130, r.output
  assert r.output.strip().splitlines()[-1].startswith("interrupted: verify stopped before its last entry"), r.output
