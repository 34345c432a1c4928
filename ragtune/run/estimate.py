"""How long a sweep's rows will take, before any runs: a model, calibrated on this host.

On a CPU the kernels run in one of jax's interpreters, whose cost follows what a config
launches on a problem (kernels.backend.GridWork): a cost per run and per grid step, more
for a step that reads and stores tiles, a pass over every element of the whole refs such
a step reads or writes (pallas_call's interpreter copies a ref the kernel indexes under
pl.when at every step), and the inner loops' steps and multiply-adds. The weights of these
terms are the backend's (Backend.interpret_cost, fitted once where the backend is
registered), in units of one interpreted grid step; that unit, and a compile's seconds, are
measured on each host by timing a tiny interpreted kernel (calibration_backend's; a few
seconds, once: cached per host and jax version). A candidate compiles once and runs RUNS
times. It is a model: docs/commands.md (plan) says how far off it was.

On a device the kernels run compiled: a candidate costs its compile, check and profile (a
nominal figure) plus RUNS runs at its roofline at the ceilings a sweep measured there
(ceilings.json), when there are some, else at the datasheet peaks of a named GPU (kernels.gpus).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import time
from pathlib import Path

from kernels import gpus, registry
from kernels.backend import Backend
from ragtune.device import ceilings, measure
from ragtune.errors import RagtuneError
from ragtune.paths import write_atomic
from ragtune.problems.shapes import Problem

# worker._measure runs a candidate once to check it, then measure.time_variants warms up
# once and times 3 runs.
RUNS = 5
CACHE_FILE = "interpret-calibration.json"
# The worker builds each problem's reference once (ragtune.device.reference: the problem's
# FLOPs, tile by tile): counted as two runs of a dense matmul of those FLOPs, with the xla
# baseline. A baseline's compile (XLA's, not an interpreter's) took 0.1-0.5 calibration compiles.
REFERENCE_RUNS = 2
BASELINE_COMPILE = 0.3
# A candidate on a device: compile, check and tune-jax's profile. Nominal, not measured on
# any device here; rows recorded there replace it.
DEVICE_CANDIDATE_S = 5.0
DEVICE_BASELINE_S = 1.0


@dataclasses.dataclass(frozen=True)
class Calibration:
  """This host's interpreter speed: the seconds of one unit (InterpretCost) and of the
  calibration kernel's compile, and a dense matmul's rate (for the baselines)."""

  step_s: float
  compile_s: float
  matmul_flops: float
  host: str
  jax_version: str
  measured: str

  @property
  def key(self) -> str:
    """What it holds for: this host and jax version."""
    return cache_key(self.host, self.jax_version)


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The time a problem's rows left will take, and where the figure comes from:
  "rows" (the median times of its recorded candidates and baselines), "model" (the interpreter cost model),
  "nominal" (a device with nothing recorded yet) or "unknown" (why in `note`)."""

  seconds: float | None
  candidate_s: float | None  # the slowest candidate left, for the --timeout check
  source: str
  note: str = ""
  # What `seconds` counts each candidate left at (their mean, or the recorded rows' median):
  # seconds = candidates left x per_candidate_s + the baselines left.
  per_candidate_s: float | None = None


def calibration_backend() -> Backend:
  """The backend whose kernel calibrates this host: the first (in registry order) available
  here, with bf16 kernels, whose interpret_cost weighs its grid step 1. Every backend's
  weights are in units of that step, so timing it calibrates them all."""
  return next(
    b
    for b in registry.REGISTRY.values()
    if b.interpret_cost and b.interpret_cost.step == 1 and "bfloat16" in b.dtypes and not b.unavailable()
  )


def _calibration_problem() -> tuple[Problem, Backend]:
  """A tiny fwd problem of calibration_backend(): a few dozen grid steps, a few that read its
  0.5M-element weights (the term that dominates real shapes)."""
  b = calibration_backend()
  return Problem("fwd", b.name, "bfloat16", 64, 128, 256, 16, "calibration", (32, 32) + (0,) * 14), b


def cache_path() -> Path:
  """The calibrations of this user's hosts: $XDG_CACHE_HOME/ragtune (~/.cache/ragtune)."""
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base) / "ragtune" / CACHE_FILE


def cache_key(host: str, jax_version: str) -> str:
  return f"{host}|jax {jax_version}"


