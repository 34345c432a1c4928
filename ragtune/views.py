"""The CLI's rich tables: the sweep summary, the plan, and the deviceless compile report."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from ragtune import ceilings as ceilings_mod
from ragtune.report import short_config

SHAPE = escape("shape [m,k]x[g,k,n]")


def _table(title: str, columns) -> Table:
  t = Table(title=title)
  for col in columns:
    t.add_column(col, overflow="fold")
  return t


def summary_table(summaries, ceil=None) -> Table:
  """One row per problem: its best correct config, the baselines, the winner and statuses."""
  t = _table(
    "sweep summary (best correct config per problem)",
    (
      "op",
      "backend",
      "dtype",
      SHAPE,
      "best ms",
      "TF/s",
      "% peak",
      "xla ms",
      "default ms",
      "vs xla",
      "vs default",
      "winner",
      "statuses",
      "best config",
    ),
  )
  fmt = lambda v: f"{v * 1e3:.4g}" if v else "-"
  for s in summaries:
    p, b, base = s.problem, s.best, s.baselines
    pct, bound = ceilings_mod.pct_of_peak(b, ceil or {}) if b else (None, "")
    t.add_row(
      p.op,
      p.backend,
      p.dtype,
      p.shape_label,
      fmt(b.time_s) if b else "-",
      f"{b.tflops:.4g}" if b else "-",
      f"{pct:.3g}% {bound}" if pct is not None else "-",
      fmt(base["xla"]),
      fmt(base["default"]),
      f"{base['xla'] / b.time_s:.2f}x" if b and base["xla"] else "-",
      f"{base['default'] / b.time_s:.2f}x" if b and base["default"] else "-",
      s.winner,
      s.statuses or "-",
      short_config(b.config) if b else s.why,
    )
  return t


def plan_table(rows: list[dict[str, Any]]) -> Table:
  """One row per problem: candidates after pruning, rows done and to do, estimated time."""
  pruned = any(r.get("rejected") for r in rows)  # by a deviceless compile (plan --target)
  t = _table(
    "plan",
    ("op", "backend", "dtype", SHAPE, "candidates")
    + (("compile-rejected",) if pruned else ())
    + ("rows done", "rows to do", "est. time"),
  )
  for r in rows:
    p = r["problem"]
    est = f"{r['est_s']:.0f}s" if r["est_s"] is not None else "-"
    t.add_row(
      p.op,
      p.backend,
      p.dtype,
      p.shape_label,
      str(r["candidates"]),
      *((str(r.get("rejected", 0)),) if pruned else ()),
      str(r["done"]),
      str(r["todo"]),
      est,
    )
  return t


def plan_footer(rows: list[dict[str, Any]]) -> str:
  todo = sum(r["todo"] for r in rows)
  known = [r["est_s"] for r in rows if r["est_s"] is not None]
  est = (
    f", about {sum(known):.0f}s" + (" (partial estimate)" if len(known) < len(rows) else "")
    if known
    else " (no time estimate until some rows are recorded)"
  )
  return f"{len(rows)} problems, {todo} measurements to do (candidates and the 2 baselines per problem){est}"


def compile_table(kind: str, items, reports: dict[int, dict[str, Any]], ok: str) -> Table:
  """One row per kernel of each (problem, config) compiled deviceless for `kind`."""
  t = _table(
    f"deviceless compile for {kind} (default configs)",
    ("op", "backend", SHAPE, "config", "outcome", "regs", "spill B", "smem KiB", "mma", "copy", "s"),
  )
  for i, (p, cfg) in enumerate(items):
    rep = reports[i]
    for kr in rep["kernels"] or [{}]:
      smem = kr.get("smem_bytes")
      t.add_row(
        p.op,
        p.backend,
        p.shape_label,
        short_config(cfg.to_dict()),
        rep["outcome"] if rep["outcome"] == ok else f"{rep['outcome']}: {rep['error'][:120]}",
        str(kr.get("registers", "-")),
        str(kr.get("spill_bytes", "-")),
        "-" if smem is None else f"{smem / 1024:.0f}" + ("*" if kr.get("smem_source") == "config" else ""),
        kr.get("mma", "-"),
        kr.get("copy", "-"),
        f"{rep['compile_s']:.1f}",
      )
  return t
