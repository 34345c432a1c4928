"""The sweep: for each problem, time baselines and every candidate config, checked first.

Per problem: baselines (XLA's op and a dense matmul of the same FLOPs) and candidates
not yet in the results file. Candidates compile in parallel under a timeout, each is
run once and compared with jax.lax.ragged_dot; only those that pass are timed, in
batches measured together. Every outcome becomes one row, appended as soon as known.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as dt
import math
import os
from pathlib import Path
from typing import Any, Callable, Protocol

import jax

import kernels
from ragtune import measure, search_space
from ragtune.shapes import Problem
from ragtune.store import ResultsStore, candidate_id, row_id

BASELINES = ("baseline:xla", "baseline:dense")


def default_results_dir() -> Path:
  return Path("results") / kernels.device_slug(kernels.current_device_kind())


@dataclasses.dataclass
class SweepOptions:
  out_dir: Path
  max_candidates: int | None = None
  timeout_s: float = 120.0
  interpret: bool = False
  jobs: int = max(1, min(8, os.cpu_count() or 1))
  op_builder: measure.OpBuilder = measure.build_op


class SweepProgress(Protocol):
  def start(self, total: int, skipped: int) -> None: ...
  def problem(self, p: Problem) -> None: ...
  def row(self, row: dict[str, Any], best: dict[str, Any] | None) -> None: ...


class _Silent:
  def start(self, total, skipped): pass
  def problem(self, p): pass
  def row(self, row, best): pass


@dataclasses.dataclass
class ProblemSummary:
  problem: Problem
  counts: dict[str, int]
  best: dict[str, Any] | None
  baselines: dict[str, float | None]


def _device_fields() -> dict[str, Any]:
  d = jax.devices()[0]
  return {"device_kind": d.device_kind, "platform": d.platform, "jax_version": jax.__version__}


class _Run:
  """State of one problem's measurement: inputs, reference, the row writer."""

  def __init__(self, p: Problem, opts: SweepOptions, store: ResultsStore, progress: SweepProgress,
               device: dict[str, Any], run_pool: cf.Executor):
    self.p, self.opts, self.store, self.progress, self.device = p, opts, store, progress, device
    self.x = measure.make_inputs(p)
    self.args = measure.op_args(p.op, self.x)
    self.ref = measure.reference(p.op, self.x)
    self.best: dict[str, Any] | None = None
    self.run_pool = run_pool  # runs compiled candidates, so a hang can be timed out

  def write(self, candidate: str, config, status: str, *, error: str = "", time_s: float | None = None,
            timer: str = "", numerics=None) -> dict[str, Any]:
    p = self.p
    ok_time = time_s is not None and math.isfinite(time_s) and time_s > 0
    row = {
        "id": row_id(p.key, candidate), "problem": p.key, "candidate": candidate,
        "kind": "baseline" if candidate.startswith("baseline:") else "candidate",
        **p.fields(), "group_sizes": list(p.group_sizes), "source": p.source,
        "config": config.to_dict() if config is not None else None,
        "status": status, "error": error,
        "time_s": time_s if ok_time else None,
        "tflops": measure.flops(p) / time_s / 1e12 if ok_time else None,
        "gbps": measure.bytes_moved(p) / time_s / 1e9 if ok_time else None,
        "timer": timer, "interpret": self.opts.interpret and p.backend != "xla",
        "numerics": None if numerics is None else {
            "max_diff": numerics.max_diff, "rel_error": numerics.rel_error, "pct_bad": numerics.pct_bad},
        **self.device, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    self.store.append(row)
    if row["kind"] == "candidate" and status == "ok" and (self.best is None or row["time_s"] < self.best["time_s"]):
      self.best = row
    self.progress.row(row, self.best)
    return row


def _baseline_fns(p: Problem, run: _Run) -> dict[str, tuple[Callable, tuple]]:
  return {
      "baseline:xla": (measure.build_op(p, "xla", None, False), run.args),
      "baseline:dense": (measure.dense_matmul, measure.dense_args(p, run.x)),
  }


def _measure_batch(run: _Run, pool: cf.Executor, items: list[tuple[str, Any, Callable, tuple, bool]]):
  """Compile (parallel, timeout), check, then time together those that passed.

  items: (candidate id, config or None, fn, args, check_against_reference)
  """
  opts = run.opts
  futures = {name: pool.submit(measure.compile_fn, fn, args) for name, _, fn, args, _ in items}
  passed = {}
  for name, cfg, fn, args, do_check in items:
    compiled, err = measure.await_result(futures[name], opts.timeout_s)
    if err:
      run.write(name, cfg, err[0], error=err[1])
      continue
    out, err = measure.await_result(run.run_pool.submit(lambda c=compiled, a=args: jax.block_until_ready(c(*a))),
                                    opts.timeout_s, error_status="run_error")
    if err:
      run.write(name, cfg, err[0], error=err[1])
      continue
    numerics = measure.check(run.p, out, run.ref) if do_check else None
    if numerics is not None and not numerics.passed:
      run.write(name, cfg, numerics.status, error=numerics.summary(), numerics=numerics)
      continue
    passed[name] = (cfg, fn, args, compiled, numerics)
  if not passed:
    return
  on_device = jax.default_backend() != "cpu"
  times, timer = measure.time_variants({n: (v[1], v[2], v[3]) for n, v in passed.items()}, on_device=on_device)
  for name, (cfg, _, _, _, numerics) in passed.items():
    t = times.get(name)
    if t is None or not math.isfinite(t):
      run.write(name, cfg, "timing_error", error="no timing was recorded", numerics=numerics)
    else:
      run.write(name, cfg, "ok", time_s=t, timer=timer, numerics=numerics)


def plan(problems: list[Problem], opts: SweepOptions) -> tuple[list[tuple[Problem, list]], int, int]:
  """For each problem, the candidates still to do; plus (to do, already done) counts."""
  done = ResultsStore(opts.out_dir).done_ids()
  todo, n_todo, n_done = [], 0, 0
  for p in problems:
    cands = search_space.candidates(p, opts.max_candidates)
    ids = list(BASELINES) + [candidate_id(c) for c in cands]
    remaining = [i for i in ids if row_id(p.key, i) not in done]
    n_todo += len(remaining)
    n_done += len(ids) - len(remaining)
    todo.append((p, [(i, c) for i, c in zip(ids, [None, None] + cands) if i in remaining]))
  return todo, n_todo, n_done


def run_sweep(problems: list[Problem], opts: SweepOptions, progress: SweepProgress | None = None) -> list[ProblemSummary]:
  progress = progress or _Silent()
  store = ResultsStore(opts.out_dir)
  todo, n_todo, n_done = plan(problems, opts)
  progress.start(n_todo, n_done)
  device = _device_fields()
  outer = cf.ThreadPoolExecutor(max_workers=opts.jobs, thread_name_prefix="ragtune-compile")
  inner = cf.ThreadPoolExecutor(max_workers=opts.jobs + 1, thread_name_prefix="ragtune-run")
  try:
    for p, items in todo:
      if not items:
        continue
      progress.problem(p)
      run = _Run(p, opts, store, progress, device, inner)
      base = _baseline_fns(p, run)
      batch = [(i, None, *base[i], False) for i, _ in items if i in base]
      if batch:
        _measure_batch(run, outer, batch)
      cands = [(i, c) for i, c in items if i not in base]
      chunk = max(1, opts.jobs * 2)
      for s in range(0, len(cands), chunk):
        part = [(i, c, opts.op_builder(p, p.backend, c, opts.interpret), run.args, True) for i, c in cands[s:s + chunk]]
        _measure_batch(run, outer, part)
  finally:
    outer.shutdown(wait=False, cancel_futures=True)
    inner.shutdown(wait=False, cancel_futures=True)
  return summarize(problems, store.rows())


def summarize(problems: list[Problem], rows: list[dict[str, Any]]) -> list[ProblemSummary]:
  by_problem: dict[str, list[dict[str, Any]]] = {}
  for r in rows:
    by_problem.setdefault(r["problem"], []).append(r)
  out = []
  for p in problems:
    rs = by_problem.get(p.key, [])
    counts: dict[str, int] = {}
    for r in rs:
      if r["kind"] == "candidate":
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    ok = [r for r in rs if r["kind"] == "candidate" and r["status"] == "ok"]
    best = min(ok, key=lambda r: (r["time_s"], r["candidate"])) if ok else None
    baselines = {b.split(":")[1]: next((r["time_s"] for r in rs if r["candidate"] == b and r["status"] == "ok"), None)
                 for b in BASELINES}
    default = kernels.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g,
                                     device_kind=kernels.current_device_kind())
    if default is not None:
      baselines["default"] = next((r["time_s"] for r in ok if r["candidate"] == candidate_id(default)), None)
    out.append(ProblemSummary(p, counts, best, baselines))
  return out
