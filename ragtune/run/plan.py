"""Planning a sweep: shards, each problem's task (candidates, what is done, what is next),
the plan's counts and estimates (ragtune/run/estimate.py), the problems an interpreter cannot
run, and the candidates likely to overrun --timeout. Opens no device."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from kernels import registry
from ragtune.candidates import prune, search_space, search_strategy
from ragtune.errors import RagtuneError
from ragtune.problems.shapes import Problem
from ragtune.records.store import Record, ResultsStore, candidate_id, make_row, row_id
from ragtune.run import devices
from ragtune.run.estimate import CostModel, Estimate, datasheet_floor_s, duration
from ragtune.run.options import SweepOptions
from ragtune.words import count

BASELINES = ("baseline:xla", "baseline:dense")


def shard(problems: list[Problem], index: int, count: int) -> list[Problem]:
  """Problem i of the set (sorted by key, so the YAML's order does not matter) goes to shard i % count."""
  if count < 1 or not 0 <= index < count:
    raise RagtuneError(f"--shard must be i/N with 0 <= i < N, got {index}/{count}")
  ordered = sorted(problems, key=lambda p: p.key)
  mine = {p.key for p in ordered[index::count]}
  return [p for p in problems if p.key in mine]


# --- a budgeted search's seed from a LUT (kernels.lut.default_lut: the one a model here uses) ---


def _lut_hint(p: Problem, lut, device_kind: str | None):
  """The nearest LUT entry's config for p, if there is one (a stage-1 seed)."""
  if lut is None:
    return None
  e = lut.query(p.op, p.m, p.k, p.n, p.g, p.dtype, backend=p.backend)
  cfg = e.config if e is not None else None
  return cfg if cfg is not None and cfg.fits(p.op, p.dtype, p.m, p.k, p.n, device_kind) else None


# --- tasks ---------------------------------------------------------------------------


@dataclasses.dataclass
class Task:
  """One problem's work: the strategy, what is done, what the worker holds now."""

  p: Problem
  strategy: search_strategy.Strategy
  configs: dict[str, Any]  # candidate id -> config
  history: dict[Any, float | None]  # config -> seconds (None: failed), as the strategy sees it
  planned: int  # candidates this problem will time at most
  pending: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
  rows: list[Record] = dataclasses.field(default_factory=list)  # this problem's rows, old and new
  best: Record | None = None
  setup_failures: int = 0
  skip_rows: list[Record] = dataclasses.field(default_factory=list)  # rejected by a deviceless compile
  rejected: int = 0  # candidates of this problem's space a deviceless compile rejected (never timed)

  def next_batch(self) -> list[tuple[str, Any]]:
    batch = self.strategy.next_batch(self.history)
    return [(candidate_id(c), c) for c in batch]


def done_rows(records: list[Record], retry_failed: bool = False) -> dict[str, Record]:
  """Row id -> its latest record, the rows a sweep counts as done: with retry_failed, not
  those that failed for a reason other than the candidate (environment.retryable)."""
  from ragtune.run import environment

  done = {r.id: r for r in records}
  if retry_failed:
    done = {k: r for k, r in done.items() if not environment.retryable(r.status, r.error)}
  return done


def by_problem(done: dict[str, Record]) -> dict[str, list[Record]]:
  out: dict[str, list[Record]] = {}
  for r in done.values():
    out.setdefault(r.problem.key, []).append(r)
  return out


def budgets(problems: list[Problem], opts: SweepOptions) -> dict[str, int | None]:
  """Each problem's budget: opts.budget weighted by its calls a step (search_strategy.weighted_budgets)."""
  return search_strategy.weighted_budgets({p.key: p.calls for p in problems}, opts.budget)


def make_task(
  p: Problem, opts: SweepOptions, done: dict[str, Record], prior: list[Record], budget: int | None = None
) -> tuple[Task, int, int]:
  """The task of problem p (prior: its rows already recorded), and (rows to do now, rows
  already done). budget: p's (budgets), else opts.budget."""
  budget = budget or opts.budget
  # The tuned device's kind, never this process's jax: the parent stays off the device.
  kind = opts.device_kind or devices.probe_devices()["device_kind"]
  # Candidates a deviceless compile for this device kind rejected (`ragtune plan --target`)
  # are never timed. A listed sweep (all, or --max-candidates) records each it passes over
  # once, as compile_error with the compiler's reason, and the next candidate takes its
  # place; a budgeted search just never sees them (compile.jsonl has their reasons), rather
  # than filling the folder with rows for configs it would not have reached.
  # A shard's folder is in the results folder that plan --target compiled into.
  rejected = (
    {**prune.rejected(opts.out_dir.parent, kind, p), **prune.rejected(opts.out_dir, kind, p)}
    if opts.sharded
    else prune.rejected(opts.out_dir, kind, p)
  )
  space = search_space.candidates(p, device_kind=kind)  # the whole pruned space, default first
  hint = _lut_hint(p, opts.lut, kind) if budget and p.backend in registry.tunable() else None
  if hint is not None and hint not in space:
    space.insert(1, hint)
  limit = None if budget else opts.max_candidates  # the budget limits a full space itself
  cands, skipped = [], []
  for c in space:
    if limit is not None and len(cands) == limit:
      break
    (skipped if candidate_id(c) in rejected else cands).append(c)
  skip_rows = (
    [
      make_row(
        p,
        candidate_id(c),
        c,
        "compile_error",
        interpret=False,
        device={"device_kind": kind, "versions": rejected[candidate_id(c)].versions},
        error=rejected[candidate_id(c)].reason,
      )
      for c in skipped
      if row_id(p.key, candidate_id(c)) not in done
    ]
    if not budget
    else []
  )
  seeds = [c for c in (space[:1] + ([hint] if hint is not None else [])) if c in cands] if budget else []
  strategy = search_strategy.make(cands, budget, seeds)
  configs = {candidate_id(c): c for c in cands}
  history = {}
  for cid, c in configs.items():
    r = done.get(row_id(p.key, cid))
    if r is not None:
      history[c] = r.time_s if r.status == "ok" else None
  planned = min(budget, len(cands)) if budget else len(cands)
  # Every rejected candidate of the space, not only those a listed sweep passes over: the
  # figure plan --target's line adds up.
  n_rejected = sum(candidate_id(c) in rejected for c in space)
  task = Task(p, strategy, configs, history, planned, rows=list(prior), skip_rows=skip_rows, rejected=n_rejected)
  base = [(b, None) for b in BASELINES if row_id(p.key, b) not in done]
  task.pending = base + task.next_batch() if cands or base else []
  n_done = sum(row_id(p.key, b) in done for b in BASELINES) + len(history)
  n_todo = len(base) + max(0, planned - len(history))
  return task, n_todo, n_done


@dataclasses.dataclass(frozen=True)
class PlanRow:
  """One problem of a plan: candidates after pruning (and budget), rows done and to do, and
  the estimated time of those left."""

  problem: Problem
  candidates: int
  rejected: int  # of the problem's space, by a deviceless compile (plan --target)
  done: int
  todo: int
  estimate: Estimate
  floor_s: float | None = None  # the problem at the GPU's datasheet peaks (estimate.datasheet_floor_s): a model


def plan(problems: list[Problem], opts: SweepOptions, model: CostModel | None = None) -> list[PlanRow]:
  """Per problem: candidates, rows done and to do, and the estimate of those left.

  Opens no device here: it reads the results folder and the search space of
  opts.device_kind (by default the probed device's). A problem with candidate rows
  recorded is estimated from them: the median wall time of its candidates (and of its
  baselines, else the model's) times those left. Any other from the model
  (ragtune/run/estimate.py), by default the one of opts.
  """
  model = model or CostModel.for_sweep(opts.interpret, opts.device_kind or "", opts.out_dir)
  done = done_rows(ResultsStore(opts.out_dir, opts.skip_bad_lines).rows(), opts.retry_failed)
  grouped = by_problem(done)
  weighted = budgets(problems, opts)
  out = []
  for p in problems:
    task, n_todo, n_done = make_task(p, opts, done, grouped.get(p.key, []), weighted[p.key])
    count = max(0, task.planned - len(task.history))  # candidates left
    baselines = [b for b in BASELINES if row_id(p.key, b) not in done]
    timed = [r for r in grouped.get(p.key, []) if r.elapsed_s is not None]
    cand_s = [r.elapsed_s for r in timed if not r.baseline]
    if cand_s:
      base_s = [r.elapsed_s for r in timed if r.baseline]
      base = statistics.median(base_s) * len(baselines) if base_s else model.baselines_s(p, baselines) or 0.0
      median = statistics.median(cand_s)
      est = Estimate(median * count + base, median, "rows", per_candidate_s=median)
    else:
      est = model.problem(p, [c for c in task.configs.values() if c not in task.history], count, baselines)
    out.append(PlanRow(p, task.planned, task.rejected, n_done, n_todo, est, datasheet_floor_s(p, opts.device_kind)))
  return out


def timeout_warnings(rows: list[PlanRow], timeout_s: float, limit: int = 5) -> list[str]:
  """One line for each of the `limit` problems whose candidates will likely overrun
  `timeout_s` by most, then a count of them all; [] when none will."""
  slow = sorted(
    (r for r in rows if r.estimate.candidate_s is not None and r.estimate.candidate_s > timeout_s),
    key=lambda r: -r.estimate.candidate_s,
  )
  lines = [
    f"{r.problem.op} {r.problem.backend} {r.problem.dtype} {r.problem.shape_label}: about "
    f"{duration(r.estimate.candidate_s)} a candidate ({r.estimate.source}), more than --timeout {timeout_s:g}s"
    for r in slow[:limit]
  ]
  if len(slow) > limit:
    lines.append(f"... and {len(slow) - limit} more such problems")
  if slow:
    lines.append(
      f"{len(slow)} of {count(len(rows), 'problem')} will likely time out. Use smaller shapes (a CPU runs the kernels "
      "in an interpreter: shapes/smoke.yaml checks the pipeline) or raise --timeout."
    )
  return lines


def interpret_skips(problems: list[Problem]) -> tuple[list[Problem], list[str]]:
  """The problems an interpreter can run here, and one notice per backend and reason it
  cannot (its backend's interpret_unsupported), naming the ops whose problems are left out."""
  keep, skipped = [], {}
  for p in problems:
    unsupported = registry.get(p.backend).interpret_unsupported()
    why = unsupported.get(p.op) or unsupported.get(f"{p.op}:{p.dtype}")
    if why is None:
      keep.append(p)
    else:
      ops = skipped.setdefault((p.backend, why), {})
      ops[p.op] = ops.get(p.op, 0) + 1
  notices = []
  for (backend, why), ops in skipped.items():
    n = sum(ops.values())
    notices.append(
      f"skipped {count(n, backend + ' problem')} ({', '.join(f'{op} {c}' for op, c in ops.items())}), "
      f"every row of which would fail: {why}. Nothing is recorded for them."
    )
  return keep, notices
