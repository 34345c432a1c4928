"""Backend 'pallas_gpu': Pallas Triton kernels (gmm.py, tgmm.py), configured by TritonConfig."""

import dataclasses

from kernels.backend import Backend
from kernels.pallas_gpu import config, gmm, tgmm
from kernels.pallas_gpu.config import TritonConfig


def forward(lhs, rhs, group_sizes, **kw):
  return gmm.gmm(lhs, rhs, group_sizes, **kw)


def grad_rhs(lhs, dout, group_sizes, *, config, transpose_rhs=False, **kw):
  # The config is in the [g,k,n] frame; with transpose_rhs the output is [g,n,k].
  if transpose_rhs:
    lhs, dout = dout, lhs
    config = dataclasses.replace(config, block_k=config.block_n, block_n=config.block_k)
  return tgmm.tgmm(lhs, dout, group_sizes, config=config, **kw)


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
  grid_work=config.grid_work,
  interpreter="pallas",
)
