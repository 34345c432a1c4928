"""records.jsonl rows as Records: every format a sweep ever wrote loads, lines keep their keys,
and the sweep summary, `show`, `report` and `export-lut` agree on a device's default baseline."""

import dataclasses
import json

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

import kernels
from ragtune import provenance
from ragtune.candidates import search_space
from ragtune.cli.app import app
from ragtune.cli.views import summary_table
from ragtune.errors import RagtuneError
from ragtune.problems.shapes import Problem
from ragtune.provenance import Versions
from ragtune.records import store
from ragtune.run import plan as planning
from ragtune.run import sweep

runner = CliRunner()

# As the first sweep wrote them (before workers: no device_index, worker_pid or elapsed_s; a
# TritonConfig with grid_order), with a key no ragtune knows.
OLD_CANDIDATE = r'''{"backend": "pallas_gpu", "candidate": "{\"block_k\": 32, \"block_m\": 16, \"block_n\": 32, \"grid_order\": \"m_fastest\", \"num_stages\": 2, \"num_warps\": 4}", "config": {"block_k": 32, "block_m": 16, "block_n": 32, "grid_order": "m_fastest", "num_stages": 2, "num_warps": 4}, "device_kind": "cpu", "dtype": "bfloat16", "error": "", "g": 3, "gbps": 0.01, "group_dist": "uniform", "group_sizes": [16, 16, 16], "host": "node7", "id": "fwd|pallas_gpu|bfloat16|48x32x40x3|dbb50655|{\"block_k\": 32, \"block_m\": 16, \"block_n\": 32, \"grid_order\": \"m_fastest\", \"num_stages\": 2, \"num_warps\": 4}", "interpret": true, "jax_version": "0.4.35", "k": 32, "kind": "candidate", "m": 48, "n": 40, "numerics": {"max_diff": 0.0, "pct_bad": 0.0, "rel_error": 0.0}, "op": "fwd", "platform": "cpu", "problem": "fwd|pallas_gpu|bfloat16|48x32x40x3|dbb50655", "source": "smoke", "status": "ok", "tflops": 0.0001, "time_s": 0.0123, "timer": "wallclock-median", "timestamp": "2026-11-21T11:30:00+00:00"}'''
OLD_BASELINE = r'''{"backend": "pallas_gpu", "candidate": "baseline:xla", "config": null, "device_kind": "cpu", "dtype": "bfloat16", "error": "", "g": 3, "gbps": 0.01, "group_dist": "uniform", "group_sizes": [16, 16, 16], "host": "node7", "id": "fwd|pallas_gpu|bfloat16|48x32x40x3|dbb50655|baseline:xla", "interpret": true, "jax_version": "0.4.35", "k": 32, "kind": "baseline", "m": 48, "n": 40, "numerics": null, "op": "fwd", "platform": "cpu", "problem": "fwd|pallas_gpu|bfloat16|48x32x40x3|dbb50655", "source": "smoke", "status": "ok", "tflops": 0.0001, "time_s": 0.002, "timer": "wallclock-median", "timestamp": "2026-11-21T11:30:00+00:00"}'''
# As a worker writes one today, and as the parent records a candidate a deviceless compile rejected.
WORKER_ROW = r'''{"backend": "pallas_gpu", "candidate": "{\"block_k\": 32, \"block_m\": 64, \"block_n\": 64, \"group_k\": 4, \"group_m\": 16, \"num_stages\": 4, \"num_warps\": 4}", "config": {"block_k": 32, "block_m": 64, "block_n": 64, "group_k": 4, "group_m": 16, "num_stages": 4, "num_warps": 4}, "device_index": 0, "device_kind": "cpu", "dtype": "bfloat16", "elapsed_s": 1.5, "error": "", "g": 3, "gbps": 0.0011863414634146342, "group_dist": "multinomial(seed=0)", "group_sizes": [20, 8, 20], "id": "fwd|pallas_gpu|bfloat16|48x32x40x3|5b393a90|{\"block_k\": 32, \"block_m\": 64, \"block_n\": 64, \"group_k\": 4, \"group_m\": 16, \"num_stages\": 4, \"num_warps\": 4}", "interpret": true, "jax_version": "0.10.2", "k": 32, "kind": "candidate", "m": 48, "n": 40, "numerics": null, "op": "fwd", "platform": "cpu", "problem": "fwd|pallas_gpu|bfloat16|48x32x40x3|5b393a90", "source": "smoke", "status": "ok", "tflops": 9.990243902439025e-06, "time_s": 0.0123, "timer": "wallclock-median", "timestamp": "2026-11-23T10:00:00+00:00", "worker_pid": 4242}'''
REJECTED_ROW = r'''{"backend": "pallas_gpu", "candidate": "{\"block_k\": 32, \"block_m\": 64, \"block_n\": 64, \"group_k\": 4, \"group_m\": 64, \"num_stages\": 2, \"num_warps\": 4}", "config": {"block_k": 32, "block_m": 64, "block_n": 64, "group_k": 4, "group_m": 64, "num_stages": 2, "num_warps": 4}, "device_kind": "cpu", "dtype": "bfloat16", "error": "deviceless compile for cpu: spill: 64 bytes", "g": 3, "gbps": null, "group_dist": "multinomial(seed=0)", "group_sizes": [20, 8, 20], "id": "fwd|pallas_gpu|bfloat16|48x32x40x3|5b393a90|{\"block_k\": 32, \"block_m\": 64, \"block_n\": 64, \"group_k\": 4, \"group_m\": 64, \"num_stages\": 2, \"num_warps\": 4}", "interpret": false, "k": 32, "kind": "candidate", "m": 48, "n": 40, "numerics": null, "op": "fwd", "problem": "fwd|pallas_gpu|bfloat16|48x32x40x3|5b393a90", "source": "smoke", "status": "compile_error", "tflops": null, "time_s": null, "timer": "", "timestamp": "2026-11-23T10:00:00+00:00"}'''
# As a worker writes one today, with the versions that made it.
VERSIONS_ROW = r'''{"backend": "pallas_gpu", "candidate": "baseline:dense", "config": null, "device_index": 1, "device_kind": "cpu", "dtype": "bfloat16", "elapsed_s": 0.5, "error": "", "g": 3, "gbps": 1.0, "group_dist": "multinomial(seed=0)", "group_sizes": [20, 8, 20], "id": "dlhs|pallas_gpu|bfloat16|48x32x40x3|5b393a90|baseline:dense", "interpret": true, "jax_version": "0.11.2", "k": 32, "kind": "baseline", "m": 48, "n": 40, "numerics": null, "op": "dlhs", "platform": "cpu", "problem": "dlhs|pallas_gpu|bfloat16|48x32x40x3|5b393a90", "source": "smoke", "status": "ok", "tflops": 0.001, "time_s": 0.0001, "timer": "wallclock-median", "timestamp": "2026-11-25T10:00:00+00:00", "versions": {"commit": "f65beb4+dirty", "jax": "0.11.2", "jaxlib": "0.11.2", "ragtune": "0.1.0"}, "worker_pid": 4343}'''
LINES = [OLD_CANDIDATE, OLD_BASELINE, WORKER_ROW, REJECTED_ROW, VERSIONS_ROW]


