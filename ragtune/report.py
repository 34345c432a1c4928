"""Results as pandas tables: every row, or the best per problem beside its baselines.

Frames keep full precision; `csv_text` rounds times and rates to 4 significant digits
(records.jsonl keeps everything). `compact_rows` is the `show --all` view, sized for a
160-column terminal. Plots live in ragtune/plots.py (matplotlib, optional).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

import kernels
from ragtune import ceilings as ceilings_mod
from ragtune.store import candidate_id

ROW_COLUMNS = ["device_kind", "op", "backend", "dtype", "m", "k", "n", "g", "group_dist", "candidate", "status",
               "time_s", "tflops", "gbps", "error", "timer", "interpret", "jax_version", "timestamp"]
KEYS = ["device_kind", "op", "backend", "dtype", "m", "k", "n", "g", "group_dist"]


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
  df = pd.DataFrame(rows)
  for c in ROW_COLUMNS:
    if c not in df:
      df[c] = None
  return df[ROW_COLUMNS]


def _shape(r) -> str:
  return f"[{r['m']},{r['k']}]x[{r['g']},{r['k']},{r['n']}]"


def best_frame(rows: list[dict[str, Any]], ceil: dict | None = None) -> pd.DataFrame:
  """One line per (device, problem), with the sweep summary's columns: best correct config,
  its time and % of the binding peak, the XLA, default-config and dense baselines, the
  winning backend at that shape and op (XLA included) and its runner-up, statuses."""
  from ragtune import winners

  df = pd.DataFrame(rows)
  out = []
  if df.empty:
    return pd.DataFrame(out)
  per_shape = winners.backend_times(rows)
  for key, grp in df.groupby(KEYS + ["problem"], sort=True, dropna=False):
    r0 = dict(zip(KEYS, key[:-1]))
    cands = grp[grp["kind"] == "candidate"]
    ok = cands[cands["status"] == "ok"].sort_values(["time_s", "candidate"])
    ok_time = lambda cid: ok[ok["candidate"] == cid]["time_s"].min() if cid else float("nan")
    base = {b: grp[(grp["candidate"] == f"baseline:{b}") & (grp["status"] == "ok")]["time_s"].min()
            for b in ("xla", "dense")}
    default = kernels.registry.default_config(r0["backend"], r0["op"], r0["dtype"], r0["m"], r0["k"], r0["n"], r0["g"])
    default_s = ok_time(candidate_id(default)) if default is not None else float("nan")
    best = ok.iloc[0].to_dict() if len(ok) else None
    t = best["time_s"] if best else float("nan")
    pct, bound = ceilings_mod.pct_of_peak(best, ceil or {}) if best else (None, "")
    counts = cands["status"].value_counts().to_dict()
    statuses = " ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    out.append({
        **r0, "shape": _shape(r0),
        "best_ms": t * 1e3,
        "tflops": best["tflops"] if best else float("nan"),
        "gbps": best["gbps"] if best else float("nan"),
        "pct_peak": pct if pct is not None else float("nan"),
        "bound": bound,
        "xla_ms": base["xla"] * 1e3,
        "default_ms": default_s * 1e3,
        "dense_ms": base["dense"] * 1e3,
        "vs_xla": base["xla"] / t if best else float("nan"),
        "vs_default": default_s / t if best else float("nan"),
        "winner": winners.winner_text(per_shape.get(winners.shape_key({**r0, "problem": key[-1]}))),
        "runner_up": winners.runner_up(per_shape.get(winners.shape_key({**r0, "problem": key[-1]}))),
        "ok": int(len(ok)),
        "failed": int(len(cands) - len(ok)),
        "statuses": statuses,
        "best_config": short_config(best["candidate"]) if best else _why(counts),
        "problem": key[-1],
    })
  return pd.DataFrame(out)


def _why(counts: dict[str, int]) -> str:
  failed = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if s != "ok")
  return f"no correct candidate: {failed}" if failed else "no candidate measured"


SHOW_COLUMNS = ["op", "backend", "dtype", "shape", "best_ms", "tflops", "pct_peak", "xla_ms", "default_ms", "vs_xla",
                "vs_default", "winner", "statuses", "best_config"]


def show_best(rows: list[dict[str, Any]], ceil: dict | None = None) -> pd.DataFrame:
  df = best_frame(rows, ceil)
  if df.empty:
    return df
  df = df.copy()
  df["pct_peak"] = [f"{p:.3g}% {b}" if not math.isnan(p) else "-" for p, b in zip(df["pct_peak"], df["bound"])]
  df["dtype"] = df["dtype"].map(lambda d: DTYPE_ABBREV.get(d, d))  # within 160 columns
  if df["device_kind"].nunique() > 1:
    return df[["device_kind"] + SHOW_COLUMNS]
  return df[SHOW_COLUMNS]


ABBREV = {"block_m": "bm", "block_k": "bk", "block_n": "bn", "num_warps": "w", "num_stages": "s",
          "group_m": "gm", "group_k": "gk", "max_concurrent_steps": "cs", "grid_block_n": "gn"}
DTYPE_ABBREV = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def short_config(candidate: str) -> str:
  try:
    cfg = json.loads(candidate)
  except json.JSONDecodeError:
    return candidate
  if not isinstance(cfg, dict):
    return candidate
  return " ".join(f"{ABBREV.get(k, k)}={v}" for k, v in cfg.items())


def compact_rows(rows: list[dict[str, Any]], width: int = 160) -> pd.DataFrame:
  """`show --all`: every row in at most `width` columns; configs abbreviated, errors cut."""
  df = rows_frame(rows)
  out = pd.DataFrame({
      "op": df["op"], "backend": df["backend"].str.replace("pallas_", "", regex=False),
      "dtype": df["dtype"].map(lambda d: DTYPE_ABBREV.get(d, d)),
      "m,k,n,g": [f"{m},{k},{n},{g}" for m, k, n, g in zip(df["m"], df["k"], df["n"], df["g"])],
      "config": df["candidate"].map(lambda c: short_config(c).replace("baseline:", "")),
      "status": df["status"],
      "ms": (df["time_s"] * 1e3).map(_g4),
      "TF/s": df["tflops"].map(_g4),
      "error": df["error"].map(lambda e: e if isinstance(e, str) else ""),
  })
  fixed = sum(max([len(str(v)) for v in out[c]] + [len(c)]) + 1 for c in out.columns if c != "error")
  room = max(10, width - fixed - 2)
  out["error"] = out["error"].map(lambda e: e if len(e) <= room else e[:room - 1] + "…")
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
