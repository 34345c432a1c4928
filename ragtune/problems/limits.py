"""Problems too big to run, refused before any work: a backend's int32 indexing and device memory."""

from __future__ import annotations

import math
import os
from typing import Any

from kernels import quant, registry
from kernels import reference as kref
from kernels.common import itemsize, scheme
from kernels.lut import shape_text
from ragtune.errors import RagtuneError
from ragtune.problems.shapes import trained

INT32_MAX = 2**31 - 1

# A backend without wide_indexing (kernels/<backend>/__init__.py says why each has it or not)
# is held to int32 element counts. DeepSeek-V3's and Llama-4-Maverick's full expert weights
# are operands past them.


def operand_elements(op: str, m: int, k: int, n: int, g: int) -> dict[str, int]:
  """Elements of each array one check of `op` holds (the forward problem's m, k, n, g)."""
  out = {"fwd": ("out [m,n]", m * n), "dlhs": ("dlhs [m,k]", m * k), "drhs": ("drhs [g,k,n]", g * k * n)}[op]
  return {"lhs [m,k]": m * k, "rhs [g,k,n]": g * k * n, "dout [m,n]": m * n, out[0]: out[1]}


# Elements of the float32 slice that a step of the inputs' draw (ragtune.device.measure) and of
# the check (ragtune.device.numerics) holds: whole rows of the array's last axes, at least one.
STEP_ELEMENTS = 1 << 24
# Their temporaries, in such slices (XLA's memory analysis on a CPU, tests/ragtune/test_reference.py):
# the draw's random bits, normals and (quantized) scaled copy; the check's widened operands.
DRAW_SLICES, CHECK_SLICES = 6, 2


def step_rows(rows: int, row: int, chunk: int = STEP_ELEMENTS) -> int:
  """Rows of `row` elements in one step's slice of an array of `rows` such rows: whole rows
  within `chunk` elements, at least one. The draw and the check slice by it."""
  return min(rows, max(1, chunk // max(1, row)))


def step_elements(elements: int, row: int) -> int:
  """Elements of one step's slice of an array of `elements` in rows of `row`."""
  row = max(1, row)
  return step_rows(elements // row, row) * row


def held(op: str, dtype: str, m: int, k: int, n: int, g: int) -> dict[str, int]:
  """Bytes one problem's check holds on the device at each stage. "draw": the inputs as drawn
  (lhs, rhs and dout in the problem's dtype; a quantized format's 8-bit lhs and rhs and
  float32 scales; a training format's dlhs and drhs, bf16 ones) and a draw's slice;
  "reference": the inputs, the float32 reference (and a quantized format's float32 bound,
  and a training format's quantized operands) and its loop's tile and group weights in
  float32 (kernels.reference); "check": the inputs, the reference, the kernel's output and the
  check's slices. The kernel's own temporaries are its compiled program's (xla_fit)."""
  fmt = scheme(dtype)
  out = list(operand_elements(op, m, k, n, g).values())[-1]
  out_cols = {"fwd": n, "dlhs": k, "drhs": n}[op]
  if trained(op, dtype):
    # bf16 operands, and the reference's quantized copies: dlhs dout and the weights in 8 bits
    # (quantized from a float32 copy: not measured, taken whole); drhs lhs and dout on the
    # padded token axis in float32, and their squares
    tokens = quant.BLOCK * quant.num_token_blocks(m, g)
    copies = m * n + 5 * g * k * n + 4 * m * n // quant.BLOCK if op == "dlhs" else 2 * 4 * tokens * (k + n)
    inputs, reference, output = 2 * (m * k + g * k * n + m * n), copies + 2 * 4 * out, 2 * out
    loop = 4 * (4 * k * n + 3 * kref.ROWS_MAX * (k + n))
  elif fmt:
    scales = sum(math.prod(s) for s in quant.scale_shapes(fmt, m, k, n, g))
    inputs, reference, output = m * k + g * k * n + 4 * scales, 2 * 4 * out, 2 * out  # a bf16 output
    loop = 4 * (4 * k * n + 3 * kref.ROWS_MAX * (k + n))  # a tile and a group dequantized, and squared
  else:
    b = itemsize(dtype)
    inputs, reference, output = b * (m * k + g * k * n + m * n), 4 * out, b * out
    loop = 4 * (2 * k * n + 2 * kref.ROWS_MAX * (k + n))
  draw = max(step_elements(m * k, k), step_elements(g * k * n, k * n), step_elements(m * n, n))
  check = step_elements(out, out_cols)
  return {
    "draw": inputs + 4 * DRAW_SLICES * draw,
    "reference": inputs + reference + loop,
    "check": inputs + reference + output + 4 * CHECK_SLICES * check + (1 << 20),
  }


def bytes_needed(op: str, dtype: str, m: int, k: int, n: int, g: int) -> int:
  """Bytes one problem's check holds on the device at its peak (held's largest stage)."""
  return max(held(op, dtype, m, k, n, g).values())


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
