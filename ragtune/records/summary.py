"""The best per problem, one rule for the sweep summary, `ragtune show`/`report` and `export-lut`.

A problem (op, backend, dtype, shape and group sizes) on one device kind has its candidate
rows counted by status, its correct (`ok`) candidates fastest first (ties: candidate id,
then results folder), and three baselines, each its fastest ok row among the records
given: XLA's own op (`baseline:xla`, timed in the same worker), a dense matmul of the
same FLOPs (`baseline:dense`) and the default config that kernels.registry.default_config picks for
that device kind.

Winner: a problem's key without its backend names the forward shape, op and group sizes
that every backend swept for it was timed on. Each backend's time there is its best
candidate's; XLA's is its fastest `baseline:xla` row. Plain Python: pandas is for tables.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable

import kernels
from kernels import registry
from ragtune.problems.shapes import Problem
from ragtune.records.store import Record, candidate_id


@dataclasses.dataclass(frozen=True)
class ProblemSummary:
  problem: Problem
  device_kind: str
  counts: dict[str, int] = dataclasses.field(default_factory=dict)  # candidate rows by status
  ranked: tuple[Record, ...] = ()  # ok candidates, fastest first
  xla: Record | None = None  # the fastest ok row of each baseline
  dense: Record | None = None
  default: Record | None = None  # of the device kind's default config
  failed: frozenset[str] = frozenset()  # candidate ids (baselines too) with a row that is not ok
  winner: str = "-"  # the fastest backend at this shape and op, XLA included: '<backend> 1.31x'
  runner_up: str = ""

  @property
  def best(self) -> Record | None:
    return self.ranked[0] if self.ranked else None

  @property
  def baselines(self) -> dict[str, float | None]:
    """Seconds of xla, dense and default, None where not timed."""
    return {
      name: r.time_s if r is not None else None
      for name, r in (("xla", self.xla), ("dense", self.dense), ("default", self.default))
    }

  @property
  def statuses(self) -> str:
    """Candidate counts by status, ok first: 'ok=5 crash=1 timeout=2'."""
    return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))

  @property
  def why(self) -> str:
    """Why there is no best config, e.g. 'no correct candidate: 3 timeout, 1 crash'."""
    if self.best is not None:
      return ""
    failed = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])) if s != "ok")
    return f"no correct candidate: {failed}" if failed else "no candidate measured"


def summarize(records: Iterable[Record], device_kind: str) -> dict[str, ProblemSummary]:
  """problem key -> its summary, from the records of `device_kind` (others are left out).
  A row id met twice in one folder counts once, the latest (as load_results keeps)."""
  groups: dict[str, list[Record]] = {}
  latest = {(r.origin, r.id): r for r in records if r.device_kind == device_kind}
  for r in latest.values():
    groups.setdefault(r.problem.key, []).append(r)
  found = {key: _summarize_problem(rs, device_kind) for key, rs in groups.items()}
  times = _backend_times(found.values())
  return {
    key: dataclasses.replace(
      s, winner=winner_text(times[shape_key(s.problem)]), runner_up=runner_up(times[shape_key(s.problem)])
    )
    for key, s in found.items()
  }


def _summarize_problem(records: list[Record], device_kind: str) -> ProblemSummary:
  p = records[0].problem
  cands = [r for r in records if not r.baseline]
  ranked = tuple(sorted((r for r in cands if r.ok), key=lambda r: (r.time_s, r.candidate, r.origin)))
  fastest = lambda name: min(
    (r for r in records if r.baseline == name and r.ok), key=lambda r: (r.time_s, r.origin), default=None
  )
  default = kernels.registry.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=device_kind)
  default_id = candidate_id(default) if default is not None else None
  return ProblemSummary(
    p,
    device_kind,
    dict(collections.Counter(r.status for r in cands)),
    ranked,
    xla=fastest("xla"),
    dense=fastest("dense"),
    default=next((r for r in ranked if r.candidate == default_id), None),
    failed=frozenset(r.candidate for r in records if r.status != "ok"),
  )


def shape_key(p: Problem) -> str:
  """The problem's key without its backend: what backends compete on."""
  parts = p.key.split("|")
  del parts[1]
  return "|".join(parts)


def _backend_times(summaries: Iterable[ProblemSummary]) -> dict[str, dict[str, float]]:
  """shape_key -> {backend: its best time}, with `xla` the fastest baseline:xla row there."""
  out: dict[str, dict[str, float]] = {}
  for s in summaries:
    times = out.setdefault(shape_key(s.problem), {})
    for name, r in ((s.problem.backend, s.best), (registry.REFERENCE, s.xla)):
      if r is not None and (name not in times or r.time_s < times[name]):
        times[name] = r.time_s
  return out


def ranking(times: dict[str, float]) -> list[tuple[str, float]]:
  """Backends fastest first; ties go to the registry order (as in Lut.query)."""
  order = {name: i for i, name in enumerate(registry.NAMES)}
  return sorted(times.items(), key=lambda kv: (kv[1], order.get(kv[0], len(order)), kv[0]))


def speedup_text(ratio: float | None) -> str:
  """The one printed form of a speedup (tables, show, report.md): '1.31x'; '-' for none (None or NaN)."""
  return f"{ratio:.2f}x" if ratio is not None and math.isfinite(ratio) else "-"


def winner_text(times: dict[str, float] | None) -> str:
  """'<backend> 1.31x': the winner and its speedup over the runner-up; the winner alone
  when it was the only backend timed; '-' when none was."""
  ranked = ranking(times or {})
  if not ranked:
    return "-"
  (best, t1), rest = ranked[0], ranked[1:]
  return f"{best} {speedup_text(rest[0][1] / t1)}" if rest else best


def runner_up(times: dict[str, float] | None) -> str:
  ranked = ranking(times or {})
  return ranked[1][0] if len(ranked) > 1 else ""
