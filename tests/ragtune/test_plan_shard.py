"""Shards partition a shape set; plan / sweep --dry-run count and estimate without a device
(from rows, else from the calibrated model); --timeout warnings and --strict; what an
interpreter cannot run."""

import dataclasses
import json
import platform
import random
import re
from pathlib import Path

import jax
import pytest
from typer.testing import CliRunner

import kernels
from ragtune.candidates import search_space
from ragtune.cli.app import app
from ragtune.device import ceilings
from ragtune.errors import RagtuneError
from ragtune.problems import shapes
from ragtune.records import store
from ragtune.run import estimate, sweep
from ragtune.run import plan as planning
from ragtune.run import shard as shard_mod

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
  """A calibration of this host in a fresh cache folder: the model's figures are known, and
  nothing is measured."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  cal = estimate.Calibration(1e-5, 2.0, 1e10, platform.node(), jax.__version__, "2026-01-01T00:00:00+00:00")
  estimate.save_calibration(cal)
  monkeypatch.setattr(estimate, "measure_calibration", lambda: pytest.fail("measured, though one was cached"))
  return cal


def test_shards_partition_the_problems_exactly(tmp_path):
  problems = shapes.expand(shapes.load_shape_set("shapes/moe.yaml"))
  keys = sorted(p.key for p in problems)
  for n in (1, 2, 3, 7):
    parts = [planning.shard(problems, i, n) for i in range(n)]
    got = [p.key for part in parts for p in part]
    assert sorted(got) == keys, "every problem in exactly one shard"
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    shuffled = problems[:]
    random.Random(n).shuffle(shuffled)
    assert [{p.key for p in planning.shard(shuffled, i, n)} for i in range(n)] == [
      {p.key for p in part} for part in parts
    ], "a shard does not depend on the order of the shape file"


def test_bad_shard_and_devices_are_one_error_line(tmp_path):
  spec = tmp_path / "s.yaml"
  spec.write_text("shapes:\n  - {m: 16, k: 16, n: 16, g: 2}\n")
  for args in (["--shard", "3/3"], ["--shard", "x"], ["--devices", "0,9"], ["--devices", "many"]):
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "res"), *args])
    lines = [l for l in r.output.splitlines() if l.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, r.output)
  assert not (tmp_path / "res" / store.RECORDS).exists()


SPEC = """
ops: [fwd, drhs]
backends: [pallas_gpu]
shapes:
  - {m: 96, k: 64, n: 80, g: 4}
