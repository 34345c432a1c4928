"""A quiet start for the `ragtune` command on a host with neither a GPU nor a TPU.

With the gpu-compile and tpu extras installed there (for deviceless compiles), each process
that starts jax prints lines that say nothing of what the command does:

- "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
  then "I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not
  be used.": a static constructor in each CUDA plugin library, when it is loaded (the
  jax_cuda12_plugin modules that `import jax` loads, and xla_cuda_plugin.so where jax
  registers the plugin). Each library bundles its own absl, whose INFO threshold no
  environment variable reaches (TF_CPP_MIN_LOG_LEVEL does not), and logs before any code can
  call into it. So fd 2 goes to a temporary file while quiet_start loads those libraries
  first, and comes back with everything written there but these two lines.
- "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda12.initialize()"
  and a traceback: jax's plugin discovery (jax._src.xla_bridge.discover_pjrt_plugins) logs,
  at ERROR, the plugin's CUDA version check failing for want of a CUDA runtime. Where there
  is no NVIDIA device node jax never starts CUDA anyway (xla_bridge.backends), so a logging
  filter drops that one record, only when the failure is that check's.
- "Failed to find host bounds for accelerator type: WARNING: could not determine TPU
  accelerator type ..." and "E0000 ... INVALID_ARGUMENT: Error: unexpected worker hostname
  ...": libtpu's start-up, when jax tries the TPU backend or a deviceless TPU compile makes a
  topology. jax has set TPU_SKIP_MDS_QUERY (no TPU here), so libtpu wants this host's slice
  from TPU_WORKER_HOSTNAMES and TPU_HOST_BOUNDS, and prints its fallback text, before its own
  logging starts (TPU_STDERR_LOG_LEVEL and TPU_MIN_LOG_LEVEL do not reach it). quiet_start
  sets them to what is true of such a host: one host, this one. libtpu then finds no chip
  and says so to jax, which logs it at INFO; compile-only topologies come out the same.

Nothing changes where the hardware is, or where the user decides: an NVIDIA device node
(/dev/nvidia*, WSL's /dev/dxg) or JAX_PLATFORMS naming cuda or gpu leaves the CUDA side alone
(jax's errors then show as ever); any sign of a TPU (/dev/accel*, a /dev/vfio group, a PCI
device of Google's), JAX_PLATFORMS naming tpu, or libtpu's slice variables set by the user
leave libtpu alone. TF_CPP_MIN_LOG_LEVEL=0 keeps the cudart lines; RAGTUNE_QUIET_START=0
turns all of this off. The settings are environment variables, so the command's child
processes inherit them; each also repeats quiet_start as it imports ragtune (ragtune/__init__.py),
for what no variable carries: the fd 2 filter and the logging filter.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

SWITCH = "RAGTUNE_QUIET_START"
# libtpu's own answer when it cannot ask the VM's metadata: a slice of one host, this one.
_TPU_SLICE = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}
_TPU_USER = (
  *_TPU_SLICE,
  "TPU_ACCELERATOR_TYPE",
  "TPU_WORKER_ID",
  "TPU_PROCESS_ADDRESSES",
  "TPU_PROCESS_BOUNDS",
  "TPU_CHIPS_PER_HOST_BOUNDS",
)
# What `import jax` loads of the CUDA plugin (jax._src.lib): Python shims over its libraries.
_JAXLIB_GPU = ("jaxlib.gpu_solver", "jaxlib.gpu_sparse", "jaxlib.gpu_prng", "jaxlib.gpu_linalg")
_CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin")
_PJRT_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_CUDART_NOTICE = re.compile(
  rb"I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\."
)
_held: dict[Path, ctypes.CDLL] = {}  # the PJRT plugin libraries loaded here, kept loaded


def quiet_start() -> None:
  """Quiet jax's start-up on a host without the GPU or TPU its plugins are for (see the
  module's docstring). Call it before anything imports jax; calling it again does nothing more."""
  if os.environ.get(SWITCH) == "0":
    return
  os.environ[SWITCH] = "1"  # the child processes repeat this (ragtune/__init__.py)
  platforms = _named("JAX_PLATFORMS")
  asked = platforms | _named("JAX_PLATFORM_NAME")  # the older variable names a default platform
  if not asked & {"cuda", "gpu"} and not _nvidia_device():
    logging.getLogger("jax._src.xla_bridge").addFilter(_not_cuda_check_failure)
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() != "0":
      # With JAX_PLATFORMS set (without cuda, here) the plugin skips its check and registers.
      _load_cuda_plugin_quietly(registers=bool(platforms or os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")))
  tpu_user = any(v in os.environ for v in _TPU_USER)
  if "tpu" not in asked and not tpu_user and _libtpu_installed() and not _tpu_device():
    os.environ.update(_TPU_SLICE)


def _named(var: str) -> set[str]:
  """The platforms a variable names for jax (a comma-separated list)."""
  return {p.strip().lower() for p in os.environ.get(var, "").split(",") if p.strip()}


def _nvidia_device() -> bool:
  """jax's own test (xla_bridge skips CUDA without it), widened to any NVIDIA device node."""
  return bool(glob.glob("/dev/nvidia*")) or os.path.exists("/dev/dxg")


def _tpu_device() -> bool:
  """Any sign of a TPU: its device nodes (/dev/accel*; a vfio group from v5e on, counted
  whatever its device) or a PCI device of Google's vendor id (jax's own test)."""
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return True
  for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
    with contextlib.suppress(OSError):
      if Path(vendor).read_text().strip() == "0x1ae0":
        return True
  return False


def _spec(name: str):
  try:
    return importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return None


def _libtpu_installed() -> bool:
  return bool(os.environ.get("TPU_LIBRARY_PATH")) or _spec("libtpu") is not None


def _not_cuda_check_failure(record: logging.LogRecord) -> bool:
  """A logging filter: False for jax's record of the CUDA plugin's version check failing."""
  if not str(record.msg).startswith("Jax plugin configuration error: Exception when calling"):
    return True
  args = record.args if isinstance(record.args, tuple) else ()
  if not (args and str(args[0]).startswith("jax_plugins.xla_cuda") and record.exc_info):
    return True
  return "_check_cuda_versions" not in {frame.name for frame in traceback.extract_tb(record.exc_info[2])}


def _load_cuda_plugin_quietly(registers: bool) -> None:
  """Load the CUDA plugin libraries that print the cudart notice, before jax does, with the
  notice cut from fd 2: those of `import jax`, and the PJRT plugin where jax will register it
  (JAX_PLATFORMS without cuda, or the version check skipped) rather than fail its check."""
  shims = [m for m in _JAXLIB_GPU if m not in sys.modules] if any(_spec(p) for p in _CUDA_PLUGINS) else []
  plugins = [p for p in (_plugin_library(name) for name in _PJRT_PLUGINS) if p and p not in _held] if registers else []
  if not shims and not plugins:
    return
  with _cudart_notices_cut():
    for module in shims:
      with contextlib.suppress(Exception):  # jax's own import shows what is wrong
        importlib.import_module(module)
    for path in plugins:
      with contextlib.suppress(OSError):  # as jax loads it (RTLD_LAZY); jax reports a failure
        _held[path] = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LAZY", 1))


def _plugin_library(name: str) -> Path | None:
  spec = _spec(name)
  path = Path(spec.origin).parent / "xla_cuda_plugin.so" if spec and spec.origin else None
  return path if path and path.is_file() else None


@contextlib.contextmanager
def _cudart_notices_cut():
  """fd 2 into a temporary file for the block, then back, with what was written there less
  the cudart notices. Where fd 2 or a temporary file cannot be had, nothing is cut."""
  try:
    tmp = tempfile.TemporaryFile()
  except OSError:
    yield
    return
  with tmp:
    if sys.stderr:
      sys.stderr.flush()
    try:
      saved = os.dup(2)
    except OSError:
      yield
      return
    try:
      os.dup2(tmp.fileno(), 2)
      yield
    finally:
      if sys.stderr:
        with contextlib.suppress(Exception):
          sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      _write_all(2, _drop_cudart_notices(tmp.read()))


def _drop_cudart_notices(data: bytes) -> bytes:
  """data less each cudart notice line and the absl preamble line just before it."""
  lines = data.splitlines(keepends=True)
  notice = [bool(_CUDART_NOTICE.fullmatch(line.rstrip(b"\r\n"))) for line in lines]
  keep = [
    line
    for i, line in enumerate(lines)
    if not notice[i] and not (line.rstrip(b"\r\n") == _ABSL_PREAMBLE and i + 1 < len(lines) and notice[i + 1])
  ]
  return b"".join(keep)


def _write_all(fd: int, data: bytes) -> None:
  while data:
    data = data[os.write(fd, data) :]
