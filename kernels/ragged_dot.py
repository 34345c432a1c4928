"""The public op: `ragged_dot`, its three constituent ops, and the custom_vjp tying them.

  forward   out  = gmm(lhs, rhs)                 [m,k] x [g,k,n] -> [m,n]
  grad_lhs  dlhs = gmm(dout, rhs, transposed)    [m,n] x [g,k,n]^T -> [m,k]  (no copy of rhs^T)
  grad_rhs  drhs = tgmm(lhs, dout)               per group lhs^T dout -> [g,k,n]

Each is tuned on its own, so each takes its own config ("fwd", "dlhs", "drhs").
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import common, gpus, quant, registry, target
from kernels import lut as lut_mod
from kernels.backend import KernelConfig
from kernels.common import OPS, QUANT_DTYPES, TRAINING_FORMATS, element_dtype
from kernels.common import scheme as common_scheme

logger = logging.getLogger("kernels")

# --- argument handling ----------------------------------------------------------------


def _check_backend(backend: str) -> str:
  if backend != "auto" and backend not in registry.REGISTRY:
    raise ValueError(f"backend must be one of {('auto',) + registry.NAMES}, got {backend!r}")
  return backend


def default_interpret(backend: str) -> bool:
  """Interpret a kernel backend when its hardware is not the device being compiled for
  (kernels.target.current)."""
  b = registry.get(backend)
  return b.config_type is not None and target.current().platform not in b.platforms


def _canonical_precision(precision):
  if precision is None:
    return None
  if isinstance(precision, (tuple, list)):
    if len(precision) != 2:
      raise ValueError(f"precision must be None, a Precision or a pair of them, got {precision!r}")
    return tuple(jax.lax.Precision(p) for p in precision)
  p = jax.lax.Precision(precision)
  return (p, p)


def _check_shapes(lhs, rhs, group_sizes, transpose_rhs, group_offset):
  if getattr(lhs, "ndim", None) != 2:
    raise ValueError(f"lhs must be a 2-D array [m, k], got shape {getattr(lhs, 'shape', None)}")
  if getattr(rhs, "ndim", None) != 3:
    layout = "[g, n, k]" if transpose_rhs else "[g, k, n]"
    raise ValueError(f"rhs must be a 3-D array {layout}, got shape {getattr(rhs, 'shape', None)}")
  if getattr(group_sizes, "ndim", None) != 1:
    raise ValueError(f"group_sizes must be a 1-D int32 array [g], got shape {getattr(group_sizes, 'shape', None)}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"group_sizes must be an integer (int32) array, got dtype {group_sizes.dtype}")
  k_rhs = rhs.shape[2] if transpose_rhs else rhs.shape[1]
  if lhs.shape[1] != k_rhs:
    axis = "rhs.shape[2]" if transpose_rhs else "rhs.shape[1]"
    raise ValueError(
      f"contraction mismatch: lhs.shape[1]={lhs.shape[1]} but {axis}={k_rhs} (transpose_rhs={transpose_rhs})"
    )
  g_total, g_local = group_sizes.shape[0], rhs.shape[0]
  if g_local < 1:
    raise ValueError(f"rhs must hold at least one group (g >= 1), got shape {rhs.shape}")
  if group_offset is None and g_total != g_local:
    raise ValueError(
      f"group count mismatch: group_sizes has {g_total} groups but rhs has {g_local}"
      " (pass group_offset when rhs holds a shard of the groups)"
    )
  if group_offset is not None:
    if g_total < g_local:
      raise ValueError(f"group_sizes has {g_total} groups, fewer than rhs's {g_local}")
    if getattr(group_offset, "ndim", np.ndim(group_offset)) != 0:
      raise ValueError(f"group_offset must be an int32 scalar, got shape {np.shape(group_offset)}")
    if not jnp.issubdtype(jnp.result_type(group_offset), jnp.integer):
      raise TypeError(f"group_offset must be an integer scalar, got {jnp.result_type(group_offset)}")


@dataclasses.dataclass(frozen=True)
class Choice:
  """What `ragged_dot` runs for one op, and where that config came from.

  source: "lut-exact" (an entry for this very (m, k, n, g)), "lut-nearest" (the closest
    tuned shape, in `tuned_shape`, at `distance` by the rule of `Lut.query`),
    "heuristic" (the backend's default), "compile-verified" (the backend's default for a
    device it was compiled for by a stated rule, not tuned: pallas_tpu on a known TPU, see
    kernels/pallas_tpu/config.py), "explicit" (passed as config=), or "none" (a backend with
    no knobs, such as xla).
  rejected: for a default although the LUT has entries of this op and dtype, the nearest
    of them and why it was not used (another regime, a config that does not fit, a backend
    that does not run on this device).
  why: for a default or "none" that no rejected entry explains, why no LUT entry was used
    (no LUT loaded, none of this op and dtype, no tunable backend compiled on this device).
  """

  op: str
  backend: str
  config: KernelConfig | None
  source: str
  tuned_shape: tuple[int, int, int, int] | None = None  # the LUT entry's forward (m, k, n, g)
  distance: float | None = None
  lut: str | None = None  # the LUT's file, when it has one
  rejected: lut_mod.Rejection | None = None
  why: str = ""

  def __str__(self) -> str:
    where = self.source
    if self.source == "lut-nearest":
      where += f" (tuned {lut_mod.shape_text(*self.tuned_shape)}, distance {self.distance:.3g})"
    if self.rejected is not None:
      where += f" ({self.rejected})"
    elif self.why:
      where += f" ({self.why})"
    backend = self.backend + (" (deprecated upstream)" if registry.get(self.backend).deprecated() else "")
    return f"{self.op}: {backend} {self.config if self.config is not None else '(no config)'} <- {where}"


def _from_entry(op: str, table, e, m: int, k: int, n: int, g: int) -> Choice:
  source = "lut-exact" if (e.m, e.k, e.n, e.g) == (m, k, n, g) else "lut-nearest"
  return Choice(
    op, e.backend, e.config, source, (e.m, e.k, e.n, e.g), lut_mod.shape_distance(e, m, k, n, g), table.source
  )


def _lut_or_default(
  op: str, backend: str, m: int, k: int, n: int, g: int, dtype: Any, miss: lut_mod.Rejection | None = None
) -> Choice:
  """`backend`'s config for `op`: the active LUT's nearest entry, else the heuristic, with the
  nearest entry it rejected (this backend's, else `miss`: auto's, of any backend)."""
  b = registry.get(backend)
  if b.config_type is None:
    return Choice(op, backend, None, "none")
  dt = lut_mod.canonical_dtype(dtype)
  table = lut_mod.active_lut()
  e = table.query(op, m, k, n, g, dt, backend=backend) if table is not None else None
  if e is None:
    rejected = (table.nearest_rejected(op, m, k, n, g, dt, backend=backend) if table is not None else None) or miss
    kind = target.current().device_kind
    default = b.default_config(op, dt, m, k, n, g, kind)
    return Choice(
      op, backend, default, b.default_source(kind), rejected=rejected, why=_no_entry(table, kind, op, dt, backend)
    )
  return _from_entry(op, table, e, m, k, n, g)


def _no_entry(table: lut_mod.Lut | None, device_kind: str, op: str, dtype: str, backend: str | None = None) -> str:
  """Why the LUT gave nothing for `op` when no entry of it was rejected."""
  if table is None or (table.source is None and not len(table)):
    return (
      f"no LUT loaded for device {device_kind!r}: `ragtune export-lut` writes one; "
      f"set {lut_mod.ENV_VAR} or call kernels.load_lut(path)"
    )
  of = f"{op} {dtype}" + (f" {backend}" if backend else "")
  return f"the LUT {table.source or '(in memory)'} has no {of} entry"


def _no_tunable_backend(platform: str, device_kind: str, fmt: str | None) -> str:
  """Why backend="auto" runs XLA's op and asks no LUT: no backend with configs compiles here
  (for this quantized format, when one is given)."""
  if fmt is not None and registry.auto_backend(platform, device_kind) != registry.REFERENCE:
    why = gpus.fp8_refusal(device_kind) if platform == "gpu" and gpus.peak_class(fmt) == "fp8" else ""
    why = common.tpu_format_refusal(device_kind, fmt) if platform == "tpu" else why
    because = f" ({why})" if why else ""
    return f"auto on {device_kind!r}: no backend with configs computes {fmt} here{because}, so XLA's op runs"
  return (
    f"auto on {device_kind!r}: no backend with configs runs compiled here, so XLA's op runs and no LUT "
    f"is asked; backend= one of {', '.join(registry.tunable())} runs interpreted with its LUT entries"
  )


def _as_config(backend: str, op: str, cfg: Any) -> Any:
  """A plain dict (as a LUT stores it) becomes the backend's config type."""
  if not isinstance(cfg, Mapping):
    return cfg
  if registry.get(backend).config_type is None:
    if cfg:
      raise TypeError(f"config[{op!r}] must be None or {{}} for backend {backend!r} (it has no knobs), got {cfg!r}")
    return None
  try:
    return registry.config_from_dict(backend, dict(cfg))
  except (TypeError, ValueError) as e:
    raise type(e)(f"config[{op!r}]: {e}") from None


