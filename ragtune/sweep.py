"""The sweep: for each problem, time baselines and candidate configs, checked first.

The parent process (this module) plans the work, hands it to worker processes
(ragtune/worker.py, one per device) one problem at a time, and is the only writer of
records.jsonl: every outcome becomes exactly one row, appended as soon as it is known.

Faults: the parent gives each candidate `timeout_s` (compile + check + time). A worker
past it is killed and the candidate recorded as `timeout`; a worker that dies is recorded
as `crash` with its signal or the tail of its stderr. A fresh worker on the same device
then takes the problem's remaining candidates. Baselines are not re-timed there: each
row is written once, the device is the same, and a fresh process warms up before it
times (measure.time_variants), so times stay comparable. Rows carry `worker_pid`, so
one can see which process timed what.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import functools
import os
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import kernels
from kernels.lut import locate_lut
from ragtune import lock, prune, search_space, search_strategy
from ragtune.errors import RagtuneError
from ragtune.run import child
from ragtune.shapes import Problem
from ragtune.store import ResultsStore, candidate_id, make_row, row_id

BASELINES = ("baseline:xla", "baseline:dense")
DEFAULT_BUILDER = "ragtune.measure:build_op"


def default_results_dir() -> Path:
  return Path("results") / kernels.device_slug(probe_devices()["device_kind"])


@dataclasses.dataclass
class SweepOptions:
  out_dir: Path
  max_candidates: int | None = None
  timeout_s: float = 120.0
  interpret: bool = False
  builder: str = DEFAULT_BUILDER          # module:function, imported by the workers
  devices: tuple[int, ...] = (0,)         # one worker per local device index
  platform: str = "cpu"                   # of those devices: "gpu" pins by CUDA_VISIBLE_DEVICES
  budget: int | None = None               # candidates timed per problem (staged search)
  wait_for_lock: bool = False
  ceilings: bool = True                   # measure the device's matmul/copy ceilings once
  lut: Any = None                         # kernels.Lut whose nearest entry seeds a budgeted search
  device_kind: str | None = None          # the tuned device (probe_devices): search space and defaults
  spare_workers: bool = True              # after a first replacement, keep a started spare per device


class SweepProgress(Protocol):
  def start(self, total: int, skipped: int) -> None: ...
  def problem(self, p: Problem) -> None: ...
  def row(self, row: dict[str, Any], best: dict[str, Any] | None) -> None: ...
  def problem_done(self, summary: "ProblemSummary") -> None: ...
  def tick(self) -> None: ...  # called about once a second, for heartbeat lines


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


# --- planning -------------------------------------------------------------------------

def shard(problems: list[Problem], index: int, count: int) -> list[Problem]:
  """Problem i of the set (sorted by key, so the YAML's order does not matter) goes to shard i % count."""
  if count < 1 or not 0 <= index < count:
    raise RagtuneError(f"--shard must be i/N with 0 <= i < N, got {index}/{count}")
  ordered = sorted(problems, key=lambda p: p.key)
  mine = {p.key for p in ordered[index::count]}
  return [p for p in problems if p.key in mine]


def parse_devices(spec: str, available: int) -> tuple[int, ...]:
  """'all' | 'N' (the first N) | '0,2,5' -> local device indices, checked against what exists."""
  text = spec.strip().lower()
  if text == "all":
    return tuple(range(available))
  try:
    if "," not in text:
      n = int(text)
      if n < 1:
        raise RagtuneError(f"--devices {spec}: a count must be at least 1 (device 0 alone is --devices 0,)")
      if n > available:
        raise RagtuneError(f"--devices {spec}: only {available} local device(s) here")
      return tuple(range(n))
    idx = tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise RagtuneError(f"--devices must be all, a count or indices like 0,2,5; got {spec!r}") from None
  bad = [i for i in idx if not 0 <= i < available]
  if bad or not idx or len(set(idx)) != len(idx):
    raise RagtuneError(f"--devices {spec}: indices must be distinct, in 0..{available - 1}")
  return idx


# Interpret-mode cost model, fitted on a 2-core CPU host: about a second to compile, then
# each run costs the padded FLOPs (each group boundary adds up to one row tile) at the
# interpreter's rate. A candidate is compiled once and run 5 times (check, warm-up, 3 timed).
_INTERP_COMPILE_S = 1.0
_INTERP_FLOPS_PER_S = {"fwd": 3e9, "dlhs": 3e9, "drhs": 5e8}


def interpret_cost_s(p: Problem) -> float:
  """Rough seconds one candidate of p takes on a CPU in Pallas interpret mode."""
  cfg = kernels.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g)
  bm = getattr(cfg, "block_m", None) or getattr(cfg, "tm", 64)
  padded = 2.0 * (p.m + p.g * bm) * p.k * p.n
  return _INTERP_COMPILE_S + 5 * padded / _INTERP_FLOPS_PER_S[p.op]


