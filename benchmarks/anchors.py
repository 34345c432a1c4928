"""The anchor benchmark: real MoE shapes, fwd/dlhs/drhs, each GPU backend (default config and
tuned config) beside XLA's ragged_dot and a dense matmul of the same FLOPs, all timed in one
run, with the device's measured matmul and copy ceilings. Ends with the gap to our targets.

  python benchmarks/anchors.py                                 # GPU: every anchor, all 3 ops
  python benchmarks/anchors.py --lut results/nvidia-h100-80gb-hbm3 --csv anchors.csv
  python benchmarks/anchors.py --only mixtral-8x7b --ops fwd --m-scale 0.5

Anchors (bf16, multinomial routing, seed 0):
  mixtral-8x7b   [8192,4096]x[8,4096,14336]     4096 tokens x top-2; hidden 4096, intermediate 14336,
                                                 8 experts (mistralai/Mixtral-8x7B-v0.1 config.json);
                                                 also tokamax's ragged_dot benchmark shape
  dsv3-up        [131072,7168]x[256,7168,2048]  16384 tokens x top-8; hidden 7168, moe_intermediate 2048,
  dsv3-down      [131072,2048]x[256,2048,7168]  256 routed experts (deepseek-ai/DeepSeek-V3 config.json)
  dsv3-decode    [512,7168]x[256,7168,2048]     64 tokens x top-8

On a CPU host (no GPU) the shapes shrink (m/256, k/32, n/32, at most 8 groups) and the Pallas
kernel runs in interpret mode: a check that the benchmark runs, never a speed figure.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import signal
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from kernels.ragged_dot import default_interpret  # noqa: E402
from ragtune import ceilings, measure  # noqa: E402
from ragtune.shapes import GroupDist, Problem  # noqa: E402

ANCHORS = {  # name: (m, k, n, g, prefill)
  "mixtral-8x7b": (8192, 4096, 14336, 8, True),
  "dsv3-up": (131072, 7168, 2048, 256, True),
  "dsv3-down": (131072, 2048, 7168, 256, True),
  "dsv3-decode": (512, 7168, 2048, 256, False),
}
TARGETS = {"geomean_vs_xla_prefill": 5.0, "min_vs_xla": 1.0, "mixtral_fwd_tflops": 700.0, "decode_pct_copy": 85.0}
COLUMNS = [
  "anchor",
  "shape",
  "op",
  "variant",
  "config",
  "status",
  "ms",
  "tflops",
  "pct_matmul_peak",
  "gbps",
  "pct_copy_bw",
  "vs_xla",
  "timer",
]


@dataclass
class Row:
  anchor: str
  shape: str
  op: str
  variant: str
  config: str
  status: str = "ok"
  ms: float | None = None
  tflops: float | None = None
  pct_matmul_peak: float | None = None
  gbps: float | None = None
  pct_copy_bw: float | None = None
  vs_xla: float | None = None
  timer: str = ""


def anchor_shape(name: str, on_device: bool, m_scale: float) -> tuple[int, int, int, int]:
  m, k, n, g, _ = ANCHORS[name]
  m = max(1, int(m * m_scale))
  if not on_device:
    m, k, n, g = max(32, m // 256), max(16, k // 32), max(16, n // 32), min(g, 8)
  return m, k, n, g


def gpu_backends(on_device: bool) -> list[str]:
  """The GPU kernel backends to time here: those the device runs compiled, or on a CPU host
  the first GPU kernel backend, interpreted."""
  gpu = [b.name for b in kernels.registry.REGISTRY.values() if b.config_type is not None and "cuda" in b.platforms]
  return [b for b in gpu if not default_interpret(b)] if on_device else gpu[:1]


def kernel_variants(p: Problem, backends: list[str], lut: kernels.Lut | None, device_kind: str):
  """{label: (backend, config)}: each backend's default config, and its LUT config where that differs."""
  out = {}
  for b in backends:
    default = kernels.registry.default_config(b, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=device_kind)
    out[f"{b} default"] = (b, default)
    e = lut.query(p.op, p.m, p.k, p.n, p.g, p.dtype, b) if lut is not None else None
    if e is not None and e.config is not None and e.config != default:
      exact = (e.m, e.k, e.n, e.g) == (p.m, p.k, p.n, p.g)
      out[f"{b} tuned" if exact else f"{b} tuned@[{e.m},{e.k}]x[{e.g},{e.k},{e.n}]"] = (b, e.config)
  return out