def _per_op(config: Mapping) -> bool:
  """{op: config} rather than one config as a dict: keys are ops, or values are configs."""
  return set(config) <= set(OPS) or any(
    v is None or isinstance(v, (Mapping, *registry.config_types())) for v in config.values()
  )


def _given_configs(config) -> dict[str, Any]:
  if config is None:
    return {}
  if isinstance(config, Mapping) and _per_op(config):
    unknown = set(config) - set(OPS)
    if unknown:
      raise ValueError(f"config keys must be among {OPS}, got {sorted(unknown)}")
    return dict(config)
  return {op: config for op in OPS}


def resolve(
  config, backend: str, m: int, k: int, n: int, g: int, dtype, ops: tuple[str, ...] = OPS
) -> dict[str, Choice]:
  """The Choice of each of `ops` for the forward problem (m, k, n, g); dtype is a format
  of common.FORMATS (a quantized one resolves "fwd" alone).

  An explicit backend runs every op. "auto" falls back, op by op, to the registry's
  highest-priority backend that runs compiled on the device (registry.auto_backend); when
  one has knobs, each op first asks the active LUT on its own (Lut.query with no backend: the
  fastest correct entry at the nearest tuned shape, any backend that runs here, XLA
  included). A config object given for an op under "auto" runs on the backend it belongs
  to; a plain dict on the device's backend (the fallback with no op_priority).
  """
  given = _given_configs(config)
  dev = target.current()
  auto = _check_backend(backend) == "auto"
  dtype = lut_mod.canonical_dtype(dtype)
  # A quantized format falls back to a backend that computes it; a plain dtype to the device's
  # backend, which names the others when it lacks that dtype (check_dtype).
  fmt = dtype if ":" in dtype else None
  trains = fmt in TRAINING_FORMATS and "drhs" in ops
  # An op with no config takes its own fallback (Backend.op_priority); a plain dict holds the
  # device backend's knobs (the fallback of no op) for every op, as the README shows.
  fallback = dict.fromkeys(ops, backend)
  if auto:
    ranked = registry.auto_backends(dev.platform, dev.device_kind, dtype, trains=trains, ops=(None, *ops))
    fallback = {op: ranked[op if given.get(op) is None else None] for op in ops}
  tunable = any(registry.get(name).config_type is not None for name in fallback.values())
  table = lut_mod.active_lut() if auto and tunable else None
  if not tunable:  # no LUT asked; a broken RAGTUNE_LUT still shows
    lut_mod.check_unused_env_lut()
  reference = auto and registry.REFERENCE in fallback.values()
  why_none = _no_tunable_backend(dev.platform, dev.device_kind, fmt) if reference else ""
  out = {}
  for op in ops:
    cfg = given.get(op)
    name = (registry.backend_of_config(cfg) or fallback[op]) if auto else fallback[op]
    cfg = _as_config(name, op, cfg)
    if cfg is not None:
      choice = Choice(op, name, cfg, "explicit")
    else:
      e = table.query(op, m, k, n, g, dtype) if table is not None else None
      miss = table.nearest_rejected(op, m, k, n, g, dtype) if table is not None and e is None else None
      if e is not None and not registry.get(e.backend).runs_on(dev.platform, dev.device_kind, dtype):
        # e.g. a Hopper-only backend's entry when compiling for Blackwell
        e, miss = None, lut_mod.Rejection(e, f"{e.backend} does not run on {dev.device_kind!r}")
      if e is not None:
        choice = _from_entry(op, table, e, m, k, n, g)
      else:
        choice = _lut_or_default(op, name, m, k, n, g, dtype, miss)
        if choice.source == "none" and why_none:
          choice = dataclasses.replace(choice, why=why_none)
    registry.get(choice.backend).check_config(op, choice.config)
    out[op] = choice
  return out


