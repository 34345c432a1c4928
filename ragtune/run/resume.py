"""A sweep's options, kept in its results folder (DIR/sweep.json), so that the bare command
`ragtune sweep SHAPES -o DIR` resumes an interrupted sweep exactly.

The rule: a bare command (no sweep option) runs a stored sweep of the same shapes file with
the options it had: the unfinished bare one if there is one, else the latest unfinished one,
else the latest finished one. An unfinished one resumes (if the file is unchanged), a finished
one has nothing left to do (unless the file has grown since). A command with any sweep option
runs exactly as given; --defaults alone asks for the file's own plan.

Each set of options is stored apart (a narrow check never replaces the full sweep), without
the options of one host (--devices), so the command a sweep prints always finishes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from ragtune.errors import RagtuneError
from ragtune.paths import write_atomic

SWEEPS = "sweep.json"
SCHEMA = "ragtune-sweeps"


@dataclasses.dataclass(frozen=True)
class SweepFlags:
  """The options of `ragtune sweep` that decide what is measured and how, as given on the
  command line: empty or None where not given (the shapes file's or the built-in default)."""

  ops: tuple[str, ...] = ()
  backends: tuple[str, ...] = ()
  shapes: tuple[str, ...] = ()  # --shape M,K,N, each
  models: tuple[str, ...] = ()
  max_candidates: int | None = None
  budget: int | None = None
  timeout_s: float | None = None
  interpret: bool | None = None
  devices: str | None = None
  shard: str | None = None
  builder: str | None = None
  defaults: bool = False  # --defaults: nothing stored applies

  def options(self) -> dict[str, list[str]]:
    """Each given option's command-line words, by option name, in the order of `ragtune sweep --help`."""
    one = lambda flag, value: [] if value is None else [flag, str(value)]
    listed = lambda flag, values: [flag, ",".join(values)] if values else []
    words = {
      "--backend": listed("--backend", self.backends),
      "--op": listed("--op", self.ops),
      "--shape": [w for shape in self.shapes for w in ("--shape", shape)],  # M,K,N has commas: one flag each
      "--model": listed("--model", self.models),
      "--max-candidates": one("--max-candidates", self.max_candidates),
      "--budget": one("--budget", self.budget),
      "--timeout": one("--timeout", None if self.timeout_s is None else f"{self.timeout_s:g}"),
      "--interpret": [] if self.interpret is None else ["--interpret" if self.interpret else "--no-interpret"],
      "--devices": one("--devices", self.devices),
      "--shard": one("--shard", self.shard),
      "--builder": one("--builder", self.builder),
      "--defaults": ["--defaults"] if self.defaults else [],
    }
    return {flag: w for flag, w in words.items() if w}

  def stored(self) -> SweepFlags:
    """These options as a folder keeps them: what is measured, not where (--devices), and
    --defaults as no option (the file's own plan)."""
    return dataclasses.replace(self, devices=None, defaults=False)

  def bare(self) -> bool:
    """No option that chooses what is measured: the command resumes what is stored."""
    return self.stored() == SweepFlags() and not self.defaults

  def argv(self) -> list[str]:
    return [w for words in self.options().values() for w in words]

  def text(self) -> str:
    return shlex.join(self.argv()) or "no options"

  def changes_from(self, old: SweepFlags) -> str:
    """How these options differ from `old`: '--op fwd dropped, --max-candidates 2 -> --max-candidates 3'."""
    new_opts, old_opts = self.options(), old.options()
    out = []
    for flag in dict.fromkeys([*old_opts, *new_opts]):
      before, after = shlex.join(old_opts.get(flag, [])), shlex.join(new_opts.get(flag, []))
      if before == after:
        continue
      out.append(f"{before} dropped" if not after else f"{after} added" if not before else f"{before} -> {after}")
    return ", ".join(out)


@dataclasses.dataclass(frozen=True)
class StoredSweep:
  """One shapes file's last sweep into a results folder."""

  shapes_file: str  # resolved path
  shapes_sha256: str
  flags: SweepFlags
  finished: bool = False

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> StoredSweep:
    flags = {k: tuple(v) if isinstance(v, list) else v for k, v in d["flags"].items()}
    return cls(d["shapes_file"], d["shapes_sha256"], SweepFlags(**flags), bool(d.get("finished")))


def file_sha256(path: Path) -> str:
  try:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
  except OSError as e:
    raise RagtuneError(f"{path}: cannot read ({e.strerror or e})") from None


def load(out_dir: Path) -> list[StoredSweep]:
  """The sweeps stored in a results folder; none if it has no sweep.json."""
  path = Path(out_dir) / SWEEPS
  if not path.is_file():
    return []
  try:
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
      raise ValueError(f"schema is not {SCHEMA!r}")
    return [StoredSweep.from_dict(d) for d in data["sweeps"]]
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise RagtuneError(f"{path}: unreadable stored sweep options ({e}); delete it to start afresh") from None


def _key(shapes_file: Path) -> str:
  """A shapes file's entry in sweep.json: its resolved path, whatever folder the command ran in."""
  return str(Path(shapes_file).resolve())


def save(out_dir: Path, shapes_file: Path, flags: SweepFlags, *, finished: bool) -> None:
  """Store (replace) this shapes file's sweep with these options in the folder's sweep.json,
  atomically, as the latest; the file's sweeps with other options stay."""
  entry = StoredSweep(_key(shapes_file), file_sha256(shapes_file), flags.stored(), finished)
  sweeps = [s for s in load(out_dir) if (s.shapes_file, s.flags) != (entry.shapes_file, entry.flags)] + [entry]
  text = json.dumps({"schema": SCHEMA, "sweeps": [s.to_dict() for s in sweeps]}, indent=1) + "\n"
  write_atomic(Path(out_dir) / SWEEPS, text)


def stored_sweeps(out_dir: Path, shapes_file: Path) -> list[StoredSweep]:
  """The sweeps of this shapes file stored in the folder, the latest last."""
  return [s for s in load(out_dir) if s.shapes_file == _key(shapes_file)]


def stored_sweep(out_dir: Path, shapes_file: Path, flags: SweepFlags | None = None) -> StoredSweep | None:
  """The stored sweep of this shapes file with these options; with none, the one a bare
  command runs: the unfinished bare sweep, else the latest unfinished, else the latest."""
  sweeps = stored_sweeps(out_dir, shapes_file)
  if flags is not None:
    return next((s for s in sweeps if s.flags == flags.stored()), None)
  unfinished = [s for s in sweeps if not s.finished]
  bare = [s for s in unfinished if s.flags == SweepFlags()]
  return (bare or unfinished or sweeps or [None])[-1]


def command(shapes_file: Path, out_dir: Path, flags: SweepFlags) -> str:
  """The command line that runs this sweep again, exactly (shell-quoted)."""
  return shlex.join(["ragtune", "sweep", str(shapes_file), "-o", str(out_dir), *flags.argv()])


def resolve(shapes_file: Path, out_dir: Path, given: SweepFlags) -> tuple[SweepFlags, str | None]:
  """The options this sweep runs with, and a line saying where they came from (None when
  they are simply the command's). Raises when a bare command would resume a sweep whose
  shapes file has changed since."""
  where = Path(out_dir) / SWEEPS
  if not given.bare():
    if stored_sweep(out_dir, shapes_file, given) is not None:
      return given, None
    other = next((s for s in reversed(stored_sweeps(out_dir, shapes_file)) if not s.finished), None)
    if other is None:
      return given, None
    return given, (
      f"note: {where} holds an unfinished sweep of {shapes_file} with {other.flags.text()}; this command runs "
      f"as given ({given.stored().changes_from(other.flags)}) and keeps that one for: "
      f"{command(shapes_file, out_dir, other.flags)}"
    )
  stored = stored_sweep(out_dir, shapes_file)
  if stored is None:
    return given, None
  flags = dataclasses.replace(stored.flags, devices=given.devices)
  if stored.finished:
    changed = stored.shapes_sha256 != file_sha256(shapes_file)
    return flags, (
      f"the sweep of {shapes_file} with {stored.flags.text()} finished ({where})"
      + ("; the file changed since: measuring what those options select in it now" if changed else "")
    )
  if stored.shapes_sha256 != file_sha256(shapes_file):
    # The options given explicitly (--defaults for none) run as given: on the file as it is now.
    explicit = stored.flags if stored.flags != SweepFlags() else SweepFlags(defaults=True)
    raise RagtuneError(
      f"{shapes_file} changed since the unfinished sweep in {out_dir} began ({where}), so its options "
      f"({stored.flags.text()}) may not select the same problems; to go on with the file as it is now "
      f"(the rows done are kept), run: {command(shapes_file, out_dir, explicit)}"
    )
  if stored.flags == SweepFlags():
    return flags, None
  return (
    flags,
    f"resuming the unfinished sweep of {shapes_file} with its options {stored.flags.text()} ({where})",
  )
