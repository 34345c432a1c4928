"""`ragtune` command line: thin wrappers over the importable steps.

ragtune sweep shapes/smoke.yaml     shapes -> checked, timed candidates (results/<device>/records.jsonl)
ragtune verify results/<device>     re-check the best configs on fresh, adversarial inputs
ragtune export-lut results/<device> write the kernels LUT (<device>.json)
ragtune show results/<device>       tables of the results
ragtune bench shapes/anchors.yaml   the LUT's choice against defaults, XLA, tokamax and dense, on this device
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

import kernels
from kernels import gpus
from ragtune import paths, stop
from ragtune.errors import RagtuneError
from ragtune.filekind import Kind
from ragtune.problems import limits
from ragtune.run import prepare
from ragtune.run.options import DEFAULT_BUILDER, DEFAULT_TIMEOUT_S
from ragtune.run.resume import SweepFlags
from ragtune.run.shard import EmptyShard
from ragtune.words import count

# The --target names: the named GPUs (kernels/gpu_facts/, docs/gpu.md) and the TPUs.
GPU_TARGETS = ", ".join(gpus.gpus())
TPU_TARGETS = "v4, v5e, v5p, v6e, v7x"

# The click that Typer runs on: newer Typer carries its own copy (typer._click), older Typer uses click.
_click = getattr(typer.core, "_click", None) or importlib.import_module("click")
# `ragtune` alone prints the help by raising this (click >= 8.2); it stays as it is.
_HELP_ERRORS = tuple(e for e in [getattr(_click.exceptions, "NoArgsIsHelpError", None)] if e is not None)
# Logs and CI are not terminals; don't squeeze tables into rich's 80-column default there.
# No emoji codes: problem labels such as "deepseek-v3:up:tokens=64" must print as written.
console = Console(width=None if sys.stdout.isatty() else 200, emoji=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200, emoji=False)


# Typer writes a required argument as {NAME} in usage lines and types as <list[Path]>.
_TYPE_WORDS = {
  "path": "(a path)",
  "list[Path]": "(paths)",
  "list[str]": "(text, repeatable)",
  "int": "(an integer)",
  "int range": "(an integer)",
  "float": "(a number)",
  "float range": "(a number)",
  "text": "(text)",
}


class _UsageLine(_click.exceptions.UsageError):
  """A usage error shown as the one `error:` line that all bad input gets (exit 2), without the usage block."""

  def show(self, file=None) -> None:
    _print(f"error: {self.format_message()}", err=True)


def _given(args: list[str], opts: list[str]) -> str | None:
  """The value given on the command line for an option (any of its names), if any."""
  for i, arg in enumerate(args):
    for opt in opts:
      if arg == opt and i + 1 < len(args):
        return args[i + 1]
      if arg.startswith(f"{opt}="):
        return arg.removeprefix(f"{opt}=")
  return None


@contextlib.contextmanager
def _usage_line(args: list[str]):
  """Turn click's usage errors (a value out of range, an unknown option or command, a
  missing argument) into _UsageLine: "error: --max-candidates 0: Input should be greater
  than or equal to 1 (see 'ragtune sweep --help')". args: the command line, as given."""
  args = list(args)  # click's parser consumes the list it is given
  try:
    yield
  except (_UsageLine, *_HELP_ERRORS):
    raise
  except _click.exceptions.UsageError as e:
    msg, param = e.format_message(), getattr(e, "param", None)
    bad_value = isinstance(e, _click.exceptions.BadParameter) and not isinstance(e, _click.exceptions.MissingParameter)
    if bad_value and param is not None and param.param_type_name == "option":
      value = _given(args, param.opts)
      name = param.opts[0] if value is None else shlex.join([param.opts[0], value])
      msg = f"{name}: {e.message.removeprefix('Value error, ')}"
    hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
    raise _UsageLine(msg + hint, e.ctx) from None


def _empty_value(params: list, args: list[str]) -> str | None:
  """What the user gave as an empty string (an unset shell variable: -o "$OUT"), if anything:
  "--out ''" or "SHAPES_FILE ''". An empty path is no folder of its own, it is the current
  one, and an empty --op is no op; no option or argument means anything by it."""
  takes_value = {o: p for p in params if p.param_type_name == "option" and not p.is_flag for o in p.opts}
  positional = [p for p in params if p.param_type_name == "argument"]
  i, n, options = 0, 0, True
  while i < len(args):
    arg, value = args[i], None
    name, eq, rest = arg.partition("=")
    if options and arg in takes_value:
      value, i = (args[i + 1] if i + 1 < len(args) else None), i + 2
    elif options and eq and name in takes_value:
      arg, value, i = name, rest, i + 1
    elif options and arg.startswith("-") and arg.strip("-"):
      i += 1
      continue
    elif options and arg == "--":
      i, options = i + 1, False
      continue
    else:  # an argument: the n-th, or one more of a last that takes many
      p = (
        positional[n] if n < len(positional) else positional[-1] if positional and positional[-1].nargs == -1 else None
      )
      if not arg.strip():
        return f"{p.metavar or p.name.upper() if p is not None else 'an extra argument'} {shlex.quote(arg)}"
      i, n = i + 1, n + 1
      continue
    if value is not None and not value.strip():
      return f"{arg} {shlex.quote(value)}"
  return None


class _Group(typer.core.TyperGroup):
  def parse_args(self, ctx, args):
    with _usage_line(args):
      return super().parse_args(ctx, args)

  def resolve_command(self, ctx, args):
    with _usage_line(args):
      return super().resolve_command(ctx, args)


app = typer.Typer(
  cls=_Group,
  add_completion=False,
  no_args_is_help=True,
  rich_markup_mode=None,
  help="Tune grouped-matmul (ragged_dot) kernels per device and export lookup tables.",
)


def _print_version(value: bool) -> None:
  if value:
    from ragtune import provenance

    _print(str(provenance.host()))
    raise typer.Exit()


@app.callback()
def _options(
  version: Annotated[
    bool,
    typer.Option(
      "--version",
      "-V",
      callback=_print_version,
      is_eager=True,
      help="Print the versions of ragtune (and its git commit in a checkout), jax and jaxlib, and exit.",
    ),
  ] = False,
) -> None:
  pass


