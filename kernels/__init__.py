"""ragtune's runtime kernels: grouped matmul (ragged_dot) for MoE layers.

A model imports only this package:

    import kernels
    kernels.load_lut()                      # optional: RAGTUNE_LUT or the bundled LUT
    y = kernels.ragged_dot(x, w, group_sizes)
    kernels.explain(x.shape, w.shape, x.dtype)   # which config each op uses, and why
    with kernels.use_lut(other_lut): ...    # another LUT for one block

One folder per backend (kernels/pallas_gpu, mosaic_gpu, mosaic_blackwell, pallas_tpu, xla), listed in
kernels/registry.py. This package depends on jax and numpy only.
"""

from kernels.lut import Entry, Lut, LutError, LutFn, Rejection, device_slug, load_lut, use_lut
from kernels.mosaic_blackwell.config import BlackwellConfig
from kernels.mosaic_gpu.config import MosaicConfig
from kernels.pallas_gpu.config import TritonConfig
from kernels.pallas_tpu.config import TpuConfig
from kernels.ragged_dot import Choice, explain, ragged_dot

__all__ = [
  "ragged_dot",
  "explain",
  "Choice",
  "TritonConfig",
  "MosaicConfig",
  "BlackwellConfig",
  "TpuConfig",
  "Lut",
  "Entry",
  "LutError",
  "Rejection",
  "LutFn",
  "load_lut",
  "use_lut",
  "device_slug",
]
