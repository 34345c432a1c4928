"""NVIDIA GPUs: what each compute capability lets a kernel do, and the facts of each named GPU.

The one place for what differs between NVIDIA GPUs:
- ARCHS: per compute capability, the shared memory a block may opt into, the MMA instructions
  and whether the tensor cores take fp8 (CUDA C++ Programming Guide, "Compute Capabilities":
  https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#compute-capabilities).
  Backends name the archs they compile for (Backend.families); defaults and search spaces
  keep to its shared memory.
- gpus(): the named GPUs, one facts file each in kernels/gpu_facts/ (SMs, L2, clock, memory and its
  bandwidth, dense tensor-core peaks, the device_kind strings jax reports for each variant,
  and a source for each figure). ragtune compiles for them by name (--target) and takes their
  datasheet peaks for its models.

A device kind not listed here is placed by its compute capability when a process has seen it
(kernels.target records it from the jax device, ragtune's deviceless compile from its target),
saying so once; else by the fragments of names in NAME_FAMILIES; else as "other", the most
careful arch (99 KB of shared memory, no fp8, no wgmma, no tcgen05).

Imports nothing of jax: the backends, the registry and ragtune read it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger("kernels")

FACTS_DIR = Path(__file__).parent / "gpu_facts"
KIB = 1024
# 32-bit registers per SM on every arch below (the same table of the CUDA guide).
REGISTERS_PER_SM = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Arch:
  """What a compute capability gives a kernel.

  smem_per_block: the opt-in maximum of shared memory one block may use; smem_per_sm: an SM's.
  threads_per_sm, fp32_per_sm: resident threads and FP32 lanes of an SM (the same guide).
  mma: the widest tensor-core MMA of the arch: "mma.sync" (a warp's), "wgmma" (a warpgroup's,
    sm_90a) or "tcgen05" (an SM's, accumulating in tensor memory, sm_100a and sm_103a).
  fp8: its tensor cores take e4m3/e5m2 operands (sm_89 and newer; Triton refuses fp8
    conversions below 8.9)."""

  name: str
  capabilities: tuple[tuple[int, int], ...]  # (major, minor); a minor of -1 takes every minor
  smem_per_block: int
  smem_per_sm: int
  threads_per_sm: int
  fp32_per_sm: int
  mma: str
  fp8: bool

  def covers(self, capability: tuple[int, int]) -> bool:
    return any(c == capability or (c[1] == -1 and c[0] == capability[0]) for c in self.capabilities)


ARCHS = (
  Arch("ampere", ((8, 0),), 163 * KIB, 164 * KIB, 2048, 64, "mma.sync", False),  # A100, A30
  Arch("ampere-ga10x", ((8, 6),), 99 * KIB, 100 * KIB, 1536, 128, "mma.sync", False),  # A10, A40, RTX 30xx
  Arch("ada", ((8, 9),), 99 * KIB, 100 * KIB, 1536, 128, "mma.sync", True),  # L4, L40S, RTX 40xx
  Arch("hopper", ((9, 0),), 227 * KIB, 228 * KIB, 2048, 128, "wgmma", True),
  Arch("blackwell", ((10, -1),), 227 * KIB, 228 * KIB, 2048, 128, "tcgen05", True),  # B200, GB200, B300
  Arch("blackwell-rtx", ((12, -1),), 99 * KIB, 100 * KIB, 1536, 128, "mma.sync", True),  # RTX PRO 6000, RTX 50xx
)
# A GPU of no known capability (and the CPU host that interprets the kernels): the careful one.
OTHER = Arch("other", (), 99 * KIB, 100 * KIB, 1536, 128, "mma.sync", False)
# Device kinds no facts file lists, placed by words of their names (lower case): "NVIDIA H800".
NAME_FAMILIES = (
  ("hopper", ("h100", "h200", "h800", "h20", "gh200")),
  ("blackwell", ("b100", "b200", "gb200", "b300", "gb300")),
  ("ampere", ("a100", "a800", "a30")),
)


def arch_of_capability(capability: tuple[int, int] | str) -> Arch:
  """The Arch of a compute capability, (9, 0) or "9.0"; OTHER for one no Arch covers."""
  cc = parse_capability(capability) if isinstance(capability, str) else capability
  return next((a for a in ARCHS if a.covers(cc)), OTHER)


def arch_names(names) -> str:
  """'hopper (9.0)' or 'hopper (9.0)/blackwell (10.x)': archs by name, with their capabilities."""
  by = {a.name: a for a in ARCHS}
  caps = lambda a: ", ".join(f"{c[0]}.{'x' if c[1] == -1 else c[1]}" for c in a.capabilities)
  return "/".join(f"{n} ({caps(by[n])})" if n in by else n for n in names)


def parse_capability(text: str) -> tuple[int, int]:
  major, _, minor = str(text).partition(".")
  return int(major), int(minor or 0)


# --- the named GPUs ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
  """One product of a GPU as jax names it: its device_kind, memory and memory bandwidth."""

  device_kind: str
  memory_bytes: int
  memory_bytes_per_s: float


@dataclasses.dataclass(frozen=True)
class Gpu:
  """A named GPU, from its facts file (kernels/gpu_facts/<name>.toml).

  tflops: dense tensor-core peaks (no 2:4 sparsity) by operand class: "bf16" (also f16, fp32
    accumulate), "fp8", "int8"; a class the chip lacks is absent. variants: the device kinds
    of its products, the first the one `--target <name>` compiles for. sources: figure ->
    where it is published."""

  name: str
  title: str
  capability: tuple[int, int]
  sms: int
  l2_bytes: int
  clock_ghz: float
  tflops: Mapping[str, float]
  variants: tuple[Variant, ...]
  sources: Mapping[str, str]
  notes: str = ""

  @property
  def arch(self) -> Arch:
    return arch_of_capability(self.capability)

  @property
  def device_kind(self) -> str:
    return self.variants[0].device_kind

  def variant(self, device_kind: str) -> Variant | None:
    return next((v for v in self.variants if v.device_kind == device_kind), None)


# The figures a facts file must give, each with a source.
REQUIRED = ("capability", "sms", "l2_bytes", "clock_ghz", "tflops", "variants")
PEAK_CLASSES = ("bf16", "fp8", "int8")


class FactsError(ValueError):
  """A facts file that does not say what a Gpu needs."""


def _gpu(path: Path) -> Gpu:
  try:
    d = tomllib.loads(path.read_text())
  except (OSError, tomllib.TOMLDecodeError) as e:
    raise FactsError(f"{path}: {e}") from None
  where = lambda key: f"{path}: {key}"
  missing = [k for k in ("name", "title", *REQUIRED, "sources") if k not in d]
  if missing:
    raise FactsError(where(f"missing {', '.join(missing)}"))
  unsourced = [k for k in REQUIRED if k not in d["sources"]]
  if unsourced:
    raise FactsError(where(f"sources: no source for {', '.join(unsourced)}"))
  bad = set(d["tflops"]) - set(PEAK_CLASSES)
  if bad or "bf16" not in d["tflops"]:
    raise FactsError(where(f"tflops: takes {PEAK_CLASSES} (bf16 at least), got {sorted(d['tflops'])}"))
  if not isinstance(d["sources"], dict) or not d["variants"]:
    raise FactsError(where("sources must be a table and variants a non-empty array of tables"))
  try:
    variants = tuple(
      Variant(v["device_kind"], int(v["memory_bytes"]), float(v["memory_bytes_per_s"])) for v in d["variants"]
    )
  except (KeyError, TypeError, ValueError) as e:
    raise FactsError(where(f"variants: each needs device_kind, memory_bytes and memory_bytes_per_s ({e})")) from None
  return Gpu(
    name=d["name"],
    title=d["title"],
    capability=parse_capability(d["capability"]),
    sms=int(d["sms"]),
    l2_bytes=int(d["l2_bytes"]),
    clock_ghz=float(d["clock_ghz"]),
    tflops={k: float(v) for k, v in d["tflops"].items()},
    variants=variants,
    sources=dict(d["sources"]),
    notes=d.get("notes", ""),
  )


@functools.cache
def gpus() -> dict[str, Gpu]:
  """Name -> Gpu, every facts file, in order of compute capability then name."""
  found = sorted((_gpu(p) for p in FACTS_DIR.glob("*.toml")), key=lambda g: (g.capability, g.name))
  kinds = [v.device_kind for g in found for v in g.variants]
  names = [g.name for g in found]
  dup = sorted({k for k in kinds if kinds.count(k) > 1} | {n for n in names if names.count(n) > 1})
  if dup:
    raise FactsError(f"{FACTS_DIR}: device kinds or names in more than one file: {dup}")
  return {g.name: g for g in found}


def gpu(name: str) -> Gpu:
  try:
    return gpus()[name]
  except KeyError:
    raise ValueError(f"no GPU named {name!r}; known: {', '.join(gpus())}") from None


@functools.cache
def _by_kind() -> dict[str, Gpu]:
  return {v.device_kind: g for g in gpus().values() for v in g.variants}


def by_kind(device_kind: str | None) -> Gpu | None:
  """The named GPU one of whose variants jax names `device_kind`, or None. A dict lookup: the
  search space asks it of every candidate (fits -> common.gpu_smem_limit)."""
  return _by_kind().get(device_kind or "")


# --- a device kind's arch -----------------------------------------------------------------

# Device kinds no facts file lists, with the compute capability a device of that kind
# reported in this process (kernels.target, ragtune's deviceless compile).
_seen: dict[str, tuple[int, int]] = {}


def note_capability(device_kind: str, capability: tuple[int, int] | str | None) -> None:
  """Record what a device of `device_kind` reported as its compute capability. A kind no facts
  file lists is then placed by it, and a WARNING says so, once per kind and process."""
  if not device_kind or capability in (None, "") or by_kind(device_kind) is not None:
    return
  try:
    cc = parse_capability(capability) if isinstance(capability, str) else tuple(capability)
  except ValueError:  # not an NVIDIA compute capability (a ROCm device's "gfx942")
    return
  if _seen.get(device_kind) == cc:
    return
  _seen[device_kind] = cc
  a = arch_of_capability(cc)
  logger.warning(
    "kernels: GPU %r has no facts file (kernels/gpu_facts/); placed by its compute capability %d.%d as %s "
    "(%d KiB of shared memory a block, %s MMAs%s)",
    device_kind,
    *cc,
    a.name,
    a.smem_per_block // KIB,
    a.mma,
    ", fp8" if a.fp8 else ", no fp8",
  )


def capability(device_kind: str | None) -> tuple[int, int] | None:
  """A device kind's compute capability: its facts file's, else what a device of that kind
  reported in this process; None when neither is known."""
  g = by_kind(device_kind)
  if g is not None:
    return g.capability
  return _seen.get(device_kind or "")


def arch(device_kind: str | None) -> Arch:
  """The Arch of a jax device_kind: by its facts file, else its recorded compute capability,
  else fragments of its name (NAME_FAMILIES), else OTHER."""
  cc = capability(device_kind)
  if cc is not None:
    return arch_of_capability(cc)
  words = set(re.findall(r"[a-z0-9]+", (device_kind or "").lower()))
  for family, fragments in NAME_FAMILIES:
    if words & set(fragments):
      return next(a for a in ARCHS if a.name == family)
  return OTHER


def how_placed(device_kind: str | None) -> str:
  """How arch() placed a device kind, in words: "facts file <name>", "compute capability 8.6",
  "name", or "unknown"."""
  g = by_kind(device_kind)
  if g is not None:
    return f"facts file {g.name}"
  if (cc := _seen.get(device_kind or "")) is not None:
    return f"compute capability {cc[0]}.{cc[1]}"
  return "name" if arch(device_kind) is not OTHER else "unknown"


def describe(device_kind: str | None) -> str:
  """'NVIDIA L40S' (8.9, ada): a device kind with its capability and arch, for messages."""
  cc = capability(device_kind)
  at = f"{cc[0]}.{cc[1]}, " if cc else ""
  return f"{device_kind!r} ({at}{arch(device_kind).name})"


# --- what the rules decide --------------------------------------------------------------------


def fp8_refusal(device_kind: str | None) -> str:
  """Why a kernel of ours cannot take fp8 operands on this GPU, or "" when it can."""
  a = arch(device_kind)
  if a.fp8:
    return ""
  if a is OTHER:
    return (
      f"{describe(device_kind)} has no fp8 tensor cores that ragtune knows of (its compute capability is "
      "unknown here; 8.9 and newer have them)"
    )
  return f"{describe(device_kind)} has no fp8 tensor cores (compute capability 8.9 and newer have them)"


def peak_class(fmt: str) -> str:
  """The tensor-core peak a format runs at: "fp8", "int8" or "bf16" (16-bit and f32 inputs)."""
  dtype = fmt.partition(":")[0]
  return "fp8" if dtype.startswith("float8") else "int8" if dtype == "int8" else "bf16"


def peaks(device_kind: str | None, fmt: str = "bfloat16") -> tuple[float | None, float | None]:
  """(dense tensor-core TF/s for `fmt`, memory GB/s) from the datasheet of a named GPU;
  (None, None) for a device kind no facts file lists, None for a class it lacks."""
  g = by_kind(device_kind)
  if g is None:
    return None, None
  v = g.variant(device_kind)
  return g.tflops.get(peak_class(fmt)), v.memory_bytes_per_s / 1e9


def serves(lut_kind: str, device_kind: str) -> bool:
  """Whether a LUT tuned on `lut_kind` may serve a device of `device_kind`: both named, of one
  compute capability and as many SMs. Every config then compiles, fits and launches the same
  (a persistent kernel's grid is the SM count); memory, L2 and clock may differ, which move the
  best config, not whether it runs."""
  a, b = by_kind(lut_kind), by_kind(device_kind)
  return a is not None and b is not None and a.capability == b.capability and a.sms == b.sms