def measure_calibration() -> Calibration:
  """Time the calibration kernel interpreted here (its compile, then the best of 5 runs) and
  a dense bf16 matmul. A few seconds on a 2-core host, most of it the compile."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  p, b = _calibration_problem()
  cfg = b.default_config(p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind="cpu")
  # Host arrays, not jax.random: no compiles but the kernel's.
  args = (
    jnp.asarray(np.ones((p.m, p.k)), jnp.bfloat16),
    jnp.asarray(np.ones((p.g, p.k, p.n)), jnp.bfloat16),
    jnp.asarray(p.group_sizes, jnp.int32),
  )
  t0 = time.perf_counter()
  compiled = measure.compile_fn(measure.build_op(p, b.name, cfg, True), args)
  compile_s = time.perf_counter() - t0
  run_s = ceilings.best_time(compiled, *args, reps=5)
  n = 256
  a = jnp.asarray(np.ones((n, n)), jnp.bfloat16)
  mm = measure.compile_fn(measure.dense_matmul, (a, a))
  units = b.interpret_cost.units(b.grid_work(cfg, p.op, p.m, p.k, p.n, p.group_sizes))
  return Calibration(
    step_s=run_s / units,
    compile_s=compile_s,
    matmul_flops=2 * n**3 / ceilings.best_time(mm, a, a, reps=3),
    host=platform.node(),
    jax_version=jax.__version__,
    measured=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
  )


def _cached() -> dict:
  try:
    cached = json.loads(cache_path().read_text())
  except (OSError, ValueError):
    return {}
  return cached if isinstance(cached, dict) else {}


def save_calibration(cal: Calibration) -> None:
  cached = _cached()
  cached[cal.key] = dataclasses.asdict(cal)
  write_atomic(cache_path(), json.dumps(cached, indent=1, sort_keys=True) + "\n")


def calibration() -> Calibration:
  """This host's calibration: cached per host and jax version (cache_path), measured once
  where there is none."""
  import jax

  entry = _cached().get(cache_key(platform.node(), jax.__version__))
  if isinstance(entry, dict):
    try:
      return Calibration(**entry)
    except TypeError:
      pass  # written by another version of ragtune: measure again
  cal = measure_calibration()
  try:
    save_calibration(cal)
  except RagtuneError:
    pass  # a cache folder we cannot write: measured again next time
  return cal


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Where a sweep will run, as the estimates need it: interpreted (with this host's
  calibration) or compiled on a device of `device_kind` (with its recorded ceilings)."""

  interpret: bool
  device_kind: str
  cal: Calibration | None = None
  ceil: dict = dataclasses.field(default_factory=dict)
  note: str = ""  # why there is no calibration

  @classmethod
  def for_sweep(cls, interpret: bool, device_kind: str, out_dir: Path | None) -> CostModel:
    ceil = ceilings.load([out_dir]) if out_dir is not None else {}
    if not interpret:
      return cls(False, device_kind, ceil=ceil)
    try:
      return cls(True, device_kind, calibration(), ceil)
    except Exception as e:  # noqa: BLE001 - a plan without an estimate beats no plan
      return cls(True, device_kind, ceil=ceil, note=f"calibration failed: {measure.error_text(e, 200)}")

  def candidate_s(self, p: Problem, cfg) -> float | None:
    """Seconds one candidate of p takes: compiled once, run RUNS times."""
    b = registry.get(p.backend)
    if not self.interpret:
      return DEVICE_CANDIDATE_S + RUNS * (self._roofline_s(p) or 0.0)
    if self.cal is None or b.grid_work is None or b.interpret_cost is None:
      return None
    cost = b.interpret_cost
    work = b.grid_work(cfg, p.op, p.m, p.k, p.n, p.group_sizes)
    return cost.compile * self.cal.compile_s + RUNS * self.cal.step_s * cost.units(work)

  def baseline_s(self, p: Problem, name: str) -> float | None:
    """Seconds of a baseline row, xla (with the worker's reference for the problem) or dense."""
    if not self.interpret:
      return DEVICE_BASELINE_S + RUNS * (self._roofline_s(p) or 0.0)
    if self.cal is None:
      return None
    # XLA's CPU ragged_dot computes every group's dense matmul over all m rows.
    work = RUNS * measure.flops(p)
    if name == "xla":
      work = RUNS * 2.0 * p.m * p.k * p.n * p.g + REFERENCE_RUNS * measure.flops(p)
    return BASELINE_COMPILE * self.cal.compile_s + work / self.cal.matmul_flops

  def _roofline_s(self, p: Problem) -> float | None:
    """A run's time at the device's recorded ceilings, else at its datasheet's peaks (a named
    GPU: kernels.gpus); None where neither is known."""
    return roofline_s(p, *ceilings.peaks(self.ceil, self.device_kind, None, p.dtype)) or datasheet_floor_s(
      p, self.device_kind
    )

  def source(self, p: Problem) -> str:
    if self.interpret:
      return "model"
    if roofline_s(p, *ceilings.peaks(self.ceil, self.device_kind, None, p.dtype)) is not None:
      return "roofline"
    return "datasheet" if datasheet_floor_s(p, self.device_kind) is not None else "nominal"

  def baselines_s(self, p: Problem, baselines: list[str]) -> float | None:
    """Seconds of these baseline rows ("baseline:xla", "baseline:dense") of p."""
    times = [self.baseline_s(p, name.partition(":")[2]) for name in baselines]
    return None if None in times else sum(times)

  def problem(self, p: Problem, left: list, count: int, baselines: list[str]) -> Estimate:
    """The rows left of p: `count` candidates like those in `left` (all of them, when the
    sweep lists its candidates; a budgeted search's are drawn from them) and the baselines."""
    per = [self.candidate_s(p, c) for c in left]
    base = self.baselines_s(p, baselines)
    if None in per or base is None:
      return Estimate(None, None, "unknown", self.note or f"no interpreter cost model for backend {p.backend!r}")
    mean = sum(per) / len(per) if per else None
    return Estimate(count * (mean or 0.0) + base, max(per, default=None), self.source(p), per_candidate_s=mean)

  def describe(self) -> str:
    """One line on what the estimates are."""
    if self.interpret and self.cal is not None:
      return (
        f"a model of the interpreter: {self.cal.step_s * 1e6:.1f} us a grid step and {self.cal.compile_s:.1f}s a "
        f"compile, calibrated on this host ({self.cal.host}, jax {self.cal.jax_version}), {RUNS} runs a candidate"
      )
    if self.interpret:
      return f"unknown ({self.note})"
    return (
      f"nominal: {DEVICE_CANDIDATE_S:g}s a candidate to compile, check and profile, plus {RUNS} runs at the "
      "roofline of the ceilings in ceilings.json where a sweep measured them, else of the GPU's datasheet"
    )


