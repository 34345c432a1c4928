"""Backend 'pallas_gpu': Pallas Triton kernels (gmm.py, tgmm.py), configured by TritonConfig.

Pallas Triton is deprecated since jax 0.11 in favour of Mosaic GPU. The kernel modules are
imported on first use, so `import kernels` works on a jax that no longer ships it; the
backend then says so (unavailable) and "auto" falls back to mosaic_gpu on Hopper. Where jax
deprecates it, jax warns at every Triton lowering (a model lowers several kernels a step); we
warn once a process instead (upstream.py).
"""

import dataclasses
import importlib
import importlib.util

import jax

from kernels.backend import PALLAS_CALL_COST, Backend
from kernels.pallas_gpu import config
from kernels.pallas_gpu.config import TritonConfig
from kernels.pallas_gpu.upstream import aot_target, deprecated

TRITON_MODULE = "jax.experimental.pallas.triton"


def forward(lhs, rhs, group_sizes, **kw):
  return importlib.import_module("kernels.pallas_gpu.gmm").gmm(lhs, rhs, group_sizes, **kw)


def grad_rhs(lhs, dout, group_sizes, *, config, transpose_rhs=False, **kw):
  # The config is in the [g,k,n] frame; with transpose_rhs the output is [g,n,k].
  if transpose_rhs:
    lhs, dout = dout, lhs
    config = dataclasses.replace(config, block_k=config.block_n, block_n=config.block_k)
  return importlib.import_module("kernels.pallas_gpu.tgmm").tgmm(lhs, dout, group_sizes, config=config, **kw)


def grad_rhs_quantized(
  a_t, b_t, a_scale, b_scale, first, count, *, config, out_dtype, transpose_rhs=False, interpret=False, **kw
):
  # As grad_rhs: the config is in the [g,k,n] frame; with transpose_rhs the output is [g,n,k].
  if transpose_rhs:
    a_t, b_t, a_scale, b_scale = b_t, a_t, b_scale, a_scale
    config = dataclasses.replace(config, block_k=config.block_n, block_n=config.block_k)
  tgmm = importlib.import_module("kernels.pallas_gpu.tgmm")
  return tgmm.tgmm_quantized(
    a_t, b_t, a_scale, b_scale, first, count, config=config, out_dtype=out_dtype, interpret=interpret, **kw
  )


def quantize_rows(x, dtype):
  return importlib.import_module("kernels.pallas_gpu.quantize").quantize_rows(x, dtype)


def quantize_tokens(x, blocks, dtype):
  return importlib.import_module("kernels.pallas_gpu.quantize").quantize_token_blocks(x, blocks, dtype)


def unavailable() -> str:
  if importlib.util.find_spec(TRITON_MODULE) is None:
    return f"jax {jax.__version__} has no Pallas Triton ({TRITON_MODULE}); Mosaic GPU replaces it"
  return ""


# Pallas's Triton lowering makes pointer offsets int64 for any array over 4 GiB
# (jax/_src/pallas/triton/lowering.py, _compute_offsets_from_indices): wide indexing.
BACKEND = Backend(
  name="pallas_gpu",
  forward=forward,
  grad_rhs=grad_rhs,
  grad_rhs_quantized=grad_rhs_quantized,
  quantize_rows=quantize_rows,
  quantize_tokens=quantize_tokens,
  config_type=TritonConfig,
  dtypes=("bfloat16", "float16", "float32", "float8_e4m3fn:channelwise", "float8_e4m3fn:block128"),
  platforms=("gpu", "cuda", "rocm"),
  default=config.default,
  space=config.space,
  launch_key=config.launch_key,
  wide_indexing=True,
  auto_priority=2,
  grid_work=config.grid_work,
  interpreter="pallas",
  interpret_cost=PALLAS_CALL_COST,
  unavailable=unavailable,
  deprecated=deprecated,
  aot_target=aot_target,
)
