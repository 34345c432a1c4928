"""This host's devices, asked of a child process, and each worker's share of them.

The parent never opens a device itself: a TPU host's chips can be held by one process
only, and a GPU context in the parent would cost every device memory.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import kernels
from kernels import gpus
from ragtune.errors import RagtuneError
from ragtune.problems import limits
from ragtune.run import child
from ragtune.words import count

PROBE_TIMEOUT_S = 300


def report_devices() -> None:
  """The probe's child process: sends ("devices", fields) of what jax sees here, or
  ("error", message) of a RagtuneError."""
  channel = child.Channel()
  import jax

  d = jax.local_devices()
  try:
    memory = limits.device_memory_bytes()
  except RagtuneError as e:
    return channel.send(("error", str(e)))
  cc = getattr(d[0], "compute_capability", None)  # places a GPU with no facts file (kernels.gpus)
  fields = {"platform": d[0].platform, "count": len(d), "device_kind": d[0].device_kind, "memory_bytes": memory}
  channel.send(("devices", {**fields, "compute_capability": cc if isinstance(cc, str) else None}))


@functools.cache
def probe_devices() -> dict[str, Any]:
  """{platform, count, device_kind, memory_bytes} of this host's accelerators, asked of a
  child process (memory_bytes: the first device's limit, None where unknown). Asked once
  per process."""
  with (
    tempfile.TemporaryDirectory() as tmp,
    child.Child(
      ["-c", "from ragtune.run import devices; devices.report_devices()"], log=Path(tmp) / "stderr.log"
    ) as probe,
  ):
    msg = probe.recv(PROBE_TIMEOUT_S)
    if msg is None:
      raise RagtuneError(f"listing this host's devices (in a child process) took over {PROBE_TIMEOUT_S}s")
    if msg[0] == "error":
      raise RagtuneError(msg[1])
    if msg[0] != "devices":
      tail = " | ".join(probe.stderr_lines()[-3:])
      raise RagtuneError(f"could not list this host's devices in a child process: {tail}")
    if msg[1]["platform"] in ("gpu", "cuda"):
      gpus.note_capability(msg[1]["device_kind"], msg[1].get("compute_capability"))
    return msg[1]


def default_results_dir() -> Path:
  return Path("results") / kernels.device_slug(probe_devices()["device_kind"])


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
        raise RagtuneError(f"--devices {spec}: only {count(available, 'local device')} here")
      return tuple(range(n))
    idx = tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise RagtuneError(f"--devices must be all, a count or indices like 0,2,5; got {spec!r}") from None
  bad = [i for i in idx if not 0 <= i < available]
  if bad or not idx or len(set(idx)) != len(idx):
    raise RagtuneError(f"--devices {spec}: indices must be distinct, in 0..{available - 1}")
  return idx


def worker_env(index: int, platform: str) -> dict[str, str]:
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


def keep_parent_off_device(platform: str) -> None:
  """Leave the accelerator to the workers: the parent's own jax (if it needs one) is the CPU."""
  if platform != "cpu":
    import jax

    try:
      jax.config.update("jax_platforms", "cpu")
    except Exception:  # noqa: BLE001 - already initialised: nothing more to do
      pass
