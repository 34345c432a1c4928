"""Results as pandas tables: every row, or the best per problem beside its baselines.

Frames keep full precision; `csv_text` rounds times and rates to 4 significant digits
(records.jsonl keeps everything). `compact_rows` is the `show --all` view, sized for a
160-column terminal. Plots live in ragtune/records/plots.py (matplotlib, optional).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pandas as pd

from kernels import registry
from kernels.common import op_order
from ragtune.device import ceilings as ceilings_mod
from ragtune.filekind import REPORT_CSV_START, SHOW_ALL_CSV_COLUMNS, SHOW_CSV_COLUMNS
from ragtune.records import summary
from ragtune.records.store import Record

KEYS = [*REPORT_CSV_START, "group_dist"]  # best.csv and rows.csv start with them
ROW_COLUMNS = [
  *KEYS,
  "candidate",
  "status",
  "time_s",
  "tflops",
  "gbps",
  "error",
  "timer",
  "interpret",
  "jax_version",
  "timestamp",
]


def rows_frame(records: list[Record]) -> pd.DataFrame:
  df = pd.DataFrame([r.to_dict() for r in records])
  for c in ROW_COLUMNS:
    if c not in df:
      df[c] = None
  return df[ROW_COLUMNS]


def _summaries(records: list[Record]) -> list[summary.ProblemSummary]:
  """Every (device kind, problem)'s summary, in the order of KEYS (ops fwd, dlhs, drhs), then the problem key."""
  found = [s for kind in {r.device_kind for r in records} for s in summary.summarize(records, kind).values()]
  order = lambda s: (s.device_kind, op_order(s.problem.op), *(s.problem.fields()[k] for k in KEYS[1:]), s.problem.key)
  return sorted(found, key=order)


def _ms(t: float | None) -> float:
  return t * 1e3 if t is not None else math.nan


def _ratio(base: float | None, t: float | None) -> float:
  return base / t if base is not None and t is not None else math.nan


def pct_of_peak(row: Record, ceil: dict[str, dict[str, Any]]) -> tuple[float | None, str]:
  """% of the roof that binds this problem: matmul TF/s if compute-bound, copy GB/s if memory-bound."""
  tf, bw = ceilings_mod.peaks(ceil, row.device_kind, row.jax_version, row.problem.dtype)
  tflops, gbps = row.tflops, row.gbps
  if not tf or not bw or not tflops or not gbps:
    return None, ""
  intensity = tflops * 1e12 / (gbps * 1e9)  # FLOP per byte moved
  ridge = tf * 1e12 / (bw * 1e9)
  if intensity >= ridge:
    return 100.0 * tflops / tf, "compute"
  return 100.0 * gbps / bw, "memory"


def best_frame(records: list[Record], ceil: dict | None = None) -> pd.DataFrame:
  """One line per (device, problem), with the sweep summary's columns: best correct config,
  its time and % of the binding peak, the XLA, default-config and dense baselines, the
  winning backend at that shape and op (XLA included) and its runner-up, statuses."""
  return pd.DataFrame(best_rows(records, ceil), columns=BEST_COLUMNS)


def best_rows(records: list[Record], ceil: dict | None = None) -> list[dict[str, Any]]:
  """best_frame's lines as dicts of BEST_COLUMNS (NaN where not measured)."""
  out = []
  for s in _summaries(records):
    p, best, base = s.problem, s.best, s.baselines
    t = best.time_s if best else None
    pct, bound = pct_of_peak(best, ceil or {}) if best else (None, "")
    out.append(
      {
        "device_kind": s.device_kind,
        **p.fields(),
        "shape": p.shape_label,
        "best_ms": _ms(t),
        "calls": p.calls,
        "step_ms": _ms(t) * p.calls,
        "tflops": best.tflops if best else math.nan,
        "gbps": best.gbps if best else math.nan,
        "pct_peak": pct if pct is not None else math.nan,
        "bound": bound,
        "xla_ms": _ms(base["xla"]),
        "default_ms": _ms(base["default"]),
        "dense_ms": _ms(base["dense"]),
        "vs_xla": _ratio(base["xla"], t),
        "vs_default": _ratio(base["default"], t),
        "winner": s.winner,
        "runner_up": s.runner_up,
        "ok": len(s.ranked),
        "failed": sum(s.counts.values()) - len(s.ranked),
        "statuses": s.statuses,
        "best_config": config_text(best.config, p.backend) if best else s.why,
        "problem": p.key,
      }
    )
  return out


BEST_COLUMNS = [
  *KEYS,
  "shape",
  "best_ms",
  "calls",  # calls a step (a captured shape file's ops: {op: calls}; else 1)
  "step_ms",  # best_ms x calls: the problem's time in one step
  "tflops",
  "gbps",
  "pct_peak",
  "bound",
  "xla_ms",
  "default_ms",
  "dense_ms",
  "vs_xla",
  "vs_default",
  "winner",
  "runner_up",
  "ok",
  "failed",
  "statuses",
  "best_config",
  "problem",
]


