"""Backend 'xla': jax.lax.ragged_dot (kernels/xla.py); no knobs, every dtype, every platform."""

from kernels import xla
from kernels.backends import Backend


def forward(lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None,
            precision=None, interpret=False):
  del config, interpret
  return xla.gmm(lhs, rhs, group_sizes, out_dtype=out_dtype, transpose_rhs=transpose_rhs,
                 group_offset=group_offset, precision=precision)


def grad_rhs(lhs, dout, group_sizes, *, num_groups, config, out_dtype, transpose_rhs=False,
             group_offset=None, precision=None, interpret=False):
  del config, interpret
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  return xla.tgmm(a, b, group_sizes, num_groups=num_groups, out_dtype=out_dtype,
                  group_offset=group_offset, precision=precision)


BACKEND = Backend(
    name="xla", forward=forward, grad_rhs=grad_rhs, default=lambda *args, **kw: None,
    config_type=None, dtypes=("bfloat16", "float16", "float32"),
    platforms=("cpu", "gpu", "cuda", "rocm", "tpu"))
