"""ragtune.tune: from a model's function to the LUT it loads. Capture its grouped matmuls
(ragtune.problems.capture), write them as a shape file in the results folder, sweep it there
(resumable and locked, as `ragtune sweep`), verify the LUT its records give on fresh and
adversarial routings, and export it only if every entry passes."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import kernels
from ragtune.errors import RagtuneError
from ragtune.lut import export
from ragtune.lut import verify as verify_mod
from ragtune.problems import capture as capture_mod
from ragtune.problems import shapes as shapes_mod
from ragtune.records import store
from ragtune.run import prepare, progress, resume, sweep
from ragtune.words import count

VERIFY_TIMEOUT_S = 300.0


def shapes_path(out_dir: Path, name: str) -> Path:
  """Where tune keeps the captured shape file: in the results folder, named for the function."""
  return out_dir / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).strip('_') or 'function'}.shapes.yaml"


def _body(text: str) -> str:
  """A shape file's text without its comment lines (the capture's time and place)."""
  return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def _same_entries(path: Path, entries: list[kernels.Entry]) -> bool:
  """Whether the LUT file at path holds exactly these entries (configs included)."""
  try:
    return path.is_file() and kernels.Lut.from_file(path).entries() == entries
  except kernels.LutError:
    return False


def _with(spec: shapes_mod.ShapeSet, **given) -> shapes_mod.ShapeSet:
  """spec with the given fields replaced, checked as a shape file is."""
  data = spec.model_dump(mode="json", exclude_unset=True) | {k: v for k, v in given.items() if v}
  out = shapes_mod.validate(data, lambda loc: f"{spec.name}: {shapes_mod._format_loc(loc)}")
  out._origin = spec._origin
  return out


def tune(
  fn: Callable,
  *args,
  budget: int | None = 8,
  out: str | Path | None = None,
  backends: Sequence[str] | None = None,
  interpret: bool | None = None,
  timeout_s: float | None = None,
  say: Callable[[str], None] = print,
  **kwargs,
) -> kernels.Lut:
  """Capture fn(*args, **kwargs), sweep its problems into `out` (default results/<device-slug>/)
  with a staged search of `budget` candidates a problem (None: all), verify and export the
  LUT there as <device-slug>.json, and return it (load it with kernels.load_lut(out) in the
  model's process). Progress goes to `say`, a line at a time. Run it again to resume: the
  captured file is rewritten only if the capture changed, and rows already measured are
  kept, and a LUT equal to the one exported (verified then) is not verified again. The LUT
  holds this step's problems alone, whatever else the folder holds. Raises
  RagtuneError when verify fails (nothing is exported then) or nothing was timed."""
  spec = capture_mod.capture(fn, *args, say=say, **kwargs)
  spec = _with(spec, backends=list(backends or ()))
  out_dir = prepare.results_dir(Path(out) if out is not None else None)
  out_dir.mkdir(parents=True, exist_ok=True)
  shapes_file = shapes_path(out_dir, spec.name or "function")
  n = len(spec.shapes)
  if _body(spec.text()) != (_body(shapes_file.read_text()) if shapes_file.is_file() else None):
    spec.write(shapes_file)  # a new capture: its sweep starts; the same one resumes
    say(f"captured {count(n, 'problem')} of {spec.name} -> {shapes_file}")
  else:
    say(f"captured {count(n, 'problem')} of {spec.name}, as {shapes_file} holds them")
  # The options given, none of those stored for the file: budget=None times every candidate.
  flags = resume.SweepFlags(budget=budget, interpret=interpret, timeout_s=timeout_s, defaults=True)
  run = prepare.sweep(shapes_file, out_dir, flags, wait=False, skip_bad_lines=False, start=True, say=say)
  if run.todo:
    say(f"sweep: {count(len(run.problems), 'problem')}, {run.todo} rows to measure -> {run.opts.out_dir}")
    sweep.run_sweep(run.problems, run.opts, progress.PlainProgress(say), None, run.save)
  else:
    run.mark_complete()
  keys = {p.key for p in run.problems}  # this step's: the folder may hold other sweeps' rows
  luts = export.build_luts([r for r in store.load_results([run.opts.out_dir]) if r.problem.key in keys])
  lut = luts.get(run.opts.device_kind)
  if lut is None:
    raise RagtuneError(f"{run.opts.out_dir}: no correct, timed candidate for {run.opts.device_kind}; nothing to export")
  entries = lut.entries()
  target = run.opts.out_dir / f"{kernels.device_slug(run.opts.device_kind)}.json"
  if _same_entries(target, entries):  # a rerun with nothing new: exported once verify passed it
    say(f"{target}: the same {count(len(entries), 'entry')}, verified when exported; nothing to do")
    return kernels.Lut.from_file(target)
  failed = []
  with verify_mod.DrawRunner(VERIFY_TIMEOUT_S) as runner:
    for i, e in enumerate(entries, 1):
      res = verify_mod.verify_entry(e, interpret=run.opts.interpret, runner=runner)
      say(verify_mod.entry_line(i, len(entries), res))
      if not res.passed:
        failed.append(res)
  if failed:
    raise RagtuneError(
      f"verify: {count(len(failed), 'entry')} of the LUT failed ({failed[0].entry.op} {failed[0].entry.backend} "
      f"{kernels.lut.shape_text(failed[0].entry.m, failed[0].entry.k, failed[0].entry.n, failed[0].entry.g)}); "
      "nothing exported: `ragtune verify` prints the reports"
    )
  (path,) = export.write_luts({run.opts.device_kind: lut}, run.opts.out_dir)
  say(f"verified {count(len(entries), 'entry')}; wrote {path}")
  return kernels.Lut.from_file(path)
