"""The record a backend folder fills in: what it computes, with which knobs, and where.

Each backend is one folder of this package (kernels/<name>/) whose ``__init__`` defines
``BACKEND = Backend(...)``; kernels/registry.py lists them. Everything else, in this
package and in ragtune, reads a backend through this record and never by its name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol

from kernels import gpus
from kernels.common import gpu_family, op_dims, tpu_format_refusal
from kernels.target import GPU_PLATFORMS


class KernelConfig(Protocol):
  """What every backend's config type provides (a frozen dataclass of plain ints)."""

  def fits(self, op: str, dtype: str, m: int, k: int, n: int, device_kind: str | None = None) -> bool: ...

  def to_dict(self) -> dict[str, Any]: ...


def _no_space(op, dtype, m, k, n, device_kind) -> list:
  return []


def _same_launch(cfg, op, m, k, n, group_sizes) -> Hashable:
  return cfg


def _nothing_unsupported() -> dict[str, str]:
  return {}


@dataclasses.dataclass(frozen=True)
class GridWork:
  """What one launch of a config does on one problem, in plain counts (a cost model's input).

  steps: grid steps (programs, or a persistent kernel's output cells), spare ones included.
  tile_steps: the steps that read operands and store an output tile.
  read_elems, write_elems: elements of the operand refs a tile step reads and of the output
      ref it writes, where an interpreter handles each whole at every step: whole arrays
      where the kernel indexes them itself under a condition (pl.when), blocks where
      BlockSpecs cut them. An unconditional read of an unchanging whole array is 0:
      pallas_call's interpreter (a loop over the grid) does that once, not per step.
  inner_steps: iterations of the steps' inner (contraction) loops, all steps together.
  inner_macs: multiply-adds of one inner iteration (its tile's dot).
  """

  steps: int
  tile_steps: int
  read_elems: int
  write_elems: int
  inner_steps: int
  inner_macs: int


@dataclasses.dataclass(frozen=True)
class InterpretCost:
  """What a backend's kernels cost in jax's interpreter on a CPU, per unit of GridWork, in
  units of a calibration step: a grid step of pallas_call's interpreter (PALLAS_CALL_COST's
  step weighs 1), which ragtune/run/estimate.py times on each host."""

  call: float  # each run of the kernel
  step: float  # each grid step
  tile_step: float  # more, for a step that reads operands and stores a tile
  read: float  # per element of the operand refs a tile step reads
  write: float  # per element of the output ref it writes
  mac: float  # per multiply-add of the inner loops
  compile: float  # a candidate's compile, build and check, in calibration compiles
  inner_step: float = 0.0  # per iteration of the inner loops (a pipeline step's copies and waits)

  def units(self, w: GridWork) -> float:
    return (
      self.call
      + self.step * w.steps
      + (self.tile_step + self.read * w.read_elems + self.write * w.write_elems) * w.tile_steps
      + (self.inner_step + self.mac * w.inner_macs) * w.inner_steps
    )


# jax's pallas_call interpreter (Backend.interpreter "pallas"), shared by the backends it runs.
# Least squares on the relative error of 30 interpreted kernels (bf16; fwd, dlhs and drhs of
# the Pallas Triton kernels; 1 ms to 23 s a run) on a loaded 2-core x86 host, jax 0.10.2.
# The terms that matter: the interpreter copies each whole ref a step reads or writes under
# pl.when (about 5 ns an element there). Its step weighs 1: it is the calibration's unit.
# Checked again (jax 0.10.2, load 3-7): two Qwen3-30B-A3B decode candidates ([8,2048] x
# [128,2048,768]) ran in 0.74-0.85x of their predicted times; a smoke candidate's compile,
# build and check took 0.4-1.3 calibration compiles (24 rows; 1.5 before, 0.6 now).
PALLAS_CALL_COST = InterpretCost(call=160, step=1, tile_step=4, read=5e-3, write=3e-4, mac=2e-4, compile=0.6)