def explain(
  lhs_shape, rhs_shape, dtype, *, transpose_rhs: bool = False, backend: str = "auto", quantize: str | None = None
) -> dict[str, Choice]:
  """What `ragged_dot(lhs, rhs, group_sizes, transpose_rhs=..., backend=...)` would run with
  config=None: per op ("fwd", "dlhs", "drhs"), the backend, the config and its source.

  lhs_shape (m, k); rhs_shape (g, k, n), or (g, n, k) with transpose_rhs; dtype the
  operands' dtype, or their quantized format ('float8_e4m3fn:block128', see kernels.quant),
  which runs "fwd" alone; with quantize (a training format, ragged_dot's quantize=), the
  three ops of that format. Uses the active LUT, as ragged_dot does.
  """
  lhs_shape, rhs_shape = tuple(lhs_shape), tuple(rhs_shape)
  if len(lhs_shape) != 2 or len(rhs_shape) != 3:
    raise ValueError(f"expected lhs_shape (m, k) and rhs_shape (g, k, n), got {lhs_shape} and {rhs_shape}")
  m, k = lhs_shape
  g, n = rhs_shape[0], rhs_shape[1] if transpose_rhs else rhs_shape[2]
  if g < 1:
    raise ValueError(f"rhs must hold at least one group (g >= 1), got shape {rhs_shape}")
  k_rhs = rhs_shape[2] if transpose_rhs else rhs_shape[1]
  if k != k_rhs:
    raise ValueError(
      f"contraction mismatch: lhs_shape {lhs_shape} vs rhs_shape {rhs_shape} (transpose_rhs={transpose_rhs})"
    )
  name = lut_mod.canonical_dtype(dtype)
  if quantize is not None:
    name = quant.check_training_format(quantize)
  if _check_backend(backend) != "auto":
    registry.check_dtype(backend, name, name, name)
  choices = resolve(None, backend, m, k, n, g, name, ops=OPS if quantize or ":" not in name else ("fwd",))
  for c in choices.values():
    registry.check_dtype(c.backend, name, name, name)
  if quantize is not None:
    _check_trains(choices["drhs"].backend, name)
  return choices


def _check_trains(backend: str, fmt: str) -> None:
  """TypeError unless `backend` computes fmt's weight gradient."""
  if registry.get(backend).grad_rhs_quantized is None:
    able = [b for b in registry.NAMES if registry.get(b).grad_rhs_quantized is not None]
    raise TypeError(f"backend {backend!r} runs {fmt} forward only; its weight gradient runs on {able}")


_logged: set = set()
# (op, m, k, n, g, dtype) of the far misses logged at INFO; bounded, so a process that keeps
# meeting new shapes stops logging them rather than growing it.
_misses_logged: set = set()
_MISSES_LOGGED_MAX = 1024


def _log_misses(choices: dict[str, Choice], m: int, k: int, n: int, g: int, dtype) -> None:
  """One INFO line the first time an op and shape runs its heuristic because every LUT entry
  of its op and dtype was rejected: a tuned shape's config on a problem of another regime
  would be a silent slowdown, and the heuristic instead is worth a word."""
  if not logger.isEnabledFor(logging.INFO):
    return
  name = lut_mod.canonical_dtype(dtype)
  for c in choices.values():
    key = (c.op, m, k, n, g, name)
    if c.rejected is None or key in _misses_logged or len(_misses_logged) >= _MISSES_LOGGED_MAX:
      continue
    _misses_logged.add(key)
    logger.info(
      "ragged_dot %s %s %s: %s; running %s's heuristic",
      c.op,
      lut_mod.shape_text(m, k, n, g),
      name,
      c.rejected,
      c.backend,
    )


def _log_choices(choices: dict[str, Choice], m: int, k: int, n: int, g: int, dtype) -> None:
  """One DEBUG line per distinct decision (shape, dtype, choices), not one per call."""
  if not logger.isEnabledFor(logging.DEBUG):
    return
  key = (m, k, n, g, lut_mod.canonical_dtype(dtype), tuple(choices.values()))
  if key in _logged:
    return
  _logged.add(key)
  logger.debug(
    "ragged_dot [%d,%d]x[%d,%d,%d] %s: %s",
    m,
    k,
    g,
    k,
    n,
    lut_mod.canonical_dtype(dtype),
    "; ".join(str(c) for c in choices.values()),
  )


# --- the three ops, each from its backend's folder (kernels/registry.py) ------------------


def forward(lhs, rhs, group_sizes, *, backend: str, **kw):
  """out[m,n]: grouped matmul of lhs [m,k] with rhs [g,k,n] ([g,n,k] if transpose_rhs).
  kw: config, out_dtype, transpose_rhs, group_offset, precision, interpret (Backend.forward),
  and lhs_scale, rhs_scale for quantized operands (kernels.quant)."""
  return registry.get(backend).forward(lhs, rhs, group_sizes, **kw)


