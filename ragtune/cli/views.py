"""The CLI's rich tables: the sweep summary, the plan, and the deviceless compile report."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kernels import common
from ragtune import words
from ragtune.problems.presets import MODEL_PRESETS
from ragtune.records.report import DTYPE_ABBREV, config_text
from ragtune.records.summary import speedup_text
from ragtune.run.estimate import CostModel, duration, gpu_sized_hint
from ragtune.run.plan import PlanRow

SHAPE = escape("shape [m,k]x[g,k,n]")


def _table(title: str, columns) -> Table:
  t = Table(title=title)
  for col in columns:
    t.add_column(col, overflow="fold")
  return t


def _problem_label(p) -> str:
  """The model entry a problem was expanded from (deepseek-v3:up:tokens=16384), else its shape."""
  return p.source if p.source.split(":")[0] in MODEL_PRESETS else p.shape_label


_RIGHT = {"best ms", "vs xla", "vs dflt", "ok"}


def summary_table(summaries) -> Table:
  """The sweep's end, one row per problem within 100 columns (with the longest model label,
  llama-4-maverick:down:tokens=16384): its best time, the speedups over XLA and the default
  config, the winner and how many candidates passed of those measured. One dtype goes in
  the title, several get a column. `ragtune show` has the rest (best config, TF/s, % of
  peak, the baselines' times, statuses)."""
  dtypes = sorted({s.problem.dtype for s in summaries})
  one_dtype = f", {dtypes[0]}" if len(dtypes) == 1 else ""
  t = Table(
    title=f"sweep summary (best correct config per problem{one_dtype})",
    box=box.SIMPLE_HEAD,
    show_edge=False,
    padding=0,
  )
  columns = (
    "problem",
    "op",
    "backend",
    *(() if one_dtype else ("dtype",)),
    "best ms",
    "vs xla",
    "vs dflt",
    "winner",
    "ok",
  )
  for col in columns:
    t.add_column(col, justify="right" if col in _RIGHT else "left", overflow="fold")
  for s in summaries:
    p, b, base = s.problem, s.best, s.baselines
    ratio = lambda name: base[name] / b.time_s if b and base[name] else None
    cells = (
      _problem_label(p),
      p.op,
      p.backend,
      *(() if one_dtype else (DTYPE_ABBREV.get(p.dtype, p.dtype),)),
      f"{b.time_s * 1e3:.4g}" if b else "-",
      speedup_text(ratio("xla")),
      speedup_text(ratio("default")),
      s.winner,
      f"{len(s.ranked)}/{sum(s.counts.values())}",
    )
    t.add_row(*(Text(c) for c in cells))  # as written: no markup, no emoji codes (":up:")
  return t


_SHOW_WRAPS = {"best_config", "config", "statuses", "error", "winner"}


def show_table(df, title: str) -> Table:
  """`ragtune show` in a terminal: the printable frame's columns, numbers right-aligned at 4
  significant digits, '-' where there is no value."""
  t = Table(title=title, box=box.SIMPLE_HEAD)
  numeric = {c for c in df.columns if df[c].dtype.kind in "iuf"}
  for col in df.columns:
    wraps = col in _SHOW_WRAPS  # the rest (shapes, numbers) stay whole on one line
    t.add_column(str(col), justify="right" if col in numeric else "left", overflow="fold", no_wrap=not wraps)
  cell = lambda v: (
    "-" if v is None or (isinstance(v, float) and v != v) else f"{v:.4g}" if isinstance(v, float) else str(v)
  )
  for row in df.itertuples(index=False):
    t.add_row(*(Text(cell(v)) for v in row))
  return t


def plan_table(rows: list[PlanRow]) -> Table:
  """One row per problem: candidates after pruning, rows done and to do, estimated time and its
  source; where a deviceless compile rejected any, how many of each problem's space (never
  timed: a listed sweep takes the next candidates instead)."""
  pruned = any(r.rejected for r in rows)  # by a deviceless compile (plan --target)
  floor = any(r.floor_s is not None for r in rows)  # a named GPU's datasheet (kernels.gpus)
  t = _table(
    "plan",
    ("op", "backend", "dtype", SHAPE, "candidates")
    + (("compile-rejected",) if pruned else ())
    + ("rows done", "rows to do", "est. time", "per candidate", "from")
    + (("floor (model)",) if floor else ()),
  )
  for r in rows:
    p, e = r.problem, r.estimate
    t.add_row(
      p.op,
      p.backend,
      p.dtype,
      p.shape_label,
      str(r.candidates),
      *((str(r.rejected),) if pruned else ()),
      str(r.done),
      str(r.todo),
      duration(e.seconds) if e.seconds is not None and r.todo else "-",
      duration(e.per_candidate_s) if e.per_candidate_s is not None and r.todo else "-",
      e.source,
      *((_short_time(r.floor_s),) if floor else ()),
    )
  return t


def _short_time(s: float | None) -> str:
  """A kernel's time: '2.66 ms', '229 us'; '-' when unknown."""
  if s is None:
    return "-"
  return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def plan_summary(rows: list[PlanRow], model: CostModel, slowest: int = 3) -> list[str]:
  """The plan's total and what its estimates are, then its `slowest` problems."""
  todo = sum(r.todo for r in rows)
  known = [r for r in rows if r.estimate.seconds is not None and r.todo]
  unknown = [r for r in rows if r.estimate.seconds is None and r.todo]
  total = sum(r.estimate.seconds for r in known)
  by_rows = sum(1 for r in known if r.estimate.source == "rows")
  head = f"{words.count(len(rows), 'problem')}, {todo} measurements to do (candidates and the 2 baselines per problem)"
  floor = (
    [
      "  floor (model) = the larger of FLOPs / the GPU's datasheet dense tensor-core peak and bytes / its memory "
      "bandwidth (kernels/gpu_facts/): no kernel runs faster"
    ]
    if any(r.floor_s is not None for r in rows)
    else []
  )
  if not todo:
    return [head, *floor]
  sources = [f"{len(known) - by_rows} from {model.describe()}"] if len(known) > by_rows else []
  sources += [f"{by_rows} from the median time of their recorded rows"] if by_rows else []
  sources += [f"{len(unknown)} unknown ({unknown[0].estimate.note})"] if unknown else []
  lines = [f"{head}: about {duration(total)} (estimates: " + "; ".join(sources) + ")"]
  lines += ["  est. time = candidates to do x per candidate + the baselines to do; --timeout warns by the slowest one"]
  worst = sorted(known, key=lambda r: -r.estimate.seconds)[:slowest]
  lines += [
    f"  slowest: {r.problem.op} {r.problem.backend} {r.problem.dtype} {r.problem.shape_label}: about "
    f"{duration(r.estimate.seconds)} for {r.todo} rows"
    + (f", {duration(r.estimate.per_candidate_s)} a candidate" if r.estimate.per_candidate_s is not None else "")
    for r in worst
    if len(known) > 1
  ]
  hint = gpu_sized_hint(model, total)
  return lines + floor + ([hint] if hint else [])


def _mib(n: int | None) -> str:
  return "-" if n is None else f"{n / (1 << 20):.2f}"


def tpu_compile_table(kind: str, items, reports: dict[int, dict[str, Any]]) -> Table:
  """One row per (problem, TpuConfig) compiled deviceless for a TPU of `kind`: the outcome,
  how the chip's MXU takes the operands (an 8-bit format natively or converted to bf16:
  common.TpuChip.mxu), the static VMEM rule's figure beside the compiler's need and limit
  where VMEM ran out, and the program's HBM (arguments + outputs from memory_analysis, or
  need/limit where it ran out)."""
  t = _table(
    f"deviceless compile for {kind} (default configs)",
    (
      "op",
      "backend",
      "dtype",
      SHAPE,
      "config",
      "outcome",
      "MXU",
      "VMEM MiB rule",
      "VMEM MiB need/limit",
      "HBM GiB",
      "temp MiB",
      "s",
    ),
  )
  chip = common.chip(kind)
  gib = lambda n: f"{n / (1 << 30):.2f}"
  for i, (p, cfg) in enumerate(items):
    rep, outcome = reports[i], reports[i]["outcome"]
    mem = rep.get("memory", {})
    vmem = f"{_mib(mem['used'])}/{_mib(mem['limit'])}" if outcome == "vmem_oom" and "limit" in mem else "-"
    if outcome == "hbm_oom" and "limit" in mem:
      hbm = f"{gib(mem['used'])}/{gib(mem['limit'])} (out of HBM)"
    else:
      hbm = gib(mem["argument"] + mem["output"]) if "argument" in mem else "-"
    path = chip.mxu_path(common.element_dtype(p.dtype)) if chip and common.scheme(p.dtype) else ""
    t.add_row(
      p.op,
      p.backend,
      p.dtype,
      p.shape_label,
      config_text(cfg.to_dict()),
      outcome if outcome == "ok" else f"{outcome}: {rep['error'][:120]}",
      f"{common.element_dtype(p.dtype)} {path}" if path else "-",
      _mib(cfg.vmem_bytes(p.op, p.dtype, p.m, p.k, p.n)),
      vmem,
      hbm,
      _mib(mem.get("temp")),
      f"{rep['compile_s']:.1f}",
    )
  return t


def compile_table(kind: str, items, reports: dict[int, dict[str, Any]], ok: str) -> Table:
  """One row per kernel of each (problem, config) compiled deviceless for `kind`; setmaxnreg:
  the registers its plan holds at worst over those the CTA is launched with."""
  t = _table(
    f"deviceless compile for {kind} (default configs)",
    (
      "op",
      "backend",
      SHAPE,
      "config",
      "outcome",
      "regs",
      "spill B",
      "loop spills",
      "smem KiB",
      "mma",
      "tmem",
      "HGMMA n",
      "setmaxnreg",
      "copy",
      "s",
    ),
  )
  for i, (p, cfg) in enumerate(items):
    rep = reports[i]
    for kr in rep["kernels"] or [{}]:
      smem = kr.get("smem_bytes")
      t.add_row(
        p.op,
        p.backend,
        p.shape_label,
        "-" if cfg is None else config_text(cfg.to_dict()),  # xla: no knobs
        rep["outcome"] if rep["outcome"] == ok else f"{rep['outcome']}: {rep['error'][:120]}",
        str(kr.get("registers", "-")),
        str(kr.get("spill_bytes", "-")),
        str(kr.get("loop_spills", "-")),
        "-" if smem is None else f"{smem / 1024:.0f}" + ("*" if kr.get("smem_source") == "config" else ""),
        " ".join(filter(None, (kr.get("mma", "-"), kr.get("mma_inputs")))),  # "mma.sync e4m3"
        {True: "yes", False: "no"}.get(kr.get("tmem_alloc"), "-"),
        str(kr.get("hgmma_n") or "-"),
        setmaxnreg_cell(kr),
        kr.get("copy", "-"),
        f"{rep['compile_s']:.1f}",
      )
  return t


def setmaxnreg_cell(kr: dict) -> str:
  """ "no" for a kernel that moves no registers; else its setmaxnreg demand over its pool
  ("64512/64512"), or "yes" where the cubin gave no thread count to size them."""
  if kr.get("setmaxnreg") is None:
    return "-"
  if not kr["setmaxnreg"]:
    return "no"
  demand = kr.get("setmaxnreg_demand")
  return f"{demand}/{kr.get('register_pool')}" if demand is not None else "yes"
