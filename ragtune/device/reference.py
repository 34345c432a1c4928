"""jax.lax.ragged_dot's function and its vjp, computed at the cost of the problem itself.

XLA lowers lax.ragged_dot on a CPU or GPU to one dense dot over an operand masked once per
group ([g, m, k]): g times the memory and the FLOPs of the problem (XLA_PATHS["dense"] in
ragtune.device.xla_fit). Here each group's rows go through in tiles of `rows` rows, one dot
of a tile with its own group's weights per step of a loop, accumulated in float32 at HIGHEST
precision from the operands as given (bf16 and f16 products are exact in f32). The FLOPs are
at most 2 * (sum(group_sizes) + g * rows) * k * n; the memory, the operands and one chunk of
the float32 output (CHUNK_BYTES), which goes to the host before the next chunk is computed.

The group sizes are concrete arrays: the tiles are planned here, on the host, into tables of
one length per problem shape, so every routing of a shape runs one compiled program.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels import quant

ROWS_MAX = 256  # a tile's rows at most; fewer where groups are small (tile_rows)
CHUNK_BYTES = 1 << 30  # the float32 output one call holds on the device
HIGHEST = jax.lax.Precision.HIGHEST


class DoesNotFit(RuntimeError):
  """The reference's compiled program needs more memory than the device has."""


