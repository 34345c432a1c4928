"""Deviceless compile: XLA's real GPU compiler, run on a CPU-only host for a named GPU.

`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)` gives a
compile-only GPU from a text GpuTargetConfigProto (the device facts in ragtune/targets/).
Under `jax.set_mesh` of that device, `jax.jit(f).lower(...).compile()` runs XLA's GPU
pipeline, the Triton and Mosaic GPU custom calls, and ptxas: every compile error,
shared-memory overflow and register spill the device would see, with nothing run. It says
nothing of speed or of races between asynchronous copies and wgmma.

Needs the CUDA plugin and ptxas (`pip install 'ragtune[gpu-compile]'`), and a process whose
jax runs on the CPU only (JAX_PLATFORMS=cpu before jax starts; the CLI's compile workers
set it). Results: one CompileReport per compiled op, with a KernelReport per ragtune kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import kernels
from kernels.ragged_dot import resolve
from ragtune import machine_code
from ragtune.errors import RagtuneError

TARGETS_DIR = Path(__file__).parent / "targets"
# Target names -> device facts files. A path to any GpuTargetConfigProto text file works too.
TARGETS = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb", "b200": "b200.txtpb"}
# Our kernels' names in the machine code (kernels/<backend>/gmm.py, tgmm.py).
KERNEL_PREFIX = "ragtune_"
# Outcomes, in the order a report names them. loop_spill: spills inside the wgmma loops,
# paid at every step (worse than a spill elsewhere, which is a spill too).
OK, NO_FIT, LOOP_SPILL, SPILL, SERIALIZED, UNSUPPORTED, ERROR = (
  "ok",
  "no_fit",
  "loop_spill",
  "spill",
  "serialized_wgmma",
  "unsupported",
  "compile_error",
)


class AotUnavailable(RagtuneError):
  """Deviceless compile cannot run in this process (plugin, ptxas or platform missing)."""


@dataclasses.dataclass(frozen=True)
class KernelReport:
  """One ragtune kernel of a compiled op.

  smem_bytes: shared memory per block at launch. For Triton kernels, XLA's own launch
  figure (its thunk sequence); a backend whose kernels set their own at launch
  (Backend.smem_at_launch: Mosaic GPU) gets the config's allocation (its smem_bytes), which
  its lowering checked against the device's bound (smem_source says which)."""

  name: str
  registers: int
  spill_bytes: int  # per-thread register spills (stack frame or local memory)
  stack_bytes: int
  smem_bytes: int | None
  smem_source: str  # "xla" | "config" | ""
  mma: str  # "wgmma" | "mma.sync" | "none"
  copy: str  # "tma" | "cp.async" | "ld/st"
  counts: dict[str, int]
  serialized_wgmma: bool
  loops_wait_one: bool
  loop_spills: int  # STL/LDL inside the loops that issue wgmma
  setmaxnreg: bool  # USETMAXREG: registers moved between warpgroups (warp specialization)
  hgmma_n: int  # the widest wgmma's N; 0 without wgmma

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def fault(self) -> tuple[str, str]:
    """(outcome, why) of what makes this kernel unfit though ptxas built it; (OK, "") if
    nothing does."""
    if self.loop_spills:
      return LOOP_SPILL, f"{self.name}: {self.loop_spills} STL/LDL in its wgmma loops ({self.spill_bytes} B/thread)"
    if self.spill_bytes:
      return SPILL, f"{self.name}: {self.spill_bytes} B/thread spilled"
    if self.serialized_wgmma:
      return SERIALIZED, f"{self.name}: wgmma serialized (ptxas C7511)"
    return OK, ""


_FAULTS = (LOOP_SPILL, SPILL, SERIALIZED)  # the worst first


def verdict(reports: tuple[KernelReport, ...]) -> tuple[str, str]:
  """(outcome, error) of a compile that ptxas finished: the worst fault of any kernel, and
  every faulty kernel named; (OK, "") when none has one."""
  faults = [f for f in (r.fault() for r in reports) if f[0] != OK]
  return min((o for o, _ in faults), key=_FAULTS.index, default=OK), "; ".join(why for _, why in faults)


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """The outcome of compiling one op (or a whole function) for a target."""

  target: str
  device_kind: str
  outcome: str  # OK, NO_FIT, LOOP_SPILL, SPILL, SERIALIZED, UNSUPPORTED or ERROR
  error: str  # the compiler's own message (first lines), "" when ok
  seconds: float
  kernels: tuple[KernelReport, ...] = ()

  @property
  def ok(self) -> bool:
    return self.outcome == OK

  def to_dict(self) -> dict[str, Any]:
    return {
      "target": self.target,
      "device_kind": self.device_kind,
      "outcome": self.outcome,
      "error": self.error,
      "compile_s": round(self.seconds, 3),
      "kernels": [k.to_dict() for k in self.kernels],
    }


