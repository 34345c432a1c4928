"""Kernel configs: what each backend can be tuned with, their valid ranges and defaults.

A config is always in the frame of the op it drives. For ``dlhs`` (dout[m,n] @ rhs^T)
the contraction is the forward ``n`` and the output columns are the forward ``k``, so a
dlhs ``block_k`` tiles the forward ``n``. LUT keys, by contrast, always use the forward
problem's (m, k, n, g); see ``op_dims``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

OPS = ("fwd", "dlhs", "drhs")
# BACKENDS (the backend names) and CONFIG_TYPES (name -> config class) are read from the
# registry in kernels/backends/ on access; see __getattr__ at the end of this module.
DTYPES = ("bfloat16", "float16", "float32")

GPU_BLOCK_RANGE = (16, 256)
GPU_NUM_WARPS = (1, 2, 4, 8, 16)
GPU_NUM_STAGES = (1, 2, 3, 4, 5, 6, 7, 8)
GPU_BAND_RANGE = (1, 1024)
TPU_VMEM_BYTES = 16 * 1024 * 1024
MOSAIC_BLOCK_MN = (64, 128, 192, 256)
MOSAIC_BLOCK_K = (64, 128)
MOSAIC_STEPS_RANGE = (2, 8)
MOSAIC_BAND_RANGE = (1, 64)

# Shared memory one thread block may use (the opt-in maximum), by device family. Sources:
# NVIDIA's CUDA C++ Programming Guide, "Compute Capabilities" table (sm_90: 227 KB, sm_80:
# 163 KB, sm_86/sm_89/sm_120: 99 KB). A LUT entry is only ever used on its own device kind,
# so each device gets its own bound.
GPU_SMEM_BYTES = {"hopper": 227 * 1024, "blackwell": 227 * 1024, "ampere": 163 * 1024}
# Any other GPU (L4, L40S, A10, RTX 30xx/40xx/50xx, and the CPU host that tests the
# pipeline in interpret mode): the smallest bound of the sm_80+ parts Triton targets.
GPU_SMEM_BYTES_SAFE = 99 * 1024
_FAMILIES = (("hopper", ("h100", "h200", "h800", "h20", "gh200")),
             ("blackwell", ("b100", "b200", "gb200", "b300", "gb300")),
             ("ampere", ("a100", "a800", "a30")))


def gpu_family(device_kind: str | None) -> str:
  """'hopper', 'blackwell', 'ampere' or 'other' for a jax device_kind string."""
  kind = (device_kind or "").lower()
  for family, names in _FAMILIES:
    if any(name in kind for name in names):
      return family
  return "other"


def gpu_smem_limit(device_kind: str | None) -> int:
  return GPU_SMEM_BYTES.get(gpu_family(device_kind), GPU_SMEM_BYTES_SAFE)


def _is_pow2(x: int) -> bool:
  return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


def next_pow2(x: int) -> int:
  return 1 << max(0, int(x) - 1).bit_length()


def itemsize(dtype: str) -> int:
  return {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype, 4)


def op_dims(op: str, m: int, k: int, n: int) -> tuple[int, int, int]:
  """The (rows, contraction, columns) an op computes, given the forward (m, k, n).

  fwd:  [m,k] x [k,n] -> [m,n]
  dlhs: [m,n] x [n,k] -> [m,k]   (megablox calls its LutFn with (m, n, k) here)
  drhs: [k,m] x [m,n] -> [k,n]   per group; the reduction runs over the group's rows
  """
  if op == "dlhs":
    return m, n, k
  if op in ("fwd", "drhs"):
    return m, k, n
  raise ValueError(f"op must be one of {OPS}, got {op!r}")


@dataclasses.dataclass(frozen=True)
class GpuConfig:
  """Pallas GPU (Triton) kernel config.

  block_m:    rows of lhs per tile; power of two in [16, 256]. For drhs it is the step
              of the reduction over a group's rows.
  block_k:    contraction step; power of two in [16, 256]. For drhs it tiles the output's k.
  block_n:    output columns per tile; power of two in [16, 256].
  num_warps:  warps per program; one of 1, 2, 4, 8, 16.
  num_stages: software-pipelining depth of the contraction loop; 1..8.
  group_m:    fwd/dlhs launch order (see gpu_gmm.program_tile): a band of group_m
              consecutive row tiles walks all column blocks before the next band starts,
              so the band's lhs rows and each weight column block are read from HBM about
              once. 1 walks one row tile's columns at a time; a band as large as the grid
              walks all row tiles of a column block first. In [1, 1024].
  group_k:    drhs launch order (see gpu_tgmm.program_tile): within each group, a band of
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
    lo, hi = GPU_BLOCK_RANGE
    for name in ("block_m", "block_k", "block_n"):
      v = getattr(self, name)
      if not _is_pow2(v) or not lo <= v <= hi:
        raise ValueError(f"GpuConfig.{name} must be a power of two in [{lo}, {hi}], got {v!r}")
    if self.num_warps not in GPU_NUM_WARPS:
      raise ValueError(f"GpuConfig.num_warps must be one of {GPU_NUM_WARPS}, got {self.num_warps!r}")
    if self.num_stages not in GPU_NUM_STAGES:
      raise ValueError(f"GpuConfig.num_stages must be in 1..8, got {self.num_stages!r}")
    lo, hi = GPU_BAND_RANGE
    for name in ("group_m", "group_k"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"GpuConfig.{name} must be an integer in [{lo}, {hi}], got {v!r}")

  def clamped(self, rows: int, contraction: int, cols: int) -> "GpuConfig":
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
    rows, contraction, cols = op_dims(op, m, k, n)
    c = self.clamped(rows, contraction, cols)
    second = c.block_m * c.block_n if op == "drhs" else c.block_k * c.block_n
    return (c.block_m * c.block_k + second) * itemsize(dtype) * max(1, c.num_stages)

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    """Whether this config can launch for the forward problem (m, k, n) as `op` on a
    device of this kind (by its shared memory per block; see gpu_smem_limit)."""
    return self.smem_bytes(op, dtype, m, k, n) <= gpu_smem_limit(device_kind)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TpuConfig:
  """Pallas TPU (megablox) tiling, in the op's own (m, k, n) frame.

  tm: rows per tile; a multiple of 8 (16 for 16-bit dtypes is best). m is padded to it.
  tk: contraction tile; a multiple of 128. A ragged last tile is masked by megablox.
  tn: output-column tile; a multiple of 128.
  """

  tm: int = 128
  tk: int = 128
  tn: int = 128

  def __post_init__(self):
    if not isinstance(self.tm, int) or self.tm <= 0 or self.tm % 8:
      raise ValueError(f"TpuConfig.tm must be a positive multiple of 8, got {self.tm!r}")
    for name in ("tk", "tn"):
      v = getattr(self, name)
      if not isinstance(v, int) or v <= 0 or v % 128:
        raise ValueError(f"TpuConfig.{name} must be a positive multiple of 128, got {v!r}")

  def vmem_bytes(self, dtype: str) -> int:
    # Double-buffered lhs and rhs tiles, the output tile and an f32 accumulator.
    b = itemsize(dtype)
    return 2 * (self.tm * self.tk + self.tk * self.tn) * b + self.tm * self.tn * (b + 4)

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    return self.vmem_bytes(dtype) <= TPU_VMEM_BYTES

  def tiling(self) -> tuple[int, int, int]:
    return (self.tm, self.tk, self.tn)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """Mosaic GPU (Hopper TMA + wgmma) kernel config, in the op's own frame.

  block_m:  fwd/dlhs: rows per output tile (a multiple of 64: one wgmma per warpgroup
            row of 64); drhs: rows of a group reduced per pipeline step. One of 64, 128,
            192, 256.
  block_n:  output columns per tile; one of 64, 128, 192, 256 (a wgmma N; the f32
            accumulator holds block_m x block_n in registers of one warpgroup).
  block_k:  fwd/dlhs: contraction per pipeline step; drhs: output rows (of k) per tile.
            64 or 128 (64 16-bit elements are one 128-byte swizzle row; a drhs output tile
            needs 64 rows per warpgroup).
            k is zero-padded to a multiple of block_k only when it is not one already.
  max_concurrent_steps: TMA pipeline depth (operand tiles in flight); 2..8.
  grid_block_n: width, in column blocks, of the band the persistent grid snakes through
            (plgpu.planar_snake): the programs in flight share a band's weight columns and
            rows. In [1, 64].

  Shared memory: max_concurrent_steps stages of the two operand tiles plus one output
  tile; see smem_bytes. Blocks are not clamped to the shape: TMA reads past the end of an
  array as zeros and clips stores, so any block is valid for any shape that fits.
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 1

  def __post_init__(self):
    for name, allowed in (("block_m", MOSAIC_BLOCK_MN), ("block_n", MOSAIC_BLOCK_MN),
                          ("block_k", MOSAIC_BLOCK_K)):
      v = getattr(self, name)
      if isinstance(v, bool) or v not in allowed:
        raise ValueError(f"MosaicConfig.{name} must be one of {allowed}, got {v!r}")
    for name, (lo, hi) in (("max_concurrent_steps", MOSAIC_STEPS_RANGE),
                           ("grid_block_n", MOSAIC_BAND_RANGE)):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"MosaicConfig.{name} must be an integer in [{lo}, {hi}], got {v!r}")

  def smem_bytes(self, op: str, dtype: str, m: int, k: int, n: int) -> int:
    """Shared memory the kernel allocates: max_concurrent_steps stages of the operand
    tiles (gmm: [block_m, block_k] lhs and [block_k, block_n] rhs; tgmm: [block_m,
    block_k] lhs and [block_m, block_n] dout) and one output tile ([block_m, block_n];
    tgmm [block_k, block_n]) in the output dtype, taken as `dtype`. Stages beyond the
    gmm pipeline's static length are not allocated, as emit_pipeline shrinks them;
    tgmm's pipeline length is a group's row count, dynamic, so it always takes all."""
    _, contraction, _ = op_dims(op, m, k, n)
    b = itemsize(dtype)
    if op == "drhs":
      steps = self.max_concurrent_steps
      stage = self.block_m * (self.block_k + self.block_n)
      out = self.block_k * self.block_n
    else:
      steps = -(-contraction // self.block_k)
      stage = self.block_k * (self.block_m + self.block_n)
      out = self.block_m * self.block_n
    return (stage * max(1, min(self.max_concurrent_steps, steps)) + out) * b

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool:
    """Whether this config's shared memory fits a block on a device of this kind."""
    return self.smem_bytes(op, dtype, m, k, n) <= gpu_smem_limit(device_kind)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


