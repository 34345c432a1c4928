"""Kernel configs: what each backend can be tuned with, their valid ranges and defaults.

A config is always in the frame of the op it drives. For ``dlhs`` (dout[m,n] @ rhs^T)
the contraction is the forward ``n`` and the output columns are the forward ``k``, so a
dlhs ``block_k`` tiles the forward ``n``. LUT keys, by contrast, always use the forward
problem's (m, k, n, g); see ``op_dims``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Union

OPS = ("fwd", "dlhs", "drhs")
BACKENDS = ("pallas_gpu", "pallas_tpu", "xla")
DTYPES = ("bfloat16", "float16", "float32")

GPU_BLOCK_RANGE = (16, 256)
GPU_NUM_WARPS = (1, 2, 4, 8, 16)
GPU_NUM_STAGES = (1, 2, 3, 4, 5, 6, 7, 8)
GPU_GRID_ORDERS = ("m_fastest", "n_fastest")
# Hopper has 227 KiB of shared memory per block; Ampere 163 KiB. Use the smaller so
# one LUT entry never names a config that cannot launch on either.
GPU_SMEM_BYTES = 163 * 1024
TPU_VMEM_BYTES = 16 * 1024 * 1024


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
  grid_order: which tile index the launch order walks first. "m_fastest" keeps a weight
              column block hot in L2 while the rows of one group stream past it (good
              when weights dominate traffic); "n_fastest" keeps the lhs row block hot.

  Blocks larger than the (power-of-two rounded) dimension are clamped at launch, so a
  config is valid for every shape.
  """

  block_m: int = 64
  block_k: int = 64
  block_n: int = 128
  num_warps: int = 4
  num_stages: int = 3
  grid_order: Literal["m_fastest", "n_fastest"] = "m_fastest"

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
    if self.grid_order not in GPU_GRID_ORDERS:
      raise ValueError(f"GpuConfig.grid_order must be one of {GPU_GRID_ORDERS}, got {self.grid_order!r}")

  def clamped(self, rows: int, contraction: int, cols: int) -> "GpuConfig":
    """Blocks no larger than each dimension needs (>=16, Triton's dot minimum)."""
    cap = lambda b, d: min(b, max(16, next_pow2(d)))
    return dataclasses.replace(
        self,
        block_m=cap(self.block_m, rows),
        block_k=cap(self.block_k, contraction),
        block_n=cap(self.block_n, cols),
    )

  def smem_bytes(self, dtype: str, rows: int, contraction: int, cols: int) -> int:
    c = self.clamped(rows, contraction, cols)
    per_stage = (c.block_m * c.block_k + c.block_k * c.block_n) * itemsize(dtype)
    return per_stage * max(1, c.num_stages)

  def fits(self, op: str, dtype: str, m: int, k: int, n: int) -> bool:
    """Whether this config can launch for the forward problem (m, k, n) as `op`."""
    return self.smem_bytes(dtype, *op_dims(op, m, k, n)) <= GPU_SMEM_BYTES

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

  def fits(self, op: str, dtype: str, m: int, k: int, n: int) -> bool:
    return self.vmem_bytes(dtype) <= TPU_VMEM_BYTES

  def tiling(self) -> tuple[int, int, int]:
    return (self.tm, self.tk, self.tn)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


Config = Union[GpuConfig, TpuConfig]
CONFIG_TYPES = {"pallas_gpu": GpuConfig, "pallas_tpu": TpuConfig}


def config_from_dict(backend: str, d: dict[str, Any]) -> Config | None:
  """Build the config type of `backend` from a plain dict (as stored in a LUT)."""
  if backend == "xla":
    return None
  try:
    cls = CONFIG_TYPES[backend]
  except KeyError:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}") from None
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(d) - fields
  if unknown:
    raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; valid: {sorted(fields)}")
  return cls(**d)


def default_config(backend: str, op: str, dtype: str, m: int, k: int, n: int, g: int) -> Config | None:
  """Built-in heuristic used when no LUT entry applies."""
  rows, contraction, cols = op_dims(op, m, k, n)
  if backend == "xla":
    return None
  if backend == "pallas_gpu":
    if op == "drhs":
      # Output tile is [k, n] per group; block_m steps over the group's rows.
      cfg = GpuConfig(block_m=64 if dtype != "float32" else 32, block_k=64, block_n=64,
                      num_warps=4, num_stages=3)
    else:
      rows_per_group = max(1, rows // max(1, g))
      block_m = 16 if rows_per_group <= 16 else 32 if rows_per_group <= 32 else 64 if rows_per_group <= 96 else 128
      block_n = 128
      block_k = 64 if dtype != "float32" else 32
      num_warps = 8 if block_m * block_n >= 128 * 128 else 4
      cfg = GpuConfig(block_m=block_m, block_k=block_k, block_n=block_n,
                      num_warps=num_warps, num_stages=3)
    return cfg.clamped(rows, contraction, cols)
  if backend == "pallas_tpu":
    def tile(d, choices=(512, 256, 128)):
      for c in choices:
        if d % c == 0:
          return c
      return 128
    tm = min(512, max(8, next_pow2(rows))) if rows < 512 else 512
    return TpuConfig(tm=tm, tk=tile(contraction), tn=tile(cols))
  raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
