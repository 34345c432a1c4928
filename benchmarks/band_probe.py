"""The Mosaic GPU forward's launch band (group_m) and narrow cells (narrow_tail), on the
prefill anchors, in one timer run per problem.

One H200 run (results/nvidia-h200) timed the default band of 16 at 8.14 ms on DeepSeek-V3 up
and a band of 4 at 6.01 ms, the same config otherwise, every row with narrow cells; the L2
model (l2_traffic.py) puts both at 1.07x the unique bytes. This probe times every band
(1, 2, 4, 8, 16) with and without narrow cells on each prefill anchor, beside pallas_gpu's
default and a dense matmul of the same FLOPs, so that the default can follow a measurement.
Bands that launch the same cells (a band wider than every group's row tiles,
MosaicConfig.launch_key) are timed once. Every variant is checked against the float32
reference first; one that fails is reported and not timed.

  python benchmarks/band_probe.py                 # fwd of Mixtral, DeepSeek-V3 up and down
  python benchmarks/band_probe.py --op dlhs       # their dlhs (gmm with rhs transposed)
  DEADLINE=240 python benchmarks/band_probe.py    # start no problem after 240 s
  python benchmarks/band_probe.py --tiny          # one small problem (a CPU: interpreted, untimed)

Writes $OUT/band_probe.csv (default: .) after each problem and prints a table; the timer is
the one `ragtune bench` uses (tune-jax's profiler on a device), named in each row.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402

from kernels import registry  # noqa: E402
from kernels.mosaic_gpu import config as mosaic_config  # noqa: E402
from ragtune.device import measure  # noqa: E402
from ragtune.problems.shapes import GroupDist, Problem  # noqa: E402

# name: (m, k, n, g), the prefill anchors of shapes/anchors.yaml (multinomial routing, seed 0)
PROBLEMS = {
  "Mixtral 8x7B": (8192, 4096, 14336, 8),
  "DeepSeek-V3 up": (131072, 7168, 2048, 256),
  "DeepSeek-V3 down": (131072, 2048, 7168, 256),
}
TINY = {"tiny": (512, 128, 512, 4)}
BANDS = (1, 2, 4, 8, 16)
COLUMNS = ("problem", "op", "variant", "config", "status", "ms", "tflops", "x_dense", "timer", "same_as")


def problem(op: str, m: int, k: int, n: int, g: int) -> Problem:
  sizes = tuple(int(s) for s in GroupDist(dist="multinomial", seed=0).draw(m, g))
  return Problem(op, "mosaic_gpu", "bfloat16", m, k, n, g, "multinomial(seed=0)", sizes)


def configs(p: Problem, device_kind: str) -> dict[str, mosaic_config.MosaicConfig]:
  """The default at each band, with and without narrow cells where they apply."""
  base = mosaic_config.default(p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind)
  out = {}
  for band in BANDS:
    for narrow in (True, False):
      cfg = dataclasses.replace(base, group_m=band, narrow_tail=narrow)
      if narrow and not cfg.narrow_tail_applies(p.op, p.dtype):
        continue
      out[f"mosaic_gpu band {band}{' narrow' if narrow else ''}"] = cfg
  return out


def run_problem(name: str, p: Problem, device: bool, device_kind: str) -> list[dict]:
  x = measure.make_inputs(p)
  args = measure.op_args(p.op, x)
  ref = measure.reference(p.op, x)
  rows, fns, launches = [], {}, {}
  interpret = not device

  def add(label, fn, fn_args, cfg_text, cfg=None, checked=True):
    row = dict(problem=name, op=p.op, variant=label, config=cfg_text, status="ok")
    rows.append(row)
    if cfg is not None:  # a band no wider than the groups' row tiles launches the same cells
      key = mosaic_config.launch_key(cfg, p.op, p.m, p.k, p.n, p.group_sizes)
      if key in launches:
        row["same_as"] = launches[key]
        return
      launches[key] = label
    try:
      compiled = measure.compile_fn(fn, fn_args)
      if checked:
        res = measure.check(p, compiled(*fn_args), ref)
        if not res.passed:
          row["status"] = "wrong: " + res.summary()
          return
      fns[label] = (fn, fn_args, compiled)
    except Exception as e:  # noqa: BLE001 - a variant that fails is a row, not the end
      row["status"] = measure.error_text(e, 300)

  for label, cfg in configs(p, device_kind).items():
    add(label, measure.build_op(p, "mosaic_gpu", cfg, interpret), args, str(cfg), cfg)
  tri = registry.default_config("pallas_gpu", p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=device_kind)
  add("pallas_gpu default", measure.build_op(p, "pallas_gpu", tri, interpret), args, str(tri))
  add("dense, same FLOPs", measure.dense_matmul, measure.dense_args(p, x), "", checked=False)
  if not device:
    return rows  # an interpreter's time says nothing of a GPU's
  times, timer = measure.time_variants(fns, on_device=True, samples=10)
  dense = times.get("dense, same FLOPs")
  for row in rows:
    t = times.get(row["variant"])
    if t is not None:
      row.update(ms=f"{t * 1e3:.4g}", tflops=f"{measure.flops(p) / t / 1e12:.4g}", timer=timer)
      row["x_dense"] = f"{dense / t:.3f}" if dense else ""
  return rows


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--op", choices=("fwd", "dlhs"), default="fwd")
  ap.add_argument("--tiny", action="store_true", help="one small problem, for a CPU trial")
  args = ap.parse_args(argv)
  t0, deadline = time.time(), float(os.environ.get("DEADLINE", "inf"))
  dev = jax.devices()[0]
  device = dev.platform == "gpu"
  path = os.path.join(os.environ.get("OUT", "."), "band_probe.csv")
  print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}; writing {path}", flush=True)
  if not device:
    print("no GPU: the kernels run in the interpreter and every variant is checked, none timed", flush=True)
  rows = []
  for name, shape in (TINY if args.tiny else PROBLEMS).items():
    if time.time() - t0 > deadline:
      print(f"deadline: {name} and the problems after it not run", flush=True)
      break
    p = problem(args.op, *shape)
    got = run_problem(name, p, device, dev.device_kind)
    rows += got
    with open(path + ".tmp", "w", newline="") as f:
      w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
      w.writeheader()
      w.writerows(rows)
    os.replace(path + ".tmp", path)
    print(f"\n== {args.op} {name} {p.shape_label} ({time.time() - t0:.0f} s)")
    for r in got:
      what = f"= {r['same_as']}" if r.get("same_as") else r["status"][:90]
      figures = (
        f"{r.get('ms', ''):>8} ms {r.get('tflops', ''):>6} TF/s {r.get('x_dense', ''):>6}x dense" if r.get("ms") else ""
      )
      print(f"  {r['variant']:28} {figures:38} {what}", flush=True)
  return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
