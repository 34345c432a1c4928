"""The peer compile table: tokamax's ragged_dot, jax's Blackwell ragged_dot and ragtune's
defaults, compiled for a GPU on this CPU host, and what their machine code is made of.

  python benchmarks/peer_compile.py                          # H100, every anchor, fwd
  python benchmarks/peer_compile.py --target h200 --op fwd,dlhs,drhs
  python benchmarks/peer_compile.py --target b200 --op fwd,dlhs,drhs
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

A Blackwell target (b200: compute capability 10) has its own libraries and columns. Its
libraries: tokamax's "mosaic_gpu" (its sm100 kernel there, chosen by the target device's
compute capability), jax's own jax.experimental.pallas.ops.gpu.blackwell_ragged_dot_mgpu
(forward only, at the 128x128 tile with k 64 its test runs, one CTA and a collective CTA
pair), and ragtune's mosaic_blackwell defaults, alone and as a CTA pair (cta_pair, a 256-wide
cell). jax's kernel sizes its persistent grid by jax.local_devices()[0].core_count, which is
this host's CPU: while it traces, jax.local_devices is patched to return the target's
compile-only device, whose core_count is the GPU's SM count (148 for the B200). Its columns:
registers, spills, tile, 2-CTA (the machine code's UTCHMMA.2CTA: cta_group::2), TMEM columns
(32-bit columns of tensor memory a CTA allocates, from each config by each kernel's own
allocation: ragtune's and jax's double-buffered [128, N] accumulator is 2 x N with N the
cell's columns, tokamax's computes the transposed product and takes 2 x its cell's rows;
"?" where a kernel allocates TMEM from a config this script cannot read), copy path and MMA
kind (tcgen05, tcgen05.2cta, wgmma, mma.sync). The tile is each library's own knobs, m x k x n;
a CTA pair's row adds its cell, the output one pair computes.
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
from ragtune.cli.views import setmaxnreg_cell  # noqa: E402
from ragtune.deviceless import aot  # noqa: E402
from ragtune.errors import RagtuneError  # noqa: E402
from ragtune.lut import bench  # noqa: E402

OPS = kernels.common.OPS
# Library name -> how it is built: (tokamax | ragtune | jax, tokamax's `implementation`, a
# ragtune backend or jax's kernel, whether it runs as a CTA pair where the library chooses).
LIBS = {
  "tokamax:triton": ("tokamax", "triton", False),
  "tokamax:mosaic_gpu": ("tokamax", "mosaic_gpu", False),
  "ragtune:pallas_gpu": ("ragtune", "pallas_gpu", False),
  "ragtune:mosaic_gpu": ("ragtune", "mosaic_gpu", False),
  "ragtune:mosaic_blackwell": ("ragtune", "mosaic_blackwell", False),
  "ragtune:mosaic_blackwell/pair": ("ragtune", "mosaic_blackwell", True),
  "jax:blackwell_ragged_dot": ("jax", "blackwell_ragged_dot", False),
  "jax:blackwell_ragged_dot/collective": ("jax", "blackwell_ragged_dot", True),
}
# A table's libraries unless --lib names them: those built for the target's GPU generation.
HOPPER_LIBS = ("tokamax:triton", "tokamax:mosaic_gpu", "ragtune:pallas_gpu", "ragtune:mosaic_gpu")
BLACKWELL_LIBS = (
  "tokamax:mosaic_gpu",
  "jax:blackwell_ragged_dot",
  "jax:blackwell_ragged_dot/collective",
  "ragtune:mosaic_blackwell",
  "ragtune:mosaic_blackwell/pair",
)
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
BLACKWELL_COLUMNS = (
  "problem",
  "op",
  "library",
  "kernel",
  "tile mxkxn",
  "outcome",
  "regs",
  "spill B",
  "2-CTA",
  "TMEM cols",
  "copy",
  "mma",
  "loop spills",
  "compile s",
)
# jax's Blackwell kernel as its own test runs it (RaggedDotSm100aTestCase: tile 128x128, k 64;
# 4 stages take 128 KiB of shared memory); the band and its order are one of the test's.
JAX_BLACKWELL_TUNING = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, grid_tile_width=8)
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
  tmem: str = "?"  # 32-bit TMEM columns a CTA allocates, by its config; "?" where unread

  def cells(self, columns: tuple[str, ...] = COLUMNS) -> tuple[str, ...]:
    """This row's cells under `columns` (COLUMNS or BLACKWELL_COLUMNS); "-" where a fact
    does not apply."""
    k = self.kernel
    yes = lambda b: "yes" if b else "no"
    error = self.error.removeprefix(f"{k.name}: ") if k else self.error  # its own name is the kernel column
    outcome = self.outcome if not error else f"{self.outcome}: {error[:140]}"
    cell = {"problem": self.problem, "op": self.op, "library": self.library, "kernel": k.name if k else "-"}
    cell |= {"tile mxkxn": self.tile, "outcome": outcome, "compile s": f"{self.seconds:.1f}"}
    if k is not None:
      cell |= {"regs": str(k.registers), "spill B": str(k.spill_bytes), "wgmma N": str(k.hgmma_n or "-")}
      cell |= {"setmaxnreg": setmaxnreg_cell(dataclasses.asdict(k)), "copy": k.copy, "C7511": yes(k.serialized_wgmma)}
      cell |= {"loop spills": str(k.loop_spills), "2-CTA": yes(k.cta_pair), "mma": k.mma}
      cell["TMEM cols"] = self.tmem if k.tmem_alloc else "-"  # the config's figure, for a kernel that allocates
    return tuple(cell.get(c, "-") for c in columns)


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


def pair_cell(rows: int, cols: int) -> str:
  """The tile column's note for a CTA pair: the output cell the pair computes."""
  return f", cell {rows}x{cols}"


