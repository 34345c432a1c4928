"""jax.lax.ragged_dot's function and its vjp in float32, computed group by group at the cost of
the problem itself: the rule every kernel is checked by (ragtune's check, kernels.quant.reference).

XLA lowers lax.ragged_dot on a CPU or GPU to one dense dot over an operand masked once per
group ([g, m, k]): g times the memory and the FLOPs of the problem. Here each group's rows go
through in tiles of `rows` rows, one dot of a tile with its own group's weights per step of a
loop, accumulated in float32 at HIGHEST precision from the operands as given (bf16 and f16
products are exact in f32). The FLOPs are at most 2 * (sum(group_sizes) + g * rows) * k * n;
the memory, the operands, the float32 output (left on the device) and a tile's temporaries.

The group sizes are concrete arrays: the tiles are planned here, on the host, into a table of
one length per problem shape, so every routing of a shape runs one compiled program.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

ROWS_MAX = 256  # a tile's rows at most; fewer where groups are small (tile_rows)
HIGHEST = jax.lax.Precision.HIGHEST


def tile_rows(m: int, g: int) -> int:
  """Rows a tile: a power of two in [8, ROWS_MAX], at most m / (2 g), so the last, partial
  tile of each group adds at most m / 2 rows of work; never more than m."""
  t = 8
  while t * 2 <= min(ROWS_MAX, m // (2 * g)):
    t *= 2
  return max(1, min(t, m))


@dataclasses.dataclass(frozen=True)
class Plan:
  """The tiles of one problem: each tile lies inside [0, m) and is masked to its group's rows,
  so every routed row is computed once, and rows of no group (and empty groups) stay 0."""

  rows: int  # tile rows
  table: np.ndarray  # [length, 4] int32: tile start, first row, end row, group
  count: int  # tiles in use; the rest of the table is never read

  @property
  def length(self) -> int:
    return self.table.shape[0]


def plan(group_sizes, m: int) -> Plan:
  """The tiles of each group's rows [start, end) (clipped to m: rows past sum(group_sizes)
  belong to none), in a table of length m // rows + min(g, m) + 1 whatever the routing: each
  group adds at most one partial tile."""
  sizes = np.asarray(group_sizes, np.int64)
  g = len(sizes)
  t = tile_rows(m, g)
  ends = np.minimum(np.cumsum(sizes), m)
  starts = np.concatenate([[0], ends[:-1]])
  tiles = [
    (min(a, m - t), a, min(a + t, int(ends[i])), i) for i in range(g) for a in range(int(starts[i]), int(ends[i]), t)
  ]
  table = np.zeros((m // t + min(g, m) + 1, 4), np.int32)
  if tiles:
    table[: len(tiles)] = tiles
  return Plan(t, table, len(tiles))


def mask(ts, lo, hi, rows: int):
  """[rows, 1]: which rows of the tile at `ts` are in [lo, hi)."""
  r = ts + jax.lax.iota(jnp.int32, rows)
  return ((r >= lo) & (r < hi))[:, None]


def loop(count, init, operands: tuple, step):
  """fori_loop of step(j, out, *operands) -> out over the tiles in use. The operands ride in
  the loop's state behind an optimization barrier: XLA:CPU widens a loop-invariant 16-bit
  operand to float32 whole before the loop (a copy twice its size), not just each tile."""

  def body(j, carry):
    out, ops = carry
    ops = jax.lax.optimization_barrier(ops)
    return step(j, out, *ops), ops

  return jax.lax.fori_loop(0, count, body, (init, operands))[0]


def dot(x, w, contract: tuple[int, int]):
  """x . w over the dims `contract`, accumulated in float32 at HIGHEST precision."""
  dims = ((contract[:1], contract[1:]), ((), ()))
  return jax.lax.dot_general(x, w, dims, precision=HIGHEST, preferred_element_type=jnp.float32)


def tile(table, j):
  """Tile j's (start, first row, end row, group)."""
  return table[j, 0], table[j, 1], table[j, 2], table[j, 3]


def _gmm(lhs, rhs, table, count, *, rows: int, contract: int):
  """fwd (contract=0: lhs [m,k] x rhs[i] [k,n]) or dlhs (contract=1: dout [m,n] x rhs[i]^T)."""

  def step(j, out, lhs, rhs):
    ts, lo, hi, grp = tile(table, j)
    x = jax.lax.dynamic_slice_in_dim(lhs, ts, rows, 0)
    w = jax.lax.dynamic_index_in_dim(rhs, grp, 0, keepdims=False)
    y = dot(x, w, (1, contract))
    cur = jax.lax.dynamic_slice_in_dim(out, ts, rows, 0)
    return jax.lax.dynamic_update_slice_in_dim(out, jnp.where(mask(ts, lo, hi, rows), y, cur), ts, 0)

  return loop(count, jnp.zeros((lhs.shape[0], rhs.shape[2 - contract]), jnp.float32), (lhs, rhs), step)


