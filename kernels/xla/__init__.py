"""Backend 'xla': jax.lax.ragged_dot (ops.py); no knobs, every dtype and quantized format,
every platform."""

from kernels.backend import Backend
from kernels.common import DTYPES, QUANT_FORMATS
from kernels.xla import ops


def forward(lhs, rhs, group_sizes, *, config=None, interpret=False, lhs_scale=None, rhs_scale=None, **kw):
  del config, interpret  # no knobs; XLA compiles it
  if lhs_scale is not None:
    return ops.gmm_quantized(lhs, rhs, group_sizes, lhs_scale, rhs_scale, **kw)
  return ops.gmm(lhs, rhs, group_sizes, **kw)


def grad_rhs(lhs, dout, group_sizes, *, config=None, interpret=False, transpose_rhs=False, **kw):
  del config, interpret
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  return ops.tgmm(a, b, group_sizes, **kw)


# XLA picks 64-bit indexing itself: wide indexing.
BACKEND = Backend(
  name="xla",
  forward=forward,
  grad_rhs=grad_rhs,
  config_type=None,
  dtypes=DTYPES + QUANT_FORMATS,
  platforms=("cpu", "gpu", "cuda", "rocm", "tpu"),
  wide_indexing=True,
  auto_priority=1,
)