@dataclasses.dataclass(frozen=True)
class Backend:
  """One way to compute ragged_dot's three ops.

  forward(lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs, group_offset,
          precision, interpret) -> [m, n]
  grad_lhs: same signature, dout [m,n] x rhs -> [m,k]; None means forward with
          transpose_rhs flipped (rhs read in place in the other layout).
  grad_rhs(lhs, dout, group_sizes, *, num_groups, config, out_dtype, transpose_rhs,
           group_offset, precision, interpret) -> [g,k,n] ([g,n,k] with transpose_rhs)
  grad_rhs_quantized(a_t, b_t, a_scale, b_scale, first, count, *, config, out_dtype,
           transpose_rhs, interpret) -> [g,k,n] ([g,n,k] with transpose_rhs): drhs of a
          training format (kernels.quant.TRAINING_FORMATS) on the padded token axis of
          quant.token_blocks: a_t [k, T] and b_t [n, T] (lhs's and dout's values, tokens
          contiguous), a_scale [T/128, k] and b_scale [T/128, n]; group i sums the 128-token
          blocks [first[i], first[i] + count[i]), each times its scales. None: the backend
          does not train in the formats it computes (dlhs of one is its forward, transposed).
  k_major_fp8: its fp8 gmm reads weights k-major only (transpose_rhs=True: [g,n,k] for the
          forward, [g,k,n] for dlhs) and copies them otherwise; fp8 training hands it the
          quantized weights in the layout it reads (kernels.quant.training_weights).
  quantize_rows(x, dtype) -> (q, scale), quantize_tokens(x, blocks, dtype) -> (q, scale):
          single-pass kernels for fp8 training's activation passes, the values of
          kernels.quant.quantize(x, dtype, (1, 128)) and quant.quantize_tokens bit for bit;
          None: none (registry.activation_quantizer says which backend's run).
  config_type: the config dataclass (a KernelConfig); None: no knobs.
  default(op, dtype, m, k, n, g, device_kind) -> config: the heuristic when no LUT entry
          applies; (m, k, n) is the forward problem, the config in the op's own frame.
  space(op, dtype, m, k, n, device_kind) -> [config]: the candidates worth timing.
  launch_key(config, op, m, k, n, group_sizes) -> what the config launches on that
          problem; configs with equal keys run the same kernel the same way.
  dtypes: the lhs/rhs dtypes (after promotion) it computes in.
  platforms: the jax platforms it runs compiled on; elsewhere it is interpreted.
  families: the GPU archs (kernels.gpus.ARCHS, by compute capability) its kernels compile
          for; empty: every device of its platforms. Compiling for another raises a clear
          error, as does an fp8 format on an arch without fp8 tensor cores (kernels.gpus).
  wide_indexing: addresses operands past 2**31 elements.
  auto_priority: backend="auto" falls back to the highest-priority backend that runs
          compiled on the platform; 0: never a fallback.
  format_priority: {format: priority} in place of auto_priority for those formats (of
          common.FORMATS): a backend that is not the fallback for 16-bit operands can be for
          a format it computes on faster tensor cores.
  op_priority: {op: priority} in place of auto_priority for that op ("fwd", "dlhs" or
          "drhs") on the plain dtypes it computes: a backend measured faster at one op is
          the fallback for that op alone (the others keep theirs).
  megablox_lut_fn: its config is megablox's (tm, tk, tn) tiling, served by Lut.lut_fn.
  smem_at_launch: its kernels set their shared memory at launch, so a compiled program
          does not record it; the config's smem_bytes gives it (ragtune's deviceless compile
          report reads it there).
  grid_work(config, op, m, k, n, group_sizes) -> GridWork: what the config launches on
          that problem; None for a backend with no kernels of its own.
  interpreter: which of jax's interpreters runs its kernels off their hardware:
          "pallas" (pallas_call's, a loop over the grid) or "mosaic_gpu" (Mosaic GPU's,
          which simulates the GPU's threads and memory); "" when none does.
  interpret_cost: what its kernels cost in that interpreter per unit of grid_work (fitted
          weights: ragtune's estimate of a sweep on a CPU); None with no grid_work.
  interpret_unsupported() -> {op: why}: the ops its kernels cannot run in this jax's
          interpreter; a key "op:format" (common.FORMATS) names an op on one format only.
  interpreter_threads: simulated threads of one kernel that its interpreter runs at once,
          each of which can block in a host callback (a barrier wait); 0 when none blocks.
          XLA:CPU may run those callbacks on its intra-op pool, which must be larger
          (registry.interpreter_env).
  unavailable() -> why: "" when this jax ships what its kernels are written in; else why
          not (it then runs nowhere and is never "auto"'s fallback).
  deprecated() -> why: "" unless what its kernels are written in is deprecated upstream in
          this jax (it still runs; `explain` says so).
  aot_target(device_kind, capability): told of each GPU an ahead-of-time compile targets (a
          compile-only device: its kind and compute capability, "8.9"), for a compiler that
          cannot read them off that device by itself; None: nothing to tell.
  default_source(device_kind) -> how `default` chose for that device, as `explain` names
          it: "heuristic", or "compile-verified" (tiles chosen by a stated rule and compiled
          for that device by the tests, not timed).
  """

  name: str
  forward: Callable[..., Any]
  grad_rhs: Callable[..., Any]
  config_type: type | None
  dtypes: tuple[str, ...]
  platforms: tuple[str, ...]
  default: Callable[..., Any] = lambda *args, **kw: None
  space: Callable[..., list] = _no_space
  launch_key: Callable[..., Hashable] = _same_launch
  grad_lhs: Callable[..., Any] | None = None
  grad_rhs_quantized: Callable[..., Any] | None = None
  k_major_fp8: bool = False
  quantize_rows: Callable[..., Any] | None = None
  quantize_tokens: Callable[..., Any] | None = None
  families: tuple[str, ...] = ()
  wide_indexing: bool = False
  auto_priority: int = 0
  format_priority: Mapping[str, int] = dataclasses.field(default_factory=dict)
  op_priority: Mapping[str, int] = dataclasses.field(default_factory=dict)
  megablox_lut_fn: bool = False
  smem_at_launch: bool = False
  grid_work: Callable[..., GridWork] | None = None
  interpreter: str = ""
  interpret_cost: InterpretCost | None = None
  interpret_unsupported: Callable[[], dict[str, str]] = _nothing_unsupported
  interpreter_threads: int = 0
  unavailable: Callable[[], str] = lambda: ""
  deprecated: Callable[[], str] = lambda: ""
  aot_target: Callable[[str, str | None], None] | None = None
  default_source: Callable[[str | None], str] = lambda device_kind: "heuristic"

  @property
  def own_kernels(self) -> bool:
    """It runs kernels of its own (a compiled program of it holds them), not XLA's ops alone."""
    return self.grid_work is not None

  def default_config(self, op: str, dtype: str, m: int, k: int, n: int, g: int, device_kind: str | None = None):
    op_dims(op, m, k, n)  # validates op
    return self.default(op, dtype, m, k, n, g, device_kind)

  def config_from_dict(self, d: dict[str, Any]):
    """This backend's config from a plain dict (as a LUT stores it)."""
    cls = self.config_type
    if cls is None:
      if d:
        raise ValueError(f"backend {self.name!r} has no config, got {d!r}")
      return None
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields
    if unknown:
      raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; valid: {sorted(fields)}")
    return cls(**d)

  def refusal(self, platform: str, device_kind: str, fmt: str | None = None) -> str:
    """Why this backend's kernels cannot compile for the device (for operands of `fmt`, a format
    of common.FORMATS, when given), or "" when they can. The GPU rules are kernels.gpus', a
    TPU's 8-bit matmuls common.TpuChip's."""
    if why := self.unavailable():
      return f"backend {self.name!r} is not available: {why}"
    if platform not in self.platforms:
      return ""
    if platform == "tpu" and fmt is not None and self.own_kernels and (why := tpu_format_refusal(device_kind, fmt)):
      return f"backend {self.name!r} cannot compute {fmt}: {why}"
    if platform not in GPU_PLATFORMS:
      return ""
    if self.families and gpu_family(device_kind) not in self.families:
      archs = gpus.arch_names(self.families)
      return f"backend {self.name!r} compiles for {archs} GPUs only, not {gpus.describe(device_kind)}"
    fp8 = fmt is not None and gpus.peak_class(fmt) == "fp8"
    if fp8 and self.own_kernels and (why := gpus.fp8_refusal(device_kind)):
      return f"backend {self.name!r} cannot compute {fmt}: {why}"
    return ""

  def check_device(
    self, platform: str, device_kind: str, alternatives: tuple[str, ...] = (), fmt: str | None = None
  ) -> None:
    """Raise ValueError with refusal() when this backend's kernels cannot compile for the
    device; the message names `alternatives`."""
    hint = f"use backend={' or '.join(repr(a) for a in alternatives)}" if alternatives else "use another backend"
    if why := self.refusal(platform, device_kind, fmt):
      raise ValueError(f"{why}; {hint}")

  def priority(self, dtype: str | None = None, op: str | None = None) -> int:
    """Its rank as "auto"'s fallback for operands of `dtype` (None: 16-bit) in `op` (None:
    any op)."""
    if dtype in self.format_priority:
      return self.format_priority[dtype]
    plain = dtype is None or (":" not in dtype and dtype in self.dtypes)
    return self.op_priority.get(op, self.auto_priority) if plain else self.auto_priority

  def runs_on(self, platform: str, device_kind: str, fmt: str | None = None) -> bool:
    """Whether it runs compiled on this device (on operands of `fmt`, when given)."""
    return platform in self.platforms and not self.refusal(platform, device_kind, fmt)

  def check_dtype(self, lhs_dtype, rhs_dtype, compute_dtype: str, alternatives: tuple[str, ...] = ()) -> None:
    """TypeError unless it computes in `compute_dtype`; the message names `alternatives`."""
    if compute_dtype not in self.dtypes:
      hint = f"; use backend={' or '.join(repr(a) for a in alternatives)}" if alternatives else ""
      raise TypeError(
        f"backend {self.name!r} supports lhs/rhs dtypes {self.dtypes}, got {lhs_dtype} x {rhs_dtype}{hint}"
      )

  def check_config(self, op: str, cfg: Any) -> None:
    if self.config_type is None:
      if cfg is not None:
        raise TypeError(f"config[{op!r}] must be None for backend {self.name!r} (it has no knobs), got {cfg!r}")
    elif not isinstance(cfg, self.config_type):
      raise TypeError(f"config[{op!r}] must be a {self.config_type.__name__} for backend {self.name!r}, got {cfg!r}")


def host_cores() -> int:
  """The cores this process may run on, as XLA:CPU counts them for its pool (its affinity)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pool_env(blocking: int, cores: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
  """{} or {"PJRT_NPROC": n}: what a process on `cores` cores that interprets kernels of
  `blocking` interpreter_threads must add to its environment (registry.interpreter_env says why)."""
  need = 2 * (blocking + 1) if blocking else 0
  if "PJRT_NPROC" in environ or "NPROC" in environ or cores >= need:
    return {}
  return {"PJRT_NPROC": str(need)}
