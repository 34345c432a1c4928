"""Sweep records: one JSON object per line in <dir>/records.jsonl, appended and fsynced.

A killed sweep can leave at most one partial last line; readers leave it out with a warning
(cut_text), and the next append cuts it off, so every complete line is kept and nothing
finished is measured twice.

Each line is a `Record`, written with the keys sweeps have always written, the derived ones
(`id`, `problem`, `candidate`, `kind`) included, so older ragtune and scripts can still read
it. Reading derives those again from the fields, takes the keys later versions added
(`device_index`, `worker_pid`, `elapsed_s`, `versions`) as absent where a line lacks them,
and ignores keys it does not know.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kernels import registry
from ragtune import filekind
from ragtune.device import measure
from ragtune.errors import RagtuneError, no_such, not_utf8
from ragtune.filekind import RECORDS, with_shards
from ragtune.problems.shapes import Problem
from ragtune.provenance import Versions
from ragtune.words import count


def _id_of(fields: dict[str, Any]) -> str:
  return json.dumps(fields, sort_keys=True)


def candidate_id(config) -> str:
  """The record key of a config: its fields as sorted JSON."""
  return _id_of(config.to_dict())


def row_id(problem_key: str, candidate: str) -> str:
  return f"{problem_key}|{candidate}"


def baseline_name(candidate: str) -> str:
  """'xla' for the candidate id 'baseline:xla'; '' for a config's id."""
  return candidate.removeprefix("baseline:") if candidate.startswith("baseline:") else ""


def _seconds(v: Any) -> float | None:
  """A time as a float, or None where it is not a positive finite number."""
  ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
  return float(v) if ok else None


def _number(v: Any) -> float | None:
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclasses.dataclass(frozen=True)
class Record:
  """One row of records.jsonl: the outcome of one candidate config (or baseline) of one
  problem on one device. A baseline has no config but a name: `xla` (XLA's own op, timed
  in the same worker) or `dense` (a dense matmul of the same FLOPs)."""

  problem: Problem
  config: dict[str, Any] | None  # the candidate's fields, keys sorted; None for a baseline
  baseline: str  # "" for a candidate, else "xla" or "dense"
  status: str  # ok, compile_error, too_big, timeout, crash, run_error, wrong, nan, timing_error
  device_kind: str
  error: str = ""
  time_s: float | None = None  # seconds per call; set only when timed
  tflops: float | None = None
  gbps: float | None = None
  timer: str = ""
  interpret: bool = False
  numerics: dict[str, float] | None = None  # max_diff, rel_error, pct_bad of the check, when it ran
  # The worker's device. A row the parent writes for a candidate that a deviceless compile
  # rejected has the device kind only; rows from before workers have no index or pid.
  platform: str | None = None
  jax_version: str | None = None
  device_index: int | None = None
  worker_pid: int | None = None
  elapsed_s: float | None = None  # seconds the worker spent on it
  versions: Versions | None = None  # what made it (ragtune.provenance); rows from before have jax_version only
  timestamp: str = ""
  origin: str = ""  # the results folder it was read from (load_results); not written

  @functools.cached_property  # read often, by every view; a frozen record never changes it
  def candidate(self) -> str:
    """The candidate id: the config as sorted JSON, or `baseline:xla` / `baseline:dense`."""
    return f"baseline:{self.baseline}" if self.baseline else _id_of(self.config)

  @functools.cached_property
  def id(self) -> str:
    return row_id(self.problem.key, self.candidate)

  @property
  def kind(self) -> str:
    return "baseline" if self.baseline else "candidate"

  @property
  def ok(self) -> bool:
    """Correct and timed."""
    return self.status == "ok" and self.time_s is not None

  def made_with(self) -> dict[str, str]:
    """What made it (ragtune.provenance): its versions, or for a row from before them its jax_version."""
    if self.versions is not None:
      return self.versions.to_dict()
    return {"jax": self.jax_version} if self.jax_version else {}

  def to_dict(self) -> dict[str, Any]:
    """The line as written (see the module docstring); device fields it lacks are left out."""
    p = self.problem
    device = {
      "platform": self.platform,
      "jax_version": self.jax_version,
      "device_index": self.device_index,
      "worker_pid": self.worker_pid,
      "elapsed_s": self.elapsed_s,
      "versions": self.versions.to_dict() if self.versions is not None else None,
    }
    return {
      "id": self.id,
      "problem": p.key,
      "candidate": self.candidate,
      "kind": self.kind,
      **p.fields(),
      "group_sizes": list(p.group_sizes),
      "source": p.source,
      **({"calls": p.calls} if p.calls != 1 else {}),
      "config": self.config,
      "status": self.status,
      "error": self.error,
      "time_s": self.time_s,
      "tflops": self.tflops,
      "gbps": self.gbps,
      "timer": self.timer,
      "interpret": self.interpret,
      "numerics": self.numerics,
      "device_kind": self.device_kind,
      **{k: v for k, v in device.items() if v is not None},
      "timestamp": self.timestamp,
    }

  @classmethod
  def from_dict(cls, d: dict[str, Any], origin: str = "", problems: dict[tuple, Problem] | None = None) -> Record:
    """A line as read, from any ragtune version; KeyError names a missing key. `problems`
    shares one Problem among a file's rows of it (its key is a sha1, computed once)."""
    baseline = baseline_name(d["candidate"])
    fields = (
      d["op"],
      d["backend"],
      d["dtype"],
      int(d["m"]),
      int(d["k"]),
      int(d["n"]),
      int(d["g"]),
      d["group_dist"],
      tuple(int(s) for s in d["group_sizes"]),
      d.get("source") or "",
      int(d.get("calls", 1)),
    )
    problem = Problem(*fields) if problems is None else problems.setdefault(fields, Problem(*fields))
    return cls(
      problem=problem,
      config=None if baseline else dict(sorted(d["config"].items())),
      baseline=baseline,
      status=d["status"],
      device_kind=d["device_kind"],
      error=d.get("error") or "",
      time_s=_seconds(d.get("time_s")),
      tflops=_number(d.get("tflops")),
      gbps=_number(d.get("gbps")),
      timer=d.get("timer") or "",
      interpret=bool(d.get("interpret")),
      numerics=d.get("numerics"),
      platform=d.get("platform"),
      jax_version=d.get("jax_version"),
      device_index=d.get("device_index"),
      worker_pid=d.get("worker_pid"),
      elapsed_s=_number(d.get("elapsed_s")),
      versions=Versions.from_dict(d["versions"]) if d.get("versions") is not None else None,
      timestamp=d.get("timestamp") or "",
      origin=origin,
    )