def test_every_format_a_sweep_wrote_loads_and_keeps_its_keys(tmp_path):
  (tmp_path / store.RECORDS).write_text("".join(line + "\n" for line in LINES))
  records = store.load_results([tmp_path])
  assert len(records) == 5
  for line, r in zip(LINES, records):
    d = json.loads(line)
    assert (r.id, r.problem.key, r.candidate, r.kind) == (d["id"], d["problem"], d["candidate"], d["kind"])
    assert r.to_dict() == {k: v for k, v in d.items() if k != "host"}, "written back as it was, unknown keys aside"
  old, baseline, new, rejected, versioned = records
  assert old.config["grid_order"] == "m_fastest" and old.elapsed_s is None and old.worker_pid is None
  assert baseline.config is None and baseline.baseline == "xla" and baseline.numerics is None
  assert new.worker_pid == 4242 and new.elapsed_s == 1.5 and rejected.platform is None and not rejected.ok
  assert old.versions is None and old.made_with() == {"jax": "0.4.35"} and rejected.made_with() == {}
  assert versioned.versions == Versions(ragtune="0.1.0", commit="f65beb4+dirty", jax="0.11.2", jaxlib="0.11.2")

  # A sweep resumes from them: the two candidates are done, the baselines are not.
  p = new.problem
  (row,) = planning.plan([p], sweep.SweepOptions(out_dir=tmp_path, max_candidates=2, device_kind="cpu"))
  assert (row.done, row.todo, row.estimate.candidate_s, row.estimate.source) == (2, 2, 1.5, "rows")
  assert (
    "note: these rows were measured under jax 0.4.35, 0.10.2, 0.11.2"
    in runner.invoke(app, ["show", str(tmp_path)]).output
  )
  for args in (
    ["show", str(tmp_path)],
    ["show", str(tmp_path), "--all"],
    ["report", str(tmp_path), "-o", str(tmp_path)],
  ):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
  assert "grid_order=m_fastest" in runner.invoke(app, ["show", str(tmp_path), "--all"]).output


