"""`ragtune report` figures and report.md. matplotlib is an optional extra: `python3 -m pip install -e '.[report]'`.

Per device kind:
- <slug>-tflops.png:     per problem, TF/s of the tuned kernel, the default config, XLA and a dense matmul;
- <slug>-roofline.png:   every problem's best against the measured matmul and copy ceilings;
- <slug>-candidates.png: the distribution of candidate times per problem, with default and XLA marked.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

import kernels
from kernels.lut import shape_text
from ragtune import paths
from ragtune.device import ceilings as ceilings_mod
from ragtune.errors import install_hint
from ragtune.filekind import REPORT_MD_MARK, Kind
from ragtune.paths import atomic_path
from ragtune.records import report
from ragtune.records.store import Record

OP_MARKERS = {"fwd": "o", "dlhs": "s", "drhs": "^"}
COLORS = {"tuned": "#1f77b4", "default": "#9ecae1", "xla": "#ff7f0e", "dense": "#7f7f7f"}


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")  # files only; never needs a display
  import matplotlib.pyplot as plt

  return plt


def _plain_log_ticks(axis) -> None:
  from matplotlib.ticker import FuncFormatter, LogLocator

  axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
  axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
  axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _legend_above(ax, ncol: int) -> None:
  ax.legend(fontsize=8, ncol=ncol, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)


def _label(r) -> str:
  dt = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(r["dtype"], r["dtype"])
  return f"{r['op']} {dt} {shape_text(r['m'], r['k'], r['n'], r['g'])}"


def _flops(r) -> float:
  return 2.0 * r["rows"] * r["k"] * r["n"]


def plot_frame(records: list[Record], ceil: dict) -> pd.DataFrame:
  """report.best_frame with what the plots add per problem: its routed rows (the sum of its
  group sizes, for the baselines' FLOPs) and where the shape file has it (`source`)."""
  best = report.best_frame(records, ceil)
  best["rows"] = best["problem"].map({r.problem.key: sum(r.problem.group_sizes or (r.problem.m,)) for r in records})
  best["source"] = best["problem"].map({r.problem.key: r.problem.source for r in records})
  return best


def tflops_plot(best: pd.DataFrame, path: Path, title: str) -> None:
  plt = _pyplot()
  df = best.sort_values(["op", "dtype", "m", "k", "n"]).reset_index(drop=True)
  series = [
    ("tuned", "best_ms"),
    ("default config", "default_ms"),
    ("XLA ragged_dot", "xla_ms"),
    ("dense matmul, same FLOPs", "dense_ms"),
  ]
  colors = [COLORS["tuned"], COLORS["default"], COLORS["xla"], COLORS["dense"]]
  n = len(df)
  fig, ax = plt.subplots(figsize=(10, 1.8 + 0.75 * n))
  h = 0.8 / len(series)
  values = {}
  for i, ((name, col), color) in enumerate(zip(series, colors)):
    tf = [_flops(r) / (r[col] / 1e3) / 1e12 if r[col] and not math.isnan(r[col]) else 0 for _, r in df.iterrows()]
    values[name] = tf
    ys = [y + (i - 1.5) * h for y in range(n)]
    ax.barh(ys, tf, height=h, color=color, label=name)
    for y, v in zip(ys, tf):
      if v:
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=6.5, color="#333333")
  positive = [v for tf in values.values() for v in tf if v > 0]
  if positive and max(positive) / min(positive) > 30:  # decode and prefill on one axis
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
  if positive:
    ax.set_xlim(right=max(positive) * (3 if ax.get_xscale() == "log" else 1.15))
  ax.set_yticks(range(n))
  ax.set_yticklabels([_label(r) for _, r in df.iterrows()], fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel("TF/s (higher is better)")
  fig.suptitle(title, fontsize=10)
  _legend_above(ax, 4)
  ax.grid(axis="x", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def point_labels(df: pd.DataFrame) -> list[str]:
  """A distinct label per problem. The shape file's model preset, projection and token count
  where it names them (an up and a down projection share m and g, and their points sit at one
  arithmetic intensity), else the shape; the backend or dtype only where the frame has several."""
  several = {c: df[c].nunique() > 1 for c in ("backend", "dtype")}
  labels = []
  for _, r in df.iterrows():
    model, _, rest = str(r.get("source") or "").partition(":")
    proj, _, tokens = rest.partition(":tokens=")
    tokens, _, layout = tokens.partition(":")  # e.g. "4096:ep=8:tp=2"
    shape = shape_text(r["m"], r["k"], r["n"], r["g"])
    name = f"{model} {proj} {tokens} tok {layout.replace(':', ' ')}".strip() if tokens else shape
    parts = [name, r["op"]] + [report.DTYPE_ABBREV.get(r[c], r[c]) for c in ("backend", "dtype") if several[c]]
    labels.append(" ".join(parts))
  seen = pd.Series(labels).duplicated(keep=False)
  return [f"{t} {r['group_dist']}" if dup else t for t, dup, (_, r) in zip(labels, seen, df.iterrows())]


# Where a label may go, in points from its marker: nearest first, every side, so a cluster
# of points (up and down of one model share their x) fans its labels out.
_RADII = (7, 16, 27, 40, 55, 72)
_ANGLES = (15, -15, 50, -50, 165, 195, 90, 270, 130, 230)


def place_labels(ax, xs: list[float], ys: list[float], texts: list[str], avoid: list[tuple[float, float]]):
  """Annotate each point with its text at the first place of _RADII x _ANGLES where the
  text's box overlaps no other label, no marker (the points' and those in `avoid`) and no
  legend, and stays in the figure, with a leader line when it sits away from its point; where none is
  free, at the place of least overlap. Needs the figure's final layout.
  Returns (the annotations, whether every one found a free place)."""
  from matplotlib.transforms import Bbox

  fig = ax.figure
  renderer = fig.canvas.get_renderer()
  marks = [ax.transData.transform(xy) for xy in [*zip(xs, ys), *avoid] if all(map(math.isfinite, xy))]
  taken = [Bbox.from_bounds(px - 5, py - 5, 10, 10) for px, py in marks]
  taken += [ax.get_legend().get_window_extent(renderer)] if ax.get_legend() else []
  placed, all_free = [], True
  for x, y, text in zip(xs, ys, texts):
    best, best_cost = None, math.inf
    for radius, angle in ((r, a) for r in _RADII for a in _ANGLES):
      dx, dy = radius * math.cos(math.radians(angle)), radius * math.sin(math.radians(angle))
      where = dict(
        xytext=(dx, dy),
        textcoords="offset points",
        ha="left" if dx >= 0 else "right",
        va="center" if abs(dy) < radius / 2 else ("bottom" if dy > 0 else "top"),
      )
      ann = ax.annotate(text, (x, y), fontsize=6.5, color="#333333", annotation_clip=False, **where)
      box = ann.get_window_extent(renderer).padded(2)  # the text alone: no leader line yet
      ann.remove()
      outside = not (fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1))
      cost = sum(box.overlaps(t) for t in taken) + outside
      if cost < best_cost:
        best, best_cost = (where, box, radius), cost
      if cost == 0:
        break
    where, box, radius = best
    line = {"arrowstyle": "-", "color": "#999999", "lw": 0.5} if radius > _RADII[0] else None
    placed.append(
      ax.annotate(text, (x, y), fontsize=6.5, color="#333333", annotation_clip=False, arrowprops=line, **where)
    )
    taken.append(box)
    all_free &= best_cost == 0
  return placed, all_free


def label_points(ax, xs: list[float], ys: list[float], texts: list[str], avoid: list[tuple[float, float]]) -> list:
  """Each label beside its point when every one finds a free place; otherwise a number
  beside each point and, right of the axes, the key of numbered labels. Returns the
  annotations beside the points."""
  labels, fit = place_labels(ax, xs, ys, texts, avoid)
  if fit:
    return labels
  for a in labels:
    a.remove()
  numbers, _ = place_labels(ax, xs, ys, [str(i) for i in range(1, len(texts) + 1)], avoid)
  key = "\n".join(f"{i:>3}  {t}" for i, t in enumerate(texts, 1))
  ax.text(1.02, 1.0, key, transform=ax.transAxes, va="top", ha="left", fontsize=6.5, family="monospace")
  return numbers


def roofline_figure(best: pd.DataFrame, ceil: dict, device_kind: str, jax_version: str | None, title: str):
  """(figure, its point labels): each problem's best (filled) and XLA (hollow) under the roofs."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(9, 6))
  df = best[best["best_ms"].notna()].reset_index(drop=True)
  ai = df["tflops"] * 1e12 / (df["gbps"] * 1e9)
  lo = max(1e-2, float(ai.min()) / 4) if len(ai) else 0.1
  hi = float(ai.max()) * 4 if len(ai) else 1e3
  xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
  drawn = False
  for dtype in sorted(df["dtype"].unique()):
    tf, bw = ceilings_mod.peaks(ceil, device_kind, jax_version, dtype)
    if tf and bw:
      ax.plot(
        xs, [min(tf, x * bw * 1e9 / 1e12) for x in xs], "-", lw=1.5, label=f"roof {dtype}: {tf:.4g} TF/s, {bw:.4g} GB/s"
      )
      drawn = True
  xla_tf = [
    _flops(r) / (r["xla_ms"] / 1e3) / 1e12 if r["xla_ms"] and not math.isnan(r["xla_ms"]) else float("nan")
    for _, r in df.iterrows()
  ]
  for op in sorted(df["op"].unique()):
    sel = df["op"] == op
    marker = OP_MARKERS.get(op, "o")
    ax.scatter(ai[sel], df["tflops"][sel], marker=marker, s=45, color=COLORS["tuned"], label=f"{op}, tuned", zorder=3)
    ax.scatter(
      ai[sel],
      [t for t, keep in zip(xla_tf, sel) if keep],
      marker=marker,
      s=45,
      facecolors="none",
      edgecolors=COLORS["xla"],
      label=f"{op}, XLA",
      zorder=3,
    )
  ax.set_xscale("log")
  ax.set_yscale("log")
  _plain_log_ticks(ax.xaxis)
  _plain_log_ticks(ax.yaxis)
  ax.set_xlabel("arithmetic intensity (FLOP per byte of weights + activations)")
  ax.set_ylabel("TF/s")
  fig.suptitle(title + ("" if drawn else "\n(no measured ceilings in these results)"), fontsize=10)
  ax.grid(which="both", alpha=0.25)
  _legend_above(ax, 3)
  fig.tight_layout()
  ax.set_xlim(ax.get_xlim())  # the layout and limits are final before labels are placed in pixels
  ax.set_ylim(ax.get_ylim())
  labels = label_points(ax, list(ai), list(df["tflops"]), point_labels(df), list(zip(ai, xla_tf)))
  return fig, labels


def roofline_plot(
  best: pd.DataFrame, ceil: dict, device_kind: str, jax_version: str | None, path: Path, title: str
) -> None:
  fig, _ = roofline_figure(best, ceil, device_kind, jax_version, title)
  fig.savefig(path, dpi=110, bbox_inches="tight")  # labels may sit past the axes
  _pyplot().close(fig)


def candidates_plot(records: list[Record], best: pd.DataFrame, path: Path, title: str) -> None:
  plt = _pyplot()
  order = best.sort_values(["op", "dtype", "m", "k", "n"])
  n = len(order)
  fig, ax = plt.subplots(figsize=(10, 1.8 + 0.6 * n))
  by_problem: dict[str, list[Record]] = {}
  for r in records:
    if not r.baseline:
      by_problem.setdefault(r.problem.key, []).append(r)
  data, labels = [], []
  for y, (_, b) in enumerate(order.iterrows()):
    cands = by_problem.get(b["problem"], [])
    ok = [r.time_s * 1e3 for r in cands if r.ok]
    data.append(ok or [float("nan")])
    failed = sum(r.status != "ok" for r in cands)
    labels.append(_label(b) + (f"  ({failed} failed)" if failed else ""))
    ax.scatter(
      ok, [y] * len(ok), s=10, alpha=0.5, color=COLORS["tuned"], zorder=2, label="candidates" if y == 0 else None
    )
    if not math.isnan(b["default_ms"]):
      ax.scatter(
        [b["default_ms"]], [y], marker="|", s=250, color="black", zorder=3, label="default config" if y == 0 else None
      )
    if not math.isnan(b["xla_ms"]):
      ax.scatter(
        [b["xla_ms"]], [y], marker="x", s=50, color=COLORS["xla"], zorder=3, label="XLA ragged_dot" if y == 0 else None
      )
  style = dict(
    positions=range(n),
    widths=0.5,
    showfliers=False,
    medianprops={"color": "#333333"},
    boxprops={"color": "#999999"},
    whiskerprops={"color": "#999999"},
    capprops={"color": "#999999"},
  )
  try:
    ax.boxplot(data, orientation="horizontal", **style)  # matplotlib >= 3.10
  except TypeError:
    ax.boxplot(data, vert=False, **style)
  ax.set_yticks(range(n))
  ax.set_yticklabels(labels, fontsize=8)
  ax.invert_yaxis()
  ax.set_xscale("log")
  _plain_log_ticks(ax.xaxis)
  ax.set_xlabel("time per call, ms (log scale; lower is better)")
  fig.suptitle(title, fontsize=10)
  ax.grid(axis="x", which="both", alpha=0.25)
  _legend_above(ax, 3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _md_table(df: pd.DataFrame) -> str:
  def cell(v):
    if isinstance(v, float):
      return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v).replace("|", "\\|")

  head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
  return head + "".join("| " + " | ".join(cell(v) for v in r) + " |\n" for r in df.itertuples(index=False))


PLOTS = ("tflops", "roofline", "candidates")  # <device-slug>-<plot>.png


def check_output(out: Path, force: bool) -> None:
  """Refuse, before anything is read, a report folder whose best.csv, rows.csv, report.md or
  plots were not written by `ragtune report` (unless force)."""
  paths.writable_dir(out, "the report folder")
  own = [(out / "best.csv", Kind.REPORT_CSV), (out / "rows.csv", Kind.REPORT_CSV), (out / "report.md", Kind.REPORT_MD)]
  own += [(p, Kind.PNG) for plot in PLOTS for p in sorted(out.glob(f"*-{plot}.png"))]
  for path, kind in own:
    paths.output_file(path, "a report file", kind, force=force)


def write_report(records: list[Record], ceil: dict, out: Path) -> list[Path]:
  """PNGs (when matplotlib is installed) and report.md beside them. Returns what was written."""
  try:
    _pyplot()
    have_plots = True
  except ImportError:
    have_plots = False
  written, md = [], [REPORT_MD_MARK, ""]
  for kind in sorted({r.device_kind for r in records}):
    kind_rows = [r for r in records if r.device_kind == kind]
    best = plot_frame(kind_rows, ceil)
    jax_version = next((r.jax_version for r in kind_rows if r.jax_version is not None), None)
    interp = any(r.interpret for r in kind_rows)
    slug = kernels.device_slug(kind)
    note = " (CPU: Pallas interpret-mode wall clock, not GPU timings)" if interp else ""
    md += [f"## {kind}{note}", ""]
    tf, bw = zip(*[ceilings_mod.peaks(ceil, kind, jax_version, d) for d in sorted(best["dtype"].unique())])
    if any(bw):
      peaks = ", ".join(f"{d} matmul {t:.4g} TF/s" for d, t in zip(sorted(best["dtype"].unique()), tf) if t)
      md += [f"Measured ceilings: {peaks}; copy {next(b for b in bw if b):.4g} GB/s.", ""]
    md += [_md_table(report.printable(report.show_best(kind_rows, ceil))), ""]
    step = report.step_totals(best)
    if step is not None and step[2]:
      tuned, xla, n, left = step
      without = f"; {left} without a correct config or an XLA time left out" if left else ""
      md += [
        f"A step's grouped matmuls ({n} problems, each times its calls a step{without}): {tuned:.4g} ms at "
        f"the fastest correct configs, {xla:.4g} ms at XLA's ragged_dot ({xla / tuned:.2f}x).",
        "",
      ]
    if have_plots:
      figs = [
        (
          f"{slug}-tflops.png",
          "TF/s per problem: tuned vs default vs XLA vs dense",
          lambda p: tflops_plot(best, p, f"{kind}: TF/s per problem{note}"),
        ),
        (
          f"{slug}-roofline.png",
          "Roofline against the measured ceilings",
          lambda p: roofline_plot(best, ceil, kind, jax_version, p, f"{kind}: roofline{note}"),
        ),
        (
          f"{slug}-candidates.png",
          "Candidate times per problem",
          lambda p: candidates_plot(kind_rows, best, p, f"{kind}: candidate times per problem{note}"),
        ),
      ]
      for name, caption, draw in figs:
        with atomic_path(out / name) as tmp:  # like every file we write; no temp left on a failure
          draw(tmp)
        written.append(out / name)
        md += [f"### {caption}", "", f"![{caption}]({name})", ""]
  if not have_plots:
    md += [f"(No plots: install the optional extra with `{install_hint('report')}`.)", ""]
  paths.write_atomic(out / "report.md", "\n".join(md))
  return written + [out / "report.md"]
