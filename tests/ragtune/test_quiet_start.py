"""The `ragtune` command starts quietly on a CPU host with the gpu-compile and tpu extras
(ragtune/quiet.py), and still shows a real failure of a platform the user asks for.

The commands run as a user runs them, through the console script, in an environment without
this test run's JAX_PLATFORMS=cpu (conftest.py) or a quiet start already marked in it."""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ragtune import quiet

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "shapes" / "smoke.yaml")
# One marker per kind of start-up line: absl's preamble, the CUDA plugin's cudart notice, jax's
# record of the plugin's failed version check, and libtpu's two.
NOISE = (
  "InitializeLog",
  "cudart_stub",
  "Jax plugin configuration error",
  "Failed to find host bounds",
  "INVALID_ARGUMENT",
)
_SET_BY_RUNS = ("JAX_PLATFORMS", quiet.SWITCH, *quiet._TPU_SLICE)


def _why_not_here() -> str | None:
  if quiet._nvidia_device() or quiet._tpu_device():
    return "a GPU or TPU host starts differently; these lines are a CPU host's"
  extras = {"gpu-compile": quiet._CUDA_PLUGINS, "tpu": ("libtpu",)}
  missing = [extra for extra, modules in extras.items() if not any(quiet._spec(m) for m in modules)]
  if missing and os.environ.get("CI"):
    raise RuntimeError(f"CI installs the {' and '.join(missing)} extras, which make these lines")
  return f"needs the {' and '.join(missing)} extras (their start-up prints the lines)" if missing else None


_WHY = _why_not_here()
cpu_host_with_extras = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _ragtune(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
  clean = {k: v for k, v in os.environ.items() if k not in _SET_BY_RUNS}
  # libtpu takes a host-wide lock unless told that several may load; with it, libtpu starts the
  # same way whether or not another process here holds that lock.
  clean["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  ragtune = Path(sys.executable).with_name("ragtune")
  cmd = [str(ragtune)] if ragtune.is_file() else [sys.executable, "-m", "ragtune"]
  return subprocess.run([*cmd, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=300)


def _noise(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if any(m in line for m in NOISE)]


@cpu_host_with_extras
@pytest.mark.parametrize(
  "args",
  [
    ["--version"],
    ["plan", SMOKE],
    # jax starts in the command itself (the CUDA plugin's check, libtpu): no LUT, checks only.
    ["bench", SMOKE, "--op", "fwd", "--shape", "96,64,80"],
  ],
  ids=["version", "plan", "bench"],
)
def test_commands_start_quietly(args, tmp_path):
  r = _ragtune(*args, cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert _noise(r.stderr) == [], r.stderr[-3000:]


@cpu_host_with_extras
def test_a_python_script_gets_the_quiet_start_docs_commands_md_shows(tmp_path):
  """`import kernels` leaves jax's start-up as it is; the snippet in docs/commands.md gives a
  script the command's quiet start, up to jax's first computation."""
  blocks = re.findall(r"^```(\w*)\n(.*?)^```", (ROOT / "docs" / "commands.md").read_text(), re.M | re.S)
  (snippet,) = [body for lang, body in blocks if lang == "python" and "quiet_start()" in body]
  clean = {k: v for k, v in os.environ.items() if k not in _SET_BY_RUNS}
  clean["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  code = snippet + "jax.numpy.ones(1).block_until_ready()\n"
  r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert _noise(r.stderr) == [], r.stderr[-3000:]


@cpu_host_with_extras
def test_a_platform_asked_for_still_fails_loudly(tmp_path):
  """JAX_PLATFORMS=cuda on a host without a GPU: jax's own error, as without the quiet start."""
  r = _ragtune("bench", SMOKE, "--op", "fwd", "--shape", "96,64,80", cwd=tmp_path, JAX_PLATFORMS="cuda")
  assert r.returncode != 0
  assert "Jax plugin configuration error" in r.stderr and "Unable to load CUDA" in r.stderr, r.stderr[-3000:]


@cpu_host_with_extras
def test_the_users_log_level_wins(tmp_path):
  """TF_CPP_MIN_LOG_LEVEL=0 asks for the C++ INFO lines: the cudart notices stay."""
  r = _ragtune("--version", cwd=tmp_path, TF_CPP_MIN_LOG_LEVEL="0")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "cudart_stub" in r.stderr


def test_only_the_cudart_notices_are_cut():
  notice = (
    b"I0000 00:00:1795588827.881776    4458 cudart_stub.cc:31] "
    b"Could not find cuda drivers on your machine, GPU will not be used.\n"
  )
  preamble = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
  real = b"E0000 00:00:1795588827.9    4458 something.cc:12] a real error\n"
  data = b"before\n" + preamble + notice + preamble + real + notice + b"after, no newline"
  assert quiet._drop_cudart_notices(data) == b"before\n" + preamble + real + b"after, no newline"


def test_a_gpu_or_tpu_host_is_left_alone(monkeypatch):
  monkeypatch.setattr(quiet, "_nvidia_device", lambda: True)
  monkeypatch.setattr(quiet, "_tpu_device", lambda: True)
  for var in _SET_BY_RUNS:
    monkeypatch.delenv(var, raising=False)
  logger = logging.getLogger("jax._src.xla_bridge")
  filters = list(logger.filters)
  quiet.quiet_start()
  assert logger.filters == filters
  assert not any(v in os.environ for v in quiet._TPU_SLICE)


def test_only_the_cuda_check_failure_is_dropped():
  def record(msg, *args, fn):
    try:
      fn()
    except RuntimeError:
      return logging.LogRecord("jax._src.xla_bridge", logging.ERROR, "", 0, msg, args, sys.exc_info())

  def _check_cuda_versions():
    raise RuntimeError("Unable to load CUDA. Is it installed?")

  def _import_extensions():
    raise RuntimeError("a broken install")

  failed = "Jax plugin configuration error: Exception when calling %s.initialize()"
  assert not quiet._not_cuda_check_failure(record(failed, "jax_plugins.xla_cuda12", fn=_check_cuda_versions))
  assert quiet._not_cuda_check_failure(record(failed, "jax_plugins.xla_cuda12", fn=_import_extensions))
  assert quiet._not_cuda_check_failure(record(failed, "jax_plugins.other", fn=_check_cuda_versions))