def cpu_timeout_warnings(problems: list[Problem], opts: SweepOptions, limit: int = 5) -> list[str]:
  slow = [(interpret_cost_s(p), p) for p in problems if p.backend != "xla"]
  slow = [(c, p) for c, p in slow if c > opts.timeout_s]
  if not slow:
    return []
  lines = [f"{p.op} {p.backend} {p.dtype} {p.shape_label}: about {c:.0f}s per candidate in interpret mode, "
           f"more than --timeout {opts.timeout_s:g}s" for c, p in sorted(slow, key=lambda x: -x[0])[:limit]]
  if len(slow) > limit:
    lines.append(f"... and {len(slow) - limit} more such problems")
  lines.append(f"{len(slow)} of {len(problems)} problems will likely time out on this CPU. The CPU runs the Pallas "
               "interpreter: use smoke-sized shapes (shapes/smoke.yaml) to check the pipeline, or raise --timeout.")
  return lines


PROBE_TIMEOUT_S = 300


def report_devices() -> None:
  """The probe's child process: sends ("devices", fields) of what jax sees here."""
  channel = child.Channel()
  import jax

  from ragtune.limits import device_memory_bytes

  d = jax.local_devices()
  channel.send(("devices", {"platform": d[0].platform, "count": len(d), "device_kind": d[0].device_kind,
                            "memory_bytes": device_memory_bytes()}))


@functools.lru_cache(maxsize=None)
def probe_devices() -> dict[str, Any]:
  """{platform, count, device_kind, memory_bytes} of this host's accelerators, asked of a
  child process (memory_bytes: the first device's limit, None where unknown). Asked once
  per process."""
  with tempfile.TemporaryDirectory() as tmp, \
       child.Child(["-c", "from ragtune import sweep; sweep.report_devices()"],
                   log=Path(tmp) / "stderr.log") as probe:
    msg = probe.recv(PROBE_TIMEOUT_S)
    if msg is None:
      raise RagtuneError(f"listing this host's devices (in a child process) took over {PROBE_TIMEOUT_S}s")
    if msg[0] != "devices":
      tail = " | ".join(probe.stderr_lines()[-3:])
      raise RagtuneError(f"could not list this host's devices in a child process: {tail}")
    return msg[1]


def keep_parent_off_device(platform: str) -> None:
  """Leave the accelerator to the workers: the parent's own jax (if it needs one) is the CPU."""
  if platform != "cpu":
    import jax

    try:
      jax.config.update("jax_platforms", "cpu")
    except Exception:  # noqa: BLE001 - already initialised: nothing more to do
      pass


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
  cfg = lut.lookup(p.op, p.m, p.k, p.n, p.g, p.dtype, backend=p.backend)
  return cfg if cfg is not None and cfg.fits(p.op, p.dtype, p.m, p.k, p.n, device_kind) else None


@dataclasses.dataclass
class _Task:
  """One problem's work: the strategy, what is done, what the worker holds now."""
  p: Problem
  strategy: search_strategy.Strategy
  configs: dict[str, Any]               # candidate id -> config
  history: dict[Any, float | None]      # config -> seconds (None: failed), as the strategy sees it
  planned: int                          # candidates this problem will time at most
  pending: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
  rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # this problem's rows, old and new
  best: dict[str, Any] | None = None
  setup_failures: int = 0
  skip_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rejected by a deviceless compile
  rejected: int = 0  # candidates a deviceless compile took out of this problem

  def next_batch(self) -> list[tuple[str, Any]]:
    batch = self.strategy.next_batch(self.history)
    return [(candidate_id(c), c) for c in batch]


