"""Backend 'pallas_tpu': jax's megablox kernels made to agree with lax (kernels/tpu_gmm.py)."""

import dataclasses

from kernels import tpu_gmm
from kernels.backends import Backend
from kernels.config import TpuConfig, tpu_default


def forward(lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None,
            precision=None, interpret=False):
  del precision
  return tpu_gmm.gmm(lhs, rhs, group_sizes, config=config, out_dtype=out_dtype,
                     transpose_rhs=transpose_rhs, group_offset=group_offset, interpret=interpret)


def grad_rhs(lhs, dout, group_sizes, *, num_groups, config, out_dtype, transpose_rhs=False,
             group_offset=None, precision=None, interpret=False):
  del precision
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  if transpose_rhs:  # the config is in the [g,k,n] frame
    config = dataclasses.replace(config, tk=config.tn, tn=config.tk)
  return tpu_gmm.tgmm(a, b, group_sizes, num_groups=num_groups, config=config, out_dtype=out_dtype,
                      group_offset=group_offset, interpret=interpret)


# megablox has no float16 matmul.
BACKEND = Backend(
    name="pallas_tpu", forward=forward, grad_rhs=grad_rhs, default=tpu_default,
    config_type=TpuConfig, dtypes=("bfloat16", "float32"), platforms=("tpu",))
