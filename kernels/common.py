"""What every backend shares: ops and their dims, dtypes, GPU archs (kernels.gpus) and their shared
memory, TPU chips and their memories, group metadata (which rows each tile covers) and a
vmap helper.

This module imports only jax, numpy and kernels.gpus: the backend folders and the registry build on it.

Group metadata. Row ranges of groups and the map from launched tiles to (segment, row block).

The rows [0, m) are cut into contiguous *segments*:

  segment 0             rows before the local groups (other shards' groups) -> zeros
  segments 1..g_local   local group i-1 (rhs[i-1])
  segment g_local+1     rows after the local groups, including rows past sum(group_sizes) -> zeros

Two ways to cut a segment into row tiles of block_m rows (`group_start`):

- aligned (False): tiles sit on the fixed block_m grid of [0, m); a grid block that
  straddles a segment boundary is visited once per segment it touches, each visit writing
  only its own rows, so every boundary costs one extra partial tile;
- group-start (True): a segment's first tile starts at its first row (or up to `align` - 1
  rows before it, see tile_schedule), and only its last tile is partial (tokamax's Triton
  kernel and DeepGEMM cut groups the same way).

Either way an empty segment costs no tile and every output row is written exactly once:
no memset, no races.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels import gpus

OPS = ("fwd", "dlhs", "drhs")


def op_order(op: str) -> int:
  """The one order of ops in what is listed (sweep, show, verify, plan): OPS's, the order
  the layer's forward and backward passes run in; an unknown op last."""
  return OPS.index(op) if op in OPS else len(OPS)


DTYPES = ("bfloat16", "float16", "float32")
# Quantized operands: an element dtype and a scale scheme (kernels/quant.py), written
# "<dtype>:<scheme>". Where a LUT, a config or a tuner says "dtype" it means one of
# FORMATS: the plain dtypes, or these.
QUANT_DTYPES = ("float8_e4m3fn", "int8")
SCHEMES = ("channelwise", "block128")
QUANT_FORMATS = tuple(f"{d}:{s}" for d in QUANT_DTYPES for s in SCHEMES)
FORMATS = DTYPES + QUANT_FORMATS
# The formats kernels.ragged_dot trains in (quantize=): DeepSeek-V3's recipe, all three ops on
# fp8 kernels (kernels.quant). The others are forward only.
TRAINING_FORMATS = ("float8_e4m3fn:block128",)


def gpu_family(device_kind: str | None) -> str:
  """The arch (kernels.gpus.ARCHS: 'ampere', 'ada', 'hopper', 'blackwell', ...; 'other' when
  unknown) of a jax device_kind."""
  return gpus.arch(device_kind).name


def gpu_smem_limit(device_kind: str | None) -> int:
  """Shared memory one block may opt into on a device of this kind (kernels.gpus)."""
  return gpus.arch(device_kind).smem_per_block


# Registers of a warp-specialized CTA. Every thread starts with the launch count; setmaxnreg
# (PTX ISA, "setmaxnreg") then moves them between warpgroups: .dec gives a warpgroup's
# registers above its new count back to the CTA's pool, and .inc waits until the pool holds
# what it asks for. The pool is what the CTA was launched with, launch registers x threads,
# so a plan that asks for more waits forever: a deadlock, which no interpreter shows.
REGISTER_FILE = gpus.REGISTERS_PER_SM
WARPGROUP = 128  # threads
SETMAXNREG_RANGE = (24, 256)  # a setmaxnreg count is a multiple of 8 in this range (PTX ISA)


