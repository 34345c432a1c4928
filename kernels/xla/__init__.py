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


def grad_rhs_quantized(
  a_t, b_t, a_scale, b_scale, first, count, *, config=None, interpret=False, transpose_rhs=False, out_dtype
):
  del config, interpret, first  # the groups' runs of blocks are consecutive from block 0
  if transpose_rhs:
    a_t, b_t, a_scale, b_scale = b_t, a_t, b_scale, a_scale
  return ops.tgmm_quantized(a_t, b_t, a_scale, b_scale, count, out_dtype=out_dtype)


# XLA picks 64-bit indexing itself: wide indexing.
BACKEND = Backend(
  name="xla",
  forward=forward,
  grad_rhs=grad_rhs,
  grad_rhs_quantized=grad_rhs_quantized,
  config_type=None,
  dtypes=DTYPES + QUANT_FORMATS,
  platforms=("cpu", "gpu", "cuda", "rocm", "tpu"),
  wide_indexing=True,
  auto_priority=1,
)
