"""Which backend won each problem, XLA included, and by how much over the runner-up.

A problem's key is `op|backend|dtype|MxKxNxG|<group-sizes digest>`; the same key without
its backend names the forward shape, op and group sizes that every backend swept for it
was timed on. Each backend's time there is its fastest `ok` candidate; XLA's is the
problem's `baseline:xla` row (XLA's own op, timed in the same worker). Plain Python (no
pandas), shared by the sweep summary and `ragtune show`.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from kernels import registry


def shape_key(row: dict[str, Any]) -> tuple:
  """(device kind, problem key without its backend): what backends compete on."""
  parts = str(row.get("problem", "")).split("|")
  if len(parts) == 5:
    del parts[1]
  return (row.get("device_kind"), "|".join(parts))


def _ok_time(r: dict[str, Any]) -> float | None:
  t = r.get("time_s")
  ok = r.get("status") == "ok" and isinstance(t, (int, float)) and not isinstance(t, bool)
  return float(t) if ok and math.isfinite(t) and t > 0 else None


def backend_times(rows: Iterable[dict[str, Any]]) -> dict[tuple, dict[str, float]]:
  """shape_key -> {backend: fastest ok time}, with `xla` from the baseline:xla rows."""
  out: dict[tuple, dict[str, float]] = {}
  for r in rows:
    t = _ok_time(r)
    if t is None:
      continue
    if r.get("kind") == "candidate":
      name = r.get("backend")
    elif r.get("candidate") == "baseline:xla":
      name = "xla"
    else:
      continue
    times = out.setdefault(shape_key(r), {})
    if name not in times or t < times[name]:
      times[name] = t
  return out


def ranking(times: dict[str, float]) -> list[tuple[str, float]]:
  """Backends fastest first; ties go to the registry order (as in Lut.choose)."""
  order = {name: i for i, name in enumerate(registry.NAMES)}
  return sorted(times.items(), key=lambda kv: (kv[1], order.get(kv[0], len(order)), kv[0]))


def winner_text(times: dict[str, float] | None) -> str:
  """'mosaic_gpu 1.31x': the winner and its speedup over the runner-up; the winner alone
  when it was the only backend timed; '-' when none was."""
  ranked = ranking(times or {})
  if not ranked:
    return "-"
  (best, t1), rest = ranked[0], ranked[1:]
  return f"{best} {rest[0][1] / t1:.2f}x" if rest else best


def runner_up(times: dict[str, float] | None) -> str:
  ranked = ranking(times or {})
  return ranked[1][0] if len(ranked) > 1 else ""