"""


def test_plan_and_dry_run_count_done_and_estimate(tmp_path, calibrated):
  spec, out = tmp_path / "p.yaml", tmp_path / "res"
  spec.write_text(SPEC)
  problems = shapes.expand(shapes.load_shape_set(spec))
  fwd = problems[0]
  cands = search_space.candidates(fwd)
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": "x"}
  rows = []
  for cid, cfg, t in [("baseline:xla", None, 2.0), ("baseline:dense", None, 2.0)] + [
    (store.candidate_id(c), c, 4.0) for c in cands[:3]
  ]:
    r = store.make_row(fwd, cid, cfg, "ok", interpret=True, device=dev, time_s=1e-3)
    rows.append(dataclasses.replace(r, elapsed_s=t))
  out.mkdir()
  (out / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))

  opts = sweep.SweepOptions(out_dir=out, interpret=True, device_kind="cpu")
  plan = {r.problem.op: r for r in planning.plan(problems, opts)}
  assert plan["fwd"].candidates == len(cands) and plan["fwd"].done == 5
  assert plan["fwd"].todo == len(cands) - 3
  assert plan["fwd"].estimate == estimate.Estimate(4.0 * (len(cands) - 3), 4.0, "rows", per_candidate_s=4.0), (
    "median s a row x rows left"
  )
  drhs = plan["drhs"]
  assert drhs.done == 0 and drhs.estimate.source == "model", "no rows of its own: the model"
  compile_s = kernels.registry.get(drhs.problem.backend).interpret_cost.compile * calibrated.compile_s
  assert drhs.estimate.seconds > drhs.estimate.candidate_s > compile_s

  budgeted = {r.problem.op: r for r in planning.plan(problems, dataclasses.replace(opts, budget=10))}
  assert budgeted["fwd"].candidates == 10 and budgeted["fwd"].todo == 10 - 3

  r = runner.invoke(app, ["plan", str(spec), "-o", str(out)])
  d = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--dry-run"])
  assert r.exit_code == d.exit_code == 0, r.output + d.output
  assert r.output == d.output and "measurements to do" in r.output
  assert "1 from the median time of their recorded rows" in r.output
  assert "10.0 us a grid step and 2.0s a compile" in r.output and "calibrated on this host" in r.output, r.output
  assert (out / store.RECORDS).read_text().count("\n") == 5, "a plan measures nothing"


def test_the_estimate_follows_the_calibrated_figure_with_no_rows(tmp_path, calibrated):
  """With no rows, each problem's estimate is the interpreter model's, at this host's
  calibrated seconds a step: a host twice as slow doubles the run time of every candidate."""
  spec = tmp_path / "p.yaml"
  spec.write_text(SPEC)
  problems = shapes.expand(shapes.load_shape_set(spec))
  opts = sweep.SweepOptions(out_dir=tmp_path / "res", interpret=True, device_kind="cpu")
  fast = planning.plan(problems, opts)
  slow_cal = dataclasses.replace(calibrated, step_s=2 * calibrated.step_s)
  slow = planning.plan(problems, opts, estimate.CostModel(True, "cpu", slow_cal))
  for a, b in zip(fast, slow):
    assert a.estimate.source == b.estimate.source == "model" and a.done == 0
    compile_s = kernels.registry.get(a.problem.backend).interpret_cost.compile * calibrated.compile_s
    assert b.estimate.candidate_s - compile_s == pytest.approx(2 * (a.estimate.candidate_s - compile_s))
  r = runner.invoke(app, ["plan", str(spec), "-o", str(tmp_path / "res")])
  todo = sum(row.todo for row in fast)
  assert r.exit_code == 0, r.output
  assert f"2 problems, {todo} measurements to do (candidates and the 2 baselines per problem): about" in r.output
  assert "2 from a model of the interpreter" in r.output and "slowest: " in r.output


def test_plan_columns_multiply_out_and_gpu_sized_sets_say_so_on_a_cpu(tmp_path, calibrated):
  """est. time = candidates to do x per candidate + the baselines to do, in each row; an
  interpreter's plan of hours says its figure is not a GPU's and how to plan for one."""
  opts = sweep.SweepOptions(out_dir=tmp_path / "res", interpret=True, device_kind="cpu")
  model = estimate.CostModel(True, "cpu", calibrated)
  for p in shapes.expand(shapes.load_shape_set("shapes/smoke.yaml"))[:3]:
    (row,) = planning.plan([p], opts, model)
    e, cands = row.estimate, row.todo - len(planning.BASELINES)
    base = model.baselines_s(p, list(planning.BASELINES))
    assert e.seconds == pytest.approx(cands * e.per_candidate_s + base), p
    assert e.candidate_s >= e.per_candidate_s, "the slowest candidate, for --timeout"
  r = runner.invoke(app, ["plan", "shapes/anchors.yaml", "-o", str(tmp_path / "res")])
  assert r.exit_code == 0, r.output
  assert "per candidate" in r.output and "a candidate  " not in r.output
  hints = [line for line in r.output.splitlines() if "not a GPU's" in line]
  assert len(hints) == 1 and "--target h100" in hints[0] and "interpreter" in hints[0], r.output
  smoke = runner.invoke(app, ["plan", "shapes/smoke.yaml", "-o", str(tmp_path / "res")])
  assert smoke.exit_code == 0 and "not a GPU's" not in smoke.output, smoke.output


def test_calibration_is_measured_once_per_host_and_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  cal = estimate.calibration()
  assert cal.step_s > 0 and cal.compile_s > 0 and cal.matmul_flops > 0
  assert json.loads(estimate.cache_path().read_text()) == {cal.key: dataclasses.asdict(cal)}
  monkeypatch.setattr(estimate, "measure_calibration", lambda: pytest.fail("measured twice"))
  assert estimate.calibration() == cal


def test_timeout_warnings_and_strict_refuse_what_the_model_says_will_overrun(tmp_path, calibrated):
  """The model puts a smoke candidate at a compile (its backend's share of the calibrated 2s)
  plus its runs: more than --timeout 1. A dry run warns; --strict refuses to start, writing
  nothing."""
  out = tmp_path / "res"
  args = ["sweep", "shapes/smoke.yaml", "--shape", "96,64,80", "--op", "fwd", "-o", str(out), "--timeout", "1"]
  smoke = shapes.load_shape_set("shapes/smoke.yaml")
  (p,) = shapes.select(shapes.expand(smoke, ops=["fwd"]), shapes=["96,64,80"])
  opts = sweep.SweepOptions(out_dir=out, max_candidates=smoke.max_candidates, interpret=True, device_kind="cpu")
  (row,) = planning.plan([p], opts)
  about = estimate.duration(row.estimate.candidate_s)
  compile_s = kernels.registry.get(p.backend).interpret_cost.compile * calibrated.compile_s
  assert row.estimate.candidate_s > compile_s > 1
  d = runner.invoke(app, [*args, "--dry-run"])
  assert d.exit_code == 0, d.output
  warning = (
    f"warning: fwd pallas_gpu bfloat16 [96,64]x[4,64,80]: about {about} a candidate (model), more than --timeout 1s"
  )
  assert warning in d.output and "1 of 1 problem will likely time out" in d.output, d.output
  ok = runner.invoke(app, [*args[:-1], "600", "--dry-run"])
  assert ok.exit_code == 0 and "warning" not in ok.output, ok.output

  r = runner.invoke(app, [*args, "--strict"])
  lines = [line for line in r.output.splitlines() if line.startswith("error:")]
  assert r.exit_code == 2 and len(lines) == 1, r.output
  assert lines[0].startswith("error: --strict: 1 of 1 problem will likely time out") and f"about {about}" in lines[0]
  assert not out.exists(), "nothing written"


def test_a_strict_sweep_exits_1_when_every_candidate_failed(tmp_path, calibrated, monkeypatch):
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text("max_candidates: 1\nshapes:\n  - {m: 32, k: 16, n: 16, g: 2}\n")
  monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'tests' / 'ragtune'}:{ROOT}")  # the workers import the builder
  args = ["sweep", str(spec), "-o", str(out), "--builder", "fault_builders:fail_build"]
  r = runner.invoke(app, [*args, "--strict"])
  errors = [line for line in r.output.splitlines() if line.startswith("error:")]
  assert r.exit_code == 1 and len(errors) == 1, r.output
  assert errors[0].startswith("error: --strict: 1 problem has no correct candidate") and "compile_error" in errors[0]
  assert [row.status for row in store.ResultsStore(out).rows()] == ["ok", "ok", "compile_error"]
  again = runner.invoke(app, args)  # resumed: nothing left to measure; without --strict a warning
  assert again.exit_code == 0 and "warning: 1 problem has no correct candidate" in again.output, again.output


MOSAIC = "ops: [fwd, dlhs, drhs]\nbackends: [mosaic_gpu]\nshapes:\n  - {m: 64, k: 64, n: 64, g: 2}\n"


def test_ops_the_interpreter_cannot_run_are_noticed_and_left_out(tmp_path, calibrated):
  spec, out = tmp_path / "m.yaml", tmp_path / "res"
  spec.write_text(MOSAIC)
  # the ops it cannot run on any format (an "op:format" key names one format: none here)
  unsupported = [op for op in kernels.registry.get("mosaic_gpu").interpret_unsupported() if ":" not in op]
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--dry-run"])
  assert r.exit_code == 0, r.output
  notices = [line for line in r.output.splitlines() if line.startswith("notice: skipped")]
  # One notice per reason, naming the ops it leaves out: "(dlhs 1, drhs 1)".
  assert len(notices) == (1 if unsupported else 0), r.output
  for n in notices:
    assert "Mosaic GPU interpreter" in n and all(f"{op} 1" in n for op in unsupported), n
  kept, _ = planning.interpret_skips(shapes.expand(shapes.load_shape_set(spec)))
  assert {p.op for p in kept} == {"fwd", "dlhs", "drhs"} - set(unsupported)
  assert f"{len(kept)} problem{'s' if len(kept) != 1 else ''}, " in r.output
  if unsupported:  # nothing left: one error line, nothing written
    only = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--op", "dlhs"])
    assert only.exit_code == 2 and only.output.strip().splitlines()[-1].startswith("error: nothing to run"), only.output
    assert not out.exists()


def test_the_search_space_is_the_probed_devices_not_the_parents(tmp_path, monkeypatch):
  """The parent stays off the accelerator, so it must not ask its own jax which device it
  tunes: the space and the default come from SweepOptions.device_kind (the probe's answer)."""
  import kernels

  h100 = "NVIDIA H100 80GB HBM3"
  monkeypatch.setattr(kernels.lut, "current_device_kind", lambda: "cpu")  # what a parent kept on the CPU sees
  monkeypatch.setattr(search_space, "current_device_kind", lambda: "cpu")
  (p,) = [
    q
    for q in shapes.expand(shapes.load_shape_set("shapes/anchors.yaml"))
    if (q.op, q.backend, q.m) == ("fwd", "pallas_gpu", 8192)
  ]
  opts = sweep.SweepOptions(out_dir=tmp_path, device_kind=h100)
  (row,) = planning.plan([p], opts)
  space = search_space.candidates(p, device_kind=h100)
  assert row.candidates == len(space) > len(search_space.candidates(p, device_kind="cpu"))
  assert space[0] == kernels.registry.default_config(
    "pallas_gpu", "fwd", "bfloat16", p.m, p.k, p.n, p.g, device_kind=h100
  )


def test_a_budgeted_search_starts_from_the_devices_lut(tmp_path, monkeypatch):
  """--budget seeds its first stage with the LUT a model here would use (RAGTUNE_LUT): the
  nearest entry of the problem's backend, when it fits the device, even one the search
  space prunes."""
  p = shapes.Problem("fwd", "pallas_gpu", "float32", 64, 32, 48, 3, "x", (20, 20, 24))
  tuned = kernels.TritonConfig(16, 16, 16, 1, 1, group_m=1, group_k=1)  # 1 warp: outside the space
  assert tuned not in search_space.candidates(p, device_kind="cpu")
  lut = kernels.Lut("cpu", [kernels.Entry("fwd", "pallas_gpu", "float32", 60, 32, 48, 3, tuned)])
  (tmp_path / "cpu.json").write_text(json.dumps(lut.to_dict()))
  monkeypatch.setenv(kernels.lut.ENV_VAR, str(tmp_path))
  found = kernels.lut.default_lut("cpu")
  assert found is not None and len(found) == 1
  assert planning._lut_hint(p, found, "cpu") == tuned
  assert planning._lut_hint(dataclasses.replace(p, backend="mosaic_gpu"), found, "cpu") is None
  opts = sweep.SweepOptions(out_dir=tmp_path / "res", budget=4, device_kind="cpu", lut=found)
  task, _, _ = planning.make_task(p, opts, {}, [])
  assert tuned in task.configs.values()  # outside the pruned space: there for the LUT alone
  timed = [c for _, c in task.pending if c is not None]  # the default first
  while tuned not in timed and len(timed) < opts.budget:
    task.history.update({c: 1e-3 for c in timed})
    batch = [c for _, c in task.next_batch()]
    assert batch, timed
    timed += batch
  assert tuned in timed, "a seed of the first stage, within the budget"


SLURM = {"SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "10"}


def test_shard_auto_reads_slurm_arrays_and_indexed_jobs():
  got = shard_mod.parse("auto", SLURM)
  assert (got.index, got.count) == (2, 3) and "SLURM_ARRAY_TASK_MIN=10" in got.text()
  stepped = dict(
    SLURM, SLURM_ARRAY_TASK_ID="30", SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_STEP="10", SLURM_ARRAY_TASK_COUNT="4"
  )
  assert shard_mod.parse("auto", stepped).index == 3, "--array=0-30:10: task 30 is the fourth"
  resubmitted = dict(SLURM, SLURM_ARRAY_TASK_ID="5", SLURM_ARRAY_TASK_MIN="2", SLURM_ARRAY_TASK_COUNT="2")
  got = shard_mod.parse("auto/8", resubmitted)
  assert (got.index, got.count) == (5, 8), "sbatch --array=2,5 of an 8-task array: the task id is the index"
  job = {"JOB_COMPLETION_INDEX": "1"}
  assert (shard_mod.parse("auto/4", job).index, shard_mod.parse("auto/4", job).count) == (1, 4)
  assert shard_mod.parse("auto", dict(job, RAGTUNE_SHARD_COUNT="2")).count == 2
  assert shard_mod.parse("1/4", {}) == shard_mod.Shard(1, 4), "i/N as before, whatever the environment"
  for text, env, says in [
    ("auto", {}, "neither a SLURM array task"),
    ("auto", job, "give --shard auto/N"),
    ("auto/2", {"JOB_COMPLETION_INDEX": "2"}, "shard 2 of 2 does not exist"),
    ("auto", dict(SLURM, SLURM_ARRAY_TASK_ID="x"), "SLURM_ARRAY_TASK_ID='x' is not an integer"),
    ("auto", dict(SLURM, SLURM_ARRAY_TASK_STEP="2", SLURM_ARRAY_TASK_ID="11"), "is not SLURM_ARRAY_TASK_MIN=10 plus"),
    ("3/3", {}, "does not exist"),
  ]:
    with pytest.raises(RagtuneError, match=re.escape(says)):
      shard_mod.parse(text, env)


def test_three_array_tasks_merge_into_the_lut_of_one_unsharded_sweep(tmp_path, monkeypatch):
  """Three SLURM array tasks (ids 10-12) each sweep their shard into its own folder; export-lut
  of the results folder reads the shards and writes the LUT one unsharded sweep gives. One
  candidate per problem (the default), so the kernel entries are the same whatever the
  timings; an xla entry is timing's choice, so both LUTs are compared on their kernel entries
  and keys."""
  monkeypatch.setattr(ceilings, "missing", lambda *args: set())  # not this test's business; saves seconds
  spec = tmp_path / "s.yaml"
  spec.write_text(
    "ops: [fwd]\nbackends: [pallas_gpu]\nmax_candidates: 1\nshapes:\n"
    + "".join(f"  - {{m: {m}, k: 32, n: 32, g: 2}}\n" for m in (24, 40, 56))
  )
  sharded, whole = tmp_path / "sharded", tmp_path / "whole"
  for task in (10, 11, 12):
    env = dict(SLURM, SLURM_ARRAY_TASK_ID=str(task))
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(sharded), "--shard", "auto"], env=env)
    assert r.exit_code == 0, r.output
    assert f"shard {task - 10}/3 (from SLURM array task: SLURM_ARRAY_TASK_ID={task}" in r.output
    assert (sharded / f"shard-{task - 10}-of-3" / store.RECORDS).is_file()
  assert not (sharded / store.RECORDS).exists(), "each task writes its own folder"
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(whole)])
  assert r.exit_code == 0, r.output
  for folder in (sharded, whole):
    r = runner.invoke(app, ["export-lut", str(folder), "-o", str(folder / "lut.json")])
    assert r.exit_code == 0, r.output
  luts = [json.loads((folder / "lut.json").read_text()) for folder in (sharded, whole)]
  key = lambda e: (e["op"], e["dtype"], e["m"], e["k"], e["n"], e["g"])
  picks = [
    sorted((key(e), e["backend"], json.dumps(e["config"])) for e in lut["entries"] if e["backend"] != "xla")
    for lut in luts
  ]
  assert len(picks[0]) == 3
  assert picks[0] == picks[1]
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(sharded), "--shard", "auto"], env=dict(SLURM))
  assert r.exit_code == 0 and "complete: every row" in r.output, "a rerun task has nothing to do"


