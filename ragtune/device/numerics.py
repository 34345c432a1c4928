"""Numerics comparison with a readable report (max/mean diff, worst index, region grid)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import numpy as np

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
  n_nan: int
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
      f"bad={self.pct_bad:.2f}% nan={self.n_nan}"
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
      f"  NaN/Inf:   {self.n_nan}",
      f"  worst at {self.worst_index}: ref={self.worst_ref:.4f}, test={self.worst_test:.4f}",
      f"  regions ({len(self.regions)}x{len(self.regions[0]) if self.regions else 0}):",
    ]
    for i, row in enumerate(self.regions):
      for j, (mean, bad) in enumerate(row):
        lines.append(f"    [{i},{j}]: mean={mean:.4f}, %bad={bad:.1f}%")
    return "\n".join(lines)


# Elements the check holds in float64 at a time; a larger output is compared chunk by chunk,
# in threads (NumPy releases the GIL), so no full-size float64 copy is made.
CHUNK = 1 << 22
MEDIAN_SAMPLE = 1 << 24  # beyond this many elements the median is of an even sample of them


def _splits(size: int, parts: int) -> list[int]:
  """np.array_split's boundaries of `size` into `parts`."""
  q, r = divmod(size, parts)
  return [i * q + min(i, r) for i in range(parts + 1)]


def compare(ref, test, *, rtol: float, atol=None, region_grid=(2, 2)) -> NumericsResult:
  """Elementwise |test-ref| <= atol + rtol*|ref|, NaN anywhere fails.

  atol defaults to rtol * max|ref| so that near-zero outputs of long sums are judged
  against the output's scale, as a relative-error bound. It may be an array of ref's shape
  (a bound per element, as quantized formats have: kernels.quant.Tolerance); the result
  reports its largest value. ref, test and atol are read as they are (any float dtype, a jax
  array comes to the host once) and compared in float64 in chunks of CHUNK elements; the
  median is of every s-th difference where there are more than MEDIAN_SAMPLE.
  """
  r_all, t_all = np.asarray(ref), np.asarray(test)
  if r_all.shape != t_all.shape:
    raise ValueError(f"shape mismatch: ref {r_all.shape} vs test {t_all.shape}")
  shape = r_all.shape
  cols = shape[-1] if len(shape) >= 2 else max(1, r_all.size)
  r2, t2 = r_all.reshape(-1, cols), t_all.reshape(-1, cols)
  a2 = None if atol is None or np.ndim(atol) == 0 else np.broadcast_to(np.asarray(atol), shape).reshape(-1, cols)
  step = max(1, CHUNK // cols)
  blocks = [(i, min(i + step, r2.shape[0])) for i in range(0, r2.shape[0], step)]
  with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
    scale = max(pool.map(lambda s: float(np.max(np.abs(r2[s[0] : s[1]]))), blocks), default=0.0)
    fixed = rtol * max(scale, 1e-30) if atol is None else (atol if a2 is None else None)
    row_edges, col_edges = _splits(r2.shape[0], region_grid[0]), _splits(cols, region_grid[1])
    stride = max(1, -(-r_all.size // MEDIAN_SAMPLE))

    def block(span):
      a, b = span
      rr = r2[a:b].astype(np.float64)
      diff = t2[a:b].astype(np.float64)
      nonfinite = ~np.isfinite(diff)
      n_nonfinite = int(np.count_nonzero(nonfinite))
      diff -= rr
      np.abs(diff, out=diff)
      if n_nonfinite:
        diff[nonfinite] = np.inf
      bound = np.abs(rr, out=rr)
      bound *= rtol
      bound += fixed if a2 is None else a2[a:b]
      bad = diff > bound
      finite = np.isfinite(diff) if n_nonfinite else None
      flat = diff.reshape(-1)
      worst = int(np.argmax(flat)) if flat.size else 0
      cells = np.zeros((region_grid[0], region_grid[1], 3))  # finite sum, finite count, bad count
      for i in range(region_grid[0]):
        lo, hi = max(a, row_edges[i]) - a, min(b, row_edges[i + 1]) - a
        for j in range(region_grid[1]):
          c = (slice(lo, hi), slice(col_edges[j], col_edges[j + 1]))
          if hi <= lo:
            continue
          if finite is None:
            cells[i, j] = (diff[c].sum(), diff[c].size, np.count_nonzero(bad[c]))
          else:
            cells[i, j] = (diff[c][finite[c]].sum(), np.count_nonzero(finite[c]), np.count_nonzero(bad[c]))
      first = a * cols
      sample = flat[(-first) % stride :: stride]
      return {
        "bad": int(np.count_nonzero(bad)),
        "nonfinite": n_nonfinite,
        "worst": (float(flat[worst]) if flat.size else -np.inf, first + worst),
        "cells": cells,
        "sample": sample[np.isfinite(sample)] if n_nonfinite else sample.copy(),
        "atol": float(np.max(a2[a:b])) if a2 is not None and b > a else None,
      }

    parts = list(pool.map(block, blocks))
  cells = sum((p["cells"] for p in parts), np.zeros((region_grid[0], region_grid[1], 3)))
  n_bad, n_nan = sum(p["bad"] for p in parts), sum(p["nonfinite"] for p in parts)
  max_diff, worst_flat = max((p["worst"] for p in parts), key=lambda w: (w[0], -w[1]), default=(0.0, 0))
  max_diff = max(max_diff, 0.0) if r_all.size else 0.0
  total, count = cells[..., 0].sum(), cells[..., 1].sum()
  sample = np.concatenate([p["sample"] for p in parts]) if parts else np.zeros(0)
  worst = np.unravel_index(worst_flat, shape) if r_all.size else ()
  sizes = np.diff(row_edges)[:, None] * np.diff(col_edges)[None, :]
  regions = [
    [
      (
        float(cells[i, j, 0] / cells[i, j, 1]) if cells[i, j, 1] else float("nan"),
        100.0 * float(cells[i, j, 2] / sizes[i, j]) if sizes[i, j] else 0.0,
      )
      for j in range(region_grid[1])
    ]
    for i in range(region_grid[0])
  ]
  if a2 is not None:
    atol_max = max((p["atol"] for p in parts if p["atol"] is not None), default=0.0)
  else:
    atol_max = float(fixed) if r_all.size or atol is not None else 0.0
  return NumericsResult(
    passed=n_bad == 0,
    shape=tuple(shape),
    max_diff=max_diff,
    mean_diff=float(total / count) if count else float("nan"),
    median_diff=float(np.median(sample)) if sample.size else float("nan"),
    rel_error=max_diff / scale if scale else max_diff,
    pct_bad=100.0 * n_bad / r_all.size if r_all.size else 0.0,
    n_nan=n_nan,
    worst_index=tuple(int(i) for i in worst),
    worst_ref=float(r_all[worst]) if r_all.size else 0.0,
    worst_test=float(t_all[worst]) if r_all.size else 0.0,
    atol=atol_max,
    rtol=rtol,
    regions=regions,
  )
