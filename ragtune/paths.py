"""Output paths checked before any work: a folder where a folder is needed, a file where a
file is, somewhere we can write, and nothing there that the command did not write itself.
Each check leaves nothing behind. Then each file is written whole or not at all (write_atomic)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ragtune.errors import RagtuneError, no_such
from ragtune.filekind import Kind, classify


def _reason(e: OSError) -> str:
  return e.strerror or type(e).__name__


def writable_dir(path: Path, what: str, shown: Path | None = None) -> Path:
  """Refuse, now, a folder `what` could not be written into (it may not exist yet).
  `shown` is the path the user gave, when it is not this folder."""
  path = Path(path)
  shown = shown or path
  if path.exists() and not path.is_dir():
    raise RagtuneError(f"{path}: is a file, but {what} must be a folder")
  missing = []
  for p in (path, *path.parents):
    if p.is_dir():
      break
    if p.exists():
      raise RagtuneError(f"{shown}: {p} is a file, so it cannot hold {what}")
    missing.append(p)
  created = []
  try:
    for p in reversed(missing):
      p.mkdir()
      created.append(p)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise RagtuneError(f"{shown}: cannot write {what} here ({_reason(e)})") from None
  finally:
    for p in reversed(created):  # the real write creates them again
      try:
        p.rmdir()
      except OSError:
        pass
  return path


def writable_file(path: Path, what: str) -> Path:
  """Refuse, now, a file path `what` could not be written to."""
  path = Path(path)
  if path.is_dir():
    raise RagtuneError(f"{path}: is a folder, but {what} must be a file")
  if path.parent.exists() and not path.parent.is_dir():
    raise RagtuneError(f"{path}: {path.parent} is a file, so it cannot hold {what}")
  writable_dir(path.parent, what, shown=path)
  return path


def output_file(path: Path, what: str, ours: Kind, *, force: bool) -> Path:
  """Refuse, now, an output file that exists and is not `ours` (the kind this command writes,
  told from the file itself: rerunning a command over its own output replaces it), unless
  `force`; and one `what` could not be written to."""
  path = writable_file(path, what)
  if not force and path.exists() and (found := classify(path)) != ours:
    found_is = "is not" if found == Kind.OTHER else f"is {found.value}, not"
    raise RagtuneError(f"{path}: exists and {found_is} {ours.value}; use --force to replace it")
  return path


def folder_of(path: Path) -> Path:
  """A results folder given as itself or as its records file."""
  path = Path(path)
  return path.parent if path.is_file() else path


def existing_dirs(dirs: list[Path], what: str = "results folder", *, default: bool = False) -> list[Path]:
  """Input folders (or records files) that must exist; `default`: they are the device's
  default, no path was given (see errors.no_such)."""
  for d in dirs:
    if not Path(d).exists():
      raise no_such(d, what, default=default)
  return dirs


@contextlib.contextmanager
def atomic_path(path: Path):
  """A temp path in the same folder to write `path`'s content to; renamed onto `path` when the
  block ends, so readers never see half a file. On any failure the temp file is removed, and
  an OSError is one line naming the path. The temp keeps the suffix (a plot's format)."""
  path = Path(path)
  if path.is_dir():
    raise RagtuneError(f"{path}: is a folder, not a file")
  tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    yield tmp
    os.replace(tmp, path)
  except OSError as e:
    raise RagtuneError(f"{path}: cannot write ({e.strerror or type(e).__name__})") from None
  finally:
    if tmp.exists():
      tmp.unlink()


def write_atomic(path: Path, text: str) -> None:
  """Write text atomically (atomic_path), synced to disk before the rename."""
  with atomic_path(path) as tmp, open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