def bench_problem(
  name: str, p: Problem, backends, lut, device_kind, on_device, peak_tf, copy_gbps, samples: int
) -> list[Row]:
  x = measure.make_inputs(p)
  args = measure.op_args(p.op, x)
  ref = measure.reference(p.op, x)
  rows: dict[str, Row] = {}
  fns = {}
  shape = f"[{p.m},{p.k}]x[{p.g},{p.k},{p.n}]"
  for label, (b, cfg) in kernel_variants(p, backends, lut, device_kind).items():
    row = rows[label] = Row(name, shape, p.op, label, _short(cfg))
    interpret = default_interpret(b)
    if interpret:
      row.variant += " [interpret]"
    fn = measure.build_op(p, b, cfg, interpret)
    try:
      compiled = measure.compile_fn(fn, args)
      res = measure.check(p, jax.block_until_ready(compiled(*args)), ref)
    except Exception as e:  # noqa: BLE001 - a failing variant is reported, not fatal
      row.status = "error: " + measure.error_text(e, 160)
      continue
    if not res.passed:
      row.status = f"{res.status}: {res.summary()}"  # never timed: a wrong kernel has no speed
      continue
    fns[label] = (fn, args, compiled)
  for label, (fn, a) in {
    "xla ragged_dot": (measure.build_op(p, kernels.registry.REFERENCE, None, False), args),
    "dense matmul, same FLOPs": (measure.dense_matmul, measure.dense_args(p, x)),
  }.items():
    rows[label] = Row(name, shape, p.op, label, "")
    fns[label] = (fn, a, measure.compile_fn(fn, a))
  times, timer = measure.time_variants(fns, on_device=on_device, warmup=2, iters=5, samples=samples)
  xla_s = times.get("xla ragged_dot")
  for label, t in times.items():
    r = rows[label]
    r.ms, r.timer = t * 1e3, timer
    r.tflops = measure.flops(p) / t / 1e12
    moved = measure.dense_bytes(fns[label][1]) if label.startswith("dense") else measure.bytes_moved(p)
    r.gbps = moved / t / 1e9
    r.pct_matmul_peak = 100 * r.tflops / peak_tf if peak_tf else None
    r.pct_copy_bw = 100 * r.gbps / copy_gbps if copy_gbps else None
    r.vs_xla = xla_s / t if xla_s else None
  return list(rows.values())


def _short(cfg) -> str:
  if cfg is None:
    return ""
  d = cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg)
  return " ".join(f"{k}={v}" for k, v in d.items())


def _fmt(v, spec: str) -> str:
  return "" if v is None else format(v, spec)


def print_table(rows: list[Row]) -> None:
  head = (
    f"{'anchor':<13}{'op':<5}{'variant':<44}{'ms':>9}{'TF/s':>8}{'%mm':>6}{'GB/s':>8}{'%copy':>7}{'vs xla':>8}  status"
  )
  print(head)
  print("-" * len(head))
  for r in rows:
    print(
      f"{r.anchor:<13}{r.op:<5}{r.variant[:43]:<44}{_fmt(r.ms, '.3f'):>9}{_fmt(r.tflops, '.1f'):>8}"
      f"{_fmt(r.pct_matmul_peak, '.0f'):>6}{_fmt(r.gbps, '.0f'):>8}{_fmt(r.pct_copy_bw, '.0f'):>7}"
      f"{_fmt(r.vs_xla, '.2f'):>8}  {r.status}"
    )


def is_kernel(r: Row) -> bool:
  return r.status == "ok" and r.variant.split(" ")[0] in kernels.registry.tunable()


def target_summary(rows: list[Row]) -> list[str]:
  """Each target and where the best kernel variant of each problem stands against it."""
  best: dict[tuple[str, str], Row] = {}
  for r in rows:
    if is_kernel(r) and r.ms is not None and ((r.anchor, r.op) not in best or r.ms < best[(r.anchor, r.op)].ms):
      best[(r.anchor, r.op)] = r
  lines = []
  prefill = [r.vs_xla for (a, _), r in best.items() if ANCHORS[a][4] and r.vs_xla]
  if prefill:
    gm = statistics.geometric_mean(prefill)
    lines.append(
      f"geomean speedup vs XLA over prefill problems: {gm:.2f}x (target >= {TARGETS['geomean_vs_xla_prefill']}x)"
    )
  if best:
    worst = min((r for r in best.values() if r.vs_xla), key=lambda r: r.vs_xla, default=None)
    if worst is not None:
      lines.append(
        f"lowest speedup vs XLA: {worst.vs_xla:.2f}x on {worst.anchor} {worst.op} "
        f"(target >= {TARGETS['min_vs_xla']}x everywhere)"
      )
  mx = best.get(("mixtral-8x7b", "fwd"))
  if mx:
    lines.append(
      f"mixtral-8x7b fwd: {mx.tflops:.1f} TF/s with {mx.variant} (target >= {TARGETS['mixtral_fwd_tflops']})"
    )
  for (a, op), r in sorted(best.items()):
    if not ANCHORS[a][4] and r.pct_copy_bw is not None:
      lines.append(
        f"{a} {op}: {r.gbps:.0f} GB/s = {r.pct_copy_bw:.0f}% of copy bandwidth "
        f"(target >= {TARGETS['decode_pct_copy']}%)"
      )
  missing = sorted({(r.anchor, r.op) for r in rows} - set(best))
  for a, op in missing:
    lines.append(f"{a} {op}: no kernel variant passed the check")
  return lines


