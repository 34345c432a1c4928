"""Deviceless compile: XLA's real GPU or TPU compiler, run on a CPU-only host for a named device.

GPU: `jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)` gives
a compile-only GPU from a text GpuTargetConfigProto (made from a named GPU's facts, kernels/gpu_facts/).
Under `jax.set_mesh` of that device, `jax.jit(f).lower(...).compile()` runs XLA's GPU
pipeline, the Triton and Mosaic GPU custom calls, and ptxas: every compile error,
shared-memory overflow and register spill the device would see, with nothing run. Needs the
CUDA plugin and ptxas (`python3 -m pip install -e '.[gpu-compile]'`).

TPU: `get_topology_desc(platform="tpu", topology_name="v6e:2x2")` gives compile-only TPUs from
libtpu (`python3 -m pip install -e '.[tpu]'`); one of them is the mesh (Pallas TPU kernels are not
partitioned over several). XLA's TPU compiler and Mosaic then report what does not fit:
a kernel's tiles over the scoped VMEM, a program over the HBM.

Neither says anything of speed, nor of races. A process whose jax runs on the CPU only
(JAX_PLATFORMS=cpu before jax starts; the CLI's compile workers set it). Results: one
CompileReport per compiled op, with a KernelReport per ragtune GPU kernel and, for a TPU,
the memory the compiler reported.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from kernels import common, gpus, quant
from kernels.lut import device_slug
from kernels.ragged_dot import resolve
from ragtune import provenance
from ragtune.deviceless import gpu_proto, machine_code
from ragtune.errors import RagtuneError, install_hint

# GPU targets: the named GPUs of kernels.gpus (h100, a100, l40s, ...), or the slug of one of
# their device kinds (nvidia-a100-sxm4-40gb); a path to any GpuTargetConfigProto text file too.
# TPU target names -> one host's chips, the smallest topology every supported libtpu accepts:
# libtpu 0.0.42 (jax 0.10) refuses 1x1 names ("not divisible by ... chips_per_host_bounds
# 2x2x1"), which 0.0.50 (jax 0.12) accepts, and the mesh takes one device of either. libtpu
# names v7x "tpu7x" and refuses "v7x:...". A topology name of a known chip ("v5e:4x4",
# "v7x:2x2x2" or "tpu7x:2x2x2") works too.
TPU_TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "v7x": "tpu7x:2x2x1"}
# Our kernels' names in the machine code (kernels/<backend>/gmm.py, tgmm.py).
KERNEL_PREFIX = "ragtune_"
# Outcomes, in the order a report names them. register_deadlock: its setmaxnreg plan asks
# for more registers than the CTA is launched with, so a warpgroup waits for them forever.
# loop_spill: spills inside the wgmma loops,
# paid at every step (worse than a spill elsewhere, which is a spill too).
# vmem_oom, hbm_oom: a TPU kernel's tiles over the scoped VMEM, a TPU program over the HBM.
# no_kernel: a GPU program built, but its machine code held none of the kernels it runs, so
# nothing of them was checked: no verdict on the config (ragtune.candidates.prune keeps it).
OK, NO_FIT, DEADLOCK, LOOP_SPILL, SPILL, SERIALIZED, VMEM_OOM, HBM_OOM, UNSUPPORTED, NO_KERNEL, ERROR = (
  "ok",
  "no_fit",
  "register_deadlock",
  "loop_spill",
  "spill",
  "serialized_wgmma",
  "vmem_oom",
  "hbm_oom",
  "unsupported",
  "no_kernel",
  "compile_error",
)
# Outcomes that reject no candidate: a clean build, and a build nothing of which was checked.
NO_VERDICT_AGAINST = (OK, NO_KERNEL)


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
  mma: str  # "wgmma" | "tcgen05" | "tcgen05.2cta" | "mma.sync" | "none"
  copy: str  # "tma" | "cp.async" | "ld/st"
  counts: dict[str, int]
  serialized_wgmma: bool
  loops_wait_one: bool
  loop_spills: int  # STL/LDL inside the loops that issue wgmma or tcgen05 MMAs or read TMEM
  setmaxnreg: bool  # USETMAXREG: registers moved between warpgroups (warp specialization)
  hgmma_n: int  # the widest wgmma's N; 0 without wgmma
  tmem_alloc: bool = False  # allocates tensor memory (tcgen05.alloc)
  cta_pair: bool = False  # its tcgen05 MMAs are a CTA pair's (cta_group::2)
  mma_inputs: str = ""  # the MMAs' input types in the SASS ("bf16", "e4m3"; "" for tcgen05, which names none)
  threads: int = 0  # the CTA's, as the cubin declares them; 0: none declared
  register_pool: int = 0  # launch registers x threads: what setmaxnreg shares out
  setmaxnreg_demand: int | None = None  # what its setmaxnreg counts hold at worst (KernelCode); None: no setmaxnreg
  fma_under_wgmma: int = 0  # FFMAs in its wgmma loops issued while a wgmma may run (SassFacts)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def fault(self) -> tuple[str, str]:
    """(outcome, why) of what makes this kernel unfit though ptxas built it; (OK, "") if
    nothing does."""
    if self.setmaxnreg and not self.threads:
      return DEADLOCK, f"{self.name}: moves registers (setmaxnreg) but declares no thread count to check them against"
    if self.setmaxnreg_demand is not None and self.setmaxnreg_demand > self.register_pool:
      return DEADLOCK, (
        f"{self.name}: setmaxnreg asks for {self.setmaxnreg_demand} registers of a CTA launched with "
        f"{self.register_pool} ({self.threads} threads x {self.registers}): a warpgroup would wait for them forever"
      )
    if self.loop_spills:
      return LOOP_SPILL, f"{self.name}: {self.loop_spills} STL/LDL in its MMA loops ({self.spill_bytes} B/thread)"
    if self.spill_bytes:
      return SPILL, f"{self.name}: {self.spill_bytes} B/thread spilled"
    if self.serialized_wgmma:
      return SERIALIZED, f"{self.name}: wgmma serialized (ptxas C7511 or C7514)"
    return OK, ""


_FAULTS = (DEADLOCK, LOOP_SPILL, SPILL, SERIALIZED)  # the worst first


def verdict(reports: tuple[KernelReport, ...]) -> tuple[str, str]:
  """(outcome, error) of a compile that ptxas finished: the worst fault of any kernel, and
  every faulty kernel named, the worst first; (OK, "") when none has one."""
  faults = sorted((f for f in (r.fault() for r in reports) if f[0] != OK), key=lambda f: _FAULTS.index(f[0]))
  return (faults[0][0] if faults else OK), "; ".join(why for _, why in faults)


@dataclasses.dataclass(frozen=True)
class MemoryReport:
  """Bytes of device memory, as the compiler reported them. A compiled program: its
  arguments, outputs, temporaries and code (`compiled.memory_analysis()`). A TPU compile that
  ran out of memory: what it needed (`used`) and the bound (`limit`), in the space named by
  the outcome (the compiler rounds them to 0.01 MiB or GiB). None: not reported."""

  argument: int | None = None
  output: int | None = None
  temp: int | None = None
  code: int | None = None
  used: int | None = None
  limit: int | None = None

  def to_dict(self) -> dict[str, int]:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """The outcome of compiling one op (or a whole function) for a target."""

  target: str
  device_kind: str
  outcome: str  # OK, NO_FIT, LOOP_SPILL, SPILL, SERIALIZED, VMEM_OOM, HBM_OOM, UNSUPPORTED, NO_KERNEL or ERROR
  error: str  # the compiler's own message (first lines), "" when ok
  seconds: float
  kernels: tuple[KernelReport, ...] = ()
  memory: MemoryReport | None = None
  # What the GPU program runs, in order (XLA's thunk sequence): "<thunk kind> <name>", a loop's
  # body indented under it ("kWhile", then "  kCustomKernel loop_add_fusion"). A loop runs
  # its body's kernels from the host, outside the program's CUDA graph, on every call.
  thunks: tuple[str, ...] = ()

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
      **({"memory": self.memory.to_dict()} if self.memory is not None else {}),
      **({"thunks": list(self.thunks)} if self.thunks else {}),
    }

  @property
  def xla_kernels(self) -> list[str]:
    """The kernels XLA runs beside ours (its fusions, copies' kernels), loop bodies included."""
    return [
      t.split()[1]
      for t in self.thunks
      if t.split()[0] == "kCustomKernel" and not t.split()[1].startswith(KERNEL_PREFIX)
    ]

  @property
  def loops(self) -> list[str]:
    """The program's loops and conditionals (kWhile, kConditional thunks)."""
    return [t.strip() for t in self.thunks if t.split()[0] in ("kWhile", "kConditional")]


# --- the target ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
  """A device to compile for: a GPU from its GpuTargetConfigProto text, or a TPU by topology."""

  name: str
  platform: str  # "gpu" | "tpu"
  spec: str  # the proto text (gpu) or the topology name (tpu)
  chip: common.TpuChip | None = None


def target_names() -> list[str]:
  return [*gpus.gpus(), *TPU_TOPOLOGIES]


def _gpu_variant(name: str) -> tuple[gpus.Gpu, gpus.Variant] | None:
  """The named GPU and variant of a target name: a GPU's name (its first variant) or the slug
  of one of its device kinds."""
  if name in gpus.gpus():
    g = gpus.gpu(name)
    return g, g.variants[0]
  return next(((g, v) for g in gpus.gpus().values() for v in g.variants if device_slug(v.device_kind) == name), None)


def resolve_target(target: str) -> Target:
  """A target name (a named GPU of kernels.gpus: h100, a100, l40s, ...; the slug of one of their
  device kinds; or a TPU: v4, v5e, v5p, v6e, v7x), a TPU topology name of a known chip under its
  name or libtpu's (v5e:4x4, v7x:2x2x2, tpu7x:2x2x2), or a GpuTargetConfigProto file."""
  low = target.lower()
  if (found := _gpu_variant(low)) is not None:
    return Target(low, "gpu", gpu_proto.proto_text(*found))
  chip_name, _, topology = low.partition(":")
  for chip in common.CHIPS:
    prefix = TPU_TOPOLOGIES[chip.name].partition(":")[0]
    if chip_name in (chip.name, prefix):
      return Target(chip.name, "tpu", f"{prefix}:{topology}" if topology else TPU_TOPOLOGIES[chip.name], chip)
  path = Path(target)
  if not path.is_file():
    raise RagtuneError(
      f"--target {target}: not one of {target_names()}, a TPU topology name nor a GpuTargetConfigProto file"
    )
  return Target(path.stem, "gpu", path.read_text())


def target_text(target: str) -> tuple[str, str]:
  """(name, GpuTargetConfigProto text) of a GPU target name (h100, a100, ...) or file path."""
  t = resolve_target(target)
  if t.platform != "gpu":
    raise RagtuneError(f"--target {target}: a TPU has no GpuTargetConfigProto")
  return t.name, t.spec


def target_for_kind(device_kind: str) -> str | None:
  """The target name of a jax device_kind this module can compile for, or None."""
  c = common.chip(device_kind)
  if c is not None:
    return c.name
  g = gpus.by_kind(device_kind)
  if g is None:
    return None
  return g.name if g.device_kind == device_kind else device_slug(device_kind)


def proto_device_kind(text: str) -> str | None:
  """The jax device_kind a GpuTargetConfigProto text names (its device_description_str)."""
  found = re.search(r'device_description_str:\s*"([^"]+)"', text)
  return found.group(1) if found else None


@functools.cache
def _mesh(platform: str, spec: str):
  from jax.experimental import topologies

  if platform == "tpu":
    # libtpu locks /tmp/libtpu_lockfile for one process unless told that several may load
    # it; a compile-only client touches no chip, so parallel compile workers are safe.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
      raise AotUnavailable(f"deviceless TPU compile needs libtpu: {install_hint('tpu')}")
    try:
      topo = topologies.get_topology_desc(platform="tpu", topology_name=spec)
    except Exception as e:  # a topology name libtpu refuses, or a jax that started on another platform
      first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
      raise AotUnavailable(
        f"libtpu gives no compile-only TPU for topology {spec!r} ({first}); it needs a name such as "
        f"{', '.join(TPU_TOPOLOGIES.values())} and a process started with JAX_PLATFORMS=cpu "
        "(ragtune's compile workers set it)"
      ) from None
    # One device: Pallas TPU kernels are not partitioned over several.
    return jax.sharding.Mesh(np.array(topo.devices[:1]), ("x",)), topo.devices[0]
  try:
    topo = topologies.get_topology_desc(platform="cuda", target_config=spec, topology="1x1x1")
  except NotImplementedError:
    raise AotUnavailable(
      f"deviceless GPU compile needs the CUDA plugin ({install_hint('gpu-compile')}) and a "
      "process started with JAX_PLATFORMS=cpu (ragtune's compile workers set it)"
    ) from None
  except Exception as e:  # a bad proto text: one line from the parser
    raise AotUnavailable(f"GPU target config rejected: {str(e).splitlines()[0][:300]}") from None
  dev = topo.devices[0]
  capability = getattr(dev, "compute_capability", None)
  gpus.note_capability(dev.device_kind, capability)  # a file's GPU of no facts
  for b in kernels.registry.REGISTRY.values():
    if b.aot_target is not None:
      b.aot_target(dev.device_kind, capability)
  return topologies.make_mesh(topo, (1,), ("x",)), dev


def target_mesh(target: str):
  """(mesh, device) of a target's compile-only device."""
  t = resolve_target(target)
  return _mesh(t.platform, t.spec)


def device_kind(target: str) -> str:
  return target_mesh(target)[1].device_kind


# --- compiling ------------------------------------------------------------------------------


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_AMOUNT = r"([\d.]+)\s*([KMGT])i?B?"
# libtpu's words for a kernel over the scoped VMEM, a program over all of VMEM, and over HBM:
# (outcome, pattern with the amount used and the limit).
# (outcome, what ran out, pattern with the amount used and the limit).
_TPU_OOM = (
  (VMEM_OOM, "scoped VMEM", re.compile(rf"Scoped allocation with size {_AMOUNT} and limit {_AMOUNT}")),
  (VMEM_OOM, "VMEM", re.compile(rf"Used {_AMOUNT} of {_AMOUNT} vmem", re.I)),
  (HBM_OOM, "HBM", re.compile(rf"\(?{_AMOUNT}\)? exceeds available HBM \({_AMOUNT}\)")),
  (HBM_OOM, "HBM", re.compile(rf"Used {_AMOUNT} of {_AMOUNT} hbm", re.I)),
)


def _bytes(number: str, unit: str) -> int:
  return round(float(number) * _UNITS[unit])


def tpu_oom(message: str) -> tuple[str, str, MemoryReport] | None:
  """(VMEM_OOM or HBM_OOM, what ran out, the amounts) of a TPU compiler's out-of-memory
  message; None for any other message."""
  for outcome, space, pattern in _TPU_OOM:
    found = pattern.search(message)
    if found:
      used, limit = _bytes(*found.group(1, 2)), _bytes(*found.group(3, 4))
      return outcome, space, MemoryReport(used=used, limit=limit)
  low = message.lower()
  if "memory space vmem" in low or "vmemoom" in low:
    return VMEM_OOM, "VMEM", MemoryReport()
  if "memory on hbm" in low or "memory space hbm" in low:
    return HBM_OOM, "HBM", MemoryReport()
  return None


def _classify(e: Exception) -> str:
  msg = str(e)
  oom = tpu_oom(msg)
  if oom is not None:
    return oom[0]
  if (
    "exceeds available shared memory" in msg
    or "Shared memory size limit exceeded" in msg
    or "out of resource: shared memory" in msg.lower()
  ):
    return NO_FIT
  if "register spilling" in msg or "spill" in msg.lower():
    return SPILL
  if ("compiles for" in msg and "GPUs only" in msg) or "has no fp8 tensor cores" in msg:  # Backend.refusal's
    return UNSUPPORTED
  return ERROR


# The GPUs this process has compiled for. jaxlib assembles every Mosaic GPU kernel of a
# process for the GPU of its first one (jax 0.10.2 and 0.12.0.1): a B200 kernel after an H100
# one fails in ptxas ("SM version specified by .target is higher than default SM version
# assumed", on stderr; the exception says only "Pass pipeline failed").
_GPU_KINDS_COMPILED: set[str] = set()


def _other_gpu_hint(device_kind: str) -> str:
  others = sorted(_GPU_KINDS_COMPILED - {device_kind})
  if not others:
    return ""
  return (
    f" (this process compiled for {', '.join(others)} before: jaxlib assembles Mosaic GPU kernels for the "
    "first GPU a process compiled for; compile each GPU in a process of its own, as `ragtune compile` does)"
  )


def _first_lines(e: Exception, limit: int = 600) -> str:
  text = f"{type(e).__name__}: {e}".strip()
  lines = [l for l in text.splitlines() if l.strip()][:4]
  return " | ".join(lines)[:limit]


def _tpu_error(e: Exception) -> str:
  """The lines of a TPU compile error worth a reader's time: libtpu puts its out-of-memory
  amounts after a long HLO instruction, so they lead here."""
  oom = tpu_oom(str(e))
  if oom is None:
    return _first_lines(e)
  outcome, space, mem = oom
  unit, size = ("MiB", 1 << 20) if outcome == VMEM_OOM else ("GiB", 1 << 30)
  need = f": needs {mem.used / size:.2f} {unit} of {mem.limit / size:.2f} {unit} {space}" if mem.used else ""
  return f"out of {space}{need} | {_first_lines(e, 300)}"[:600]


def _memory(compiled) -> MemoryReport | None:
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every client reports it
    return None
  if m is None:
    return None
  return MemoryReport(
    argument=m.argument_size_in_bytes,
    output=m.output_size_in_bytes,
    temp=m.temp_size_in_bytes,
    code=m.generated_code_size_in_bytes,
  )


# XLA's words when ptxas (the nvidia-cuda-nvcc wheel) is missing: no verdict on a config.
_MISSING_TOOL = re.compile(
  r"ptxas.*(not found|no such file)|(couldn't|could not|can't|cannot|unable to) (find|locate)\S* .*ptxas", re.I | re.S
)
_THUNK = re.compile(r"kCustomKernel\s+\[[^\]]*\]\s+(\S+) grid: .*?shared_memory: (\d+) bytes")
# A line of XLA's thunk sequence: its indent (a loop's body is indented), kind and name.
_THUNK_LINE = re.compile(r"^( *)\d+: (k\w+)\s+\[[^\]]*\]\s*(\S*)", re.M)


def compile_fn(
  target: str,
  fn: Callable,
  *arg_shapes: tuple[tuple[int, ...], Any],
  smem_hint: Callable[[str], int | None] | None = None,
  kernel: Callable[[machine_code.KernelCode], bool] | None = None,
  expect_kernel: bool = True,
) -> CompileReport:
  """Compile `fn(*args)` for `target`, args given as (shape, dtype) pairs; read its kernels:
  ragtune's (by name), or those `kernel` picks (another library's, named as it likes). A GPU
  build whose machine code holds none of them is NO_KERNEL, not OK (nothing was checked),
  unless expect_kernel is False: `fn` runs only XLA's own ops. A TPU has no machine code to
  read here: its report gives the outcome and the memory."""
  t = resolve_target(target)
  mesh, dev = _mesh(t.platform, t.spec)
  from jax.sharding import NamedSharding, PartitionSpec

  args = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, PartitionSpec())) for s, d in arg_shapes]
  name = t.name
  start = time.perf_counter()
  if t.platform == "tpu":
    try:
      with jax.set_mesh(mesh):
        compiled = jax.jit(fn).lower(*args).compile()
    except Exception as e:  # the compiler's own failure, whatever its type
      oom = tpu_oom(str(e))
      outcome, memory = (oom[0], oom[2]) if oom else (_classify(e), None)
      return CompileReport(name, dev.device_kind, outcome, _tpu_error(e), time.perf_counter() - start, (), memory)
    return CompileReport(name, dev.device_kind, OK, "", time.perf_counter() - start, (), _memory(compiled))
  options = {"xla_gpu_cuda_data_dir": cuda} if (cuda := provenance.cuda_data_dir()) else {}
  with tempfile.TemporaryDirectory(prefix="ragtune-aot-") as dump:
    try:
      with jax.set_mesh(mesh):
        compiled = jax.jit(fn).lower(*args).compile(compiler_options={"xla_dump_to": dump, **options})
    except Exception as e:  # the compiler's own failure, whatever its type
      if _MISSING_TOOL.search(str(e)):
        raise AotUnavailable(f"the GPU toolchain is incomplete: {_first_lines(e, 300)}") from None
      error = _first_lines(e) + _other_gpu_hint(dev.device_kind)
      return CompileReport(name, dev.device_kind, _classify(e), error, time.perf_counter() - start)
    _GPU_KINDS_COMPILED.add(dev.device_kind)
    seconds = time.perf_counter() - start
    launch_smem, thunks = {}, []
    for f in sorted(Path(dump).glob("*thunk_sequence.txt")):
      text = f.read_text()
      for kname, smem in _THUNK.findall(text):
        launch_smem[kname] = int(smem)
      for indent, kind, tname in _THUNK_LINE.findall(text):
        depth = len(indent) // 4  # a loop's condition and body sit 4 spaces in
        thunks.append(f"{'  ' * depth}{kind} {tname}".rstrip())
  # jax's public serializer: a pickle around XLA's executable proto, whose Riegeli record
  # the machine-code reader finds by its magic bytes.
  from jax.experimental import serialize_executable

  blob = serialize_executable.serialize(compiled)[0]
  found = machine_code.read_executable(blob, only=None if kernel else KERNEL_PREFIX.encode())
  reports = []
  for kc in found:
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
        kc.tmem_alloc,
        kc.cta_pair,
        kc.mma_inputs,
        kc.threads,
        kc.register_pool,
        kc.setmaxnreg_demand,
        kc.fma_under_wgmma,
      )
    )
  if expect_kernel and not reports:
    # A reader that misses the kernels (a new executable layout) must not pass for a clean build.
    n = len(machine_code.cubins(blob))
    if kernel:
      what = f"none of the picked kernels ({len(found)} functions in {n} cubins read)"
    else:
      what = f"no {KERNEL_PREFIX}* kernel ({n} cubins read)"
    error = f"the machine code held {what}: nothing was checked"
    return CompileReport(name, dev.device_kind, NO_KERNEL, error, seconds, (), _memory(compiled), tuple(thunks))
  outcome, error = verdict(tuple(reports))
  return CompileReport(name, dev.device_kind, outcome, error, seconds, tuple(reports), _memory(compiled), tuple(thunks))


