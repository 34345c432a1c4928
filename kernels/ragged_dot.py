"""The public op: `ragged_dot`, its three constituent ops, and the custom_vjp tying them.

  forward   out  = gmm(lhs, rhs)                 [m,k] x [g,k,n] -> [m,n]
  grad_lhs  dlhs = gmm(dout, rhs, transposed)    [m,n] x [g,k,n]^T -> [m,k]  (no copy of rhs^T)
  grad_rhs  drhs = tgmm(lhs, dout)               per group lhs^T dout -> [g,k,n]

Each is tuned on its own, so each takes its own config ("fwd", "dlhs", "drhs").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from kernels import gpu_gmm, gpu_tgmm, tpu_gmm, xla
from kernels import lut as lut_mod
from kernels.config import BACKENDS, CONFIG_TYPES, OPS, Config, config_from_dict, default_config

logger = logging.getLogger("kernels")

# Input dtypes each Pallas backend computes in (megablox/TPU has no float16 matmul).
PALLAS_DTYPES = {"pallas_gpu": ("bfloat16", "float16", "float32"), "pallas_tpu": ("bfloat16", "float32")}


# --- argument handling ----------------------------------------------------------------

def resolve_backend(backend: str) -> str:
  if backend == "auto":
    platform = jax.default_backend()
    if platform in ("gpu", "cuda", "rocm"):
      return "pallas_gpu"
    if platform == "tpu":
      return "pallas_tpu"
    return "xla"
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")
  return backend


def default_interpret(backend: str) -> bool:
  """Interpret a Pallas backend when its hardware is not the default device."""
  platform = jax.default_backend()
  if backend == "pallas_gpu":
    return platform not in ("gpu", "cuda", "rocm")
  if backend == "pallas_tpu":
    return platform != "tpu"
  return False


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
    raise ValueError(f"contraction mismatch: lhs.shape[1]={lhs.shape[1]} but {axis}={k_rhs}"
                     f" (transpose_rhs={transpose_rhs})")
  g_total, g_local = group_sizes.shape[0], rhs.shape[0]
  if g_local < 1:
    raise ValueError(f"rhs must hold at least one group (g >= 1), got shape {rhs.shape}")
  if group_offset is None and g_total != g_local:
    raise ValueError(f"group count mismatch: group_sizes has {g_total} groups but rhs has {g_local}"
                     " (pass group_offset when rhs holds a shard of the groups)")
  if group_offset is not None:
    if g_total < g_local:
      raise ValueError(f"group_sizes has {g_total} groups, fewer than rhs's {g_local}")
    if getattr(group_offset, "ndim", np.ndim(group_offset)) != 0:
      raise ValueError(f"group_offset must be an int32 scalar, got shape {np.shape(group_offset)}")
    if not jnp.issubdtype(jnp.result_type(group_offset), jnp.integer):
      raise TypeError(f"group_offset must be an integer scalar, got {jnp.result_type(group_offset)}")


def _check_config(backend: str, op: str, cfg: Any) -> None:
  if backend == "xla":
    if cfg is not None:
      raise TypeError(f"config[{op!r}] must be None for backend 'xla' (it has no knobs), got {cfg!r}")
    return
  expected = CONFIG_TYPES[backend]
  if not isinstance(cfg, expected):
    raise TypeError(f"config[{op!r}] must be a {expected.__name__} for backend {backend!r}, got {cfg!r}")


@dataclasses.dataclass(frozen=True)
class Choice:
  """What `ragged_dot` runs for one op, and where that config came from.

  source: "lut-exact" (an entry for this very (m, k, n, g)), "lut-nearest" (the closest
    tuned shape, in `tuned_shape`, at `distance` by the rule of `Lut.nearest`),
    "heuristic" (`default_config`), "explicit" (passed as config=), or "none" (the xla
    backend has no knobs).
  """

  op: str
  backend: str
  config: Config | None
  source: str
  tuned_shape: tuple[int, int, int, int] | None = None  # the LUT entry's forward (m, k, n, g)
  distance: float | None = None
  lut: str | None = None  # the LUT's file, when it has one

  def __str__(self) -> str:
    where = self.source
    if self.source == "lut-nearest":
      m, k, n, g = self.tuned_shape
      where += f" (tuned [{m},{k}]x[{g},{k},{n}], distance {self.distance:.3g})"
    return f"{self.op}: {self.backend} {self.config if self.config is not None else '(no config)'} <- {where}"


def choose_config(op: str, backend: str, m: int, k: int, n: int, g: int, dtype: Any) -> Choice:
  """The config `ragged_dot` uses for `op` when none is given, with its source."""
  if backend == "xla":
    return Choice(op, backend, None, "none")
  dt = lut_mod.canonical_dtype(dtype)
  table = lut_mod.active_lut()
  e = table.nearest(op, m, k, n, g, dt, backend=backend) if table is not None else None
  if e is None:
    heuristic = default_config(backend, op, dt, m, k, n, g, device_kind=lut_mod.current_device_kind())
    return Choice(op, backend, heuristic, "heuristic")
  d = lut_mod.shape_distance(e, m, k, n, g)
  exact = (e.m, e.k, e.n, e.g) == (m, k, n, g)
  return Choice(op, backend, e.config, "lut-exact" if exact else "lut-nearest", (e.m, e.k, e.n, e.g), d,
                table.source)


def select_config(op: str, backend: str, m: int, k: int, n: int, g: int, dtype: Any) -> Config | None:
  """The config `ragged_dot` uses for `op` when none is given: LUT, else heuristic."""
  return choose_config(op, backend, m, k, n, g, dtype).config


def _as_config(backend: str, op: str, cfg: Any) -> Any:
  """A plain dict (as a LUT stores it) becomes the backend's config type."""
  if not isinstance(cfg, Mapping):
    return cfg
  if backend == "xla":
    if cfg:
      raise TypeError(f"config[{op!r}] must be None or {{}} for backend 'xla' (it has no knobs), got {cfg!r}")
    return None
  try:
    return config_from_dict(backend, dict(cfg))
  except (TypeError, ValueError) as e:
    raise type(e)(f"config[{op!r}]: {e}") from None


