"""Backend 'mosaic_blackwell': Blackwell tcgen05 kernels (gmm.py, tgmm.py) with the accumulator
in tensor memory, configured by BlackwellConfig.

The kernel modules are imported on first use: jax's Mosaic GPU package imports absl
(absl-py), which `import kernels` must not need. What this jax lacks is found by looking for
it (jax_support below), not by version.
"""

import importlib

from kernels.backend import Backend
from kernels.mosaic_blackwell import config
from kernels.mosaic_blackwell.config import BlackwellConfig


def _check_interpretable(op: str, interpret) -> None:
  if interpret and (why := interpret_unsupported().get(op)):
    raise NotImplementedError(f"backend 'mosaic_blackwell' cannot run {op} interpreted: {why}")


def forward(lhs, rhs, group_sizes, **kw):
  _check_interpretable("fwd", kw.get("interpret"))
  return importlib.import_module("kernels.mosaic_blackwell.gmm").gmm(lhs, rhs, group_sizes, **kw)


def grad_rhs(lhs, dout, group_sizes, *, config, transpose_rhs=False, precision=None, **kw):
  """drhs in the config's [g,k,n] frame: a cell is [block_k, block_n] of [k, n] (with
  transpose_rhs, of [n, k]: the operands swap, so the cell's rows are dout's columns)."""
  del precision  # tcgen05 on 16-bit inputs has one precision
  _check_interpretable("drhs", kw.get("interpret"))
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  return importlib.import_module("kernels.mosaic_blackwell.tgmm").tgmm(a, b, group_sizes, config=config, **kw)


def unavailable() -> str:
  """Why this jax cannot build the kernels, or "": they need Pallas Mosaic GPU's tcgen05 MMA,
  tensor memory and warp_map (all in jax 0.10.2 and 0.12)."""
  try:
    plgpu = importlib.import_module("jax.experimental.pallas.mosaic_gpu")
  except ImportError as e:
    return f"jax's Pallas Mosaic GPU does not import ({e})"
  missing = [name for name in ("tcgen05_mma", "tcgen05_commit_arrive", "TMEM", "warp_map") if not hasattr(plgpu, name)]
  return f"this jax's Pallas Mosaic GPU lacks {', '.join(missing)}" if missing else ""


def interpret_unsupported() -> dict[str, str]:
  """jax's Mosaic GPU interpreter runs tcgen05 MMAs and tensor memory from jax 0.12 on; jax
  0.10.2's has no rule for them. Found by looking for the interpreter's rule."""
  try:
    interp = importlib.import_module("jax._src.pallas.mosaic_gpu.interpret.jaxpr_interpret")
  except ImportError:
    interp = None
  if interp is not None and any(
    hasattr(c, "_interpret_tcgen05_mma_p") for c in vars(interp).values() if isinstance(c, type)
  ):
    return {}
  import jax

  why = f"jax {jax.__version__}'s Mosaic GPU interpreter has no tcgen05 MMA or tensor memory (jax 0.12's has)"
  return {op: why for op in ("fwd", "dlhs", "drhs")}


# tcgen05 is sm_100a/sm_103a (B200, GB200, B300): Hopper has wgmma (mosaic_gpu), and consumer
# Blackwell (sm_120) has neither. TMA loads take 64-bit addresses: wide indexing. Mosaic sets a
# kernel's shared memory at launch, outside the compiled program: smem_at_launch.
BACKEND = Backend(
  name="mosaic_blackwell",
  forward=forward,
  grad_rhs=grad_rhs,
  config_type=BlackwellConfig,
  dtypes=("bfloat16", "float16"),
  platforms=("gpu", "cuda"),
  families=("blackwell",),
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
  unavailable=unavailable,
  # Below pallas_gpu until a GPU has measured it; "auto"'s fallback on Blackwell where jax no
  # longer ships Pallas Triton.
  auto_priority=1,
)
