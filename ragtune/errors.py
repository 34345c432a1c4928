import shlex
from pathlib import Path

from kernels.common import not_utf8


def install_hint(*extras: str) -> str:
  """The one form every message gives for installing extras: the README's, from the checkout."""
  return f"python3 -m pip install -e '.[{','.join(extras)}]'"


class RagtuneError(Exception):
  """A user-facing error: the CLI prints its message on one line and exits non-zero."""


def read_text(path: str | Path) -> str:
  """A file's text; a byte that is not UTF-8 is a RagtuneError naming the file, line and
  column. OSError (a missing file) is the caller's to word."""
  data = Path(path).read_bytes()
  try:
    return data.decode()
  except UnicodeDecodeError as e:
    line, why = not_utf8(data, e)
    raise RagtuneError(f"{path}:{line}: {why}") from None


def no_such(path: Path, what: str = "results folder", *, default: bool = False) -> RagtuneError:
  """The error for an input a sweep makes that is not there, with how to make it: `default`
  when no path was given and this is the device's default results folder (a fresh clone's
  first command other than sweep)."""
  shapes = "shapes/smoke.yaml" if Path("shapes/smoke.yaml").is_file() else "SHAPES.yaml"
  if default:
    how = f"this device's default; run a sweep first: ragtune sweep {shapes}"
  elif Path(path).suffix == ".json":
    how = f"export-lut writes one: ragtune export-lut RESULTS_DIR -o {shlex.quote(str(path))}"
  else:
    how = f"a sweep makes one: ragtune sweep {shapes} -o {shlex.quote(str(path))}"
  return RagtuneError(f"{path}: no such {what} ({how})")
