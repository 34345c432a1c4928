"""What a path holds, read from its content, not its name: the one place that tells a shape
file from a LUT, a records file, a model's config.json or a CSV one of our commands wrote.
Commands use it to refuse the wrong kind of input with an error about the file given, and
to replace only an output they wrote themselves (ragtune.paths.output_file)."""

from __future__ import annotations

import csv
import enum
import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from ragtune.errors import RagtuneError

# The first line of a shape file `ragtune shapes from-config` writes: how a rerun knows its own file.
FROM_CONFIG_MARK = "# Written by `ragtune shapes from-config`; rerun it to update this file."
# ... and of one ragtune.capture wrote (`ragtune shapes from-function`, ShapeSet.write).
CAPTURED_MARK = "# Written by ragtune.capture from a function's run; capture it again to update this file."
# The first line of report.md, and of the module `export-lut --format python` writes.
REPORT_MD_MARK = "# ragtune report"
LUT_MODULE_MARK = '"""ragtune LUT for '
# The headers of the CSVs our commands write, by which classify knows them and a rerun
# replaces only its own: `bench --csv` (ragtune.lut.bench.Row's fields, in order), `show --csv`
# (best per problem, "device_kind" first when the rows span several device kinds; and --all),
# and how `report`'s best.csv and rows.csv start.
BENCH_CSV_COLUMNS = [
  "problem",
  "shape",
  "op",
  "dtype",
  "variant",
  "config",
  "status",
  "rel_error",
  "ms",
  "tflops",
  "pct_matmul_peak",
  "gbps",
  "pct_copy_bw",
  "vs_xla",
  "vs_peer",
  "peer",
  "timer",
  "same_as",
]
SHOW_CSV_COLUMNS = [
  "op",
  "backend",
  "dtype",
  "shape",
  "best_ms",
  "tflops",
  "pct_peak",
  "xla_ms",
  "default_ms",
  "vs_xla",
  "vs_default",
  "winner",
  "statuses",
  "best_config",
]
SHOW_ALL_CSV_COLUMNS = ["op", "backend", "dtype", "shape", "config", "status", "ms", "TF/s", "error"]
REPORT_CSV_START = ["device_kind", "op", "backend", "dtype", "m", "k", "n", "g"]
# A results folder holds RECORDS, or shard folders that do (written by sweeps with --shard,
# ragtune.run.shard), or both.
RECORDS = "records.jsonl"
SHARD_FOLDERS = "shard-*-of-*"
_HEAD_BYTES = 1 << 16
_PNG = b"\x89PNG\r\n\x1a\n"


class Kind(enum.Enum):
  """Each kind's value is how an error names it."""

  MISSING = "nothing"
  RESULTS = "a results folder"
  FOLDER = "a folder"
  SHAPES = "a shape file"
  FROM_CONFIG = "a shape file written by `ragtune shapes from-config`"
  CAPTURED = "a shape file written by ragtune.capture"
  LUT = "a ragtune LUT"
  LUT_MODULE = "a LUT module written by `ragtune export-lut --format python`"
  RECORDS = "a records file (records.jsonl)"
  HF_CONFIG = "a Hugging Face model config"
  SHOW_CSV = "a CSV written by `ragtune show --csv`"
  BENCH_CSV = "a CSV written by `ragtune bench`"
  REPORT_CSV = "a CSV written by `ragtune report`"
  REPORT_MD = "a report.md written by `ragtune report`"
  PNG = "a PNG image"
  OTHER = "a file of another kind"


def _json_kind(data: Any) -> Kind | None:
  import kernels

  if not isinstance(data, dict):
    return None
  if {"problem", "status"} <= data.keys():
    return Kind.RECORDS
  if data.get("schema") == kernels.lut.SCHEMA:
    try:
      kernels.Lut.from_dict(data)
    except kernels.LutError:
      return Kind.OTHER  # says it is a LUT but is not one we can read
    return Kind.LUT
  if {"model_type", "architectures", "hidden_size"} & data.keys():
    return Kind.HF_CONFIG
  return None