def test_the_calibration_kernel_is_the_unit_of_every_backends_weights():
  """The host is calibrated on a kernel whose grid step weighs 1, the unit every backend's
  interpret_cost is in; it is chosen by that, not by name."""
  b = estimate.calibration_backend()
  assert b.interpret_cost.step == 1 and b.own_kernels and not b.unavailable()
  p, chosen = estimate._calibration_problem()
  assert chosen is b and p.backend == b.name


def test_a_device_sweeps_the_backends_that_compile_for_it():
  """A shapes file of several GPU generations' backends: an H100 keeps mosaic_gpu's and
  pallas_gpu's problems and a notice names mosaic_blackwell's; a B200 the reverse of the
  Mosaic pair; one error line when nothing is left; a CPU (interpreted) keeps them all."""
  from ragtune.run import prepare

  spec = shapes.ShapeSet.model_validate(
    {"backends": ["pallas_gpu", "mosaic_gpu", "mosaic_blackwell"], "shapes": [{"m": 64, "k": 64, "n": 64, "g": 2}]}
  )
  problems = shapes.expand(spec)
  said = []
  kept = prepare.on_device(problems, "gpu", "NVIDIA H100 80GB HBM3", said.append)
  assert [p.backend for p in kept] == ["pallas_gpu", "mosaic_gpu"]
  assert said == [
    "notice: backend 'mosaic_blackwell' compiles for blackwell (10.x) GPUs only, "
    "not 'NVIDIA H100 80GB HBM3' (9.0, hopper): its 1 problem left out"
  ]
  assert [p.backend for p in prepare.on_device(problems, "gpu", "NVIDIA B200", said.append)] == [
    "pallas_gpu",
    "mosaic_blackwell",
  ]
  assert prepare.on_device(problems, "cpu", "cpu", said.append) == problems
  with pytest.raises(RagtuneError, match="nothing to run on NVIDIA A100-SXM4-80GB: backend 'mosaic_gpu'"):
    prepare.on_device(problems[1:], "gpu", "NVIDIA A100-SXM4-80GB", said.append)


