"""XLA as a candidate backend: export-lut writes an xla entry where XLA's own op is fastest,
Lut.query follows it, merging stays order-independent, and the tables name the winner."""

import dataclasses
import json

import pytest
from conftest import entry_config, entry_pick
from rich.console import Console
from typer.testing import CliRunner

import kernels
from ragtune.candidates import search_space
from ragtune.cli.app import app
from ragtune.cli.views import summary_table
from ragtune.lut import export
from ragtune.problems.shapes import Problem
from ragtune.records import report, store, summary
from ragtune.run import sweep

runner = CliRunner()
DEV = {"device_kind": "NVIDIA H100 80GB HBM3", "platform": "gpu", "jax_version": "0.0.1"}
XLA_WINS = (256, 128, 128, 4)  # xla 1.0 ms, mosaic_gpu 1.5, pallas_gpu 2.0
MOSAIC_WINS = (512, 256, 384, 4)  # mosaic_gpu 1.0 ms, pallas_gpu 1.31, xla 3.0


def _problem(backend, shape):
  m, k, n, g = shape
  return Problem("fwd", backend, "bfloat16", m, k, n, g, "multinomial(seed=0)", (m // g,) * g)


def _cfg(backend, shape):
  m, k, n, g = shape
  return kernels.registry.default_config(backend, "fwd", "bfloat16", m, k, n, g, device_kind=DEV["device_kind"])


def _rows(backend, shape, best_s, xla_s, stamp="2026-01-01T00:00:00+00:00"):
  """One problem's rows as the sweep writes them: two baselines, then the default config
  (best_s) and a slower one; a third config is fast but wrong."""
  p = _problem(backend, shape)
  mk = lambda cand, cfg, status, t=None: dataclasses.replace(
    store.make_row(p, cand, cfg, status, interpret=False, device=DEV, time_s=t), timestamp=stamp
  )
  default, slower, wrong = search_space.candidates(p, 3, device_kind=DEV["device_kind"])
  assert default == _cfg(backend, shape)
  return [
    mk("baseline:xla", None, "ok", xla_s),
    mk("baseline:dense", None, "ok", xla_s / 2),
    mk(store.candidate_id(default), default, "ok", best_s),
    mk(store.candidate_id(slower), slower, "ok", best_s * 1.7),
    mk(store.candidate_id(wrong), wrong, "wrong", None),
  ]


def _folders(tmp_path):
  """Folder a: the pallas_gpu problems; folder b: the mosaic_gpu ones. Each times XLA itself:
  on XLA_WINS both folders measured XLA at exactly 1.0 ms (a tie broken by folder, not order)."""
  a = _rows("pallas_gpu", XLA_WINS, 2.0e-3, 1.0e-3, "2026-01-01T00:00:00+00:00") + _rows(
    "pallas_gpu", MOSAIC_WINS, 1.31e-3, 3.2e-3
  )
  b = _rows("mosaic_gpu", XLA_WINS, 1.5e-3, 1.0e-3, "2026-02-02T00:00:00+00:00") + _rows(
    "mosaic_gpu", MOSAIC_WINS, 1.0e-3, 3.0e-3
  )
  dirs = []
  for name, rows in (("a", a), ("b", b)):
    d = tmp_path / name
    d.mkdir()
    (d / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    dirs.append(d)
  return dirs


def test_export_writes_xla_where_it_is_fastest_and_choose_follows(tmp_path):
  a, b = _folders(tmp_path)
  (lut,) = export.build_luts(store.load_results([a, b])).values()
  kinds = {(e.backend, (e.m, e.k, e.n, e.g)) for e in lut.entries()}
  assert kinds == {
    ("pallas_gpu", XLA_WINS),
    ("mosaic_gpu", XLA_WINS),
    ("xla", XLA_WINS),
    ("pallas_gpu", MOSAIC_WINS),
    ("mosaic_gpu", MOSAIC_WINS),
  }, "xla only where it wins"
  xla = next(e for e in lut.entries() if e.backend == "xla")
  assert xla.config is None and xla.to_dict()["config"] == {} and xla.extra["time_s"] == 1.0e-3
  assert xla.extra["runner_up"] == {"backend": "mosaic_gpu", "time_s": 1.5e-3, "speedup": 1.5}

  # Through the file format, as a model loads it.
  path = tmp_path / "lut.json"
  export.write_luts({lut.device_kind: lut}, path)
  lut = kernels.Lut.from_file(path)
  assert entry_pick(lut.query("fwd", *XLA_WINS, "bfloat16")) == ("xla", None)
  assert entry_pick(lut.query("fwd", 250, 128, 128, 4, "bfloat16")) == ("xla", None), "nearest shape, then fastest"
  assert entry_pick(lut.query("fwd", *MOSAIC_WINS, "bfloat16")) == ("mosaic_gpu", _cfg("mosaic_gpu", MOSAIC_WINS))
  # Every backend keeps its own best entry for an explicit backend; never the wrong config.
  for backend in ("pallas_gpu", "mosaic_gpu"):
    for shape in (XLA_WINS, MOSAIC_WINS):
      assert entry_config(lut.query("fwd", *shape, "bfloat16", backend=backend)) == _cfg(backend, shape)


def test_xla_entry_only_when_strictly_fastest_and_never_where_xla_failed(tmp_path):
  rows = _rows("pallas_gpu", XLA_WINS, 1.0e-3, 1.0e-3)  # a tie goes to the kernel
  (lut,) = export.build_luts(rows).values()
  assert {e.backend for e in lut.entries()} == {"pallas_gpu"}
  failed = [r if r.baseline else dataclasses.replace(r, status="timeout", time_s=None) for r in rows]
  (lut,) = export.build_luts(failed).values()
  assert [(e.backend, e.extra["runner_up"]) for e in lut.entries()] == [("xla", None)]
  # XLA failed on another draw of the shape (a timeout, say): distrusted there, as a config would be.
  draw = dataclasses.replace(rows[0].problem, group_sizes=(100, 50, 50, 56))
  other = [dataclasses.replace(r, problem=draw, status="timeout", time_s=None) for r in rows if r.baseline == "xla"]
  assert export.build_luts(failed + other) == {}


def test_merging_with_xla_entries_is_order_independent(tmp_path):
  a, b = _folders(tmp_path)
  strip = lambda luts: {k: [e.to_dict() for e in v.entries()] for k, v in luts.items()}
  ab = strip(export.build_luts(store.load_results([a, b])))
  ba = strip(export.build_luts(store.load_results([b, a])))
  assert ab == ba
  (entries,) = ab.values()
  assert [e["measured"] for e in entries if e["backend"] == "xla"] == ["2026-01-01T00:00:00+00:00"]


@pytest.mark.parametrize("shape, text", [(XLA_WINS, "xla 1.50x"), (MOSAIC_WINS, "mosaic_gpu 1.31x")])
def test_show_and_sweep_summary_name_the_winner(tmp_path, shape, text):
  a, b = _folders(tmp_path)
  rows = store.load_results([a, b])
  df = report.best_frame(rows)
  mine = df[df["m"] == shape[0]]
  assert list(mine["winner"]) == [text, text], "both backends' lines name the same winner"
  assert set(mine["runner_up"]) == {"mosaic_gpu" if shape == XLA_WINS else "pallas_gpu"}

  r = runner.invoke(app, ["show", str(a), str(b)])
  assert r.exit_code == 0, r.output
  lines = r.output.splitlines()
  assert "winner" in lines[0] and "max_concurrent_steps=4 group_m=16" in r.output and " bf16 " in r.output, (
    "config fields by their full names, dtypes abbreviated for width"
  )
  assert sum(text in line for line in lines) == 2

  summaries = sweep.summarize([_problem("pallas_gpu", shape), _problem("mosaic_gpu", shape)], rows)
  assert [s.winner for s in summaries] == [text, text]
  console = Console(width=250, record=True)
  console.print(summary_table(summaries))
  out = console.export_text()
  assert "winner" in out and out.count(text) == 2


def test_a_kernel_alone_wins_without_a_ratio_and_nothing_timed_is_a_dash():
  assert summary.winner_text({"pallas_gpu": 1e-3}) == "pallas_gpu"
  assert summary.winner_text({}) == "-"
  assert summary.winner_text({"xla": 2e-3, "pallas_gpu": 2e-3}) == "pallas_gpu 1.00x", "ties: registry order"
