"""One sweep per results folder: a file lock (filelock), and who holds it.

A second sweep into a held folder stops at once naming the holder (pid, host, start
time), or waits with --wait. The lock is released by the OS if its holder dies.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
from pathlib import Path

from ragtune.errors import RagtuneError
from ragtune.paths import write_atomic

LOCK = ".sweep.lock"
HOLDER = ".sweep.holder.json"


@contextlib.contextmanager
def sweep_lock(directory: str | Path, *, wait: bool = False, on_wait=None):
  """Hold the results folder for one sweep. A second one fails at once naming the holder,
  or with wait=True waits for it (on_wait(holder_text) is called once before waiting)."""
  import filelock

  d = Path(directory)
  if d.exists() and not d.is_dir():
    raise RagtuneError(f"{d}: is a file, not a results folder")
  d.mkdir(parents=True, exist_ok=True)
  lock = filelock.FileLock(str(d / LOCK))
  try:
    lock.acquire(timeout=0)
  except filelock.Timeout:
    if not wait:
      raise _held(d) from None
    if on_wait:
      on_wait(_holder(d))
    lock.acquire()
  try:
    info = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    write_atomic(d / HOLDER, json.dumps(info) + "\n")
    yield
  finally:
    try:
      (d / HOLDER).unlink()
    except OSError:
      pass
    lock.release()


def check(directory: str | Path) -> None:
  """Raise as sweep_lock does if another sweep holds the folder now: before a sweep prints its plan."""
  import filelock

  d = Path(directory)
  if not (d / LOCK).is_file():
    return
  lock = filelock.FileLock(str(d / LOCK))
  try:
    lock.acquire(timeout=0)
  except filelock.Timeout:
    raise _held(d) from None
  lock.release()


def _held(d: Path) -> RagtuneError:
  return RagtuneError(
    f"{d}: another sweep is writing here ({_holder(d)}); wait for it, use another -o folder, or pass --wait"
  )


def _holder(d: Path) -> str:
  try:
    h = json.loads((d / HOLDER).read_text())
    return f"pid {h['pid']} on {h['host']}, started {h['started']}"
  except (OSError, ValueError, KeyError):
    return "holder unknown"
