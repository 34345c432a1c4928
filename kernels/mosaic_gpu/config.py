"""Mosaic GPU config: its knobs and ranges, the fit in shared memory, the defaults, and
the search space a sweep draws from.

The kernels are warp-specialized (gmm.py, tgmm.py): one producer warpgroup issues the TMA
loads, and two consumer warpgroups split the CTA's output tile and run wgmma on it.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels import quant
from kernels.backend import GridWork, InterpretCost
from kernels.common import (
  check_int_range,
  gpu_smem_limit,
  itemsize,
  narrowed_to_fit,
  op_dims,
  register_split,
  round_up,
  row_tiles,
  scheme,
  tiles_evenly,
)

BLOCK_M = (64, 128, 256)
BLOCK_N = (64, 128, 256)
BLOCK_K = (64, 128, 256)
STEPS_RANGE = (2, 8)
BAND_RANGE = (1, 64)
CONSUMERS = 2  # consumer warpgroups; a third one produces
# The warpgroups of a CTA, each a thread the interpreter can block (Backend.interpreter_threads);
# it runs CTAs one by one.
INTERPRETER_THREADS = CONSUMERS + 1
WGMMA_M = 64  # rows of one warpgroup's wgmma
SWIZZLE_ELEMS = 64  # 16-bit elements in a 128-byte swizzle row: the unit any operand tile is cut in
EPI_TILE = 64  # the epilogue stores [64, 64] sub-tiles through epilogue_slots() slots per consumer


def epilogue_slots(quantized: bool) -> int:
  """[64, 64] output slots per consumer: two, so a sub-tile's store overlaps the next one's
  write; one for quantized (fp8) operands, whose epilogue waits for every store before it
  reuses a slot anyway (gmm.py), leaving 16 KiB to the pipeline."""
  return 1 if quantized else 2


# Quantized operands the gmm takes (kernels.quant). Channelwise scales are applied once, in
# the epilogue. Block scales vary along k: each 128-deep k step's wgmma goes into a fresh
# step accumulator, which is then scaled and added into the f32 main one ("promotion", as
# DeepGEMM does; it also bounds the fp8 tensor cores' ~14-bit accumulation to one step).
FP8_FORMATS = ("float8_e4m3fn:channelwise", "float8_e4m3fn:block128")
FP8_BLOCK_K = 128  # one 128-byte swizzle row of 8-bit elements; block128's k block
# block128 with block_k 256: a step of two k blocks, each with a step accumulator of its own,
# each promoted while the other's wgmma runs (gmm.py's overlapped_step). A main and two step
# accumulators are 3 x 64 f32 registers a thread on a 64x128 share, of the 232 a consumer has.
FP8_PAIR_K = 256
# fp8 training's drhs (tgmm.py's tgmm_quantized): a step is one 128-token block (its scales' block),
# cells [128, 128] of [k, n], each consumer a 64x128 main and step accumulator (128 of 240
# registers; a 64x256 share would need 256).
FP8_DRHS_TILE = (128, 128, 128)


def k_multiple(block_k: int, dtype) -> int:
  """What gmm's wrapper pads k to: block_k, or for block128 its 128-block whatever block_k (a
  256-deep step over an odd count of blocks reads its last half past k, as zeros, by TMA)."""
  return FP8_BLOCK_K if scheme(getattr(dtype, "name", None) or str(dtype)) == "block128" else block_k


# Each consumer's share of the tile with channelwise fp8: the one that compiles with no spill
# on sm_90a with the scales' epilogue. 64x64, 64x128 and 128x128 spilled 8-48 B/thread inside
# the persistent loop (deviceless ptxas, jax 0.10.2 and 0.12; without the scales they do not):
# fp8 cells are 128x256, two 64x256 consumers.
FP8_CONSUMER_TILE = (64, 256)
# block128: each consumer holds an f32 main accumulator and a 64x128 (or 64x64) step one, and
# promotes a 128-column block of the weights' scales at a time, one scale each. A 64x256
# share runs its k step in two halves through the one step accumulator: 128 + 64 registers a
# thread of its 232, which deviceless ptxas builds with no spill (jax 0.10.2 and 0.12) once
# the second half's wgmma waits for the first's promotion (gmm.py's promote).
FP8_BLOCK_CONSUMER_TILES = ((64, 256), (64, 128), (64, 64))

# setmaxnreg (common.register_split): the producer warpgroup only issues TMA and goes down to
# this many registers a thread; the two consumers take the rest of the CTA's pool, gmm's 232
# and tgmm's 240 (at 232 ptxas spills 8 B/thread in tgmm's wgmma loop with jax 0.10.2: the
# H100 drhs default, built deviceless).
PRODUCER_REGISTERS = {"gmm": 40, "tgmm": 24}


def jax_consumer_registers(producer: int, consumers: int) -> int:
  """What jax's emit_pipeline_warp_specialized has each consumer warpgroup ask for when its
  producer keeps `producer` (its _compute_registers, jax 0.10-0.12): (512 - producer) /
  consumers in multiples of 8, at most 256. 512 is a one-warpgroup CTA's pool a thread;
  three warpgroups start at 168 each, 504."""
  return int(min(256.0, (512 - producer) / consumers) // 8 * 8)


def pipeline_registers(kernel: str) -> int:
  """The producer's count for `kernel`'s pipeline ("gmm" or "tgmm"), checked against the pool:
  ValueError when jax's split asks for more than common.register_split leaves, a kernel that
  would hang in its consumers' setmaxnreg (tgmm's 32 did: 32 + 2 x 240 = 512 > 504)."""
  producer = PRODUCER_REGISTERS[kernel]
  fits = register_split(CONSUMERS + 1, producer, CONSUMERS)
  asked = jax_consumer_registers(producer, CONSUMERS)
  if asked > fits:
    raise ValueError(
      f"{kernel}: a producer at {producer} registers gets its {CONSUMERS} consumers {asked} each from jax's "
      f"pipeline, over the {fits} the CTA's pool leaves them: setmaxnreg would wait forever"
    )
  return producer


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """Mosaic GPU (Hopper TMA + wgmma, warp-specialized) kernel config, in the op's own frame.

  block_m:  fwd/dlhs: rows per CTA output tile (64, 128 or 256); drhs: rows of a group
            reduced per pipeline step (64 or 128).
  block_n:  output columns per CTA tile: 64, 128 or 256.
  block_k:  fwd/dlhs: contraction per pipeline step (64 or 128; fp8 block128 also 256, two
            k blocks a step); drhs: output rows (of k) per CTA tile (128 or 256).
  max_concurrent_steps: TMA pipeline depth (operand stages in flight); 2..8.
  group_m:  band of the group-major launch order (common.launch_cell): this many row
            tiles of one group walk the column blocks together (drhs: k tiles over the n
            tiles). In [1, 64].
  narrow_tail: fwd/dlhs on 16-bit operands, 128-row cells of 128 or 256 columns: a cell
            whose rows to store end by its 64th row (counted from the tile's first row, its
            group's first row rounded down to 8: a group's short last tile, or a short group)
            runs as a 64-row cell, the two consumers splitting its columns, so it costs the
            MMA work of 64 rows, not 128 (gmm.computed_rows). No effect elsewhere
            (narrow_tail_applies). Off unless set (a config saved before it existed was
            measured without it); the defaults set it where it applies.

  The two consumer warpgroups split the CTA tile (consumer_tile): fwd/dlhs by rows when
  block_m >= 128, else by columns; drhs by its block_k output rows. Rows are cut from each
  group's first row (group-start tiles), so only a group's last tile is partial.
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  group_m: int = 1
  narrow_tail: bool = False

  def __post_init__(self):
    for name, allowed in (("block_m", BLOCK_M), ("block_n", BLOCK_N), ("block_k", BLOCK_K)):
      v = getattr(self, name)
      if isinstance(v, bool) or v not in allowed:
        raise ValueError(f"MosaicConfig.{name} must be one of {allowed}, got {v!r}")
    check_int_range("MosaicConfig", "max_concurrent_steps", self.max_concurrent_steps, *STEPS_RANGE)
    check_int_range("MosaicConfig", "group_m", self.group_m, *BAND_RANGE)
    if not isinstance(self.narrow_tail, bool):
      raise ValueError(f"MosaicConfig.narrow_tail must be true or false, got {self.narrow_tail!r}")

  def narrow_tail_applies(self, op: str, dtype=None) -> bool:
    """Whether `op`'s kernel runs a cell whose rows fit in 64 as a 64-row cell (narrow_tail):
    fwd/dlhs on unquantized operands (`dtype` a format of common.FORMATS, None: 16-bit),
    cells of 128 rows (two consumers of 64 stacked) and at least 128 columns (a half is then
    whole 64-column swizzle rows)."""
    quantized = dtype is not None and itemsize(getattr(dtype, "name", None) or str(dtype)) == 1
    rows_split = self.block_m == CONSUMERS * WGMMA_M
    return self.narrow_tail and op != "drhs" and not quantized and rows_split and self.block_n >= 128

  def consumer_tile(self, op: str) -> tuple[int, int, bool]:
    """(rows, cols, split_rows): each consumer warpgroup's share of the CTA output tile and
    whether the two shares stack by rows (else side by side by columns)."""
    if op == "drhs":
      return self.block_k // CONSUMERS, self.block_n, True
    if self.block_m >= CONSUMERS * WGMMA_M:
      return self.block_m // CONSUMERS, self.block_n, True
    return self.block_m, self.block_n // CONSUMERS, False

  def valid_for(self, op: str, dtype=None) -> str | None:
    """Why this config cannot drive `op`'s kernel on operands of `dtype` (a format of
    common.FORMATS; None: 16-bit), or None: each consumer's share must be whole wgmma rows
    (64) and whole swizzle rows of columns (64); 8-bit operands step k by one 128-byte
    swizzle row (128) and run the forward only."""
    rows, cols, _ = self.consumer_tile(op)
    name = getattr(dtype, "name", None) or str(dtype)
    pair = dtype is not None and itemsize(name) == 1 and scheme(name) == "block128" and self.block_k == FP8_PAIR_K
    if dtype is not None and itemsize(name) == 1 and op == "drhs":
      if scheme(name) != "block128":
        return f"8-bit drhs runs the training format's block scales only, not {name}"
      if (self.block_m, self.block_k, self.block_n) != FP8_DRHS_TILE:
        return (
          f"8-bit drhs takes block_m, block_k, block_n = {FP8_DRHS_TILE} (a 128-token block a step into "
          f"two 64x128 consumer shares, each a main and a step accumulator), got "
          f"{(self.block_m, self.block_k, self.block_n)}"
        )
      return None
    if dtype is not None and itemsize(name) == 1 and op == "dlhs" and scheme(name) != "block128":
      return f"8-bit dlhs runs the training format's block scales only, not {name}"
    if dtype is not None and itemsize(name) == 1:  # fwd, and dlhs: the same kernel, rhs read the other way
      block = scheme(name) == "block128"
      if pair and rows * cols > WGMMA_M * quant.BLOCK:
        return f"block_k {FP8_PAIR_K} (two step accumulators) takes consumer tiles of at most 64x128, got {rows}x{cols}"
      if self.block_k != FP8_BLOCK_K and not pair:
        return (
          f"8-bit operands take block_k = {FP8_BLOCK_K} (a 128-byte swizzle row), or {FP8_PAIR_K} with block "
          f"scales, got {self.block_k}"
        )
      if block:
        # A share wider than a 128-column block is promoted a block at a time; it only comes
        # from a cell split by rows, so it starts on a block.
        # A 256-deep step promotes each 128-deep half on its own.
        if (rows, cols) not in FP8_BLOCK_CONSUMER_TILES or quant.tile_violation(
          name, min(self.block_k, FP8_BLOCK_K), min(cols, quant.BLOCK)
        ):
          tiles = " or ".join(f"{r}x{c}" for r, c in FP8_BLOCK_CONSUMER_TILES)
          return f"block scales take {tiles} consumer tiles (a main and a step accumulator), got {rows}x{cols}"
      elif (rows, cols) != FP8_CONSUMER_TILE:
        return f"8-bit operands take {FP8_CONSUMER_TILE[0]}x{FP8_CONSUMER_TILE[1]} consumer tiles, got {rows}x{cols}"
    if op == "drhs" and self.block_m > 128:
      return f"drhs reduces at most 128 rows a step, got block_m={self.block_m}"
    if op != "drhs" and self.block_k > 128 and not pair:
      return f"fwd/dlhs take at most 128 of k a step, got block_k={self.block_k}"
    if rows % WGMMA_M or cols % SWIZZLE_ELEMS:
      return f"each of the 2 consumer warpgroups needs a [64k, 64k] share of the tile, got [{rows}, {cols}]"
    return None

  def smem_bytes(self, op: str, dtype: str, m: int, k: int, n: int) -> int:
    """Shared memory the kernel allocates: max_concurrent_steps stages of the operand tiles
    (gmm: [block_m, block_k] lhs and [block_k, block_n] rhs; tgmm: [block_m, block_k] lhs and
    [block_m, block_n] dout, and fp8's per-column scales of both), and the epilogue's [64, 64]
    slots per consumer (two; fp8's gmm one), in the
    output dtype, taken as `dtype` (bf16 for 8-bit operands), and fp8's scales: channelwise
    each consumer's row and column vectors; block128 a stage's [block_k / 128, block_m] row scales. The
    allocation is made once for the persistent loop, so every stage is taken whatever the
    problem's length."""
    del m, k, n
    b = itemsize(dtype)
    if op == "drhs":
      stage = self.block_m * (self.block_k + self.block_n)
    else:
      stage = self.block_k * (self.block_m + self.block_n)
    out = CONSUMERS * epilogue_slots(b == 1) * EPI_TILE * EPI_TILE * (2 if b == 1 else b)  # 8-bit: bf16 out
    if op == "drhs":  # tgmm's two slots a consumer; 8-bit: a step's column scales of both operands
      out = CONSUMERS * 2 * EPI_TILE * EPI_TILE * (2 if b == 1 else b)
      return (stage * b + (4 * (self.block_k + self.block_n) if b == 1 else 0)) * self.max_concurrent_steps + out
    rows, cols, _ = self.consumer_tile(op)
    # f32, each consumer's, with their barriers and alignment (Mosaic allocated 616 B more than
    # the vectors alone for the 128x256 tile; 1 KiB covers it).
    scales = CONSUMERS * (rows + cols) * 4 + 1024 if scheme(dtype) == "channelwise" else 0
    stage_scales = self.block_m * 4 * (self.block_k // FP8_BLOCK_K) if scheme(dtype) == "block128" else 0
    return (stage * b + stage_scales) * self.max_concurrent_steps + out + scales

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    """Whether this config drives `op` on `dtype` and its shared memory fits a block on
    `device_kind`; a quantized format, only those of FP8_FORMATS."""
    if scheme(dtype) and dtype not in FP8_FORMATS:
      return False
    return self.valid_for(op, dtype) is None and self.smem_bytes(op, dtype, m, k, n) <= gpu_smem_limit(device_kind)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# --- defaults -----------------------------------------------------------------------------

# In the op's own frame. Why: 128x256 CTA tiles (two 64x256 consumers) halve the operand
# traffic per MMA against 128x128; block_k 64 is one 128-byte swizzle row of 16-bit
# elements; four stages (48 KiB each) hide HBM latency. A band of 16 row tiles holds a whole
# Mixtral group (a group of 1024+ rows spans 9 tiles when it starts off the 128-row grid, and
# a band of 8 would stream that expert's weights twice: benchmarks/l2_traffic.py, 1.50x the
# unique bytes at group_m 8, 1.00x at 16). One H200 disagrees: band 8 beat 16 on Mixtral fwd
# (1.378 vs 1.474 ms) and band 4 beat 16 on DeepSeek-V3 up (6.01 vs 8.14 ms), which the model
# does not explain (results/nvidia-h200/records.jsonl); kept until more shapes are timed.
# Few rows per group (decode) take 64-row tiles split by columns, so less of each tile is
# wasted on rows past the group.
# drhs reduces 64 rows a step into a [128, 256] tile of [k, n].
_DEFAULTS = {
  "gmm": MosaicConfig(block_m=128, block_n=256, block_k=64, max_concurrent_steps=4, group_m=16, narrow_tail=True),
  "tgmm": MosaicConfig(block_m=64, block_n=256, block_k=128, max_concurrent_steps=4, group_m=4),
}


def default(op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None) -> MosaicConfig:
  cfg = _DEFAULTS["tgmm" if op == "drhs" else "gmm"]
  if op == "drhs" and itemsize(dtype) == 1:  # the one tile it takes; 5 stages of 33 KiB (unmeasured)
    bm, bk, bn = FP8_DRHS_TILE
    cfg = dataclasses.replace(cfg, block_m=bm, block_k=bk, block_n=bn, max_concurrent_steps=5)
    return narrowed_to_fit(cfg, (), STEPS_RANGE[0], lambda c: c.fits(op, dtype, m, k, n, device_kind))
  if op != "drhs" and max(1, m // max(1, g)) <= 96:
    cfg = dataclasses.replace(cfg, block_m=64)
  if scheme(dtype) == "block128":  # two 64x128 consumers: by rows, or by columns for few rows a group
    if cfg.block_m == 64:  # decode streams weights: the deepest pipeline of 128-deep steps
      cfg = dataclasses.replace(cfg, block_n=256, block_k=FP8_BLOCK_K, max_concurrent_steps=5)
    else:  # prefill: 256-deep steps, each block's promotion behind the next block's wgmma
      pair = dataclasses.replace(cfg, block_n=128, block_k=FP8_PAIR_K, max_concurrent_steps=3)
      # Where 2 such stages do not fit, 128-deep steps keep a deeper pipeline.
      fits = dataclasses.replace(pair, max_concurrent_steps=STEPS_RANGE[0]).fits(op, dtype, m, k, n, device_kind)
      cfg = pair if fits else dataclasses.replace(pair, block_k=FP8_BLOCK_K, max_concurrent_steps=5)
  elif itemsize(dtype) == 1:  # the same 128-byte rows of k, twice the elements; 128x256 cells
    cfg = dataclasses.replace(cfg, block_m=128, block_n=256, block_k=FP8_BLOCK_K)
  # A device with less shared memory than Hopper gets fewer stages in flight, then narrower tiles.
  cfg = narrowed_to_fit(cfg, (128,), STEPS_RANGE[0], lambda c: c.fits(op, dtype, m, k, n, device_kind))
  return dataclasses.replace(cfg, narrow_tail=cfg.narrow_tail_applies(op, dtype))  # off where it does nothing


# --- search space -------------------------------------------------------------------------

SPACE_BLOCK_M = (64, 128, 256)
SPACE_BLOCK_N = (64, 128, 256)
SPACE_BLOCK_K = (64, 128)
SPACE_TGMM_BLOCK_M = (64, 128)
SPACE_TGMM_BLOCK_K = (128, 256)
SPACE_STEPS = (2, 3, 4, 5, 6)
SPACE_GROUP_M = (1, 2, 4, 8, 16)
# f32 accumulator elements one consumer warpgroup holds in registers (128 threads): 64x256
# is 128 values a thread, under setmaxnreg's 232 for a consumer. block128 adds a step
# accumulator of at most 64x128, two with block_k 256 (valid_for).
MAX_ACC = 64 * 256


def space(op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None) -> list[MosaicConfig]:
  """Configs that drive the op, fit shared memory on `device_kind`, keep each consumer's
  accumulator in registers, and tile the dims evenly: a ragged column tile wastes a wgmma,
  and a block_k that does not divide k makes the wrapper pad (copy) the operands."""
  rows, contraction, cols = op_dims(op, m, k, n)
  if itemsize(dtype) == 1 and (dtype not in FP8_FORMATS or (op != "fwd" and dtype not in quant.TRAINING_FORMATS)):
    return []  # 8-bit dlhs and drhs: fp8 training's format only
  if op == "drhs" and itemsize(dtype) == 1:
    axes = tuple((v,) for v in FP8_DRHS_TILE)
  elif op == "drhs":
    axes = (SPACE_TGMM_BLOCK_M, SPACE_BLOCK_N, SPACE_TGMM_BLOCK_K)
  else:
    fp8_k = (FP8_BLOCK_K, FP8_PAIR_K) if scheme(dtype) == "block128" else (FP8_BLOCK_K,)
    axes = (SPACE_BLOCK_M, SPACE_BLOCK_N, fp8_k if itemsize(dtype) == 1 else SPACE_BLOCK_K)
  out = []
  for bm, bn, bk, steps, band in itertools.product(*axes, SPACE_STEPS, SPACE_GROUP_M):
    cfg = MosaicConfig(bm, bn, bk, steps, band)
    acc_rows, acc_cols, _ = cfg.consumer_tile(op)
    if op == "drhs":  # block_m steps over rows; [block_k, block_n] tiles the [k, n] output
      evenly = tiles_evenly(contraction, bk) and tiles_evenly(cols, bn)
      too_big = band > max(1, -(-contraction // bk))
    else:
      evenly = tiles_evenly(cols, bn) and (contraction % k_multiple(bk, dtype) == 0 or bk == 64)
      too_big = bm > max(64, round_up(rows, 64))
    if acc_rows * acc_cols <= MAX_ACC and evenly and not too_big and cfg.fits(op, dtype, m, k, n, device_kind):
      # With narrow_tail where it applies, and without it (the sweep measures what it buys).
      narrow = dataclasses.replace(cfg, narrow_tail=True)
      if narrow.narrow_tail_applies(op, dtype):
        out.append(narrow)
      out.append(cfg)
  return out


def launch_key(cfg: MosaicConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> MosaicConfig:
  """A band no wider than the widest group's row tiles (drhs: than the k tiles)."""
  rows, _, _ = op_dims(op, m, k, n)
  if op == "drhs":
    widest = -(-round_up(k, 64) // cfg.block_k)
  else:
    widest = max([t for t in row_tiles(group_sizes, rows, cfg.block_m, group_start=True, align=8)[0] if t] or [1])
  return dataclasses.replace(cfg, group_m=min(cfg.group_m, widest))


def grid_work(cfg: MosaicConfig, op: str, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> GridWork:
  """gmm.py's and tgmm.py's output cells (the persistent programs share them out), after the
  wrappers' padding: rows to 8, columns to a 64-element swizzle row, gmm's k to block_k."""
  rows, contraction, cols = op_dims(op, m, k, n)
  g = len(group_sizes)
  m_pad = round_up(rows, 8)
  if op == "drhs":  # cells (group, k tile, n tile); a pipeline step per block_m rows of the group
    k_pad, n_pad = round_up(k, 64), round_up(n, 64)
    tiles = -(-k_pad // cfg.block_k) * -(-n_pad // cfg.block_n)
    steps = g * tiles
    out = g * round_up(k_pad, cfg.block_k) * round_up(n_pad, cfg.block_n)
    blocks = sum(row_tiles(group_sizes, rows, cfg.block_m, group_start=True, align=8)[0])
    return GridWork(steps, steps, m_pad * (k_pad + n_pad), out, blocks * tiles, cfg.block_m * cfg.block_k * cfg.block_n)
  k_pad, n_pad = round_up(contraction, cfg.block_k), round_up(cols, 64)
  col_blocks = -(-n_pad // cfg.block_n)
  group_tiles, rest = row_tiles(group_sizes, m_pad, cfg.block_m, group_start=True, align=8)
  cells = (sum(group_tiles) + rest) * col_blocks
  return GridWork(
    steps=cells,
    tile_steps=cells,
    read_elems=m_pad * k_pad + g * k_pad * n_pad,
    write_elems=m_pad * col_blocks * cfg.block_n,
    inner_steps=sum(group_tiles) * col_blocks * (k_pad // cfg.block_k),
    inner_macs=cfg.block_m * cfg.block_k * cfg.block_n,
  )


# jax's Mosaic GPU interpreter (ragtune's estimate of a sweep on a CPU; Backend.interpret_cost).
# Least squares on the relative error of 20 interpreted runs of these kernels (bf16; fwd, and
# dlhs and drhs under tests/kernels/mgpu_interpret.py's transposed-tile reads, which jax 0.11's
# interpreter has itself; 1 to 64 cells, 1 to 1536 pipeline steps, 3 to 25 s a run) on a 2-core
# x86 host at load 1-2.5, jax 0.10.2: within 0.75-1.2x of each. A run costs about 3.4 s before
# its first cell (2 simulated SMs of 3 warpgroups, each a host thread), 20 ms a cell and 11 ms a
# pipeline step plus its dot; a term per operand element improved no fit (201M elements of
# weights ran as fast as 8K). Under a load of 6-9 from other processes the same runs took
# 1.3-3.8x as long. compile: what a sweep's candidate rows took beyond 5 of their median runs
# (compile, build, check and the runs' spread), in calibration compiles: median 3.5 over 10 rows.
INTERPRET_COST = InterpretCost(
  call=1.8e7, step=0, tile_step=1.1e5, read=0, write=0, mac=0.027, compile=3.5, inner_step=5.9e4
)
