"""A sweep never times what a deviceless compile rejected (ragtune.candidates.prune), and
`ragtune plan --target` records every candidate's compile in DIR/compile.jsonl."""

import json
import multiprocessing
import os
import signal
import threading
import time

import jax
import pytest
from test_aot_compile import _UNAVAILABLE
from typer.testing import CliRunner

from ragtune import provenance, stop
from ragtune.candidates import prune, search_space
from ragtune.cli.app import app
from ragtune.deviceless import aot
from ragtune.problems import shapes
from ragtune.provenance import Versions
from ragtune.records import store
from ragtune.run import plan as planning
from ragtune.run import sweep

runner = CliRunner()
TINY = """
ops: [fwd]
backends: [pallas_gpu]
max_candidates: 2
shapes:
  - {m: 48, k: 32, n: 40, g: 3}
"""
KIND = jax.devices()[0].device_kind
H100 = "NVIDIA H100 80GB HBM3"


def _reject(out, p, cfg, outcome="spill", error="ragtune_gmm: 8 B/thread spilled", versions=None):
  out.mkdir(parents=True, exist_ok=True)
  row = {
    "id": f"{prune.shape_key(KIND, p)}|{store.candidate_id(cfg)}",
    "kind": "compile",
    "candidate": store.candidate_id(cfg),
    **p.fields(),
    "config": cfg.to_dict(),
    "outcome": outcome,
    "error": error,
    "compile_s": 1.0,
    "kernels": [],
    "device_kind": KIND,
    **({"versions": versions} if versions else {}),
  }
  with open(out / prune.COMPILE_RECORDS, "a") as f:
    f.write(json.dumps(row) + "\n")


def test_a_sweep_skips_and_records_what_the_compile_rejected(tmp_path):
  spec = tmp_path / "tiny.yaml"
  spec.write_text(TINY)
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  space = search_space.candidates(p, device_kind=KIND)
  default, second, third = space[:3]
  out = tmp_path / "results"
  _reject(out, p, default, versions={"ragtune": "0.1.0", "jax": "0.9.0", "ptxas": "12.9.86"})
  _reject(out, p, third, outcome="ok", error="")  # a clean compile changes nothing
  opts = sweep.SweepOptions(out_dir=out, max_candidates=2, device_kind=KIND)
  (row,) = planning.plan([p], opts)
  assert row.candidates == 2 and row.rejected == 1  # the next candidate takes its place
  budgeted = sweep.SweepOptions(out_dir=out, budget=len(space), device_kind=KIND)
  task, _, _ = planning.make_task(p, budgeted, {}, [])
  assert task.rejected == 1 and not task.skip_rows and store.candidate_id(default) not in task.configs
  assert len(task.configs) == len(space) - 1

  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  rows = {x.candidate: x for x in store.ResultsStore(out).rows()}
  skipped = rows[store.candidate_id(default)]
  assert skipped.status == "compile_error" and skipped.time_s is None
  assert "deviceless compile for" in skipped.error and "spill" in skipped.error
  assert skipped.versions == Versions(ragtune="0.1.0", jax="0.9.0", ptxas="12.9.86"), "the compile's, not the sweep's"
  timed = [x for x in rows.values() if x.kind == "candidate" and x.status == "ok"]
  assert sorted(x.candidate for x in timed) == sorted(store.candidate_id(c) for c in (second, third))
  # A rerun writes nothing new: the skip row is recorded once.
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  assert len(store.ResultsStore(out).rows()) == len(rows)


def test_launch_order_knobs_share_one_compile():
  from kernels import MosaicConfig, TritonConfig

  assert prune.compile_class(TritonConfig(64, 64, 128, 4, 3, group_m=16, group_k=4)) == prune.compile_class(
    TritonConfig(64, 64, 128, 4, 3, group_m=1, group_k=16)
  )
  assert prune.compile_class(MosaicConfig(128, 128, 64, 4, 8)) == prune.compile_class(MosaicConfig(128, 128, 64, 4, 1))
  assert prune.compile_class(TritonConfig(64, 64, 128, 4, 3)) != prune.compile_class(TritonConfig(64, 64, 128, 4, 4))


def test_target_facts_come_from_the_shipped_files():
  assert prune.target_facts("h100") == {
    "platform": "gpu",
    "device_kind": "NVIDIA H100 80GB HBM3",
    "memory_bytes": 84942979072,
  }
  assert prune.target_facts("b200")["device_kind"] == "NVIDIA B200"
  with pytest.raises(Exception, match="not one of"):
    prune.target_facts("h800")