class JsonLines:
  """An append-only file of JSON objects, one a line, each appended and fsynced."""

  def __init__(self, path: str | Path):
    self.path = Path(path)
    self._tail_checked = False

  def _repair_tail(self) -> None:
    """A last line with no newline: cut off (readers skip it, with a warning), or whole but
    for its newline (readers read it), which is kept."""
    if not self.path.exists():
      return
    with open(self.path, "rb+") as f:
      data = f.read()
      if data and not data.endswith(b"\n"):
        start = data.rfind(b"\n") + 1
        try:
          json.loads(data[start:].decode())
          f.write(b"\n")
        except ValueError:
          f.truncate(start)

  def rows(self) -> list[dict[str, Any]]:
    return [d for _, d in _read_lines(self.path)] if self.path.exists() else []

  def append(self, row: dict[str, Any]) -> None:
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if not self._tail_checked:
      self._repair_tail()
      self._tail_checked = True
    line = json.dumps(row, sort_keys=True, default=str) + "\n"
    with open(self.path, "a") as f:
      f.write(line)
      f.flush()
      os.fsync(f.fileno())


class ResultsStore:
  """A results folder's records.jsonl. With skip_bad_lines, lines that are not records are
  left out (and left in the file) instead of stopping the read."""

  def __init__(self, directory: str | Path, skip_bad_lines: bool = False):
    self.path = Path(directory) / RECORDS
    self._lines = JsonLines(self.path)
    self.skip_bad_lines = skip_bad_lines

  def rows(self) -> list[Record]:
    if not self.path.exists():
      return []
    return read_records(self.path, skipped=[] if self.skip_bad_lines else None)

  def append(self, record: Record) -> None:
    self._lines.append(record.to_dict())


_SKIP_HINT = "--skip-bad-lines reads past such lines"


def _bad_line(path: Path, i: int, why: str, skipped: list[int] | None) -> None:
  """Line i is not a record: noted in `skipped` when given, else an error naming it."""
  if skipped is None:
    raise RagtuneError(f"{path}:{i}: {why}; {_SKIP_HINT}")
  skipped.append(i)


def _read_lines(
  path: Path, skipped: list[int] | None = None, cut: list[int] | None = None
) -> list[tuple[int, dict[str, Any]]]:
  """(line number, object) of each complete line. A line that is not JSON is an error, or,
  with `skipped` given, its number is appended there. A last line with no newline that is
  not JSON was cut off mid-write (a killed sweep), not corrupted: it is left out, and its
  number appended to `cut` when given."""
  rows = []
  lines = Path(path).read_bytes().split(b"\n")
  for i, data in enumerate(lines, 1):
    if not data.strip():
      continue
    try:
      rows.append((i, json.loads(data.decode())))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      if i == len(lines):  # the next append cuts it off (JsonLines._repair_tail)
        if cut is not None:
          cut.append(i)
        continue
      why = not_utf8(data, e)[1] if isinstance(e, UnicodeDecodeError) else "corrupt record (not JSON)"
      _bad_line(path, i, why, skipped)
  return rows