def grad_lhs(dout, rhs, group_sizes, *, backend: str, transpose_rhs: bool = False, **kw):
  """dlhs[m,k] = dout[m,n] @ rhs[group]^T; reads rhs in place with the other layout."""
  own = registry.get(backend).grad_lhs
  if own is not None:
    return own(dout, rhs, group_sizes, transpose_rhs=transpose_rhs, **kw)
  return forward(dout, rhs, group_sizes, backend=backend, transpose_rhs=not transpose_rhs, **kw)


def grad_rhs(lhs, dout, group_sizes, *, backend: str, **kw):
  """drhs[g,k,n] = lhs[group]^T @ dout[group] (or [g,n,k] with transpose_rhs); the config
  is in the [g,k,n] frame. kw: num_groups and those of forward (Backend.grad_rhs)."""
  return registry.get(backend).grad_rhs(lhs, dout, group_sizes, **kw)


# --- observation (ragtune.capture) -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
  """One `ragged_dot` call as it is traced, for a tool that finds a step's calls
  (`observe`): "fwd", or "bwd" when its custom_vjp's backward (dlhs and drhs) is traced.
  m, k, n, g are the lookup's forward dims (g: rhs's groups); dtype the compute dtype or
  the quantized format; out_dtype the result's."""

  op: str
  m: int
  k: int
  n: int
  g: int
  dtype: str
  transpose_rhs: bool
  out_dtype: str
  group_offset: bool


Observer = Callable[[Call, Any, Any], tuple[Any, Any]]
_observer: contextvars.ContextVar[Observer | None] = contextvars.ContextVar("kernels_observer", default=None)


@contextlib.contextmanager
def observe(observer: Observer):
  """While tracing in this block, each call (and each backward traced) passes
  `observer(call, group_sizes, group_offset)` and computes with the (group_sizes,
  group_offset) it returns, the same values: a tool marks them in the traced program there.
  A function jit traced before the block is not traced again unless the tool makes it
  (jax.make_user_context)."""
  token = _observer.set(observer)
  try:
    yield
  finally:
    _observer.reset(token)


def _observed(op: str, dims: tuple[int, int, int, int], dtype: str, plan, group_sizes, group_offset):
  """(group_sizes, group_offset), through the observer when there is one; plan: the call's
  _Plan or _QuantPlan (transpose_rhs, out_dtype, has_offset)."""
  observer = _observer.get()
  if observer is None:
    return group_sizes, group_offset
  call = Call(op, *dims, dtype, plan.transpose_rhs, plan.out_dtype, plan.has_offset)
  return observer(call, group_sizes, group_offset)


def _scope():
  """Observed, a call's whole computation is named "kernels.ragged_dot" in the traced
  program, so that a tool tells its inner ops (XLA's ragged_dot on the xla backend) from the
  model's own."""
  return jax.named_scope(SCOPE) if _observer.get() is not None else contextlib.nullcontext()


SCOPE = "kernels.ragged_dot"