def tile_rows(m: int, g: int) -> int:
  """Rows a tile: a power of two in [8, ROWS_MAX], at most m / (2 g), so the last, partial
  tile of each group adds at most m / 2 rows of work; never more than m."""
  t = 8
  while t * 2 <= min(ROWS_MAX, m // (2 * g)):
    t *= 2
  return max(1, min(t, m))


@dataclasses.dataclass(frozen=True)
class Call:
  """One call of the compiled loop: its buffer starts at output row (fwd, dlhs) or group
  (drhs) `origin`; `keep` = [lo, hi) of the buffer is this call's share of the output."""

  origin: int
  keep: tuple[int, int]
  table: np.ndarray  # [length, 4] int32: tile start, first row, end row (tile coordinates), group
  count: int  # tiles in use; the rest of the table is never read


@dataclasses.dataclass(frozen=True)
class Plan:
  rows: int  # tile rows
  span: int  # buffer rows (fwd, dlhs) or groups (drhs) of one call
  length: int  # table rows of every call
  calls: tuple[Call, ...]


def _bounds(group_sizes, m: int) -> tuple[np.ndarray, np.ndarray]:
  """Each group's rows [start, end), clipped to m (rows past sum(group_sizes) belong to none)."""
  ends = np.minimum(np.cumsum(np.asarray(group_sizes, np.int64)), m)
  return np.concatenate([[0], ends[:-1]]), ends


def _table(tiles: list[tuple[int, int, int, int]], length: int) -> np.ndarray:
  table = np.zeros((length, 4), np.int32)
  if tiles:
    table[: len(tiles)] = tiles
  return table


def plan_rows(group_sizes, m: int, width: int, chunk_bytes: int = CHUNK_BYTES) -> Plan:
  """fwd and dlhs: the output [m, width] in calls of `span` rows. A call's buffer starts at
  min(its first row, m - span), so every buffer has the same shape; its tiles cover the rows
  of each group within the call's own rows, each tile placed inside the buffer and masked
  to its rows, so every output row is written once, and rows of no group stay 0."""
  g = len(group_sizes)
  t = tile_rows(m, g)
  span = min(m, max(t, chunk_bytes // (4 * width) // t * t))
  length = span // t + min(g, span) + 1
  starts, ends = _bounds(group_sizes, m)
  calls = []
  for lo in range(0, m, span):
    hi = min(lo + span, m)
    origin = min(lo, m - span)
    tiles = []
    for i in range(g):
      for a in range(max(int(starts[i]), lo), min(int(ends[i]), hi), t):
        b = min(a + t, int(ends[i]), hi)
        tiles.append((min(a - origin, span - t), a - origin, b - origin, i))
    calls.append(Call(origin, (lo - origin, hi - origin), _table(tiles, length), len(tiles)))
  return Plan(t, span, length, tuple(calls))


def plan_groups(group_sizes, m: int, k: int, n: int, chunk_bytes: int = CHUNK_BYTES) -> Plan:
  """drhs: the output [g, k, n] in calls of `span` groups; a call's tiles are the rows of its
  groups, each tile inside [0, m) and masked to its group's rows. An empty group stays 0."""
  g = len(group_sizes)
  t = tile_rows(m, g)
  span = min(g, max(1, chunk_bytes // (4 * k * n)))
  length = m // t + span + 1
  starts, ends = _bounds(group_sizes, m)
  calls = []
  for first in range(0, g, span):
    tiles = []
    for i in range(first, min(first + span, g)):
      for a in range(int(starts[i]), int(ends[i]), t):
        tiles.append((min(a, m - t), a, min(a + t, int(ends[i])), i - first))
    calls.append(Call(first, (0, min(span, g - first)), _table(tiles, length), len(tiles)))
  return Plan(t, span, length, tuple(calls))


def _mask(ts, lo, hi, rows: int):
  r = ts + jax.lax.iota(jnp.int32, rows)
  return ((r >= lo) & (r < hi))[:, None]


def _loop(count, init, operands: tuple, step):
  """fori_loop of step(j, out, *operands) -> out over the tiles in use. The operands ride in
  the loop's state behind an optimization barrier: XLA:CPU widens a loop-invariant 16-bit
  operand to float32 whole before the loop (a copy twice its size), not just each tile."""

  def body(j, carry):
    out, ops = carry
    ops = jax.lax.optimization_barrier(ops)
    return step(j, out, *ops), ops

  return jax.lax.fori_loop(0, count, body, (init, operands))[0]


def _dot(x, w, contract: tuple[int, int]):
  """x . w over the dims `contract`, accumulated in float32 at HIGHEST precision."""
  dims = ((contract[:1], contract[1:]), ((), ()))
  return jax.lax.dot_general(x, w, dims, precision=HIGHEST, preferred_element_type=jnp.float32)


def _row(table, j):
  return table[j, 0], table[j, 1], table[j, 2], table[j, 3]


def _gmm(lhs, rhs, table, count, origin, *, rows: int, span: int, contract: int):
  """fwd (contract=0: lhs [m,k] x rhs[i] [k,n]) or dlhs (contract=1: dout [m,n] x rhs[i]^T)."""

  def step(j, out, lhs, rhs):
    ts, lo, hi, grp = _row(table, j)
    x = jax.lax.dynamic_slice_in_dim(lhs, origin + ts, rows, 0)
    w = jax.lax.dynamic_index_in_dim(rhs, grp, 0, keepdims=False)
    y = _dot(x, w, (1, contract))
    cur = jax.lax.dynamic_slice_in_dim(out, ts, rows, 0)
    return jax.lax.dynamic_update_slice_in_dim(out, jnp.where(_mask(ts, lo, hi, rows), y, cur), ts, 0)

  return _loop(count, jnp.zeros((span, rhs.shape[2 - contract]), jnp.float32), (lhs, rhs), step)


def _tgmm(lhs, dout, table, count, origin, *, rows: int, span: int):
  """drhs: lhs[rows of i]^T x dout[rows of i] into group i - origin of a [span, k, n] buffer."""
  del origin  # the table's groups are the buffer's

  def step(j, out, lhs, dout):
    ts, lo, hi, grp = _row(table, j)
    keep = _mask(ts, lo, hi, rows)
    x = jnp.where(keep, jax.lax.dynamic_slice_in_dim(lhs, ts, rows, 0), 0)
    d = jnp.where(keep, jax.lax.dynamic_slice_in_dim(dout, ts, rows, 0), 0)
    y = _dot(x, d, (0, 0))
    cur = jax.lax.dynamic_index_in_dim(out, grp, 0, keepdims=True)
    return jax.lax.dynamic_update_index_in_dim(out, cur + y[None], grp, 0)

  return _loop(count, jnp.zeros((span, lhs.shape[1], dout.shape[1]), jnp.float32), (lhs, dout), step)


def _quantized(lhs, rhs, lhs_scale, rhs_scale, table, count, origin, *, rows: int, span: int, transpose_rhs: bool):
  """The forward of quantized operands, each tile and its group's weights dequantized
  (kernels.quant.dequantize): the products' sum and the sum of their squares (the size of
  the terms, kernels.quant.error_scale's before its square root)."""
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  contract = (1, 1 if transpose_rhs else 0)

  def step(j, outs, lhs, rhs, lhs_scale, rhs_scale):
    ts, lo, hi, grp = _row(table, j)
    x = jax.lax.dynamic_slice_in_dim(lhs, origin + ts, rows, 0)
    xs = jax.lax.dynamic_slice_in_dim(lhs_scale, origin + ts, rows, 0)
    w = jax.lax.dynamic_index_in_dim(rhs, grp, 0, keepdims=True)
    ws = jax.lax.dynamic_index_in_dim(rhs_scale, grp, 0, keepdims=True)
    a, b = quant.dequantize(x, w, xs, ws, transpose_rhs=transpose_rhs)
    keep = _mask(ts, lo, hi, rows)
    new = []
    for acc, (p, q) in zip(outs, ((a, b[0]), (a * a, b[0] * b[0]))):
      y = _dot(p, q, contract)
      cur = jax.lax.dynamic_slice_in_dim(acc, ts, rows, 0)
      new.append(jax.lax.dynamic_update_slice_in_dim(acc, jnp.where(keep, y, cur), ts, 0))
    return tuple(new)

  zeros = jnp.zeros((span, n), jnp.float32)
  return _loop(count, (zeros, zeros), (lhs, rhs, lhs_scale, rhs_scale), step)


_BODIES = {
  "fwd": functools.partial(_gmm, contract=0),
  "dlhs": functools.partial(_gmm, contract=1),
  "drhs": _tgmm,
  "quantized": _quantized,
}


@functools.lru_cache(maxsize=32)
def _compiled(kind: str, operands: tuple, statics: tuple, length: int):
  """The loop for these operand shapes and dtypes, compiled once and kept (one per shape)."""
  fn = functools.partial(_BODIES[kind], **dict(statics))
  table = jax.ShapeDtypeStruct((length, 4), jnp.int32)
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  return jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, d) for s, d in operands), table, scalar, scalar).compile()


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


def compile_call(kind: str, operands: list[tuple[tuple[int, ...], object]], plan: Plan, **statics):
  """The compiled loop of one call of `plan`, for operands given as (shape, dtype) pairs."""
  key = tuple((tuple(s), jnp.dtype(d)) for s, d in operands)
  return _compiled(kind, key, tuple(sorted(dict(statics, rows=plan.rows, span=plan.span).items())), plan.length)


def _run(kind: str, operands: tuple, plan: Plan, outs: list[np.ndarray], memory: int | None, **statics) -> None:
  """Each call of `plan`: the compiled loop run, and the share of its output it keeps copied
  into `outs` (host arrays, one an output of the loop). Refused (DoesNotFit) where the
  compiled program needs more than `memory` bytes."""
  compiled = compile_call(kind, [(a.shape, a.dtype) for a in operands], plan, **statics)
  need = program_bytes(compiled)
  if memory and need and need > memory:
    raise DoesNotFit(
      f"the lax reference ({kind}) needs {need:,} bytes ({need / 2**30:.2f} GiB) on the device, more than its "
      f"{memory:,} bytes"
    )
  for call in plan.calls:
    got = compiled(*operands, call.table, np.int32(call.count), np.int32(call.origin))
    lo, hi = call.keep
    for host, buffer in zip(outs, got if isinstance(got, tuple) else (got,)):
      host[call.origin + lo : call.origin + hi] = np.asarray(buffer)[lo:hi]


def _device(a) -> jax.Array:
  return a if isinstance(a, jax.Array) else jnp.asarray(a)


def ragged_dot(
  op: str, lhs, rhs, dout, group_sizes, *, memory: int | None = None, chunk_bytes: int = CHUNK_BYTES
) -> np.ndarray:
  """float32 jax.lax.ragged_dot(lhs, rhs, group_sizes) at HIGHEST precision (op "fwd"), or
  the cotangent of lhs (dlhs) or rhs (drhs) of its vjp with `dout`, on the host. `memory`:
  the device's bytes, which the compiled program must not need more of (DoesNotFit)."""
  gs = np.asarray(group_sizes)
  m, k = lhs.shape
  g, _, n = rhs.shape
  if op == "drhs":
    out = np.zeros((g, k, n), np.float32)
    if m:
      _run("drhs", (_device(lhs), _device(dout)), plan_groups(gs, m, k, n, chunk_bytes), [out], memory)
    return out
  width = n if op == "fwd" else k
  out = np.zeros((m, width), np.float32)
  if not m:
    return out
  a = _device(lhs if op == "fwd" else dout)
  _run(op, (a, _device(rhs)), plan_rows(gs, m, width, chunk_bytes), [out], memory)
  return out


def quantized(
  lhs,
  rhs,
  group_sizes,
  lhs_scale,
  rhs_scale,
  *,
  transpose_rhs: bool,
  memory: int | None = None,
  chunk_bytes: int = CHUNK_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
  """kernels.quant.reference and kernels.quant.error_scale of quantized operands, on the host."""
  m = lhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  value, squares = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
  if not m:
    return value, squares
  plan = plan_rows(np.asarray(group_sizes), m, 2 * n, chunk_bytes)  # two float32 outputs
  operands = tuple(_device(a) for a in (lhs, rhs, lhs_scale, rhs_scale))
  _run("quantized", operands, plan, [value, squares], memory, transpose_rhs=transpose_rhs)
  return value, np.sqrt(squares, out=squares)