def roofline_s(p: Problem, tflops: float | None, gbps: float | None) -> float | None:
  """A model: the larger of p's FLOPs over `tflops` and the bytes any implementation moves
  (measure.bytes_moved) over `gbps`; None when either is unknown."""
  if not tflops or not gbps:
    return None
  return max(measure.flops(p) / (tflops * 1e12), measure.bytes_moved(p) / (gbps * 1e9))


def datasheet_floor_s(p: Problem, device_kind: str | None) -> float | None:
  """p's roofline at a named GPU's datasheet peaks (kernels.gpus: the dense tensor-core TF/s of
  its format, the memory bandwidth): no kernel runs faster. None for a GPU with no facts file."""
  return roofline_s(p, *gpus.peaks(device_kind, p.dtype))


# An interpreted plan longer than this is of problems sized for a GPU (shapes/smoke.yaml's
# whole sweep takes minutes on a CPU).
GPU_SIZED_S = 6 * 3600


def gpu_sized_hint(model: CostModel, total_s: float) -> str | None:
  """One line for an interpreter's plan that runs for hours: its figure is not a GPU's."""
  if not model.interpret or total_s <= GPU_SIZED_S:
    return None
  return (
    f"note: {duration(total_s)} is the Pallas interpreter's time on this CPU, not a GPU's: these problems are "
    "sized for a GPU. Plan them for one with --target h100 (or h200, b200), or run plan and sweep on the GPU; "
    "shapes/smoke.yaml is sized for a CPU."
  )


def duration(seconds: float) -> str:
  """'42s', '12m 05s', '3h 20m'."""
  s = round(seconds)
  if s < 60:
    return f"{seconds:.0f}s" if seconds >= 9.95 else f"{seconds:.1f}s"
  if s < 3600:
    return f"{s // 60}m {s % 60:02d}s"
  return f"{s // 3600}h {s % 3600 // 60:02d}m"
