"""The peer compile table: tokamax's ragged_dot and ragtune's defaults, compiled for a GPU on
this CPU host, and what their machine code is made of.

  python benchmarks/peer_compile.py                          # H100, every anchor, fwd
  python benchmarks/peer_compile.py --target h200 --op fwd,dlhs,drhs
  python benchmarks/peer_compile.py --only mixtral-8x7b --lib tokamax:mosaic_gpu

Each library compiles deviceless with XLA's real GPU compiler (ragtune.deviceless.aot: the same
topology, mesh and ptxas as `ragtune compile`), and ragtune.deviceless.machine_code reads both
libraries' cubins the same way. tokamax runs with its own configs (its shipped cache, else
its heuristics; the tile column says which); ragtune with its defaults for the target. One
row per matmul kernel (one that issues an MMA instruction; XLA's own small fusions around it
are left out), or one row saying why a library did not compile or is absent. Nothing is
timed: registers, spills and instruction kinds are facts of the build, not of its speed.

tokamax's implementations: "mosaic_gpu" (Pallas Mosaic GPU) and "triton", which is Pallas
Triton up to 0.0.14 and native Triton through jax_triton from 0.0.15 (absent without the
jax_triton and triton packages: a row says so). Native Triton writes PTX for the newest ISA
of its own bundled ptxas and XLA assembles it with the gpu-compile extra's, which may be
older; so Triton is pointed at that ptxas here (TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH,
unless set), and both agree on the ISA.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CUDA plugin then serves compile-only GPUs
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
from anchors import ANCHORS, chosen  # noqa: E402

import kernels  # noqa: E402
from ragtune import provenance  # noqa: E402
from ragtune.deviceless import aot  # noqa: E402
from ragtune.errors import RagtuneError  # noqa: E402
from ragtune.lut import bench  # noqa: E402

OPS = kernels.common.OPS
# Library name -> how it is built: tokamax's `implementation`, or a ragtune backend.
LIBS = {
  "tokamax:triton": ("tokamax", "triton"),
  "tokamax:mosaic_gpu": ("tokamax", "mosaic_gpu"),
  "ragtune:pallas_gpu": ("ragtune", "pallas_gpu"),
  "ragtune:mosaic_gpu": ("ragtune", "mosaic_gpu"),
}
DTYPE = "bfloat16"
COLUMNS = (
  "problem",
  "op",
  "library",
  "kernel",
  "tile mxkxn",
  "outcome",
  "regs",
  "spill B",
  "wgmma N",
  "setmaxnreg",
  "copy",
  "C7511",
  "loop spills",
  "compile s",
)
TRITON_PTXAS = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")  # the ptxas Triton reads below sm_90, and from it


@dataclasses.dataclass(frozen=True)
class PeerRow:
  """One kernel of one library's compile of one problem's op; kernel None when the compile
  failed or built no matmul kernel (outcome and error say which)."""

  problem: str
  op: str
  library: str
  outcome: str
  error: str
  seconds: float
  kernel: aot.KernelReport | None
  tile: str = "-"  # block_m x block_k x block_n of the config it built, in its own op's frame

  def cells(self) -> tuple[str, ...]:
    k = self.kernel
    yes = lambda b: "yes" if b else "no"
    outcome = self.outcome if not self.error else f"{self.outcome}: {self.error[:140]}"
    head = (self.problem, self.op, self.library, k.name if k else "-", self.tile, outcome)
    if k is None:
      return (*head, *["-"] * 7, f"{self.seconds:.1f}")
    facts = (k.registers, k.spill_bytes, k.hgmma_n or "-", yes(k.setmaxnreg), k.copy, yes(k.serialized_wgmma))
    return (*head, *map(str, facts), str(k.loop_spills), f"{self.seconds:.1f}")


@contextlib.contextmanager
def cross_compile_tokamax(target: str):
  """Yields (tokamax or None, its version or why it is left out), set to build for the
  target's compile-only device while the context lasts: its hardware checks off
  (tokamax.config.cross_compile, the --tokamax_cross_compile flag), and that device as
  jax's default, whose compute capability (read by tokamax._src.gpu_utils) picks its kernel
  generation (sm90 for H100 and H200) and whose kind keys its config cache; native Triton
  pointed at XLA's ptxas, unless the environment names one."""
  tokamax, note = bench.import_tokamax()  # parses no argv as absl flags (openxla/tokamax#957)
  if tokamax is None:
    yield None, note
    return
  from jax.extend import backend

  _, dev = aot.target_mesh(target)
  absl_log = logging.getLogger("absl")
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)  # a config cache miss per call, with every group size
  # Native Triton picks its PTX ISA from the ptxas it is pointed at: XLA's (the gpu-compile
  # extra's), so that XLA can assemble it.
  ptxas = provenance.xla_ptxas()
  same_ptxas = {} if ptxas is None or any(k in os.environ for k in TRITON_PTXAS) else dict.fromkeys(TRITON_PTXAS, ptxas)
  try:
    with (
      tokamax.config.cross_compile(True),
      mock.patch.object(backend, "get_default_device", lambda: dev),
      mock.patch.dict(os.environ, same_ptxas),
    ):
      yield tokamax, note
  finally:
    absl_log.setLevel(level)


