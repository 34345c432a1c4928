"""Which shard of a shape set a task sweeps: `--shard i/N`, or `--shard auto` from the batch
engine that started the task.

auto reads the task's index and count from the environment:
- a SLURM job array (https://slurm.schedmd.com/job_array.html): SLURM_ARRAY_TASK_ID and
  SLURM_ARRAY_TASK_COUNT; an array need not start at 0 (SLURM_ARRAY_TASK_MIN) and may step
  (SLURM_ARRAY_TASK_STEP, as in --array=0-30:10). With `auto/N` the task id is the index
  and N the count, so resubmitting some tasks of an array (--array=2,5) sweeps their shards;
- a Kubernetes Indexed Job (https://kubernetes.io/docs/concepts/workloads/controllers/job/
  #completion-mode): JOB_COMPLETION_INDEX. The pod is not told the Job's completions, so
  the count comes from `--shard auto/N` or RAGTUNE_SHARD_COUNT.
Each shard sweeps into its own folder, shard-<i>-of-<N>, under the results folder; the
commands that read results folders read those too (records.store.load_results), and say
which shards have no records there (Gap; ragtune.run.prepare.missing_shards).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from ragtune.errors import RagtuneError
from ragtune.filekind import SHARD_FOLDERS
from ragtune.words import count

COUNT_VAR = "RAGTUNE_SHARD_COUNT"
FOLDER = re.compile(r"shard-(\d+)-of-(\d+)")  # Shard.folder's name


class EmptyShard(Exception):
  """Not an error: this task's shard has no problems (more tasks than problems); the command
  says so and exits 0, as a task with nothing to do should."""


@dataclasses.dataclass(frozen=True)
class Shard:
  index: int  # 0-based
  count: int
  source: str = ""  # where auto found it: 'SLURM_ARRAY_TASK_ID=3 ...'; "" when given as i/N

  def folder(self, out_dir: Path) -> Path:
    return Path(out_dir) / f"shard-{self.index}-of-{self.count}"

  def text(self) -> str:
    return f"shard {self.index}/{self.count}" + (f" (from {self.source})" if self.source else "")

  def empty(self, total: int) -> EmptyShard:
    return EmptyShard(
      f"{self.text()} has no problems ({count(total, 'problem')} for {self.count} tasks); nothing to do"
    )


def folders(base: Path) -> dict[int, dict[int, Path]]:
  """The shard folders in a results folder: {N: {i: shard-<i>-of-<N>}}."""
  out: dict[int, dict[int, Path]] = {}
  for p in Path(base).glob(SHARD_FOLDERS) if Path(base).is_dir() else []:
    if (m := FOLDER.fullmatch(p.name)) and p.is_dir():
      out.setdefault(int(m[2]), {})[int(m[1])] = p
  return out


@dataclasses.dataclass(frozen=True)
class Gap:
  """Shards of a sharded sweep into `base` with no records there: not swept yet, still
  running, stopped before its first row, or failed. `command` sweeps the first of them (the
  options its sweep stored), or is "" when no shard folder says which file it swept."""

  base: Path
  count: int  # N of --shard i/N
  missing: tuple[int, ...]
  command: str = ""

  def text(self, then: str) -> str:
    """'DIR: shard 0 of 2 has no records here (...): <then, its or their problems>; sweep it: ...'."""
    one = len(self.missing) == 1
    which = f"shard {self.missing[0]}" if one else f"shards {', '.join(map(str, self.missing))}"
    text = (
      f"{self.base}: {which} of {self.count} {'has' if one else 'have'} no records here (not swept yet, still "
      f"running, or stopped before its first row): {then.format(their='its' if one else 'their')}"
    )
    if self.command:
      others = ", ".join(f"{i}/{self.count}" for i in self.missing[1:])
      text += f"; sweep {'it' if one else 'them'}: {self.command}" + (f" (and --shard {others})" if others else "")
    return text


def _int(env: Mapping[str, str], name: str, what: str) -> int:
  value = env.get(name, "").strip()
  if not value.lstrip("-").isdigit():
    raise RagtuneError(f"--shard {what}: {name}={value!r} is not an integer")
  return int(value)


def _slurm(env: Mapping[str, str]) -> Shard:
  task, count = _int(env, "SLURM_ARRAY_TASK_ID", "auto"), _int(env, "SLURM_ARRAY_TASK_COUNT", "auto")
  first = _int(env, "SLURM_ARRAY_TASK_MIN", "auto") if "SLURM_ARRAY_TASK_MIN" in env else 0
  step = _int(env, "SLURM_ARRAY_TASK_STEP", "auto") if "SLURM_ARRAY_TASK_STEP" in env else 1
  if step < 1 or (task - first) % step:
    raise RagtuneError(
      f"--shard auto: SLURM_ARRAY_TASK_ID={task} is not SLURM_ARRAY_TASK_MIN={first} plus a multiple of "
      f"SLURM_ARRAY_TASK_STEP={step}; give --shard i/N"
    )
  used = [f"SLURM_ARRAY_TASK_ID={task}", f"SLURM_ARRAY_TASK_COUNT={count}"]
  used += [f"{k}={env[k]}" for k in ("SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP") if k in env]
  return _checked((task - first) // step, count, "SLURM array task: " + " ".join(used))


def _indexed_job(env: Mapping[str, str], count_given: str) -> Shard:
  index = _int(env, "JOB_COMPLETION_INDEX", "auto")
  if count_given:
    count, from_where = _count(count_given, "--shard auto/N"), f"--shard auto/{count_given}"
  elif env.get(COUNT_VAR, "").strip():
    count, from_where = _int(env, COUNT_VAR, "auto"), f"{COUNT_VAR}={env[COUNT_VAR]}"
  else:
    raise RagtuneError(
      f"--shard auto: a Kubernetes Indexed Job (JOB_COMPLETION_INDEX={index}) does not say how many "
      f"shards there are; give --shard auto/N with N the Job's completions, or set {COUNT_VAR}"
    )
  return _checked(index, count, f"Kubernetes Indexed Job: JOB_COMPLETION_INDEX={index}, {from_where}")


def _count(text: str, what: str) -> int:
  if not text.strip().isdigit():
    raise RagtuneError(f"{what}: the count must be a positive integer, got {text!r}")
  return int(text)


def _checked(index: int, count: int, source: str) -> Shard:
  if count < 1 or not 0 <= index < count:
    where = f" ({source})" if source else ""
    raise RagtuneError(f"--shard: shard {index} of {count} does not exist{where}; i must be in 0..N-1")
  return Shard(index, count, source)


def parse(text: str | None, env: Mapping[str, str] | None = None) -> Shard | None:
  """--shard's value: None, 'i/N', 'auto' or 'auto/N'."""
  if text is None:
    return None
  env = os.environ if env is None else env
  head, sep, tail = text.strip().partition("/")
  if head == "auto":
    if "SLURM_ARRAY_TASK_ID" in env and sep:
      count = _count(tail, "--shard auto/N")
      task = _int(env, "SLURM_ARRAY_TASK_ID", "auto")
      return _checked(task, count, f"SLURM array task: SLURM_ARRAY_TASK_ID={task}, --shard auto/{count}")
    if "SLURM_ARRAY_TASK_ID" in env:
      return _slurm(env)
    if "JOB_COMPLETION_INDEX" in env:
      return _indexed_job(env, tail if sep else "")
    raise RagtuneError(
      "--shard auto: this is neither a SLURM array task (no SLURM_ARRAY_TASK_ID) nor a Kubernetes "
      "Indexed Job (no JOB_COMPLETION_INDEX); give --shard i/N"
    )
  if not sep or not head.isdigit() or not tail.strip().isdigit():
    raise RagtuneError(f"--shard must look like i/N (e.g. 0/4) or auto, got {text!r}")
  return _checked(int(head), int(tail), "")