def is_blackwell(target: str) -> bool:
  """Whether the target is a Blackwell datacenter GPU (compute capability 10.x: tcgen05 and
  TMEM; sm_120 has neither)."""
  return int(float(aot.target_mesh(target)[1].compute_capability)) == 10


@contextlib.contextmanager
def tokamax_tiles():
  """Yields a list that fills, while the context lasts, with (tile text, config) of each
  config tokamax picks, the text saying where it came from: its shipped cache, or its
  heuristics. tokamax picks an op's config by `op.bind(...).default_config` (its Op
  docstring) as it traces; this records each."""
  from tokamax._src.ops import op as op_lib

  pick = op_lib.BoundArguments.default_config
  picked: list[tuple[str, object]] = []

  def record(ba):
    config = pick.fget(ba)
    pair = getattr(config, "collective", False)  # its Blackwell kernel's CTA pair: both blocks twice
    note = pair_cell(2 * config.block_m, 2 * config.block_n) if pair else ""
    text = f"{tile(config)}{note} ({_config_source(ba, config)})"
    if text not in (t for t, _ in picked):
      picked.append((text, config))
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


def cta_pair(cfg, op: str):
  """ragtune's mosaic_blackwell config as a CTA pair (cta_group::2): the cell's tall side is
  the pair's 256 (fwd/dlhs: 2 x 128 rows of m; drhs: block_k 256 of k, the TMEM lanes of two
  CTAs), 256 columns wide, the rest the default's."""
  wide = {"block_k": 256} if op == "drhs" else {"block_n": 256}
  return dataclasses.replace(cfg, cta_pair=True, **wide)


