"""`ragtune` command line: thin wrappers over the importable steps.

  ragtune sweep shapes/smoke.yaml     shapes -> checked, timed candidates (results/<device>/records.jsonl)
  ragtune verify results/<device>     re-check the best configs on fresh, adversarial inputs
  ragtune export-lut results/<device> write the kernels LUT (<device>.json)
  ragtune show results/<device>       tables of the results
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import kernels
from ragtune import limits, paths
from ragtune.errors import RagtuneError

# Typer writes a required argument as {NAME} in usage lines and types as <list[Path]>.
_TYPE_WORDS = {"path": "(a path)", "list[Path]": "(paths)", "list[str]": "(text, repeatable)", "int": "(an integer)",
               "int range": "(an integer)", "float": "(a number)", "float range": "(a number)", "text": "(text)"}


class _Command(typer.core.TyperCommand):
  """Usage lines that name arguments (SHAPES_FILE), and types in words."""

  def collect_usage_pieces(self, ctx):
    return [re.sub(r"^\{(.*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

  def get_help(self, ctx) -> str:
    return re.sub(r"<([^<>\s][^<>]*)>", lambda m: _TYPE_WORDS.get(m.group(1), m.group(0)), super().get_help(ctx))


# Every example runs as pasted on a fresh clone (tests/test_help_examples.py runs them). The
# sweep makes results/<device-slug>/, the default folder of the other commands; rerun, it
# resumes and measures nothing again.
_SWEEP_EXAMPLE = "ragtune sweep shapes/smoke.yaml --op fwd --shape 96,64,80 --max-candidates 2"


def _example(then: str) -> str:
  cmd = f"{_SWEEP_EXAMPLE} && {then}" if then else _SWEEP_EXAMPLE
  return f"\b\nExample: {cmd}"  # \b: click keeps the line unwrapped, so it can be pasted


app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Tune grouped-matmul (ragged_dot) kernels per device and export lookup tables.")
# Logs and CI are not terminals; don't squeeze tables into rich's 80-column default there.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _fail(msg: str, code: int = 2):
  err_console.print(f"error: {msg}", markup=False, highlight=False, soft_wrap=True)
  raise typer.Exit(code)


def user_errors(fn):
  """Turn expected failures into one line on stderr and a non-zero exit, no traceback."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except (RagtuneError, kernels.LutError) as e:
      _fail(str(e))
    except OSError as e:  # a path problem no check caught: still one line
      _fail(f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}")
  return wrapper


def _split(values: Optional[list[str]]) -> Optional[list[str]]:
  if not values:
    return None
  return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _split_shapes(values: Optional[list[str]]) -> Optional[list[str]]:
  """--shape M,K,N values; several may also be given in one, separated by spaces or ';'."""
  if not values:
    return None
  return [v.strip() for item in values for v in item.replace(";", " ").split() if v.strip()]


def _resolve_interpret(interpret: Optional[bool]) -> bool:
  import jax

  on_cpu = jax.default_backend() == "cpu"
  if interpret is None:
    interpret = on_cpu
  if interpret and on_cpu:
    err_console.print("[yellow]notice:[/] no accelerator: Pallas kernels run in interpret mode on the CPU. "
                      "Timings are of the interpreter, NOT GPU/TPU timings; use them to test the pipeline only.")
  return interpret


class _RichProgress:
  def __init__(self, progress: Progress):
    self.progress, self.task, self.current = progress, None, ""

  def start(self, total: int, skipped: int) -> None:
    if skipped:
      console.print(f"resuming: {skipped} measurements already in the results file are skipped")
    self.task = self.progress.add_task("sweep", total=total, best="")

  def problem(self, p) -> None:
    self.current = f"{p.op} {p.backend} {p.dtype} {p.shape_label}"
    self.progress.update(self.task, description=self.current, best="")

  def row(self, row: dict[str, Any], best: dict[str, Any] | None) -> None:
    text = f"best {best['time_s'] * 1e3:.3f} ms ({best['tflops']:.2f} TF/s)" if best else ""
    self.progress.update(self.task, advance=1, best=text)


def _summary_table(summaries) -> Table:
  t = Table(title="sweep summary (best correct config per problem)")
  for col in ("op", "backend", "dtype", escape("shape [m,k]x[g,k,n]"), "best ms", "TF/s", "xla ms", "default ms",
              "vs xla", "vs default", "ok", "failed", "best config"):
    t.add_column(col, overflow="fold")
  from ragtune.report import short_config

  for s in summaries:
    p, b = s.problem, s.best
    fmt = lambda v: f"{v * 1e3:.3f}" if v else "-"
    failed = sum(v for k, v in s.counts.items() if k != "ok")
    t.add_row(p.op, p.backend, p.dtype, p.shape_label, fmt(b["time_s"]) if b else "-",
              f"{b['tflops']:.2f}" if b else "-", fmt(s.baselines.get("xla")), fmt(s.baselines.get("default")),
              f"{s.baselines['xla'] / b['time_s']:.2f}x" if b and s.baselines.get("xla") else "-",
              f"{s.baselines['default'] / b['time_s']:.2f}x" if b and s.baselines.get("default") else "-",
              str(s.counts.get("ok", 0)), str(failed), short_config(b["candidate"]) if b else "none correct")
  return t


