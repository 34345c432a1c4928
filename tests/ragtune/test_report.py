"""show / report: the summary's columns, % of peak, 160-column --all, 4-significant-digit CSVs, PNG plots."""

import json
import re

import pandas as pd
from rich.console import Console
from typer.testing import CliRunner

import kernels
from ragtune.candidates import search_space
from ragtune.cli.app import app
from ragtune.device import ceilings
from ragtune.problems.shapes import Problem
from ragtune.records import plots, report, store

runner = CliRunner()
DEV = {"device_kind": "Fake GPU 80GB", "platform": "gpu", "jax_version": "0.0.1"}


def _results(tmp_path):
  """Two problems (prefill and decode) with baselines and candidates; one has none correct."""
  rows = []
  prefill = Problem("fwd", "pallas_gpu", "bfloat16", 4096, 4096, 14336, 8, "multinomial(seed=0)", (512,) * 8)
  decode = Problem("fwd", "pallas_gpu", "bfloat16", 16, 4096, 14336, 8, "multinomial(seed=0)", (2,) * 8)
  for p, scale in ((prefill, 1.0), (decode, 0.01)):
    rows.append(store.make_row(p, "baseline:xla", None, "ok", interpret=False, device=DEV, time_s=9.123456e-3 * scale))
    rows.append(
      store.make_row(p, "baseline:dense", None, "ok", interpret=False, device=DEV, time_s=1.2345678e-3 * scale)
    )
    for i, c in enumerate(search_space.candidates(p, 12)):
      rows.append(
        store.make_row(
          p,
          store.candidate_id(c),
          c,
          "ok",
          interpret=False,
          device=DEV,
          time_s=(1.5e-3 + i * 1.37e-4 + 1.11111e-7) * scale,
        )
      )
  broken = Problem("drhs", "pallas_gpu", "bfloat16", 64, 128, 128, 2, "multinomial(seed=0)", (32, 32))
  for c, s in zip(search_space.candidates(broken, 3), ("timeout", "timeout", "crash")):
    rows.append(store.make_row(broken, store.candidate_id(c), c, s, interpret=False, device=DEV, error="x"))
  out = tmp_path / "res"
  out.mkdir()
  (out / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
  ceilings.save(out, DEV, {"matmul_tflops": {"bfloat16": 800.0}, "copy_gbps": 3000.0})
  return out, prefill, decode


def test_show_has_the_summary_columns_and_percent_of_peak(tmp_path):
  out, prefill, decode = _results(tmp_path)
  df = report.best_frame(store.load_results([out]), ceilings.load([out])).set_index("m")
  best = df.loc[4096]
  assert best["bound"] == "compute" and abs(best["pct_peak"] - 100 * best["tflops"] / 800) < 1e-9
  assert df.loc[16, "bound"] == "memory" and abs(df.loc[16, "pct_peak"] - 100 * df.loc[16, "gbps"] / 3000) < 1e-9
  assert df.loc[64, "best_config"] == "no correct candidate: 2 timeout, 1 crash"
  r = runner.invoke(app, ["show", str(out)])
  assert r.exit_code == 0, r.output
  for col in ("best_ms", "pct_peak", "xla_ms", "default_ms", "vs_xla", "vs_default", "backend", "statuses"):
    assert col in r.output
  assert "% compute" in r.output and "% memory" in r.output


def test_show_all_fits_160_columns(tmp_path):
  out, _, _ = _results(tmp_path)
  r = runner.invoke(app, ["show", str(out), "--all"])
  assert r.exit_code == 0
  lines = r.output.splitlines()
  assert len(lines) > 20 and max(map(len, lines)) <= 160, max(map(len, lines))
  assert "block_m=" in r.output and "bm=" not in r.output, "config fields by their full names, as in the LUT"
  assert "[4096,4096]x[8,4096,14336]" in r.output, "the one printed shape form, [m,k]x[g,k,n]"
  # Baselines under their own names, not under the backend of the problem they were timed for.
  by_backend = {line.split()[1]: line for line in lines[1:] if "(baseline)" in line}
  assert set(by_backend) == {"xla", "dense"}, lines


def test_csvs_round_to_4_significant_digits_records_keep_full_precision(tmp_path):
  out, _, _ = _results(tmp_path)
  rep = tmp_path / "rep"
  r = runner.invoke(app, ["report", str(out), "-o", str(rep)])
  assert r.exit_code == 0, r.output
  rows = pd.read_csv(rep / "rows.csv")
  xla = rows[rows["candidate"] == "baseline:xla"]["time_s"].max()
  assert xla == 0.009123, "4 significant digits"
  assert any(r.time_s == 9.123456e-3 for r in store.ResultsStore(out).rows()), "records keep full precision"
  best = pd.read_csv(rep / "best.csv")
  assert (best["best_ms"].dropna().map(lambda v: len(f"{v:.10g}".replace(".", "").lstrip("0"))) <= 4).all()


def test_report_writes_readable_pngs_and_markdown(tmp_path):
  out, _, _ = _results(tmp_path)
  rep = tmp_path / "rep"
  r = runner.invoke(app, ["report", str(out), "-o", str(rep)])
  assert r.exit_code == 0, r.output
  names = ["fake-gpu-80gb-tflops.png", "fake-gpu-80gb-roofline.png", "fake-gpu-80gb-candidates.png"]
  for name in names:
    data = (rep / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
  md = (rep / "report.md").read_text()
  assert all(f"]({n})" in md for n in names) and "| op |" in md and "800 TF/s" in md
  assert not list(rep.glob(".*tmp*")), "files are written atomically"


def test_a_plot_that_fails_mid_write_leaves_neither_half_a_png_nor_its_temp_file(tmp_path, monkeypatch):
  out, _, _ = _results(tmp_path)
  rep = tmp_path / "rep"

  def disk_full(best, path, title):
    path.write_bytes(b"\x89PNG\r\n\x1a\n half of it")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(plots, "tflops_plot", disk_full)
  r = runner.invoke(app, ["report", str(out), "-o", str(rep)])
  assert r.exit_code == 2, r.output
  assert r.output.strip().splitlines()[-1] == (
    f"error: {rep / 'fake-gpu-80gb-tflops.png'}: cannot write (No space left on device)"
  ), r.output
  assert sorted(p.name for p in rep.iterdir()) == ["best.csv", "rows.csv"], "no temp file, no half a PNG"


def _model_results(tmp_path, interpret: bool):
  """Rows of two backends on DeepSeek-V3's and Llama-4-Maverick's layers (as labelled by a
  shapes file's model entries), with XLA and the default config as baselines."""
  out, rows, problems = tmp_path / "res", [], []
  for source, (m, k, n, g) in {
    "deepseek-v3:up:tokens=16384": (131072, 7168, 2048, 256),
    "llama-4-maverick:down:tokens=16384": (16384, 8192, 5120, 128),
  }.items():
    for backend, scale in (("pallas_gpu", 1.0), ("mosaic_gpu", 0.8)):
      p = Problem("fwd", backend, "bfloat16", m, k, n, g, "multinomial(seed=0)", (m // g,) * g, source)
      problems.append(p)
      dev = dict(DEV, device_kind="NVIDIA H100 80GB HBM3")
      rows.append(store.make_row(p, "baseline:xla", None, "ok", interpret=interpret, device=dev, time_s=9.87e-3))
      for i, c in enumerate(search_space.candidates(p, 3, device_kind=dev["device_kind"])):
        t = (2.5e-3 + i * 1.0e-3) * scale
        rows.append(store.make_row(p, store.candidate_id(c), c, "ok", interpret=interpret, device=dev, time_s=t))
  out.mkdir()
  (out / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
  return out, problems


def test_sweep_summary_fits_100_columns_without_wrapping(tmp_path):
  from ragtune.cli.views import summary_table
  from ragtune.run import sweep

  out, problems = _model_results(tmp_path, interpret=False)
  summaries = sweep.summarize(problems, store.ResultsStore(out).rows())
  console = Console(width=100, record=True)
  console.print(summary_table(summaries))
  lines = console.export_text().splitlines()
  assert max(map(len, lines)) <= 100, "\n".join(lines)
  for s in summaries:  # each problem on one line, every cell whole
    (line,) = [l for l in lines if l.startswith(s.problem.source) and f" fwd {s.problem.backend} " in l]
    assert s.winner in line and f"{s.baselines['xla'] / s.best.time_s:.2f}x" in line, line
  assert len(lines) == 3 + len(summaries), "title, header, rule, one line per problem"


def test_one_speedup_format_and_the_interpreter_notice_in_show_and_report(tmp_path):
  from ragtune.cli.views import summary_table
  from ragtune.records import summary
  from ragtune.run import sweep

  out, problems = _model_results(tmp_path, interpret=True)
  summaries = sweep.summarize(problems, store.ResultsStore(out).rows())
  speedups = [summary.speedup_text(s.baselines["xla"] / s.best.time_s) for s in summaries]
  assert all(re.fullmatch(r"\d+\.\d\dx", x) for x in speedups), speedups
  r = runner.invoke(app, ["show", str(out), "--csv", str(tmp_path / "show.csv")])
  assert r.exit_code == 0, r.output
  notice = "measured in Pallas interpret mode. Timings are of the interpreter, NOT GPU/TPU timings"
  assert notice in r.output
  rep = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / "rep")])
  assert rep.exit_code == 0 and notice in rep.output, rep.output
  md = (tmp_path / "rep" / "report.md").read_text()
  console = Console(width=100, record=True)
  console.print(summary_table(summaries))
  table = console.export_text()
  for text in (r.output, md, table):  # the same '5.48x' wherever a speedup is printed
    assert all(x in text for x in speedups), text
  csv = pd.read_csv(tmp_path / "show.csv")
  assert sorted(csv["vs_xla"].round(2)) == sorted(float(x[:-1]) for x in speedups), "CSVs keep the ratio"
  (tmp_path / "gpu").mkdir()
  r = runner.invoke(app, ["show", str(_results(tmp_path / "gpu")[0])])
  assert r.exit_code == 0 and "interpret mode" not in r.output, "no notice for device timings"


def _model_records():
  """Eight fwd problems as `models:` in a shape file names them (Mixtral-8x7B and DeepSeek-V3,
  up and down, decode and prefill), timed near an H100's roofs, XLA 3x slower."""
  from ragtune.device import measure
  from ragtune.problems import presets
  from ragtune.problems.shapes import GroupDist

  dev = {"device_kind": "NVIDIA H100 80GB HBM3", "platform": "gpu", "jax_version": "0.11.2"}
  rows = []
  for i, (model, tokens) in enumerate(
    (("mixtral-8x7b", 16), ("mixtral-8x7b", 4096), ("deepseek-v3", 64), ("deepseek-v3", 16384))
  ):
    pre = presets.MODEL_PRESETS[model]
    m = tokens * pre.top_k
    for proj, (k, n) in (("up", (pre.hidden, pre.intermediate)), ("down", (pre.intermediate, pre.hidden))):
      sizes = tuple(int(s) for s in GroupDist().draw(m, pre.experts))
      p = Problem(
        "fwd",
        "pallas_gpu",
        "bfloat16",
        m,
        k,
        n,
        pre.experts,
        "multinomial(seed=0)",
        sizes,
        f"{model}:{proj}:tokens={tokens}",
      )
      t = max(measure.flops(p) / 600e12, measure.bytes_moved(p) / 2400e9) * (1 + 0.05 * i)
      rows.append(store.make_row(p, "baseline:xla", None, "ok", interpret=False, device=dev, time_s=3 * t))
      c = search_space.candidates(p, 1)[0]
      rows.append(store.make_row(p, store.candidate_id(c), c, "ok", interpret=False, device=dev, time_s=t))
  roofs = {"matmul_tflops": {"bfloat16": 800.0}, "copy_gbps": 3000.0}  # as ceilings.json holds them
  return rows, {f"{dev['device_kind']}|{dev['jax_version']}": {**dev, **roofs}}


def _text_boxes(fig, labels):
  from matplotlib.text import Text

  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  return [Text.get_window_extent(a, renderer) for a in labels]  # the text alone, without its leader line


def test_roofline_labels_name_up_and_down_apart_and_never_overlap():
  from ragtune.records import plots

  records, ceil = _model_records()
  fig, labels = plots.roofline_figure(plots.plot_frame(records, ceil), ceil, records[0].device_kind, "0.11.2", "t")
  texts = [a.get_text() for a in labels]
  assert len(texts) == 8 and len(set(texts)) == 8, texts
  assert {"mixtral-8x7b up 4096 tok fwd", "mixtral-8x7b down 4096 tok fwd"} <= set(texts), texts
  boxes = _text_boxes(fig, labels)
  clashes = [(texts[i], texts[j]) for i in range(8) for j in range(i + 1, 8) if boxes[i].overlaps(boxes[j])]
  assert not clashes, clashes
  assert all(fig.bbox.contains(b.x0, b.y0) and fig.bbox.contains(b.x1, b.y1) for b in boxes)


def test_labels_that_cannot_all_fit_become_numbers_and_a_key():
  from ragtune.records import plots

  plt = plots._pyplot()
  fig, ax = plt.subplots(figsize=(3, 2))
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1)
  texts = [f"a rather long label for problem number {i}" for i in range(12)]
  labels = plots.label_points(ax, [0.5] * 12, [0.5] * 12, texts, [])
  assert [a.get_text() for a in labels] == [str(i) for i in range(1, 13)]
  boxes = _text_boxes(fig, labels)
  assert not any(boxes[i].overlaps(boxes[j]) for i in range(12) for j in range(i + 1, 12))
  key = [t.get_text() for t in ax.texts if t not in labels]
  assert len(key) == 1 and all(f"{i + 1:>3}  {t}" in key[0] for i, t in enumerate(texts))
  plt.close(fig)


def test_show_and_lut_entries_list_ops_fwd_dlhs_drhs(tmp_path):
  """One order of ops everywhere (kernels.common.op_order), as sweep runs them; not alphabetical."""
  rows = []
  for op in ("drhs", "fwd", "dlhs"):
    p = Problem(op, "pallas_gpu", "bfloat16", 64, 128, 128, 2, "multinomial(seed=0)", (32, 32))
    c = search_space.candidates(p, 1)[0]
    rows.append(store.make_row(p, store.candidate_id(c), c, "ok", interpret=False, device=DEV, time_s=1e-3))
  out = tmp_path / "res"
  out.mkdir()
  (out / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
  assert list(report.best_frame(store.load_results([out]))["op"]) == ["fwd", "dlhs", "drhs"]
  r = runner.invoke(app, ["show", str(out)])
  assert r.exit_code == 0, r.output
  assert [line.split()[0] for line in r.output.splitlines()[1:4]] == ["fwd", "dlhs", "drhs"], r.output
  lut = kernels.Lut(
    "cpu", [kernels.Entry(op, "pallas_gpu", "bfloat16", 64, 128, 128, 2, None) for op in kernels.common.OPS[::-1]]
  )
  assert [e.op for e in lut.entries()] == ["fwd", "dlhs", "drhs"]


def test_show_json_is_one_document_with_stable_keys(tmp_path):
  out, prefill, _ = _results(tmp_path)
  r = runner.invoke(app, ["show", str(out), "--json"])
  assert r.exit_code == 0, r.output
  doc = json.loads(r.stdout)
  assert (doc["schema"], doc["schema_version"], doc["view"]) == ("ragtune-show", 1, "best")
  assert all(list(row) == report.BEST_COLUMNS for row in doc["rows"]) and len(doc["rows"]) == 3
  best = next(row for row in doc["rows"] if row["m"] == prefill.m)
  assert best["shape"] == "[4096,4096]x[8,4096,14336]" and "block_m=" in best["best_config"]
  broken = next(row for row in doc["rows"] if row["op"] == "drhs")
  assert broken["best_ms"] is None and broken["vs_xla"] is None, "no value is null, not NaN"

  r = runner.invoke(app, ["show", str(out), "--all", "--json"])
  assert r.exit_code == 0, r.output
  doc = json.loads(r.stdout)
  assert doc["view"] == "all" and len(doc["rows"]) == len(store.load_results([out]))
  assert all(list(row) == [*report.ROW_COLUMNS, "shape", "config", "baseline"] for row in doc["rows"])
  assert {row["baseline"] for row in doc["rows"]} == {"xla", "dense", None}
  cand = next(row for row in doc["rows"] if row["baseline"] is None)
  assert set(cand["config"]) >= {"block_m", "block_k", "block_n"}
  help_text = " ".join(runner.invoke(app, ["show", "--help"]).output.split())
  documented = help_text.partition("--json")[2]
  assert all(f"{key}," in documented or f"{key}." in documented for key in report.BEST_COLUMNS), "--help lists the keys"
  assert all(k in documented for k in (*report.ROW_COLUMNS, "shape", "config", "baseline"))


def test_show_in_a_terminal_is_a_rich_table(tmp_path, monkeypatch):
  import ragtune.cli.app as app_mod

  out, _, _ = _results(tmp_path)
  term = Console(force_terminal=True, width=200, emoji=False, record=True)
  monkeypatch.setattr(app_mod, "console", term)
  r = runner.invoke(app, ["show", str(out)])
  assert r.exit_code == 0, r.output
  text = term.export_text()
  assert "best correct config per problem" in text and "─" in text and "block_m=" in text, text
  assert "[4096,4096]x[8,4096,14336]" in text, text


def test_a_stored_config_prints_in_its_config_class_order_as_verify_prints_it():
  """records.jsonl stores a config's fields sorted; show, report and verify print them alike."""
  from kernels import registry

  cfg = registry.default_config("pallas_gpu", "fwd", "bfloat16", 96, 64, 80, 4)
  stored = dict(sorted(cfg.to_dict().items()))
  assert list(stored) != list(cfg.to_dict()), "sorted differs from the class's order"
  assert report.config_text(stored, "pallas_gpu") == report.config_text(cfg.to_dict())
  assert report.config_text(stored, "pallas_gpu").startswith("block_m=")
