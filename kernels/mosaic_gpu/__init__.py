"""Backend 'mosaic_gpu': Hopper TMA + wgmma kernels (gmm.py, tgmm.py), configured by MosaicConfig.

The kernel modules are imported on first use: jax's Mosaic GPU package imports absl
(absl-py), which `import kernels` must not need.
"""

import importlib

import jax

from kernels.backend import Backend
from kernels.mosaic_gpu import config
from kernels.mosaic_gpu.config import MosaicConfig


def forward(lhs, rhs, group_sizes, **kw):
  return importlib.import_module("kernels.mosaic_gpu.gmm").gmm(lhs, rhs, group_sizes, **kw)


def grad_rhs(lhs, dout, group_sizes, *, config, transpose_rhs=False, precision=None, **kw):
  """drhs in the config's [g,k,n] frame: the output tile is [block_k, block_n] of [k, n]
  (with transpose_rhs, [block_n, block_k] of [n, k]); block_m rows are reduced a step. The
  two consumer warpgroups split the tile's k (config.consumer_tile): a's columns, or b's
  with transpose_rhs."""
  del precision  # wgmma on 16-bit inputs has one precision
  tgmm = importlib.import_module("kernels.mosaic_gpu.tgmm")
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  tile_a, tile_b = (config.block_n, config.block_k) if transpose_rhs else (config.block_k, config.block_n)
  steps = config.max_concurrent_steps
  return tgmm.tgmm(
    a,
    b,
    group_sizes,
    block_m=config.block_m,
    tile_a=tile_a,
    tile_b=tile_b,
    group_m=config.group_m,
    max_concurrent_steps=steps,
    split_b=transpose_rhs,
    **kw,
  )


def grad_rhs_quantized(a_t, b_t, a_scale, b_scale, first, count, *, config, transpose_rhs=False, **kw):
  """fp8 training's drhs (Backend.grad_rhs_quantized) in the config's [g,k,n] frame: square
  [block_k, block_n] output tiles (config.valid_for), so transpose_rhs swaps the operands."""
  tgmm = importlib.import_module("kernels.mosaic_gpu.tgmm")
  if transpose_rhs:
    a_t, b_t, a_scale, b_scale = b_t, a_t, b_scale, a_scale
  return tgmm.tgmm_quantized(
    a_t,
    b_t,
    a_scale,
    b_scale,
    first,
    count,
    tile_a=config.block_k,
    tile_b=config.block_n,
    group_m=config.group_m,
    max_concurrent_steps=config.max_concurrent_steps,
    **kw,
  )


def interpret_unsupported() -> dict[str, str]:
  """dlhs reads rhs and drhs reads lhs transposed from shared memory in wgmma. jax's Mosaic
  GPU interpreter reads such tiles from 0.11 on; before, every such wgmma raises
  "'TransposeTransform' object has no attribute 'indices'" (tests/kernels/mgpu_interpret.py
  adds it for the tests)."""
  if jax.__version_info__ >= (0, 11):
    return {}
  why = (
    f"jax {jax.__version__}'s Mosaic GPU interpreter cannot run wgmma on a transposed shared-memory tile "
    "(jax 0.11's can; a Hopper GPU runs them compiled)"
  )
  # fp8's forward reads its weights as k-major [n, k] tiles, transposed for wgmma as dlhs's,
  # and its scales with plgpu.load, which jax 0.10's interpreter has no rule for either.
  fp8 = why + "; nor plgpu.load (fp8's scales)"
  return {"dlhs": why, "drhs": why, **{f"fwd:{fmt}": fp8 for fmt in config.FP8_FORMATS}}


# wgmma takes 16-bit inputs here, and fp8 with channelwise scales (forward). wgmma is sm_90a
# only: Blackwell (sm_100) has tcgen05 instead, and Ampere neither, so the kernels are
# Hopper's. TMA loads take 64-bit addresses: wide indexing. Mosaic sets a kernel's shared
# memory at launch, outside the compiled program: smem_at_launch.
BACKEND = Backend(
  name="mosaic_gpu",
  forward=forward,
  grad_rhs=grad_rhs,
  grad_rhs_quantized=grad_rhs_quantized,
  k_major_fp8=True,  # an 8-bit wgmma's B is k-major only (gmm.py)
  config_type=MosaicConfig,
  dtypes=("bfloat16", "float16", *config.FP8_FORMATS),
  platforms=("gpu", "cuda"),
  families=("hopper",),
  default=config.default,
  space=config.space,
  launch_key=config.launch_key,
  wide_indexing=True,
  smem_at_launch=True,
  grid_work=config.grid_work,
  interpreter="mosaic_gpu",
  interpret_cost=config.INTERPRET_COST,
  interpret_unsupported=interpret_unsupported,
  interpreter_threads=config.INTERPRETER_THREADS,
  # Below pallas_gpu for fwd and dlhs: one H200 timed it 34% longer on DeepSeek-V3 up's
  # forward (its band; docs/design.md). "auto"'s fallback on Hopper where jax no longer ships
  # Pallas Triton.
  auto_priority=1,
  # Its tgmm beat pallas_gpu's on every drhs the H200 timed: Mixtral 1.23x, DeepSeek-V3 up
  # 1.29x, decode 1.48x, a 96-row problem 5.4x (results/nvidia-h200/bench-drhs.csv).
  op_priority={"drhs": 3},
  # fp8 runs here on fp8 wgmma (QGMMA: Hopper's fp8 peak is twice its 16-bit one); pallas_gpu's
  # Triton converts fp8 to f16 for mma.sync (HMMA), at most the 16-bit rate (the deviceless
  # machine code of both: tests/ragtune/test_quantized.py). On one H100, DeepSeek-V3 up and
  # down in block128: 4.0x and 3.6x as fast as pallas_gpu (docs/quantization.md).
  format_priority={fmt: 3 for fmt in config.FP8_FORMATS},
)