def test_a_record_round_trips_through_the_store(tmp_path):
  p = Problem("drhs", "mosaic_gpu", "float16", 256, 128, 192, 4, "zipf(a=1.2,seed=3)", (100, 0, 56, 100), "moe")
  cfg = search_space.candidates(p, 1, device_kind="NVIDIA H100 80GB HBM3")[0]
  dev = {
    "device_kind": "NVIDIA H100 80GB HBM3",
    "platform": "gpu",
    "jax_version": "0.10.2",
    "device_index": 3,
    "worker_pid": 99,
    "versions": Versions(ragtune="0.1.0", jax="0.10.2", jaxlib="0.10.2", platform="cuda 12090"),
  }
  rows = [
    store.make_row(p, "baseline:dense", None, "ok", interpret=False, device=dev, time_s=1e-4, timer="cupti"),
    store.make_row(p, store.candidate_id(cfg), cfg, "ok", interpret=False, device=dev, time_s=2e-4),
    store.make_row(p, store.candidate_id(cfg), cfg, "timeout", interpret=False, device=dev, error="no result"),
  ]
  s = store.ResultsStore(tmp_path)
  for r in rows:
    s.append(r)
  assert s.rows() == rows
  assert rows[1].candidate == store.candidate_id(cfg) and rows[0].candidate == "baseline:dense"
  assert kernels.registry.config_from_dict("mosaic_gpu", rows[1].config) == cfg
  with pytest.raises(dataclasses.FrozenInstanceError):
    rows[0].status = "crash"


def test_a_line_that_is_no_record_is_named(tmp_path):
  (tmp_path / store.RECORDS).write_text(WORKER_ROW + "\n" + json.dumps({"id": "x", "candidate": "baseline:xla"}) + "\n")
  with pytest.raises(RagtuneError, match=r"records.jsonl:2: not a sweep record \(no 'op'\); --skip-bad-lines"):
    store.load_results([tmp_path])
  r = runner.invoke(app, ["show", str(tmp_path)])
  assert r.exit_code == 2 and "records.jsonl:2: not a sweep record" in r.output


