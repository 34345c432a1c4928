"""From a command's options to what a sweep or a plan runs: the problems of a shapes file
(selected, sharded, and those too big for the device or that the interpreter cannot run
left out), this host's device, the results folder and the SweepOptions, and the plan.

What a command says on the way goes through `say`, one plain line each ("notice: ...",
"warning: ..."), so all of it runs and is tested without the command line.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from pathlib import Path

import kernels
from ragtune import filekind, paths
from ragtune.errors import RagtuneError
from ragtune.problems import limits
from ragtune.problems import shapes as shapes_mod
from ragtune.records import store
from ragtune.run import devices as devices_mod
from ragtune.run import environment, lock, resume
from ragtune.run import plan as plan_mod
from ragtune.run import shard as shard_mod
from ragtune.run.estimate import CostModel
from ragtune.run.options import DEFAULT_BUILDER, DEFAULT_TIMEOUT_S, SweepOptions
from ragtune.words import count

Say = Callable[[str], None]
INTERPRETER_TIMINGS = "Timings are of the interpreter, NOT GPU/TPU timings; use them to test the pipeline only."


@dataclasses.dataclass(frozen=True)
class Selection:
  """Which problems of a shapes file: None or () where the file's own (all) are meant."""

  ops: tuple[str, ...] = ()
  backends: tuple[str, ...] = ()
  shapes: tuple[str, ...] = ()  # forward M,K,N
  models: tuple[str, ...] = ()
  shard: str | None = None  # i/N, auto or auto/N

  @classmethod
  def of(cls, flags: resume.SweepFlags) -> Selection:
    return cls(flags.ops, flags.backends, flags.shapes, flags.models, flags.shard)


def check_search(max_candidates: int | None, budget: int | None) -> None:
  """--max-candidates and --budget are two searches, not limits of one: refuse both at once."""
  if max_candidates and budget:
    raise RagtuneError(
      f"--max-candidates {max_candidates} and --budget {budget}: give one (--max-candidates N times the "
      "first N candidates of each problem; --budget N a staged search that times at most N)"
    )


def load_problems(shapes_file: Path, sel: Selection, say: Say | None = None):
  """(spec, problems) of a shapes file as selected; with a shard, only that shard's (said when auto found it)."""
  spec = shapes_mod.load_shape_set(shapes_file)
  skipped: list = []
  problems = shapes_mod.expand(spec, ops=list(sel.ops) or None, backends=list(sel.backends) or None, skipped=skipped)
  reasons = collections.Counter(why for *_, why in skipped)
  if not problems and reasons:
    raise RagtuneError(f"{shapes_file}: nothing to tune: " + "; ".join(reasons))
  for why, n in reasons.items():
    if say is not None:
      say(f"notice: {why}: {n} (op, backend, shape) left out")
  problems = shapes_mod.select(problems, shapes=list(sel.shapes) or None, models=list(sel.models) or None)
  sh = shard_mod.parse(sel.shard)
  if sh is not None:
    total, problems = len(problems), plan_mod.shard(problems, sh.index, sh.count)
    if not problems and total:
      raise sh.empty(total)
    if sh.source and say is not None:
      say(f"notice: {sh.text()}: {count(len(problems), 'problem')}")
  return spec, problems


def device() -> dict:
  """This host's device (asked of a child process); the parent keeps off the accelerator, so
  the workers get all of its memory."""
  limits.memory_override()  # a bad RAGTUNE_DEVICE_MEMORY, refused before the probe (which is cached per process)
  info = devices_mod.probe_devices()
  devices_mod.keep_parent_off_device(info["platform"])
  return info


def results_dir(out: Path | None = None) -> Path:
  """-o, or results/<device-slug>/."""
  return out or devices_mod.default_results_dir()


def results_dirs(dirs: list[Path] | None) -> list[Path]:
  """The results folders a reading command was given, or this device's default; each must
  exist (an error that says how to make one, otherwise)."""
  return paths.existing_dirs(dirs or [results_dir()], default=not dirs)