Config = Union[GpuConfig, MosaicConfig, TpuConfig]


def config_from_dict(backend: str, d: dict[str, Any]) -> Config | None:
  """Build the config type of `backend` from a plain dict (as stored in a LUT)."""
  from kernels import backends
  cls = backends.get(backend).config_type
  if cls is None:
    if d:
      raise ValueError(f"backend {backend!r} has no config, got {d!r}")
    return None
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(d) - fields
  if unknown:
    raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; valid: {sorted(fields)}")
  return cls(**d)


# Defaults for large problems, per device family and op, in the op's own frame. Why:
# - block_m (gmm) / block_k (tgmm) >= 64 with >= 4 warps, so Hopper uses wgmma; every
#   default compiles for sm_90a with no spills (README: "What the kernels compile to").
# - The launch-order band (group_m, group_k) keeps HBM traffic near the unique bytes in
#   benchmarks/l2_traffic.py on Mixtral and DeepSeek-V3 (README: "Launch order and L2").
# - Shared memory within the family's bound, leaving room for 1-2 programs per SM.
_GPU_DEFAULTS = {
    "hopper": {"gmm": GpuConfig(128, 64, 256, 8, 3, group_m=16), "tgmm": GpuConfig(64, 128, 128, 8, 3)},
    "blackwell": {"gmm": GpuConfig(128, 64, 256, 8, 3, group_m=16), "tgmm": GpuConfig(64, 128, 128, 8, 3)},
    "ampere": {"gmm": GpuConfig(128, 64, 128, 8, 3, group_m=16), "tgmm": GpuConfig(64, 128, 128, 8, 3)},
    "other": {"gmm": GpuConfig(128, 32, 128, 8, 3, group_m=16), "tgmm": GpuConfig(32, 64, 128, 4, 3)},
}


