"""The sweep: for each problem, time baselines and candidate configs, checked first.

run_sweep plans each problem's work (ragtune/run/plan.py), hands it to worker processes,
one per device (ragtune/run/pool.py, ragtune/run/worker.py), and returns a summary per problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from ragtune.problems.shapes import Problem
from ragtune.records import summary
from ragtune.records.store import Record, ResultsStore
from ragtune.records.summary import ProblemSummary
from ragtune.run import lock, plan, pool
from ragtune.run.options import SweepOptions

__all__ = ["SweepOptions", "SweepProgress", "ProblemSummary", "run_sweep", "summarize"]


class SweepProgress(pool.Progress, Protocol):
  """What a sweep reports: the pool's problem, row and tick, its start and each problem's summary."""

  def start(self, total: int, skipped: int) -> None: ...
  def problem_done(self, summary: ProblemSummary) -> None: ...


class _Silent:
  def start(self, total, skipped):
    pass

  def problem(self, p):
    pass

  def row(self, row, best):
    pass

  def problem_done(self, summary):
    pass

  def tick(self):
    pass


def run_sweep(
  problems: list[Problem],
  opts: SweepOptions,
  progress: SweepProgress | None = None,
  on_wait=None,
  on_state: Callable[[bool], None] | None = None,
) -> list[ProblemSummary]:
  """Measure every problem; returns the per-problem summaries. Holds the folder's lock
  throughout; with opts.wait_for_lock, on_wait(holder) is called before waiting for it.
  on_state(finished) is called, under the lock, with False once the folder's rows are read
  and with True once every measurement is done."""
  progress = progress or _Silent()
  with lock.sweep_lock(opts.out_dir, wait=opts.wait_for_lock, on_wait=on_wait):
    store = ResultsStore(opts.out_dir, opts.skip_bad_lines)
    done = plan.done_rows(store.rows(), opts.retry_failed)
    if on_state is not None:
      on_state(False)
    tasks, n_todo, n_done = [], 0, 0
    grouped = plan.by_problem(done)
    weighted = plan.budgets(problems, opts)
    for p in problems:
      task, todo, did = plan.make_task(p, opts, done, grouped.get(p.key, []), weighted[p.key])
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
    if on_state is not None:
      on_state(True)
    return summarize(problems, store.rows(), opts.device_kind)


def summarize(problems: list[Problem], records: list[Record], device_kind: str | None = None) -> list[ProblemSummary]:
  """Per problem, its summary (ragtune/records/summary.py) among the records of device_kind: the
  tuned device (else the records' device), whose default config is the "default" baseline."""
  kind = device_kind or next((r.device_kind for r in records), "")
  found = summary.summarize(records, kind)
  return [dataclasses.replace(found[p.key], problem=p) if p.key in found else ProblemSummary(p, kind) for p in problems]