@app.command(cls=_Command, epilog=_example(""))
@user_errors
def sweep(
    shapes_file: Path = typer.Argument(..., metavar="SHAPES_FILE", help="Shape set YAML (see README: 'Shape sets')."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="DIR", help="Results folder [default: results/<device-slug>/]."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", metavar="BACKEND", help="Backends (repeat or comma-separate): pallas_gpu, pallas_tpu, xla. Default: the file's."),
    ops: Optional[list[str]] = typer.Option(None, "--ops", "--op", metavar="OP", help="Ops to tune: fwd, dlhs, drhs. Default: the file's."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", metavar="M,K,N", help="Only problems of this forward shape M,K,N (repeatable)."),
    model: Optional[list[str]] = typer.Option(None, "--model", metavar="NAME", help="Only problems of this model preset (repeatable), e.g. mixtral-8x7b."),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, metavar="N", help="Candidates per problem (default config first)."),
    timeout: float = typer.Option(120.0, "--timeout", min=1, metavar="SECONDS", help="Seconds allowed to compile, and to run, one candidate."),
    interpret: Optional[bool] = typer.Option(None, "--interpret/--no-interpret", help="Pallas interpret mode [default: on when there is no accelerator]."),
    jobs: int = typer.Option(max(1, min(8, os.cpu_count() or 1)), "--jobs", "-j", min=1, metavar="N", help="Parallel compiles."),
):
  """Measure every candidate config of every problem in SHAPES_FILE: compile, check against
  jax.lax.ragged_dot, time. Rows are appended as they finish; rerunning resumes."""
  from ragtune import shapes as shapes_mod
  from ragtune import sweep as sweep_mod

  spec = shapes_mod.load_shape_set(shapes_file)
  problems = shapes_mod.expand(spec, ops=_split(ops), backends=_split(backend))
  problems = shapes_mod.select(problems, shapes=_split_shapes(shape), models=_split(model))
  limits.check_fits(problems)
  out = paths.writable_dir(out or sweep_mod.default_results_dir(), "the results folder")
  if (out / "records.jsonl").is_dir():
    raise RagtuneError(f"{out / 'records.jsonl'}: is a folder, but the results file must be a file")
  opts = sweep_mod.SweepOptions(out_dir=out,
                                max_candidates=max_candidates or spec.max_candidates, timeout_s=timeout,
                                interpret=_resolve_interpret(interpret), jobs=jobs)
  console.print(f"{len(problems)} problems from {shapes_file} -> {opts.out_dir}/records.jsonl")
  t0 = time.perf_counter()
  columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
             TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[best]}")]
  with Progress(*columns, console=console, transient=False) as progress:
    summaries = sweep_mod.run_sweep(problems, opts, _RichProgress(progress))
  console.print(_summary_table(summaries))
  console.print(f"sweep done in {time.perf_counter() - t0:.1f}s; records: {opts.out_dir / 'records.jsonl'}")
  if any(s.best is None for s in summaries if s.problem.backend != "xla"):
    err_console.print("warning: some problems have no correct candidate; they will be missing from the LUT")