def op_arg_shapes(op: str, m: int, k: int, n: int, g: int, dtype: str) -> list[tuple[tuple[int, ...], Any]]:
  """The operands of one op of the forward problem (m, k, n, g), as measure.op_args orders them
  (a training format's dlhs and drhs: float ones, quantized in the op, but dlhs's weights,
  which the forward quantized)."""
  from ragtune.device.measure import QUANTIZED_RHS_NK, TRAINED_DTYPE
  from ragtune.problems.shapes import trained

  dt = jnp.dtype(TRAINED_DTYPE if trained(op, dtype) else common.element_dtype(dtype))
  gs = ((g,), jnp.int32)
  if common.scheme(dtype) and not trained(op, dtype):
    # quantized operands in measure's layout, and their float32 scales (kernels.quant)
    ls, rs = quant.scale_shapes(common.scheme(dtype), m, k, n, g)
    rhs = (g, n, k) if QUANTIZED_RHS_NK else (g, k, n)
    return [((m, k), dt), (rhs, dt), gs, (ls, jnp.float32), (rs, jnp.float32)]
  if op == "fwd":
    return [((m, k), dt), ((g, k, n), dt), gs]
  if op == "dlhs" and trained(op, dtype):  # float dout, the forward's quantized weights (measure.trained_inputs)
    q = jnp.dtype(common.element_dtype(dtype))
    _, rs = quant.scale_shapes(common.scheme(dtype), m, k, n, g)
    return [((m, n), dt), ((g, k, n), q), gs, (rs, jnp.float32), ((g, n, k), q)]
  if op == "dlhs":
    return [((m, n), dt), ((g, k, n), dt), gs]
  return [((m, k), dt), ((m, n), dt), gs]