def _per_op(config: Mapping) -> bool:
  """{op: config} rather than one config as a dict: keys are ops, or values are configs."""
  return set(config) <= set(OPS) or any(v is None or isinstance(v, (Mapping, *CONFIG_TYPES.values()))
                                        for v in config.values())


def resolve_choices(config, backend: str, m: int, k: int, n: int, g: int, dtype) -> dict[str, Choice]:
  if config is None:
    given = {}
  elif isinstance(config, Mapping) and _per_op(config):
    unknown = set(config) - set(OPS)
    if unknown:
      raise ValueError(f"config keys must be among {OPS}, got {sorted(unknown)}")
    given = dict(config)
  else:
    given = {op: config for op in OPS}
  out = {}
  for op in OPS:
    cfg = _as_config(backend, op, given.get(op))
    choice = Choice(op, backend, cfg, "explicit") if cfg is not None else choose_config(op, backend, m, k, n, g, dtype)
    _check_config(backend, op, choice.config)
    out[op] = choice
  return out


def resolve_configs(config, backend: str, m: int, k: int, n: int, g: int, dtype) -> dict[str, Config | None]:
  return {op: c.config for op, c in resolve_choices(config, backend, m, k, n, g, dtype).items()}


def _check_dtype(backend: str, compute_dtype) -> None:
  if backend != "xla" and jnp.dtype(compute_dtype).name not in PALLAS_DTYPES[backend]:
    raise TypeError(f"backend {backend!r} supports lhs/rhs dtypes {PALLAS_DTYPES[backend]}, got "
                    f"{jnp.dtype(compute_dtype).name}; use backend='xla'")