def _by_problem(done: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
  out: dict[str, list[dict[str, Any]]] = {}
  for r in done.values():
    out.setdefault(r.get("problem"), []).append(r)
  return out


def _make_task(p: Problem, opts: SweepOptions, done: dict[str, dict[str, Any]],
               prior: list[dict[str, Any]]) -> tuple[_Task, int, int]:
  """The task of problem p (prior: its rows already recorded), and (rows to do now, rows already done)."""
  kind = opts.device_kind or probe_devices()["device_kind"]  # never this process's jax: it stays off the device
  # Candidates a deviceless compile for this device kind rejected (`ragtune plan --target`)
  # are never timed. A listed sweep (all, or --max-candidates) records each it passes over
  # once, as compile_error with the compiler's reason, and the next candidate takes its
  # place; a budgeted search just never sees them (compile.jsonl has their reasons), rather
  # than filling the folder with rows for configs it would not have reached.
  rejected = prune.rejected(opts.out_dir, kind, p) if p.backend in prune.GPU_BACKENDS else {}
  space = search_space.candidates(p, device_kind=kind)  # the whole pruned space, default first
  hint = _lut_hint(p, opts.lut, kind) if opts.budget and p.backend != "xla" else None
  if hint is not None and hint not in space:
    space.insert(1, hint)
  limit = None if opts.budget else opts.max_candidates  # the budget limits a full space itself
  cands, skipped = [], []
  for c in space:
    if limit is not None and len(cands) == limit:
      break
    (skipped if candidate_id(c) in rejected else cands).append(c)
  skip_rows = [make_row(p, candidate_id(c), c, "compile_error", interpret=False, device={"device_kind": kind},
                        error=rejected[candidate_id(c)])
               for c in skipped if row_id(p.key, candidate_id(c)) not in done] if not opts.budget else []
  seeds = [c for c in (space[:1] + ([hint] if hint is not None else [])) if c in cands] if opts.budget else []
  strategy = search_strategy.make(cands, opts.budget, seeds)
  configs = {candidate_id(c): c for c in cands}
  history = {}
  for cid, c in configs.items():
    r = done.get(row_id(p.key, cid))
    if r is not None:
      history[c] = r["time_s"] if r.get("status") == "ok" else None
  planned = min(opts.budget, len(cands)) if opts.budget else len(cands)
  task = _Task(p, strategy, configs, history, planned, rows=list(prior), skip_rows=skip_rows, rejected=len(skipped))
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
  done = {r["id"]: r for r in ResultsStore(opts.out_dir).rows() if "id" in r}
  per_problem: dict[str, list[float]] = {}
  for r in done.values():
    if isinstance(r.get("elapsed_s"), (int, float)):
      per_problem.setdefault(r["problem"], []).append(r["elapsed_s"])
  everything = [t for ts in per_problem.values() for t in ts]
  grouped = _by_problem(done)
  out = []
  for p in problems:
    task, n_todo, n_done = _make_task(p, opts, done, grouped.get(p.key, []))
    times = per_problem.get(p.key) or everything
    est = statistics.median(times) * n_todo if times else None
    out.append({"problem": p, "candidates": task.planned, "rejected": task.rejected, "done": n_done, "todo": n_todo,
                "est_s": est})
  return out


# --- workers (parent side) ------------------------------------------------------------

def _worker_env(index: int, platform: str) -> dict[str, str]:
  """The environment of the worker for local device `index`: a GPU is pinned by CUDA_VISIBLE_DEVICES."""
  env = dict(os.environ)
  if platform == "gpu":
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    env["RAGTUNE_DEVICE_INDEX"] = "0"
  else:
    env["RAGTUNE_DEVICE_INDEX"] = str(index)
  env["PYTHONPATH"] = child.pythonpath(os.getcwd())  # and the user's --builder module from the current folder
  env["PYTHONUNBUFFERED"] = "1"
  return env


# Ctrl-C and SIGTERM during a sweep. A KeyboardInterrupt raised by a signal handler can land
# inside the lock that queue.get holds and come out as "RuntimeError: release unlocked lock",
# so while the pool's loop runs the handler only sets this flag, and the loop raises
# KeyboardInterrupt at its next turn (within a second). Elsewhere it raises at once.
_stop_requested = threading.Event()
_in_pool_loop = threading.Event()


def stop_handler(signum, frame) -> None:
  """SIGINT/SIGTERM handler for a sweep: stop it as Ctrl-C does, at a safe point."""
  if _in_pool_loop.is_set():
    _stop_requested.set()
  else:
    raise KeyboardInterrupt


class _Worker(child.Child):
  """One worker process on one device, and what it is doing."""

  def __init__(self, slot: int, index: int, platform: str, events: queue.Queue, log_dir: Path):
    self.slot, self.index = slot, index
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"worker-{slot}.log"
    started = dt.datetime.now().isoformat(timespec="seconds")
    with open(log, "ab") as f:
      f.write(f"--- worker for device {index} started {started}\n".encode())
    super().__init__(["-m", "ragtune.worker"], env=_worker_env(index, platform), log=log, events=events)
    self.device: dict[str, Any] | None = None
    self.task: _Task | None = None
    self.current: str | None = None      # the item being measured now
    self.deadline: float | None = None
    self.purpose = "work"

  def ask(self, msg, timeout_s: float) -> None:
    """Send msg; the worker has timeout_s to answer."""
    self.deadline = time.monotonic() + timeout_s
    self.send(msg)


class _Pool:
  """Shares the tasks out to one worker per device and writes every row."""

  def __init__(self, opts: SweepOptions, store: ResultsStore, progress: SweepProgress, dtypes: set[str]):
    self.opts, self.store, self.progress, self.dtypes = opts, store, progress, dtypes
    self.events: queue.Queue = queue.Queue()
    self.workers: dict[int, _Worker] = {}
    self.start_failures: dict[int, int] = collections.Counter()
    self.ceilings_asked = False
    self.worker_opts = {"builder": opts.builder, "interpret": opts.interpret}
    # Per device, a spare with its imports done, so a killed worker is replaced in a moment.
    self.spares: dict[int, _Worker] = {}
    self.spare_workers = opts.spare_workers

  def _new(self, slot: int) -> _Worker:
    return _Worker(slot, self.opts.devices[slot], self.opts.platform, self.events, self.opts.out_dir / "logs")

  def _spawn(self, slot: int, task: _Task | None = None) -> None:
    """Put a worker to work on this slot: the spare if it is alive, and start a new spare."""
    w = self.spares.pop(slot, None)
    if w is None or not w.alive():
      w = self._new(slot)
    w.task = task
    w.ask(("start",), max(120.0, self.opts.timeout_s))  # jax import and device start-up
    replacing = slot in self.workers
    self.workers[slot] = w
    # A spare only once a slot has needed a replacement: a clean sweep starts no extra
    # process, and one whose candidates keep failing gets each replacement at once.
    if self.spare_workers and replacing:
      self.spares[slot] = self._new(slot)

  def close(self, graceful: bool = True) -> None:
    for w in list(self.workers.values()) + list(self.spares.values()):
      if not w.dead:
        w.close() if graceful else w.kill()

  def run(self, tasks: list[_Task]) -> None:
    _stop_requested.clear()
    _in_pool_loop.set()
    try:
      self._run(tasks)
    finally:
      _in_pool_loop.clear()

  def _run(self, tasks: list[_Task]) -> None:
    self.queue = collections.deque(tasks)
    for slot in range(min(len(self.opts.devices), max(1, len(tasks)))):
      self._spawn(slot)
    while any(w.task is not None or w.purpose != "work" for w in self.workers.values()) or self.queue:
      if _stop_requested.is_set():
        raise KeyboardInterrupt
      self.progress.tick()
      now = time.monotonic()
      deadlines = [w.deadline for w in self.workers.values() if w.deadline is not None]
      wait = min([1.0] + [max(0.01, d - now) for d in deadlines])
      try:
        w, msg = self.events.get(timeout=wait)
      except queue.Empty:
        for w in list(self.workers.values()):
          if w.deadline is not None and time.monotonic() > w.deadline:
            self._lost(w, "timeout")
        continue
      if w.dead or self.workers.get(w.slot) is not w:
        continue  # a killed worker's last words, or a spare that died idle (replaced when needed)
      getattr(self, f"_on_{msg[0]}")(w, *msg[1:])

  # -- events --

  def _on_hello(self, w: _Worker, device: dict[str, Any]) -> None:
    w.device, w.deadline = device, None
    self.start_failures[w.slot] = 0
    if self.opts.ceilings and not self.ceilings_asked:
      from ragtune import ceilings

      self.ceilings_asked = True
      missing = ceilings.missing(self.opts.out_dir, device, self.dtypes)
      if missing:
        w.purpose = "ceilings"
        w.ask(("ceilings", sorted(missing)), max(120.0, self.opts.timeout_s))
        return
    self._feed(w)

  def _on_ceilings(self, w: _Worker, data: dict[str, Any]) -> None:
    from ragtune import ceilings

    ceilings.save(self.opts.out_dir, w.device, data)
    w.purpose, w.deadline = "work", None
    self._feed(w)

  def _on_begin(self, w: _Worker, cid: str) -> None:
    w.current, w.deadline = cid, time.monotonic() + self.opts.timeout_s

  def _on_row(self, w: _Worker, row: dict[str, Any]) -> None:
    self._write(w.task, row)
    w.current, w.deadline = None, time.monotonic() + self.opts.timeout_s

  def _on_done(self, w: _Worker, key: str) -> None:
    w.deadline = None
    self._feed(w)

  def _on_eof(self, w: _Worker) -> None:
    self._lost(w, "crash")

  def _on_retire(self, w: _Worker, reason: str) -> None:
    # Its last row is written; the rest of its problem goes to a fresh process.
    w.kill()
    self._spawn(w.slot, w.task)

  # -- helpers --

  def _feed(self, w: _Worker) -> None:
    """Give w the rest of its problem, its problem's next batch, or the next problem."""
    while True:
      t = w.task
      if t is not None and not t.pending:
        t.pending = t.next_batch()
      if t is not None and t.pending:
        w.current = None
        w.ask(("run", t.p, list(t.pending), self.worker_opts), self.opts.timeout_s)
        return
      if t is not None:
        self.progress.problem_done(summarize([t.p], t.rows, self.opts.device_kind)[0])
        w.task = None
      if not self.queue:
        w.deadline = None
        return
      w.task = self.queue.popleft()
      self.progress.problem(w.task.p)

  def _write(self, t: _Task, row: dict[str, Any]) -> None:
    self.store.append(row)
    t.rows.append(row)
    t.pending = [(c, cfg) for c, cfg in t.pending if c != row["candidate"]]
    if row["kind"] == "candidate":
      cfg = t.configs.get(row["candidate"])
      if cfg is not None:
        t.history[cfg] = row["time_s"] if row["status"] == "ok" else None
      if row["status"] == "ok" and (t.best is None or row["time_s"] < t.best["time_s"]):
        t.best = row
    self.progress.row(row, t.best)

  def _lost(self, w: _Worker, status: str) -> None:
    """w hung past its deadline (status 'timeout') or died ('crash'): record, replace, go on."""
    if status == "timeout":
      w.kill()
      note = f"no result within {self.opts.timeout_s:g}s; worker killed"
    else:
      note = f"worker {w.death_note()}"
      w.kill()
    t, slot = w.task, w.slot
    if w.device is None:  # died or hung while starting
      self.start_failures[slot] += 1
      if self.start_failures[slot] >= 3:
        raise RagtuneError(f"the worker for device {w.index} failed to start 3 times: {note} "
                           f"(log: {w.log_path})")
    elif w.purpose == "ceilings":
      self.opts.ceilings = False  # measuring the ceilings is a nicety; never retry it
    elif t is not None and w.current is not None:
      cfg = t.configs.get(w.current)
      self._write(t, make_row(t.p, w.current, cfg, status, interpret=self.opts.interpret, device=w.device,
                              error=note))
    elif t is not None and t.pending:
      t.setup_failures += 1
      if t.setup_failures >= 2:  # the problem itself (inputs, reference) cannot be built here
        for cid, cfg in list(t.pending):
          self._write(t, make_row(t.p, cid, cfg, status, interpret=self.opts.interpret, device=w.device,
                                  error=f"{note} while building the problem's inputs and reference"))
    self._spawn(slot, t)


def run_sweep(problems: list[Problem], opts: SweepOptions, progress: SweepProgress | None = None,
              on_wait=None) -> list[ProblemSummary]:
  """Measure every problem; returns the per-problem summaries. Holds the folder's lock
  throughout; with opts.wait_for_lock, on_wait(holder) is called before waiting for it."""
  progress = progress or _Silent()
  with lock.sweep_lock(opts.out_dir, wait=opts.wait_for_lock, on_wait=on_wait):
    store = ResultsStore(opts.out_dir)
    done = {r["id"]: r for r in store.rows() if "id" in r}
    tasks, n_todo, n_done = [], 0, 0
    grouped = _by_problem(done)
    for p in problems:
      task, todo, did = _make_task(p, opts, done, grouped.get(p.key, []))
      n_todo, n_done = n_todo + todo, n_done + did
      for row in task.skip_rows:
        store.append(row)
      if task.pending:
        tasks.append(task)
    progress.start(n_todo, n_done)
    if tasks:
      pool = _Pool(opts, store, progress, {p.dtype for p in problems})
      try:
        pool.run(tasks)
      except BaseException:  # Ctrl-C or an error: stop every worker now, whatever it is doing
        pool.close(graceful=False)
        raise
      pool.close()
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
