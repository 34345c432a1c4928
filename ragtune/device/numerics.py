"""Numerics comparison with a readable report (max/mean diff, worst index, region grid)."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ragtune.problems import limits

# Bound on |test - ref| relative to max|ref|, per input dtype. bf16/f16 outputs round at
# 2^-8 / 2^-11; f32 on NVIDIA runs as TF32 by default.
TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-2}


@dataclasses.dataclass
class NumericsResult:
  passed: bool
  shape: tuple[int, ...]
  max_diff: float
  mean_diff: float
  median_diff: float
  rel_error: float
  pct_bad: float
  n_nan: int  # elements where test or ref is NaN or inf
  n_ref_nan: int  # of those, where ref is
  worst_index: tuple[int, ...]
  worst_ref: float
  worst_test: float
  atol: float
  rtol: float
  regions: list[list[tuple[float, float]]]

  @property
  def status(self) -> str:
    return "ok" if self.passed else ("nan" if self.n_nan else "wrong")

  def summary(self) -> str:
    return (
      f"{'PASS' if self.passed else 'FAIL'} max_diff={self.max_diff:.3g} rel={self.rel_error:.3g} "
      f"bad={self.pct_bad:.2f}% nan={self.n_nan}" + (f" ({self.n_ref_nan} in the reference)" if self.n_ref_nan else "")
    )

  def __str__(self) -> str:
    lines = [
      f"NumericsResult({'PASS' if self.passed else 'FAIL'})",
      f"  shape:     {self.shape}",
      f"  max_diff:  {self.max_diff:.6f}",
      f"  mean_diff: {self.mean_diff:.6f}",
      f"  median:    {self.median_diff:.6f}",
      f"  rel_error: {self.rel_error:.3g} (max diff / max |ref|)",
      f"  % > tol:   {self.pct_bad:.2f}%  (atol={self.atol:.3g}, rtol={self.rtol:.3g})",
      f"  NaN/Inf:   {self.n_nan}" + (f" ({self.n_ref_nan} in the reference)" if self.n_ref_nan else ""),
      f"  worst at {self.worst_index}: ref={self.worst_ref:.4f}, test={self.worst_test:.4f}",
      f"  regions ({len(self.regions)}x{len(self.regions[0]) if self.regions else 0}):",
    ]
    for i, row in enumerate(self.regions):
      for j, (mean, bad) in enumerate(row):
        lines.append(f"    [{i},{j}]: mean={mean:.4f}, %bad={bad:.1f}%")
    return "\n".join(lines)


# Elements each step of the check's loop reads (whole rows of the output's last axis, at least
# one): its temporaries are a few of these in float32, whatever the output's size.
CHUNK = limits.STEP_ELEMENTS
MEDIAN_SAMPLE = 1 << 16  # the median is of an even grid of at most about this many elements (sorted)


def _splits(size: int, parts: int) -> list[int]:
  """np.array_split's boundaries of `size` into `parts`."""
  q, r = divmod(size, parts)
  return [i * q + min(i, r) for i in range(parts + 1)]