# --- differentiation ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
  backends: tuple[str, str, str]  # per op, in OPS order
  fwd: KernelConfig | None
  dlhs: KernelConfig | None
  drhs: KernelConfig | None
  transpose_rhs: bool
  precision: Any
  out_dtype: str
  compute_dtype: str
  interpret: tuple[Any, Any, Any]  # per op, in OPS order
  has_offset: bool
  vma: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # lhs's and rhs's manual axes they vary over (shard_map)

  def common(self, op: str, group_offset) -> dict[str, Any]:
    i = OPS.index(op)
    return dict(
      backend=self.backends[i],
      config=getattr(self, op),
      transpose_rhs=self.transpose_rhs,
      precision=self.precision,
      interpret=self.interpret[i],
      group_offset=group_offset if self.has_offset else None,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ragged_dot(lhs, rhs, group_sizes, group_offset, plan: _Plan):
  return forward(lhs, rhs, group_sizes, out_dtype=plan.out_dtype, **plan.common("fwd", group_offset))


def _ragged_dot_fwd(lhs, rhs, group_sizes, group_offset, plan):
  return _ragged_dot(lhs, rhs, group_sizes, group_offset, plan), (lhs, rhs, group_sizes, group_offset)


def _ragged_dot_bwd(plan, residuals, dout):
  with _scope():
    return _backward(plan, residuals, dout)


def _backward(plan, residuals, dout):
  lhs, rhs, group_sizes, group_offset = residuals
  dims = (*lhs.shape, rhs.shape[1] if plan.transpose_rhs else rhs.shape[2], rhs.shape[0])
  # residuals hold a zero offset where none was given: the observer sees what the call got
  given = group_offset if plan.has_offset else None
  group_sizes, offset = _observed("bwd", dims, plan.compute_dtype, plan, group_sizes, given)
  group_offset = offset if plan.has_offset else group_offset
  dout = dout.astype(plan.compute_dtype)
  dlhs = grad_lhs(dout, rhs, group_sizes, out_dtype=plan.compute_dtype, **plan.common("dlhs", group_offset))
  drhs = grad_rhs(
    lhs, dout, group_sizes, num_groups=rhs.shape[0], out_dtype=plan.compute_dtype, **plan.common("drhs", group_offset)
  )
  dlhs, drhs = _summed_over(dlhs, plan.vma[0]), _summed_over(drhs, plan.vma[1])
  return dlhs.astype(lhs.dtype), drhs.astype(rhs.dtype), None, None


def _vma(x) -> tuple[str, ...]:
  """The shard_map axes x varies over (its type's manual_axis_type in jax 0.10-0.12)."""
  mat = getattr(jax.typeof(x), "manual_axis_type", None)
  return tuple(sorted(getattr(mat, "varying", None) or ()))


def _summed_over(ct, vma: tuple[str, ...]):
  """Under shard_map, an operand the same on every rank (lhs of an expert-parallel layer whose
  ranks each multiply all rows) has a cotangent that varies over ranks: its gradient is the sum
  of theirs, as jax's own transpose of an implicit pvary."""
  extra = tuple(a for a in _vma(ct) if a not in vma)
  return jax.lax.psum(ct, extra) if extra else ct


_ragged_dot.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


def ragged_dot(
  lhs,
  rhs,
  group_sizes,
  precision=None,
  preferred_element_type=None,
  *,
  transpose_rhs: bool = False,
  group_offset=None,
  lhs_scale=None,
  rhs_scale=None,
  quantize: str | None = None,
  rhs_quantized=None,
  backend: str = "auto",
  config: KernelConfig | Mapping[str, Any] | None = None,
  interpret: bool | None = None,
):
  """Grouped matmul with the semantics of `jax.lax.ragged_dot`, differentiable in lhs and rhs.

  lhs [m,k]; rhs [g,k,n] (or [g,n,k] with transpose_rhs); group_sizes int32 [g]. Rows of
  group i are multiplied by rhs[i]; rows past sum(group_sizes) come out 0.

  group_offset: int32 scalar for expert parallelism. rhs then holds groups
    [group_offset, group_offset + rhs.shape[0]) of the len(group_sizes) groups, and rows
    of every other group come out 0.
  backend: a name in kernels.registry.NAMES, or "auto": each op (fwd, dlhs, drhs) from
    the active LUT, else the device's default backend (the Pallas kernels of a GPU or
    TPU, XLA elsewhere). See resolve.
  config: None (the active LUT, else a heuristic), one config for all three ops, or a
    mapping {"fwd", "dlhs", "drhs"} -> config. Configs are the backends' config types
    (TritonConfig, MosaicConfig, TpuConfig), or plain dicts of their fields as a LUT
    stores them. `kernels.explain` says what None picks.
  interpret: run a kernel backend in interpret mode; None means "when the backend's
    platform is not the device's". Mosaic GPU also takes jax's InterpretGPUParams.
  lhs_scale, rhs_scale: float32 scales of quantized lhs and rhs (both float8_e4m3fn, or
    both int8); their shapes name the scheme (kernels.quant): [m, 1] and [g, 1, n] per token
    and per expert column, or [m, ceil(k/128)] and [g, ceil(k/128), ceil(n/128)] per 1x128
    and 128x128 block, in the [g, k, n] frame also with transpose_rhs. The result is that
    of the dequantized operands, in bfloat16 unless preferred_element_type says otherwise.
    Forward only: differentiating it raises (use quantize= to train).
  quantize: a training format (kernels.quant.TRAINING_FORMATS, "float8_e4m3fn:block128"):
    lhs and rhs in a float dtype are quantized on each call as DeepSeek-V3 trains (1x128
    activation blocks, 128x128 weight blocks), and the forward and both gradients run on fp8
    kernels (dlhs: dout in 1x128 blocks times the weights' blocks transposed; drhs: lhs and
    dout in 128-token blocks per group, kernels.quant.token_blocks). Differentiable in lhs and
    rhs; the result is in lhs's dtype unless preferred_element_type says otherwise. With rhs
    already quantized (float8_e4m3fn values and rhs_scale, as a checkpoint ships them) only
    lhs is quantized, and the weights are constants: their cotangents are zeros and no drhs
    runs (frozen fp8 experts, e.g. under adapters).
  rhs_quantized: with quantize=, rhs quantized by kernels.quant.training_weights (with the
    call's transpose_rhs), made once per optimizer step: fwd and dlhs
    read it instead of quantizing rhs on every call (about 3 bytes moved a weight), and the
    gradient still goes to rhs.
  """
  _check_shapes(lhs, rhs, group_sizes, transpose_rhs, group_offset)
  _check_backend(backend)
  if quantize is not None:
    return _trained(
      lhs,
      rhs,
      group_sizes,
      lhs_scale,
      rhs_scale,
      fmt=quantize,
      precision=precision,
      out_dtype=preferred_element_type,
      transpose_rhs=transpose_rhs,
      group_offset=group_offset,
      backend=backend,
      config=config,
      interpret=interpret,
      rhs_quantized=rhs_quantized,
    )
  if rhs_quantized is not None:
    raise ValueError("rhs_quantized is fp8 training's copy of the weights: pass quantize= too")
  if lhs_scale is not None or rhs_scale is not None:
    return _quantized(
      lhs,
      rhs,
      group_sizes,
      lhs_scale,
      rhs_scale,
      precision=precision,
      out_dtype=preferred_element_type or jnp.bfloat16,
      transpose_rhs=transpose_rhs,
      group_offset=group_offset,
      backend=backend,
      config=config,
      interpret=interpret,
    )
  if jnp.dtype(lhs.dtype).name in QUANT_DTYPES or jnp.dtype(rhs.dtype).name in QUANT_DTYPES:
    raise TypeError(
      f"{lhs.dtype} x {rhs.dtype} operands need lhs_scale and rhs_scale (see kernels.quant); "
      "for unscaled values, cast them to bfloat16 first"
    )
  out_dtype = jax.eval_shape(
    functools.partial(jax.lax.ragged_dot, preferred_element_type=preferred_element_type),
    jax.ShapeDtypeStruct(lhs.shape, lhs.dtype),
    jax.ShapeDtypeStruct((rhs.shape[0], lhs.shape[1], rhs.shape[1] if transpose_rhs else rhs.shape[2]), rhs.dtype),
    jax.ShapeDtypeStruct((rhs.shape[0],), jnp.int32),
  ).dtype
  compute_dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
  if backend != "auto":
    registry.check_dtype(backend, lhs.dtype, rhs.dtype, compute_dtype.name)
  m, k = lhs.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  choices = resolve(config, backend, m, k, n, rhs.shape[0], compute_dtype)
  _log_choices(choices, m, k, n, rhs.shape[0], compute_dtype)
  _log_misses(choices, m, k, n, rhs.shape[0], compute_dtype)
  names = tuple(choices[op].backend for op in OPS)
  for name in set(names):  # "auto" may pick a backend per op; each must take the dtype
    registry.check_dtype(name, lhs.dtype, rhs.dtype, compute_dtype.name)
  modes = tuple(default_interpret(name) if interpret is None else interpret for name in names)
  compiled = {name for name, mode in zip(names, modes) if not mode}
  if compiled:
    dev = target.current()
    for name in compiled:
      registry.check_device(name, dev.platform, dev.device_kind, compute_dtype.name)
  plan = _Plan(
    names,
    choices["fwd"].config,
    choices["dlhs"].config,
    choices["drhs"].config,
    bool(transpose_rhs),
    _canonical_precision(precision),
    jnp.dtype(out_dtype).name,
    compute_dtype.name,
    modes,
    group_offset is not None,
    (_vma(lhs), _vma(rhs)),
  )
  with _scope():
    group_sizes, group_offset = _observed(
      "fwd", (m, k, n, rhs.shape[0]), compute_dtype.name, plan, group_sizes, group_offset
    )
    offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
    return _ragged_dot(
      lhs.astype(compute_dtype), rhs.astype(compute_dtype), group_sizes.astype(jnp.int32), offset, plan
    )


# --- quantized operands (forward only) ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _QuantPlan:
  backend: str
  config: KernelConfig | None
  transpose_rhs: bool
  precision: Any
  out_dtype: str
  interpret: Any
  has_offset: bool


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _quantized_call(lhs, rhs, group_sizes, group_offset, lhs_scale, rhs_scale, plan: _QuantPlan):
  return forward(
    lhs,
    rhs,
    group_sizes,
    backend=plan.backend,
    config=plan.config,
    out_dtype=plan.out_dtype,
    transpose_rhs=plan.transpose_rhs,
    group_offset=group_offset if plan.has_offset else None,
    precision=plan.precision,
    interpret=plan.interpret,
    lhs_scale=lhs_scale,
    rhs_scale=rhs_scale,
  )


def _quantized_fwd(lhs, rhs, group_sizes, group_offset, lhs_scale, rhs_scale, plan):
  return _quantized_call(lhs, rhs, group_sizes, group_offset, lhs_scale, rhs_scale, plan), None


def _quantized_bwd(plan, residuals, dout):
  raise NotImplementedError(
    "ragged_dot with quantized operands (lhs_scale/rhs_scale) is forward only: differentiate a "
    "bfloat16 ragged_dot, or stop the gradient at the quantized weights"
  )


_quantized_call.defvjp(_quantized_fwd, _quantized_bwd)


def _quantized(
  lhs,
  rhs,
  group_sizes,
  lhs_scale,
  rhs_scale,
  *,
  precision,
  out_dtype,
  transpose_rhs,
  group_offset,
  backend,
  config,
  interpret,
):
  lhs_scale = lhs_scale if lhs_scale is None else jnp.asarray(lhs_scale)
  rhs_scale = rhs_scale if rhs_scale is None else jnp.asarray(rhs_scale)
  fmt = quant.check(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs)
  out_dtype = jnp.dtype(out_dtype)
  if out_dtype.name not in quant.OUTPUT_ROUNDOFF:
    raise TypeError(f"quantized ragged_dot outputs one of {tuple(quant.OUTPUT_ROUNDOFF)}, got {out_dtype.name}")
  m, k = lhs.shape
  g = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  choice = resolve(config, backend, m, k, n, g, fmt, ops=("fwd",))["fwd"]
  _log_choices({"fwd": choice}, m, k, n, g, fmt)
  _log_misses({"fwd": choice}, m, k, n, g, fmt)
  registry.check_dtype(choice.backend, lhs.dtype, rhs.dtype, fmt)
  mode = default_interpret(choice.backend) if interpret is None else interpret
  if not mode:
    dev = target.current()
    registry.check_device(choice.backend, dev.platform, dev.device_kind, fmt)
  plan = _QuantPlan(
    choice.backend,
    choice.config,
    bool(transpose_rhs),
    _canonical_precision(precision),
    out_dtype.name,
    mode,
    group_offset is not None,
  )
  with _scope():
    group_sizes, group_offset = _observed("fwd", (m, k, n, g), fmt, plan, group_sizes, group_offset)
    offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
    return _quantized_call(
      lhs,
      rhs,
      group_sizes.astype(jnp.int32),
      offset,
      lhs_scale.astype(jnp.float32),
      rhs_scale.astype(jnp.float32),
      plan,
    )


# --- fp8 training (quantize=): the three matmuls of DeepSeek-V3's recipe -------------------


@dataclasses.dataclass(frozen=True)
class _TrainPlan:
  fmt: str
  backends: tuple[str, ...]  # per op of `ops`
  configs: tuple[KernelConfig | None, ...]
  interpret: tuple[Any, ...]
  ops: tuple[str, ...]  # OPS; frozen weights: fwd and dlhs
  transpose_rhs: bool
  out_dtype: str
  grad_dtype: str  # dlhs's kernel output: lhs's dtype, or f32
  rhs_dtype: str  # rhs's, its cotangent's (drhs's kernel outputs _kernel_out of it)
  has_offset: bool
  frozen: bool
  cached: bool  # rhs_quantized: fwd and dlhs read the caller's fp8 copy of rhs
  vma: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

  def of(self, op: str, group_offset) -> dict[str, Any]:
    """train_op's keywords for `op`, but its operands and out_dtype."""
    i = self.ops.index(op)
    return dict(
      fmt=self.fmt,
      backend=self.backends[i],
      config=self.configs[i],
      interpret=self.interpret[i],
      transpose_rhs=self.transpose_rhs,
      group_offset=group_offset if self.has_offset else None,
    )


def train_op(
  op: str,
  a,
  b,
  group_sizes,
  *,
  fmt: str,
  backend: str,
  config=None,
  out_dtype,
  transpose_rhs: bool = False,
  group_offset=None,
  interpret=False,
  rhs_scale=None,
  rhs_other=None,
  num_groups: int | None = None,
):
  """One op of fp8 training (ragged_dot's quantize=) on float operands, quantized by the
  format's recipe, then run on `backend`: "fwd" a = lhs [m,k], b = rhs [g,k,n] ([g,n,k] with
  transpose_rhs) -> [m,n]; "dlhs" a = dout [m,n], b = rhs -> [m,k]; "drhs" a = lhs, b = dout
  -> [g,k,n] ([g,n,k]) for num_groups groups from group_offset (default: all of group_sizes).
  rhs may come quantized, with its rhs_scale ([g,k,n] frame; fwd and dlhs), and rhs_other, its
  values in the other layout, which a backend that reads fp8 weights k-major takes instead of
  copying them (quant.training_weights). config None: the
  active LUT's, else the backend's default. The custom_vjp runs these, and a sweep times and
  checks them."""
  dtype = element_dtype(quant.check_training_format(fmt))
  if config is None and registry.get(backend).config_type is not None:  # the LUT's, else the default
    rows, cols = a.shape[0], b.shape[1] if op == "drhs" else (b.shape[1] if transpose_rhs else b.shape[2])
    g = (num_groups or group_sizes.shape[0]) if op == "drhs" else b.shape[0]
    k = a.shape[1] if op != "dlhs" else (b.shape[2] if transpose_rhs else b.shape[1])
    n = cols if op != "dlhs" else a.shape[1]
    config = resolve(None, backend, rows, k, n, g, fmt, ops=(op,))[op].config
  kw = dict(backend=backend, config=config, interpret=interpret)
  rows_pass, tokens_pass = _activation_passes(backend, fmt, interpret)
  if op == "drhs":
    m = a.shape[0]
    g = group_sizes.shape[0] if num_groups is None else num_groups
    # lhs and dout in 128-token blocks of one group each (quant.token_blocks); the token axis
    # holds the local groups only, so group_offset is spent here.
    blocks = quant.token_blocks(group_sizes, m, group_offset, g)
    a_t, a_s = tokens_pass(a, blocks, dtype)
    b_t, b_s = tokens_pass(b, blocks, dtype)
    grad = registry.get(kw.pop("backend")).grad_rhs_quantized
    return grad(a_t, b_t, a_s, b_s, blocks.first, blocks.count, out_dtype=out_dtype, transpose_rhs=transpose_rhs, **kw)
  if rhs_scale is None:
    tw = quant.training_weights(b, dtype, transpose_rhs=transpose_rhs, both_layouts=registry.get(backend).k_major_fp8)
    b, rhs_scale, rhs_other = tw.values, tw.scales, tw.other
  # a in 1x128 blocks along its contraction; dlhs reads the weights' 128x128 blocks transposed,
  # as they are (no requantization).
  aq, a_s = rows_pass(a, dtype)
  rs, kernel_t = (rhs_scale, transpose_rhs) if op == "fwd" else (rhs_scale.swapaxes(1, 2), not transpose_rhs)
  if registry.get(backend).k_major_fp8 and not kernel_t and rhs_other is not None:
    b, kernel_t = rhs_other, True
  return forward(
    aq,
    b,
    group_sizes,
    lhs_scale=a_s,
    rhs_scale=rs,
    out_dtype=out_dtype,
    transpose_rhs=kernel_t,
    group_offset=group_offset,
    precision=None,
    **kw,
  )


def _activation_passes(backend: str, fmt: str, interpret):
  """(rows, tokens): fp8 training's activation quantizers. A kernel backend compiled for a
  device with single-pass ones (registry.activation_quantizer) runs those; XLA's path, and
  anything interpreted, runs kernels.quant's XLA passes. Both give the same values."""
  dev = target.current()
  fused = (
    None
    if interpret or not registry.get(backend).own_kernels
    else registry.activation_quantizer(dev.platform, dev.device_kind, fmt)
  )
  if fused is None:
    return (lambda x, dtype: quant.quantize(x, dtype, (1, quant.BLOCK))), quant.quantize_tokens
  return fused.quantize_rows, fused.quantize_tokens


def _train_forward(lhs, rhs, group_sizes, group_offset, rhs_scale, cached, plan: _TrainPlan):
  if plan.frozen:
    rq, rs, other = rhs, rhs_scale, None
  elif cached is not None:  # the caller's fp8 copy of rhs (rhs_quantized)
    rq, rs, other = cached.values, cached.scales, cached.other
  else:  # quantized once, for the forward and the backward's dlhs, in the layouts they read
    k_major = any(registry.get(plan.backends[plan.ops.index(op)]).k_major_fp8 for op in ("fwd", "dlhs"))
    tw = quant.training_weights(rhs, plan.fmt, transpose_rhs=plan.transpose_rhs, both_layouts=k_major)
    rq, rs, other = tw.values, tw.scales, tw.other
  kw = plan.of("fwd", group_offset)
  out = train_op("fwd", lhs, rq, group_sizes, rhs_scale=rs, rhs_other=other, out_dtype=plan.out_dtype, **kw)
  return out, (lhs, rq, rs, other, group_sizes, group_offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _train_call(lhs, rhs, group_sizes, group_offset, rhs_scale, cached, plan: _TrainPlan):
  return _train_forward(lhs, rhs, group_sizes, group_offset, rhs_scale, cached, plan)[0]


def _train_bwd(plan: _TrainPlan, residuals, dout):
  with _scope():
    return _train_backward(plan, residuals, dout)


def _train_backward(plan: _TrainPlan, residuals, dout):
  lhs, rq, rs, other, group_sizes, group_offset = residuals
  m, k = lhs.shape
  g = rq.shape[0]
  n = rq.shape[1] if plan.transpose_rhs else rq.shape[2]
  given = group_offset if plan.has_offset else None
  group_sizes, offset = _observed("bwd", (m, k, n, g), plan.fmt, plan, group_sizes, given)
  group_offset = offset if plan.has_offset else group_offset
  dlhs = train_op(
    "dlhs",
    dout,
    rq,
    group_sizes,
    rhs_scale=rs,
    rhs_other=other,
    out_dtype=plan.grad_dtype,
    **plan.of("dlhs", group_offset),
  )
  dlhs = _summed_over(dlhs, plan.vma[0]).astype(lhs.dtype)
  if plan.frozen:
    return dlhs, jnp.zeros_like(rq), None, None, jnp.zeros_like(rs), None
  # rhs_quantized's copy is a constant: the gradient goes to rhs, whose values it stands for.
  cached_ct = (
    None if not plan.cached else jax.tree.map(jnp.zeros_like, quant.TrainingWeights(rq, rs, other, plan.transpose_rhs))
  )
  drhs = train_op(
    "drhs", lhs, dout, group_sizes, num_groups=g, out_dtype=_kernel_out(plan.rhs_dtype), **plan.of("drhs", group_offset)
  )
  return dlhs, _summed_over(drhs, plan.vma[1]).astype(plan.rhs_dtype), None, None, None, cached_ct


_train_call.defvjp(_train_forward, _train_bwd)


def _kernel_out(dtype) -> str:
  """A gradient kernel's output dtype for an operand of `dtype`: its own, or float32."""
  name = jnp.dtype(dtype).name
  return name if name in quant.OUTPUT_ROUNDOFF else "float32"


def _float_operand(name: str, x) -> None:
  if not jnp.issubdtype(x.dtype, jnp.floating) or jnp.dtype(x.dtype).name in QUANT_DTYPES:
    raise TypeError(f"quantize= takes {name} in a float dtype (bfloat16, float16 or float32), got {x.dtype}")


def _check_rhs_quantized(rhs_quantized, rhs, frozen: bool, fmt: str, transpose_rhs: bool, k: int, n: int):
  """rhs_quantized with float32 scales, or a clear error."""
  if frozen:
    raise ValueError("rhs_quantized is the fp8 copy of float weights; with rhs_scale, rhs is already quantized")
  make = f"kernels.quant.training_weights(rhs, {fmt!r}, transpose_rhs={transpose_rhs})"
  if not isinstance(rhs_quantized, quant.TrainingWeights):
    raise TypeError(f"rhs_quantized takes what {make} returns, got {type(rhs_quantized).__name__}")
  tw = rhs_quantized
  if tw.transpose_rhs != transpose_rhs:
    raise ValueError(
      f"rhs_quantized was made with transpose_rhs={tw.transpose_rhs}, the call has {transpose_rhs}: {make}"
    )
  want = quant.scale_shapes(common_scheme(fmt), 1, k, n, rhs.shape[0])[1]
  other = rhs.shape[:1] + rhs.shape[:0:-1]
  if (
    jnp.dtype(tw.values.dtype).name != element_dtype(fmt)
    or tw.values.shape != rhs.shape
    or tw.scales.shape != want
    or (tw.other is not None and (tw.other.dtype != tw.values.dtype or tw.other.shape != other))
  ):
    got = [None if t is None else f"{t.dtype}{list(t.shape)}" for t in (tw.values, tw.scales, tw.other)]
    raise TypeError(
      f"rhs_quantized takes {element_dtype(fmt)} values {list(rhs.shape)}, scales {list(want)} and values in the "
      f"other layout {list(other)} or None ({make}); got {got}"
    )
  return quant.TrainingWeights(tw.values, tw.scales.astype(jnp.float32), tw.other, transpose_rhs)


def _trained(
  lhs,
  rhs,
  group_sizes,
  lhs_scale,
  rhs_scale,
  *,
  fmt,
  precision,
  out_dtype,
  transpose_rhs,
  group_offset,
  backend,
  config,
  interpret,
  rhs_quantized=None,
):
  del precision  # the format sets it
  fmt = quant.check_training_format(fmt)
  dtype = element_dtype(fmt)
  if lhs_scale is not None:
    raise ValueError("quantize= quantizes lhs itself: pass lhs in a float dtype, without lhs_scale")
  _float_operand("lhs", lhs)
  m, k = lhs.shape
  g = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  frozen = rhs_scale is not None
  if frozen:
    rhs_scale = jnp.asarray(rhs_scale)
    want = quant.scale_shapes(common_scheme(fmt), m, k, n, g)[1]
    floating = jnp.issubdtype(rhs_scale.dtype, jnp.floating)
    if jnp.dtype(rhs.dtype).name != dtype or tuple(rhs_scale.shape) != want or not floating:
      raise TypeError(
        f"quantize={fmt!r} with rhs_scale takes rhs as {dtype} values and a float32 rhs_scale {list(want)} (the "
        f"[g,k,n] frame), got rhs {rhs.dtype} and rhs_scale {rhs_scale.dtype}{list(rhs_scale.shape)}"
      )
    rhs_scale = rhs_scale.astype(jnp.float32)
  else:
    _float_operand("rhs", rhs)
  if rhs_quantized is not None:
    rhs_quantized = _check_rhs_quantized(rhs_quantized, rhs, frozen, fmt, transpose_rhs, k, n)
  out_dtype = jnp.dtype(out_dtype or lhs.dtype)
  if out_dtype.name not in quant.OUTPUT_ROUNDOFF:
    raise TypeError(f"quantized ragged_dot outputs one of {tuple(quant.OUTPUT_ROUNDOFF)}, got {out_dtype.name}")
  ops = OPS[:2] if frozen else OPS
  choices = resolve(config, backend, m, k, n, g, fmt, ops=ops)
  _log_choices(choices, m, k, n, g, fmt)
  _log_misses(choices, m, k, n, g, fmt)
  names = tuple(choices[op].backend for op in ops)
  for op, name in zip(ops, names):
    registry.check_dtype(name, dtype, dtype, fmt)
    if op == "drhs":
      _check_trains(name, fmt)
  modes = tuple(default_interpret(name) if interpret is None else interpret for name in names)
  dev = target.current()
  for name, mode in zip(names, modes):
    if not mode:
      registry.check_device(name, dev.platform, dev.device_kind, fmt)
  plan = _TrainPlan(
    fmt,
    names,
    tuple(choices[op].config for op in ops),
    modes,
    ops,
    bool(transpose_rhs),
    out_dtype.name,
    _kernel_out(lhs.dtype),
    jnp.dtype(rhs.dtype).name,
    group_offset is not None,
    frozen,
    rhs_quantized is not None,
    (_vma(lhs), _vma(rhs)),
  )
  with _scope():
    group_sizes, group_offset = _observed("fwd", (m, k, n, g), fmt, plan, group_sizes, group_offset)
    offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
    return _train_call(lhs, rhs, group_sizes.astype(jnp.int32), offset, rhs_scale, rhs_quantized, plan)
