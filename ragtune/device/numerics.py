"""Numerics comparison with a readable report (max/mean diff, worst index, region grid)."""

from __future__ import annotations

import dataclasses

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


def compare(ref, test, *, rtol: float, atol=None, region_grid=(2, 2)) -> NumericsResult:
  """Elementwise |test-ref| <= atol + rtol*|ref|, NaN anywhere fails.

  atol defaults to rtol * max|ref| so that near-zero outputs of long sums are judged
  against the output's scale, as a relative-error bound. It may be an array of ref's shape
  (a bound per element, as quantized formats have: kernels.quant.Tolerance); the result
  reports its largest value.
  """
  r = np.asarray(ref, np.float64)
  t = np.asarray(test, np.float64)
  if r.shape != t.shape:
    raise ValueError(f"shape mismatch: ref {r.shape} vs test {t.shape}")
  scale = float(np.max(np.abs(r))) if r.size else 0.0
  atol = rtol * max(scale, 1e-30) if atol is None else atol
  nonfinite = ~np.isfinite(t)
  diff = np.where(nonfinite, np.inf, np.abs(t - r))
  bad = diff > atol + rtol * np.abs(r)
  flat = diff.reshape(-1)
  finite = flat[np.isfinite(flat)]
  worst = np.unravel_index(int(np.argmax(flat)), r.shape) if r.size else ()
  view = diff.reshape(-1, r.shape[-1]) if r.ndim >= 2 else diff.reshape(1, -1)
  bad_view = bad.reshape(view.shape)
  regions = []
  for rows, brows in zip(np.array_split(view, region_grid[0], 0), np.array_split(bad_view, region_grid[0], 0)):
    row = []
    for cell, bcell in zip(np.array_split(rows, region_grid[1], 1), np.array_split(brows, region_grid[1], 1)):
      fin = cell[np.isfinite(cell)]
      row.append((float(fin.mean()) if fin.size else float("nan"), 100.0 * float(bcell.mean()) if bcell.size else 0.0))
    regions.append(row)
  max_diff = float(flat.max()) if flat.size else 0.0
  return NumericsResult(
    passed=not bool(bad.any()),
    shape=tuple(r.shape),
    max_diff=max_diff,
    mean_diff=float(finite.mean()) if finite.size else float("nan"),
    median_diff=float(np.median(finite)) if finite.size else float("nan"),
    rel_error=max_diff / scale if scale else max_diff,
    pct_bad=100.0 * float(bad.mean()) if bad.size else 0.0,
    n_nan=int(nonfinite.sum()),
    worst_index=tuple(int(i) for i in worst),
    worst_ref=float(r[worst]) if r.size else 0.0,
    worst_test=float(t[worst]) if r.size else 0.0,
    atol=float(np.max(atol)) if np.size(atol) else 0.0,
    rtol=rtol,
    regions=regions,
  )