def step_totals(best: pd.DataFrame) -> tuple[float, float, int, int] | None:
  """A step's grouped matmuls by the calls recorded with each problem (a captured shape file):
  (ms at the fastest correct config of each op and shape, ms at XLA's op, shapes summed,
  shapes left out for lacking either time), or None when no problem has calls recorded. The
  fastest of the backends, as the LUT takes it; every problem of the records counts, 1 call
  where none is recorded."""
  if best.empty or (best["calls"] == 1).all():
    return None
  per = best.groupby(["op", "m", "k", "n", "g", "dtype"]).agg(
    best_ms=("best_ms", "min"), xla_ms=("xla_ms", "min"), calls=("calls", "max")
  )
  both = per.dropna(subset=["best_ms", "xla_ms"])
  tuned, xla = (both["best_ms"] * both["calls"]).sum(), (both["xla_ms"] * both["calls"]).sum()
  return float(tuned), float(xla), len(both), len(per) - len(both)


# `show --json`: a document's schema and its version, raised when a key changes meaning or goes.
SHOW_SCHEMA, SHOW_SCHEMA_VERSION = "ragtune-show", 1


def _json_value(v: Any) -> Any:
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v.item() if hasattr(v, "item") else v  # numpy scalars


def show_json(records: list[Record], ceil: dict | None, all_rows: bool) -> str:
  """`show --json`: one document. view "best": a row per problem of BEST_COLUMNS; view
  "all": a row per record of ROW_COLUMNS plus shape, candidate config (fields by full name,
  {} for a baseline) and baseline (xla, dense or null). null where there is no value."""
  if all_rows:
    line = lambda r, d: {
      **{c: d.get(c) for c in ROW_COLUMNS},
      "shape": r.problem.shape_label,
      "config": r.config or {},
      "baseline": r.baseline or None,
    }
    rows = [line(r, r.to_dict()) for r in records]
  else:
    rows = best_rows(records, ceil)
  doc = {
    "schema": SHOW_SCHEMA,
    "schema_version": SHOW_SCHEMA_VERSION,
    "view": "all" if all_rows else "best",
    "rows": [{k: _json_value(v) for k, v in row.items()} for row in rows],
  }
  return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def show_best(records: list[Record], ceil: dict | None = None) -> pd.DataFrame:
  df = best_frame(records, ceil)
  if df.empty:
    return df
  df = df.copy()
  df["pct_peak"] = [f"{p:.3g}% {b}" if not math.isnan(p) else "-" for p, b in zip(df["pct_peak"], df["bound"])]
  df["dtype"] = df["dtype"].map(lambda d: DTYPE_ABBREV.get(d, d))  # within 160 columns
  if df["device_kind"].nunique() > 1:
    return df[["device_kind"] + SHOW_CSV_COLUMNS]
  return df[SHOW_CSV_COLUMNS]


SPEEDUP_COLUMNS = ("vs_xla", "vs_default")


def printable(df: pd.DataFrame) -> pd.DataFrame:
  """The frame as `show` and report.md print it: speedups as '1.31x', as everywhere else
  (CSVs keep the ratios)."""
  out = df.copy()
  for c in SPEEDUP_COLUMNS:
    if c in out:
      out[c] = out[c].map(summary.speedup_text)
  return out


DTYPE_ABBREV = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def config_text(config: dict[str, Any], backend: str | None = None) -> str:
  """The one printed form of a config: its fields' full names, as in the LUT file and the
  kernels' config classes ('block_m=64 block_k=32 ...'), in the config class's order when the
  backend is known (records store them sorted)."""
  config = dict(config)
  try:
    cls = registry.get(backend).config_type if backend else None
  except (KeyError, ValueError):
    cls = None
  if cls is not None and dataclasses.is_dataclass(cls):
    order = {f.name: i for i, f in enumerate(dataclasses.fields(cls))}
    config = dict(sorted(config.items(), key=lambda kv: order.get(kv[0], len(order))))
  return " ".join(f"{k}={v}" for k, v in config.items())


def compact_rows(records: list[Record], width: int = 160) -> pd.DataFrame:
  """`show --all`: every row in at most `width` columns, errors cut. A baseline row is
  listed under its own name (xla, dense), not under the backend of the problem it was timed for."""
  out = pd.DataFrame(
    {
      "op": [r.problem.op for r in records],
      "backend": [r.baseline or r.problem.backend for r in records],
      "dtype": [DTYPE_ABBREV.get(r.problem.dtype, r.problem.dtype) for r in records],
      "shape": [r.problem.shape_label for r in records],
      "config": ["(baseline)" if r.baseline else config_text(r.config, r.problem.backend) for r in records],
      "status": [r.status for r in records],
      "ms": [_g4(r.time_s * 1e3 if r.time_s is not None else None) for r in records],
      "TF/s": [_g4(r.tflops) for r in records],
      "error": [r.error for r in records],
    },
    columns=SHOW_ALL_CSV_COLUMNS,
  )
  fixed = sum(max([len(str(v)) for v in out[c]] + [len(c)]) + 1 for c in out.columns if c != "error")
  room = max(10, width - fixed - 2)
  out["error"] = out["error"].map(lambda e: e if len(e) <= room else e[: room - 1] + "…")
  return out


def _g4(v) -> str:
  return f"{v:.4g}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _round_sig(x, digits: int = 4):
  if isinstance(x, float) and math.isfinite(x) and x != 0:
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))
  return x


def csv_text(df: pd.DataFrame) -> str:
  """CSV with floats rounded to 4 significant digits (records.jsonl keeps full precision)."""
  df = df.copy()
  for c in df.columns:
    if pd.api.types.is_float_dtype(df[c]):
      df[c] = df[c].map(_round_sig)
  return df.to_csv(index=False)
