"""Backend 'pallas_gpu': Pallas Triton kernels (gmm.py, tgmm.py), configured by TritonConfig."""

import dataclasses

from kernels.backend import Backend
from kernels.pallas_gpu import config, gmm, tgmm
from kernels.pallas_gpu.config import TritonConfig


def forward(
  lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None, precision=None, interpret=False
):
  return gmm.gmm(
    lhs,
    rhs,
    group_sizes,
    config=config,
    out_dtype=out_dtype,
    transpose_rhs=transpose_rhs,
    group_offset=group_offset,
    precision=precision,
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
  # The config is in the [g,k,n] frame; with transpose_rhs the output is [g,n,k].
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  if transpose_rhs:
    config = dataclasses.replace(config, block_k=config.block_n, block_n=config.block_k)
  return tgmm.tgmm(
    a,
    b,
    group_sizes,
    num_groups=num_groups,
    config=config,
    out_dtype=out_dtype,
    group_offset=group_offset,
    precision=precision,
    interpret=interpret,
  )


# Pallas's Triton lowering makes pointer offsets int64 for any array over 4 GiB
# (jax/_src/pallas/triton/lowering.py, _compute_offsets_from_indices): wide indexing.
BACKEND = Backend(
  name="pallas_gpu",
  forward=forward,
  grad_rhs=grad_rhs,
  config_type=TritonConfig,
  dtypes=("bfloat16", "float16", "float32"),
  platforms=("gpu", "cuda", "rocm"),
  default=config.default,
  space=config.space,
  launch_key=config.launch_key,
  wide_indexing=True,
  abbrev=config.ABBREV,
  auto_priority=2,
)
