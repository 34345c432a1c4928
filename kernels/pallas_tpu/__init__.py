"""Backend 'pallas_tpu': jax's megablox kernels made to agree with lax (gmm.py), configured
by TpuConfig."""

import dataclasses

from kernels.backend import Backend
from kernels.pallas_tpu import config, gmm
from kernels.pallas_tpu.config import TpuConfig


def forward(
  lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None, precision=None, interpret=False
):
  del precision
  return gmm.gmm(
    lhs,
    rhs,
    group_sizes,
    config=config,
    out_dtype=out_dtype,
    transpose_rhs=transpose_rhs,
    group_offset=group_offset,
    interpret=interpret,
  )


def grad_rhs(
  lhs,
  dout,
  group_sizes,
  *,
  num_groups,
  config,
  out_dtype,
  transpose_rhs=False,
  group_offset=None,
  precision=None,
  interpret=False,
):
  del precision
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  if transpose_rhs:  # the config is in the [g,k,n] frame
    config = dataclasses.replace(config, tk=config.tn, tn=config.tk)
  return gmm.tgmm(
    a,
    b,
    group_sizes,
    num_groups=num_groups,
    config=config,
    out_dtype=out_dtype,
    group_offset=group_offset,
    interpret=interpret,
  )


# megablox has no float16 matmul, and indexes with int32 element counts.
BACKEND = Backend(
  name="pallas_tpu",
  forward=forward,
  grad_rhs=grad_rhs,
  config_type=TpuConfig,
  dtypes=("bfloat16", "float32"),
  platforms=("tpu",),
  default=config.default,
  space=config.space,
  abbrev={"tm": "tm", "tk": "tk", "tn": "tn"},
  auto_priority=2,
  megablox_lut_fn=True,
)
