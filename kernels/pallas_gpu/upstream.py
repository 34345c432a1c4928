"""Pallas Triton's deprecation upstream (jax >= 0.11): the backend's `deprecated`, and one
warning a process in place of jax's one per Triton lowering. The backend (__init__.py) and
its kernels (gmm.py, tgmm.py) import it; it imports neither."""

import warnings

import jax


def deprecated() -> str:
  if jax.__version_info__ >= (0, 11):  # jax's CHANGELOG, 0.11.0: Pallas Triton deprecated
    return f"Pallas Triton is deprecated upstream since jax 0.11 (this is {jax.__version__}); 'mosaic_gpu' replaces it"
  return ""


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