def test_skip_bad_lines_reads_past_them_and_counts_them_per_file(tmp_path):
  """Garbage mid-file stops every reader, naming file:line and the flag; with the flag each
  command reads on and says how many lines it skipped. A torn last line (a kill mid-write)
  is not counted but said apart, and the next append cuts it off."""
  good, other = tmp_path / "a", tmp_path / "b"
  for d in (good, other):
    d.mkdir()
  records = good / store.RECORDS
  torn = WORKER_ROW[:40]
  records.write_text("\n".join([WORKER_ROW, "garbage{", REJECTED_ROW, "[1, 2]", OLD_BASELINE, torn]))
  (other / store.RECORDS).write_text(WORKER_ROW + "\n")
  before = records.read_text()
  for cmd in (["show"], ["export-lut", "-o", str(tmp_path / "lut.json")], ["report", "-o", str(tmp_path / "rep")]):
    tree = sorted(tmp_path.rglob("*"))
    r = runner.invoke(app, [cmd[0], str(good), str(other), *cmd[1:]])
    assert r.exit_code == 2 and f"{records}:2: corrupt record (not JSON); --skip-bad-lines" in r.output, r.output
    assert sorted(tmp_path.rglob("*")) == tree, "nothing written"
    r = runner.invoke(app, [cmd[0], str(good), str(other), *cmd[1:], "--skip-bad-lines"])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {records}: skipped 2 bad lines (2, 4)", f"warning: {store.cut_text(records, 6)}"]
  assert records.read_text() == before, "readers leave the file as it is"
  s = store.ResultsStore(good, skip_bad_lines=True)
  assert len(s.rows()) == 3
  s.append(s.rows()[0])
  assert records.read_text() == before.removesuffix(torn) + json.dumps(s.rows()[0].to_dict(), sort_keys=True) + "\n"


H100 = {
  "device_kind": "NVIDIA H100 80GB HBM3",
  "platform": "gpu",
  "jax_version": "0.10.2",
  "device_index": 0,
  "worker_pid": 4242,
}
SHAPE = (512, 256, 384, 4)
# backend: (ms of its default config, of the winner, of a third config or None: wrong), XLA's ms
TIMES = {"pallas_gpu": ((2.0, 1.25, 1.6), 3.0), "mosaic_gpu": ((1.5, 1.0, None), 3.2)}


def test_show_report_sweep_summary_and_lut_agree_on_an_h100(tmp_path):
  """Rows as an H100 sweep writes them. Each backend's default config on an H100 is not its
  device-less default, so every view must ask for the rows' device kind."""
  kind = H100["device_kind"]
  m, k, n, g = SHAPE
  out = tmp_path / "res"
  s = store.ResultsStore(out)
  problems, expect = [], {}
  for backend, ((default_ms, best_ms, third_ms), xla_ms) in TIMES.items():
    p = Problem("fwd", backend, "bfloat16", m, k, n, g, "multinomial(seed=0)", (128,) * 4)
    problems.append(p)
    default, best, third = search_space.candidates(p, 3, device_kind=kind)
    assert default == kernels.registry.default_config(backend, "fwd", "bfloat16", m, k, n, g, device_kind=kind)
    assert default != kernels.registry.default_config(backend, "fwd", "bfloat16", m, k, n, g)
    s.append(store.make_row(p, "baseline:xla", None, "ok", interpret=False, device=H100, time_s=xla_ms / 1e3))
    s.append(store.make_row(p, "baseline:dense", None, "ok", interpret=False, device=H100, time_s=0.5e-3))
    for cfg, ms in ((default, default_ms), (best, best_ms), (third, third_ms)):
      s.append(
        store.make_row(
          p,
          store.candidate_id(cfg),
          cfg,
          "ok" if ms else "wrong",
          interpret=False,
          device=H100,
          time_s=ms / 1e3 if ms else None,
        )
      )
    short = " ".join(f"{key}={v}" for key, v in best.to_dict().items())  # the config class's order
    expect[backend] = (default_ms, best_ms, xla_ms, best, short)
  winner = "mosaic_gpu 1.25x"  # 1.25 ms (pallas_gpu) over 1.0 ms; XLA at 3.0 ms

  # The sweep summary, as run_sweep returns it and the CLI prints it.
  summaries = sweep.summarize(problems, s.rows(), kind)
  assert [x.baselines["default"] * 1e3 for x in summaries] == [expect[b][0] for b in TIMES]
  assert [x.winner for x in summaries] == [winner, winner]
  console = Console(width=300, record=True)
  console.print(summary_table(summaries))
  table = console.export_text()
  for default_ms, best_ms, _xla_ms, _, _ in expect.values():
    assert f"{default_ms / best_ms:.2f}x" in table  # the best config is in `show` (below)
  assert table.count(winner) == 2

  # `show` (its --csv) and `report` (best.csv).
  r = runner.invoke(app, ["show", str(out), "--csv", str(tmp_path / "show.csv")])
  assert r.exit_code == 0, r.output
  r = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / "rep")])
  assert r.exit_code == 0, r.output
  for path in (tmp_path / "show.csv", tmp_path / "rep" / "best.csv"):
    df = pd.read_csv(path).set_index("backend")
    for backend, (default_ms, best_ms, xla_ms, _, short) in expect.items():
      line = df.loc[backend]
      assert (line["default_ms"], line["best_ms"], line["xla_ms"]) == (default_ms, best_ms, xla_ms), path.name
      assert line["vs_default"] == round(default_ms / best_ms, 4) and line["best_config"] == short, path.name
      assert line["winner"] == winner, path.name

  # The LUT.
  r = runner.invoke(app, ["export-lut", str(out), "-o", str(tmp_path / "lut.json")])
  assert r.exit_code == 0, r.output
  lut = json.loads((tmp_path / "lut.json").read_text())
  assert lut["device_kind"] == kind
  entries = {e["backend"]: e for e in lut["entries"]}
  assert set(entries) == set(TIMES), "no xla entry: a kernel beat XLA"
  for backend, (default_ms, best_ms, xla_ms, best, _) in expect.items():
    e = entries[backend]
    assert kernels.registry.config_from_dict(backend, e["config"]) == best
    assert e["baselines"] == {"xla_s": xla_ms / 1e3, "default_s": default_ms / 1e3, "dense_s": 0.5e-3}
    assert e["speedup_vs_default"] == round(default_ms / best_ms, 4)