@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
def test_plan_target_compiles_every_candidate_once(tmp_path):
  spec = tmp_path / "tiny.yaml"
  spec.write_text("ops: [drhs]\nbackends: [mosaic_gpu]\nshapes:\n  - {m: 64, k: 64, n: 64, g: 2}\n")
  out = tmp_path / "h100"
  r = runner.invoke(app, ["plan", str(spec), "--target", "h100", "-o", str(out), "-j", "2"])
  assert r.exit_code == 0, r.output
  rows = list(prune.compile_rows(out).values())
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  assert len(rows) == len(search_space.candidates(p, device_kind="NVIDIA H100 80GB HBM3")) > 0
  assert all(x["kind"] == "compile" and x["device_kind"] == "NVIDIA H100 80GB HBM3" for x in rows)
  assert all(x["outcome"] == aot.OK and x["kernels"][0]["mma"] == "wgmma" for x in rows), rows
  assert all(x["versions"] == provenance.for_aot().to_dict() for x in rows) and provenance.for_aot().ptxas
  assert "compile-rejected" not in r.output  # nothing rejected: the plain plan table
  r = runner.invoke(app, ["plan", str(spec), "--target", "h100", "-o", str(out)])
  assert r.exit_code == 0 and "nothing new" in r.output, r.output


@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
def test_compile_command_prints_each_kernel_and_fails_on_what_does_not_compile(tmp_path):
  spec = tmp_path / "tiny.yaml"
  spec.write_text("ops: [fwd]\nbackends: [pallas_gpu, mosaic_gpu]\nshapes:\n  - {m: 256, k: 128, n: 128, g: 2}\n")
  r = runner.invoke(app, ["compile", str(spec), "--target", "h100"], terminal_width=200)
  assert r.exit_code == 0, r.output
  assert r.output.count("wgmma") == 2 and "cp.async" in r.output and "tma" in r.output, r.output
  # On a B200 the file's Hopper backend is left out with a notice (it lists the backends of
  # several GPUs); asked for by name, it is one error line.
  r = runner.invoke(app, ["compile", str(spec), "--target", "b200"], terminal_width=200)
  assert r.exit_code == 0, r.output
  assert "notice: backend 'mosaic_gpu' compiles for hopper (9.0) GPUs only" in r.output, r.output
  assert "tcgen05" in r.output, r.output
  r = runner.invoke(app, ["compile", str(spec), "--target", "b200", "--backend", "mosaic_gpu"])
  assert r.exit_code == 2 and r.output.strip().splitlines()[-1].startswith("error: nothing to run on NVIDIA B200"), (
    r.output
  )


@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
@pytest.mark.parametrize(
  "a,b",
  [
    ("pallas_gpu", (dict(group_m=1, group_k=1), dict(group_m=64, group_k=16))),
    ("mosaic_gpu", (dict(group_m=1), dict(group_m=16))),
  ],
  ids=["pallas_gpu", "mosaic_gpu"],
)
def test_launch_order_knobs_compile_alike(a, b):
  """What compile_class assumes: configs that differ only in launch order get the same
  registers, spills, shared memory and instructions kinds (Mixtral fwd, H100)."""
  import dataclasses

  import kernels

  m, k, n, g = 8192, 4096, 14336, 8
  base = kernels.registry.default_config(a, "fwd", "bfloat16", m, k, n, g, device_kind="NVIDIA H100 80GB HBM3")
  reps = [aot.compile_op("h100", a, "fwd", "bfloat16", m, k, n, g, dataclasses.replace(base, **knobs)) for knobs in b]
  facts = [
    [(kr.registers, kr.spill_bytes, kr.smem_bytes, kr.mma, kr.copy, kr.serialized_wgmma) for kr in r.kernels]
    for r in reps
  ]
  assert all(r.ok for r in reps) and facts[0] == facts[1], facts


UNREAD = "the machine code held no ragtune_* kernel (12 cubins read): nothing was checked"


def _no_kernel(calls):
  """prune.compile_many's stand-in: every compile built, and the reader found no kernel."""

  def compile_many(target, items, jobs=None):
    calls.append(len(items))
    for i in range(len(items)):
      yield i, {"outcome": aot.NO_KERNEL, "error": UNREAD, "compile_s": 1.0, "kernels": []}

  return compile_many


def test_plan_target_shows_per_problem_what_its_line_counts(tmp_path, monkeypatch):
  """A rejected candidate past --max-candidates: the line says a sweep skips 1, and the table's
  compile-rejected column says of which problem, though a listed sweep never reaches it."""

  def compile_many(target, items, jobs=None):
    for i in range(len(items)):
      last = i == len(items) - 1
      yield i, {"outcome": aot.SPILL if last else aot.OK, "error": "8 B spilled" if last else "", "compile_s": 1.0}

  monkeypatch.setattr(prune, "compile_many", compile_many)
  spec = tmp_path / "tiny.yaml"
  spec.write_text(TINY)
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  out = tmp_path / "h100"
  r = runner.invoke(app, ["plan", str(spec), "--target", "h100", "-o", str(out), "--max-candidates", "1"])
  assert r.exit_code == 0, r.output
  n = len(prune.rejected(out, H100, p))
  assert n >= 1 and f"a sweep there skips {n} of them" in r.output, r.output
  assert "per problem: the plan's compile-rejected column" in r.output, r.output
  header = next(line for line in r.output.splitlines() if "compile-rejected" in line and "┃" in line)
  row = next(line for line in r.output.splitlines() if p.shape_label in line and "│" in line)
  cells = [c.strip() for c in row.split("│")]
  assert cells[[c.strip() for c in header.split("┃")].index("compile-rejected")] == str(n), r.output