def compile_op(target: str, backend: str, op: str, dtype: str, m: int, k: int, n: int, g: int, config) -> CompileReport:
  """Compile one op of `backend` with `config` (in the op's frame) for `target`: the same
  callable a sweep times (measure.build_op), with interpret off."""
  from ragtune.device import measure
  from ragtune.problems.shapes import Problem

  p = Problem(op, backend, dtype, m, k, n, g, "compile", ())
  fn = measure.build_op(p, backend, config, interpret=False)
  t = resolve_target(target)
  _, dev = _mesh(t.platform, t.spec)
  try:
    kernels.registry.check_device(backend, t.platform, dev.device_kind, dtype)
  except ValueError as e:
    return CompileReport(t.name, dev.device_kind, UNSUPPORTED, str(e), 0.0)
  b = kernels.registry.get(backend)
  hint = (lambda _name: config.smem_bytes(op, dtype, m, k, n)) if b.smem_at_launch else None
  shapes = op_arg_shapes(op, m, k, n, g, dtype)
  return compile_fn(target, fn, *shapes, smem_hint=hint, expect_kernel=b.own_kernels)


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
  train: bool = False,
) -> CompileReport:
  """Compile `kernels.ragged_dot` as a model calls it (forward, and with vjp its two
  gradients) for `target`; config=None takes the LUT or the target's defaults. A quantized
  format (common.QUANT_FORMATS) compiles the forward with its scales, as a serving model
  calls it; with train, a training format (common.TRAINING_FORMATS) compiles as a model trains
  in it: bfloat16 operands through ragged_dot(quantize=), forward and (with vjp) both
  gradients, each an fp8 kernel."""
  if common.scheme(dtype) and not train:
    return _compile_quantized(target, m, k, n, g, dtype, backend=backend, config=config)
  from ragtune.device.measure import TRAINED_DTYPE

  if train:
    quant.check_training_format(dtype)
  dt = jnp.dtype(TRAINED_DTYPE if train else dtype)
  quantize = dtype if train else None

  def fn(lhs, rhs, gs, dout):
    f = lambda a, b: kernels.ragged_dot(a, b, gs, quantize=quantize, backend=backend, config=config, interpret=False)
    if not vjp:
      return f(lhs, rhs)
    out, pull = jax.vjp(f, lhs, rhs)
    return (out, *pull(dout))

  t = resolve_target(target)
  mesh, dev = _mesh(t.platform, t.spec)
  with jax.set_mesh(mesh):
    try:
      plan = {op: (c.backend, c.config) for op, c in resolve(config, backend, m, k, n, g, dtype).items()}
    except (TypeError, ValueError) as e:  # a backend the target lacks, or a bad config
      return CompileReport(t.name, dev.device_kind, _classify(e), _first_lines(e), 0.0)
  own = {op: cfg for op, (b, cfg) in plan.items() if kernels.registry.get(b).smem_at_launch}

  def hint(kname: str) -> int | None:  # fwd and dlhs share the gmm kernel: the larger allocation
    ops = ("drhs",) if "tgmm" in kname else ("fwd", "dlhs")
    sizes = [own[op].smem_bytes(op, dtype, m, k, n) for op in ops if op in own]
    return max(sizes) if sizes else None

  own_kernels = any(kernels.registry.get(b).own_kernels for b, _ in plan.values())
  shapes = (((m, k), dt), ((g, k, n), dt), ((g,), jnp.int32), ((m, n), dt))
  return compile_fn(target, fn, *shapes, smem_hint=hint, expect_kernel=own_kernels)


