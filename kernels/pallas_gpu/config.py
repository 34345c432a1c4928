"""Pallas Triton config: its knobs and ranges, the fit in shared memory, the defaults
per GPU family, and the search space a sweep draws from."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels import quant
from kernels.backend import GridWork
from kernels.common import (
  check_int_range,
  gpu_family,
  gpu_smem_limit,
  is_pow2,
  itemsize,
  next_pow2,
  op_dims,
  row_tiles,
  scheme,
)

BLOCK_RANGE = (16, 256)
NUM_WARPS = (1, 2, 4, 8, 16)
NUM_STAGES = (1, 2, 3, 4, 5, 6, 7, 8)
BAND_RANGE = (1, 1024)


@dataclasses.dataclass(frozen=True)
class TritonConfig:
  """Pallas GPU (Triton) kernel config, in the op's own frame (common.op_dims).

  block_m:    rows of lhs per tile; power of two in [16, 256]. For drhs it is the step
              of the reduction over a group's rows.
  block_k:    contraction step; power of two in [16, 256]. For drhs it tiles the output's k.
  block_n:    output columns per tile; power of two in [16, 256].
  num_warps:  warps per program; one of 1, 2, 4, 8, 16.
  num_stages: software-pipelining depth of the contraction loop; 1..8.
  group_m:    fwd/dlhs launch order (see gmm.program_tile): a band of group_m
              consecutive row tiles walks all column blocks before the next band starts,
              so the band's lhs rows and each weight column block are read from HBM about
              once. 1 walks one row tile's columns at a time; a band as large as the grid
              walks all row tiles of a column block first. In [1, 1024].
  group_k:    drhs launch order (see tgmm.program_tile): within each group, a band of
              group_k output k blocks walks all n blocks. In [1, 1024].

  Blocks larger than the (power-of-two rounded) dimension are clamped at launch, so a
  config is valid for every shape.
  """

  block_m: int = 64
  block_k: int = 64
  block_n: int = 128
  num_warps: int = 4
  num_stages: int = 3
  group_m: int = 16
  group_k: int = 4

  def __post_init__(self):
    lo, hi = BLOCK_RANGE
    for name in ("block_m", "block_k", "block_n"):
      v = getattr(self, name)
      if not is_pow2(v) or not lo <= v <= hi:
        raise ValueError(f"TritonConfig.{name} must be a power of two in [{lo}, {hi}], got {v!r}")
    if self.num_warps not in NUM_WARPS:
      raise ValueError(f"TritonConfig.num_warps must be one of {NUM_WARPS}, got {self.num_warps!r}")
    if self.num_stages not in NUM_STAGES:
      raise ValueError(f"TritonConfig.num_stages must be in 1..8, got {self.num_stages!r}")
    for name in ("group_m", "group_k"):
      check_int_range("TritonConfig", name, getattr(self, name), *BAND_RANGE)

  def clamped(self, rows: int, contraction: int, cols: int) -> TritonConfig:
    """Blocks no larger than each dimension needs (>=16, Triton's dot minimum)."""
    cap = lambda b, d: min(b, max(16, next_pow2(d)))
    return dataclasses.replace(
      self,
      block_m=cap(self.block_m, rows),
      block_k=cap(self.block_k, contraction),
      block_n=cap(self.block_n, cols),
    )

  def smem_bytes(self, op: str, dtype: str, m: int, k: int, n: int) -> int:
    """Shared memory of the pipelined operand tiles for the forward problem (m, k, n) as
    `op`: one [block_m, block_k] lhs tile and one [block_k, block_n] rhs tile per stage
    (drhs: [block_m, block_k] of lhs and [block_m, block_n] of dout). Matches what
    Triton 3.8 allocates for sm_90a wgmma kernels; mma.sync kernels use a stage less."""
    c = self.clamped(*dims(op, dtype, m, k, n))
    second = c.block_m * c.block_n if op == "drhs" else c.block_k * c.block_n
    return (c.block_m * c.block_k + second) * itemsize(dtype) * max(1, c.num_stages)

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    """Whether this config can launch for the forward problem (m, k, n) as `op` on a
    device of this kind (by its shared memory per block; see common.gpu_smem_limit), and,
    for a quantized format, carry its scales (fwd, and dlhs of a training format, which is
    the forward kernel: quant.tile_violation; drhs of a training format: token_step_violation,
    steps of TOKEN_STEP_MIN or more, and at most FP8_DRHS_ACC accumulator values a thread)."""
    if scheme(dtype):
      if not quantized_op(op, dtype):
        return False
      c = self.clamped(*dims(op, dtype, m, k, n))
      if op == "drhs":
        if token_step_violation(c.block_m) or c.block_m < TOKEN_STEP_MIN:
          return False
        if c.block_k * c.block_n > FP8_DRHS_ACC * 32 * c.num_warps:
          return False
      elif quant.tile_violation(dtype, c.block_k, c.block_n):
        return False
    return self.smem_bytes(op, dtype, m, k, n) <= gpu_smem_limit(device_kind)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def dims(op: str, dtype: str, m: int, k: int, n: int) -> tuple[int, int, int]:
  """common.op_dims, but fp8 drhs steps over quant.token_blocks' padded token axis: at least
  one 128-token block, whatever m (tgmm_quantized clamps block_m to it)."""
  rows, contraction, cols = op_dims(op, m, k, n)
  if op == "drhs" and scheme(dtype):
    rows = max(rows, quant.BLOCK)
  return rows, contraction, cols


def quantized_op(op: str, dtype: str) -> bool:
  """Whether this backend computes `op` on operands of the quantized format `dtype`: the
  forward of any (gmm.py); dlhs (the forward kernel over transposed weights) and drhs
  (tgmm.tgmm_quantized) of a training format."""
  return op == "fwd" or dtype in quant.TRAINING_FORMATS


def token_step_violation(block_m: int) -> str:
  """Why block_m cannot step tgmm_quantized over its 128-token scale blocks, or "": a step
  must lie within one block (one scale a column) and whole steps fill a block."""
  if quant.BLOCK % block_m:
    return f"fp8 drhs steps over {quant.BLOCK}-token scale blocks: block_m must divide {quant.BLOCK}, got {block_m}"
  return ""


# The shallowest fp8 drhs step a search or LUT takes: 16-deep ones build, but fall off fp8
# tcgen05 to f16 mma.sync on sm_100a (deviceless, jax 0.10.2).
TOKEN_STEP_MIN = 32
# f32 accumulator values a thread of fp8 drhs holds (block_k * block_n / threads), each with
# its step's product beside it: 128x128 tiles on 4 warps (128 a thread) and 128x256 on 8
# spilled ~300 B a thread; 128x128 on 8 warps (64) did not (deviceless sm_90a and sm_100a).
FP8_DRHS_ACC = 64


# --- defaults -----------------------------------------------------------------------------

# Defaults for large problems, per device family and op, in the op's own frame. Why:
# - block_m (gmm) / block_k (tgmm) >= 64 with >= 4 warps, so Hopper uses wgmma; every
#   default compiles for sm_90a with no spills (docs/design.md: "Defaults, search space and what they compile to").
# - The launch-order band (group_m, group_k) keeps HBM traffic near the unique bytes in
#   benchmarks/l2_traffic.py on Mixtral and DeepSeek-V3 (docs/design.md: "Launch order and L2").
# - Shared memory within the family's bound, leaving room for 1-2 programs per SM.
_DEFAULTS = {
  "hopper": {"gmm": TritonConfig(128, 64, 256, 8, 3, group_m=16), "tgmm": TritonConfig(64, 128, 128, 8, 3)},
  "blackwell": {"gmm": TritonConfig(128, 64, 256, 8, 3, group_m=16), "tgmm": TritonConfig(64, 128, 128, 8, 3)},
  "ampere": {"gmm": TritonConfig(128, 64, 128, 8, 3, group_m=16), "tgmm": TritonConfig(64, 128, 128, 8, 3)},
  "other": {"gmm": TritonConfig(128, 32, 128, 8, 3, group_m=16), "tgmm": TritonConfig(32, 64, 128, 4, 3)},
  # sm_120 (deviceless, jax 0.10.2 and 0.12): ptxas keeps 8-warp 128x128 tiles near 128
  # registers, and "other"'s gmm spilled 8 B a thread in dlhs at Mixtral's shape (jax 0.12), a
  # 64-deep 2-stage one 16 B in fwd (0.10.2); on 4 warps the tile takes ~240 registers, clean.
  "blackwell-rtx": {"gmm": TritonConfig(128, 32, 128, 4, 3, group_m=16), "tgmm": TritonConfig(32, 64, 128, 4, 3)},
}
# Every other arch (kernels.gpus: ada, ampere-ga10x; an unknown GPU) has 99 KB a block, what
# "other" is sized for.
_SMALL_SMEM = "other"


def _default(op: str, dtype: str, rows: int, contraction: int, cols: int, g: int, family: str) -> TritonConfig:
  base = _DEFAULTS.get(family, _DEFAULTS[_SMALL_SMEM])["tgmm" if op == "drhs" else "gmm"]
  if scheme(dtype) and op == "drhs":
    # fp8 training's drhs (tgmm_quantized): 128-token steps, one promotion a scale block.
    # Deviceless for sm_90a (f16 mma.sync, as the forward) and sm_100a (fp8 tcgen05), jax 0.10.2:
    # 128x128 tiles on 8 warps compile with no spill (218 and 230 registers); on 4 warps, or
    # 128x256 on 8, they spill ~300 B a thread.
    base = dataclasses.replace(base, block_m=quant.BLOCK, block_k=128, block_n=128, num_warps=8, num_stages=3)
  elif scheme(dtype):
    # fp8 dots lower to mma.sync, not wgmma: jax's Triton lowering leaves the dot's
    # max_num_imprecise_acc at 0, and Triton keeps fp8 with full f32 accumulation off MMAv3.
    # mma.sync's fragments cost registers: on sm_90a 128x128 tiles on 8 warps compile with no
    # spill (channelwise 128-deep steps: 142 registers; block scales, whose per-step scaling
    # holds a second tile, 64-deep: 240), where 128x256 tiles spill. 128 columns also keep a
    # tile within one block-scale column (quant.tile_violation).
    steps = (128, 3) if scheme(dtype) == "channelwise" else (64, 4)
    base = dataclasses.replace(
      base, block_n=min(base.block_n, quant.BLOCK), block_k=steps[0], num_stages=steps[1], num_warps=8
    )
  elif dtype == "float32":  # twice the bytes per element: halve the contraction step
    base = (
      dataclasses.replace(base, block_m=base.block_m // 2)
      if op == "drhs"
      else dataclasses.replace(base, block_k=max(16, base.block_k // 2))
    )
  if op == "drhs":
    # Keep the smaller of a group's lhs rows [rows, k] and dout rows [rows, n] in L2 and
    # stream the other once: walk every k block of an n block first when k <= n.
    k_blocks = -(-contraction // base.block_k)
    return dataclasses.replace(base, group_k=min(BAND_RANGE[1], k_blocks) if contraction <= cols else 1)
  if not scheme(dtype) and (contraction * itemsize(dtype) % 16 or cols * itemsize(dtype) % 16):
    # Operand rows that are not a whole number of 16 bytes apart cannot be copied by cp.async:
    # they load through registers, where a 64-deep step of a 128x256 tile spilled 256 B a thread
    # (dlhs of [777,333]x[5,333,555], deviceless ptxas for sm_90a, jax 0.10.2); 32-deep steps did not.
    base = dataclasses.replace(base, block_k=min(base.block_k, 32))
  # Few rows per group (decode): a row tile per group and the weights streamed once. The
  # kernel is memory-bound there, so the rows a 64-row tile wastes cost no time, and 64
  # rows with 4 warps keep it on wgmma (fewer fall back to mma.sync).
  if max(1, rows // max(1, g)) <= 96:
    return dataclasses.replace(base, block_m=64, block_n=128, num_warps=4, num_stages=4)
  return base


def default(op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None) -> TritonConfig:
  rows, contraction, cols = dims(op, dtype, m, k, n)
  cfg = _default(op, dtype, rows, contraction, cols, g, gpu_family(device_kind))
  return cfg.clamped(rows, contraction, cols)


# --- search space -------------------------------------------------------------------------

# gmm (fwd, dlhs): block_m rows, block_k contraction step, block_n columns.
SPACE_BLOCK_M = (16, 32, 64, 128)
SPACE_BLOCK_K = (32, 64, 128)
SPACE_BLOCK_K_8BIT = (64, 128, 256)  # one-byte operands: the same bytes a step, twice the k
SPACE_BLOCK_N = (32, 64, 128, 256)
SPACE_NUM_WARPS = (2, 4, 8)
SPACE_NUM_STAGES = (2, 3, 4, 5)
SPACE_GROUP_M = (1, 4, 16, 64)
# tgmm (drhs): block_m is the step over a group's rows, [block_k, block_n] the output tile.
SPACE_TGMM_BLOCK_M = (32, 64, 128)
SPACE_TGMM_BLOCK_K = (64, 128, 256)
SPACE_TGMM_BLOCK_N = (64, 128, 256)
SPACE_GROUP_K = (1, 4, 16, 64)


def worth_timing(cfg: TritonConfig, out_rows: int, out_cols: int) -> bool:
  """Whether a (clamped) config can be fast. Each rule was checked against XLA's real
  compiler for H100 (tests/ragtune/test_aot_compile.py::test_each_pruning_rule_against_the_compiler):
  1. At most 128 f32 accumulator values per thread: more spill (128x128 on 2 warps
     ~6.8 KB/thread, 128x256 on 4 warps 1 KB, a 256x256 drhs tile on 8 warps 0.6 KB).
  2. Output tiles of 64x64 or more need 4+ warps: with 2 there is no warpgroup, so no
     wgmma (mma.sync only).
  3. 8 warps need 128x64 outputs or more. This one is speed, not compilation (such tiles
     compile clean): two warpgroups on a tile one covers each get half a 64-row wgmma's
     work. It keeps ~120 configs a problem (Mixtral fwd) out of the timing budget.
  4. block_n 256 needs 8 warps. Also economy, not compilation: 64x256 on 4 warps compiles
     to m64n256 wgmma with no spill (128x256 on 4 warps is rule 1's). Admitting them adds
     ~30 configs a problem, and on tests/ragtune/test_search_strategy.py's synthetic surfaces the
     budgeted search then finds the optimum within 3% on 25 of 30 seeds instead of 30:
     admit them once GPU timings show 64-row tiles pay (DeepSeek-V3's group boundaries)."""
  tile = out_rows * out_cols
  if tile > 128 * 32 * cfg.num_warps:
    return False
  if cfg.num_warps < 4 and tile >= 64 * 64:
    return False
  if cfg.num_warps == 8 and tile < 64 * 128:
    return False
  if cfg.block_n == 256 and cfg.num_warps < 8:
    return False
  return True


def space(op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None) -> list[TritonConfig]:
  rows, contraction, cols = dims(op, dtype, m, k, n)
  if scheme(dtype) and not quantized_op(op, dtype):
    return []  # quantized operands: the forward, and drhs of a training format
  if op == "drhs":
    grid = itertools.product(
      SPACE_TGMM_BLOCK_M,
      SPACE_TGMM_BLOCK_K,
      SPACE_TGMM_BLOCK_N,
      SPACE_NUM_WARPS,
      SPACE_NUM_STAGES,
      (TritonConfig.group_m,),
      SPACE_GROUP_K,
    )
  else:
    grid = itertools.product(
      SPACE_BLOCK_M,
      SPACE_BLOCK_K_8BIT if itemsize(dtype) == 1 else SPACE_BLOCK_K,
      SPACE_BLOCK_N,
      SPACE_NUM_WARPS,
      SPACE_NUM_STAGES,
      SPACE_GROUP_M,
      (TritonConfig.group_k,),
    )
  out = []
  for bm, bk, bn, w, s, gm, gk in grid:
    cfg = TritonConfig(bm, bk, bn, w, s, group_m=gm, group_k=gk).clamped(rows, contraction, cols)
    out_rows, out_cols = (cfg.block_k, cfg.block_n) if op == "drhs" else (cfg.block_m, cfg.block_n)
    if worth_timing(cfg, out_rows, out_cols) and cfg.fits(op, dtype, m, k, n, device_kind):
      out.append(cfg)
  return out


def launch_key(cfg: TritonConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> TritonConfig:
  """Blocks clamped to the shape, and a gmm band no wider than the widest group (drhs: than
  the k blocks)."""
  cfg = cfg.clamped(*op_dims(op, m, k, n))
  if op == "drhs":
    return dataclasses.replace(cfg, group_k=min(cfg.group_k, -(-k // cfg.block_k)))
  widest = max([t for t in row_tiles(group_sizes, m, cfg.block_m, group_start=True)[0] if t] or [1])
  return dataclasses.replace(cfg, group_m=min(cfg.group_m, widest))


def grid_work(cfg: TritonConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> GridWork:
  """gmm.py's and tgmm.py's grids. Their refs are whole arrays (each program indexes them);
  gmm reads and stores under pl.when, tgmm reads unconditionally. Both cut a group's rows
  from its first row (common.tile_schedule's group_start)."""
  rows, contraction, cols = op_dims(op, m, k, n)
  c = cfg.clamped(rows, contraction, cols)
  g = len(group_sizes)
  group_tiles, rest = row_tiles(group_sizes, m, c.block_m, group_start=True)
  if op == "drhs":  # a program per (group, k block, n block), reducing over its group's row blocks
    cells = -(-k // c.block_k) * -(-n // c.block_n)
    steps = g * cells
    return GridWork(steps, steps, 0, g * k * n, sum(group_tiles) * cells, c.block_m * c.block_k * c.block_n)
  col_blocks = -(-cols // c.block_n)
  return GridWork(
    steps=(-(-rows // c.block_m) + g + 1) * col_blocks,  # common.num_tiles_bound
    tile_steps=(sum(group_tiles) + rest) * col_blocks,
    read_elems=rows * contraction + g * contraction * cols,
    write_elems=rows * cols,
    inner_steps=sum(group_tiles) * col_blocks * -(-contraction // c.block_k),
    inner_macs=c.block_m * c.block_k * c.block_n,
  )
