"""Shards partition a shape set; plan / sweep --dry-run count and estimate without a device; CPU cost warnings."""

import dataclasses
import json
import random

from typer.testing import CliRunner

import kernels
from ragtune import search_space, shapes, store, sweep
from ragtune.cli import app
from ragtune.run import plan as planning

runner = CliRunner()


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


def test_plan_and_dry_run_count_done_and_estimate(tmp_path):
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

  plan = {r["problem"].op: r for r in planning.plan(problems, sweep.SweepOptions(out_dir=out))}
  assert plan["fwd"]["candidates"] == len(cands) and plan["fwd"]["done"] == 5
  assert plan["fwd"]["todo"] == len(cands) - 3
  assert plan["fwd"]["est_s"] == 4.0 * (len(cands) - 3), "median seconds per row so far x rows left"
  assert plan["drhs"]["done"] == 0 and plan["drhs"]["est_s"] == 4.0 * plan["drhs"]["todo"]

  budgeted = {r["problem"].op: r for r in planning.plan(problems, sweep.SweepOptions(out_dir=out, budget=10))}
  assert budgeted["fwd"]["candidates"] == 10 and budgeted["fwd"]["todo"] == 10 - 3

  r = runner.invoke(app, ["plan", str(spec), "-o", str(out)])
  d = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--dry-run"])
  assert r.exit_code == d.exit_code == 0, r.output + d.output
  assert r.output == d.output and "measurements to do" in r.output
  assert (out / store.RECORDS).read_text().count("\n") == 5, "a plan measures nothing"


def test_cpu_sweep_warns_when_interpret_mode_will_hit_the_timeout():
  big = shapes.expand(shapes.load_shape_set("shapes/moe.yaml"), ops=["drhs"])
  warn = planning.cpu_timeout_warnings(big, sweep.SweepOptions(out_dir=None, timeout_s=120))
  assert warn and "smoke" in warn[-1] and "--timeout" in warn[-1]
  small = shapes.expand(shapes.load_shape_set("shapes/smoke.yaml"))
  assert planning.cpu_timeout_warnings(small, sweep.SweepOptions(out_dir=None, timeout_s=120)) == []


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
  assert row["candidates"] == len(space) > len(search_space.candidates(p, device_kind="cpu"))
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
  found = planning.find_lut("cpu")
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