@app.command(cls=_Command, epilog=_example("ragtune verify --op fwd"))
@user_errors
def verify(
    target: Optional[Path] = typer.Argument(None, metavar="LUT_OR_DIR", help="LUT file, or results folder [default: results/<device-slug>/]."),
    seed: int = typer.Option(1234, "--seed", metavar="SEED", help="Seed for the fresh inputs and group-size draws."),
    force: bool = typer.Option(False, "--force", help="Verify a LUT made for another device kind."),
    interpret: Optional[bool] = typer.Option(None, "--interpret/--no-interpret", help="[default: on when there is no accelerator]."),
    full: bool = typer.Option(False, "--full", help="Print the numerics report of every draw, not only of failures."),
    op: Optional[list[str]] = typer.Option(None, "--op", metavar="OP", help="Only entries of these ops: fwd, dlhs, drhs (repeat or comma-separate)."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", metavar="M,K,N", help="Only entries of this forward shape M,K,N (repeatable)."),
    timeout: float = typer.Option(300.0, "--timeout", min=1, metavar="SECONDS", help="Seconds allowed per draw (compile and run); a draw that overruns is killed and fails as 'timeout'."),
):
  """Re-run every LUT entry on fresh inputs and adversarial group sizes (empty groups,
  sum < m, one group holding all rows). One line per entry; the numerics report of
  failures (of every draw with --full). Exit 1 if any fails."""
  from ragtune import shapes as shapes_mod
  from ragtune import sweep as sweep_mod
  from ragtune import verify as verify_mod

  target = target or sweep_mod.default_results_dir()
  lut = verify_mod.load_lut_for_verify(target)
  here = kernels.current_device_kind()
  if lut.device_kind != here and not force:
    raise RagtuneError(f"{target}: LUT was tuned on {lut.device_kind!r} but this device is {here!r} "
                       "(use --force to check its numerics here anyway)")
  entries = lut.entries()
  if not entries:
    raise RagtuneError(f"{target}: LUT has no entries")
  entries = shapes_mod.select(entries, ops=_split(op), shapes=_split_shapes(shape), what="LUT entry")
  limits.check_fits(entries)
  interp = _resolve_interpret(interpret)
  failures, t0 = 0, time.perf_counter()
  columns = [TextColumn("verify {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
             TextColumn("eta"), TimeRemainingColumn()]
  # A live bar in a terminal; in a log, the per-entry lines are the progress.
  with verify_mod.DrawRunner(timeout) as runner, \
       Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
    task = progress.add_task("", total=len(entries))
    for i, e in enumerate(entries, 1):
      progress.update(task, description=f"{e.op} {e.backend} m={e.m} k={e.k} n={e.n} g={e.g}")
      res = verify_mod.verify_entry(e, seed=seed, interpret=interp, runner=runner)
      failures += not res.passed
      console.print(verify_mod.entry_line(i, len(entries), res), markup=False, highlight=False)
      for line in verify_mod.entry_report(res, full):
        console.print(line, markup=False, highlight=False)
      progress.advance(task)
  console.print(f"verified {len(entries)} entries in {time.perf_counter() - t0:.1f}s: "
                f"{len(entries) - failures} passed, {failures} failed")
  if failures:
    raise typer.Exit(1)


@app.command("export-lut", cls=_Command, epilog=_example("ragtune export-lut -o luts/"))
@user_errors
def export_lut(
    dirs: Optional[list[Path]] = typer.Argument(None, metavar="DIR", help="Results folders to merge [default: results/<device-slug>/]."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE_OR_DIR", help="LUT .json file (one device) or folder (<device-slug>.json each) [default: the first results folder]."),
    fmt: str = typer.Option("json", "--format", metavar="FORMAT", help="json, or python (also writes an importable <slug>.py)."),
):
  """Pick the fastest correct config per (device, op, backend, dtype, shape) and write the LUT atomically."""
  from ragtune import export, store
  from ragtune import sweep as sweep_mod

  dirs = paths.existing_dirs(dirs or [sweep_mod.default_results_dir()])
  output = output or dirs[0]
  if output.suffix == ".json":
    paths.writable_file(output, "the LUT file")
  else:
    paths.writable_dir(output, "the LUT folder (-o FILE.json for one file)")
  luts = export.build_luts(store.load_results(dirs))
  written = export.write_luts(luts, output, fmt)
  for kind, lut in sorted(luts.items()):
    console.print(f"{kind}: {len(lut)} entries")
  for p in written:
    console.print(f"wrote {p}")


def _show_frames(dirs: list[Path], all_rows: bool):
  from ragtune import report, store

  rows = store.load_results(dirs)
  return report.rows_frame(rows) if all_rows else report.best_frame(rows)


@app.command(cls=_Command, epilog=_example("ragtune show --all"))
@user_errors
def show(
    dirs: Optional[list[Path]] = typer.Argument(None, metavar="DIR", help="Results folders [default: results/<device-slug>/]."),
    all_rows: bool = typer.Option(False, "--all", help="Every measured row, not only the best per problem."),
    csv: Optional[Path] = typer.Option(None, "--csv", metavar="FILE", help="Also write the table as CSV."),
):
  """Print results as a table (best per problem by default)."""
  import pandas as pd

  from ragtune import sweep as sweep_mod
  from ragtune.store import write_atomic

  if csv:
    paths.writable_file(csv, "the --csv file")
  df = _show_frames(paths.existing_dirs(dirs or [sweep_mod.default_results_dir()]), all_rows)
  with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 250,
                         "display.float_format", "{:.4g}".format):
    console.print(df.to_string(index=False), markup=False, highlight=False, soft_wrap=True)
  if csv:
    write_atomic(csv, df.to_csv(index=False))
    console.print(f"wrote {csv}")


@app.command(cls=_Command, epilog=_example("ragtune report -o report/"))
@user_errors
def report(
    dirs: Optional[list[Path]] = typer.Argument(None, metavar="DIR", help="Results folders [default: results/<device-slug>/]."),
    output: Path = typer.Option(Path("."), "--output", "-o", metavar="DIR", help="Folder for best.csv and rows.csv."),
):
  """Write best.csv (best per problem with baselines) and rows.csv (every row)."""
  from ragtune import report as report_mod
  from ragtune import store
  from ragtune import sweep as sweep_mod
  from ragtune.store import write_atomic

  paths.writable_dir(output, "the report folder")
  rows = store.load_results(paths.existing_dirs(dirs or [sweep_mod.default_results_dir()]))
  for name, df in (("best.csv", report_mod.best_frame(rows)), ("rows.csv", report_mod.rows_frame(rows))):
    write_atomic(output / name, df.to_csv(index=False))
    console.print(f"wrote {output / name} ({len(df)} rows)")


def main():
  app(prog_name="ragtune")


if __name__ == "__main__":
  sys.exit(main())
