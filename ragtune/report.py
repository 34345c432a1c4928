"""Results as pandas tables: every row, or the best per problem beside its baselines."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

ROW_COLUMNS = ["device_kind", "op", "backend", "dtype", "m", "k", "n", "g", "group_dist", "candidate", "status",
               "time_s", "tflops", "gbps", "error", "timer", "interpret", "jax_version", "timestamp"]


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
  df = pd.DataFrame(rows)
  for c in ROW_COLUMNS:
    if c not in df:
      df[c] = None
  return df[ROW_COLUMNS]


def best_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
  """One line per (device, problem): best correct config, its time, the baselines, status counts."""
  df = pd.DataFrame(rows)
  keys = ["device_kind", "op", "backend", "dtype", "m", "k", "n", "g", "group_dist"]
  out = []
  for key, grp in df.groupby(keys + ["problem"], sort=True, dropna=False):
    cands = grp[grp["kind"] == "candidate"]
    ok = cands[cands["status"] == "ok"].sort_values(["time_s", "candidate"])
    base = {b: grp[(grp["candidate"] == f"baseline:{b}") & (grp["status"] == "ok")]["time_s"].min()
            for b in ("xla", "dense")}
    best = ok.iloc[0] if len(ok) else None
    t = best["time_s"] if best is not None else float("nan")
    out.append({
        **dict(zip(keys, key[:-1])),
        "best_ms": t * 1e3,
        "tflops": best["tflops"] if best is not None else float("nan"),
        "xla_ms": base["xla"] * 1e3,
        "dense_ms": base["dense"] * 1e3,
        "vs_xla": base["xla"] / t if best is not None else float("nan"),
        "ok": int(len(ok)),
        "failed": int(len(cands) - len(ok)),
        "best_config": short_config(best["candidate"]) if best is not None else "",
    })
  return pd.DataFrame(out)


def short_config(candidate: str) -> str:
  try:
    cfg = json.loads(candidate)
  except json.JSONDecodeError:
    return candidate
  abbrev = {"block_m": "bm", "block_k": "bk", "block_n": "bn", "num_warps": "w", "num_stages": "s",
            "group_m": "gm", "group_k": "gk"}
  return " ".join(f"{abbrev.get(k, k)}={v}" for k, v in cfg.items())
