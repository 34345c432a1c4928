"""XLA's own ragged_dot on this device: which way XLA compiles it, and whether that fits.

XLA's RaggedDotRewriter (openxla/xla, xla/hlo/transforms/expanders/ragged_dot_rewriter.cc)
either keeps the ragged-dot for a cuDNN grouped GEMM (a fusion of kind "__cudnn$fusion"; with
--xla_gpu_experimental_use_ragged_dot_fusion and cuDNN >= 9.22, openxla/xla#40189, upstream's
NVIDIA default since openxla/xla#42313; jaxlib 0.10.2 and 0.12.0.1 leave it off) or for
hipBLASLt's grouped GEMM on ROCm (a "__cublas$lt$groupedMatmul" custom call, openxla/xla#43210),
or expands it to one dense dot over the ragged operand masked once per group: lhs (or dout)
broadcast to [g, m, k] (or [g, m, n]), g times the FLOPs and that much memory. jax expands it
the same way on a CPU. DeepSeek-V3's prefill forward asks 481 GB of that, and an H100 ran out
of memory on it (448 and 128 GiB allocations). So the XLA rows (sweep's baseline:xla, bench's
XLA) first compile a small problem of the same op and dtype to see the path, and where it is
the dense fallback and its bytes (dense_bytes) are more than the device's, say so instead of
compiling and running it.
"""

from __future__ import annotations

import functools
import re

import jax

from kernels import quant, registry
from kernels.common import itemsize, scheme
from ragtune.device import measure
from ragtune.device.reference import program_bytes
from ragtune.problems.shapes import Problem, trained

# How XLA compiled jax.lax.ragged_dot, told from the compiled HLO text (xla_path).
XLA_PATHS = {
  "cudnn": "cuDNN grouped GEMM",
  "grouped_gemm": "hipBLASLt grouped GEMM",
  "ragged_dot": "ragged-dot kept",
  "dense": "dense fallback: one dot over every group, masked",
  "unknown": "unknown: the compiled HLO has neither a ragged-dot nor a dot",
  "unread": "unknown: no HLO text from this client",
}
_HLO_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")
_HLO_CALLS = re.compile(r"calls=%([\w.\-]+)")
_HLO_KIND = re.compile(r'"kind":"([^"]+)"')
PROBE = (256, 256, 256, 4)  # m, k, n, g of the problem whose compile tells the path (128-blocks of scales)


def _hlo_computations(hlo: str) -> dict[str, list[str]]:
  """The instruction lines of each computation of an HLO module's text, by name."""
  comps: dict[str, list[str]] = {}
  body: list[str] | None = None
  for line in hlo.splitlines():
    head = _HLO_COMPUTATION.match(line)
    if head:
      body = comps.setdefault(head.group(1), [])
    elif line.startswith("}"):
      body = None
    elif body is not None:
      body.append(line)
  return comps


def xla_path(hlo: str) -> str:
  """Which way XLA compiled jax.lax.ragged_dot (a key of XLA_PATHS), from the compiled module's
  text (`jax.jit(f).lower(...).compile().as_text()`)."""
  comps = _hlo_computations(hlo)
  lines = [l for body in comps.values() for l in body] or hlo.splitlines()
  if any("__cublas$lt$groupedMatmul" in l for l in lines):
    return "grouped_gemm"
  ragged = {name for name, body in comps.items() if any(" ragged-dot(" in l for l in body)}
  if ragged:
    kinds = {k for l in lines if (c := _HLO_CALLS.search(l)) and c.group(1) in ragged for k in _HLO_KIND.findall(l)}
    return "cudnn" if "__cudnn$fusion" in kinds else "ragged_dot"
  if any(" dot(" in l or "__cublas$gemm" in l or "__cublas$lt$matmul" in l for l in lines):
    return "dense"
  return "unknown"


def path_of(compiled) -> str:
  try:
    return xla_path(compiled.as_text())
  except Exception:  # noqa: BLE001 - a client without HLO text: say so, go on
    return "unread"


@functools.cache
def _probe(op: str, dtype: str, device_kind: str) -> str:
  del device_kind  # the cache key: one probe a device kind
  m, k, n, g = PROBE
  small = Problem(op, registry.REFERENCE, dtype, m, k, n, g, "probe", (m // g,) * g)
  args = measure.op_args(op, jax.eval_shape(lambda: measure.make_inputs(small)))  # shapes only: nothing drawn
  return path_of(jax.jit(measure.build_op(small, registry.REFERENCE, None, False)).lower(*args).compile())


def probe_path(p: Problem) -> str:
  """The path XLA takes for p's op and dtype on this device, from a small problem's compile."""
  return _probe(p.op, p.dtype, jax.devices()[0].device_kind)


def dense_bytes(p: Problem) -> int:
  """Bytes XLA's dense fallback holds for p at least (kernels.xla as measure.build_op runs
  it): the operands, the output, and the operand masked once per group: lhs [g, m, k] for
  fwd, dout [g, m, n] for dlhs, both for drhs. A quantized forward masks lhs as bf16
  (channelwise) or dequantized to f32 with rhs (block128). At DeepSeek-V3 prefill XLA's memory
  analysis of a deviceless H100 build is within 6% of it; XLA:CPU widens bf16 to f32, twice it."""
  m, k, n, g = p.m, p.k, p.n, p.g
  b = itemsize(p.dtype)
  if trained(p.op, p.dtype):  # bf16 operands and output, their 8-bit copies, dequantized to f32 and masked
    if p.op == "dlhs":
      return 2 * (m * n + g * k * n + m * k) + (1 + 4) * (m * n + g * k * n) + 4 * g * m * n
    tokens = quant.BLOCK * quant.num_token_blocks(m, g)
    return 2 * (m * k + m * n + g * k * n) + (1 + 4) * tokens * (k + n) + 4 * (g + 1) * tokens * (k + n)
  if scheme(p.dtype):
    wide = 2 if scheme(p.dtype) == "channelwise" else 4
    dequantized = 0 if wide == 2 else 4 * (m * k + g * k * n)
    return b * (m * k + g * k * n) + 2 * m * n + dequantized + wide * g * m * k
  io = {"fwd": m * k + g * k * n + m * n, "dlhs": m * n + g * k * n + m * k, "drhs": m * k + m * n + g * k * n}[p.op]
  masked = {"fwd": g * m * k, "dlhs": g * m * n, "drhs": g * m * (k + n)}[p.op]
  return b * (io + masked)


def _gib(b: int) -> str:
  return f"{b:,} bytes ({b / 2**30:.1f} GiB)"


def refusal(p: Problem, memory: int | None) -> str | None:
  """Why XLA's ragged_dot is not run for p here: it compiles to the dense fallback and that
  needs more than `memory` bytes. None when it fits, takes another path, or memory is unknown."""
  need = dense_bytes(p)
  if not memory or need <= memory or probe_path(p) != "dense":
    return None
  return (
    f"does not fit: XLA's ragged_dot compiles here to its {XLA_PATHS['dense']} (g = {p.g} times the "
    f"problem's FLOPs) and needs {_gib(need)}, more than the device's {_gib(memory)}"
  )


def compiled_refusal(compiled, memory: int | None) -> str | None:
  """Why a compiled program is not run: XLA's memory analysis says it needs more than
  `memory` bytes. None when it fits or either is unknown."""
  need = program_bytes(compiled)
  if not memory or not need or need <= memory:
    return None
  return f"does not fit: the compiled program needs {_gib(need)}, more than the device's {_gib(memory)}"
