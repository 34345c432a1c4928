"""Problems too big to run, refused before any work: a backend's int32 indexing and device memory."""

from __future__ import annotations

import os
from typing import Any

from kernels import registry
from kernels.common import itemsize
from kernels.lut import shape_text
from ragtune.errors import RagtuneError

INT32_MAX = 2**31 - 1

# A backend without wide_indexing (kernels/<backend>/__init__.py says why each has it or not)
# is held to int32 element counts. DeepSeek-V3's and Llama-4-Maverick's full expert weights
# are operands past them.


def operand_elements(op: str, m: int, k: int, n: int, g: int) -> dict[str, int]:
  """Elements of each array one check of `op` holds (the forward problem's m, k, n, g)."""
  out = {"fwd": ("out [m,n]", m * n), "dlhs": ("dlhs [m,k]", m * k), "drhs": ("drhs [g,k,n]", g * k * n)}[op]
  return {"lhs [m,k]": m * k, "rhs [g,k,n]": g * k * n, "dout [m,n]": m * n, out[0]: out[1]}


def bytes_needed(op: str, dtype: str, m: int, k: int, n: int, g: int) -> int:
  """Inputs in `dtype`, their float32 copies for the reference, its output and the op's."""
  el = operand_elements(op, m, k, n, g)
  out = list(el.values())[-1]
  inputs = el["lhs [m,k]"] + el["rhs [g,k,n]"] + el["dout [m,n]"]
  return itemsize(dtype) * (inputs + out) + 4 * (inputs + out)


# Bytes that stand in for the device's memory: a device shared with another job, or a CPU
# host (which reports no limit of its own) standing in for a smaller device, as tests do.
MEMORY_ENV = "RAGTUNE_DEVICE_MEMORY"


def memory_override() -> int | None:
  """RAGTUNE_DEVICE_MEMORY's bytes, None when it is unset; anything but a positive whole
  number is an error naming the variable."""
  text = os.environ.get(MEMORY_ENV, "")
  if not text:
    return None
  try:
    n = int(text)
  except ValueError:
    n = 0
  if n < 1:
    raise RagtuneError(f"{MEMORY_ENV}={text!r}: expected a positive whole number of bytes, e.g. 8000000000")
  return n


def device_memory_bytes() -> int | None:
  """The default device's memory limit (RAGTUNE_DEVICE_MEMORY bytes when set); a CPU host's
  physical memory."""
  import jax

  if (n := memory_override()) is not None:
    return n
  d = jax.devices()[0]
  try:
    stats = d.memory_stats() or {}
  except Exception:  # noqa: BLE001 - not every backend reports stats
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  if d.platform == "cpu":
    try:
      return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
      return None
  return None


def _label(p: Any, where: str = "") -> str:
  """'shapes/x.yaml: shapes[2]: fwd <backend> [m,k]x[g,k,n] bfloat16': the file, the entry
  (a Problem's source) and the problem."""
  src, backend = getattr(p, "source", ""), getattr(p, "backend", "")
  prefix = "".join(f"{part}: " for part in (where, src) if part)
  return f"{prefix}{p.op} {backend + ' ' if backend else ''}{shape_text(p.m, p.k, p.n, p.g)} {p.dtype}"


def too_big(p: Any, memory: int | None, where: str = "") -> str | None:
  """Why problem (or LUT entry) p cannot run here: its backend's indexing, or `memory` bytes
  (None or 0: not checked). None if it fits. `where` names the file p comes from."""
  need = bytes_needed(p.op, p.dtype, p.m, p.k, p.n, p.g)
  for name, count in operand_elements(p.op, p.m, p.k, p.n, p.g).items():
    backend = getattr(p, "backend", None)
    if count > INT32_MAX and not (backend in registry.REGISTRY and registry.get(backend).wide_indexing):
      return (
        f"{_label(p, where)}: {name} has {count:,} elements, beyond {p.backend}'s int32 indexing "
        f"({INT32_MAX:,}); the problem needs {need:,} bytes"
      )
  if memory and need > memory:
    return (
      f"{_label(p, where)}: needs {need:,} bytes ({need / 2**30:.1f} GiB) for its inputs, "
      f"reference and output, more than the device's {memory:,} bytes"
    )
  return None


def check_fits(items: list, memory: int | None = None, where: str = "") -> None:
  """Raise for the first problem (or LUT entry) that its backend's indexing or `memory`
  bytes cannot hold (None: indexing only). The memory is the probed device's
  (ragtune.run.devices.probe_devices): asking this process's jax would open the accelerator here.
  `where` names the shapes file (or LUT) the items come from."""
  for p in items:
    reason = too_big(p, memory, where)
    if reason:
      raise RagtuneError(reason)


def split_by_memory(items: list, memory: int | None, where: str = "") -> tuple[list, list[str]]:
  """(the items that fit `memory`, the reasons of those that do not)."""
  fit, reasons = [], []
  for p in items:
    reason = too_big(p, memory, where)
    if reason:
      reasons.append(reason)
    else:
      fit.append(p)
  return fit, reasons
