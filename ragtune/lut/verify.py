"""Re-check every LUT entry on fresh inputs and adversarial group sizes.

Draws per entry: a fresh multinomial routing, a skewed one with empty groups, rows
left over (sum(group_sizes) < m), and all rows in a single group. Each entry's op is
run as the sweep ran it (`measure.build_op` with the entry's config), so a dlhs entry
computes only dlhs and a drhs entry only drhs. The reference is jax.lax.ragged_dot (or
the vjp of it for that one operand) in float32 at HIGHEST precision, computed group by group
(measure.reference). The op is jitted once per entry and reused by all its draws (only the
group sizes change between draws, and they are a traced argument); the reference compiles
once per shape (the draws' group sizes are tables of one length).

With a timeout, draws run in a worker process that is killed when a draw overruns, so
a timed-out computation is stopped, not abandoned; the next draw gets a fresh worker.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kernels
from kernels.lut import locate_lut, shape_text
from ragtune import filekind, provenance
from ragtune.device.numerics import NumericsResult
from ragtune.errors import RagtuneError, no_such
from ragtune.problems.shapes import GroupDist, Problem
from ragtune.run import child


@dataclasses.dataclass
class DrawResult:
  draw: str
  group_sizes: list[int]
  numerics: NumericsResult | None
  error: str = ""
  status: str = ""  # "ok", "wrong", "nan", "timeout", "error" or "skipped"
  time_s: float = 0.0

  @property
  def passed(self) -> bool:
    return self.numerics is not None and self.numerics.passed


@dataclasses.dataclass
class EntryResult:
  entry: kernels.Entry
  draws: list[DrawResult]
  time_s: float = 0.0

  @property
  def passed(self) -> bool:
    return all(d.passed for d in self.draws)

  @property
  def n_passed(self) -> int:
    return sum(d.passed for d in self.draws)

  def worst(self) -> DrawResult:
    failing = [d for d in self.draws if not d.passed]
    if failing:
      return failing[0]
    return max(self.draws, key=lambda d: d.numerics.rel_error)

  def worst_rel_error(self) -> float | None:
    rels = [d.numerics.rel_error for d in self.draws if d.numerics is not None]
    return max(rels) if rels else None


def group_size_draws(m: int, g: int, seed: int) -> dict[str, np.ndarray]:
  one = np.zeros(g, np.int32)
  one[seed % g] = m
  return {
    "multinomial": GroupDist(dist="multinomial", seed=seed).draw(m, g),
    "skewed+empty": GroupDist(dist="zipf", seed=seed, empty_fraction=0.25).draw(m, g),
    "sum<m": GroupDist(dist="multinomial", seed=seed + 1, fill=0.75).draw(m, g),
    "one-group": one,
  }


# --- one draw (runs in the worker process, or here without a timeout) ----------------


_compiled: dict[tuple, Callable] = {}


def fresh_inputs(p: Problem, seed: int) -> dict:
  """Random operands for one draw, drawn on the device as a sweep draws them
  (measure.make_inputs), salted by the seed so they are not the sweep's. Drawn on the host,
  DeepSeek-V3's 3.8e9 weights took longer than a draw's timeout before the kernel ran."""
  from ragtune.device import measure

  return measure.make_inputs(p, salt=f"verify{seed}")


def check_draw(e: kernels.Entry, name: str, sizes, seed: int, interpret: bool) -> DrawResult:
  """Run entry `e` on one group-size draw and compare it with the reference."""
  import jax

  from ragtune.device import measure

  p = Problem(e.op, e.backend, e.dtype, e.m, e.k, e.n, e.g, name, tuple(int(s) for s in sizes))
  t0 = time.perf_counter()
  try:
    key = (e.key, e.config, interpret)
    if key not in _compiled:
      _compiled[key] = jax.jit(measure.build_op(p, e.backend, e.config, interpret))
    x = fresh_inputs(p, seed)
    # done before the reference is dispatched: XLA:CPU can deadlock between an interpreted
    # kernel still in flight and new executions (jax 0.12, fp8 drhs's eager token blocks)
    out = jax.block_until_ready(_compiled[key](*measure.op_args(e.op, x)))
    # A quantized format is judged by its dequantized reference and bound (kernels.quant).
    res = measure.check(p, out, measure.reference(e.op, x, measure.out_dtype(p), p.dtype))
    return DrawResult(
      name, list(p.group_sizes), res, "" if res.passed else res.summary(), res.status, time.perf_counter() - t0
    )
  except Exception as exc:  # noqa: BLE001 - a crash is a failed check, reported
    return DrawResult(
      name, list(p.group_sizes), None, f"{type(exc).__name__}: {exc}"[:300], "error", time.perf_counter() - t0
    )


def serve_draws() -> None:
  """The verify worker process: runs each draw it is sent and sends back its DrawResult."""
  channel = child.Channel()
  # Pay the imports' start-up cost before the first draw's clock starts.
  for module in ("jax", "kernels", "ragtune.device.measure"):
    importlib.import_module(module)
  channel.send(("ready",))
  while True:
    job = channel.recv()
    if job is None or job[0] == "exit":
      return
    channel.send(("result", check_draw(*job[1:])))


STARTUP_S = 120


class DrawRunner:
  """Runs draws in a worker process, killed (and replaced) when a draw overruns `timeout`.

  timeout=None runs draws in this process, with no way to stop one.
  """

  def __init__(self, timeout: float | None):
    self.timeout = timeout
    self._child: child.Child | None = None

  def _start(self) -> None:
    self._child = child.Child(["-c", "from ragtune.lut.verify import serve_draws; serve_draws()"])
    # Importing jax takes seconds; that is not the first draw's time.
    if self._child.recv(STARTUP_S) != ("ready",):
      self.stop()
      raise RagtuneError(f"the verify worker process did not start within {STARTUP_S}s")

  def run(self, e: kernels.Entry, name: str, sizes, seed: int, interpret: bool) -> DrawResult:
    if self.timeout is None:
      return check_draw(e, name, sizes, seed, interpret)
    if self._child is None or not self._child.alive():
      self._start()
    t0 = time.perf_counter()
    self._child.send(("draw", e, name, [int(s) for s in sizes], seed, interpret))
    msg = self._child.recv(self.timeout)
    if msg is not None and msg[0] == "result":
      return msg[1]
    died = None if msg is None else f"error: the verify worker died ({self._child.exit_text()})"
    self.stop()
    if msg is None:
      return DrawResult(
        name,
        [int(s) for s in sizes],
        None,
        f"timeout: did not finish within {self.timeout:g}s",
        "timeout",
        time.perf_counter() - t0,
      )
    return DrawResult(name, [int(s) for s in sizes], None, died, "error", time.perf_counter() - t0)

  def stop(self) -> None:
    if self._child is not None:
      self._child.kill()
    self._child = None

  def close(self) -> None:
    if self._child is not None:
      self._child.close()
    self._child = None

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *_):
    # On an error or Ctrl-C, don't wait for the draw in flight: kill it.
    self.close() if exc_type is None else self.stop()


def verify_entry(
  e: kernels.Entry, *, seed: int = 1234, interpret: bool = False, runner: DrawRunner | None = None
) -> EntryResult:
  runner = runner or DrawRunner(None)
  t0, draws = time.perf_counter(), []
  for name, sizes in group_size_draws(e.m, e.g, seed).items():
    if any(d.status == "timeout" for d in draws):
      # The same compile would overrun again; don't spend another timeout on it.
      draws.append(DrawResult(name, [int(s) for s in sizes], None, "skipped: an earlier draw timed out", "skipped"))
      continue
    draws.append(runner.run(e, name, sizes, seed, interpret))
  return EntryResult(e, draws, time.perf_counter() - t0)


def entry_line(i: int, total: int, res: EntryResult) -> str:
  """One line per entry: pass/fail, what it is, draws passed, worst relative error, time."""
  e = res.entry
  rel = res.worst_rel_error()
  failed = [d for d in res.draws if not d.passed]
  why = f"  ({', '.join(sorted({d.status for d in failed}))})" if failed else ""
  cfg = " ".join(f"{k}={v}" for k, v in e.config.to_dict().items()) if e.config else "-"
  return (
    f"[{i}/{total}] {'PASS' if res.passed else 'FAIL'} {e.op} {e.backend} {e.dtype} "
    f"{shape_text(e.m, e.k, e.n, e.g)}  {res.n_passed}/{len(res.draws)} draws{why}  "
    f"worst rel {'-' if rel is None else f'{rel:.2e}'}  {res.time_s:.1f}s  config: {cfg}"
  )


def entry_report(res: EntryResult, full: bool) -> list[str]:
  """The numerics report of failing draws (of every draw with `full`)."""
  lines = []
  for d in res.draws:
    if d.passed and not full:
      continue
    sizes = f"{d.group_sizes[:8]}{'...' if len(d.group_sizes) > 8 else ''}"
    if d.numerics is None:
      lines.append(f"  draw '{d.draw}' (group_sizes={sizes}): {d.error}")
    else:
      lines.append(f"  draw '{d.draw}' (group_sizes={sizes}):")
      lines.append(str(d.numerics))
  return lines


def load_lut_for_verify(
  target: Path,
  kind: str,
  *,
  force: bool = False,
  skipped: dict[Path, list[int]] | None = None,
  cut: dict[Path, int] | None = None,
  default: bool = False,
) -> kernels.Lut:
  """A LUT file, or a folder holding LUTs or records (then the LUT those records export),
  for a device of `kind`, with entries. A LUT made for another device kind is refused
  unless `force`. `skipped`, `cut`: as for store.load_results. `default`: target is the device's
  default results folder, no path was given (errors.no_such)."""
  if not (target.is_file() or target.is_dir()):
    raise no_such(target, "LUT file or results folder", default=default)
  filekind.check_input(target, {filekind.Kind.LUT, filekind.Kind.RESULTS}, "a LUT file or a results folder")
  try:
    lut_path = locate_lut(target, kind)
  except kernels.LutError:
    lut_path = None  # a folder with no LUT for this device
  if lut_path is None:
    lut = _lut_from_records(target, kind, skipped, cut)
  else:
    try:
      lut = kernels.Lut.from_file(lut_path)
    except kernels.LutError as e:
      raise RagtuneError(str(e)) from None
  if not kernels.lut.serves(lut.device_kind, kind) and not force:
    raise RagtuneError(
      f"{target}: LUT was tuned on {lut.device_kind!r} but this device is {kind!r} "
      "(use --force to check its numerics here anyway)"
    )
  if not len(lut):
    raise RagtuneError(f"{target}: LUT has no entries")
  return lut


def target_of_lut(path: Path | None) -> str:
  """verify --target auto: the deviceless target of a LUT file's device kind."""
  from ragtune.deviceless import aot

  if path is None or not path.is_file():
    raise RagtuneError("verify --target auto: name a LUT file (its device kind names the target)")
  try:
    kind = kernels.Lut.from_file(path).device_kind
  except kernels.LutError as e:
    raise RagtuneError(str(e)) from None
  name = aot.target_for_kind(kind)
  if name is None:
    raise RagtuneError(
      f"{path}: no deviceless target for {kind!r}; name one with --target ({', '.join(aot.target_names())})"
    )
  return name