def read_records(
  path: Path, origin: str = "", skipped: list[int] | None = None, cut: list[int] | None = None
) -> list[Record]:
  """The file's records. A line that is no record is an error naming it, or, with `skipped`
  given, its number is appended there and the line left out. `cut`: as for _read_lines."""
  out: list[Record] = []
  problems: dict[tuple, Problem] = {}
  for i, d in _read_lines(path, skipped, cut):
    try:
      out.append(Record.from_dict(d, origin, problems))
    except KeyError as e:
      _bad_line(path, i, f"not a sweep record (no {e.args[0]!r})", skipped)
    except (TypeError, ValueError, AttributeError) as e:
      _bad_line(path, i, f"not a sweep record ({e})", skipped)
  if skipped:
    skipped.sort()
  return out


def _refuse_other_kind(path: Path) -> None:
  """A file with no sweep record in it, whose content does not mark it as a records file
  either (a README given to show): say what it is, not what is wrong with its first line."""
  if filekind.classify(path) == filekind.Kind.OTHER and not read_records(path, skipped=[]):
    raise RagtuneError(
      f"{path}: is {filekind.Kind.OTHER.value}, not a results folder or its {RECORDS} (no line of it is a sweep record)"
    )


def load_results(
  dirs: Iterable[str | Path], skipped: dict[Path, list[int]] | None = None, cut: dict[Path, int] | None = None
) -> list[Record]:
  """All records of the given results folders (or records files), each with its `origin`.
  With `skipped` given, lines that are no records are left out and listed there per file;
  with `cut`, the number of each file's last line that was cut off mid-write (cut_text)."""
  out, dirs = [], list(dirs)
  for d in dirs:
    if not Path(d).exists():
      raise no_such(d)
    filekind.check_input(
      Path(d), {filekind.Kind.RESULTS, filekind.Kind.RECORDS}, "a results folder or its records.jsonl"
    )
  for p in with_shards(dirs):
    path = p / RECORDS if p.is_dir() else p
    if not path.exists():
      raise RagtuneError(f"{p}: no {RECORDS} here (is it a results folder written by `ragtune sweep`?)")
    bad: list[int] | None = None if skipped is None else []
    torn: list[int] = []
    try:
      records = read_records(path, str(p), bad, torn)
    except RagtuneError:
      _refuse_other_kind(path)
      raise
    if bad:
      skipped[path] = bad
    if torn and cut is not None:
      cut[path] = torn[0]
    if not records:
      if bad:
        _refuse_other_kind(path)
      raise RagtuneError(
        f"{path}: results file is empty"
        + (f" ({len(bad)} bad lines skipped)" if bad else "")
        + (f" (line {torn[0]} was cut off mid-write)" if torn else "")
      )
    # An id met twice: a row measured again (sweep --retry-failed), or two unlocked sweeps
    # of older versions; the latest record wins.
    out += {r.id: r for r in records}.values()
  return out


def skipped_text(path: Path, lines: list[int], shown: int = 5) -> str:
  """'DIR/records.jsonl: skipped 2 bad lines (5, 9)': what --skip-bad-lines left out of a file."""
  more = f", and {len(lines) - shown} more" if len(lines) > shown else ""
  return f"{path}: skipped {count(len(lines), 'bad line')} ({', '.join(map(str, lines[:shown]))}{more})"


def cut_text(path: Path, line: int) -> str:
  """What readers say of a last line cut off mid-write (_read_lines): not corruption, and repaired by the next sweep."""
  return (
    f"{path}:{line}: the last line was cut off mid-write (a sweep stopped while writing it) and is not read; "
    "the next sweep that writes here removes it"
  )


def make_row(
  p: Problem,
  candidate: str,
  config,
  status: str,
  *,
  interpret: bool,
  device: dict[str, Any],
  error: str = "",
  time_s: float | None = None,
  timer: str = "",
  numerics=None,
) -> Record:
  """The record of one outcome. device: Record's device fields (device_kind, and from a
  worker platform, jax_version, device_index, worker_pid, versions)."""
  ok_time = _seconds(time_s) is not None
  return Record(
    problem=p,
    config=dict(sorted(config.to_dict().items())) if config is not None else None,
    baseline=baseline_name(candidate),
    status=status,
    error=error,
    time_s=time_s if ok_time else None,
    tflops=measure.flops(p) / time_s / 1e12 if ok_time else None,
    gbps=measure.bytes_moved(p) / time_s / 1e9 if ok_time else None,
    timer=timer,
    interpret=interpret and registry.get(p.backend).config_type is not None,
    numerics=None
    if numerics is None
    else {"max_diff": numerics.max_diff, "rel_error": numerics.rel_error, "pct_bad": numerics.pct_bad},
    **device,
    timestamp=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
  )
