"""`ragtune bench SHAPES.yaml`: what the tuning bought, on this device.

For each problem of a shape set it runs the LUT's choice (what `kernels.ragged_dot` picks
with the LUT; on a CPU host, where backend="auto" runs XLA's op and reads no LUT, what the
first GPU backend picks), each GPU backend's default config, XLA's `jax.lax.ragged_dot`,
`tokamax.ragged_dot` with its own shipped config cache (when tokamax is installed; on a GPU
also its Triton implementation where that loads, since its own choice there is Mosaic GPU) and a
dense matmul of the same FLOPs. Each ragged variant is checked against `jax.lax.ragged_dot`
first; one that fails is reported and never timed. The rest are timed together, in one
tune-jax run per problem (device profiler events, after warm-up), beside the matmul and
copy ceilings measured in the same process.

On a CPU host the Pallas kernels are interpreted and shapes too big for that shrink: every
variant is checked and none is timed, since an interpreter's time says nothing about a GPU's.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import pandas as pd

import kernels
from kernels import gpus, registry, target
from kernels.common import scheme
from kernels.lut import shape_text
from kernels.ragged_dot import Choice, default_interpret, resolve
from ragtune import filekind, paths
from ragtune.device import ceilings, measure, xla_fit
from ragtune.device.xla_fit import XLA_PATHS
from ragtune.errors import RagtuneError, install_hint
from ragtune.filekind import BENCH_CSV_COLUMNS
from ragtune.problems import limits
from ragtune.problems.shapes import GroupDist, Problem, trained
from ragtune.records import report
from ragtune.run import estimate

XLA = "xla ragged_dot"
TOKAMAX = "tokamax ragged_dot"
TOKAMAX_TRITON = "tokamax triton"  # its Triton implementation, where it loads: auto picks Mosaic GPU on Hopper
DENSE = "dense matmul, same FLOPs"
BF16 = "bf16 auto, same shape"  # a quantized problem's: our 16-bit kernel on its values, what fp8 buys
PEERS = {
  XLA: "xla",
  TOKAMAX: "tokamax",
  TOKAMAX_TRITON: "tokamax",
  DENSE: "dense",
}  # the ratio column names the fastest
CPU_ROUTING = GroupDist(dist="multinomial", seed=0)
CPU_COST_S = 5.0  # a problem the interpreter runs in this many seconds per candidate is benched as it is
# tokamax's own vjp calls ragged_dot_general with these for dlhs and drhs
# (tokamax/_src/ops/ragged_dot/base.py, `vjp`), with the forward's group sizes (a GroupSizes of
# the total rows) and the forward operand's dtype as preferred_element_type; its shipped config
# cache is keyed by all three, so tokamax_op calls it the same way.
TOKAMAX_DIMS = {
  "fwd": ((([1], [1]), ([], [])), [0], [0]),
  "dlhs": ((([1], [2]), ([], [])), [0], [0]),
  "drhs": ((([0], [0]), ([], [])), [0], []),
}
# The module under tokamax/_src/ops/ragged_dot/ that registers each GPU implementation, when it
# imports: "triton" is Pallas Triton up to 0.0.14 (pallas_triton.py) and native Triton through
# jax_triton from 0.0.15 (triton.py). The keys are tokamax's implementation names (its api.py's
# IMPLEMENTATIONS), a peer library's, not kernels.registry's backends.
TOKAMAX_MODULES = {"triton": ("triton", "pallas_triton"), "mosaic_gpu": ("pallas_mosaic_gpu",)}


@dataclasses.dataclass
class Row:
  """One variant of one problem: a line of the table and of the CSV, whose columns
  (filekind.BENCH_CSV_COLUMNS) are these fields, in order."""

  problem: str  # where the shape file has it, e.g. mixtral-8x7b:up:tokens=4096 or shapes[0]
  shape: str
  op: str
  dtype: str
  variant: str
  config: str = ""
  status: str = "ok"
  rel_error: float | None = None  # max |variant - lax| / max |lax|; none for the dense matmul
  ms: float | None = None
  tflops: float | None = None
  pct_matmul_peak: float | None = None
  gbps: float | None = None
  pct_copy_bw: float | None = None
  vs_xla: float | None = None
  vs_peer: float | None = None  # the fastest peer's time / this time
  peer: str = ""  # which peer that is: xla, tokamax or dense
  timer: str = ""
  same_as: str = ""  # the variant this one runs the same code as (its numbers are that one's)

  @property
  def failed(self) -> bool:
    """A failure of its own (a row the same as another repeats that one's)."""
    return not self.same_as and self.status.split(":")[0] in ("wrong", "nan", "error")


@dataclasses.dataclass(frozen=True)
class Variant:
  label: str
  key: tuple[str, Any]  # (backend, config): variants with one key run the same code
  config: str
  fn: Callable | None
  args: tuple
  checked: bool = True
  same_as: str = ""  # the label of the variant this one is, when it runs the same code


@dataclasses.dataclass(frozen=True)
class Bench:
  """What every problem of one run shares."""

  device_kind: str
  on_device: bool  # False on a CPU host: check, never time
  backends: tuple[str, ...]
  lut: kernels.Lut | None
  tokamax: ModuleType | None
  tokamax_note: str  # its version, or why it is left out
  peaks: dict[str, float]  # matmul TF/s per dtype, measured in this process
  copy_gbps: float | None
  samples: int


def on_device() -> bool:
  return jax.devices()[0].platform != "cpu"


def gpu_backends(device: bool, device_kind: str) -> tuple[str, ...]:
  """The GPU kernel backends that run compiled on this device; on a CPU host the first one,
  interpreted."""
  gpu = [b for b in registry.REGISTRY.values() if b.config_type is not None and "gpu" in b.platforms]
  if not device:
    return (gpu[0].name,)
  platform = target.current().platform
  return tuple(b.name for b in gpu if b.runs_on(platform, device_kind))


@functools.cache  # one read of the calibration cache per process, not one per problem
def _cpu_cost() -> estimate.CostModel:
  """The interpreter's cost model on this host (calibrated once, then cached)."""
  return estimate.CostModel.for_sweep(True, "cpu", None)


def cpu_sized(p: Problem) -> Problem:
  """p as a CPU host benches it: as it is where the Pallas interpreter runs a candidate in
  seconds (so a LUT tuned here applies exactly), else shrunk (m/256, k/32, n/32, at most 8
  groups, multinomial routing). The cost is that of the kernel a CPU host benches (its first
  GPU backend, gpu_backends), not of p's backend: a shape file lists a shape once per backend,
  and each must size alike to be benched once."""
  (interpreted,) = gpu_backends(False, "cpu")
  b = interpreted if p.dtype in registry.get(interpreted).dtypes else p.backend
  q = dataclasses.replace(p, backend=b)
  seconds = _cpu_cost().candidate_s(q, registry.default_config(b, p.op, p.dtype, p.m, p.k, p.n, p.g))
  if seconds is not None and seconds <= CPU_COST_S:
    return p
  m, k, n, g = min(p.m, max(32, p.m // 256)), min(p.k, max(16, p.k // 32)), min(p.n, max(16, p.n // 32)), min(p.g, 8)
  sizes = tuple(int(s) for s in CPU_ROUTING.draw(m, g))
  return dataclasses.replace(p, m=m, k=k, n=n, g=g, group_dist=CPU_ROUTING.label(), group_sizes=sizes)


def bench_problems(problems: list[Problem], device: bool) -> list[Problem]:
  """One problem per op, dtype, shape and routing: a shape file lists one per backend, and
  the bench runs every backend on each. CPU-sized on a CPU host."""
  out: dict[tuple, Problem] = {}
  for p in problems:
    q = p if device else cpu_sized(p)
    out.setdefault((q.op, q.dtype, q.m, q.k, q.n, q.g, q.group_sizes), q)
  return list(out.values())


def find_lut(path: Path | None, device_kind: str, results_dir: Path) -> tuple[kernels.Lut | None, Path | None]:
  """The LUT to bench and its file: `path` (a file, or a folder holding <slug>.json); else the
  one a model here loads (RAGTUNE_LUT, then kernels/luts/<slug>.json, with the errors and
  RAGTUNE_LUT_ON_ERROR rule a model meets); else the results folder's export
  (<results>/<slug>.json, where export-lut writes it); else none."""
  if path is None:
    lut = kernels.lut.default_lut(device_kind)
    if lut is not None:  # without a source: RAGTUNE_LUT_ON_ERROR=warn said why, and a model runs none
      return (lut, Path(lut.source)) if lut.source is not None else (None, None)
    found = results_dir / f"{kernels.device_slug(device_kind)}.json"
    if not found.is_file():
      return None, None
  else:
    filekind.check_input(
      Path(path), {filekind.Kind.LUT, filekind.Kind.RESULTS}, "a ragtune LUT or a folder holding one"
    )
    found = kernels.lut.locate_lut(path, device_kind)
  lut = kernels.Lut.from_file(found)
  if not kernels.lut.serves(lut.device_kind, device_kind):
    raise RagtuneError(f"{found}: LUT was tuned on {lut.device_kind!r} but this device is {device_kind!r}")
  return lut, found


def default_csv(lut_file: Path | None, results_dir: Path, set_name: str) -> Path:
  """bench-<set>.csv beside the LUT; in the results folder when there is no LUT or it is the
  one bundled in the kernels package (whose folder is the package's, not a place for results)."""
  name = f"bench-{set_name}.csv"
  if lut_file is None or lut_file.resolve().parent == kernels.lut.BUNDLED_DIR.resolve():
    return results_dir / name
  return lut_file.parent / name


def import_tokamax() -> tuple[ModuleType | None, str]:
  """(tokamax, its version) or (None, why it is left out)."""
  try:
    import tokamax
  except ImportError as e:
    return None, f"not installed ({e}); {install_hint('bench')} adds it"
  except Exception as e:  # noqa: BLE001 - installed, but broken with this jax: say so, bench the rest
    return None, f"fails to import with jax {jax.__version__}: {measure.error_text(e, 200)}"
  from absl import flags

  # tokamax <= 0.0.12 reads its options by parsing all of sys.argv as absl flags on first
  # use, and stops at ragtune's own options (openxla/tokamax#957): parse none, so they keep
  # their defaults.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])
  return tokamax, importlib.metadata.version("tokamax")


def tokamax_missing(implementation: str) -> str | None:
  """None when tokamax's ragged_dot has `implementation` here; else why not, in one line.
  tokamax registers an implementation only if its module imports (0.0.15+'s "triton" needs the
  jax_triton and triton packages), and an unregistered name fails only when called."""
  try:
    from tokamax._src.ops.ragged_dot import api
  except ImportError:
    return None  # another layout: the call itself says
  if implementation in api.IMPLEMENTATIONS or implementation == "mosaic":  # "mosaic": tokamax picks GPU or TPU
    return None
  version = importlib.metadata.version("tokamax")
  for name in TOKAMAX_MODULES.get(implementation, ()):
    module = f"tokamax._src.ops.ragged_dot.{name}"
    if importlib.util.find_spec(module) is None:
      continue
    try:
      importlib.import_module(module)
    except ImportError as e:
      return f"tokamax {version} has no {implementation!r} ragged_dot here: its {name}.py fails to import ({e})"
  have = ", ".join(sorted(api.IMPLEMENTATIONS))
  return f"tokamax {version} has no {implementation!r} ragged_dot here (it has {have})"


def tokamax_gpu_note() -> str:
  """Which of tokamax's GPU ragged_dot implementations are here, and why one is not (auto
  picks among those registered, so a missing one would go unseen)."""
  why = {impl: tokamax_missing(impl) for impl in TOKAMAX_MODULES}
  have = ", ".join(impl for impl, w in why.items() if w is None) or "none"
  return f"GPU ragged_dot: {have}" + "".join(f"; {w}" for w in why.values() if w)


def tokamax_op(
  tokamax: ModuleType, op: str, device: bool, implementation: str | None = None, quantized: bool = False
) -> Callable:
  """tokamax's ragged_dot for `op`, taking measure.op_args. On a device tokamax picks its
  implementation (Mosaic GPU, Triton, XLA) and config itself, unless `implementation` names
  one; on a CPU host, its XLA one. quantized: a forward of quantized operands with their
  scales, the weights stored [g, n, k] (measure.QUANTIZED_RHS_NK), as qwix QArrays."""
  contract, ragged, group = TOKAMAX_DIMS["dlhs" if quantized else op]  # dlhs's: rhs contracted on its last dim
  dims = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=contract, lhs_ragged_dimensions=ragged, rhs_group_dimensions=group
  )
  impl = implementation if device else "xla"

  def call(a, b, gs, *scales):
    sizes = tokamax.RaggedDotGroupSizes(gs, a.shape[0])  # the ragged dim is lhs's first in all three
    out_dtype = None if op == "fwd" else a.dtype
    if scales:  # quantized operands (fwd): tokamax takes them as qwix QArrays, scales of our layout
      import qwix

      k, n = a.shape[1], b.shape[1]
      if scales[0].shape[1] > 1 and (k % 128 or n % 128):  # a QArray's scale tile is shape // scale.shape
        raise ValueError(f"qwix QArray cannot hold 128-block scales of a partial block (k={k}, n={n})")
      rhs_scale = scales[1].swapaxes(1, 2)  # ours are in the [g, k, n] frame
      a, b, out_dtype = qwix.QArray(a, scales[0]), qwix.QArray(b, rhs_scale), jnp.bfloat16
    return tokamax.ragged_dot_general(a, b, sizes, dims, preferred_element_type=out_dtype, implementation=impl)

  return call


def computes_here(backend: str, fmt: str, bench: Bench) -> bool:
  """Whether `backend` (one of the bench's) computes `fmt` on the bench's device (on a CPU host:
  interpreted, anywhere)."""
  b = registry.get(backend)
  return fmt in b.dtypes and not (bench.on_device and b.refusal(target.current().platform, bench.device_kind, fmt))


def lut_choice(p: Problem, bench: Bench) -> Choice:
  """What kernels.ragged_dot runs for p.op with the bench's LUT: backend="auto" on a device;
  on a CPU host, where auto runs XLA, the first GPU backend's LUT entry (or heuristic)."""
  computes = [b for b in bench.backends if computes_here(b, p.dtype, bench)] or [registry.REFERENCE]
  with kernels.use_lut(bench.lut):
    return resolve(None, "auto" if bench.on_device else computes[0], p.m, p.k, p.n, p.g, p.dtype, ops=(p.op,))[p.op]


def _lut_label(c: Choice, auto: bool) -> str:
  """'LUT: <backend> (exact)': what backend="auto" runs with the LUT. On a CPU host, where
  auto runs XLA's op and reads no LUT, the row is an explicit backend's: 'LUT with
  backend=<backend> (exact)'."""
  head = "LUT: " if auto else f"LUT with backend={c.backend} "
  name = f"{c.backend} " if auto else ""
  if c.source == "lut-exact":
    return f"{head}{name}(exact)"
  if c.source == "lut-nearest":
    return f"{head}{name}(nearest, {shape_text(*c.tuned_shape)})"
  return f"{head}{name}(no entry)"


def _short(cfg: Any) -> str:
  return "" if cfg is None else report.config_text(cfg.to_dict())


def _as_bf16(p: Problem) -> Problem:
  return dataclasses.replace(p, dtype="bfloat16")


def bf16_variant(p: Problem, x: dict[str, jax.Array], bench: Bench) -> Variant:
  """A quantized problem's values as bf16 (exact for e4m3 and int8), weights [g, k, n], with no
  scales, through what backend="auto" runs for bf16 here (on a CPU host the bench's first
  backend, interpreted) with its default config. Unchecked: unscaled, its result is not the
  problem's."""
  dev = target.current()
  name = (
    registry.auto_backend(dev.platform, dev.device_kind, "bfloat16", op=p.op) if bench.on_device else bench.backends[0]
  )
  q = dataclasses.replace(_as_bf16(p), backend=name)
  cfg = registry.default_config(name, q.op, q.dtype, q.m, q.k, q.n, q.g, device_kind=bench.device_kind)
  if trained(p.op, p.dtype) and p.op == "dlhs":  # float dout; the weights as the forward's values, in bf16
    args = (x["dout"], x["rhs"].astype(jnp.bfloat16), x["group_sizes"])
  elif trained(p.op, p.dtype):  # float operands already: the same op unquantized, what fp8 training replaces
    args = measure.op_args(p.op, x)
  else:
    rhs = x["rhs"].swapaxes(1, 2) if measure.QUANTIZED_RHS_NK else x["rhs"]
    args = (x["lhs"].astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), x["group_sizes"])
  fn = measure.build_op(q, name, cfg, default_interpret(name))
  return Variant(BF16, (name, ("bfloat16", cfg)), f"{name}: {_short(cfg)}", fn, args, checked=False)


def variants(p: Problem, x: dict[str, jax.Array], bench: Bench) -> list[Variant]:
  """The LUT's choice first, then each backend's default, XLA, tokamax and dense."""
  args = measure.op_args(p.op, x)
  out = []
  for b in bench.backends:
    if not computes_here(b, p.dtype, bench):
      continue  # a backend without this dtype, or without it on this GPU (fp8 below sm_89)
    cfg = registry.default_config(b, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=bench.device_kind)
    interpret = default_interpret(b)
    label = f"{b} default" + (" [interpret]" if interpret else "")
    out.append(Variant(label, (b, cfg), _short(cfg), measure.build_op(p, b, cfg, interpret), args))
  out.append(Variant(XLA, (registry.REFERENCE, None), "", measure.build_op(p, registry.REFERENCE, None, False), args))
  if bench.tokamax is not None and not trained(p.op, p.dtype):  # tokamax has no fp8 training recipe
    impl = "implementation=" + ("auto" if bench.on_device else "xla")
    tok = tokamax_op(bench.tokamax, p.op, bench.on_device, quantized=bool(scheme(p.dtype)))
    out.append(Variant(TOKAMAX, ("tokamax", None), impl, tok, args))
    if bench.on_device and not scheme(p.dtype) and tokamax_missing("triton") is None:
      tri = tokamax_op(bench.tokamax, p.op, True, implementation="triton")
      out.append(Variant(TOKAMAX_TRITON, ("tokamax", "triton"), "implementation=triton", tri, args))
  dense = measure.dense_args(p, x)
  out.append(Variant(DENSE, ("dense", None), "", measure.dense_matmul, dense, checked=False))
  if scheme(p.dtype):
    out.append(bf16_variant(p, x, bench))
  c = lut_choice(p, bench)
  same = next((v.label for v in out if v.key == (c.backend, c.config)), "")
  fn = None if same else measure.build_op(p, c.backend, c.config, default_interpret(c.backend))
  label = _lut_label(c, bench.on_device)
  return [Variant(label, (c.backend, c.config), _short(c.config), fn, args, same_as=same), *out]


def _fill_times(
  rows: dict[str, Row], times: dict[str, float], timer: str, p: Problem, vs: list[Variant], bench: Bench
) -> None:
  peers = {label: t for label, t in times.items() if label in PEERS}
  best = min(peers, key=peers.get) if peers else None
  args = {v.label: v.args for v in vs}
  for label, t in times.items():
    r = rows[label]
    r.ms, r.timer, r.tflops = t * 1e3, timer, measure.flops(p) / t / 1e12
    own = _as_bf16(p) if label == BF16 else p  # the bf16 row: bf16's bytes and peak
    r.gbps = (measure.dense_bytes(args[label]) if label == DENSE else measure.bytes_moved(own)) / t / 1e9
    peak = bench.peaks.get(own.dtype)
    r.pct_matmul_peak = 100 * r.tflops / peak if peak else None
    r.pct_copy_bw = 100 * r.gbps / bench.copy_gbps if bench.copy_gbps else None
    r.vs_xla = times[XLA] / t if XLA in times else None
    if best is not None:
      r.vs_peer, r.peer = peers[best] / t, PEERS[best]


def bench_problem(p: Problem, bench: Bench) -> list[Row]:
  """Check every variant against jax.lax.ragged_dot, then (on a device) time those that
  passed together, in one timer run. A variant whose program needs more than the device's
  memory (XLA's dense fallback, ragtune.device.xla_fit) is not run: its row says so."""
  x = measure.make_inputs(p)
  ref = measure.reference(p.op, x, measure.out_dtype(p), p.dtype)
  vs = variants(p, x, bench)
  rows = {v.label: Row(p.source, p.shape_label, p.op, p.dtype, v.label, v.config) for v in vs}
  ready = {}
  memory = limits.device_memory_bytes()
  for v in vs:
    if v.same_as:
      continue
    row = rows[v.label]
    if v.label == XLA and (why := xla_fit.refusal(p, memory)):
      row.config, row.status = f"path: {XLA_PATHS['dense']}", f"too_big: {why}"
      continue
    try:
      compiled = measure.compile_fn(v.fn, v.args)
      if v.label == XLA:
        row.config = f"path: {XLA_PATHS[xla_fit.path_of(compiled)]}"
      if why := xla_fit.compiled_refusal(compiled, memory):
        row.status = f"too_big: {why}"
        continue
      out = jax.block_until_ready(compiled(*v.args))
    except Exception as e:  # noqa: BLE001 - a variant that does not run is reported, not fatal
      row.status = "error: " + measure.error_text(e, 160)
      continue
    if v.checked:
      res = measure.check(p, out, ref)
      row.rel_error = res.rel_error
      if not res.passed:
        row.status = f"{res.status}: {res.summary()}"  # never timed: a wrong kernel has no speed
        continue
    ready[v.label] = (v.fn, v.args, compiled)
  if bench.on_device and ready:
    times, timer = measure.time_variants(ready, on_device=True, warmup=2, iters=5, samples=bench.samples)
    _fill_times(rows, times, timer, p, vs, bench)
  for v in vs:
    if v.same_as:
      src = rows[v.same_as]
      rows[v.label] = dataclasses.replace(src, variant=v.label, config=v.config, same_as=v.same_as)
  return list(rows.values())


def run(problems: list[Problem], bench: Bench, on_problem: Callable[[Problem, list[Row]], None]) -> list[Row]:
  """bench_problem for each problem; on_problem(problem, its rows) after each."""
  rows: list[Row] = []
  for p in problems:
    try:
      got = bench_problem(p, bench)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory on one problem: report it, go on
      got = [Row(p.source, p.shape_label, p.op, p.dtype, "(all)", status="error: " + measure.error_text(e, 200))]
    rows += got
    on_problem(p, got)
    jax.clear_caches()
  return rows


def start(lut: kernels.Lut | None, dtypes: list[str], samples: int) -> Bench:
  """The run's device, backends, tokamax and (on a device) the ceilings, measured now."""
  kind = kernels.lut.current_device_kind()
  device = on_device()
  backends = gpu_backends(device, kind)
  if not backends:
    raise RagtuneError(f"no GPU kernel backend runs on {kind!r}; ragtune bench times GPU kernels")
  peaks, copy = {}, None
  if any(scheme(d) for d in dtypes):  # the bf16 row of a quantized problem against bf16's peak
    dtypes = list(dict.fromkeys([*dtypes, "bfloat16"]))
  if device:
    c = ceilings.measure_ceilings(dtypes, jax.devices()[0].platform)
    peaks, copy = c["matmul_tflops"], c["copy_gbps"]
  tokamax, note = import_tokamax()
  return Bench(kind, device, backends, lut, tokamax, note, peaks, copy, samples)


@dataclasses.dataclass
class Plan:
  """What `ragtune bench` runs: its problems (shrunk on a CPU host), the bench, the LUT file and the CSV."""

  problems: list[Problem]
  bench: Bench
  lut_file: Path | None
  csv: Path

  @property
  def device(self) -> bool:
    return self.bench.on_device


def plan(
  problems: list[Problem],
  set_name: str,
  where: str,
  *,
  lut: Path | None,
  csv: Path | None,
  samples: int,
  say,
  force: bool = False,
) -> Plan:
  """The LUT (lut, or the one a model here loads), the problems that fit this device (a
  warning each through `say` for those that do not) and the CSV path, checked writable and
  not a file of another kind than bench's CSV (unless force)."""
  from ragtune.filekind import Kind
  from ragtune.run import prepare

  kind = kernels.lut.current_device_kind()
  results_dir = Path("results") / kernels.device_slug(kind)
  table, lut_file = find_lut(lut, kind, results_dir)
  what = "the --csv file" if csv else "bench's default CSV"
  csv = csv or default_csv(lut_file, results_dir, set_name)
  paths.output_file(csv, what, Kind.BENCH_CSV, force=force)
  problems = bench_problems(problems, on_device())
  limits.check_fits(problems, where=where)
  problems = prepare.fitting(problems, limits.device_memory_bytes(), Path(where), say)
  return Plan(problems, start(table, sorted({p.dtype for p in problems}), samples), lut_file, csv)


def datasheet_line(device_kind: str, dtypes: list[str]) -> str:
  """The datasheet's peaks of a named GPU (kernels.gpus) beside the measured ceilings; "" for a
  GPU with no facts file."""
  g = gpus.by_kind(device_kind)
  if g is None:
    return ""
  # by the peak each runs at (float32 has none of its own here: it is left out)
  tf = [f"{d} {t:.4g} TF/s" for d in dtypes if d != "float32" and (t := gpus.peaks(device_kind, d)[0])]
  bw = gpus.peaks(device_kind)[1]
  return f"datasheet ({g.title}, dense tensor cores): matmul {', '.join(tf) or '-'}; memory {bw:.4g} GB/s"


def header(bench: Bench, lut_file: Path | None) -> list[str]:
  """What ran where: device, versions, the LUT, tokamax, the ceilings or why nothing is timed."""
  d = jax.devices()[0]
  lines = [
    f"device: {d.device_kind} ({d.platform}), jax {jax.__version__}",
    f"LUT: {lut_file if lut_file is not None else 'none found (each op runs its heuristic)'}",
    f"tokamax: {bench.tokamax_note}" + (f" ({tokamax_gpu_note()})" if bench.tokamax is not None else ""),
  ]
  if bench.on_device:
    peaks = ", ".join(f"{dt} {tf:.4g} TF/s" for dt, tf in bench.peaks.items())
    lines.append(f"ceilings, measured now: matmul {peaks}; copy {bench.copy_gbps:.4g} GB/s")
    if sheet := datasheet_line(bench.device_kind, list(bench.peaks)):
      lines.append(sheet)
  else:
    lines.append(
      "CPU host: the Pallas kernels are interpreted, and shapes too big for that are shrunk (m/256, k/32, "
      "n/32, at most 8 groups, multinomial routing). Every variant is checked against jax.lax.ragged_dot; "
      "none is timed, since an interpreter's time says nothing about a GPU's. backend=\"auto\" runs XLA's op "
      "here and reads no LUT: the LUT row is the choice, with the LUT, of the first backend here that "
      "computes the problem's dtype (it names it)."
    )
  return lines


def _g(v: float | None, spec: str) -> str:
  return "" if v is None else format(v, spec)


def table(rows: list[Row], timed: bool) -> list[str]:
  """Plain lines: each variant's check and status, with its speed when timed."""
  width = max(len(r.variant) for r in rows) + 2
  speed = f"{'ms':>9}{'TF/s':>8}{'%mm':>6}{'GB/s':>8}{'%copy':>7}{'vs best peer':>15}" if timed else ""
  lines = [f"{'variant':<{width}}{speed}{'rel err':>9}  status  config"]
  for r in rows:
    cols = ""
    if timed:
      vs = f"{r.vs_peer:.2f}x {r.peer}" if r.vs_peer is not None else ""
      cols = (
        f"{_g(r.ms, '.3f'):>9}{_g(r.tflops, '.1f'):>8}{_g(r.pct_matmul_peak, '.0f'):>6}"
        f"{_g(r.gbps, '.0f'):>8}{_g(r.pct_copy_bw, '.0f'):>7}{vs:>15}"
      )
    status = f"{r.status} (same as {r.same_as})" if r.same_as else r.status
    lines.append(f"{r.variant:<{width}}{cols}{_g(r.rel_error, '.2g'):>9}  {status}  {r.config}")
  return lines


def write_csv(path: Path, rows: list[Row]) -> None:
  """All rows so far, atomically, times and rates to 4 significant digits."""
  df = pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=BENCH_CSV_COLUMNS)
  paths.write_atomic(path, report.csv_text(df))