def sweep_folder(base: Path, shapes_file: Path, shard: str | None) -> tuple[Path, shard_mod.Shard | None]:
  """Where a sweep of this shard of the file writes, and the shard: the results folder itself
  without one; with one, its shard folder there, unless the results folder holds this file's
  sweep of that very shard, as sweeps wrote them before shard folders, which goes on there."""
  sh = shard_mod.parse(shard)
  if sh is None:
    return base, None
  before = resume.stored_sweeps(base, shapes_file) if (base / resume.SWEEPS).is_file() else []
  return (base if any(s.flags.shard == shard for s in before) else sh.folder(base)), sh


def shard_folders_notice(base: Path, say: Say) -> None:
  """An unsharded sweep or plan of a folder that holds shard folders: they are not its rows."""
  shards = sorted(p.name for p in base.glob(filekind.SHARD_FOLDERS)) if base.is_dir() else []
  if shards:
    say(
      f"notice: {base} holds {count(len(shards), 'shard folder')} ({shards[0]}, ...); without --shard this neither "
      f"reads nor resumes them (export-lut {base} merges them)"
    )


def _stored_sweeps(folder: Path) -> list[resume.StoredSweep]:
  try:
    return resume.load(folder)
  except RagtuneError:  # unreadable: it tells nothing of the set
    return []


def _set_size(stored: resume.StoredSweep) -> int | None:
  """How many problems a stored sweep's options select in its shapes file, before sharding;
  None when the file is gone or has changed since."""
  path = Path(stored.shapes_file)
  try:
    if not path.is_file() or resume.file_sha256(path) != stored.shapes_sha256:
      return None
    return len(load_problems(path, Selection.of(dataclasses.replace(stored.flags, shard=None)))[1])
  except RagtuneError:
    return None


def missing_shards(dirs: list[Path]) -> list[shard_mod.Gap]:
  """Per results folder and shard count N, the shards i of N with no records there. A shard
  with no problem (a set of fewer problems than shards: shard i is empty when i is past the
  set's size) writes no folder and is not missing; the shard folders' stored sweeps give that
  size, while their shapes file is there unchanged."""
  gaps = []
  for base in map(Path, dirs):
    for n, found in sorted(shard_mod.folders(base).items()):
      swept = {i for i, folder in found.items() if (folder / store.RECORDS).is_file()}
      stored = [s for folder in found.values() for s in _stored_sweeps(folder)]
      # The shards' sweeps are one sweep's, bar the shard: its set's size read once, not a shard each.
      sets = {(s.shapes_file, s.shapes_sha256, repr(dataclasses.replace(s.flags, shard=None))): s for s in stored}
      sizes = [_set_size(s) for s in sets.values()]
      size = max(sizes) if sizes and None not in sizes else n
      missing = tuple(i for i in range(min(n, size)) if i not in swept)
      if missing:
        flags = dataclasses.replace(stored[-1].flags, shard=f"{missing[0]}/{n}") if stored else None
        command = resume.command(Path(stored[-1].shapes_file), base, flags) if stored else ""
        gaps.append(shard_mod.Gap(base, n, missing, command))
  return gaps


def fitting(problems: list, memory: int | None, where: Path, say: Say) -> list:
  """The problems that fit the device's memory; a warning for each that does not (an error if none does)."""
  fit, reasons = limits.split_by_memory(problems, memory, str(where))
  if not fit and reasons:
    raise RagtuneError(reasons[0] + (f" (and {count(len(reasons) - 1, 'more problem')})" if len(reasons) > 1 else ""))
  shown = 5
  for reason in reasons[:shown]:
    say(f"warning: skipped: {reason}")
  if len(reasons) > shown:
    say(
      f"warning: skipped {count(len(reasons) - shown, 'more problem')} too big for this device "
      f"({len(reasons)} in all; {len(fit)} remain)"
    )
  return fit


def on_device(problems: list, platform: str, device_kind: str, say: Say) -> list:
  """The problems whose backend compiles for this device (a shapes file may list the kernels
  of several GPU generations): a notice for each backend left out, and an error if none is
  left. Off its hardware (interpreted on a CPU) every backend stays."""
  keep, left_out = [], {}
  for p in problems:
    if why := kernels.registry.get(p.backend).refusal(platform, device_kind, p.dtype):
      left_out.setdefault((p.backend, why), [why, 0])[1] += 1
    else:
      keep.append(p)
  notices = [f"{why}: its {count(n, 'problem')} left out" for why, n in left_out.values()]
  if not keep and notices:
    raise RagtuneError(f"nothing to run on {device_kind}: " + "; ".join(notices))
  for notice in notices:
    say(f"notice: {notice}")
  return keep