@dataclasses.dataclass
class Selected:
  """What `ragtune verify` checks: the entries of a LUT, where it came from, and the device
  they are run on (this host's) or compiled for (compile_for, a deviceless target)."""

  lut: kernels.Lut
  entries: list[kernels.Entry]
  where: Path
  info: dict
  compile_for: str | None


def select(
  target: Path | None,
  compile_for: str | None,
  *,
  force: bool,
  ops: list[str] | None,
  shapes: list[str] | None,
  skipped: dict[Path, list[int]] | None,
  device: Callable[[], dict],
  cut: dict[Path, int] | None = None,
) -> Selected:
  """The LUT (file or results folder; by default this device's results folder, or the
  target's) and its entries of these ops and shapes. A LUT for another chip than a
  --target's is refused unless force."""
  from ragtune.candidates import prune
  from ragtune.problems import shapes as shapes_mod
  from ragtune.run import devices

  if compile_for == "auto":
    compile_for = target_of_lut(target)
  info = prune.target_facts(compile_for) if compile_for else device()
  slug_dir = Path("results") / kernels.device_slug(info["device_kind"])
  given, target = target, target or (slug_dir if compile_for else devices.default_results_dir())
  lut = load_lut_for_verify(
    target, info["device_kind"], force=force or bool(compile_for), skipped=skipped, cut=cut, default=given is None
  )
  if compile_for and not force and not kernels.lut.serves(lut.device_kind, info["device_kind"]):
    raise RagtuneError(
      f"{target}: LUT was tuned on {lut.device_kind!r} but --target {compile_for} compiles for "
      f"{info['device_kind']!r} (use --force to compile it for that device anyway)"
    )
  entries = shapes_mod.select(lut.entries(), ops=ops, shapes=shapes, what="LUT entry")
  return Selected(lut, entries, target, info, compile_for)