def _compile_quantized(target: str, m: int, k: int, n: int, g: int, fmt: str, *, backend: str, config) -> CompileReport:
  """compile_ragged_dot of quantized operands: the forward, as a serving model calls it
  (the weights' layout of measure.QUANTIZED_RHS_NK)."""
  from ragtune.device.measure import QUANTIZED_RHS_NK

  def fn(lhs, rhs, gs, ls, rs):
    kw = dict(backend=backend, config=config, interpret=False, transpose_rhs=QUANTIZED_RHS_NK)
    return kernels.ragged_dot(lhs, rhs, gs, lhs_scale=ls, rhs_scale=rs, **kw)

  t = resolve_target(target)
  mesh, dev = _mesh(t.platform, t.spec)
  with jax.set_mesh(mesh):
    try:
      choice = resolve(config, backend, m, k, n, g, fmt, ops=("fwd",))["fwd"]
      kernels.registry.check_dtype(choice.backend, fmt, fmt, fmt)
    except (TypeError, ValueError) as e:  # a backend without the format, or a bad config
      return CompileReport(t.name, dev.device_kind, _classify(e), _first_lines(e), 0.0)
  b = kernels.registry.get(choice.backend)
  hint = (lambda _name: choice.config.smem_bytes("fwd", fmt, m, k, n)) if b.smem_at_launch else None
  shapes = op_arg_shapes("fwd", m, k, n, g, fmt)
  return compile_fn(target, fn, *shapes, smem_hint=hint, expect_kernel=b.own_kernels)
