"""`ragtune` command line: thin wrappers over the importable steps.

  ragtune sweep shapes/smoke.yaml     shapes -> checked, timed candidates (results/<device>/records.jsonl)
  ragtune verify results/<device>     re-check the best configs on fresh, adversarial inputs
  ragtune export-lut results/<device> write the kernels LUT (<device>.json)
  ragtune show results/<device>       tables of the results
"""

from __future__ import annotations

import functools
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import kernels
from ragtune import limits, paths
from ragtune.errors import RagtuneError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Tune grouped-matmul (ragged_dot) kernels per device and export lookup tables.")
# Logs and CI are not terminals; don't squeeze tables into rich's 80-column default there.
# No emoji codes: problem labels such as "deepseek-v3:up:tokens=64" must print as written.
console = Console(width=None if sys.stdout.isatty() else 200, emoji=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200, emoji=False)


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


def _resolve_interpret(interpret: Optional[bool], platform: str) -> bool:
  on_cpu = platform == "cpu"
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
              "default ms", "vs xla", "vs default", "winner", "statuses", "best config"):
    t.add_column(col, overflow="fold")
  for s in summaries:
    p, b = s.problem, s.best
    fmt = lambda v: f"{v * 1e3:.4g}" if v else "-"
    pct, bound = ceilings_mod.pct_of_peak(b, ceil or {}) if b else (None, "")
    statuses = " ".join(f"{k}={v}" for k, v in sorted(s.counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    base = s.baselines
    t.add_row(p.op, p.backend, p.dtype, p.shape_label, fmt(b.time_s) if b else "-",
              f"{b.tflops:.4g}" if b else "-", f"{pct:.3g}% {bound}" if pct is not None else "-",
              fmt(base["xla"]), fmt(base["default"]),
              f"{base['xla'] / b.time_s:.2f}x" if b and base["xla"] else "-",
              f"{base['default'] / b.time_s:.2f}x" if b and base["default"] else "-",
              s.winner, statuses or "-", short_config(b.config) if b else s.why)
  return t


def _parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
  if text is None:
    return None
  i, sep, n = text.partition("/")
  if not sep or not i.strip().isdigit() or not n.strip().isdigit():
    raise RagtuneError(f"--shard must look like i/N (e.g. 0/4), got {text!r}")
  return int(i), int(n)


def _load_problems(shapes_file: Path, ops, backend, shard: Optional[str], shape=None, model=None):
  from ragtune import shapes as shapes_mod
  from ragtune.run import plan as plan_mod

  spec = shapes_mod.load_shape_set(shapes_file)
  problems = shapes_mod.expand(spec, ops=_split(ops), backends=_split(backend))
  problems = shapes_mod.select(problems, shapes=_split_shapes(shape), models=_split(model))
  sh = _parse_shard(shard)
  if sh:
    problems = plan_mod.shard(problems, *sh)
  return spec, problems


def _plan_table(rows) -> Table:
  t = Table(title="plan")
  pruned = any(r.get("rejected") for r in rows)  # by a deviceless compile (plan --target)
  cols = ("op", "backend", "dtype", escape("shape [m,k]x[g,k,n]"), "candidates") + \
      (("compile-rejected",) if pruned else ()) + ("rows done", "rows to do", "est. time")
  for col in cols:
    t.add_column(col, overflow="fold")
  for r in rows:
    p = r["problem"]
    est = f"{r['est_s']:.0f}s" if r["est_s"] is not None else "-"
    t.add_row(p.op, p.backend, p.dtype, p.shape_label, str(r["candidates"]),
              *((str(r.get("rejected", 0)),) if pruned else ()), str(r["done"]), str(r["todo"]), est)
  return t


def _print_plan(rows) -> None:
  console.print(_plan_table(rows))
  todo = sum(r["todo"] for r in rows)
  known = [r["est_s"] for r in rows if r["est_s"] is not None]
  est = (f", about {sum(known):.0f}s" + (" (partial estimate)" if len(known) < len(rows) else "") if known
         else " (no time estimate until some rows are recorded)")
  console.print(f"{len(rows)} problems, {todo} measurements to do (candidates and the 2 baselines per problem){est}")


def _device() -> dict:
  """This host's device (asked of a child process); the parent keeps off the accelerator, so
  the workers get all of its memory."""
  from ragtune.run import devices

  info = devices.probe_devices()
  devices.keep_parent_off_device(info["platform"])
  return info


def _fitting(problems: list, memory: Optional[int]) -> list:
  """The problems that fit the device's memory; a warning for each that does not (an error if none does)."""
  fit, reasons = limits.split_by_memory(problems, memory)
  if not fit and reasons:
    raise RagtuneError(reasons[0] + (f" (and {len(reasons) - 1} more problems)" if len(reasons) > 1 else ""))
  shown = 5
  for reason in reasons[:shown]:
    err_console.print(f"warning: skipped: {reason}", markup=False, highlight=False, soft_wrap=True)
  if len(reasons) > shown:
    err_console.print(f"warning: skipped {len(reasons) - shown} more problems too big for this device "
                      f"({len(reasons)} in all; {len(fit)} remain)", markup=False, highlight=False, soft_wrap=True)
  return fit


def _results_dir(out: Optional[Path] = None) -> Path:
  from ragtune.run import devices

  return out or devices.default_results_dir()


@app.command(cls=_Command, epilog=_example(""))
@user_errors
def sweep(
    shapes_file: Path = typer.Argument(..., metavar="SHAPES_FILE", help="Shape set YAML (see README: 'Shape sets')."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="DIR", help="Results folder [default: results/<device-slug>/]."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", metavar="BACKEND", help=f"Backends (repeat or comma-separate): {', '.join(kernels.registry.NAMES)}. Default: the file's."),
    ops: Optional[list[str]] = typer.Option(None, "--ops", "--op", metavar="OP", help="Ops to tune: fwd, dlhs, drhs. Default: the file's."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", metavar="M,K,N", help="Only problems of this forward shape M,K,N (repeatable)."),
    model: Optional[list[str]] = typer.Option(None, "--model", metavar="NAME", help="Only problems of this model preset (repeatable), e.g. mixtral-8x7b."),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, metavar="N", help="Candidates per problem (default config first)."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, metavar="N", help="Staged search: candidates timed per problem (coarse design, then one-knob neighbours of the best)."),
    timeout: float = typer.Option(120.0, "--timeout", min=1, metavar="SECONDS", help="Seconds for one candidate (compile + check + time); past it the worker is killed."),
    interpret: Optional[bool] = typer.Option(None, "--interpret/--no-interpret", help="Pallas interpret mode [default: on when there is no accelerator]."),
    devices: Optional[str] = typer.Option(None, "--devices", metavar="all|N|I,J,...", help="Local devices, one worker each: all, a count N, or indices like 0,2,5 [default: all GPUs; 1 otherwise]."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="I/N", help="Take shard i of N of the problems (i/N, 0-based), e.g. a SLURM array task."),
    builder: str = typer.Option("ragtune.measure:build_op", "--builder", metavar="MODULE:FUNCTION", help="module:function building the op, (problem, backend, config, interpret) -> callable; importable by the workers."),
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
  from ragtune.run import devices as devices_mod
  from ragtune.run import plan as plan_mod
  from ragtune.run import pool

  spec, problems = _load_problems(shapes_file, ops, backend, shard, shape, model)
  limits.check_fits(problems)  # indexing now; memory once the device is known
  try:
    worker_mod.load_builder(builder)  # fail here, once, rather than in every worker
  except ValueError as e:
    raise RagtuneError(str(e)) from None
  out_dir = paths.writable_dir(_results_dir(out), "the results folder")
  if (out_dir / "records.jsonl").is_dir():
    raise RagtuneError(f"{out_dir / 'records.jsonl'}: is a folder, but the results file must be a file")
  info = _device()
  problems = _fitting(problems, info.get("memory_bytes"))
  opts = sweep_mod.SweepOptions(out_dir=out_dir, max_candidates=max_candidates or spec.max_candidates,
                                timeout_s=timeout, builder=builder, budget=budget, wait_for_lock=wait,
                                device_kind=info["device_kind"])
  if dry_run:
    _print_plan(plan_mod.plan(problems, opts))
    return
  opts.platform = info["platform"]
  # One process owns a TPU host's chips, and the CPU is one device: one worker there.
  opts.devices = devices_mod.parse_devices(devices or ("all" if opts.platform == "gpu" else "1"), info["count"])
  opts.interpret = opts.platform == "cpu" if interpret is None else interpret
  if opts.interpret and opts.platform == "cpu":
    err_console.print("[yellow]notice:[/] no accelerator: Pallas kernels run in interpret mode on the CPU. "
                      "Timings are of the interpreter, NOT GPU/TPU timings; use them to test the pipeline only.")
  opts.lut = plan_mod.find_lut(info["device_kind"]) if budget else None
  if opts.platform == "cpu" and opts.interpret:
    for warning in plan_mod.cpu_timeout_warnings(problems, opts):
      err_console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
  console.print(f"{len(problems)} problems from {shapes_file} -> {out_dir}/records.jsonl "
                f"({len(opts.devices)} worker{'s' if len(opts.devices) > 1 else ''}, devices {list(opts.devices)})",
                markup=False, highlight=False)
  t0 = time.perf_counter()

  # SIGTERM (a batch scheduler's time limit) ends the sweep as Ctrl-C does, at a safe point.
  in_main = threading.current_thread() is threading.main_thread()
  stops = (signal.SIGINT, signal.SIGTERM)
  previous = {sig: signal.signal(sig, pool.stop_handler) for sig in stops} if in_main else {}
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
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  console.print(_summary_table(summaries, ceilings_mod.load([out_dir])))
  console.print(f"sweep done in {time.perf_counter() - t0:.1f}s; records: {out_dir / 'records.jsonl'}")
  missing = [s for s in summaries if s.best is None and s.problem.backend in kernels.registry.tunable()]
  if missing:
    err_console.print(f"warning: {len(missing)} problem(s) have no correct candidate; they will be missing from the LUT",
                      markup=False, highlight=False)


@app.command(cls=_Command, epilog="\b\nExample: ragtune plan shapes/smoke.yaml --budget 12")
@user_errors
def plan(
    shapes_file: Path = typer.Argument(..., metavar="SHAPES_FILE", help="Shape set YAML."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="DIR", help="Results folder [default: results/<device-slug>/]."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", metavar="BACKEND", help="Backends, as for sweep."),
    ops: Optional[list[str]] = typer.Option(None, "--ops", "--op", metavar="OP", help="Ops, as for sweep."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", metavar="M,K,N", help="As for sweep."),
    model: Optional[list[str]] = typer.Option(None, "--model", metavar="NAME", help="As for sweep."),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, metavar="N", help="As for sweep."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, metavar="N", help="As for sweep."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="I/N", help="As for sweep: i/N."),
    target: Optional[str] = typer.Option(
        None, "--target", metavar="GPU",
        help="Compile every candidate deviceless for this GPU first (h100, h200, b200, or a "
             "GpuTargetConfigProto file), in parallel; a sweep on that device then skips what fails, "
             "spills or overflows. Needs the gpu-compile extra."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, metavar="N",
                                       help="Compile processes with --target [default: all cores]."),
):
  """List each problem with its candidate count after pruning, how many are done in the
  results folder, and an estimated time once some timings exist. Measures nothing (a child
  process only asks which device this is). With --target, first compiles every candidate
  for that GPU with XLA's real compiler on this host and records the outcome in
  DIR/compile.jsonl."""
  from ragtune import prune
  from ragtune import sweep as sweep_mod
  from ragtune.run import plan as plan_mod

  spec, problems = _load_problems(shapes_file, ops, backend, shard, shape, model)
  limits.check_fits(problems)
  info = prune.target_facts(target) if target else _device()
  problems = _fitting(problems, info.get("memory_bytes"))
  out_dir = out or Path("results") / kernels.device_slug(info["device_kind"])
  if target:
    out_dir = paths.writable_dir(out_dir, "the results folder")
    start = time.monotonic()
    try:
      counts = prune.run(problems, target, out_dir, jobs)
    except KeyboardInterrupt:
      err_console.print(f"interrupted: every finished compile is kept in {out_dir / prune.COMPILE_RECORDS}; "
                        f"the same command goes on from there", markup=False, highlight=False, soft_wrap=True)
      raise typer.Exit(130)
    total = sum(counts.values())
    bad = total - counts.get("ok", 0)
    err_console.print(f"compiled {total} new candidates for {info['device_kind']} in {time.monotonic() - start:.0f}s: "
                      + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing new")
                      + f"; a sweep there skips {bad} of them ({out_dir / prune.COMPILE_RECORDS})",
                      markup=False, highlight=False, soft_wrap=True)
  opts = sweep_mod.SweepOptions(out_dir=out_dir, max_candidates=max_candidates or spec.max_candidates,
                                budget=budget, device_kind=info["device_kind"])
  _print_plan(plan_mod.plan(problems, opts))


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
  from ragtune import verify as verify_mod

  info = _device()
  here = info["device_kind"]
  target = _results_dir(target)
  lut = verify_mod.load_lut_for_verify(target, here)
  if lut.device_kind != here and not force:
    raise RagtuneError(f"{target}: LUT was tuned on {lut.device_kind!r} but this device is {here!r} "
                       "(use --force to check its numerics here anyway)")
  entries = lut.entries()
  if not entries:
    raise RagtuneError(f"{target}: LUT has no entries")
  entries = shapes_mod.select(entries, ops=_split(op), shapes=_split_shapes(shape), what="LUT entry")
  limits.check_fits(entries, memory=info.get("memory_bytes"))
  interp = _resolve_interpret(interpret, info["platform"])
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


@app.command("compile", cls=_Command,
             epilog="\b\nExample: ragtune compile shapes/anchors.yaml --target h100 --shape 8192,4096,14336 --op fwd")
@user_errors
def compile_cmd(
    shapes_file: Path = typer.Argument(..., metavar="SHAPES_FILE", help="Shape set YAML."),
    target: str = typer.Option("h100", "--target", metavar="GPU",
                               help="h100, h200, b200, or a GpuTargetConfigProto file."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", metavar="BACKEND", help="As for sweep."),
    ops: Optional[list[str]] = typer.Option(None, "--ops", "--op", metavar="OP", help="As for sweep."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", metavar="M,K,N", help="As for sweep."),
    model: Optional[list[str]] = typer.Option(None, "--model", metavar="NAME", help="As for sweep."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, metavar="N", help="Compile processes [default: all cores]."),
):
  """Compile each problem's default config for a GPU with XLA's real compiler, on this host
  (no GPU needed), and print what each kernel is built from: outcome, registers, spilled
  bytes, shared memory, MMA and copy instructions, compile time. Needs the gpu-compile
  extra. Says nothing of speed."""
  from ragtune import aot, prune
  from ragtune.report import short_config

  _, problems = _load_problems(shapes_file, ops, backend, None, shape, model)
  kind = prune.target_facts(target)["device_kind"]
  items = [(p, kernels.registry.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=kind))
           for p in problems if p.backend in prune.GPU_BACKENDS]
  if not items:
    raise RagtuneError(f"{shapes_file}: no problem of a GPU backend ({', '.join(prune.GPU_BACKENDS)}) selected")
  reports = dict(prune.compile_many(target, items, jobs))
  t = Table(title=f"deviceless compile for {kind} (default configs)")
  for col in ("op", "backend", escape("shape [m,k]x[g,k,n]"), "config", "outcome", "regs", "spill B", "smem KiB",
              "mma", "copy", "s"):
    t.add_column(col, overflow="fold")
  for i, (p, cfg) in enumerate(items):
    rep = reports[i]
    ks = rep["kernels"] or [{}]
    for kr in ks:
      smem = kr.get("smem_bytes")
      t.add_row(p.op, p.backend, p.shape_label, short_config(cfg.to_dict()),
                rep["outcome"] if rep["outcome"] == aot.OK else f"{rep['outcome']}: {rep['error'][:120]}",
                str(kr.get("registers", "-")), str(kr.get("spill_bytes", "-")),
                "-" if smem is None else f"{smem / 1024:.0f}" + ("*" if kr.get("smem_source") == "config" else ""),
                kr.get("mma", "-"), kr.get("copy", "-"), f"{rep['compile_s']:.1f}")
  console.print(t)
  console.print("smem: XLA's launch figure; * the config's allocation (Mosaic GPU sets its own at launch).",
                markup=False, highlight=False)
  bad = sum(rep["outcome"] != aot.OK for rep in reports.values())
  if bad:
    err_console.print(f"{bad} of {len(items)} did not compile clean", markup=False, highlight=False)
    raise typer.Exit(1)


@app.command("export-lut", cls=_Command, epilog=_example("ragtune export-lut -o luts/"))
@user_errors
def export_lut(
    dirs: Optional[list[Path]] = typer.Argument(None, metavar="DIR", help="Results folders to merge [default: results/<device-slug>/]."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE_OR_DIR", help="LUT .json file (one device) or folder (<device-slug>.json each) [default: the first results folder]."),
    fmt: str = typer.Option("json", "--format", metavar="FORMAT", help="json, or python (also writes an importable <slug>.py)."),
):
  """Pick the fastest correct config per (device, op, backend, dtype, shape), plus an xla
  entry where XLA's own op was fastest, and write the LUT atomically."""
  from ragtune import export, store

  dirs = paths.existing_dirs(dirs or [_results_dir()])
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
  from ragtune import ceilings, report, store

  rows = store.load_results(dirs)
  return report.compact_rows(rows) if all_rows else report.show_best(rows, ceilings.load(dirs))


@app.command(cls=_Command, epilog=_example("ragtune show --all"))
@user_errors
def show(
    dirs: Optional[list[Path]] = typer.Argument(None, metavar="DIR", help="Results folders [default: results/<device-slug>/]."),
    all_rows: bool = typer.Option(False, "--all", help="Every measured row, not only the best per problem."),
    csv: Optional[Path] = typer.Option(None, "--csv", metavar="FILE", help="Also write the table as CSV."),
):
  """Print results as a table (best per problem by default)."""
  import pandas as pd

  from ragtune.report import csv_text
  from ragtune.store import write_atomic

  if csv:
    paths.writable_file(csv, "the --csv file")
  df = _show_frames(paths.existing_dirs(dirs or [_results_dir()]), all_rows)
  with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 160,
                         "display.max_colwidth", 200, "display.float_format", "{:.4g}".format):
    console.print(df.to_string(index=False), markup=False, highlight=False, soft_wrap=True)
  if csv:
    write_atomic(csv, csv_text(df))
    console.print(f"wrote {csv}")


@app.command(cls=_Command, epilog=_example("ragtune report -o report/"))
@user_errors
def report(
    dirs: Optional[list[Path]] = typer.Argument(None, metavar="DIR", help="Results folders [default: results/<device-slug>/]."),
    output: Path = typer.Option(Path("."), "--output", "-o", metavar="DIR", help="Folder for best.csv, rows.csv, the PNG plots and report.md."),
):
  """Write best.csv (best per problem with baselines), rows.csv (every row), PNG plots
  (TF/s per problem, roofline, candidate times; needs the [report] extra) and report.md."""
  from ragtune import ceilings, plots, store
  from ragtune import report as report_mod
  from ragtune.store import write_atomic

  paths.writable_dir(output, "the report folder")
  dirs = paths.existing_dirs(dirs or [_results_dir()])
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
