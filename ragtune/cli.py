"""`ragtune` command line: thin wrappers over the importable steps.

  ragtune sweep shapes/smoke.yaml     shapes -> checked, timed candidates (results/<device>/records.jsonl)
  ragtune verify results/<device>     re-check the best configs on fresh, adversarial inputs
  ragtune export-lut results/<device> write the kernels LUT (<device>.json)
  ragtune show results/<device>       tables of the results
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import kernels
from ragtune.errors import RagtuneError

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
  return wrapper


def _split(values: Optional[list[str]]) -> Optional[list[str]]:
  if not values:
    return None
  return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _resolve_interpret(interpret: Optional[bool]) -> bool:
  import jax

  on_cpu = jax.default_backend() == "cpu"
  if interpret is None:
    interpret = on_cpu
  if interpret and on_cpu:
    err_console.print("[yellow]notice:[/] no accelerator: Pallas kernels run in interpret mode on the CPU. "
                      "Timings are of the interpreter, NOT GPU/TPU timings; use them to test the pipeline only.")
  return interpret


def _summary_table(summaries, ceil=None) -> Table:
  from ragtune import ceilings as ceilings_mod
  from ragtune.report import short_config

  t = Table(title="sweep summary (best correct config per problem)")
  for col in ("op", "backend", "dtype", escape("shape [m,k]x[g,k,n]"), "best ms", "TF/s", "% peak", "xla ms",
              "default ms", "vs xla", "vs default", "statuses", "best config"):
    t.add_column(col, overflow="fold")
  for s in summaries:
    p, b = s.problem, s.best
    fmt = lambda v: f"{v * 1e3:.4g}" if v else "-"
    pct, bound = ceilings_mod.pct_of_peak(b, ceil or {}) if b else (None, "")
    statuses = " ".join(f"{k}={v}" for k, v in sorted(s.counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    t.add_row(p.op, p.backend, p.dtype, p.shape_label, fmt(b["time_s"]) if b else "-",
              f"{b['tflops']:.4g}" if b else "-", f"{pct:.3g}% {bound}" if pct is not None else "-",
              fmt(s.baselines.get("xla")), fmt(s.baselines.get("default")),
              f"{s.baselines['xla'] / b['time_s']:.2f}x" if b and s.baselines.get("xla") else "-",
              f"{s.baselines['default'] / b['time_s']:.2f}x" if b and s.baselines.get("default") else "-",
              statuses or "-", short_config(b["candidate"]) if b else s.why)
  return t


def _parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
  if text is None:
    return None
  i, sep, n = text.partition("/")
  if not sep or not i.strip().isdigit() or not n.strip().isdigit():
    raise RagtuneError(f"--shard must look like i/N (e.g. 0/4), got {text!r}")
  return int(i), int(n)


def _load_problems(shapes_file: Path, ops, backend, shard: Optional[str]):
  from ragtune import shapes as shapes_mod
  from ragtune import sweep as sweep_mod

  spec = shapes_mod.load_shape_set(shapes_file)
  problems = shapes_mod.expand(spec, ops=_split(ops), backends=_split(backend))
  sh = _parse_shard(shard)
  if sh:
    problems = sweep_mod.shard(problems, *sh)
  return spec, problems


def _plan_table(rows) -> Table:
  t = Table(title="plan")
  for col in ("op", "backend", "dtype", escape("shape [m,k]x[g,k,n]"), "candidates", "rows done", "rows to do", "est. time"):
    t.add_column(col, overflow="fold")
  for r in rows:
    p = r["problem"]
    est = f"{r['est_s']:.0f}s" if r["est_s"] is not None else "-"
    t.add_row(p.op, p.backend, p.dtype, p.shape_label, str(r["candidates"]), str(r["done"]), str(r["todo"]), est)
  return t


def _print_plan(rows) -> None:
  console.print(_plan_table(rows))
  todo = sum(r["todo"] for r in rows)
  known = [r["est_s"] for r in rows if r["est_s"] is not None]
  est = (f", about {sum(known):.0f}s" + (" (partial estimate)" if len(known) < len(rows) else "") if known
         else " (no time estimate until some rows are recorded)")
  console.print(f"{len(rows)} problems, {todo} measurements to do (candidates and the 2 baselines per problem){est}")


def _results_dir(out: Optional[Path]) -> Path:
  from ragtune import sweep as sweep_mod

  return out or Path("results") / kernels.device_slug(sweep_mod.probe_devices()["device_kind"])


@app.command(epilog="Example: ragtune sweep shapes/smoke.yaml --budget 12 --timeout 60")
@user_errors
def sweep(
    shapes_file: Path = typer.Argument(..., help="Shape set YAML (see README: 'Shape sets')."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Results folder [default: results/<device-slug>/]."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="Backends (repeat or comma-separate): pallas_gpu, pallas_tpu, xla. Default: the file's."),
    ops: Optional[list[str]] = typer.Option(None, "--ops", help="Ops to tune: fwd, dlhs, drhs. Default: the file's."),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, help="Candidates per problem (default config first)."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="Staged search: candidates timed per problem (coarse design, then one-knob neighbours of the best)."),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="Seconds for one candidate (compile + check + time); past it the worker is killed."),
    interpret: Optional[bool] = typer.Option(None, "--interpret/--no-interpret", help="Pallas interpret mode [default: on when there is no accelerator]."),
    devices: Optional[str] = typer.Option(None, "--devices", help="Local devices, one worker each: all, a count N, or indices like 0,2,5 [default: all GPUs; 1 otherwise]."),
    shard: Optional[str] = typer.Option(None, "--shard", help="Take shard i of N of the problems (i/N, 0-based), e.g. a SLURM array task."),
    builder: str = typer.Option("ragtune.measure:build_op", "--builder", help="module:function building the op, (problem, backend, config, interpret) -> callable; importable by the workers."),
    wait: bool = typer.Option(False, "--wait", help="If another sweep holds the results folder, wait for it instead of stopping."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (as `ragtune plan`) and exit."),
):
  """Measure the candidate configs of every problem in SHAPES_FILE in worker processes:
  compile, check against jax.lax.ragged_dot, time. Rows are appended as they finish;
  rerunning resumes."""
  from ragtune import ceilings as ceilings_mod
  from ragtune import progress as progress_mod
  from ragtune import sweep as sweep_mod
  from ragtune import worker as worker_mod

  spec, problems = _load_problems(shapes_file, ops, backend, shard)
  try:
    worker_mod.load_builder(builder)  # fail here, once, rather than in every worker
  except ValueError as e:
    raise RagtuneError(str(e)) from None
  out_dir = _results_dir(out)
  opts = sweep_mod.SweepOptions(out_dir=out_dir, max_candidates=max_candidates or spec.max_candidates,
                                timeout_s=timeout, builder=builder, budget=budget, wait_for_lock=wait)
  if dry_run:
    _print_plan(sweep_mod.plan(problems, opts))
    return
  info = sweep_mod.probe_devices()  # in a child: the parent never opens the accelerator
  sweep_mod.keep_parent_off_device(info["platform"])
  opts.platform = info["platform"]
  # One process owns a TPU host's chips, and the CPU is one device: one worker there.
  opts.devices = sweep_mod.parse_devices(devices or ("all" if opts.platform == "gpu" else "1"), info["count"])
  opts.interpret = opts.platform == "cpu" if interpret is None else interpret
  if opts.interpret and opts.platform == "cpu":
    err_console.print("[yellow]notice:[/] no accelerator: Pallas kernels run in interpret mode on the CPU. "
                      "Timings are of the interpreter, NOT GPU/TPU timings; use them to test the pipeline only.")
  opts.lut = sweep_mod.find_lut(info["device_kind"]) if budget else None
  if opts.platform == "cpu" and opts.interpret:
    for warning in sweep_mod.cpu_timeout_warnings(problems, opts):
      err_console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
  console.print(f"{len(problems)} problems from {shapes_file} -> {out_dir}/records.jsonl "
                f"({len(opts.devices)} worker{'s' if len(opts.devices) > 1 else ''}, devices {list(opts.devices)})",
                markup=False, highlight=False)
  t0 = time.perf_counter()

  def stop(signum, frame):  # SIGTERM (a batch scheduler's time limit) ends the sweep as Ctrl-C does
    raise KeyboardInterrupt

  in_main = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, stop) if in_main else None
  waiting = lambda holder: err_console.print(f"waiting for the sweep that holds {out_dir} ({holder})",
                                             markup=False, highlight=False, soft_wrap=True)
  try:
    if console.is_terminal:
      columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[best]}")]
      with Progress(*columns, console=console, transient=False) as bar:
        summaries = sweep_mod.run_sweep(problems, opts, progress_mod.RichProgress(bar, console), waiting)
    else:
      plain = progress_mod.PlainProgress(lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
      summaries = sweep_mod.run_sweep(problems, opts, plain, waiting)
  except KeyboardInterrupt:
    err_console.print(f"interrupted: every finished row is kept in {out_dir / 'records.jsonl'}; resume with the "
                      f"same command, e.g. ragtune sweep {shapes_file} -o {out_dir}", markup=False, highlight=False,
                      soft_wrap=True)
    raise typer.Exit(130)
  finally:
    if in_main:
      signal.signal(signal.SIGTERM, previous)
  console.print(_summary_table(summaries, ceilings_mod.load([out_dir])))
  console.print(f"sweep done in {time.perf_counter() - t0:.1f}s; records: {out_dir / 'records.jsonl'}")
  missing = [s for s in summaries if s.best is None and s.problem.backend != "xla"]
  if missing:
    err_console.print(f"warning: {len(missing)} problem(s) have no correct candidate; they will be missing from the LUT",
                      markup=False, highlight=False)


@app.command(epilog="Example: ragtune plan shapes/smoke.yaml --budget 12")
@user_errors
def plan(
    shapes_file: Path = typer.Argument(..., help="Shape set YAML."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Results folder [default: results/<device-slug>/]."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="Backends, as for sweep."),
    ops: Optional[list[str]] = typer.Option(None, "--ops", help="Ops, as for sweep."),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, help="As for sweep."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="As for sweep."),
    shard: Optional[str] = typer.Option(None, "--shard", help="As for sweep: i/N."),
):
  """List each problem with its candidate count after pruning, how many are done in the
  results folder, and an estimated time once some timings exist. Runs nothing on a device."""
  from ragtune import sweep as sweep_mod

  spec, problems = _load_problems(shapes_file, ops, backend, shard)
  opts = sweep_mod.SweepOptions(out_dir=_results_dir(out),
                                max_candidates=max_candidates or spec.max_candidates, budget=budget)
  _print_plan(sweep_mod.plan(problems, opts))


@app.command(epilog="Example: ragtune verify results/cpu   (or a LUT file: ragtune verify kernels/luts/nvidia-h100-80gb-hbm3.json)")
@user_errors
def verify(
    target: Optional[Path] = typer.Argument(None, help="LUT file, or results folder [default: results/<device-slug>/]."),
    seed: int = typer.Option(1234, "--seed", help="Seed for the fresh inputs and group-size draws."),
    force: bool = typer.Option(False, "--force", help="Verify a LUT made for another device kind."),
    interpret: Optional[bool] = typer.Option(None, "--interpret/--no-interpret", help="[default: on when there is no accelerator]."),
    full: bool = typer.Option(False, "--full", help="Print the numerics report of every draw, not only the worst."),
):
  """Re-run every LUT entry on fresh inputs and adversarial group sizes (empty groups,
  sum < m, one group holding all rows); exit 1 if any fails."""
  from ragtune import sweep as sweep_mod
  from ragtune import verify as verify_mod

  target = target or sweep_mod.default_results_dir()
  lut = verify_mod.load_lut_for_verify(target)
  here = kernels.current_device_kind()
  if lut.device_kind != here and not force:
    raise RagtuneError(f"{target}: LUT was tuned on {lut.device_kind!r} but this device is {here!r} "
                       "(use --force to check its numerics here anyway)")
  interp = _resolve_interpret(interpret)
  entries = lut.entries()
  if not entries:
    raise RagtuneError(f"{target}: LUT has no entries")
  failures, t0 = 0, time.perf_counter()
  for i, e in enumerate(entries, 1):
    res = verify_mod.verify_entry(e, seed=seed, interpret=interp)
    failures += not res.passed
    tag = "[green]PASS[/]" if res.passed else "[red]FAIL[/]"
    console.print(f"[{i}/{len(entries)}] {tag} {e.op} {e.backend} {e.dtype} m={e.m} k={e.k} n={e.n} g={e.g} "
                  f"config={e.config.to_dict() if e.config else None}")
    for d in res.draws:
      line = d.numerics.summary() if d.numerics else f"ERROR {d.error}"
      console.print(f"    {d.draw:<13} {line}", markup=False, highlight=False)
    shown = res.draws if full else [res.worst()]
    for d in shown:
      if d.numerics is not None:
        console.print(f"  report for draw '{d.draw}' (group_sizes={d.group_sizes[:8]}{'...' if len(d.group_sizes) > 8 else ''}):",
                      markup=False, highlight=False)
        console.print(str(d.numerics), markup=False, highlight=False)
  console.print(f"verified {len(entries)} entries in {time.perf_counter() - t0:.1f}s: "
                f"{len(entries) - failures} passed, {failures} failed")
  if failures:
    raise typer.Exit(1)


@app.command("export-lut", epilog="Example: ragtune export-lut results/nvidia-h100-80gb-hbm3 results/nvidia-h200 -o kernels/luts/")
@user_errors
def export_lut(
    dirs: Optional[list[Path]] = typer.Argument(None, help="Results folders to merge [default: results/<device-slug>/]."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="LUT .json file (one device) or folder (<device-slug>.json each) [default: the first results folder]."),
    fmt: str = typer.Option("json", "--format", help="json, or python (also writes an importable <slug>.py)."),
):
  """Pick the fastest correct config per (device, op, backend, dtype, shape) and write the LUT atomically."""
  from ragtune import export, store
  from ragtune import sweep as sweep_mod

  dirs = dirs or [sweep_mod.default_results_dir()]
  luts = export.build_luts(store.load_results(dirs))
  written = export.write_luts(luts, output or dirs[0], fmt)
  for kind, lut in sorted(luts.items()):
    console.print(f"{kind}: {len(lut)} entries")
  for p in written:
    console.print(f"wrote {p}")


def _show_frames(dirs: list[Path], all_rows: bool):
  from ragtune import ceilings, report, store

  rows = store.load_results(dirs)
  return report.compact_rows(rows) if all_rows else report.show_best(rows, ceilings.load(dirs))


@app.command(epilog="Example: ragtune show results/cpu --all")
@user_errors
def show(
    dirs: Optional[list[Path]] = typer.Argument(None, help="Results folders [default: results/<device-slug>/]."),
    all_rows: bool = typer.Option(False, "--all", help="Every measured row, not only the best per problem."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Also write the table as CSV."),
):
  """Print results as a table (best per problem by default)."""
  import pandas as pd

  from ragtune import sweep as sweep_mod
  from ragtune.report import csv_text
  from ragtune.store import write_atomic

  df = _show_frames(dirs or [sweep_mod.default_results_dir()], all_rows)
  with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 160,
                         "display.max_colwidth", 200, "display.float_format", "{:.4g}".format):
    console.print(df.to_string(index=False), markup=False, highlight=False, soft_wrap=True)
  if csv:
    write_atomic(csv, csv_text(df))
    console.print(f"wrote {csv}")


@app.command(epilog="Example: ragtune report results/cpu -o report/")
@user_errors
def report(
    dirs: Optional[list[Path]] = typer.Argument(None, help="Results folders [default: results/<device-slug>/]."),
    output: Path = typer.Option(Path("."), "--output", "-o", help="Folder for best.csv, rows.csv, the PNG plots and report.md."),
):
  """Write best.csv (best per problem with baselines), rows.csv (every row), PNG plots
  (TF/s per problem, roofline, candidate times; needs the [report] extra) and report.md."""
  from ragtune import ceilings, plots, store
  from ragtune import report as report_mod
  from ragtune import sweep as sweep_mod
  from ragtune.store import write_atomic

  dirs = dirs or [sweep_mod.default_results_dir()]
  rows = store.load_results(dirs)
  ceil = ceilings.load(dirs)
  for name, df in (("best.csv", report_mod.best_frame(rows, ceil)), ("rows.csv", report_mod.rows_frame(rows))):
    write_atomic(output / name, report_mod.csv_text(df))
    console.print(f"wrote {output / name} ({len(df)} rows)")
  for path in plots.write_report(rows, ceil, output):
    console.print(f"wrote {path}")


def main():
  app(prog_name="ragtune")


if __name__ == "__main__":
  sys.exit(main())