def test_a_lut_keeps_the_versions_its_rows_share_and_each_entry_its_own(tmp_path):
  """Rows of two jax versions (two folders merged): the LUT's tuned_with holds what they
  share, each entry the rest, and verify names both versions."""
  from ragtune.lut import export, verify

  kind = H100["device_kind"]
  made = {
    "fwd": Versions(ragtune="0.1.0", jax="0.10.2", jaxlib="0.10.2", platform="cuda 12090"),
    "drhs": Versions(ragtune="0.1.0", jax="0.11.2", jaxlib="0.11.2", platform="cuda 12090"),
  }
  rows = []
  for op, versions in made.items():
    p = Problem(op, "pallas_gpu", "bfloat16", *SHAPE, "multinomial(seed=0)", (128,) * 4)
    dev = {**H100, "jax_version": versions.jax, "versions": versions}
    (cfg,) = search_space.candidates(p, 1, device_kind=kind)
    rows.append(store.make_row(p, "baseline:xla", None, "ok", interpret=False, device=dev, time_s=3e-3))
    rows.append(store.make_row(p, store.candidate_id(cfg), cfg, "ok", interpret=False, device=dev, time_s=1e-3))
  (lut,) = export.build_luts(rows).values()
  assert lut.meta["tuned_with"] == {"ragtune": "0.1.0", "platform": "cuda 12090"}
  assert lut.meta["exported_with"] == provenance.host().to_dict()
  for e in lut.entries():
    assert e.extra["versions"] == {"jax": made[e.op].jax, "jaxlib": made[e.op].jaxlib}
    assert provenance.of_entry(lut.meta, e) == made[e.op]
  warning = verify.version_warning(lut, lut.entries(), "lut.json")
  assert warning.startswith("lut.json: tuned under jax 0.10.2 and 0.11.2, jaxlib 0.10.2 and 0.11.2, verified under")

  # Rows of one jax version: all in tuned_with, nothing per entry.
  same = [r for r in rows if r.problem.op == "fwd"]
  (lut,) = export.build_luts(same).values()
  assert lut.meta["tuned_with"] == made["fwd"].to_dict() and all("versions" not in e.extra for e in lut.entries())
