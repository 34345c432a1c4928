"""jax.lax.ragged_dot's function and its vjp, computed at the cost of the problem itself, on the
device, refused where its compiled program needs more memory than the device has.

The loop is kernels.reference's (each group's rows in tiles, one dot of a tile with its own
group's weights per step, float32 at HIGHEST precision): lax's own lowering on a CPU or GPU
takes g times the memory and the FLOPs of the problem (XLA_PATHS["dense"] in
ragtune.device.xla_fit). Its float32 output stays on the device, where the check
(ragtune.device.numerics) reads it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import quant
from kernels import reference as kref


class DoesNotFit(RuntimeError):
  """The reference's compiled program needs more memory than the device has."""


def program_bytes(compiled) -> int | None:
  """Bytes a compiled program holds while it runs: arguments, outputs and temporaries (less
  the outputs that reuse an argument's buffer), from XLA's memory analysis; None where the
  client reports none."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every client reports it
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def _run(what: str, prog: kref.Program, memory: int | None):
  """Run `prog`; refused (DoesNotFit) where it needs more than `memory` bytes."""
  need = program_bytes(prog.compiled) if prog.compiled is not None else None
  if memory and need and need > memory:
    raise DoesNotFit(
      f"the lax reference ({what}) needs {need:,} bytes ({need / 2**30:.2f} GiB) on the device, more than its "
      f"{memory:,} bytes"
    )
  return prog()


def ragged_dot(op: str, lhs, rhs, dout, group_sizes, *, memory: int | None = None) -> jax.Array:
  """float32 jax.lax.ragged_dot(lhs, rhs, group_sizes) at HIGHEST precision (op "fwd"), or
  the cotangent of lhs (dlhs) or rhs (drhs) of its vjp with `dout`, on the device
  (kernels.reference.ragged_dot). `memory`: the device's bytes, which the compiled program
  must not need more of (DoesNotFit)."""
  return _run(op, kref.ragged_dot_program(op, lhs, rhs, dout, group_sizes), memory)


def quantized(
  lhs, rhs, group_sizes, lhs_scale, rhs_scale, *, transpose_rhs: bool, memory: int | None = None
) -> tuple[jax.Array, jax.Array]:
  """kernels.quant.reference and the sum of squares under kernels.quant.error_scale's root, of
  quantized operands, on the device, in one loop."""
  prog = quant.reference_program(lhs, rhs, group_sizes, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs)
  return _run("quantized", prog, memory)


def token_contraction(a, b, sizes, out_shape: tuple[int, int, int], *, memory: int | None = None):
  """(sum, sum of squares) of a[rows of i]^T b[rows of i] into group i of out_shape [g, k, n],
  float32 at HIGHEST, group i the next sizes[i] rows of a [T, k] and b [T, n]: fp8 training's
  drhs of its dequantized token blocks (ragtune.device.measure), the squares error_scale's
  before its root. Two runs of kernels.reference's drhs loop."""
  shape = jax.ShapeDtypeStruct(out_shape, jnp.float32)  # the loop reads only its shape
  value = _run("drhs", kref.ragged_dot_program("drhs", a, shape, b, sizes), memory)
  squares = _run("drhs", kref.ragged_dot_program("drhs", a * a, shape, b * b, sizes), memory)
  return value, squares