def interpreting(interpret: bool | None, platform: str) -> bool:
  """--interpret/--no-interpret, by default on where there is no accelerator."""
  return platform == "cpu" if interpret is None else interpret


def resolve_interpret(interpret: bool | None, platform: str, say: Say) -> bool:
  """interpreting(), with a notice when the kernels will run in the CPU's interpreter."""
  interpret = interpreting(interpret, platform)
  if interpret and platform == "cpu":
    say(f"notice: no accelerator: Pallas kernels run in interpret mode on the CPU. {INTERPRETER_TIMINGS}")
  return interpret


def interpretable(problems: list, interpret: bool, say: Say) -> list:
  """The problems the kernels' interpreter can run, when interpreting: a notice for each
  (backend, op) it cannot, whose problems are left out (an error if none is left)."""
  if not interpret:
    return problems
  keep, notices = plan_mod.interpret_skips(problems)
  if not keep:
    raise RagtuneError("nothing to run in interpret mode: " + " ".join(notices))
  for notice in notices:
    say(f"notice: {notice}")
  return keep


def warn_unread_lines(out_dir: Path, skip_bad_lines: bool, say: Say) -> None:
  """Say, before any work, which lines of the results file are not read: its bad lines with
  --skip-bad-lines (without, the first is the error), and a last line cut off mid-write."""
  path, skipped, cut = Path(out_dir) / store.RECORDS, [] if skip_bad_lines else None, []
  if path.is_file():
    store.read_records(path, skipped=skipped, cut=cut)
    if skipped:
      say(f"warning: {store.skipped_text(path, skipped)}")
    if cut:
      say(f"warning: {store.cut_text(path, cut[0])}")


def sweep_dir(out_dir: Path, builder: str) -> Path:
  """The results folder, writable; the builder is imported here once rather than in every worker."""
  from ragtune.run import worker

  try:
    worker.load_builder(builder)
  except ValueError as e:
    raise RagtuneError(str(e)) from None
  out_dir = paths.writable_dir(out_dir, "the results folder")
  if (out_dir / store.RECORDS).is_dir():
    raise RagtuneError(f"{out_dir / store.RECORDS}: is a folder, but the results file must be a file")
  return out_dir


def worker_devices(devices: str | None, info: dict) -> tuple[int, ...]:
  """--devices: the local devices the workers run on, one each."""
  # One process owns a TPU host's chips, and the CPU is one device: one worker there.
  return devices_mod.parse_devices(devices or ("all" if info["platform"] == "gpu" else "1"), info["count"])


def check_timeout(rows: list, timeout_s: float, strict: bool, say: Say) -> None:
  """Warn of candidates likely to overrun --timeout; with strict, refuse to start."""
  warnings = plan_mod.timeout_warnings(rows, timeout_s)
  if strict and warnings:
    raise RagtuneError(f"--strict: {warnings[-1]} The slowest: {warnings[0]}")
  for warning in warnings:
    say(f"warning: {warning}")


