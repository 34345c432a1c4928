"""Ctrl-C (SIGINT) and SIGTERM at any moment of a command: one line, exit 130 or 143, no traceback.

A terminal's Ctrl-C and a batch scheduler's SIGTERM reach every process of the group. The sweep's
own moments (a candidate in flight, a worker killed alone) are in test_workers.py; verify's and
bench's in test_verify.py and test_bench.py.
"""

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragtune import stop
from ragtune.cli.app import app
from ragtune.run import pool, prepare

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "shapes" / "smoke.yaml"
runner = CliRunner()
pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc (Linux)")


def _children(pid: int) -> list[int]:
  kids = []
  for stat in Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid:
      kids.append(int(stat.parent.name))
  return kids


def _stop_when(tmp_path, sig, ready) -> subprocess.CompletedProcess:
  """`ragtune sweep` in its own process group, sent sig once ready(pid) holds; its outcome."""
  env = {k: v for k, v in os.environ.items() if k != "RAGTUNE_QUIET_START"}
  cmd = [sys.executable, "-m", "ragtune", "sweep", str(SMOKE), "-o", str(tmp_path / "res"), "--op", "fwd"]
  pipe = subprocess.PIPE
  proc = subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True)
  deadline = time.time() + 300
  while not ready(proc.pid) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.01)
  assert proc.poll() is None, proc.communicate()
  os.killpg(proc.pid, sig)
  out, err = proc.communicate(timeout=120)
  return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_inside_import_kernels_is_one_line(tmp_path, sig):
  """The user's report: a KeyboardInterrupt traceback from inside `import kernels` (or an
  ImportError, where the interrupt lands in an extension module's start-up)."""
  importing = lambda pid: "jaxlib" in Path(f"/proc/{pid}/maps").read_text()
  r = _stop_when(tmp_path, sig, importing)
  assert (r.returncode, r.stdout, r.stderr) == (128 + sig, "", "interrupted\n")
  assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_while_the_devices_are_listed_is_one_line(tmp_path, sig):
  """After the imports, before the sweep's own handling: the device probe, a child process, runs.
  SIGTERM kills the child too; that is the stop, not "could not list this host's devices"."""
  r = _stop_when(tmp_path, sig, _children)
  assert r.returncode == 128 + sig, r.stderr
  assert r.stderr.strip().splitlines()[-1] == "interrupted" and "Traceback" not in r.stderr, r.stderr
  assert "error" not in r.stderr, r.stderr


def test_a_ctrl_c_python_drops_still_stops_the_sweep(tmp_path, monkeypatch):
  """The user's report: Ctrl-C in the first second, and the sweep ran to its end with exit 0.
  The KeyboardInterrupt was raised inside jax's garbage-collection callback, where Python
  prints it and goes on."""
  real = prepare.sweep

  def interrupted_in_gc(*args, **kwargs):
    run = real(*args, **kwargs)

    def callback(phase, info):
      if phase == "start":
        signal.raise_signal(signal.SIGINT)

    gc.callbacks.append(callback)
    try:
      gc.collect()
    finally:
      gc.callbacks.remove(callback)
    return run

  monkeypatch.setattr(prepare, "sweep", interrupted_in_gc)
  monkeypatch.setattr(pool.Pool, "run", lambda self, tasks: pytest.fail("the sweep went on"))
  r = runner.invoke(app, ["sweep", str(SMOKE), "-o", str(tmp_path / "res"), "--op", "fwd", "--budget", "2"])
  assert r.exit_code == 130, r.output
  assert r.output.strip().splitlines()[-1].startswith("interrupted: every finished row is kept"), r.output
  assert "Traceback" not in r.output and "Exception ignored" not in r.output, r.output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_child_killed_by_ctrl_c_or_sigterm_is_a_stop_when_this_process_gets_it_too(sig, monkeypatch):
  """A scheduler signals a job's processes in turn: the child's death is seen first, this
  process's own signal comes within the grace."""
  later = threading.Timer(0.1, os.kill, (os.getpid(), sig))
  monkeypatch.setattr(stop, "STOP_GRACE_S", 30)
  with stop.handlers(), stop.deferred(), pytest.raises(stop.Stop) as stopped:
    later.start()
    stop.died_of(-sig)
  assert stop.exit_code(stopped.value) == 128 + sig


@pytest.mark.parametrize("returncode", [-signal.SIGINT, -signal.SIGTERM])
def test_a_child_killed_alone_by_ctrl_c_or_sigterm_is_its_own_death(returncode, monkeypatch):
  monkeypatch.setattr(stop, "STOP_GRACE_S", 0.2)
  t0 = time.monotonic()
  stop.died_of(returncode)  # the caller records it (a sweep: `crash`)
  assert time.monotonic() - t0 >= 0.2, "this process's own signal was waited for"


@pytest.mark.parametrize("returncode", [None, 0, 1, 3, -signal.SIGKILL, -signal.SIGSEGV, -signal.SIGABRT])
def test_a_child_that_exits_or_dies_otherwise_is_its_own_failure(returncode):
  stop.died_of(returncode)  # the caller records it (a sweep: `crash`)
