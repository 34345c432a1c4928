"""The backends `kernels.ragged_dot` can run, registered in one place: REGISTRY.

A backend is one module in this package that defines ``BACKEND = Backend(...)``: its
three ops (fwd, dlhs, drhs), its config type, its default config and the input dtypes it
computes in. To add one, write ``kernels/backends/<name>.py`` and add its module to
``_MODULES`` below; ragged_dot, the LUT, config_from_dict/default_config and ragtune's
search space (which adds a candidate space under the same name) look backends up here.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Backend:
  """One way to compute ragged_dot's three ops.

  forward(lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs, group_offset,
          precision, interpret) -> [m, n]
  grad_lhs: same signature, dout [m,n] x rhs -> [m,k]; None means forward with
          transpose_rhs flipped (rhs read in place in the other layout).
  grad_rhs(lhs, dout, group_sizes, *, num_groups, config, out_dtype, transpose_rhs,
           group_offset, precision, interpret) -> [g,k,n] ([g,n,k] with transpose_rhs)
  default(op, dtype, m, k, n, g, device_kind) -> config: the heuristic when no LUT entry
          applies; (m, k, n) is the forward problem, the config in the op's own frame.
  config_type: the config dataclass (with fits() and to_dict()); None: no knobs.
  dtypes: the lhs/rhs dtypes (after promotion) it computes in.
  platforms: the jax platforms it runs compiled on; elsewhere it is interpreted.
  families: the GPU families (kernels.config.gpu_family) its kernels compile for; empty:
          every device of its platforms. Compiling for another raises a clear error.
  """

  name: str
  forward: Callable[..., Any]
  grad_rhs: Callable[..., Any]
  default: Callable[..., Any]
  config_type: type | None
  dtypes: tuple[str, ...]
  platforms: tuple[str, ...] = ()
  grad_lhs: Callable[..., Any] | None = None
  families: tuple[str, ...] = ()

  def check_device(self, platform: str, device_kind: str) -> None:
    """Raise ValueError when this backend's kernels cannot compile for the device."""
    from kernels.config import gpu_family
    if self.families and platform in self.platforms and gpu_family(device_kind) not in self.families:
      raise ValueError(
          f"backend {self.name!r} compiles for {'/'.join(self.families)} GPUs only, not "
          f"{device_kind!r} ({gpu_family(device_kind)}); use backend='pallas_gpu' or 'xla'")

  def runs_on(self, platform: str, device_kind: str) -> bool:
    try:
      self.check_device(platform, device_kind)
    except ValueError:
      return False
    return True

  def check_dtype(self, lhs_dtype, rhs_dtype, compute_dtype: str) -> None:
    if compute_dtype not in self.dtypes:
      raise TypeError(f"backend {self.name!r} supports lhs/rhs dtypes {self.dtypes}, got "
                      f"{lhs_dtype} x {rhs_dtype}; use backend='xla'" +
                      (" or 'pallas_gpu'" if self.name == "mosaic_gpu" else ""))

  def check_config(self, op: str, cfg: Any) -> None:
    if self.config_type is None:
      if cfg is not None:
        raise TypeError(f"config[{op!r}] must be None for backend {self.name!r} (it has no knobs), got {cfg!r}")
    elif not isinstance(cfg, self.config_type):
      raise TypeError(f"config[{op!r}] must be a {self.config_type.__name__} for backend {self.name!r}, got {cfg!r}")


# One line per backend. Order matters only for display and for ties in Lut.choose.
_MODULES = (
    "kernels.backends.pallas_gpu",
    "kernels.backends.mosaic_gpu",
    "kernels.backends.pallas_tpu",
    "kernels.backends.xla",
)

REGISTRY: dict[str, Backend] = {b.name: b for b in (importlib.import_module(m).BACKEND for m in _MODULES)}

NAMES = tuple(REGISTRY)


def get(name: str) -> Backend:
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(f"backend must be one of {NAMES}, got {name!r}") from None


def backend_of_config(cfg: Any) -> str | None:
  """The backend whose config type `cfg` is (None for None or an unknown type)."""
  for b in REGISTRY.values():
    if b.config_type is not None and isinstance(cfg, b.config_type):
      return b.name
  return None