def _sample_steps(rows: int, cols: int, most: int) -> tuple[int, int]:
  """(row step, column step) of the median's grid: every column where a row is within
  `most`, and rows evenly spaced so the grid holds at most about `most`."""
  sc = max(1, -(-cols // most))
  per_row = -(-cols // sc)
  return max(1, -(-rows * per_row // most)), sc


def _sums(operands: tuple, init: tuple, combine: tuple, axes: tuple[int, ...]) -> tuple:
  """Reductions of same-shaped operands over `axes` in one pass: XLA:CPU fuses a select or a
  compare into a variadic reduce, not into a plain one (which would hold a full-size mask)."""
  ops = {"sum": jnp.add, "max": jnp.maximum}
  return jax.lax.reduce(
    operands, init, lambda x, y: tuple(ops[c](a, b) for c, a, b in zip(combine, x, y, strict=True)), axes
  )


# Why float32 is enough: ref and test are exact in float32 (bf16, f16, fp8 and f32 outputs; the
# reference is float32), so d = |test - ref| and the bound atol + rtol*|ref| are each within
# 2^-23 relative of their exact values (one rounding each for -, *, +; a subtraction of values
# within a factor 2 of each other is exact). The verdict d <= bound can therefore differ from
# exact arithmetic only for an element whose error is within about 3e-7 of its own bound
# (relative), where bounds are rtol >= 2^-7 (quant.Tolerance; TOLERANCE 1e-2) of the output's
# scale: such an element is at the tolerance's edge either way. Sums (the mean) are of
# non-negative terms, over a step's rows in float32 on the device and across steps in float64 on
# the host; counts are exact (int32 within a step, int64 across steps).
@functools.partial(jax.jit, static_argnames=("region_grid", "default_atol", "chunk", "sample"))
def _reduce(ref, test, atol, rtol, *, region_grid=(2, 2), default_atol=True, chunk=CHUNK, sample=MEDIAN_SAMPLE):
  """The check's reductions over ref and test of any shape, read as [rows, last axis] (atol: a
  scalar, or broadcastable to their shape): the small arrays compare() reads. The reshape is
  in here, where it is free: outside, an eager reshape of a drhs's [g, k, n] copies it."""
  shape = ref.shape
  size = math.prod(shape)
  cols = shape[-1] if len(shape) >= 2 else max(1, size)
  rows = size // cols
  ref, test = ref.reshape(rows, cols), test.reshape(rows, cols)
  if atol.ndim:
    atol = jnp.broadcast_to(atol.astype(jnp.float32), shape).reshape(rows, cols)
  return _reduce_rows(ref, test, atol, rtol, **_statics(rows, cols, region_grid, default_atol, chunk, sample))


def _reduce_rows(ref, test, atol, rtol, *, chunk_rows, row_edges, col_edges, sample, default_atol):
  """_reduce over ref and test [rows, cols] (atol: a scalar, or [rows, cols]), chunk_rows rows a step."""
  rows, cols = ref.shape
  per_element = atol.ndim == 2
  f32, i32, inf = jnp.float32, jnp.int32, jnp.inf
  n_steps = -(-rows // chunk_rows)

  def rows_of(x, c):
    """Step c's rows of x: [first, first + chunk_rows), the last step's slice ending at `rows`
    (its rows before `first`, another step's, are masked by `valid`)."""
    first = c * chunk_rows
    start = jnp.minimum(first, rows - chunk_rows)
    grow = start + jax.lax.iota(i32, chunk_rows)
    return jax.lax.dynamic_slice_in_dim(x, start, chunk_rows, 0), start, grow, grow >= first

  def steps(fn, ops):
    """fn(ops, c) for each step c, stacked. In a loop, the operands ride in its state behind a
    barrier, or XLA hoists their widening to float32 out of it: a full-size copy (as
    kernels.reference.loop). One step needs no loop (and compiles in half the time)."""
    if n_steps == 1:
      return jax.tree.map(lambda x: x[None], fn(ops, jnp.int32(0)))

    def body(ops, c):
      ops = jax.lax.optimization_barrier(ops)
      return ops, fn(ops, c)

    return jax.lax.scan(body, ops, jnp.arange(n_steps, dtype=i32))[1]

  def step_scale(ops, c):
    r = rows_of(ops[0], c)[0].astype(f32)  # the last step's rows seen twice: no matter to a max
    return _sums((jnp.where(jnp.isfinite(r), jnp.abs(r), 0),), (f32(0),), ("max",), (0, 1))[0]

  # the default atol's scale: max |ref| over its finite elements (a NaN or inf is judged alone)
  scale = jnp.max(steps(step_scale, (ref,)))
  if default_atol:
    atol = rtol * jnp.maximum(scale, 1e-30)

  def step(ops, c):
    ref, test, atol = ops
    r, start, grow, valid = rows_of(ref, c)
    r, t = r.astype(f32), rows_of(test, c)[0].astype(f32)
    a = rows_of(atol, c)[0] if per_element else atol
    d = jnp.abs(t - r)
    bound = a + rtol * jnp.abs(r)
    bad = ~((d <= bound) & (bound < inf))  # a NaN or inf in test, ref or the bound is bad
    finite = jnp.isfinite(t) & jnp.isfinite(r)
    # per row: the sum of finite diffs, the finite and bad counts, the largest diff (inf where
    # not finite), the reference's NaN/inf count, the largest atol
    operands = (jnp.where(finite, d, 0), finite.astype(i32), bad.astype(i32), jnp.where(finite, d, inf))
    operands += ((~jnp.isfinite(r)).astype(i32),) + ((jnp.broadcast_to(a, d.shape),) if per_element else ())
    init = (f32(0), i32(0), i32(0), f32(-inf), i32(0), f32(-inf))[: len(operands)]
    combine = ("sum", "sum", "sum", "max", "sum", "max")[: len(operands)]
    regions = zip(col_edges[:-1], col_edges[1:])
    per_region = [_sums(tuple(x[:, lo:hi] for x in operands), init, combine, (1,)) for lo, hi in regions]
    per_row = [jnp.stack(x, axis=1) for x in zip(*per_region)]  # each statistic [rows, column region]
    region = sum((grow >= e).astype(i32) for e in row_edges[1:-1]) if len(row_edges) > 2 else jnp.zeros_like(grow)
    in_cell = (valid[None] & (region[None] == jnp.arange(len(row_edges) - 1)[:, None]))[:, :, None]  # [region, rows, 1]
    cell = lambda x: jnp.sum(jnp.where(in_cell, x[None], 0), axis=1)  # [row region, column region]
    row_max = jnp.where(valid, jnp.max(per_row[3], axis=1), -1.0)
    w = jnp.argmax(row_max).astype(i32)  # the first row of the step holding its largest difference
    rw, tw = (jax.lax.dynamic_index_in_dim(x, w, 0, keepdims=False) for x in (r, t))
    col = jnp.argmax(jnp.where(jnp.isfinite(tw) & jnp.isfinite(rw), jnp.abs(tw - rw), inf)).astype(i32)
    row_atol = jnp.max(per_row[5], axis=1) if per_element else jnp.full_like(row_max, a)
    return {
      "sum": cell(per_row[0]),
      "finite": cell(per_row[1]),
      "bad": cell(per_row[2]),
      "ref_nonfinite": jnp.sum(jnp.where(valid, jnp.sum(per_row[4], axis=1), 0)),
      "worst": (row_max[w], start + w, col, rw[col], tw[col]),
      "atol_max": jnp.max(jnp.where(valid, row_atol, -inf)),
    }

  parts = steps(step, (ref, test, atol))
  grid = [jax.lax.slice(x, (0, 0), (rows, cols), sample).astype(f32).reshape(-1) for x in (ref, test)]
  d = jnp.abs(grid[1] - grid[0])
  ok = jnp.isfinite(grid[0]) & jnp.isfinite(grid[1])
  n = jnp.sum(ok, dtype=i32)
  srt = jnp.sort(jnp.where(ok, d, inf))
  lo, hi = srt[jnp.maximum(n - 1, 0) // 2], srt[n // 2]
  median = jnp.where(n > 0, (lo + hi) / 2, jnp.nan)
  return parts, scale, median


def _statics(rows: int, cols: int, region_grid, default_atol: bool, chunk: int, sample: int) -> dict:
  """_reduce_rows's static arguments for ref and test [rows, cols]."""
  return dict(
    chunk_rows=limits.step_rows(rows, cols, chunk),
    row_edges=tuple(_splits(rows, region_grid[0])),
    col_edges=tuple(_splits(cols, region_grid[1])),
    sample=_sample_steps(rows, cols, sample),
    default_atol=default_atol,
  )


def compare(ref, test, *, rtol: float, atol=None, region_grid=(2, 2)) -> NumericsResult:
  """Elementwise |test-ref| <= atol + rtol*|ref|; NaN or inf anywhere fails (in test, in ref
  or in atol). n_nan counts the elements where test or ref is NaN or inf, n_ref_nan those
  where ref is: a reference that is not finite is no judge, and the report says so.

  atol defaults to rtol * max|ref| (over ref's finite elements) so that near-zero outputs of
  long sums are judged against the output's scale, as a relative-error bound. It may be an
  array broadcastable to ref's shape (a bound per element, as quantized formats have:
  kernels.quant.Tolerance); the result reports its largest value. ref, test and atol are read
  where they are (a NumPy array goes to the device once) and reduced there in float32 by one
  jitted program, CHUNK elements a step (whole rows of the last axis); only the summary comes
  to the host. The median is of an even grid of at most about MEDIAN_SAMPLE differences.
  """
  ref, test = _device(ref), _device(test)
  if ref.shape != test.shape:
    raise ValueError(f"shape mismatch: ref {ref.shape} vs test {test.shape}")
  shape = tuple(ref.shape)
  size = int(np.prod(shape))
  cols = shape[-1] if len(shape) >= 2 else max(1, size)
  rows = size // cols if size else 0
  sizes = np.diff(_splits(rows, region_grid[0]))[:, None] * np.diff(_splits(cols, region_grid[1]))[None, :]
  if not size:
    return _empty(shape, rtol, atol, region_grid)
  if atol is not None and np.ndim(atol) > 0:
    a = _device(atol)
    jnp.broadcast_shapes(a.shape, shape)  # a ValueError here, naming both, not inside the program
  else:
    a = jnp.float32(0.0 if atol is None else atol)
  region_grid = tuple(region_grid)
  statics = dict(region_grid=region_grid, default_atol=atol is None, chunk=CHUNK, sample=MEDIAN_SAMPLE)
  parts, scale, median = _reduce(ref, test, a, jnp.float32(rtol), **statics)
  parts, scale, median = jax.device_get((parts, scale, median))
  total = parts["sum"].astype(np.float64).sum(axis=0)
  finite, bad = (parts[k].astype(np.int64).sum(axis=0) for k in ("finite", "bad"))
  n_bad = int(bad.sum())
  n_nan = size - int(finite.sum())
  value, wrow, wcol, wref, wtest = parts["worst"]
  best = int(np.argmax(value))  # the first step holding the largest: row-major order
  max_diff = max(float(value[best]), 0.0)
  worst = np.unravel_index(int(wrow[best]) * cols + int(wcol[best]), shape)
  scale = float(scale)
  regions = [
    [
      (
        float(total[i, j] / finite[i, j]) if finite[i, j] else float("nan"),
        100.0 * float(bad[i, j] / sizes[i, j]) if sizes[i, j] else 0.0,
      )
      for j in range(region_grid[1])
    ]
    for i in range(region_grid[0])
  ]
  return NumericsResult(
    passed=n_bad == 0,
    shape=shape,
    max_diff=max_diff,
    mean_diff=float(total.sum() / finite.sum()) if finite.sum() else float("nan"),
    median_diff=float(median),
    rel_error=max_diff / scale if scale else max_diff,
    pct_bad=100.0 * n_bad / size,
    n_nan=n_nan,
    n_ref_nan=int(parts["ref_nonfinite"].astype(np.int64).sum()),
    worst_index=tuple(int(i) for i in worst),
    worst_ref=float(wref[best]),
    worst_test=float(wtest[best]),
    atol=float(np.max(parts["atol_max"])),
    rtol=rtol,
    regions=regions,
  )


def _empty(shape, rtol: float, atol, region_grid) -> NumericsResult:
  """An empty output passes: nothing differs."""
  nan = float("nan")
  return NumericsResult(
    passed=True,
    shape=shape,
    max_diff=0.0,
    mean_diff=nan,
    median_diff=nan,
    rel_error=0.0,
    pct_bad=0.0,
    n_nan=0,
    n_ref_nan=0,
    worst_index=(),
    worst_ref=0.0,
    worst_test=0.0,
    atol=0.0 if atol is None or np.ndim(atol) else float(atol),
    rtol=rtol,
    regions=[[(nan, 0.0)] * region_grid[1] for _ in range(region_grid[0])],
  )


def _device(a) -> jax.Array:
  return a if isinstance(a, jax.Array) else jnp.asarray(a)
