"""Problems too big to run, refused before any work: int32 indexing and device memory."""

from __future__ import annotations

import os
from typing import Any

from kernels.config import itemsize
from ragtune.errors import RagtuneError

INT32_MAX = 2**31 - 1


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


def device_memory_bytes() -> int | None:
  """The default device's memory limit; a CPU host's physical memory."""
  import jax

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


def _label(p: Any) -> str:
  src = getattr(p, "source", "")
  return f"{src + ': ' if src else ''}{p.op} [{p.m},{p.k}]x[{p.g},{p.k},{p.n}] {p.dtype}"


def check_fits(items: list, memory: int | None = None) -> None:
  """Raise for the first problem (or LUT entry) that int32 indexing or memory cannot hold."""
  memory = device_memory_bytes() if memory is None else memory
  for p in items:
    need = bytes_needed(p.op, p.dtype, p.m, p.k, p.n, p.g)
    for name, count in operand_elements(p.op, p.m, p.k, p.n, p.g).items():
      if count > INT32_MAX:
        raise RagtuneError(f"{_label(p)}: {name} has {count:,} elements, beyond int32 indexing "
                           f"({INT32_MAX:,}); the problem needs {need:,} bytes")
    if memory and need > memory:
      raise RagtuneError(f"{_label(p)}: needs {need:,} bytes ({need / 2**30:.1f} GiB) for its inputs, "
                         f"reference and output, more than the device's {memory:,} bytes")