class _Command(typer.core.TyperCommand):
  """Usage lines that name arguments (SHAPES_FILE), types in words, usage errors in one line."""

  def parse_args(self, ctx, args):
    if (empty := _empty_value(self.get_params(ctx), args)) is not None:
      raise _UsageLine(
        f"{empty}: empty (an unset shell variable?); give a value (see '{ctx.command_path} --help')", ctx
      )
    with _usage_line(args):
      return super().parse_args(ctx, args)

  def collect_usage_pieces(self, ctx):
    return [re.sub(r"^\{(.*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

  def get_help(self, ctx) -> str:
    return re.sub(r"<([^<>\s][^<>]*)>", lambda m: _TYPE_WORDS.get(m.group(1), m.group(0)), super().get_help(ctx))

  def invoke(self, ctx):
    """Ctrl-C or SIGTERM anywhere in a command: one line and exit 130 or 143 (a command's
    _stoppable says more). A signal whose KeyboardInterrupt was dropped, or came out of an
    import or a compiled callback as another error, still counts."""
    try:
      try:
        with stop.handlers():
          result = super().invoke(ctx)
          stop.check()
          return result
      except Exception:
        stop.check()
        raise
    except KeyboardInterrupt as e:
      _print("interrupted", err=True)
      raise typer.Exit(stop.exit_code(e)) from None


# Every example runs as pasted on a fresh clone (tests/ragtune/test_help_examples.py runs them). The
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
    except EmptyShard as e:  # a task with nothing to do: said, exit 0
      _print(str(e))
    except (RagtuneError, kernels.LutError) as e:
      stop.check()  # an error a stop caused is the stop's one line, not this one too
      _fail(str(e))
    except OSError as e:  # a path problem no check caught: still one line
      stop.check()
      _fail(f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}")

  return wrapper


def _split(values: list[str] | None) -> list[str] | None:
  if not values:
    return None
  return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _split_shapes(values: list[str] | None) -> list[str] | None:
  """--shape M,K,N values; several may also be given in one, separated by spaces or ';'."""
  if not values:
    return None
  return [v.strip() for item in values for v in item.replace(";", " ").split() if v.strip()]


def _interpreted_notice(records: list) -> None:
  """The sweep's notice, for tables of rows measured in interpret mode."""
  where = sorted({r.origin for r in records if r.interpret})
  if where:
    err_console.print(
      f"[yellow]notice:[/] rows of {escape(', '.join(where))} were measured in Pallas interpret mode. "
      f"{prepare.INTERPRETER_TIMINGS}",
      highlight=False,
    )


def _warn_skipped(skipped: dict[Path, list[int]], cut: dict[Path, int]) -> None:
  from ragtune.records import store

  for path, lines in skipped.items():
    _print(f"warning: {store.skipped_text(path, lines)}", err=True)
  for path, line in cut.items():
    _print(f"warning: {store.cut_text(path, line)}", err=True)


def _shard_gaps(dirs: list[Path], *, refuse: bool = False) -> None:
  """Shards of a sharded sweep with no records in these folders (prepare.missing_shards): a
  warning each; with refuse, an error (export-lut: a LUT from the rest would lack them)."""
  gaps = prepare.missing_shards(dirs)
  if gaps and refuse:
    raise RagtuneError(
      gaps[0].text("a LUT from the others would lack {their} problems")
      + "; or pass --partial to export the others anyway"
    )
  for gap in gaps:
    _print(f"warning: {gap.text('{their} problems are left out')}", err=True)


def _verify_selection(target, compile_for, force, op, shape, skip_bad_lines: bool):
  """verify's LUT and entries (ragtune.lut.verify.select), with what its records' reading skipped said."""
  from ragtune.lut import verify as verify_mod

  skipped: dict[Path, list[int]] | None = {} if skip_bad_lines else None
  cut: dict[Path, int] = {}
  sel = verify_mod.select(
    target,
    compile_for,
    force=force,
    ops=_split(op),
    shapes=_split_shapes(shape),
    skipped=skipped,
    cut=cut,
    device=prepare.device,
  )
  _warn_skipped(skipped or {}, cut)
  if sel.lut.source is None:  # the LUT of the folder's records, not a file: its shards count
    _shard_gaps([sel.where])
  return sel


def _records(dirs: list[Path], skip_bad_lines: bool, *, partial: bool = True) -> list:
  """The records of the results folders; lines that are not records stop the command, or
  with skip_bad_lines are skipped with a warning per file; a last line cut off mid-write
  is skipped with a warning. Shards of a sharded sweep with no records there: a warning, or
  unless partial an error."""
  from ragtune.records import store

  _shard_gaps(dirs, refuse=not partial)
  skipped: dict[Path, list[int]] | None = {} if skip_bad_lines else None
  cut: dict[Path, int] = {}
  records = store.load_results(dirs, skipped, cut)
  _warn_skipped(skipped or {}, cut)
  return records


# --- options several commands share -------------------------------------------------------

ShapesFile = Annotated[Path, typer.Argument(metavar="SHAPES_FILE", help="Shape set YAML (see docs/shapes.md).")]
OutDir = Annotated[
  Path | None, typer.Option("--out", "-o", metavar="DIR", help="Results folder [default: results/<device-slug>/].")
]
ResultsDirs = Annotated[
  list[Path] | None, typer.Argument(metavar="DIR", help="Results folders [default: results/<device-slug>/].")
]
Backends = Annotated[
  list[str] | None,
  typer.Option(
    "--backend",
    metavar="BACKEND",
    help=f"Backends (repeat or comma-separate): {', '.join(kernels.registry.NAMES)}. Default: the file's.",
  ),
]
Ops = Annotated[
  list[str] | None,
  typer.Option("--ops", "--op", metavar="OP", help="Ops to tune: fwd, dlhs, drhs. Default: the file's."),
]
Shapes = Annotated[
  list[str] | None,
  typer.Option(
    "--shape",
    metavar="M,K,N",
    help="Only problems whose forward shape [m,k]x[g,k,n] (as tables print it) has these m,k,n (repeatable).",
  ),
]
Models = Annotated[
  list[str] | None,
  typer.Option("--model", metavar="NAME", help="Only problems of this model preset (repeatable), e.g. mixtral-8x7b."),
]
MaxCandidates = Annotated[
  int | None,
  typer.Option(
    "--max-candidates", min=1, metavar="N", help="Candidates per problem (default config first); not with --budget."
  ),
]
Budget = Annotated[
  int | None,
  typer.Option(
    "--budget",
    min=1,
    metavar="N",
    help="Staged search: candidates timed per problem (coarse design, then one-knob neighbours of the best); "
    "not with --max-candidates.",
  ),
]
Shard = Annotated[
  str | None,
  typer.Option(
    "--shard", metavar="I/N", help="Take shard i of N of the problems (i/N, 0-based), e.g. a SLURM array task."
  ),
]
Jobs = Annotated[
  int | None, typer.Option("--jobs", "-j", min=1, metavar="N", help="Compile processes [default: all cores].")
]
Interpret = Annotated[
  bool | None,
  typer.Option("--interpret/--no-interpret", help="Pallas interpret mode [default: on when there is no accelerator]."),
]

Force = Annotated[
  bool,
  typer.Option(
    "--force", help="Replace the output even where the file there is not one this command wrote (refused otherwise)."
  ),
]
SkipBadLines = Annotated[
  bool,
  typer.Option(
    "--skip-bad-lines",
    help="Read past lines of records.jsonl that are not records (a warning counts them per file) instead of stopping.",
  ),
]


class LutFormat(enum.StrEnum):
  json = "json"
  python = "python"


def _print(text: str, *, err: bool = False) -> None:
  """A plain line (no markup, no highlighting), wrapped only by the terminal."""
  (err_console if err else console).print(text, markup=False, highlight=False, soft_wrap=True)


def _say_err(text: str) -> None:
  """A stage's notices and warnings (ragtune.run.prepare's say): notices in yellow, on stderr."""
  head, sep, rest = text.partition(": ")
  if head == "notice" and sep:
    return err_console.print(f"[yellow]notice:[/] {escape(rest)}", highlight=False, soft_wrap=True)
  _print(text, err=True)


def _selection(ops, backend, shard, shape, model) -> prepare.Selection:
  return prepare.Selection(
    tuple(_split(ops) or ()),
    tuple(_split(backend) or ()),
    tuple(_split_shapes(shape) or ()),
    tuple(_split(model) or ()),
    shard,
  )


def _print_plan(rows, cost) -> None:
  from ragtune.cli import views

  console.print(views.plan_table(rows))
  for line in views.plan_summary(rows, cost):
    _print(line)


@contextlib.contextmanager
def _stoppable(message: str | Callable[[], str]):
  """Ctrl-C or SIGTERM (a batch scheduler's stop) stops the work (ragtune/stop.py), prints
  message (or what it returns then) and exits with status 130 or 143."""
  try:
    with stop.handlers():
      yield
  except KeyboardInterrupt as e:
    _print(message if isinstance(message, str) else message(), err=True)
    raise typer.Exit(stop.exit_code(e)) from None


def _run_sweep(run: prepare.SweepPlan):
  """run_sweep with a live bar in a terminal, or plain progress lines in a log. The plan is
  printed once the sweep holds the folder: with --wait, what the sweep it waited for recorded
  meanwhile is done."""
  from ragtune.cli import views
  from ragtune.run import progress, sweep

  problems, opts, waited = run.problems, run.opts, []

  def waiting(holder: str) -> None:
    waited.append(holder)
    _print(f"waiting for the sweep that holds {opts.out_dir} ({holder})", err=True)

  def on_state(finished: bool) -> None:
    if not finished:  # under the lock, the folder's rows read
      for line in views.plan_summary(run.replan() if waited else run.rows, run.cost):
        _print(line)
    run.save(finished)

  if not console.is_terminal:
    return sweep.run_sweep(problems, opts, progress.PlainProgress(_print), waiting, on_state)
  with Progress(*progress.bar_columns(), console=console, transient=False) as bar:
    return sweep.run_sweep(problems, opts, progress.RichProgress(bar, console), waiting, on_state)


def _print_sweep_end(summaries, done: str, strict: bool) -> None:
  """The summary table and the done line; with --strict, exit 1 if a problem of a tunable
  backend has no correct candidate."""
  from ragtune.cli import views

  console.print(views.summary_table(summaries))
  _print(done)
  missing = [s for s in summaries if s.best is None and s.problem.backend in kernels.registry.tunable()]
  if missing:
    have = "has" if len(missing) == 1 else "have"
    msg = f"{count(len(missing), 'problem')} {have} no correct candidate; they will be missing from the LUT"
    if strict:
      _fail(
        f"--strict: {msg} (the first: {missing[0].problem.op} {missing[0].problem.backend} "
        f"{missing[0].problem.shape_label}, {missing[0].why})",
        code=1,
      )
    _print(f"warning: {msg}", err=True)
  for s in missing[:5]:
    _print(f"warning: {s.problem.op} {s.problem.backend} {s.problem.dtype} {s.problem.shape_label}: {s.why}", err=True)


@app.command(cls=_Command, epilog=_example(""))
@user_errors
def sweep(
  ctx: typer.Context,
  shapes_file: ShapesFile,
  out: OutDir = None,
  backend: Backends = None,
  ops: Ops = None,
  shape: Shapes = None,
  model: Models = None,
  max_candidates: MaxCandidates = None,
  budget: Budget = None,
  timeout: Annotated[
    float,
    typer.Option(
      "--timeout",
      min=1,
      metavar="SECONDS",
      help="Seconds for one candidate (compile + check + time); past it the worker is killed.",
    ),
  ] = DEFAULT_TIMEOUT_S,
  interpret: Interpret = None,
  devices: Annotated[
    str | None,
    typer.Option(
      "--devices",
      metavar="all|N|I,J,...",
      help="Local devices, one worker each: all, a count N, or indices like 0,2,5 [default: all GPUs; 1 otherwise].",
    ),
  ] = None,
  shard: Shard = None,
  builder: Annotated[
    str,
    typer.Option(
      "--builder",
      metavar="MODULE:FUNCTION",
      help="module:function building the op, (problem, backend, config, interpret) -> callable; "
      "importable by the workers.",
    ),
  ] = DEFAULT_BUILDER,
  wait: Annotated[
    bool, typer.Option("--wait", help="If another sweep holds the results folder, wait for it instead of stopping.")
  ] = False,
  dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (as `ragtune plan`) and exit.")] = False,
  defaults: Annotated[
    bool,
    typer.Option(
      "--defaults",
      help="Use the shapes file's and the built-in defaults for the options not given, not the options "
      "stored for this file in the results folder.",
    ),
  ] = False,
  skip_bad_lines: SkipBadLines = False,
  strict: Annotated[
    bool,
    typer.Option(
      "--strict",
      help="Refuse to start (exit 2) when candidates will likely overrun --timeout, and exit 1 when a "
      "problem ends with no correct candidate.",
    ),
  ] = False,
  retry_failed: Annotated[
    bool,
    typer.Option(
      "--retry-failed",
      help="Measure again the rows that failed for a reason other than the candidate: an environment "
      "error (a missing module, no GPU for compiled kernels), a timeout or a crash of the worker; their new "
      "records replace the old. Not stored with the sweep's options.",
    ),
  ] = False,
):
  """Measure the candidate configs of every problem in SHAPES_FILE in worker processes:
  compile, check against jax.lax.ragged_dot, time. Rows are appended as they finish. The
  bare command (SHAPES_FILE and -o only) runs the folder's sweep of the file again with its
  options (its unfinished bare sweep first; a run with other options never replaces it): an
  unfinished one resumes, a finished one has nothing to do. It starts with
  an estimate of its time. An error of the environment rather than of a candidate (a missing
  module, interpret mode off on a CPU) stops it before anything is recorded for it."""

  from_cli = lambda name: ctx.get_parameter_source(name) == _click.core.ParameterSource.COMMANDLINE
  given = SweepFlags(  # as given: None or () where an option is left to its default
    ops=tuple(_split(ops) or ()),
    backends=tuple(_split(backend) or ()),
    shapes=tuple(_split_shapes(shape) or ()),
    models=tuple(_split(model) or ()),
    max_candidates=max_candidates,
    budget=budget,
    timeout_s=timeout if from_cli("timeout") else None,
    interpret=interpret,
    devices=devices,
    shard=shard,
    builder=builder if from_cli("builder") else None,
    defaults=defaults,
  )
  run = prepare.sweep(
    shapes_file,
    out,
    given,
    wait=wait,
    skip_bad_lines=skip_bad_lines,
    start=not dry_run,
    say=_say_err,
    retry_failed=retry_failed,
  )
  if dry_run:
    _print_plan(run.rows, run.cost)
    return prepare.check_timeout(run.rows, run.opts.timeout_s, False, _say_err)
  if not run.todo:  # the stored rows' summary, as if it had just run
    run.mark_complete()
    return _print_sweep_end(run.summaries(), run.complete_text(), strict)
  prepare.check_timeout(run.rows, run.opts.timeout_s, strict, _say_err)
  devs = list(run.opts.devices)
  _print(
    f"{count(len(run.problems), 'problem')} from {shapes_file} -> {run.opts.out_dir}/records.jsonl "
    f"({count(len(devs), 'worker')}, devices {devs})"
  )
  t0 = time.perf_counter()
  kept = f"interrupted: every finished row is kept in {run.opts.out_dir / 'records.jsonl'}; resume with: "
  with _stoppable(kept + run.command()):
    summaries = _run_sweep(run)
  out_dir = run.opts.out_dir
  seconds = time.perf_counter() - t0
  done = (
    f"sweep done in {seconds:.1f}s; records: {out_dir / 'records.jsonl'}; configs and details: ragtune show {out_dir}"
  )
  _print_sweep_end(summaries, done, strict)


def _compile_for(target: str, problems: list, out_dir: Path, jobs: int | None, kind: str) -> None:
  """plan --target: every candidate compiled deviceless into DIR/compile.jsonl, with a line of counts."""
  from ragtune.candidates import prune
  from ragtune.deviceless import aot

  start = time.monotonic()
  try:
    counts = prune.run(problems, target, out_dir, jobs)
  except KeyboardInterrupt as e:
    _print(
      f"interrupted: every finished compile is kept in {out_dir / prune.COMPILE_RECORDS}; "
      f"the same command goes on from there",
      err=True,
    )
    raise typer.Exit(stop.exit_code(e)) from None
  total = sum(counts.values())
  bad = total - sum(counts.get(o, 0) for o in aot.NO_VERDICT_AGAINST)
  _print(
    f"compiled {total} new candidates for {kind} in {time.monotonic() - start:.0f}s: "
    + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing new")
    + f"; a sweep there skips {bad} of them ({out_dir / prune.COMPILE_RECORDS}"
    + ("; per problem: the plan's compile-rejected column)" if bad else ")"),
    err=True,
  )


@app.command(cls=_Command, epilog="\b\nExample: ragtune plan shapes/smoke.yaml --budget 12")
@user_errors
def plan(
  shapes_file: ShapesFile,
  out: OutDir = None,
  backend: Backends = None,
  ops: Ops = None,
  shape: Shapes = None,
  model: Models = None,
  max_candidates: MaxCandidates = None,
  budget: Budget = None,
  shard: Shard = None,
  target: Annotated[
    str | None,
    typer.Option(
      "--target",
      metavar="DEVICE",
      help=f"Compile every candidate deviceless for this GPU or TPU first ({GPU_TARGETS}, a "
      f"GpuTargetConfigProto file; {TPU_TARGETS}), in parallel; a sweep on that device then "
      "skips what fails, spills or overflows shared memory, VMEM or HBM. Needs the gpu-compile "
      "or the tpu extra.",
    ),
  ] = None,
  jobs: Annotated[
    int | None,
    typer.Option("--jobs", "-j", min=1, metavar="N", help="Compile processes with --target [default: all cores]."),
  ] = None,
  skip_bad_lines: SkipBadLines = False,
):
  """List each problem with its candidate count after pruning, how many are done in the
  results folder, and an estimate of the time left: from its recorded rows, or else from a
  model (on a CPU, of the kernels' interpreter, calibrated once per host by timing a tiny
  kernel for a few seconds). Runs no sweep (a child process only asks which device this
  is). With --target, first compiles every candidate for that GPU or TPU with XLA's real
  compiler on this host and records the outcome in DIR/compile.jsonl; a shapes file that
  lists no backend of the target's then plans the target's own backends."""
  compile_all = lambda problems, out_dir, kind: _compile_for(target, problems, out_dir, jobs, kind)
  rows, cost = prepare.plan(
    shapes_file,
    out,
    _selection(ops, backend, shard, shape, model),
    target=target,
    max_candidates=max_candidates,
    budget=budget,
    skip_bad_lines=skip_bad_lines,
    compile_all=compile_all,
    say=_say_err,
  )
  _print_plan(rows, cost)


def _verify_entries(entries: list, *, seed: int, interpret: bool, timeout: float, full: bool) -> int:
  """Each entry's draws in a killable child; one line per entry (and its numerics report
  where it failed, or always with full). Returns the number of failed entries."""
  from ragtune.lut import verify as verify_mod
  from ragtune.run import progress as progress_mod

  failures = 0
  columns = progress_mod.bar_columns("verify {task.description}", best=False)
  # A live bar in a terminal; in a log, the per-entry lines are the progress.
  with (
    verify_mod.DrawRunner(timeout) as runner,
    Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress,
  ):
    task = progress.add_task("", total=len(entries))
    for i, e in enumerate(entries, 1):
      progress.update(task, description=f"{e.op} {e.backend} {kernels.lut.shape_text(e.m, e.k, e.n, e.g)}")
      res = verify_mod.verify_entry(e, seed=seed, interpret=interpret, runner=runner)
      failures += not res.passed
      for line in [verify_mod.entry_line(i, len(entries), res), *verify_mod.entry_report(res, full)]:
        console.print(line, markup=False, highlight=False)
      progress.advance(task)
  return failures


def _compile_entries(target: str, entries: list, jobs: int | None) -> int:
  """verify --target: each entry compiled deviceless, one line each; returns the failures."""
  from ragtune.candidates import prune
  from ragtune.deviceless import aot
  from ragtune.problems.shapes import Problem

  t0 = time.perf_counter()
  items = [(Problem(e.op, e.backend, e.dtype, e.m, e.k, e.n, e.g, "lut", ()), e.config) for e in entries]
  compiled = [i for i, (p, cfg) in enumerate(items) if cfg is not None]
  reports = {compiled[j]: rep for j, rep in prune.compile_many(target, [items[i] for i in compiled], jobs)}
  failures = 0
  for i, (p, cfg) in enumerate(items, 1):
    rep = reports.get(i - 1)
    head = f"[{i}/{len(items)}] {p.op} {p.backend} {p.shape_label} {p.dtype}"
    if rep is None:
      _print(f"{head}: no kernel of its own to compile ({p.backend})")
      continue
    failures += rep["outcome"] != aot.OK
    verdict = "compiles" if rep["outcome"] == aot.OK else f"FAILED {rep['outcome']}: {rep['error'][:300]}"
    _print(f"{head} {cfg}: {verdict} ({rep['compile_s']:.1f}s)")
  console.print(
    f"compiled {len(compiled)} of {count(len(items), 'entry')} for {target} in {time.perf_counter() - t0:.1f}s: "
    f"{len(compiled) - failures} ok, {failures} failed"
  )
  return failures


@app.command(cls=_Command, epilog=_example("ragtune verify --op fwd"))
@user_errors
def verify(
  target: Annotated[
    Path | None,
    typer.Argument(metavar="LUT_OR_DIR", help="LUT file, or results folder [default: results/<device-slug>/]."),
  ] = None,
  seed: Annotated[
    int, typer.Option("--seed", min=0, metavar="SEED", help="Seed for the fresh inputs and group-size draws.")
  ] = 1234,
  force: Annotated[bool, typer.Option("--force", help="Verify a LUT made for another device kind.")] = False,
  interpret: Annotated[
    bool | None, typer.Option("--interpret/--no-interpret", help="[default: on when there is no accelerator].")
  ] = None,
  full: Annotated[
    bool, typer.Option("--full", help="Print the numerics report of every draw, not only of failures.")
  ] = False,
  op: Annotated[
    list[str] | None,
    typer.Option("--op", metavar="OP", help="Only entries of these ops: fwd, dlhs, drhs (repeat or comma-separate)."),
  ] = None,
  shape: Annotated[
    list[str] | None,
    typer.Option(
      "--shape",
      metavar="M,K,N",
      help="Only entries whose forward shape [m,k]x[g,k,n] (as printed) has these m,k,n (repeatable).",
    ),
  ] = None,
  timeout: Annotated[
    float,
    typer.Option(
      "--timeout",
      min=1,
      metavar="SECONDS",
      help="Seconds allowed per draw (compile and run); a draw that overruns is killed and fails as 'timeout'.",
    ),
  ] = 300.0,
  compile_for: Annotated[
    str | None,
    typer.Option(
      "--target",
      metavar="DEVICE",
      help=f"Compile each entry deviceless for this device ({GPU_TARGETS}; {TPU_TARGETS}; "
      "auto: the LUT file's own) with XLA's real compiler instead of running it: a LUT for a "
      "device this host lacks. Checks that each compiles and fits (VMEM, HBM, shared memory), "
      "not its numbers or speed.",
    ),
  ] = None,
  jobs: Jobs = None,
  skip_bad_lines: SkipBadLines = False,
):
  """Re-run every LUT entry on fresh inputs and adversarial group sizes (empty groups,
  sum < m, one group holding all rows). One line per entry; the numerics report of
  failures (of every draw with --full). Exit 1 if any fails. With --target, compile each
  entry for that device instead, on this host."""
  from ragtune.lut import verify as verify_mod

  sel = _verify_selection(target, compile_for, force, op, shape, skip_bad_lines)
  stopped = "interrupted: verify stopped before its last entry (it writes nothing); run it again to check them all"
  if sel.compile_for:
    with _stoppable(stopped):
      failed = _compile_entries(sel.compile_for, sel.entries, jobs)
    if failed:
      raise typer.Exit(1)
    return
  entries = sel.entries
  limits.check_fits(entries, memory=sel.info.get("memory_bytes"), where=str(sel.where))
  warning = verify_mod.version_warning(sel.lut, entries, sel.lut.source or str(sel.where))
  if warning:
    _print(f"warning: {warning}", err=True)
  t0 = time.perf_counter()
  interpret = prepare.resolve_interpret(interpret, sel.info["platform"], _say_err)
  with _stoppable(stopped):
    failures = _verify_entries(entries, seed=seed, interpret=interpret, timeout=timeout, full=full)
  console.print(
    f"verified {count(len(entries), 'entry')} in {time.perf_counter() - t0:.1f}s: "
    f"{len(entries) - failures} passed, {failures} failed"
  )
  if failures:
    raise typer.Exit(1)


@app.command(
  "compile",
  cls=_Command,
  epilog="\b\nExample: ragtune compile shapes/anchors.yaml --target h100 --shape 8192,4096,14336 --op fwd",
)
@user_errors
def compile_cmd(
  shapes_file: ShapesFile,
  target: Annotated[
    str,
    typer.Option(
      "--target",
      metavar="DEVICE",
      help=f"A GPU ({GPU_TARGETS}, the LUT slug of one of their products, or a GpuTargetConfigProto "
      f"file) or a TPU ({TPU_TARGETS}).",
    ),
  ] = "h100",
  backend: Backends = None,
  ops: Ops = None,
  shape: Shapes = None,
  model: Models = None,
  jobs: Jobs = None,
):
  """Compile each problem's default config for a GPU or TPU with XLA's real compiler, on this
  host (no accelerator needed). A GPU: what each kernel is built from (outcome, registers,
  spilled bytes, shared memory, MMA and copy instructions, compile time; the gpu-compile
  extra). A TPU: the outcome, VMEM (the static rule's figure and the compiler's), HBM and
  compile time (the tpu extra). A shapes file that lists no backend of the target's compiles
  the target's own. Says nothing of speed."""
  from ragtune.candidates import prune
  from ragtune.cli import views
  from ragtune.deviceless import aot

  facts = prune.target_facts(target)
  kind, own = facts["device_kind"], prune.backends_for(facts["platform"])
  _, problems, _ = prepare.target_problems(facts, shapes_file, _selection(ops, backend, None, shape, model), _say_err)
  items = [
    (p, kernels.registry.default_config(p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=kind))
    for p in problems
    if p.backend in own
  ]
  if not items:
    raise RagtuneError(f"{shapes_file}: no problem of a backend for {kind} ({', '.join(own)}) selected")
  reports = dict(prune.compile_many(target, items, jobs))
  if facts["platform"] == "tpu":
    console.print(views.tpu_compile_table(kind, items, reports))
    _print("VMEM rule: the backend config's static figure; need/limit: the compiler's, where it ran out.")
  else:
    console.print(views.compile_table(kind, items, reports, aot.OK))
    _print("smem: XLA's launch figure; * the config's allocation (Mosaic GPU sets its own at launch).")
  bad = sum(rep["outcome"] != aot.OK for rep in reports.values())
  unread = [rep["error"] for rep in reports.values() if rep["outcome"] == aot.NO_KERNEL]
  if unread:
    _print(f"{len(unread)} of {len(items)} were not checked ({aot.NO_KERNEL}): {unread[0]}", err=True)
  if bad:
    _print(f"{bad} of {len(items)} did not compile clean", err=True)
    raise typer.Exit(1)


@app.command("export-lut", cls=_Command, epilog=_example("ragtune export-lut -o luts/"))
@user_errors
def export_lut(
  dirs: Annotated[
    list[Path] | None, typer.Argument(metavar="DIR", help="Results folders to merge [default: results/<device-slug>/].")
  ] = None,
  output: Annotated[
    Path | None,
    typer.Option(
      "--output",
      "-o",
      metavar="FILE_OR_DIR",
      help="LUT .json file (one device) or folder (<device-slug>.json each) [default: the first results folder].",
    ),
  ] = None,
  fmt: Annotated[
    LutFormat, typer.Option("--format", metavar="FORMAT", help="json, or python (also writes an importable <slug>.py).")
  ] = LutFormat.json,
  force: Force = False,
  skip_bad_lines: SkipBadLines = False,
  partial: Annotated[
    bool,
    typer.Option(
      "--partial",
      help="Export although shards of a sharded sweep (--shard) have no records in DIR yet: a LUT "
      "without their problems (refused otherwise).",
    ),
  ] = False,
):
  """Pick the fastest correct config per (device, op, backend, dtype, shape), plus an xla
  entry where XLA's own op was fastest, and write the LUT atomically. A DIR may be a
  records.jsonl (its folder is then the default -o). An existing file is replaced only if
  it is a ragtune LUT (or the module --format python wrote). A DIR that holds shard folders
  merges them, and is refused while a shard has no records there, unless --partial."""
  from ragtune.lut import export

  dirs = prepare.results_dirs(dirs)
  output = output or paths.folder_of(dirs[0])
  if output.suffix == ".json":
    paths.output_file(output, "the LUT file", Kind.LUT, force=force)
  else:
    paths.writable_dir(output, "the LUT folder (-o FILE.json for one file)")
  luts = export.build_luts(_records(dirs, skip_bad_lines, partial=partial))
  written = export.write_luts(luts, output, fmt.value, force=force)
  for kind, lut in sorted(luts.items()):
    console.print(f"{kind}: {count(len(lut), 'entry')}")
  for p in written:
    console.print(f"wrote {p}")


@app.command(cls=_Command, epilog=_example("ragtune show --all"))
@user_errors
def show(
  dirs: ResultsDirs = None,
  all_rows: Annotated[bool, typer.Option("--all", help="Every measured row, not only the best per problem.")] = False,
  csv: Annotated[
    Path | None,
    typer.Option("--csv", metavar="FILE", help="Also write the table as CSV (replacing only a CSV show wrote)."),
  ] = None,
  force: Force = False,
  as_json: Annotated[
    bool,
    typer.Option(
      "--json",
      help="Print one JSON document instead of the table: {schema: ragtune-show, schema_version: 1, "
      "view: best|all, rows: [...]}. A best row: device_kind, op, backend, dtype, m, k, n, g, group_dist, "
      "shape, best_ms, calls, step_ms, tflops, gbps, pct_peak, bound, xla_ms, default_ms, dense_ms, vs_xla, "
      "vs_default, winner, runner_up, ok, failed, statuses, best_config, problem. With --all, a row per record: "
      "device_kind, op, backend, dtype, m, k, n, g, group_dist, candidate, status, time_s, tflops, gbps, "
      "error, timer, interpret, jax_version, timestamp, shape, config, baseline (xla or dense on a baseline's "
      "row, whose backend is the problem's). null: no value. "
      "Notices go to stderr.",
    ),
  ] = False,
  skip_bad_lines: SkipBadLines = False,
):
  """Print results as a table (best per problem by default): a rich table in a terminal,
  plain columns when piped or in a log (one line per row), JSON with --json. Shapes read
  [m,k]x[g,k,n] (ragged_dot's lhs x rhs); configs name their fields as the LUT does."""
  from ragtune import provenance
  from ragtune.device import ceilings
  from ragtune.records import report

  if csv:
    paths.output_file(csv, "the --csv file", Kind.SHOW_CSV, force=force)
  dirs = prepare.results_dirs(dirs)
  records = _records(dirs, skip_bad_lines)
  _interpreted_notice(records)
  ceil = ceilings.load(dirs)
  df = report.compact_rows(records) if all_rows else report.show_best(records, ceil)
  if as_json:
    typer.echo(report.show_json(records, ceil, all_rows), nl=False)
  elif console.is_terminal:
    from ragtune.cli import views

    title = "every measured row" if all_rows else "best correct config per problem"
    console.print(views.show_table(report.printable(df), title))
  else:
    _print_frame(report.printable(df))
  jax_versions = provenance.sorted_versions({v for r in records if (v := r.made_with().get("jax"))})
  if len(jax_versions) > 1:  # timings under different jax versions may not compare
    _print(f"note: these rows were measured under jax {', '.join(jax_versions)}", err=as_json)
  if csv:
    paths.write_atomic(csv, report.csv_text(df))
    _print(f"wrote {csv}", err=as_json)


def _print_frame(df) -> None:
  """A frame as plain columns (pipes, logs, tests); '-' where there is no value, as in the rich table."""
  import pandas as pd

  with pd.option_context(
    "display.max_rows",
    500,
    "display.max_columns",
    50,
    "display.width",
    160,
    "display.max_colwidth",
    200,
    "display.float_format",
    "{:.4g}".format,
  ):
    _print(df.to_string(index=False, na_rep="-"))


@app.command(cls=_Command, epilog=_example("ragtune report -o report/"))
@user_errors
def report(
  dirs: ResultsDirs = None,
  output: Annotated[
    Path | None,
    typer.Option(
      "--output",
      "-o",
      metavar="DIR",
      help="Folder for best.csv, rows.csv, the PNG plots and report.md [default: report/ in the first results folder].",
    ),
  ] = None,
  force: Force = False,
  skip_bad_lines: SkipBadLines = False,
):
  """Write best.csv (best per problem with baselines), rows.csv (every row), PNG plots
  (TF/s per problem, roofline, candidate times; needs the report extra) and report.md.
  Files of those names already there are replaced only if report wrote them."""
  from ragtune.device import ceilings
  from ragtune.records import plots
  from ragtune.records import report as report_mod

  dirs = prepare.results_dirs(dirs)
  output = output or paths.folder_of(dirs[0]) / "report"
  plots.check_output(output, force)
  records = _records(dirs, skip_bad_lines)
  _interpreted_notice(records)
  ceil = ceilings.load(dirs)
  for name, df in (("best.csv", report_mod.best_frame(records, ceil)), ("rows.csv", report_mod.rows_frame(records))):
    paths.write_atomic(output / name, report_mod.csv_text(df))
    console.print(f"wrote {output / name} ({count(len(df), 'row')})")
  for path in plots.write_report(records, ceil, output):
    console.print(f"wrote {path}")


@app.command(cls=_Command, epilog="\b\nExample: ragtune bench shapes/smoke.yaml --op fwd --shape 96,64,80")
@user_errors
def bench(
  shapes_file: ShapesFile,
  ops: Ops = None,
  shape: Shapes = None,
  model: Models = None,
  lut: Annotated[
    Path | None,
    typer.Option(
      "--lut",
      metavar="FILE_OR_DIR",
      help="LUT file, or a folder holding <device-slug>.json [default: the one a model here loads "
      "(RAGTUNE_LUT, then kernels/luts/<device-slug>.json), else results/<device-slug>/<device-slug>.json].",
    ),
  ] = None,
  csv: Annotated[
    Path | None,
    typer.Option(
      "--csv",
      metavar="FILE",
      help="[default: bench-<set name>.csv beside the LUT, else in results/<device-slug>/]; "
      "replaces only a CSV bench wrote.",
    ),
  ] = None,
  samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Profiler samples per variant.")] = 10,
  force: Force = False,
):
  """Time, on this GPU, each problem's LUT choice, each GPU backend's default config, XLA's
  ragged_dot, tokamax.ragged_dot (when installed) and a dense matmul of the same FLOPs, in
  one run of one device timer; every variant is checked against jax.lax.ragged_dot first
  and one that fails is never timed. Exit 1 if any fails. On a CPU host: checks only, no
  speed (shapes too big for the Pallas interpreter shrink)."""
  from ragtune.lut import bench as bench_mod

  spec, problems = prepare.load_problems(shapes_file, _selection(ops, None, None, shape, model))
  bench = bench_mod.plan(
    problems, spec.name, str(shapes_file), lut=lut, csv=csv, samples=samples, say=_say_err, force=force
  )
  csv, device = bench.csv, bench.device
  for line in bench_mod.header(bench.bench, bench.lut_file):
    _print(line)
  done: list = []

  def show(p, rows) -> None:
    _print(f"\n== {p.op} {p.shape_label} {p.dtype}  {p.source}")
    for line in bench_mod.table(rows, device):
      _print(line)
    done.extend(rows)
    bench_mod.write_csv(csv, done)

  stopped = lambda: (
    f"interrupted: the rows so far are in {csv}" if done else "interrupted: no problem finished; no CSV written"
  )
  with _stoppable(stopped):
    rows = bench_mod.run(bench.problems, bench.bench, show)
  _print(f"\nwrote {csv}")
  failed = [r for r in rows if r.failed]
  if failed:
    _print(f"{count(len(failed), 'variant')} failed the check or did not run; see the status column", err=True)
    raise typer.Exit(1)


shapes_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Write shape files.")
app.add_typer(shapes_app, name="shapes")


def _positive_ints(text: str, option: str) -> list[int]:
  parts = [t.strip() for t in text.split(",")]
  if not all(t.isdigit() and int(t) > 0 for t in parts):
    raise RagtuneError(f"{option} {text!r}: expected positive integers separated by commas, e.g. 16,4096")
  return [int(t) for t in parts]


@shapes_app.command(
  "from-config",
  cls=_Command,
  epilog="\b\nExample: ragtune shapes from-config shapes/configs/qwen3-30b-a3b.json --ep 8 --fused-gate-up",
)
@user_errors
def from_config(
  config: Annotated[Path, typer.Argument(metavar="CONFIG_JSON", help="A Hugging Face model's config.json (local).")],
  output: Annotated[
    Path | None,
    typer.Option(
      "--output",
      "-o",
      metavar="FILE",
      help="Shapes file to write [default: print it]; replaces only a file from-config wrote.",
    ),
  ] = None,
  tokens: Annotated[
    str, typer.Option("--tokens", metavar="N,N,...", help="Token counts; m = tokens * top_k / ep, rounded up.")
  ] = "16,4096",
  ep: Annotated[int, typer.Option("--ep", metavar="N", help="Expert-parallel ranks (each holds experts/N).")] = 1,
  tp: Annotated[
    int, typer.Option("--tp", metavar="N", help="Tensor-parallel ranks (split the intermediate size).")
  ] = 1,
  fused_gate_up: Annotated[
    bool, typer.Option("--fused-gate-up", help="Gate and up in one matmul: the up projection's n = 2 x intermediate.")
  ] = False,
  dtype: Annotated[
    str | None,
    typer.Option(
      "--dtype",
      metavar="DTYPE",
      help="bfloat16, float16, float32, or a quantized format such as float8_e4m3fn:block128 "
      "[default: the config's quantization_config (fp8 128x128 blocks, fbgemm_fp8), else bfloat16].",
    ),
  ] = None,
  name: Annotated[
    str | None,
    typer.Option("--name", metavar="NAME", help="The model's name [default: the config file's name, or its folder's]."),
  ] = None,
  force: Force = False,
):
  """Read the MoE layer (hidden, expert intermediate size, experts, top_k) from a model's
  config.json and write a shape file that tunes it: one models: entry, laid out over ep x tp
  ranks. Knows the field names of Mixtral, DeepSeek, Qwen-MoE, Llama-4, gpt-oss, OLMoE and DBRX,
  and the fp8 formats of a quantization_config."""
  from ragtune.problems import hf_config

  if output is not None:
    paths.output_file(output, "the shapes file", Kind.FROM_CONFIG, force=force)
  text = hf_config.shape_file(
    config,
    tokens=_positive_ints(tokens, "--tokens"),
    ep=ep,
    tp=tp,
    fused_gate_up=fused_gate_up,
    dtype=dtype,
    name=name,
  )
  if output is None:
    typer.echo(text, nl=False)
  else:
    paths.write_atomic(output, text)
    console.print(f"wrote {output}")


def _load_callable(spec: str, option: str):
  """MODULE:FUNCTION imported as `python -m` would (the current folder first on the path)."""
  import sys

  from ragtune.run import worker

  if "" not in sys.path and str(Path.cwd()) not in sys.path:
    sys.path.insert(0, str(Path.cwd()))
  try:
    return worker.load_function(spec, option)
  except ValueError as e:
    raise RagtuneError(str(e)) from None


def _called(spec: str, fn):
  try:
    return fn()
  except Exception as e:
    raise RagtuneError(f"{spec} raised: {type(e).__name__}: {e}") from None


def _step_and_args(function: str, args_from: str | None):
  """(fn, args, kwargs): FUNCTION() returns (fn, args) or (fn, args, kwargs); with --args,
  FUNCTION is the step and ARGS() returns its positional arguments (a tuple; anything else is
  the one argument)."""
  target = _load_callable(function, "MODULE:FUNCTION")
  if args_from is not None:
    got = _called(args_from, _load_callable(args_from, "--args"))
    return target, (got if isinstance(got, tuple) else (got,)), {}
  got = _called(function, target)
  if not (isinstance(got, tuple) and len(got) in (2, 3) and callable(got[0]) and isinstance(got[1], (tuple, list))):
    raise RagtuneError(
      f"{function} returned {type(got).__name__}; it must return (step, args) or (step, args, kwargs), "
      "or be the step itself with --args MODULE:FUNCTION returning its arguments"
    )
  kwargs = got[2] if len(got) == 3 else {}
  if not isinstance(kwargs, dict):
    raise RagtuneError(f"{function} returned kwargs of type {type(kwargs).__name__}, not a dict")
  return got[0], tuple(got[1]), kwargs


@shapes_app.command(
  "from-function",
  cls=_Command,
  epilog="\b\nExample: ragtune shapes from-function tests.ragtune.moe_model:make_train",
)
@user_errors
def from_function(
  function: Annotated[
    str,
    typer.Argument(
      metavar="MODULE:FUNCTION",
      help="Returns (step, args) or (step, args, kwargs): the function to capture and what to call it with; "
      "with --args, the step itself.",
    ),
  ],
  args_from: Annotated[
    str | None,
    typer.Option("--args", metavar="MODULE:FUNCTION", help="Returns the step's positional arguments, as a tuple."),
  ] = None,
  output: Annotated[
    Path | None,
    typer.Option(
      "--output",
      "-o",
      metavar="FILE",
      help="Shapes file to write [default: print it]; replaces only a file ragtune.capture wrote.",
    ),
  ] = None,
  name: Annotated[
    str | None, typer.Option("--name", metavar="NAME", help="The set's name [default: the step's].")
  ] = None,
  force: Force = False,
):
  """Run a model's step once (a jitted train or serving step, with jax.grad, scan or shard_map
  inside) and write a shape file of every grouped matmul in it: jax.lax.ragged_dot,
  kernels.ragged_dot and megablox gmm calls, each rank's own problem under shard_map, the ops
  the step needs (dlhs and drhs where it differentiates), calls a step, and the group sizes
  its router produced (ragtune.capture)."""
  from ragtune.problems import capture

  if output is not None:
    paths.output_file(output, "the shapes file", Kind.CAPTURED, force=force)
  step, args, kwargs = _step_and_args(function, args_from)
  spec = capture.capture(step, *args, name=name, say=_say_err, **kwargs)
  calls = sum(sum(s.ops.values()) for s in spec.shapes if isinstance(s.ops, dict))
  if output is None:
    typer.echo(spec.text(), nl=False)
  else:
    spec.write(output, force=force)
    console.print(f"wrote {output}: {count(len(spec.shapes), 'problem')}, {count(calls, 'call')} a step")
