"""Backend 'xla': jax.lax.ragged_dot (ops.py); no knobs, every dtype, every platform."""

from kernels.backend import Backend
from kernels.xla import ops


def forward(
  lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None, precision=None, interpret=False
):
  del config, interpret
  return ops.gmm(
    lhs,
    rhs,
    group_sizes,
    out_dtype=out_dtype,
    transpose_rhs=transpose_rhs,
    group_offset=group_offset,
    precision=precision,
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
  del config, interpret
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  return ops.tgmm(
    a, b, group_sizes, num_groups=num_groups, out_dtype=out_dtype, group_offset=group_offset, precision=precision
  )


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