def launch_registers(threads: int) -> int:
  """The most registers a thread of a `threads`-thread CTA can start with, one CTA an SM: the
  register file shared out in ptxas's units of 8, at most 255 (168 for 3 warpgroups)."""
  return min(255, REGISTER_FILE // threads // 8 * 8)


def register_split(warpgroups: int, producer: int, consumers: int) -> int:
  """The registers a thread each of `consumers` warpgroups can ask for with setmaxnreg.inc
  once the other warpgroups (producers) have gone down to `producer`: what is left of the
  pool of a CTA of `warpgroups` warpgroups launched at launch_registers, shared out in
  multiples of 8 (at most 256). ValueError when `producer` is no setmaxnreg count or leaves
  the consumers less than they start with."""
  lo, hi = SETMAXNREG_RANGE
  if producer % 8 or not lo <= producer <= hi:
    raise ValueError(f"setmaxnreg takes a multiple of 8 in [{lo}, {hi}], got {producer}")
  launch = launch_registers(warpgroups * WARPGROUP)
  pool = launch * warpgroups  # per thread of a warpgroup
  share = min(hi, (pool - producer * (warpgroups - consumers)) // consumers // 8 * 8)
  if share < launch:
    raise ValueError(
      f"a producer at {producer} registers leaves {consumers} consumers {share}, under the {launch} they start with"
    )
  return share


# --- TPU chips ----------------------------------------------------------------------------
# Device facts, as kernels.gpus has a GPU's: which TPU a jax device_kind is, and its memories.

MIB, GIB = 1 << 20, 1 << 30


@dataclasses.dataclass(frozen=True)
class TpuChip:
  """A TPU generation as a Pallas kernel meets it.

  scoped_vmem: the VMEM XLA lets one kernel's tiles take when the kernel asks for no limit of
    its own (megablox asks for none): 16 MiB on v4, v5e and v5p, 32 MiB on v6e and v7x, as
    libtpu's compiler reports it ("Scoped allocation with size ... and limit 16.00M"). A tiling
    over it does not compile.
  hbm: bytes of HBM per device (Cloud TPU's system architecture pages:
    https://cloud.google.com/tpu/docs/system-architecture-tpu-vm). A v7x chip's two
    TensorCores are two jax devices (no megacore), each with half its 192 GiB
    (https://cloud.google.com/tpu/docs/tpu7x).
  mxu: how the MXU takes 8-bit operands of each element dtype (kernels.quant), as libtpu's
    Mosaic compiler lowers a Pallas dot of them (the matmul data format of its LLO; libtpu
    0.0.42 and 0.0.50): NATIVE at the MXU's 8-bit rate (int8 on v5e, v5p and v6e, twice
    their bf16 rate; fp8 on v7x, twice its bf16 rate: Cloud TPU's v5e, v5p, v6e and tpu7x
    pages), TO_BF16 converted to bfloat16 on the way in (exact for e4m3 and int8; bf16's
    rate, half the bytes read). A dtype missing is one Mosaic refuses ("Unsupported matmul
    RHS type"), as v4 refuses both.
  """

  name: str  # the --target name
  device_kinds: tuple[str, ...]  # jax's device_kind strings; the first is libtpu's compile-only client's
  scoped_vmem: int
  hbm: int
  mxu: tuple[tuple[str, str], ...] = ()

  def mxu_path(self, dtype: str) -> str:
    """NATIVE, TO_BF16, or "" (no matmul of it) for an operand element dtype."""
    return dict(self.mxu).get(dtype, "")


NATIVE, TO_BF16 = "native", "to bf16"
_INT8_MXU = (("int8", NATIVE), ("float8_e4m3fn", TO_BF16))

CHIPS = (
  TpuChip("v4", ("TPU v4",), 16 * MIB, 32 * GIB),
  TpuChip("v5e", ("TPU v5 lite", "TPU v5e"), 16 * MIB, 16 * GIB, _INT8_MXU),
  TpuChip("v5p", ("TPU v5", "TPU v5p"), 16 * MIB, 95 * GIB, _INT8_MXU),
  TpuChip("v6e", ("TPU v6 lite", "TPU v6e"), 32 * MIB, 32 * GIB, _INT8_MXU),
  # jax and libtpu spell its kind one way only
  TpuChip("v7x", ("TPU7x",), 32 * MIB, 96 * GIB, (("float8_e4m3fn", NATIVE), ("int8", TO_BF16))),
)


def chip(device_kind: str | None) -> TpuChip | None:
  """The TpuChip of a jax device_kind (any of its spellings), or None."""
  return next((c for c in CHIPS if device_kind in c.device_kinds), None)


def tpu_format_refusal(device_kind: str | None, fmt: str) -> str:
  """Why a TPU's MXU takes no operands of a quantized format (one of QUANT_FORMATS), or "".
  A TPU ragtune has no facts of (v2, v3, a newer one) is refused too: Mosaic's error is no
  place to learn it, and XLA's dequantized path runs anywhere."""
  if ":" not in fmt:
    return ""
  c = chip(device_kind)
  able = [x.name for x in CHIPS if x.mxu_path(element_dtype(fmt))]
  if c is None:
    return f"ragtune knows no 8-bit MXU facts of {device_kind!r}; {fmt} runs on {able}"
  if c.mxu_path(element_dtype(fmt)):
    return ""
  return f"{device_kind} ({c.name}) has no {element_dtype(fmt)} matmul (Mosaic refuses it); {fmt} runs on {able}"


def canonical_kind(device_kind: str) -> str:
  """One spelling per TPU chip (jax names v5p "TPU v5" or "TPU v5p"): the compile-only
  client's; any other device kind as it is."""
  c = chip(device_kind)
  return c.device_kinds[0] if c else device_kind


def is_pow2(x: int) -> bool:
  return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


def next_pow2(x: int) -> int:
  return 1 << max(0, int(x) - 1).bit_length()


def narrowed_to_fit(cfg, block_ns, min_steps: int, fits):
  """A TMA kernel's default on a device with less shared memory: `cfg` with fewer stages in
  flight (max_concurrent_steps down to min_steps), then each narrower block_n of `block_ns`,
  until fits(config); `cfg` itself when none fits."""
  for block_n in sorted({cfg.block_n, *block_ns}, reverse=True):
    narrowed = dataclasses.replace(cfg, block_n=block_n)
    while narrowed.max_concurrent_steps > min_steps and not fits(narrowed):
      narrowed = dataclasses.replace(narrowed, max_concurrent_steps=narrowed.max_concurrent_steps - 1)
    if fits(narrowed):
      return narrowed
  return cfg


def round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def tiles_evenly(dim: int, block: int, unit: int = 64) -> bool:
  """Whether `block` splits `dim`, rounded up to `unit` (the 64-element swizzle row a TMA
  kernel pads to), into whole tiles; `unit` itself always does."""
  return block == unit or round_up(dim, unit) % block == 0


def element_dtype(fmt: str) -> str:
  """The operands' element dtype of a format: 'float8_e4m3fn' for 'float8_e4m3fn:block128'."""
  return fmt.split(":", 1)[0]


def scheme(fmt: str) -> str:
  """The scale scheme of a format (one of SCHEMES), or "" for plain operands."""
  return fmt.split(":", 1)[1] if ":" in fmt else ""


def itemsize(dtype: str) -> int:
  """Bytes of one operand element of a format."""
  return {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "int8": 1}.get(element_dtype(dtype), 4)


def op_dims(op: str, m: int, k: int, n: int) -> tuple[int, int, int]:
  """The (rows, contraction, columns) an op computes, given the forward (m, k, n).

  A config is always in the frame of the op it drives; LUT keys always use the forward
  problem's (m, k, n, g). So a dlhs block_k tiles the forward n.

  fwd:  [m,k] x [k,n] -> [m,n]
  dlhs: [m,n] x [n,k] -> [m,k]   (megablox calls its LutFn with (m, n, k) here)
  drhs: [k,m] x [m,n] -> [k,n]   per group; the reduction runs over the group's rows
  """
  if op == "dlhs":
    return m, n, k
  if op in ("fwd", "drhs"):
    return m, k, n
  raise ValueError(f"op must be one of {OPS}, got {op!r}")


def check_int_range(owner: str, name: str, v, lo: int, hi: int) -> None:
  """ValueError unless `v` is an int (not a bool) in [lo, hi]."""
  if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
    raise ValueError(f"{owner}.{name} must be an integer in [{lo}, {hi}], got {v!r}")


# --- group metadata -----------------------------------------------------------------------


def num_tiles_bound(m: int, block_m: int, g_local: int) -> int:
  """Static launch size: row blocks plus one extra tile per internal segment boundary."""
  return -(-m // block_m) + g_local + 1


def group_row_bounds(group_sizes: jax.Array, m: int, group_offset: jax.Array, g_local: int):
  """[start, end) rows of each local group, clamped to [0, m); int32 [g_local] each."""
  sizes = group_sizes.astype(jnp.int32)
  ends = jnp.minimum(jnp.cumsum(sizes), m)
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
  # Pad so a dynamic slice of g_local groups starting at group_offset never clamps.
  total = ends[-1] if sizes.shape[0] else jnp.int32(0)
  pad = jnp.full((g_local,), total, jnp.int32)
  starts = jax.lax.dynamic_slice(jnp.concatenate([starts, pad]), (group_offset,), (g_local,))
  ends = jax.lax.dynamic_slice(jnp.concatenate([ends, pad]), (group_offset,), (g_local,))
  return starts, ends


def _rows_before(group_sizes, m: int, i):
  """min(sum(group_sizes[:i]), m) for each i of an int32 vector (i past the groups: all of
  them). A cumulative sum read by index, with no loop, scatter or concatenation, so XLA can
  fuse it into the ops that use it."""
  sizes = group_sizes.astype(jnp.int32)
  ends = jnp.minimum(jnp.cumsum(sizes), m)
  return jnp.where(i <= 0, 0, ends[jnp.clip(i - 1, 0, sizes.shape[0] - 1)]).astype(jnp.int32)


def pad_rows(x: jax.Array, multiple: int) -> jax.Array:
  """x with zero rows appended up to a multiple of `multiple` (a kernel's row tile)."""
  pad = -x.shape[0] % multiple
  return x if pad == 0 else jnp.pad(x, ((0, pad), *((0, 0),) * (x.ndim - 1)))


def local_row_mask(group_sizes, m: int, group_offset, g_local: int) -> jax.Array:
  """True for the rows [m] that belong to one of the local groups."""
  starts, ends = group_row_bounds(group_sizes, m, group_offset, g_local)
  rows = jnp.arange(m, dtype=jnp.int32)
  lo = starts[0] if g_local else jnp.int32(0)
  hi = ends[-1] if g_local else jnp.int32(0)
  return (rows >= lo) & (rows < hi)


def row_groups(group_sizes, m: int, group_offset, g_local: int) -> jax.Array:
  """The local group of each row [m], int32; rows of no local group get the nearest one
  (callers zero those rows)."""
  _, ends = group_row_bounds(group_sizes, m, group_offset, g_local)
  rows = jnp.arange(m, dtype=jnp.int32)
  return jnp.minimum(jnp.searchsorted(ends, rows, side="right", method="scan_unrolled"), g_local - 1).astype(jnp.int32)


def is_local(seg, g_local: int):
  """Whether segment `seg` (an int, array or traced scalar: plain operators only, so Blackwell's
  warp_map code can call it) is one of the local groups, not the rows before or after them."""
  return (seg >= 1) & (seg <= g_local)


def segment_bounds(group_sizes, m: int, group_offset, g_local: int):
  """[start, end) of the g_local + 2 segments described in the module docstring."""
  s = jnp.arange(g_local + 2, dtype=jnp.int32)
  first = jnp.asarray(group_offset, jnp.int32)
  starts = jnp.where(s == 0, 0, _rows_before(group_sizes, m, first + s - 1))
  ends = jnp.where(s == g_local + 1, m, _rows_before(group_sizes, m, first + s))
  return starts, ends


def row_tiles(group_sizes, m: int, block_m: int, group_start: bool = False, align: int = 1) -> tuple[list[int], int]:
  """tile_schedule in plain ints, for all the groups (no offset): the block_m row tiles each
  group's rows take (0 for an empty group), and those of the rows past sum(group_sizes)."""

  def count(start, end):
    if end <= start:
      return 0
    if group_start:
      return -(-(end - start // align * align) // block_m)
    return -(-end // block_m) - start // block_m

  tiles, start = [], 0
  for size in group_sizes:
    end = min(start + int(size), m)
    tiles.append(count(start, end))
    start = end
  return tiles, count(start, m)


# The tables of a tile schedule, in their order in its one int32 buffer.
SCHEDULE_TABLES = (
  "tile_segment",  # [num_tiles]: the segment of tile t
  "tile_row",  # [num_tiles]: the first row of tile t, in units of `align` rows (block_m rows from it)
  "active",  # [1]: tiles t >= active are spare launch slots
  "segment_first_tile",  # [num_segments]: index of each segment's first tile
  "segment_num_tiles",  # [num_segments]: tiles of each segment (0 if empty)
  "segment_start",  # [num_segments]: the segment's rows [start, end)
  "segment_end",
)


class Table(NamedTuple):
  """One table of a schedule: table[i] reads buffer[offset + i], where buffer is the packed
  array, a kernel's ref of it, or a NumPy copy (i may be a vector)."""

  buffer: Any
  offset: int
  size: int

  @property
  def shape(self) -> tuple[int]:
    return (self.size,)

  def __getitem__(self, i):
    return self.buffer[self.offset + i]


@dataclasses.dataclass(frozen=True)
class ScheduleLayout:
  """Where each of SCHEDULE_TABLES lies in a schedule's buffer (static: a kernel's parameter)."""

  num_tiles: int
  num_segments: int
  align: int

  def sizes(self) -> tuple[int, ...]:
    t, s = self.num_tiles, self.num_segments
    return (t, t, 1, s, s, s, s)

  @property
  def length(self) -> int:
    return sum(self.sizes())

  def tables(self, buffer) -> dict[str, Table]:
    """Each table of SCHEDULE_TABLES over `buffer`, by name."""
    offsets = np.cumsum((0, *self.sizes()))
    return {name: Table(buffer, int(o), size) for name, o, size in zip(SCHEDULE_TABLES, offsets, self.sizes())}


@functools.partial(jax.tree_util.register_dataclass, data_fields=["packed"], meta_fields=["layout"])
@dataclasses.dataclass(frozen=True)
class TileSchedule:
  """Which rows each scheduled row tile covers (see tile_schedule): every table in one int32
  buffer, so XLA computes the whole schedule in a few small fusions beside the kernel (two on a
  small problem) and a kernel takes it as one operand, reading it through layout.tables(its ref)."""

  packed: Any  # int32 [layout.length]: a jax.Array, or a NumPy copy (to_numpy)
  layout: ScheduleLayout

  def to_numpy(self) -> TileSchedule:
    """The same schedule with its buffer on the host (benchmarks and tests walk it there)."""
    return TileSchedule(np.asarray(self.packed), self.layout)

  def table(self, name: str) -> jax.Array:
    t = self.layout.tables(self.packed)[name]
    return self.packed[t.offset : t.offset + t.size]

  @property
  def tile_segment(self) -> jax.Array:
    return self.table("tile_segment")

  @property
  def tile_row_start(self) -> jax.Array:  # in rows
    return self.table("tile_row") * self.layout.align

  @property
  def active(self) -> jax.Array:
    return self.table("active")

  @property
  def segment_first_tile(self) -> jax.Array:
    return self.table("segment_first_tile")

  @property
  def segment_num_tiles(self) -> jax.Array:
    return self.table("segment_num_tiles")


def tile_schedule(
  seg_starts, seg_ends, block_m: int, num_tiles: int, *, group_start: bool = False, align: int = 1
) -> TileSchedule:
  """Tiles in segment order: each segment's row tiles, aligned or group-start (see the
  module docstring). A group-start tile may begin up to align - 1 rows before its segment,
  for copies whose row offset must be a multiple of `align` (TMA's 8-row boxes); those rows
  are a neighbour's and are not stored. num_tiles_bound bounds both ways: a segment takes at
  most as many group-start tiles as aligned ones (its first tile starts at or after the
  aligned grid's), and a segment of r rows at most ceil(r / block_m) + 1 aligned ones.

  No loop: a while loop (jnp.searchsorted's default) splits a GPU program's CUDA graph and
  sends each of its steps' kernels from the host, on every call."""
  if block_m % align:
    raise ValueError(f"block_m {block_m} is not a multiple of align {align}")
  nonempty = seg_ends > seg_starts
  if group_start:
    first_row = seg_starts // align * align
    count = (seg_ends - first_row + block_m - 1) // block_m
  else:
    first_row = (seg_starts // block_m) * block_m
    count = (seg_ends + block_m - 1) // block_m - seg_starts // block_m
  tiles_per_seg = jnp.where(nonempty, count, 0).astype(jnp.int32)
  tiles_end = jnp.cumsum(tiles_per_seg).astype(jnp.int32)
  tiles_begin = tiles_end - tiles_per_seg
  t = jnp.arange(num_tiles, dtype=jnp.int32)
  seg = jnp.searchsorted(tiles_end, t, side="right", method="scan_unrolled").astype(jnp.int32)
  seg = jnp.minimum(seg, seg_starts.shape[0] - 1)
  row = (first_row[seg] + (t - tiles_begin[seg]) * block_m) // align
  packed = jnp.concatenate(
    [seg, row, tiles_end[-1:], tiles_begin, tiles_per_seg, seg_starts, seg_ends], dtype=jnp.int32
  )
  return TileSchedule(packed, ScheduleLayout(num_tiles, seg_starts.shape[0], align))


# --- launch order -------------------------------------------------------------------------
# Shared by the GPU kernels (the Triton grid and Mosaic GPU's persistent loop): it decides how
# often lhs and the weights travel from HBM through L2. The groups go in row order, and each
# group's (row tile, column block) cells are walked in bands of `group_m` row tiles: a band's
# lhs rows stay in L2 while it walks the weight columns, and each weight column block is shared
# by the band's tiles while it is hot. benchmarks/l2_traffic.py models the bytes this fetches.


def _elementwise(py_fn, np_fn, jnp_fn):
  """A binary op for Python ints, NumPy arrays and traced int32 alike."""

  def fn(a, b):
    if isinstance(a, jax.Array) or isinstance(b, jax.Array):
      return jnp_fn(a, b)
    if isinstance(a, int) and isinstance(b, int):
      return py_fn(a, b)
    return np_fn(a, b)

  return fn


_minimum = _elementwise(min, np.minimum, jnp.minimum)
_maximum = _elementwise(max, np.maximum, jnp.maximum)


def program_tile(pid, num_tiles, num_col_blocks, group_m):
  """The (tile, col_block) that launch slot `pid` computes, in banded order.

  Slots are taken in bands of `group_m` consecutive tiles (the last band may be short);
  within a band the tile varies fastest, then the column block. group_m=1 walks one
  tile's column blocks before the next tile; group_m >= num_tiles walks every tile of a
  column block first. A bijection from [0, num_tiles * num_col_blocks) onto the cells.

  Integer arithmetic only, so it runs on Python ints, NumPy arrays and traced int32
  inside the kernel (where num_tiles is the dynamic count of scheduled tiles).
  """
  per_band = group_m * num_col_blocks
  band = pid // per_band
  first = band * group_m
  band_size = _maximum(_minimum(num_tiles - first, group_m), 1)  # >= 1 guards spare slots
  local = pid - band * per_band
  return first + local % band_size, local // band_size


def launch_cell(pid, tile_segment, segment_first_tile, segment_num_tiles, num_col_blocks, group_m):
  """The (tile, col_block) of launch slot `pid` in the kernel's launch order.

  Segments (groups) go in row order, and each one's cells follow `program_tile` on its
  own tiles, so a band never holds tiles of two groups: a band that did would fetch two
  groups' weights for every column block it walks. A segment's slots are exactly its
  tiles times num_col_blocks, so `tile_segment[pid // num_col_blocks]` finds it.
  The tables may be kernel refs (traced scalars) or NumPy arrays (vectors of slots).
  """
  seg = tile_segment[pid // num_col_blocks]
  first = segment_first_tile[seg]
  tile, col = program_tile(pid - first * num_col_blocks, segment_num_tiles[seg], num_col_blocks, group_m)
  return first + tile, col


# --- vmap -----------------------------------------------------------------------------


def broadcast_vmap(impl, *args):
  """impl(*args), batchable whichever of `args` vmap batches.

  Under vmap the unbatched arguments are broadcast to the batch, so `impl`'s own batching
  rule only ever sees all of them batched. custom_vmap has no reverse-mode rule, so
  differentiate through `kernels.ragged_dot` (its custom_vjp), not through `impl`.
  """

  @jax.custom_batching.custom_vmap
  def call(*a):
    return impl(*a)

  @call.def_vmap
  def _rule(axis_size, in_batched, *a):
    a = [x if b else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, b in zip(a, in_batched)]
    return jax.vmap(impl)(*a), True

  return call(*args)


def not_utf8(data: bytes, e: UnicodeDecodeError) -> tuple[int, str]:
  """(line, why) of the first byte of `data` that is not UTF-8: 'not UTF-8 text (byte 0xe9 at
  column 5)'. How every reader of ours (LUTs here, shape and records files in ragtune) says it."""
  line = data.count(b"\n", 0, e.start) + 1
  column = e.start - data.rfind(b"\n", 0, e.start)
  return line, f"not UTF-8 text (byte 0x{data[e.start]:02x} at column {column})"
