"""Backend 'pallas_gpu': Pallas Triton kernels (kernels/gpu_gmm.py, kernels/gpu_tgmm.py)."""

import dataclasses

from kernels import gpu_gmm, gpu_tgmm
from kernels.backends import Backend
from kernels.config import GpuConfig, gpu_default


def forward(lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None,
            precision=None, interpret=False):
  return gpu_gmm.gmm(lhs, rhs, group_sizes, config=config, out_dtype=out_dtype,
                     transpose_rhs=transpose_rhs, group_offset=group_offset,
                     precision=precision, interpret=interpret)


def grad_rhs(lhs, dout, group_sizes, *, num_groups, config, out_dtype, transpose_rhs=False,
             group_offset=None, precision=None, interpret=False):
  # The config is in the [g,k,n] frame; with transpose_rhs the output is [g,n,k].
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  if transpose_rhs:
    config = dataclasses.replace(config, block_k=config.block_n, block_n=config.block_k)
  return gpu_tgmm.tgmm(a, b, group_sizes, num_groups=num_groups, config=config, out_dtype=out_dtype,
                       group_offset=group_offset, precision=precision, interpret=interpret)


BACKEND = Backend(
    name="pallas_gpu", forward=forward, grad_rhs=grad_rhs, default=gpu_default,
    config_type=GpuConfig, dtypes=("bfloat16", "float16", "float32"),
    platforms=("gpu", "cuda", "rocm"))