@dataclasses.dataclass
class SweepPlan:
  """A sweep ready to run: its options (as given, or resumed), problems, SweepOptions and plan."""

  shapes_file: Path
  out: Path  # -o as given, or the default results folder; a shard's folder is in it
  flags: resume.SweepFlags
  problems: list
  opts: SweepOptions
  cost: CostModel
  rows: list[plan_mod.PlanRow]
  shard: shard_mod.Shard | None = None

  @property
  def todo(self) -> int:
    return sum(r.todo for r in self.rows)

  def replan(self) -> list[plan_mod.PlanRow]:
    """The plan again, from the rows in the folder now (another sweep's, once it let go)."""
    self.rows = plan_mod.plan(self.problems, self.opts, self.cost)
    return self.rows

  def command(self, flags: resume.SweepFlags | None = None) -> str:
    """The command that runs this sweep again, exactly (or with other flags); a shard found
    by auto is named as i/N, which runs anywhere."""
    flags = self.flags if flags is None else flags
    if self.shard is not None and self.shard.source:
      flags = dataclasses.replace(flags, shard=f"{self.shard.index}/{self.shard.count}")
    return resume.command(self.shapes_file, self.out, flags) + (" --retry-failed" if self.opts.retry_failed else "")

  def mark_complete(self) -> None:
    """Store these options as finished where they are stored unfinished (a sweep stopped
    after its last row); options that started no work are not stored."""
    st = resume.stored_sweep(self.opts.out_dir, self.shapes_file, self.flags)
    if st is not None and (not st.finished or st.shapes_sha256 != resume.file_sha256(self.shapes_file)):
      self.save(finished=True)

  def summaries(self) -> list:
    """Per problem, its summary among the rows stored so far."""
    from ragtune.run import sweep

    rows = store.ResultsStore(self.opts.out_dir, self.opts.skip_bad_lines).rows()
    return sweep.summarize(self.problems, rows, self.opts.device_kind)

  def save(self, finished: bool) -> None:
    resume.save(self.opts.out_dir, self.shapes_file, self.flags, finished=finished)

  def complete_text(self) -> str:
    """What a sweep with nothing left to measure says, and how to measure more."""
    n = len(self.problems)
    return (
      f"complete: every row of the sweep of {self.shapes_file} with {self.flags.text()} is in "
      f"{self.opts.out_dir / store.RECORDS} ({count(n, 'problem')}); nothing to do. To measure "
      "more, give the options that widen it (--op, --backend, --shape, --model, --max-candidates, --budget), "
      f"or run the file's own plan: {self.command(resume.SweepFlags(shard=self.flags.shard, defaults=True))}"
    )


def environment_rows_notice(run: SweepPlan, say: Say) -> None:
  """Rows recorded (by older versions) as failed for the environment, not the candidate: how
  to measure them again."""
  if run.opts.retry_failed:
    return
  rows = plan_mod.done_rows(store.ResultsStore(run.opts.out_dir, run.opts.skip_bad_lines).rows()).values()
  failures = [f for r in rows if r.status != "ok" and (f := environment.classify(r.error)) is not None]
  if failures:
    n = len(failures)
    say(
      f"notice: {count(n, 'row')} of {run.opts.out_dir / store.RECORDS} failed for the environment, "
      f"not the candidate ({failures[0].cause}); once fixed, measure them again with: {run.command()} --retry-failed"
    )


def sweep(
  shapes_file: Path,
  out: Path | None,
  given: resume.SweepFlags,
  *,
  wait: bool,
  skip_bad_lines: bool,
  start: bool,
  say: Say,
  retry_failed: bool = False,
) -> SweepPlan:
  """The sweep a `ragtune sweep` command runs: bad input is refused before anything else;
  a bare command resumes the options stored for the file in the results folder
  (ragtune.run.resume); start=False (--dry-run) places no workers."""
  check_search(given.max_candidates, given.budget)
  spec, problems = load_problems(shapes_file, Selection.of(given), say)
  info = device()
  workers = worker_devices(given.devices, info)  # checked before anything is decided about the folder
  base = results_dir(out)
  flags, origin = resume.resolve(shapes_file, sweep_folder(base, shapes_file, given.shard)[0], given)
  if flags != given:
    spec, problems = load_problems(shapes_file, Selection.of(flags), say)
  if origin:
    say(origin)
  limits.check_fits(problems, where=str(shapes_file))  # indexing now; memory once the device is known
  folder, shard = sweep_folder(base, shapes_file, flags.shard)
  if shard is None:
    shard_folders_notice(base, say)
  out_dir = sweep_dir(folder, flags.builder or DEFAULT_BUILDER)
  if start and not wait:  # refused before the plan is printed, not after (the sweep takes the lock)
    lock.check(out_dir)
  warn_unread_lines(out_dir, skip_bad_lines, say)
  if not interpreting(flags.interpret, info["platform"]):  # interpreted, any backend's kernels run
    problems = on_device(problems, info["platform"], info["device_kind"], say)
  problems = fitting(problems, info.get("memory_bytes"), shapes_file, say)
  opts = SweepOptions(
    out_dir=out_dir,
    max_candidates=flags.max_candidates or spec.max_candidates,
    timeout_s=flags.timeout_s or DEFAULT_TIMEOUT_S,
    builder=flags.builder or DEFAULT_BUILDER,
    budget=flags.budget,
    wait_for_lock=wait,
    device_kind=info["device_kind"],
    skip_bad_lines=skip_bad_lines,
    platform=info["platform"],
    interpret=interpreting(flags.interpret, info["platform"]),
    sharded=folder != base,
    retry_failed=retry_failed,
  )
  problems = interpretable(problems, opts.interpret, say)
  opts.lut = kernels.lut.default_lut(info["device_kind"]) if opts.budget else None  # a budgeted search's start
  cost = CostModel.for_sweep(opts.interpret, info["device_kind"], out_dir)
  run = SweepPlan(Path(shapes_file), base, flags, problems, opts, cost, plan_mod.plan(problems, opts, cost), shard)
  if start:
    environment_rows_notice(run, say)
  if start and run.todo:
    environment.check({p.backend for p in problems}, opts.interpret, opts.platform)
    opts.devices = workers
    opts.interpret = resolve_interpret(flags.interpret, opts.platform, say)
  elif start:  # nothing to run; its stored rows' summary still says what timed them
    resolve_interpret(flags.interpret, opts.platform, say)
  return run


