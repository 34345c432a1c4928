"""Backend 'xla': jax.lax.ragged_dot (ops.py); no knobs, every dtype, every platform."""

from kernels.backend import Backend
from kernels.xla import ops


def forward(lhs, rhs, group_sizes, *, config=None, interpret=False, **kw):
  del config, interpret  # no knobs; XLA compiles it
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
  dtypes=("bfloat16", "float16", "float32"),
  platforms=("cpu", "gpu", "cuda", "rocm", "tpu"),
  wide_indexing=True,
  auto_priority=1,
)