# --- the target ---------------------------------------------------------------------------


def target_text(target: str) -> tuple[str, str]:
  """(name, GpuTargetConfigProto text) of a target name (h100, h200, b200) or file path."""
  if target.lower() in TARGETS:
    return target.lower(), (TARGETS_DIR / TARGETS[target.lower()]).read_text()
  path = Path(target)
  if not path.is_file():
    raise RagtuneError(f"--target {target}: not one of {sorted(TARGETS)} nor a GpuTargetConfigProto file")
  return path.stem, path.read_text()


@functools.cache
def _mesh(text: str):
  from jax.experimental import topologies

  try:
    topo = topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x1")
  except NotImplementedError:
    raise AotUnavailable(
      "deviceless GPU compile needs the CUDA plugin (pip install 'ragtune[gpu-compile]') and a "
      "process started with JAX_PLATFORMS=cpu (ragtune's compile workers set it)"
    ) from None
  except Exception as e:  # a bad proto text: one line from the parser
    raise AotUnavailable(f"GPU target config rejected: {str(e).splitlines()[0][:300]}") from None
  return topologies.make_mesh(topo, (1,), ("x",)), topo.devices[0]


def device_kind(target: str) -> str:
  _, text = target_text(target)
  return _mesh(text)[1].device_kind


# --- compiling ------------------------------------------------------------------------------


def _classify(e: Exception) -> str:
  msg = str(e)
  if (
    "exceeds available shared memory" in msg
    or "Shared memory size limit exceeded" in msg
    or "out of resource: shared memory" in msg.lower()
  ):
    return NO_FIT
  if "register spilling" in msg or "spill" in msg.lower():
    return SPILL
  if "compiles for" in msg and "GPUs only" in msg:
    return UNSUPPORTED
  return ERROR


def _first_lines(e: Exception, limit: int = 600) -> str:
  text = f"{type(e).__name__}: {e}".strip()
  lines = [l for l in text.splitlines() if l.strip()][:4]
  return " | ".join(lines)[:limit]


# XLA's words when ptxas (the nvidia-cuda-nvcc wheel) is missing: no verdict on a config.
_MISSING_TOOL = re.compile(
  r"ptxas.*(not found|no such file)|(couldn't|could not|can't|cannot|unable to) (find|locate)\S* .*ptxas", re.I | re.S
)
_THUNK = re.compile(r"kCustomKernel\s+\[[^\]]*\]\s+(\S+) grid: .*?shared_memory: (\d+) bytes")


def compile_fn(
  target: str,
  fn: Callable,
  *arg_shapes: tuple[tuple[int, ...], Any],
  smem_hint: Callable[[str], int | None] | None = None,
  kernel: Callable[[machine_code.KernelCode], bool] | None = None,
) -> CompileReport:
  """Compile `fn(*args)` for `target`, args given as (shape, dtype) pairs; read its kernels:
  ragtune's (by name), or those `kernel` picks (another library's, named as it likes)."""
  name, text = target_text(target)
  mesh, dev = _mesh(text)
  from jax.sharding import NamedSharding, PartitionSpec

  args = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, PartitionSpec())) for s, d in arg_shapes]
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="ragtune-aot-") as dump:
    try:
      with jax.set_mesh(mesh):
        compiled = jax.jit(fn).lower(*args).compile(compiler_options={"xla_dump_to": dump})
    except Exception as e:  # the compiler's own failure, whatever its type
      if _MISSING_TOOL.search(str(e)):
        raise AotUnavailable(f"the GPU toolchain is incomplete: {_first_lines(e, 300)}") from None
      return CompileReport(name, dev.device_kind, _classify(e), _first_lines(e), time.perf_counter() - start)
    seconds = time.perf_counter() - start
    launch_smem = {}
    for f in Path(dump).glob("*thunk_sequence.txt"):
      for kname, smem in _THUNK.findall(f.read_text()):
        launch_smem[kname] = int(smem)
  # jax's public serializer: a pickle around XLA's executable proto, whose Riegeli record
  # the machine-code reader finds by its magic bytes.
  from jax.experimental import serialize_executable

  blob = serialize_executable.serialize(compiled)[0]
  reports = []
  for kc in machine_code.read_executable(blob, only=None if kernel else KERNEL_PREFIX.encode()):
    if not (kernel(kc) if kernel else kc.name.startswith(KERNEL_PREFIX)):
      continue  # XLA's own fusions around the kernels
    if kc.name in launch_smem:
      smem, source = launch_smem[kc.name], "xla"
    else:
      smem = smem_hint(kc.name) if smem_hint else None
      source = "config" if smem is not None else ""
    reports.append(
      KernelReport(
        kc.name,
        kc.registers,
        kc.spill_bytes,
        kc.stack_bytes,
        smem,
        source,
        kc.mma,
        kc.copy,
        kc.counts,
        kc.serialized_wgmma,
        kc.loops_wait_one,
        kc.loop_spills,
        kc.setmaxnreg,
        kc.hgmma_n,
      )
    )
  outcome, error = verdict(tuple(reports))
  return CompileReport(name, dev.device_kind, outcome, error, seconds, tuple(reports))