def _gpu_default(op: str, dtype: str, rows: int, contraction: int, cols: int, g: int,
                 family: str) -> GpuConfig:
  base = _GPU_DEFAULTS[family]["tgmm" if op == "drhs" else "gmm"]
  if dtype == "float32":  # twice the bytes per element: halve the contraction step
    base = dataclasses.replace(base, block_m=base.block_m // 2) if op == "drhs" else \
        dataclasses.replace(base, block_k=max(16, base.block_k // 2))
  if op == "drhs":
    # Keep the smaller of a group's lhs rows [rows, k] and dout rows [rows, n] in L2 and
    # stream the other once: walk every k block of an n block first when k <= n.
    k_blocks = -(-contraction // base.block_k)
    return dataclasses.replace(base, group_k=min(GPU_BAND_RANGE[1], k_blocks) if contraction <= cols else 1)
  # Few rows per group (decode): a row tile per group and the weights streamed once. The
  # kernel is memory-bound there, so the rows a 64-row tile wastes cost no time, and 64
  # rows with 4 warps keep it on wgmma (fewer fall back to mma.sync).
  if max(1, rows // max(1, g)) <= 96:
    return dataclasses.replace(base, block_m=64, block_n=128, num_warps=4, num_stages=4)
  return base


def gpu_default(op: str, dtype: str, m: int, k: int, n: int, g: int,
                device_kind: str | None = None) -> GpuConfig:
  rows, contraction, cols = op_dims(op, m, k, n)
  cfg = _gpu_default(op, dtype, rows, contraction, cols, g, gpu_family(device_kind))
  return cfg.clamped(rows, contraction, cols)


def tpu_default(op: str, dtype: str, m: int, k: int, n: int, g: int,
                device_kind: str | None = None) -> TpuConfig:
  rows, contraction, cols = op_dims(op, m, k, n)

  def tile(d, choices=(512, 256, 128)):
    for c in choices:
      if d % c == 0:
        return c
    return 128
  tm = min(512, max(8, next_pow2(rows))) if rows < 512 else 512
  return TpuConfig(tm=tm, tk=tile(contraction), tn=tile(cols))


# Mosaic GPU defaults, in the op's own frame. Why: one warpgroup holds the f32 accumulator
# in registers, and 128x128 is the largest tile it holds without spilling (128 values per
# thread); block_k 64 is one 128-byte swizzle row of 16-bit elements. Four stages in
# flight (~160 KiB of shared memory with the output tile) hide HBM latency on Hopper. Few
# rows per group (decode) take 64-row tiles, so less of each tile is wasted on rows of a
# neighbouring group. drhs reduces 64 rows a step into a [128, 128] tile of [k, n].
_MOSAIC_DEFAULTS = {
    "gmm": MosaicConfig(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=4),
    "tgmm": MosaicConfig(block_m=64, block_n=128, block_k=128, max_concurrent_steps=4, grid_block_n=1),
}


def mosaic_default(op: str, dtype: str, m: int, k: int, n: int, g: int,
                   device_kind: str | None = None) -> MosaicConfig:
  cfg = _MOSAIC_DEFAULTS["tgmm" if op == "drhs" else "gmm"]
  if op != "drhs" and max(1, m // max(1, g)) <= 96:
    cfg = dataclasses.replace(cfg, block_m=64)
  # A device with less shared memory than Hopper gets fewer stages in flight.
  while cfg.max_concurrent_steps > MOSAIC_STEPS_RANGE[0] and not cfg.fits(op, dtype, m, k, n, device_kind):
    cfg = dataclasses.replace(cfg, max_concurrent_steps=cfg.max_concurrent_steps - 1)
  return cfg


def default_config(backend: str, op: str, dtype: str, m: int, k: int, n: int, g: int,
                   device_kind: str | None = None) -> Config | None:
  """Built-in heuristic used when no LUT entry applies, for a device of `device_kind`
  (None: the safe family of gpu_smem_limit). Each backend's `default` in kernels/backends/."""
  from kernels import backends
  op_dims(op, m, k, n)  # validates op
  return backends.get(backend).default(op, dtype, m, k, n, g, device_kind)


def __getattr__(name: str):
  if name in ("BACKENDS", "CONFIG_TYPES"):
    from kernels import backends
    if name == "BACKENDS":
      return backends.NAMES
    return {b.name: b.config_type for b in backends.REGISTRY.values() if b.config_type is not None}
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