def compile_peer(
  target: str, lib: str, op: str, m: int, k: int, n: int, g: int, tokamax: ModuleType | None
) -> tuple[aot.CompileReport, str, str]:
  """One library's op on the forward problem (m, k, n, g), compiled for `target`, its tile,
  and the TMEM columns a CTA of it allocates ("?" unknown)."""
  kind, impl, pair = LIBS[lib]
  if kind == "jax":
    return compile_jax_blackwell(target, op, m, k, n, g, pair)
  if kind == "ragtune":
    kind_name = aot.device_kind(target)
    cfg = kernels.registry.default_config(impl, op, DTYPE, m, k, n, g, device_kind=kind_name)
    cfg = cta_pair(cfg, op) if pair else cfg
    tmem = str(2 * cfg.block_n) if impl == "mosaic_blackwell" else "?"  # two [128, block_n] f32 accumulators
    if pair and not cfg.fits(op, DTYPE, m, k, n, kind_name):
      why = cfg.valid_for(op) or f"{cfg.smem_bytes(op, DTYPE, m, k, n)} B of shared memory exceed {kind_name}'s"
      return aot.CompileReport(target, kind_name, aot.UNSUPPORTED, f"{cfg}: {why}", 0.0), tile(cfg), tmem
    note = pair_cell(*cfg.cell(op)) if getattr(cfg, "cta_pair", False) else ""
    return aot.compile_op(target, impl, op, DTYPE, m, k, n, g, cfg), tile(cfg) + note, tmem
  fn = bench.tokamax_op(tokamax, op, True, implementation=impl)
  with tokamax_tiles() as picked:
    rep = aot.compile_fn(target, fn, *aot.op_arg_shapes(op, m, k, n, g, DTYPE), kernel=lambda kc: kc.mma != "none")
  # tokamax's sm100 kernel allocates TMEM [block_n, 2 x cell rows]: it computes out^T, so its
  # lanes are the columns and its double buffer the cell's rows (a pair's 2 x block_m).
  cols = [2 * c.block_m * (2 if c.collective else 1) for _, c in picked if hasattr(c, "collective")]
  tmem = " / ".join(map(str, dict.fromkeys(cols))) if impl == "mosaic_gpu" and cols else "?"
  return rep, " / ".join(t for t, _ in picked) or "?", tmem


def jax_blackwell_misfit(m: int, k: int, n: int, config) -> str | None:
  """Why jax's Blackwell kernel cannot take the problem, or None: it tiles m, n and k
  exactly (a CTA pair's cell is twice the tile both ways) and pads nothing."""
  ctas = 2 if config.collective else 1
  for dim, size, block in (("m", m, config.tile_m * ctas), ("k", k, config.tile_k), ("n", n, config.tile_n * ctas)):
    if size % block:
      return f"jax's kernel needs {dim} a multiple of its {block}-wide tile, got {dim}={size}"
  return None


def compile_jax_blackwell(
  target: str, op: str, m: int, k: int, n: int, g: int, collective: bool
) -> tuple[aot.CompileReport, str, str]:
  """jax's own Blackwell ragged_dot (jax.experimental.pallas.ops.gpu.blackwell_ragged_dot_mgpu,
  the forward only) at JAX_BLACKWELL_TUNING, one CTA or a collective pair, for `target`."""
  _, dev = aot.target_mesh(target)
  unsupported = lambda why: aot.CompileReport(target, dev.device_kind, aot.UNSUPPORTED, why, 0.0)
  try:
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu, blackwell_ragged_dot_mgpu
  except ImportError as e:
    return unsupported(f"jax {jax.__version__} has no blackwell_ragged_dot_mgpu here ({e})"), "-", "?"
  config = blackwell_ragged_dot_mgpu.TuningConfig(
    **JAX_BLACKWELL_TUNING, collective=collective, grid_minor_dim=blackwell_matmul_mgpu.MatmulDimension.M
  )
  ctas = 2 if collective else 1
  text = f"{config.tile_m}x{config.tile_k}x{config.tile_n}"
  text += (pair_cell(ctas * config.tile_m, ctas * config.tile_n) if collective else "") + " (its test's)"
  tmem = str(2 * ctas * config.tile_n)  # [tile_m, 2 x cell columns]: double-buffered
  if op != "fwd":
    return unsupported("jax's blackwell_ragged_dot_mgpu has the forward ragged_dot only"), text, tmem
  if why := jax_blackwell_misfit(m, k, n, config):
    return unsupported(why), text, tmem

  def fn(a, b, gs):
    # Its grid is jax.local_devices()[0].core_count CTAs (pairs: half): that is this host's
    # CPU, so it reads the target's compile-only device instead, as long as it traces.
    with mock.patch.object(jax, "local_devices", lambda *_, **__: [dev]):
      return blackwell_ragged_dot_mgpu.ragged_dot_kernel(a, b, gs, config)

  shapes = aot.op_arg_shapes(op, m, k, n, g, DTYPE)
  return aot.compile_fn(target, fn, *shapes, kernel=lambda kc: kc.mma != "none"), text, tmem