def triton_ptxas() -> str:
  """The version of the ptxas native Triton writes its PTX for here, for the header."""
  path = next((os.environ[k] for k in TRITON_PTXAS[::-1] if k in os.environ), None) or provenance.xla_ptxas()
  return f"ptxas {provenance.ptxas_version(path) or '?'}"


def tile(config) -> str:
  """block_m x block_k x block_n of a ragtune or tokamax config (both name them so)."""
  dims = [getattr(config, f"block_{d}", None) for d in "mkn"]
  return "x".join(map(str, dims)) if all(dims) else "?"


@contextlib.contextmanager
def tokamax_tiles():
  """Yields a list that fills, while the context lasts, with the tile of each config tokamax
  picks and where it came from: its shipped cache, or its heuristics. tokamax picks an op's
  config by `op.bind(...).default_config` (its Op docstring) as it traces; this records each."""
  from tokamax._src.ops import op as op_lib

  pick = op_lib.BoundArguments.default_config
  picked: list[str] = []

  def record(ba):
    config = pick.fget(ba)
    text = f"{tile(config)} ({_config_source(ba, config)})"
    if text not in picked:
      picked.append(text)
    return config

  with mock.patch.object(op_lib.BoundArguments, "default_config", property(record)):
    yield picked


def _config_source(ba, config) -> str:
  if ba.op.config is not None:
    return "given"
  data = ba.cached_autotuning_data
  if data is None:
    return "heuristic"
  if not data.items():  # tokamax's cache holds some shapes with no timed config
    return "heuristic, cache entry empty"
  return "cache" if data.fastest_config == config else "not its cache's"


def compile_peer(
  target: str, lib: str, op: str, m: int, k: int, n: int, g: int, tokamax: ModuleType | None
) -> tuple[aot.CompileReport, str]:
  """One library's op on the forward problem (m, k, n, g), compiled for `target`, and its tile."""
  kind, impl = LIBS[lib]
  if kind == "ragtune":
    cfg = kernels.registry.default_config(impl, op, DTYPE, m, k, n, g, device_kind=aot.device_kind(target))
    return aot.compile_op(target, impl, op, DTYPE, m, k, n, g, cfg), tile(cfg)
  fn = bench.tokamax_op(tokamax, op, True, implementation=impl)
  with tokamax_tiles() as tiles:
    rep = aot.compile_fn(target, fn, *aot.op_arg_shapes(op, m, k, n, g, DTYPE), kernel=lambda kc: kc.mma != "none")
  return rep, " / ".join(tiles) or "?"


