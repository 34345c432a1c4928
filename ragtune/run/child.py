"""Child processes the parent can stop: the sweep's workers, verify's draws, the device probe.

A child is a fresh Python interpreter that imports this ragtune (never a fork: jax's
threads must not be forked). Parent and child talk in messages, length-prefixed pickles
on the child's stdin (parent -> child) and on a duplicate of its original stdout (child
-> parent); in the child, fd 1 points at stderr, so stray prints from jax or a user's
code cannot corrupt the stream. A thread in the parent turns each child's messages into
events (child, message), then (child, EOF) once the child is gone. The parent stops a
child by killing it (SIGKILL, then reaping it), so a hung computation is stopped, not
abandoned; the child's exit status and stderr say why it died. A child killed by SIGINT or
SIGTERM means the command is being stopped (ragtune/stop.py), not that the child failed.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from ragtune import stop

EOF = ("eof",)  # the event of a child that is gone (or sent a torn message)
_HEADER = struct.Struct(">I")


def _write(f: BinaryIO, msg: Any) -> None:
  data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
  f.write(_HEADER.pack(len(data)) + data)
  f.flush()


def _read(f: BinaryIO) -> Any:
  """The next message, or None at end of file (the other side is gone)."""
  head = f.read(_HEADER.size)
  if len(head) < _HEADER.size:
    return None
  (n,) = _HEADER.unpack(head)
  data = f.read(n)
  if len(data) < n:
    return None
  return pickle.loads(data)


def pythonpath(*extra: str) -> str:
  """PYTHONPATH for a child process that imports this ragtune (then `extra`, then the caller's)."""
  root = str(Path(__file__).resolve().parents[2])
  return os.pathsep.join(x for x in (root, *extra, os.environ.get("PYTHONPATH", "")) if x)


# --- the child's side -------------------------------------------------------------------


class Channel:
  """The child's end of the messages. Made first thing in a child: it takes fd 1 for the
  messages, leaves Ctrl-C to the parent, and exits the child if the parent dies."""

  def __init__(self):
    self._out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    self._in = sys.stdin.buffer
    stop.ignore_ctrl_c()
    threading.Thread(target=_watch_parent, daemon=True).start()

  def send(self, msg: Any) -> None:
    _write(self._out, msg)

  def recv(self) -> Any:
    """The parent's next message, or None once the parent has closed its end."""
    return _read(self._in)


def _watch_parent() -> None:
  # An orphaned child (the parent was SIGKILLed) must not keep a device busy.
  parent = os.getppid()
  while True:
    time.sleep(0.5)
    if os.getppid() != parent:
      os._exit(3)


# --- the parent's side ------------------------------------------------------------------


class Child:
  """`python ARGS` as a child process, and the thread that turns its messages into events.

  env: its environment [default: this process's, with PYTHONPATH=pythonpath()].
  log: a file its stderr is appended to [default: this process's stderr].
  events: the queue its (self, message) events go to, shared by a pool of children
  [default: its own, read with recv].
  """

  def __init__(
    self,
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    events: queue.Queue | None = None,
  ):
    self.events: queue.Queue = queue.Queue() if events is None else events
    self.log_path = log
    self._log = open(log, "ab") if log is not None else None
    self._log_start = self._log.tell() if self._log is not None else 0
    with stop.ctrl_c_blocked():
      self.proc = subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=self._log,
        env=env or dict(os.environ, PYTHONPATH=pythonpath()),
      )
    self.dead = False  # given up on by the parent: its last events are to be ignored
    threading.Thread(target=self._pump, daemon=True).start()

  def _pump(self) -> None:
    while True:
      try:
        msg = _read(self.proc.stdout)
      except Exception:  # noqa: BLE001 - a torn message is the same as a dead child
        msg = None
      self.events.put((self, EOF if msg is None else msg))
      if msg is None:
        return

  @property
  def pid(self) -> int:
    return self.proc.pid

  def alive(self) -> bool:
    return self.proc.poll() is None

  def send(self, msg: Any) -> None:
    try:
      _write(self.proc.stdin, msg)
    except (BrokenPipeError, OSError):
      pass  # it is gone: its EOF event follows

  def recv(self, timeout_s: float) -> Any:
    """Its next message (EOF once it is gone), or None if none came within timeout_s; raises
    stop.Stop on Ctrl-C or SIGTERM, to this process or the child. Only for a child with its own
    events queue."""
    end = time.monotonic() + timeout_s
    with stop.deferred():
      while True:
        try:
          msg = self.events.get(timeout=max(0.0, min(0.5, end - time.monotonic())))[1]
        except queue.Empty:
          stop.check()
          if time.monotonic() >= end:
            return None
          continue
        stop.check()
        if msg == EOF:
          stop.died_of(self.reaped())
        return msg

  def reaped(self, grace_s: float = 5.0) -> int:
    """The exit status of a child whose output has ended. It exits then, normally; one that
    lingers (its last message torn) is killed, so no wait here is left to a signal to end."""
    try:
      return self.proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
      self.kill()
      return self.proc.returncode

  def kill(self) -> None:
    """Stop it now and reap it."""
    self.dead = True
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()
    if self._log is not None:
      self._log.close()

  def close(self, grace_s: float = 5.0) -> None:
    """Ask it to exit ("exit", then the end of its input); kill it if it has not within grace_s."""
    self.dead = True
    try:
      _write(self.proc.stdin, ("exit",))
      self.proc.stdin.close()
      self.proc.wait(timeout=grace_s)
    except Exception:  # noqa: BLE001 - gone already, or hung: killed below either way
      pass
    self.kill()

  def __enter__(self) -> Child:
    return self

  def __exit__(self, *_) -> None:
    self.kill()

  def stderr_lines(self) -> list[str]:
    """Once it has exited: the non-empty lines it wrote to its log."""
    self.proc.wait()
    if self.log_path is None:
      return []
    try:
      with open(self.log_path, "rb") as f:
        f.seek(self._log_start)
        return [l for l in f.read().decode(errors="replace").splitlines() if l.strip()]
    except OSError:
      return []

  def exit_text(self) -> str:
    """How it ended, once it has: 'killed by SIGSEGV', 'exited with code 1'."""
    rc = self.proc.wait()
    if rc < 0 and -rc in signal.Signals._value2member_map_:
      return f"killed by {signal.Signals(-rc).name}"
    return f"exited with code {rc}"

  def death_note(self) -> str:
    """Why it died: signal or exit code, and the tail of its stderr, e.g. 'killed by SIGSEGV; stderr: ...'."""
    how = self.exit_text()
    lines = self.stderr_lines()
    fatal = next((i for i, l in enumerate(lines) if l.startswith("Fatal Python error")), None)
    if fatal is not None:  # faulthandler: the error, then the crashing thread's innermost frames
      start = next((i for i in range(fatal, len(lines)) if lines[i].startswith("Current thread")), fatal)
      frames = [l.strip() for l in lines[start + 1 :] if l.strip().startswith("File")][:2]
      tail = " | ".join([lines[fatal]] + frames)[:400]
    else:
      tail = " | ".join(lines[-3:])[-400:]
    return how + (f"; stderr: {tail}" if tail else "")
