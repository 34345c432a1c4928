"""The sweep: for each problem, time baselines and candidate configs, checked first.

run_sweep plans each problem's work (ragtune/run/plan.py), hands it to worker processes,
one per device (ragtune/run/pool.py, ragtune/worker.py), and returns a summary per problem.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import kernels
from ragtune import lock
from ragtune.run import plan, pool
from ragtune.run.options import SweepOptions
from ragtune.run.plan import BASELINES
from ragtune.shapes import Problem
from ragtune.store import ResultsStore, candidate_id


class SweepProgress(pool.Progress, Protocol):
  """What a sweep reports: the pool's problem, row and tick, its start and each problem's summary."""
  def start(self, total: int, skipped: int) -> None: ...
  def problem_done(self, summary: "ProblemSummary") -> None: ...


class _Silent:
  def start(self, total, skipped): pass
  def problem(self, p): pass
  def row(self, row, best): pass
  def problem_done(self, summary): pass
  def tick(self): pass


@dataclasses.dataclass
class ProblemSummary:
  problem: Problem
  counts: dict[str, int]
  best: dict[str, Any] | None
  baselines: dict[str, float | None]
  winner: str = "-"  # the fastest backend at this shape and op, XLA included: 'mosaic_gpu 1.31x'

  @property
  def why(self) -> str:
    """Why there is no best config, e.g. 'no correct candidate: 3 timeout, 1 crash'."""
    if self.best is not None:
      return ""
    failed = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])) if s != "ok")
    return f"no correct candidate: {failed}" if failed else "no candidate measured"


def run_sweep(problems: list[Problem], opts: SweepOptions, progress: SweepProgress | None = None,
              on_wait=None) -> list[ProblemSummary]:
  """Measure every problem; returns the per-problem summaries. Holds the folder's lock
  throughout; with opts.wait_for_lock, on_wait(holder) is called before waiting for it."""
  progress = progress or _Silent()
  with lock.sweep_lock(opts.out_dir, wait=opts.wait_for_lock, on_wait=on_wait):
    store = ResultsStore(opts.out_dir)
    done = {r["id"]: r for r in store.rows() if "id" in r}
    tasks, n_todo, n_done = [], 0, 0
    grouped = plan.by_problem(done)
    for p in problems:
      task, todo, did = plan.make_task(p, opts, done, grouped.get(p.key, []))
      n_todo, n_done = n_todo + todo, n_done + did
      for row in task.skip_rows:
        store.append(row)
      if task.pending:
        tasks.append(task)
    progress.start(n_todo, n_done)
    if tasks:
      def problem_done(t: plan.Task) -> None:
        progress.problem_done(summarize([t.p], t.rows, opts.device_kind)[0])

      workers = pool.Pool(opts, store, progress, {p.dtype for p in problems}, problem_done)
      try:
        workers.run(tasks)
      except BaseException:  # Ctrl-C or an error: stop every worker now, whatever it is doing
        workers.close(graceful=False)
        raise
      workers.close()
    return summarize(problems, store.rows(), opts.device_kind)


def summarize(problems: list[Problem], rows: list[dict[str, Any]],
              device_kind: str | None = None) -> list[ProblemSummary]:
  """Per problem: status counts, best correct candidate, baselines, and the winner among
  every backend the rows hold for its shape and op (ragtune/winners.py). device_kind: the
  tuned device, whose default config is the "default" baseline (else the rows' device)."""
  from ragtune import winners

  by_problem: dict[str, list[dict[str, Any]]] = {}
  per_shape = winners.backend_times(rows)
  device_kind = device_kind or next((r["device_kind"] for r in rows if r.get("device_kind")), None)
  for r in rows:
    by_problem.setdefault(r["problem"], []).append(r)
  out = []
  for p in problems:
    rs = list({r["id"]: r for r in reversed(by_problem.get(p.key, []))}.values())[::-1]  # first of each id
    counts: dict[str, int] = {}
    for r in rs:
      if r["kind"] == "candidate":
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    ok = [r for r in rs if r["kind"] == "candidate" and r["status"] == "ok"]
    best = min(ok, key=lambda r: (r["time_s"], r["candidate"])) if ok else None
    baselines = {b.split(":")[1]: next((r["time_s"] for r in rs if r["candidate"] == b and r["status"] == "ok"), None)
                 for b in BASELINES}
    default = kernels.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=device_kind)
    if default is not None:
      baselines["default"] = next((r["time_s"] for r in ok if r["candidate"] == candidate_id(default)), None)
    dev = rs[0].get("device_kind") if rs else device_kind
    winner = winners.winner_text(per_shape.get(winners.shape_key({"problem": p.key, "device_kind": dev})))
    out.append(ProblemSummary(p, counts, best, baselines, winner))
  return out
