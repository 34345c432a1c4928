"""Planning a sweep: shards, each problem's task (candidates, what is done, what is next),
the plan's counts and estimates, and a rough CPU cost model. Opens no device."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import kernels
from kernels import registry
from kernels.lut import locate_lut
from ragtune import prune, search_space, search_strategy
from ragtune.errors import RagtuneError
from ragtune.run import devices
from ragtune.run.options import SweepOptions
from ragtune.shapes import Problem
from ragtune.store import Record, ResultsStore, candidate_id, make_row, row_id

BASELINES = ("baseline:xla", "baseline:dense")


def shard(problems: list[Problem], index: int, count: int) -> list[Problem]:
  """Problem i of the set (sorted by key, so the YAML's order does not matter) goes to shard i % count."""
  if count < 1 or not 0 <= index < count:
    raise RagtuneError(f"--shard must be i/N with 0 <= i < N, got {index}/{count}")
  ordered = sorted(problems, key=lambda p: p.key)
  mine = {p.key for p in ordered[index::count]}
  return [p for p in problems if p.key in mine]


# Interpret-mode cost model, fitted on a 2-core CPU host: about a second to compile, then
# each run costs the padded FLOPs (each group boundary adds up to one row tile) at the
# interpreter's rate. A candidate is compiled once and run 5 times (check, warm-up, 3 timed).
_INTERP_COMPILE_S = 1.0
_INTERP_FLOPS_PER_S = {"fwd": 3e9, "dlhs": 3e9, "drhs": 5e8}


def interpret_cost_s(p: Problem) -> float:
  """Rough seconds one candidate of p takes on a CPU in Pallas interpret mode."""
  cfg = kernels.registry.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g)
  bm = getattr(cfg, "block_m", None) or getattr(cfg, "tm", 64)
  padded = 2.0 * (p.m + p.g * bm) * p.k * p.n
  return _INTERP_COMPILE_S + 5 * padded / _INTERP_FLOPS_PER_S[p.op]


def cpu_timeout_warnings(problems: list[Problem], opts: SweepOptions, limit: int = 5) -> list[str]:
  slow = [(interpret_cost_s(p), p) for p in problems if p.backend in registry.tunable()]
  slow = [(c, p) for c, p in slow if c > opts.timeout_s]
  if not slow:
    return []
  lines = [
    f"{p.op} {p.backend} {p.dtype} {p.shape_label}: about {c:.0f}s per candidate in interpret mode, "
    f"more than --timeout {opts.timeout_s:g}s"
    for c, p in sorted(slow, key=lambda x: -x[0])[:limit]
  ]
  if len(slow) > limit:
    lines.append(f"... and {len(slow) - limit} more such problems")
  lines.append(
    f"{len(slow)} of {len(problems)} problems will likely time out on this CPU. The CPU runs the Pallas "
    "interpreter: use smoke-sized shapes (shapes/smoke.yaml) to check the pipeline, or raise --timeout."
  )
  return lines


# --- a budgeted search's seed from a LUT ----------------------------------------------


def find_lut(device_kind: str) -> kernels.Lut | None:
  """The LUT a model on this device would use (RAGTUNE_LUT, else the bundled one), or None."""
  try:
    path = locate_lut(None, device_kind)
    lut = kernels.Lut.from_file(path) if path is not None else None
  except kernels.LutError:
    return None
  return lut if lut is not None and lut.device_kind == device_kind else None


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
  rejected: int = 0  # candidates a deviceless compile took out of this problem

  def next_batch(self) -> list[tuple[str, Any]]:
    batch = self.strategy.next_batch(self.history)
    return [(candidate_id(c), c) for c in batch]


def by_problem(done: dict[str, Record]) -> dict[str, list[Record]]:
  out: dict[str, list[Record]] = {}
  for r in done.values():
    out.setdefault(r.problem.key, []).append(r)
  return out


def make_task(p: Problem, opts: SweepOptions, done: dict[str, Record], prior: list[Record]) -> tuple[Task, int, int]:
  """The task of problem p (prior: its rows already recorded), and (rows to do now, rows already done)."""
  # The tuned device's kind, never this process's jax: the parent stays off the device.
  kind = opts.device_kind or devices.probe_devices()["device_kind"]
  # Candidates a deviceless compile for this device kind rejected (`ragtune plan --target`)
  # are never timed. A listed sweep (all, or --max-candidates) records each it passes over
  # once, as compile_error with the compiler's reason, and the next candidate takes its
  # place; a budgeted search just never sees them (compile.jsonl has their reasons), rather
  # than filling the folder with rows for configs it would not have reached.
  rejected = prune.rejected(opts.out_dir, kind, p) if p.backend in prune.GPU_BACKENDS else {}
  space = search_space.candidates(p, device_kind=kind)  # the whole pruned space, default first
  hint = _lut_hint(p, opts.lut, kind) if opts.budget and p.backend in registry.tunable() else None
  if hint is not None and hint not in space:
    space.insert(1, hint)
  limit = None if opts.budget else opts.max_candidates  # the budget limits a full space itself
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
    if not opts.budget
    else []
  )
  seeds = [c for c in (space[:1] + ([hint] if hint is not None else [])) if c in cands] if opts.budget else []
  strategy = search_strategy.make(cands, opts.budget, seeds)
  configs = {candidate_id(c): c for c in cands}
  history = {}
  for cid, c in configs.items():
    r = done.get(row_id(p.key, cid))
    if r is not None:
      history[c] = r.time_s if r.status == "ok" else None
  planned = min(opts.budget, len(cands)) if opts.budget else len(cands)
  task = Task(p, strategy, configs, history, planned, rows=list(prior), skip_rows=skip_rows, rejected=len(skipped))
  base = [(b, None) for b in BASELINES if row_id(p.key, b) not in done]
  task.pending = base + task.next_batch() if cands or base else []
  n_done = sum(row_id(p.key, b) in done for b in BASELINES) + len(history)
  n_todo = len(base) + max(0, planned - len(history))
  return task, n_todo, n_done


def plan(problems: list[Problem], opts: SweepOptions) -> list[dict[str, Any]]:
  """Per problem: candidates after pruning (and budget), done, to do, estimated seconds.

  Opens no device here: it reads the results folder and the search space of
  opts.device_kind (by default the probed device's). The estimate
  is the median wall time per row already recorded for the problem (or, failing that,
  for the folder), times the rows left; None until some rows exist.
  """
  done = {r.id: r for r in ResultsStore(opts.out_dir, opts.skip_bad_lines).rows()}
  per_problem: dict[str, list[float]] = {}
  for r in done.values():
    if r.elapsed_s is not None:
      per_problem.setdefault(r.problem.key, []).append(r.elapsed_s)
  everything = [t for ts in per_problem.values() for t in ts]
  grouped = by_problem(done)
  out = []
  for p in problems:
    task, n_todo, n_done = make_task(p, opts, done, grouped.get(p.key, []))
    times = per_problem.get(p.key) or everything
    est = statistics.median(times) * n_todo if times else None
    out.append(
      {
        "problem": p,
        "candidates": task.planned,
        "rejected": task.rejected,
        "done": n_done,
        "todo": n_todo,
        "est_s": est,
      }
    )
  return out
