"""The sweep's worker pool: one worker process per device (ragtune/run/worker.py), fed one
problem at a time; the pool is the only writer of records.jsonl, and every outcome
becomes exactly one row, appended as soon as it is known.

Faults: the pool gives each candidate `timeout_s` (compile + check + time). A worker
past it is killed and the candidate recorded as `timeout`; a worker that dies is recorded
as `crash` with its signal or the tail of its stderr, unless SIGINT or SIGTERM killed it: the
sweep is being stopped (ragtune/stop.py), and the candidate in flight is left for the
resumed sweep, as on a stop of the sweep itself. A fresh worker on the same device
then takes the problem's remaining candidates. Baselines are not re-timed there: each
row is written once, the device is the same, and a fresh process warms up before it
times (measure.time_variants), so times stay comparable. Rows carry `worker_pid`, so
one can see which process timed what.
"""

from __future__ import annotations

import collections
import datetime as dt
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ragtune import stop
from ragtune.errors import RagtuneError
from ragtune.problems.shapes import Problem
from ragtune.records.store import Record, ResultsStore, make_row
from ragtune.run import child, devices, environment
from ragtune.run.options import SweepOptions
from ragtune.run.plan import Task


class Progress(Protocol):
  """What the pool reports as it goes."""

  def problem(self, p: Problem) -> None: ...
  def row(self, row: Record, best: Record | None) -> None: ...
  def tick(self) -> None: ...  # called about once a second, for heartbeat lines


class _Worker(child.Child):
  """One worker process on one device, and what it is doing."""

  def __init__(self, slot: int, index: int, platform: str, events: queue.Queue, log_dir: Path):
    self.slot, self.index = slot, index
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"worker-{slot}.log"
    started = dt.datetime.now().isoformat(timespec="seconds")
    with open(log, "ab") as f:
      f.write(f"--- worker for device {index} started {started}\n".encode())
    super().__init__(["-m", "ragtune.run.worker"], env=devices.worker_env(index, platform), log=log, events=events)
    self.device: dict[str, Any] | None = None
    self.task: Task | None = None
    self.current: str | None = None  # the item being measured now
    self.deadline: float | None = None
    self.purpose = "work"

  def ask(self, msg, timeout_s: float) -> None:
    """Send msg; the worker has timeout_s to answer."""
    self.deadline = time.monotonic() + timeout_s
    self.send(msg)


class Pool:
  """Shares the tasks out to one worker per device and writes every row."""

  def __init__(
    self,
    opts: SweepOptions,
    store: ResultsStore,
    progress: Progress,
    dtypes: set[str],
    problem_done: Callable[[Task], None],
  ):
    self.opts, self.store, self.progress, self.dtypes = opts, store, progress, dtypes
    self.problem_done = problem_done  # called with each task once its problem is done
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

  def _spawn(self, slot: int, task: Task | None = None) -> None:
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

  def run(self, tasks: list[Task]) -> None:
    # Ctrl-C and SIGTERM stop the loop at its next turn (within a second), or before it acts
    # on the event it has just read: the death of a worker killed by the same signal.
    with stop.deferred():
      self._run(tasks)

  def _run(self, tasks: list[Task]) -> None:
    self.queue = collections.deque(tasks)
    for slot in range(min(len(self.opts.devices), max(1, len(tasks)))):
      self._spawn(slot)
    while any(w.task is not None or w.purpose != "work" for w in self.workers.values()) or self.queue:
      stop.check()
      self.progress.tick()
      now = time.monotonic()
      deadlines = [w.deadline for w in self.workers.values() if w.deadline is not None]
      wait = min([1.0] + [max(0.01, d - now) for d in deadlines])
      try:
        w, msg = self.events.get(timeout=wait)
      except queue.Empty:
        stop.check()
        for w in list(self.workers.values()):
          if w.deadline is not None and time.monotonic() > w.deadline:
            self._lost(w, "timeout")
        continue
      stop.check()
      if w.dead or self.workers.get(w.slot) is not w:
        continue  # a killed worker's last words, or a spare that died idle (replaced when needed)
      getattr(self, f"_on_{msg[0]}")(w, *msg[1:])

  # -- events --

  def _on_hello(self, w: _Worker, device: dict[str, Any]) -> None:
    w.device, w.deadline = device, None
    self.start_failures[w.slot] = 0
    if self.opts.ceilings and not self.ceilings_asked:
      from ragtune.device import ceilings

      self.ceilings_asked = True
      missing = ceilings.missing(self.opts.out_dir, device, self.dtypes)
      if missing:
        w.purpose = "ceilings"
        w.ask(("ceilings", sorted(missing)), max(120.0, self.opts.timeout_s))
        return
    self._feed(w)

  def _on_ceilings(self, w: _Worker, data: dict[str, Any]) -> None:
    from ragtune.device import ceilings

    ceilings.save(self.opts.out_dir, w.device, data)
    w.purpose, w.deadline = "work", None
    self._feed(w)

  def _on_begin(self, w: _Worker, cid: str) -> None:
    w.current, w.deadline = cid, time.monotonic() + self.opts.timeout_s

  def _on_row(self, w: _Worker, row: Record) -> None:
    if row.status != "ok" and (failure := environment.classify(row.error)) is not None:
      p = row.problem  # not recorded: it would fail every candidate the same way
      raise RagtuneError(environment.stop_text(f"{p.op} {p.backend} {p.shape_label} {row.candidate}", failure))
    self._write(w.task, row)
    w.current, w.deadline = None, time.monotonic() + self.opts.timeout_s

  def _on_done(self, w: _Worker, key: str) -> None:
    w.deadline = None
    self._feed(w)

  def _on_eof(self, w: _Worker) -> None:
    stop.died_of(w.reaped())
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
        self.problem_done(t)
        w.task = None
      if not self.queue:
        w.deadline = None
        return
      w.task = self.queue.popleft()
      self.progress.problem(w.task.p)

  def _write(self, t: Task, row: Record) -> None:
    self.store.append(row)
    t.rows.append(row)
    cid = row.candidate
    t.pending = [(c, cfg) for c, cfg in t.pending if c != cid]
    if not row.baseline:
      cfg = t.configs.get(cid)
      if cfg is not None:
        t.history[cfg] = row.time_s if row.status == "ok" else None
      if row.ok and (t.best is None or row.time_s < t.best.time_s):
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
        raise RagtuneError(f"the worker for device {w.index} failed to start 3 times: {note} (log: {w.log_path})")
    elif w.purpose == "ceilings":
      self.opts.ceilings = False  # measuring the ceilings is a nicety; never retry it
    elif t is not None and w.current is not None:
      cfg = t.configs.get(w.current)
      self._write(t, make_row(t.p, w.current, cfg, status, interpret=self.opts.interpret, device=w.device, error=note))
    elif t is not None and t.pending:
      t.setup_failures += 1
      if t.setup_failures >= 2:  # the problem itself (inputs, reference) cannot be built here
        for cid, cfg in list(t.pending):
          self._write(
            t,
            make_row(
              t.p,
              cid,
              cfg,
              status,
              interpret=self.opts.interpret,
              device=w.device,
              error=f"{note} while building the problem's inputs and reference",
            ),
          )
    self._spawn(slot, t)