def target_problems(facts: dict, shapes_file: Path, sel: Selection, say: Say):
  """(spec, problems, switched) of a shapes file for a deviceless target: its problems, or,
  when it lists no backend that compiles for the target and sel names none, the target's
  own backends' (a notice says so; switched is then True)."""
  from ragtune.candidates import prune

  spec, problems = load_problems(shapes_file, sel, say)
  own = prune.backends_for(facts["platform"])
  if sel.backends or any(p.backend in own for p in problems):
    return spec, on_device(problems, facts["platform"], facts["device_kind"], say), False
  say(f"notice: {shapes_file} lists no backend for {facts['device_kind']}; using {', '.join(own)}")
  spec, problems = load_problems(shapes_file, dataclasses.replace(sel, backends=tuple(own)))
  return spec, on_device(problems, facts["platform"], facts["device_kind"], say), True


def plan(
  shapes_file: Path,
  out: Path | None,
  sel: Selection,
  *,
  target: str | None,
  max_candidates: int | None,
  budget: int | None,
  skip_bad_lines: bool,
  compile_all: Callable[[list, Path, str], None],
  say: Say,
):
  """`ragtune plan`: (rows, cost) of a shapes file on this device, or on a deviceless target
  after compile_all(problems, out_dir, device_kind) has compiled every candidate for it."""
  from ragtune.candidates import prune

  check_search(max_candidates, budget)
  info = prune.target_facts(target) if target else device()
  if target:
    spec, problems, switched = target_problems(info, shapes_file, sel, say)
    if switched:
      problems = fitting(problems, None, shapes_file, say)  # a warning for each the backend cannot index
  else:
    spec, problems = load_problems(shapes_file, sel, say)
    problems = on_device(problems, info["platform"], info["device_kind"], say)
  limits.check_fits(problems, where=str(shapes_file))
  problems = fitting(problems, info.get("memory_bytes"), shapes_file, say)
  base = out or Path("results") / kernels.device_slug(info["device_kind"])
  out_dir, shard = sweep_folder(base, shapes_file, sel.shard)
  if shard is None:
    shard_folders_notice(base, say)
  if target:
    compile_all(problems, paths.writable_dir(out_dir, "the results folder"), info["device_kind"])
  interpret = interpreting(None, info["platform"])
  problems = interpretable(problems, interpret, say)
  opts = SweepOptions(
    out_dir=out_dir,
    max_candidates=max_candidates or spec.max_candidates,
    budget=budget,
    device_kind=info["device_kind"],
    skip_bad_lines=skip_bad_lines,
    platform=info["platform"],
    interpret=interpret,
    sharded=out_dir != base,
  )
  opts.lut = kernels.lut.default_lut(info["device_kind"]) if budget else None  # as the sweep's
  warn_unread_lines(out_dir, skip_bad_lines, say)
  cost = CostModel.for_sweep(interpret, info["device_kind"], out_dir)
  return plan_mod.plan(problems, opts, cost), cost