def write_csv(path: str, rows: list[Row]) -> None:
  """All rows so far, written atomically: a run stopped midway keeps what it measured."""
  tmp = f"{path}.tmp"
  with open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    for r in rows:
      w.writerow(
        {c: (float(f"{v:.4g}") if isinstance(v, float) and math.isfinite(v) else v) for c, v in vars(r).items()}
      )
  os.replace(tmp, path)


def _stop(signum, frame):  # a time limit's SIGTERM ends the run as Ctrl-C does: rows so far are kept
  raise KeyboardInterrupt


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", default=",".join(ANCHORS), help=f"anchors, comma-separated: {', '.join(ANCHORS)}")
  ap.add_argument("--ops", default="fwd,dlhs,drhs")
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--lut", default=None, help="LUT file or results folder: also time each backend's tuned config")
  ap.add_argument(
    "--m-scale", type=float, default=1.0, help="scale every anchor's m (e.g. 0.5 if memory or time is short)"
  )
  ap.add_argument("--samples", type=int, default=10, help="profiler samples per variant (tune-jax)")
  ap.add_argument("--csv", default=None, help="write the rows here too")
  args = ap.parse_args(argv)

  names = [a.strip() for a in args.only.split(",") if a.strip()]
  ops = [o.strip() for o in args.ops.split(",") if o.strip()]
  bad = [a for a in names if a not in ANCHORS] + [o for o in ops if o not in kernels.common.OPS]
  if bad:
    print(
      f"error: unknown anchor or op {bad}; anchors: {list(ANCHORS)}, ops: {list(kernels.common.OPS)}", file=sys.stderr
    )
    return 2
  on_device = jax.default_backend() != "cpu"
  dev = jax.devices()[0]
  lut = None
  if args.lut:
    try:
      lut = kernels.load_lut(args.lut)
    except kernels.LutError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  ceil = ceilings.measure_ceilings([args.dtype], dev.platform)
  peak_tf, copy_gbps = ceil["matmul_tflops"][args.dtype], ceil["copy_gbps"]
  print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}")
  print(
    f"ceilings, measured now: {args.dtype} matmul {ceil['sizes']['matmul_n']}^3 {peak_tf:.1f} TF/s; "
    f"copy {ceil['sizes']['copy_bytes'] / 2**30:.1f} GiB {copy_gbps:.0f} GB/s (read + write); timer: {ceil['timer']}"
  )
  if not on_device:
    print("NOTE: CPU host: shapes shrunk and the Pallas kernel interpreted. These are not GPU speeds.")
  backends = gpu_backends(on_device)
  if not backends:
    print(f"error: no GPU kernel backend runs on {dev.platform}; this benchmark is for GPUs", file=sys.stderr)
    return 2
  rows: list[Row] = []
  signal.signal(signal.SIGTERM, _stop)
  try:
    for name in names:
      m, k, n, g = anchor_shape(name, on_device, args.m_scale)
      sizes = tuple(int(s) for s in GroupDist(dist="multinomial", seed=0).draw(m, g))
      for op in ops:
        p = Problem(op, backends[0], args.dtype, m, k, n, g, "multinomial(seed=0)", sizes)
        print(f"== {name} {op} [{m},{k}]x[{g},{k},{n}]", flush=True)
        try:
          got = bench_problem(name, p, backends, lut, dev.device_kind, on_device, peak_tf, copy_gbps, args.samples)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory on one anchor: report it, go on
          got = [Row(name, f"[{m},{k}]x[{g},{k},{n}]", op, "(all)", "", "error: " + measure.error_text(e, 200))]
        print_table(got)
        rows += got
        if args.csv:
          write_csv(args.csv, rows)
        jax.clear_caches()
  except KeyboardInterrupt:
    print("\ninterrupted: the summary below covers the problems finished so far")
  print("\n== all problems")
  print_table(rows)
  timers = sorted({r.timer for r in rows if r.timer})
  print(f"timer: {'; '.join(timers)}")
  print("\n== targets")
  for line in target_summary(rows):
    print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
