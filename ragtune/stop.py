"""How a command stops: on Ctrl-C (SIGINT) or SIGTERM, a batch scheduler's stop (SLURM sends it
to every process of a job on scancel, preemption and at the time limit; Kubernetes to each
container's main process when it deletes a pod).

A command stops at once, or at its next safe point, and exits with 128 + the signal's number:
130 for SIGINT, 143 for SIGTERM. Each signal is recorded before anything is raised, so one whose
KeyboardInterrupt Python drops (one raised inside a garbage-collection callback is printed and
ignored) still stops the command at its next check(). Child processes leave Ctrl-C to their
parent and die of SIGTERM; a parent that sees a child die of either, and gets its own signal
within STOP_GRACE_S, stops (died_of), whichever of the two got it first: a job's stop is never
read as the child's crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop(KeyboardInterrupt):
  """A stop asked by a signal. A KeyboardInterrupt, so what cleans up on Ctrl-C cleans up on it too."""

  def __init__(self, signum: int = signal.SIGINT):
    super().__init__(signal.Signals(signum).name)
    self.signum = int(signum)


_received: list[int] = []  # the stop signals received and not yet acted on, first first
_deferred = 0  # > 0 while the main thread runs code that calls check() at its safe points


def handler(signum: int, frame) -> None:
  """The SIGINT/SIGTERM handler while a command runs: record the signal, then raise Stop,
  unless inside deferred(), whose code stops at its next check()."""
  _received.append(signum)
  if not _deferred:
    raise Stop(signum)


def check() -> None:
  """Raise Stop if a stop signal has been received (and not yet acted on)."""
  if _received:
    raise Stop(_received[0])


def exit_code(e: KeyboardInterrupt) -> int:
  """128 + the signal's number; a plain KeyboardInterrupt is Ctrl-C's. The stop is acted on:
  the record is cleared (a later command in the same process starts afresh)."""
  _received.clear()
  return 128 + (e.signum if isinstance(e, Stop) else signal.SIGINT)


# A stop reaches a job's processes one at a time (SLURM signals each process of a step in turn;
# a terminal, the whole group at once): a child dead of SIGINT or SIGTERM is the command's stop
# when this process gets its own signal within this long. Alone (an out-of-memory killer's
# SIGTERM, a kill of one pid) it is the child's own death, and a resumed sweep does not meet it
# again as a stop.
STOP_GRACE_S = 2.0


def died_of(returncode: int | None) -> None:
  """Raise Stop if a child's exit status says SIGINT or SIGTERM killed it and this process
  receives a stop signal too, within STOP_GRACE_S from now; else return, and the
  caller records the death as the child's own (a sweep: `crash`, killed by SIGTERM)."""
  if returncode is None or -returncode not in SIGNALS:
    return
  end = time.monotonic() + STOP_GRACE_S
  while True:
    check()
    if time.monotonic() >= end:
      return
    time.sleep(0.01)


@contextlib.contextmanager
def deferred():
  """Within: a signal is only recorded, and the code stops at its next check(). For code whose
  state a KeyboardInterrupt from an arbitrary line could break (a wait on a queue's lock can come
  out as "RuntimeError: release unlocked lock")."""
  global _deferred
  main = threading.current_thread() is threading.main_thread()
  _deferred += main
  try:
    check()
    yield
  finally:
    _deferred -= main


@contextlib.contextmanager
def handlers():
  """SIGINT and SIGTERM run handler() within (main thread only: elsewhere a no-op); the
  previous handlers come back after. A signal received earlier stops the command on entry.
  A Stop that Python can only print and ignore (raised in a garbage-collection callback, as
  jax has, or in __del__) is not printed: it is recorded, and stops the command at its next check()."""
  previous, hook = {}, sys.unraisablehook
  if threading.current_thread() is threading.main_thread():
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    sys.unraisablehook = lambda u: None if isinstance(u.exc_value, Stop) else hook(u)
  try:
    check()
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)
    sys.unraisablehook = hook


def exit_at_once() -> None:
  """The command's first act: until its commands install handlers(), a stop signal exits at
  once with one line. Imports are all there is to stop then, and a KeyboardInterrupt inside an
  import can come out as an ImportError or be dropped."""

  def now(signum, frame):
    with contextlib.suppress(Exception):
      sys.stdout.flush()
    os.write(2, b"interrupted\n")
    os._exit(128 + signum)

  for sig in SIGNALS:
    signal.signal(sig, now)


def ignore_ctrl_c() -> None:
  """In a child process: the parent decides what Ctrl-C stops (SIGTERM still ends the child)."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def ctrl_c_blocked():
  """Child processes started within never see Ctrl-C, from their first instruction on (a
  terminal sends it to every process of the group; one in its imports would print a traceback):
  they inherit this thread's signal mask through fork and exec. This process loses nothing: its
  other threads take the signal meanwhile, or it waits until the block ends."""
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