def version_warning(lut: kernels.Lut, entries: list[kernels.Entry], where: str) -> str | None:
  """A line naming the jax and jaxlib versions the entries were tuned under when they are not
  this process's; None when they match or the LUT does not say."""
  try:
    tuned = [provenance.of_entry(lut.meta, e) for e in entries]
  except ValueError as e:
    raise RagtuneError(f"{where}: {e}") from None
  here = provenance.host()
  seen = {key: provenance.sorted_versions({getattr(v, key) for v in tuned} - {None}) for key in ("jax", "jaxlib")}
  if all(versions in ([], [getattr(here, key)]) for key, versions in seen.items()):
    return None
  then = ", ".join(f"{key} {' and '.join(versions)}" for key, versions in seen.items() if versions)
  return (
    f"{where}: tuned under {then}, verified under jax {here.jax}, jaxlib {here.jaxlib}; its timings may not hold here"
  )


def _lut_from_records(
  folder: Path, kind: str, skipped: dict[Path, list[int]] | None, cut: dict[Path, int] | None = None
) -> kernels.Lut:
  from ragtune.lut import export
  from ragtune.records import store

  if not any((d / filekind.RECORDS).exists() for d in filekind.with_shards([folder])):
    raise RagtuneError(f"{folder}: neither a LUT ({kernels.device_slug(kind)}.json) nor {filekind.RECORDS} here")
  luts = export.build_luts(store.load_results([folder], skipped, cut))
  if kind not in luts:
    raise RagtuneError(f"{folder}: no correct results for this device ({kind!r}); found {sorted(luts)}")
  return luts[kind]