def _tgmm(lhs, dout, table, count, *, rows: int, groups: int):
  """drhs: lhs[rows of i]^T x dout[rows of i] into group i of a [groups, k, n] output."""

  def step(j, out, lhs, dout):
    ts, lo, hi, grp = tile(table, j)
    keep = mask(ts, lo, hi, rows)
    x = jnp.where(keep, jax.lax.dynamic_slice_in_dim(lhs, ts, rows, 0), 0)
    d = jnp.where(keep, jax.lax.dynamic_slice_in_dim(dout, ts, rows, 0), 0)
    y = dot(x, d, (0, 0))
    cur = jax.lax.dynamic_index_in_dim(out, grp, 0, keepdims=True)
    return jax.lax.dynamic_update_index_in_dim(out, cur + y[None], grp, 0)

  return loop(count, jnp.zeros((groups, lhs.shape[1], dout.shape[1]), jnp.float32), (lhs, dout), step)


BODIES = {"fwd": functools.partial(_gmm, contract=0), "dlhs": functools.partial(_gmm, contract=1), "drhs": _tgmm}


@functools.lru_cache(maxsize=32)
def _compiled(body: Callable, operands: tuple, statics: tuple, length: int):
  """The loop for these operand shapes and dtypes, compiled once and kept (one per shape)."""
  fn = functools.partial(body, **dict(statics))
  table = jax.ShapeDtypeStruct((length, 4), jnp.int32)
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  return jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, d) for s, d in operands), table, scalar).compile()


def compile_loop(body: Callable, operands: list[tuple[tuple[int, ...], object]], p: Plan, **statics):
  """The compiled `body(*operands, table, count, rows=..., **statics)` of plan `p`, for
  operands given as (shape, dtype) pairs; its arguments are the operands, p.table, p.count."""
  key = tuple((tuple(s), jnp.dtype(d)) for s, d in operands)
  return _compiled(body, key, tuple(sorted(dict(statics, rows=p.rows).items())), p.length)


@dataclasses.dataclass(frozen=True)
class Program:
  """A reference's compiled loop and its arguments, to run (call it) or to size first (the
  compiled program's memory_analysis()); compiled is None where nothing is to compute (m = 0)."""

  compiled: object
  args: tuple
  empty: tuple = ()  # the outputs' (shape) where compiled is None

  def __call__(self):
    if self.compiled is None:
      outs = tuple(jnp.zeros(s, jnp.float32) for s in self.empty)
      return outs if len(outs) > 1 else outs[0]
    return self.compiled(*self.args)


def _device(a):
  return a if isinstance(a, (jax.Array, jax.ShapeDtypeStruct)) else jnp.asarray(a)


def program(body: Callable, operands: tuple, group_sizes, m: int, outs: tuple, **statics) -> Program:
  """The loop `body` over the tiles of group_sizes (rows of m), for `operands` (arrays, or
  jax.ShapeDtypeStructs for a program to size, not run); `outs`: the shapes of its float32
  outputs, returned as zeros without a program where m = 0."""
  if not m:
    return Program(None, (), outs)
  p = plan(group_sizes, m)
  operands = tuple(_device(a) for a in operands)
  compiled = compile_loop(body, [(a.shape, a.dtype) for a in operands], p, **statics)
  return Program(compiled, (*operands, p.table, np.int32(p.count)))


def ragged_dot_program(op: str, lhs, rhs, dout, group_sizes) -> Program:
  """The program of ragged_dot (below), compiled, not run."""
  m, k = lhs.shape
  g, _, n = rhs.shape
  gs = np.asarray(group_sizes)
  if op == "drhs":
    return program(_tgmm, (lhs, dout), gs, m, ((g, k, n),), groups=g)
  return program(BODIES[op], (lhs if op == "fwd" else dout, rhs), gs, m, ((m, n if op == "fwd" else k),))


def ragged_dot(op: str, lhs, rhs, dout, group_sizes) -> jax.Array:
  """float32 jax.lax.ragged_dot(lhs, rhs, group_sizes) at HIGHEST precision (op "fwd"), or the
  cotangent of lhs (dlhs) or rhs (drhs) of its vjp with `dout`, on the device. group_sizes
  must be concrete (the tiles are planned on the host)."""
  return ragged_dot_program(op, lhs, rhs, dout, group_sizes)()