def _csv_kind(header: list[str]) -> Kind | None:
  if header in (SHOW_CSV_COLUMNS, ["device_kind", *SHOW_CSV_COLUMNS], SHOW_ALL_CSV_COLUMNS):
    return Kind.SHOW_CSV
  if header == BENCH_CSV_COLUMNS:
    return Kind.BENCH_CSV
  if header[: len(REPORT_CSV_START)] == REPORT_CSV_START:
    return Kind.REPORT_CSV
  return None


def _text_kind(text: str, whole: Callable[[], str]) -> Kind:
  """`text`: the file's start; `whole()`: all of it, read only for a JSON document."""
  first = text.split("\n", 1)[0]
  if first == FROM_CONFIG_MARK:
    return Kind.FROM_CONFIG
  if first == CAPTURED_MARK:
    return Kind.CAPTURED
  if first == REPORT_MD_MARK:
    return Kind.REPORT_MD
  if first.startswith(LUT_MODULE_MARK):
    return Kind.LUT_MODULE
  found = None
  try:  # JSON lines: the first line alone
    found = _json_kind(json.loads(first))
  except json.JSONDecodeError:
    if text.lstrip().startswith("{"):
      try:
        found = _json_kind(json.loads(whole()))
      except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        found = None
  if found is not None:
    return found
  if "," in first:
    header = next(csv.reader(io.StringIO(first)), [])
    if (kind := _csv_kind(header)) is not None:
      return kind
  try:
    data = yaml.safe_load(text)
  except yaml.YAMLError:
    return Kind.OTHER
  return Kind.SHAPES if isinstance(data, dict) and {"shapes", "models"} & data.keys() else Kind.OTHER


def with_shards(dirs: Iterable[str | Path]) -> list[Path]:
  """The results folders, each followed by the shard folders a sharded sweep made in it
  (shard-<i>-of-<N>, ragtune.run.shard); a folder that holds only shards stands for them."""
  out = []
  for d in map(Path, dirs):
    shards = sorted(s for s in d.glob(SHARD_FOLDERS) if (s / RECORDS).is_file()) if d.is_dir() else []
    out += ([d] if not shards or (d / RECORDS).exists() else []) + shards
  return out


def classify(path: Path) -> Kind:
  """What `path` holds, from its content (only its first 64 KiB are read)."""
  path = Path(path)
  if path.is_dir():
    return Kind.RESULTS if with_shards([path]) != [path] or (path / RECORDS).is_file() else Kind.FOLDER
  try:
    with open(path, "rb") as f:
      head = f.read(_HEAD_BYTES)
  except FileNotFoundError:
    return Kind.MISSING
  except OSError:
    return Kind.OTHER
  if head.startswith(_PNG):
    return Kind.PNG
  try:
    text = head.decode()
  except UnicodeDecodeError as e:
    if len(head) < _HEAD_BYTES or e.start < len(head) - 4:
      return Kind.OTHER
    text = head[: e.start].decode()  # the cut fell inside a character
  return _text_kind(text, lambda: head.decode() if len(head) < _HEAD_BYTES else path.read_text())


def check_input(path: Path, accepted: set[Kind], wanted: str) -> None:
  """Refuse `path` when it is plainly another kind than `accepted` (one of ours, or a model's
  config), saying what it is and that the command wants `wanted`; a file of no kind we know
  is left to the reader's own, more precise errors."""
  kind = classify(path)
  if kind in accepted or kind in (Kind.MISSING, Kind.OTHER, Kind.FOLDER):
    return
  hint = ""
  if kind == Kind.HF_CONFIG:
    hint = f"; make a shape file from it with `ragtune shapes from-config {path} -o FILE.yaml`"
  elif kind == Kind.RECORDS and Kind.RESULTS in accepted:
    hint = f" (its results folder is {path.parent})"
  raise RagtuneError(f"{path}: is {kind.value}, not {wanted}{hint}")