def peer_rows(
  target: str,
  problems: list[str],
  ops: list[str],
  libs: list[str],
  compile_one: Callable[..., tuple[aot.CompileReport, str]] = compile_peer,
  log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> list[PeerRow]:
  """Every (anchor, op, library) compiled for `target`. A library that fails, whatever the
  failure, is a row naming it; the others go on."""
  wants_tokamax = any(LIBS[lib][0] == "tokamax" for lib in libs)
  with cross_compile_tokamax(target) if wants_tokamax else contextlib.nullcontext((None, "")) as (tokamax, note):
    return [
      row
      for name in problems
      for op in ops
      for lib in libs
      for row in _rows(target, name, op, lib, tokamax, note, compile_one, log)
    ]


def _rows(
  target: str,
  name: str,
  op: str,
  lib: str,
  tokamax: ModuleType | None,
  note: str,
  compile_one: Callable[..., tuple[aot.CompileReport, str]],
  log: Callable[[str], None],
) -> list[PeerRow]:
  """One (anchor, op, library): a row per matmul kernel, or one saying why there is none."""
  m, k, n, g, _ = ANCHORS[name]
  kind, impl = LIBS[lib]
  if kind == "tokamax":
    absent = f"tokamax {note}" if tokamax is None else bench.tokamax_missing(impl)
    if absent:
      log(f"{name} {op} {lib}: absent: {absent}")
      return [PeerRow(name, op, lib, aot.UNSUPPORTED, absent, 0.0, None)]
  tile_text = "-"
  try:
    rep, tile_text = compile_one(target, lib, op, m, k, n, g, tokamax)
  except Exception as e:  # noqa: BLE001 - a library's own failure is a row, not the end of the table
    rep = aot.CompileReport(target, "", aot.ERROR, f"{type(e).__name__}: {e}".splitlines()[0][:300], 0.0)
  log(f"{name} {op} {lib}: {rep.outcome} in {rep.seconds:.1f}s")
  error = "" if rep.ok else rep.error
  if rep.ok and not rep.kernels:
    error = "no kernel issues an MMA instruction"
  rows = [PeerRow(name, op, lib, rep.outcome, error, rep.seconds, kr, tile_text) for kr in rep.kernels]
  return rows or [PeerRow(name, op, lib, rep.outcome, error, rep.seconds, None, tile_text)]


def table(rows: list[PeerRow]) -> str:
  """A markdown table, columns padded to their widest cell."""
  cells = [COLUMNS, *(r.cells() for r in rows)]
  widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
  line = lambda cs: "| " + " | ".join(c.ljust(w) for c, w in zip(cs, widths)) + " |"
  return "\n".join([line(COLUMNS), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells[1:])])


def versions(libs: list[str]) -> str:
  """The header's versions: jaxlib, and tokamax (with its Triton pieces and the ptxas native
  Triton writes for) when a tokamax library is in the table."""
  import importlib.metadata as md

  def version(dist: str) -> str:
    try:
      return md.version(dist)
    except md.PackageNotFoundError:
      return "not installed"

  out = f"jaxlib {version('jaxlib')}"
  if any(LIBS[lib][0] == "tokamax" for lib in libs):
    out += f", tokamax {version('tokamax')} (jax-triton {version('jax-triton')}, triton {version('triton')})"
    if "tokamax:triton" in libs and version("jax-triton") != "not installed":
      out += f", native Triton's PTX for {triton_ptxas()}"
  return out


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--target", default="h100", help="h100, h200, or a GpuTargetConfigProto file [default: h100]")
  ap.add_argument("--only", default=",".join(ANCHORS), help=f"anchors, comma-separated: {', '.join(ANCHORS)}")
  ap.add_argument("--op", default="fwd", help=f"ops, comma-separated: {', '.join(OPS)} [default: fwd]")
  ap.add_argument("--lib", default=",".join(LIBS), help=f"libraries, comma-separated: {', '.join(LIBS)}")
  args = ap.parse_args(argv)
  try:
    problems = chosen(args.only, ANCHORS, "anchor")
    ops, libs = chosen(args.op, OPS, "op"), chosen(args.lib, LIBS, "library")
    kind = aot.device_kind(args.target)
  except (ValueError, RagtuneError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  rows = peer_rows(args.target, problems, ops, libs)
  print(f"deviceless compile for {kind}, {DTYPE}, jax {jax.__version__}, {versions(libs)}")
  print(table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
