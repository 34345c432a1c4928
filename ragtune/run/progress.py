"""Sweep progress: a rich bar in a terminal, plain timestamped lines everywhere else.

Logs (CI, nohup, SLURM) get a line per finished problem and at least one every
`every_s` seconds, each with elapsed time, ETA and the best so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.progress import (
  BarColumn,
  MofNCompleteColumn,
  ProgressColumn,
  TextColumn,
  TimeElapsedColumn,
  TimeRemainingColumn,
)
from rich.table import Column

from ragtune.records.store import Record
from ragtune.words import count


def _fmt_s(s: float | None) -> str:
  if s is None:
    return "?"
  s = int(round(s))
  return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def best_text(best: Record | None) -> str:
  return f"best {best.time_s * 1e3:.4g} ms ({best.tflops:.4g} TF/s)" if best else "no correct candidate yet"


class PlainProgress:
  """Line-oriented progress. `clock` and `write` are injectable for tests."""

  def __init__(self, write: Callable[[str], None], every_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
    self.write, self.every_s, self.clock = write, every_s, clock
    self.total = self.done = 0
    self.t0 = self.last = clock()
    self.label, self.best = "", None

  def _eta(self) -> float | None:
    if not self.done:
      return None
    return (self.clock() - self.t0) / self.done * max(0, self.total - self.done)

  def _line(self, what: str) -> None:
    self.last = self.clock()
    self.write(f"[{_fmt_s(self.clock() - self.t0)} elapsed, eta {_fmt_s(self._eta())}] {self.done}/{self.total} {what}")

  def start(self, total: int, skipped: int) -> None:
    self.total, self.t0, self.last = total, self.clock(), self.clock()
    if skipped:
      self.write(f"resuming: skipping {count(skipped, 'measurement')} already in the results file")

  def problem(self, p) -> None:
    self.label, self.best = f"{p.op} {p.backend} {p.dtype} {p.shape_label}", None

  def row(self, row: Record, best: Record | None) -> None:
    self.done += 1
    self.best = best
    self.tick()

  def tick(self) -> None:
    """Called on every row and by the sweep's heartbeat: a line if every_s have passed."""
    if self.clock() - self.last >= self.every_s:
      self._line(f"{self.label}: {best_text(self.best)}")

  def problem_done(self, s) -> None:
    p = s.problem
    counts = " ".join(f"{k}={v}" for k, v in sorted(s.counts.items()))
    self._line(
      f"done {p.op} {p.backend} {p.dtype} {p.shape_label}: {best_text(s.best) if s.best else s.why} [{counts}]"
    )


class _FitText(TextColumn):
  """Text cut to its column with an ellipsis, the column the one that narrows when the line
  is too long: elapsed time and ETA (no_wrap) then keep their width."""

  def __init__(self, fmt: str):
    super().__init__(fmt, table_column=Column(no_wrap=False, overflow="ellipsis"))

  def render(self, task):
    text = super().render(task)
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def bar_columns(description: str = "{task.description}", best: bool = True) -> list[ProgressColumn]:
  """The live bar of sweep and verify: what runs, the bar, done/total, elapsed, ETA and (for a
  sweep) the best so far. In a narrow terminal the description and the best text are cut,
  never the times."""
  return [
    _FitText(description),
    BarColumn(bar_width=20),
    MofNCompleteColumn(),
    TimeElapsedColumn(),
    TextColumn("eta"),
    TimeRemainingColumn(),
    *([_FitText("{task.fields[best]}")] if best else []),
  ]


class RichProgress:
  def __init__(self, progress, console):
    self.progress, self.console, self.task = progress, console, None

  def start(self, total: int, skipped: int) -> None:
    if skipped:
      self.console.print(f"resuming: skipping {count(skipped, 'measurement')} already in the results file")
    self.task = self.progress.add_task("sweep", total=total, best="")

  def problem(self, p) -> None:
    self.progress.update(self.task, description=f"{p.op} {p.backend} {p.dtype} {p.shape_label}", best="")

  def row(self, row: Record, best: Record | None) -> None:
    self.progress.update(self.task, advance=1, best=best_text(best) if best else "")

  def tick(self) -> None:
    pass

  def problem_done(self, s) -> None:
    pass
