"""Sweep records: one JSON object per line in <dir>/records.jsonl, appended and fsynced.

A killed sweep can leave at most one partial last line; it is cut off on the next open,
so every complete line is kept and nothing finished is measured twice.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from ragtune import measure
from ragtune.errors import RagtuneError
from ragtune.shapes import Problem

RECORDS = "records.jsonl"


def candidate_id(config) -> str:
  """The record key of a config: its fields as sorted JSON."""
  return json.dumps(config.to_dict(), sort_keys=True)


def row_id(problem_key: str, candidate: str) -> str:
  return f"{problem_key}|{candidate}"


class ResultsStore:
  def __init__(self, directory: str | Path):
    self.dir = Path(directory)
    self.path = self.dir / RECORDS
    self._tail_checked = False

  def _repair_tail(self) -> None:
    if not self.path.exists():
      return
    with open(self.path, "rb+") as f:
      data = f.read()
      if data and not data.endswith(b"\n"):
        f.truncate(data.rfind(b"\n") + 1)

  def rows(self) -> list[dict[str, Any]]:
    return read_rows(self.path) if self.path.exists() else []

  def done_ids(self) -> set[str]:
    return {r["id"] for r in self.rows() if "id" in r}

  def append(self, row: dict[str, Any]) -> None:
    self.dir.mkdir(parents=True, exist_ok=True)
    if not self._tail_checked:
      self._repair_tail()
      self._tail_checked = True
    line = json.dumps(row, sort_keys=True, default=str) + "\n"
    with open(self.path, "a") as f:
      f.write(line)
      f.flush()
      os.fsync(f.fileno())


def read_rows(path: Path) -> list[dict[str, Any]]:
  rows = []
  with open(path) as f:
    lines = f.read().split("\n")
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if i == len(lines):  # a partial last line from a killed sweep
        continue
      raise RagtuneError(f"{path}:{i}: corrupt record (not JSON)") from None
  return rows


def load_results(dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
  """All rows of the given results folders (or records files); each row gets `_source`."""
  out = []
  for d in dirs:
    p = Path(d)
    if not p.exists():
      raise RagtuneError(f"{p}: no such results folder")
    path = p / RECORDS if p.is_dir() else p
    if not path.exists():
      raise RagtuneError(f"{p}: no {RECORDS} here (is it a results folder written by `ragtune sweep`?)")
    rows = read_rows(path)
    if not rows:
      raise RagtuneError(f"{path}: results file is empty")
    seen = set()
    for r in rows:
      if r.get("id") in seen:
        continue  # older files could get an id twice (two unlocked sweeps): keep the first
      seen.add(r.get("id"))
      r["_source"] = str(p)
      out.append(r)
  return out


def write_atomic(path: Path, text: str) -> None:
  """Write via a temp file in the same folder and rename, so readers never see half a file.
  On failure the temp file is removed and the error is one line naming the path."""
  path = Path(path)
  if path.is_dir():
    raise RagtuneError(f"{path}: is a folder, not a file")
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    raise RagtuneError(f"{path}: cannot write ({e.strerror or type(e).__name__})") from None
  finally:
    if tmp.exists():
      tmp.unlink()


def make_row(p: Problem, candidate: str, config, status: str, *, interpret: bool, device: dict[str, Any],
             error: str = "", time_s: float | None = None, timer: str = "", numerics=None) -> dict[str, Any]:
  ok_time = time_s is not None and math.isfinite(time_s) and time_s > 0
  return {
      "id": row_id(p.key, candidate), "problem": p.key, "candidate": candidate,
      "kind": "baseline" if candidate.startswith("baseline:") else "candidate",
      **p.fields(), "group_sizes": list(p.group_sizes), "source": p.source,
      "config": config.to_dict() if config is not None else None,
      "status": status, "error": error,
      "time_s": time_s if ok_time else None,
      "tflops": measure.flops(p) / time_s / 1e12 if ok_time else None,
      "gbps": measure.bytes_moved(p) / time_s / 1e9 if ok_time else None,
      "timer": timer, "interpret": interpret and p.backend != "xla",
      "numerics": None if numerics is None else {
          "max_diff": numerics.max_diff, "rel_error": numerics.rel_error, "pct_bad": numerics.pct_bad},
      **device, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
  }