def op_arg_shapes(op: str, m: int, k: int, n: int, g: int, dtype: str) -> list[tuple[tuple[int, ...], Any]]:
  """The operands of one op of the forward problem (m, k, n, g), as measure.op_args orders them."""
  dt = jnp.dtype(dtype)
  gs = ((g,), jnp.int32)
  if op == "fwd":
    return [((m, k), dt), ((g, k, n), dt), gs]
  if op == "dlhs":
    return [((m, n), dt), ((g, k, n), dt), gs]
  return [((m, k), dt), ((m, n), dt), gs]


def compile_op(target: str, backend: str, op: str, dtype: str, m: int, k: int, n: int, g: int, config) -> CompileReport:
  """Compile one op of `backend` with `config` (in the op's frame) for `target`: the same
  callable a sweep times (measure.build_op), with interpret off."""
  from ragtune import measure
  from ragtune.shapes import Problem

  p = Problem(op, backend, dtype, m, k, n, g, "compile", ())
  fn = measure.build_op(p, backend, config, interpret=False)
  name, text = target_text(target)
  _, dev = _mesh(text)
  try:
    kernels.registry.check_device(backend, "gpu", dev.device_kind)
  except ValueError as e:
    return CompileReport(name, dev.device_kind, UNSUPPORTED, str(e), 0.0)
  sets_own = kernels.registry.get(backend).smem_at_launch
  hint = (lambda _name: config.smem_bytes(op, dtype, m, k, n)) if sets_own else None
  return compile_fn(target, fn, *op_arg_shapes(op, m, k, n, g, dtype), smem_hint=hint)


def compile_ragged_dot(
  target: str,
  m: int,
  k: int,
  n: int,
  g: int,
  dtype: str = "bfloat16",
  *,
  backend: str = "auto",
  config=None,
  vjp: bool = True,
) -> CompileReport:
  """Compile `kernels.ragged_dot` as a model calls it (forward, and with vjp its two
  gradients) for `target`; config=None takes the LUT or the target's defaults."""
  dt = jnp.dtype(dtype)

  def fn(lhs, rhs, gs, dout):
    f = lambda a, b: kernels.ragged_dot(a, b, gs, backend=backend, config=config, interpret=False)
    if not vjp:
      return f(lhs, rhs)
    out, pull = jax.vjp(f, lhs, rhs)
    return (out, *pull(dout))

  name, text = target_text(target)
  _, dev = _mesh(text)
  with jax.set_mesh(_mesh(text)[0]):
    try:
      plan = {op: (c.backend, c.config) for op, c in resolve(config, backend, m, k, n, g, dt).items()}
    except (TypeError, ValueError) as e:  # a backend the target lacks, or a bad config
      return CompileReport(name, dev.device_kind, _classify(e), _first_lines(e), 0.0)
  own = {op: cfg for op, (b, cfg) in plan.items() if kernels.registry.get(b).smem_at_launch}

  def hint(kname: str) -> int | None:  # fwd and dlhs share the gmm kernel: the larger allocation
    ops = ("drhs",) if "tgmm" in kname else ("fwd", "dlhs")
    sizes = [own[op].smem_bytes(op, dtype, m, k, n) for op in ops if op in own]
    return max(sizes) if sizes else None

  return compile_fn(target, fn, ((m, k), dt), ((g, k, n), dt), ((g,), jnp.int32), ((m, n), dt), smem_hint=hint)