def test_a_compile_whose_machine_code_shows_no_kernel_prunes_nothing_and_says_so(tmp_path, monkeypatch):
  """NO_KERNEL judged nothing: plan --target keeps every candidate with a warning naming how
  many and why, and compiles them again next time; `ragtune compile` fails naming it."""
  spec = tmp_path / "tiny.yaml"
  spec.write_text("ops: [fwd]\nbackends: [mosaic_gpu]\nshapes:\n  - {m: 256, k: 128, n: 128, g: 2}\n")
  calls = []
  monkeypatch.setattr(prune, "compile_many", _no_kernel(calls))
  out = tmp_path / "h100"
  r = runner.invoke(app, ["plan", str(spec), "--target", "h100", "-o", str(out)])
  assert r.exit_code == 0, r.output
  (p,) = shapes.expand(shapes.load_shape_set(spec))
  n = len(search_space.candidates(p, device_kind=H100))
  assert f"WARNING: {n} candidates could not be judged (no_kernel: {UNREAD})" in r.output, r.output
  assert "a sweep there skips 0 of them" in r.output and "compile-rejected" not in r.output, r.output
  assert prune.rejected(out, H100, p) == {} and len(prune.compile_rows(out)) == n
  logs = []
  assert prune.run([p], "h100", out, log=logs.append) == {aot.NO_KERNEL: n}  # compiled again
  assert len(calls) == 2 and "WARNING" in logs[-1], logs
  r = runner.invoke(app, ["compile", str(spec), "--target", "h100"], terminal_width=200)
  assert r.exit_code == 1 and "no_kernel: the machine code" in r.output, r.output
  assert f"1 of 1 were not checked (no_kernel): {UNREAD}\n1 of 1 did not compile clean" in r.output, r.output


def test_ctrl_c_while_compiling_stops_at_once_and_the_workers_never_see_it(capfd):
  """A terminal's Ctrl-C reaches the compile workers too: they must not print tracebacks (they
  leave Ctrl-C to this process, which stops and kills them)."""
  import fault_builders

  def sigint_in(pid: int, field: str) -> bool:  # SigCgt: Python has started there; SigBlk: blocked
    try:
      status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    except OSError:
      return False
    return bool(int(status[field], 16) >> (signal.SIGINT - 1) & 1)

  def ctrl_c_once_they_start():
    deadline = time.time() + 120
    while time.time() < deadline:
      workers = multiprocessing.active_children()
      if len(workers) == 2 and all(sigint_in(w.pid, "SigCgt") for w in workers):
        break
      time.sleep(0.01)
    seen.extend(w.pid for w in workers)
    for worker in workers:
      os.kill(worker.pid, signal.SIGINT)
    # Each has died of it (printing what it prints), or holds it blocked; then this process's turn.
    settled = time.time() + 10
    while time.time() < settled and any(w.is_alive() and not sigint_in(w.pid, "SigBlk") for w in workers):
      time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)

  seen: list[int] = []
  items = [(None, "hang"), (None, "hang")]
  threading.Thread(target=ctrl_c_once_they_start, daemon=True).start()
  with stop.handlers(), pytest.raises(KeyboardInterrupt) as stopped:
    list(prune.compile_many("h100", items, jobs=2, timeout_s=60, fn=fault_builders.compile_faults))
  assert stop.exit_code(stopped.value) == 130  # and the stop is acted on, as the command does
  left = [pid for pid in seen if os.path.exists(f"/proc/{pid}")]  # a zombie (not reaped) has an entry too
  assert not left, f"every worker killed and reaped: {left} are not"
  err = capfd.readouterr().err
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_compile_many_survives_a_crash_and_a_hang_and_stops_on_a_broken_toolchain():
  import fault_builders

  from ragtune.errors import RagtuneError

  p = None  # the stand-in ignores the problem
  items = [(p, w) for w in ("ok", "crash", "ok", "hang", "ok", "ok")]
  # A worker's first item also pays for its start (spawn, imports): seconds on a busy 2-core host.
  got = dict(prune.compile_many("h100", items, jobs=2, timeout_s=6, fn=fault_builders.compile_faults))
  assert sorted(got) == list(range(len(items)))
  assert [got[i]["outcome"] for i in (0, 2, 4, 5)] == ["ok"] * 4
  assert got[1]["outcome"] == aot.ERROR and "process died (retried alone)" in got[1]["error"]
  assert got[3]["outcome"] == aot.ERROR and "ran past 6s (retried alone)" in got[3]["error"]
  with pytest.raises(RagtuneError, match="cannot compile here: no ptxas"):
    list(prune.compile_many("h100", [(p, "ok"), (p, "setup")], jobs=1, fn=fault_builders.compile_faults))
