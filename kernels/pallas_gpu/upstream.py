"""What of Pallas Triton upstream the backend works around: its deprecation (jax >= 0.11: the
backend's `deprecated`, and one warning a process in place of jax's one per Triton lowering),
and jax 0.12's table of GPU names for an ahead-of-time target (`aot_target`). The backend
(__init__.py) and its kernels (gmm.py, tgmm.py) import it; it imports neither."""

import warnings

import jax


def deprecated() -> str:
  if jax.__version_info__ >= (0, 11):  # jax's CHANGELOG, 0.11.0: Pallas Triton deprecated
    return f"Pallas Triton is deprecated upstream since jax 0.11 (this is {jax.__version__}); 'mosaic_gpu' replaces it"
  return ""


def aot_target(device_kind: str, capability: str | None) -> None:
  """jax 0.12's Pallas Triton lowering takes an ahead-of-time GPU's compute capability from a
  table of product names (jax._src.pallas.triton.gpu_info) and refuses a name outside it ("No
  supported GPU devices found": NVIDIA L40S, whose "L40" entry its regex does not match, and
  NVIDIA H20), where a real device of that kind compiles from its own capability. Give it the
  target's, as the device would. jax 0.10 reads the mesh's device and has no such table."""
  try:
    from jax._src.pallas.triton import gpu_info
  except ImportError:
    return
  lookup = getattr(gpu_info, "gpu_version_from_device_kind", None)
  if not capability or lookup is None or lookup(device_kind) is not None:
    return
  if not hasattr(gpu_info, "_get_device_arch_name"):
    return
  if not hasattr(gpu_info, "_ragtune_targets"):
    known, jax_own = {}, gpu_info._get_device_arch_name
    gpu_info._ragtune_targets = known
    gpu_info._get_device_arch_name = lambda kind: known.get(kind) or jax_own(kind)
  gpu_info._ragtune_targets[device_kind] = str(capability)


# jax's own notice, raised at each lowering of a Triton kernel.
_UPSTREAM_NOTICE = r"The Pallas Triton backend is deprecated"
_warned = False


def warn_deprecated_once() -> None:
  """One DeprecationWarning a process for this backend in place of jax's one per kernel (gmm
  and tgmm call it). Re-installs the filter at each call: pytest and warnings.catch_warnings
  restore the filters they found when they exit."""
  global _warned
  why = deprecated()
  if not why:
    return
  warnings.filterwarnings("ignore", message=_UPSTREAM_NOTICE, category=DeprecationWarning)
  if not _warned:
    _warned = True
    warnings.warn(f"kernels backend 'pallas_gpu': {why}", DeprecationWarning, stacklevel=3)