def explain(lhs_shape, rhs_shape, dtype, *, transpose_rhs: bool = False, backend: str = "auto") -> dict[str, Choice]:
  """What `ragged_dot(lhs, rhs, group_sizes, transpose_rhs=..., backend=...)` would run with
  config=None: per op ("fwd", "dlhs", "drhs"), the backend, the config and its source.

  lhs_shape (m, k); rhs_shape (g, k, n), or (g, n, k) with transpose_rhs; dtype the
  operands' dtype. Uses the active LUT, as ragged_dot does.
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
    raise ValueError(f"contraction mismatch: lhs_shape {lhs_shape} vs rhs_shape {rhs_shape} (transpose_rhs={transpose_rhs})")
  backend = resolve_backend(backend)
  _check_dtype(backend, dtype)
  return resolve_choices(None, backend, m, k, n, g, dtype)


_logged: set = set()


def _log_choices(choices: dict[str, Choice], m: int, k: int, n: int, g: int, dtype) -> None:
  """One DEBUG line per distinct decision (shape, dtype, choices), not one per call."""
  if not logger.isEnabledFor(logging.DEBUG):
    return
  key = (m, k, n, g, jnp.dtype(dtype).name, tuple(choices.values()))
  if key in _logged:
    return
  _logged.add(key)
  logger.debug("ragged_dot [%d,%d]x[%d,%d,%d] %s: %s", m, k, g, k, n, jnp.dtype(dtype).name,
               "; ".join(str(c) for c in choices.values()))


# --- the three ops, per backend -------------------------------------------------------

def forward(lhs, rhs, group_sizes, *, backend: str, config: Config | None, out_dtype,
            transpose_rhs: bool = False, group_offset=None, precision=None, interpret: bool = False):
  """out[m,n]: grouped matmul of lhs [m,k] with rhs [g,k,n] ([g,n,k] if transpose_rhs)."""
  if backend == "pallas_gpu":
    return gpu_gmm.gmm(lhs, rhs, group_sizes, config=config, out_dtype=out_dtype,
                       transpose_rhs=transpose_rhs, group_offset=group_offset,
                       precision=precision, interpret=interpret)
  if backend == "pallas_tpu":
    return tpu_gmm.gmm(lhs, rhs, group_sizes, config=config, out_dtype=out_dtype,
                       transpose_rhs=transpose_rhs, group_offset=group_offset, interpret=interpret)
  return xla.gmm(lhs, rhs, group_sizes, out_dtype=out_dtype, transpose_rhs=transpose_rhs,
                 group_offset=group_offset, precision=precision)


def grad_lhs(dout, rhs, group_sizes, *, transpose_rhs: bool = False, **kw):
  """dlhs[m,k] = dout[m,n] @ rhs[group]^T; reads rhs in place with the other layout."""
  return forward(dout, rhs, group_sizes, transpose_rhs=not transpose_rhs, **kw)


def _swap_kn(cfg):
  if cfg is None:
    return None
  if hasattr(cfg, "block_k"):
    return dataclasses.replace(cfg, block_k=cfg.block_n, block_n=cfg.block_k)
  return dataclasses.replace(cfg, tk=cfg.tn, tn=cfg.tk)


def grad_rhs(lhs, dout, group_sizes, *, num_groups: int, backend: str, config: Config | None,
             out_dtype, transpose_rhs: bool = False, group_offset=None, precision=None,
             interpret: bool = False):
  """drhs[g,k,n] = lhs[group]^T @ dout[group] (or [g,n,k] with transpose_rhs)."""
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  cfg = _swap_kn(config) if transpose_rhs else config  # config is in the [g,k,n] frame
  if backend == "pallas_gpu":
    return gpu_tgmm.tgmm(a, b, group_sizes, num_groups=num_groups, config=cfg, out_dtype=out_dtype,
                         group_offset=group_offset, precision=precision, interpret=interpret)
  if backend == "pallas_tpu":
    return tpu_gmm.tgmm(a, b, group_sizes, num_groups=num_groups, config=cfg, out_dtype=out_dtype,
                        group_offset=group_offset, interpret=interpret)
  return xla.tgmm(a, b, group_sizes, num_groups=num_groups, out_dtype=out_dtype,
                  group_offset=group_offset, precision=precision)


OP_FUNCTIONS = {"fwd": forward, "dlhs": grad_lhs, "drhs": grad_rhs}


# --- differentiation ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Plan:
  backend: str
  fwd: Config | None
  dlhs: Config | None
  drhs: Config | None
  transpose_rhs: bool
  precision: Any
  out_dtype: str
  compute_dtype: str
  interpret: bool
  has_offset: bool

  def common(self, op: str, group_offset) -> dict[str, Any]:
    return dict(backend=self.backend, config=getattr(self, op), transpose_rhs=self.transpose_rhs,
                precision=self.precision, interpret=self.interpret,
                group_offset=group_offset if self.has_offset else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ragged_dot(lhs, rhs, group_sizes, group_offset, plan: _Plan):
  return forward(lhs, rhs, group_sizes, out_dtype=plan.out_dtype, **plan.common("fwd", group_offset))


def _ragged_dot_fwd(lhs, rhs, group_sizes, group_offset, plan):
  return _ragged_dot(lhs, rhs, group_sizes, group_offset, plan), (lhs, rhs, group_sizes, group_offset)


def _ragged_dot_bwd(plan, residuals, dout):
  lhs, rhs, group_sizes, group_offset = residuals
  dout = dout.astype(plan.compute_dtype)
  dlhs = grad_lhs(dout, rhs, group_sizes, out_dtype=plan.compute_dtype,
                  **plan.common("dlhs", group_offset))
  drhs = grad_rhs(lhs, dout, group_sizes, num_groups=rhs.shape[0], out_dtype=plan.compute_dtype,
                  **plan.common("drhs", group_offset))
  return dlhs.astype(lhs.dtype), drhs.astype(rhs.dtype), None, None


_ragged_dot.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, *,
               transpose_rhs: bool = False, group_offset=None, backend: str = "auto",
               config: Config | Mapping[str, Any] | None = None, interpret: bool | None = None):
  """Grouped matmul with the semantics of `jax.lax.ragged_dot`, differentiable in lhs and rhs.

  lhs [m,k]; rhs [g,k,n] (or [g,n,k] with transpose_rhs); group_sizes int32 [g]. Rows of
  group i are multiplied by rhs[i]; rows past sum(group_sizes) come out 0.

  group_offset: int32 scalar for expert parallelism. rhs then holds groups
    [group_offset, group_offset + rhs.shape[0]) of the len(group_sizes) groups, and rows
    of every other group come out 0.
  backend: "pallas_gpu" | "pallas_tpu" | "xla" | "auto" (GPU, TPU, else XLA).
  config: None (the active LUT, else a heuristic), one config for all three ops, or a
    mapping {"fwd", "dlhs", "drhs"} -> config. Configs are GpuConfig / TpuConfig, or
    plain dicts of their fields as a LUT stores them. `kernels.explain` says what None picks.
  interpret: run a Pallas backend in interpret mode; None means "when the backend's
    hardware (GPU for pallas_gpu, TPU for pallas_tpu) is not the default device".
  """
  _check_shapes(lhs, rhs, group_sizes, transpose_rhs, group_offset)
  backend = resolve_backend(backend)
  out_dtype = jax.eval_shape(
      functools.partial(jax.lax.ragged_dot, preferred_element_type=preferred_element_type),
      jax.ShapeDtypeStruct(lhs.shape, lhs.dtype),
      jax.ShapeDtypeStruct((rhs.shape[0], lhs.shape[1], rhs.shape[1] if transpose_rhs else rhs.shape[2]), rhs.dtype),
      jax.ShapeDtypeStruct((rhs.shape[0],), jnp.int32)).dtype
  compute_dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
  _check_dtype(backend, compute_dtype)
  m, k = lhs.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  choices = resolve_choices(config, backend, m, k, n, rhs.shape[0], compute_dtype)
  _log_choices(choices, m, k, n, rhs.shape[0], compute_dtype)
  configs = {op: c.config for op, c in choices.items()}
  if interpret is None:
    interpret = default_interpret(backend)
  plan = _Plan(backend, configs["fwd"], configs["dlhs"], configs["drhs"], bool(transpose_rhs),
               _canonical_precision(precision), jnp.dtype(out_dtype).name, compute_dtype.name,
               bool(interpret), group_offset is not None)
  offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset, jnp.int32)
  return _ragged_dot(lhs.astype(compute_dtype), rhs.astype(compute_dtype),
                     group_sizes.astype(jnp.int32), offset, plan)
