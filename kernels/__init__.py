"""ragtune's runtime kernels: grouped matmul (ragged_dot) for MoE layers.

A model imports only this package:

    import kernels
    kernels.load_lut()                      # optional: RAGTUNE_LUT or the bundled LUT
    y = kernels.ragged_dot(x, w, group_sizes)
    kernels.explain(x.shape, w.shape, x.dtype)   # which config each op uses, and why

This package depends on jax and numpy only.
"""

from kernels import target
from kernels.backends import REGISTRY, Backend
from kernels.config import (BACKENDS, DTYPES, OPS, GpuConfig, MosaicConfig, TpuConfig,
                            config_from_dict, default_config, op_dims)
from kernels.lut import (ENV_VAR, SCHEMA, SCHEMA_VERSION, Entry, Lut, LutError, LutFn,
                         active_lut, current_device_kind, device_slug, load_lut,
                         reset_active_lut, set_active_lut)
from kernels.ragged_dot import (OP_FUNCTIONS, Choice, choose_config, explain, forward, grad_lhs,
                                grad_rhs, ragged_dot, resolve_backend, resolve_plan, select_config)

__all__ = [
    "target", "REGISTRY", "Backend", "BACKENDS", "DTYPES", "OPS", "GpuConfig", "MosaicConfig", "TpuConfig", "config_from_dict", "default_config",
    "op_dims", "ENV_VAR", "SCHEMA", "SCHEMA_VERSION", "Entry", "Lut", "LutError", "LutFn",
    "active_lut", "current_device_kind", "device_slug", "load_lut", "reset_active_lut",
    "set_active_lut", "OP_FUNCTIONS", "forward", "grad_lhs", "grad_rhs", "ragged_dot",
    "resolve_backend", "resolve_plan", "select_config", "Choice", "choose_config", "explain",
]