def test_an_empty_shard_says_so_and_exits_0(tmp_path):
  """The user's report: a SLURM array of 3 tasks over one problem; task 1 printed "0 problems" and
  "error: nothing to run in interpret mode: " (no reason), exit 2."""
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text("ops: [fwd]\nbackends: [pallas_gpu]\nshapes:\n  - {m: 24, k: 32, n: 32, g: 2}\n")
  for task in (11, 12):
    r = runner.invoke(
      app, ["sweep", str(spec), "-o", str(out), "--shard", "auto"], env=dict(SLURM, SLURM_ARRAY_TASK_ID=str(task))
    )
    assert r.exit_code == 0, r.output
    assert f"shard {task - 10}/3 (from SLURM array task: SLURM_ARRAY_TASK_ID={task}" in r.output
    assert r.output.rstrip().endswith("has no problems (1 problem for 3 tasks); nothing to do"), r.output
    assert "error" not in r.output
  assert not out.exists(), "nothing written"
  r = runner.invoke(app, ["plan", str(spec), "-o", str(out), "--shard", "2/3"])
  assert r.exit_code == 0 and "shard 2/3 has no problems (1 problem for 3 tasks); nothing to do" in r.output, r.output


def _swept_shard(spec: Path, out: Path, index: int, count: int) -> None:
  """Shard index/count of spec as a finished sweep leaves it in out: its records (XLA's row and
  the default config's of each problem) and its stored options, written here, not measured."""
  from ragtune.run import prepare, resume

  _, problems = prepare.load_problems(spec, prepare.Selection(shard=f"{index}/{count}"))
  folder = shard_mod.Shard(index, count).folder(out)
  folder.mkdir(parents=True)
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": jax.__version__}
  rows = []
  for p in problems:
    (cfg,) = search_space.candidates(p, 1)
    rows.append(store.make_row(p, "baseline:xla", None, "ok", interpret=False, device=dev, time_s=2e-3))
    rows.append(store.make_row(p, store.candidate_id(cfg), cfg, "ok", interpret=True, device=dev, time_s=1e-3))
  (folder / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
  resume.save(folder, spec, resume.SweepFlags(shard="auto"), finished=True)


def test_a_shard_with_no_records_is_named_and_stops_export_lut_unless_partial(tmp_path):
  """A SLURM array of 2 tasks, task 0 not run yet: show warns, export-lut refuses a LUT of half
  the set (--partial writes it), naming the shard and the sweep that fills it; once it is
  there, nothing is said. A shard past the set's size (more tasks than problems) is empty,
  not missing."""
  spec, out = tmp_path / "s.yaml", tmp_path / "res"
  spec.write_text(
    "ops: [fwd]\nbackends: [pallas_gpu]\nshapes:\n  - {m: 24, k: 32, n: 32, g: 2}\n  - {m: 40, k: 32, n: 32, g: 2}\n"
  )
  _swept_shard(spec, out, 1, 2)
  gap = f"{out}: shard 0 of 2 has no records here (not swept yet, still running, or stopped before its first row)"
  sweep_it = f"sweep it: ragtune sweep {spec} -o {out} --shard 0/2"
  r = runner.invoke(app, ["show", str(out)])
  assert r.exit_code == 0 and f"warning: {gap}: its problems are left out; {sweep_it}" in r.output, r.output
  r = runner.invoke(app, ["export-lut", str(out)])
  assert r.exit_code == 2, r.output
  assert r.output.strip() == (
    f"error: {gap}: a LUT from the others would lack its problems; {sweep_it}; or pass --partial to export the "
    "others anyway"
  ), r.output
  assert not list(out.glob("*.json")), "nothing written"
  r = runner.invoke(app, ["export-lut", str(out), "--partial"])
  assert r.exit_code == 0 and "warning: " in r.output and (out / "cpu.json").is_file(), r.output
  _swept_shard(spec, out, 0, 2)
  r = runner.invoke(app, ["export-lut", str(out), "-o", str(out / "all.json")])
  assert r.exit_code == 0 and "warning" not in r.output and "cpu: 2 entries" in r.output, r.output

  one, out3 = tmp_path / "one.yaml", tmp_path / "res3"  # 1 problem, 3 tasks: shards 1 and 2 are empty
  one.write_text("ops: [fwd]\nbackends: [pallas_gpu]\nshapes:\n  - {m: 24, k: 32, n: 32, g: 2}\n")
  _swept_shard(one, out3, 0, 3)
  r = runner.invoke(app, ["export-lut", str(out3)])
  assert r.exit_code == 0 and "warning" not in r.output, r.output
  one.write_text(one.read_text() + "  - {m: 40, k: 32, n: 32, g: 2}\n")  # changed since: the size is unknown
  r = runner.invoke(app, ["show", str(out3)])
  assert r.exit_code == 0 and f"{out3}: shards 1, 2 of 3 have no records here" in r.output, r.output
  assert "(and --shard 2/3)" in r.output, r.output