def peer_rows(
  target: str,
  problems: list[str],
  ops: list[str],
  libs: list[str],
  compile_one: Callable[..., tuple[aot.CompileReport, str, str]] = compile_peer,
  log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> list[PeerRow]:
  """Every (anchor, op, library) compiled for `target`. A library that fails, whatever the
  failure, is a row naming it; the others go on. compile_one(target, lib, op, m, k, n, g,
  tokamax) gives (report, tile, TMEM columns)."""
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
  compile_one: Callable[..., tuple[aot.CompileReport, str, str]],
  log: Callable[[str], None],
) -> list[PeerRow]:
  """One (anchor, op, library): a row per matmul kernel, or one saying why there is none."""
  m, k, n, g, _ = ANCHORS[name]
  kind, impl, _ = LIBS[lib]
  if kind == "tokamax":
    absent = f"tokamax {note}" if tokamax is None else bench.tokamax_missing(impl)
    if absent:
      log(f"{name} {op} {lib}: absent: {absent}")
      return [PeerRow(name, op, lib, aot.UNSUPPORTED, absent, 0.0, None)]
  tile_text, tmem = "-", "?"
  try:
    rep, tile_text, tmem = compile_one(target, lib, op, m, k, n, g, tokamax)
  except Exception as e:  # noqa: BLE001 - a library's own failure is a row, not the end of the table
    rep = aot.CompileReport(target, "", aot.ERROR, f"{type(e).__name__}: {e}".splitlines()[0][:300], 0.0)
  log(f"{name} {op} {lib}: {rep.outcome} in {rep.seconds:.1f}s")
  error = "" if rep.ok else rep.error
  if rep.ok and not rep.kernels:
    error = "no kernel issues an MMA instruction"
  rows = [PeerRow(name, op, lib, rep.outcome, error, rep.seconds, kr, tile_text, tmem) for kr in rep.kernels]
  return rows or [PeerRow(name, op, lib, rep.outcome, error, rep.seconds, None, tile_text, tmem)]


def table(rows: list[PeerRow], columns: tuple[str, ...] = COLUMNS) -> str:
  """A markdown table, columns padded to their widest cell."""
  cells = [columns, *(r.cells(columns) for r in rows)]
  widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
  line = lambda cs: "| " + " | ".join(c.ljust(w) for c, w in zip(cs, widths)) + " |"
  return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells[1:])])


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
  ap.add_argument("--target", default="h100", help="h100, h200, b200, or a GpuTargetConfigProto file [default: h100]")
  ap.add_argument("--only", default=",".join(ANCHORS), help=f"anchors, comma-separated: {', '.join(ANCHORS)}")
  ap.add_argument("--op", default="fwd", help=f"ops, comma-separated: {', '.join(OPS)} [default: fwd]")
  ap.add_argument(
    "--lib",
    help=f"libraries, comma-separated: {', '.join(LIBS)} [default: {', '.join(HOPPER_LIBS)}; "
    f"for a Blackwell target {', '.join(BLACKWELL_LIBS)}]",
  )
  args = ap.parse_args(argv)
  try:
    problems = chosen(args.only, ANCHORS, "anchor")
    ops = chosen(args.op, OPS, "op")
    libs = chosen(args.lib, LIBS, "library") if args.lib is not None else None
    kind = aot.device_kind(args.target)
    blackwell = is_blackwell(args.target)
  except (ValueError, RagtuneError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  libs = libs or list(BLACKWELL_LIBS if blackwell else HOPPER_LIBS)
  rows = peer_rows(args.target, problems, ops, libs)
  print(f"deviceless compile for {kind}, {DTYPE}, jax {jax.__version__}, {versions(libs)}")
  print(table(rows, BLACKWELL_COLUMNS if blackwell else COLUMNS))
  return 0


if __name__ == "__main__":
  sys.exit(main())
