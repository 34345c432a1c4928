"""The backends `kernels.ragged_dot` can run, listed in one place.

A backend is one folder of this package whose ``__init__`` defines ``BACKEND =
Backend(...)`` (kernels/backend.py): its kernels, config type, defaults, search space and
capabilities. Adding one means that folder plus one line in ``_MODULES``. Everything else
looks backends up here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from kernels.backend import Backend, KernelConfig, host_cores, pool_env
from kernels.common import OPS

# One line per backend. Order matters only for display and for ties (Lut.query).
_MODULES = (
  "kernels.pallas_gpu",
  "kernels.mosaic_gpu",
  "kernels.mosaic_blackwell",
  "kernels.pallas_tpu",
  "kernels.xla",
)

REGISTRY: dict[str, Backend] = {b.name: b for b in (importlib.import_module(m).BACKEND for m in _MODULES)}
NAMES = tuple(REGISTRY)
# The backend every tuned kernel is measured against: jax.lax.ragged_dot as XLA compiles it.
REFERENCE = "xla"


def get(name: str) -> Backend:
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(f"backend must be one of {NAMES}, got {name!r}") from None


def tunable() -> tuple[str, ...]:
  """The backends with knobs, in registry order (the first is a shape file's default)."""
  return tuple(b.name for b in REGISTRY.values() if b.config_type is not None)


def backend_of_config(cfg: Any) -> str | None:
  """The backend whose config type `cfg` is (None for None or an unknown type)."""
  for b in REGISTRY.values():
    if b.config_type is not None and isinstance(cfg, b.config_type):
      return b.name
  return None


def config_types() -> tuple[type, ...]:
  return tuple(b.config_type for b in REGISTRY.values() if b.config_type is not None)


def config_from_dict(backend: str, d: dict[str, Any]) -> KernelConfig | None:
  """Build the config type of `backend` from a plain dict (as stored in a LUT)."""
  return get(backend).config_from_dict(d)


def default_config(
  backend: str, op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None
) -> KernelConfig | None:
  """The backend's heuristic for `op` on the forward problem (m, k, n, g), for a device of
  `device_kind` (None: the safe GPU family)."""
  return get(backend).default_config(op, dtype, m, k, n, g, device_kind)


def auto_backend(
  platform: str, device_kind: str, dtype: str | None = None, *, trains: bool = False, op: str | None = None
) -> str:
  """What backend="auto" falls back to: the highest priority (Backend.priority) among the
  backends that run compiled on this device (and, for `dtype` a quantized format of
  common.FORMATS, compute it; with `trains`, its weight gradient too: a training format's
  three ops go to one backend). `op` ranks by each backend's op_priority where it computes
  `dtype`; a plain dtype no candidate computes still gets the device's backend, whose error
  names the others (check_dtype)."""
  return auto_backends(platform, device_kind, dtype, trains=trains, ops=(op,))[op]


def auto_backends(
  platform: str, device_kind: str, dtype: str | None = None, *, trains: bool = False, ops: tuple[str | None, ...] = OPS
) -> dict[str | None, str]:
  """auto_backend for each of `ops` (None: any op), the device checked once."""
  fmt = dtype if dtype is not None and ":" in dtype else None
  runs = [
    b
    for b in REGISTRY.values()
    if b.runs_on(platform, device_kind, fmt)
    and (fmt is None or fmt in b.dtypes)
    and (not trains or b.grad_rhs_quantized is not None)
  ]
  out = {}
  for op in ops:
    ranked = [b for b in runs if b.priority(dtype, op) > 0]
    out[op] = max(ranked, key=lambda b: b.priority(dtype, op)).name if ranked else REFERENCE
  return out


def check_dtype(name: str, lhs_dtype, rhs_dtype, compute_dtype: str) -> None:
  """TypeError unless backend `name` computes in `compute_dtype`, naming those that do."""
  b = get(name)
  others = tuple(
    o.name
    for o in REGISTRY.values()
    if o.name != name and compute_dtype in o.dtypes and set(o.platforms) & set(b.platforms)
  )
  b.check_dtype(lhs_dtype, rhs_dtype, compute_dtype, others)


def check_device(name: str, platform: str, device_kind: str, fmt: str | None = None) -> None:
  """ValueError unless backend `name` compiles for this device (on operands of `fmt`, a format
  of common.FORMATS, when given), naming those that run there."""
  others = tuple(
    b.name
    for b in REGISTRY.values()
    if b.name != name and b.runs_on(platform, device_kind, fmt) and (fmt is None or fmt in b.dtypes)
  )
  get(name).check_device(platform, device_kind, others, fmt)


def activation_quantizer(platform: str, device_kind: str, fmt: str) -> Backend | None:
  """The backend whose single-pass quantizers (Backend.quantize_rows) compile for this device
  and the training format `fmt`, or None: fp8 training's activation passes then run in XLA (kernels.quant). XLA's take a
  reduce and a convert, reading their input twice (docs/quantization.md)."""
  return next(
    (b for b in REGISTRY.values() if b.quantize_rows is not None and b.runs_on(platform, device_kind, fmt)), None
  )


def megablox_backend() -> str | None:
  """The backend whose configs are megablox tilings (Lut.lut_fn serves them)."""
  return next((b.name for b in REGISTRY.values() if b.megablox_lut_fn), None)


def interpreter_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
  """What a process that interprets kernels on a CPU must add to its environment before jax
  starts: {} or {"PJRT_NPROC": n}.

  XLA:CPU runs a program's host callbacks on the caller's thread or, once any of its work has
  gone to the intra-op pool, on a pool thread; the pool has PJRT_NPROC (else NPROC, else the
  core count) threads. jax's Mosaic GPU interpreter blocks in callbacks: one waits for the
  simulated threads of the kernel, each of those can wait at a barrier. When they hold every
  pool thread, the threads they wait for cannot run: a deadlock, seen on 2-core hosts with
  jax 0.10.2 and 0.12.0.1 alike. A pool of twice the blocked callbacks is ample."""
  return pool_env(max(b.interpreter_threads for b in REGISTRY.values()), host_cores(), environ)
