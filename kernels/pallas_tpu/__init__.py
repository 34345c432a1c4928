"""Backend 'pallas_tpu': jax's megablox kernels made to agree with lax (gmm.py), and a
megablox-style gmm of int8 or fp8 operands with their scales (qgmm.py), configured by TpuConfig.

The kernel modules are imported on first use: jax's Pallas TPU package is a sixth of
`import kernels`, on hosts that never run it.
"""

import dataclasses
import importlib

from kernels.backend import PALLAS_CALL_COST, Backend
from kernels.common import QUANT_FORMATS
from kernels.pallas_tpu import config
from kernels.pallas_tpu.config import TpuConfig


def _gmm():
  return importlib.import_module("kernels.pallas_tpu.gmm")


def forward(lhs, rhs, group_sizes, *, precision=None, lhs_scale=None, rhs_scale=None, **kw):
  del precision  # megablox picks its own
  if lhs_scale is not None:
    qgmm = importlib.import_module("kernels.pallas_tpu.qgmm")
    return qgmm.qgmm(lhs, rhs, group_sizes, lhs_scale, rhs_scale, **kw)
  return _gmm().gmm(lhs, rhs, group_sizes, **kw)


def grad_rhs(lhs, dout, group_sizes, *, config, transpose_rhs=False, precision=None, **kw):
  del precision
  if transpose_rhs:  # the config is in the [g,k,n] frame
    lhs, dout = dout, lhs
    config = dataclasses.replace(config, tk=config.tn, tn=config.tk)
  return _gmm().tgmm(lhs, dout, group_sizes, config=config, **kw)


# megablox has no float16 matmul, and indexes with int32 element counts. The 8-bit formats
# run where the chip's MXU takes them (common.TpuChip.mxu; Backend.refusal says where not).
BACKEND = Backend(
  name="pallas_tpu",
  forward=forward,
  grad_rhs=grad_rhs,
  config_type=TpuConfig,
  dtypes=("bfloat16", "float32", *QUANT_FORMATS),
  platforms=("tpu",),
  default=config.default,
  space=config.space,
  auto_priority=2,
  megablox_lut_fn=True,
  grid_work=config.grid_work,
  interpreter="pallas",
  interpret_cost=PALLAS_CALL_COST,
  default_source=config.default_source,
)
