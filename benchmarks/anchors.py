"""The anchor benchmark: `ragtune bench shapes/anchors.yaml`, then the gap to our targets.

  python benchmarks/anchors.py                                 # GPU: every anchor, all 3 ops
  python benchmarks/anchors.py --lut results/nvidia-h100-80gb-hbm3 --csv anchors.csv
  python benchmarks/anchors.py --only mixtral-8x7b --op fwd

Anchors (bf16, multinomial routing, seed 0; shapes/anchors.yaml cites the model configs):
  mixtral-8x7b   [8192,4096]x[8,4096,14336]     4096 tokens x top-2; also tokamax's ragged_dot benchmark shape
  dsv3-up        [131072,7168]x[256,7168,2048]  DeepSeek-V3 prefill, 16384 tokens x top-8
  dsv3-down      [131072,2048]x[256,2048,7168]
  dsv3-decode    [512,7168]x[256,7168,2048]     64 tokens x top-8

Targets: at least 5x XLA as a geometric mean over the prefill problems and never below 1x,
at least 700 TF/s on Mixtral fwd, at least 85% of the copy bandwidth on decode. On a CPU
host `ragtune bench` times nothing, so there is nothing to hold against them.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from ragtune.cli.app import app  # noqa: E402
from ragtune.lut.bench import Row  # noqa: E402

ANCHORS = {  # name: (m, k, n, g, prefill)
  "mixtral-8x7b": (8192, 4096, 14336, 8, True),
  "dsv3-up": (131072, 7168, 2048, 256, True),
  "dsv3-down": (131072, 2048, 7168, 256, True),
  "dsv3-decode": (512, 7168, 2048, 256, False),
}
TARGETS = {"geomean_vs_xla_prefill": 5.0, "min_vs_xla": 1.0, "mixtral_fwd_tflops": 700.0, "decode_pct_copy": 85.0}
SHAPE_FILE = ROOT / "shapes" / "anchors.yaml"


def chosen(text: str, known, what: str) -> list[str]:
  """The comma-separated names of `text`, each one of `known`; else ValueError naming them."""
  names = [a.strip() for a in text.split(",") if a.strip()]
  bad = [a for a in names if a not in known]
  if bad or not names:
    raise ValueError(f"unknown {what} {bad}; one of {list(known)}")
  return names


def anchor_of(shape: str) -> str | None:
  """The anchor whose forward shape label ([m,k]x[g,k,n]) is `shape`."""
  return next((a for a, (m, k, n, g, _) in ANCHORS.items() if shape == kernels.lut.shape_text(m, k, n, g)), None)


def is_kernel(r: Row) -> bool:
  """A timed row of one of our kernels (a backend's default, or the LUT's choice of one)."""
  name = r.variant.removeprefix("LUT: ").split(" ")[0]
  return r.ms is not None and not r.failed and name in kernels.registry.tunable()


def target_summary(rows: list[Row]) -> list[str]:
  """Each target and where the best kernel variant of each anchor problem stands against it."""
  best: dict[tuple[str, str], Row] = {}
  for r in rows:
    key = (anchor_of(r.shape), r.op)
    if key[0] and is_kernel(r) and (key not in best or r.ms < best[key].ms):
      best[key] = r
  lines = []
  prefill = [r.vs_xla for (a, _), r in best.items() if ANCHORS[a][4] and r.vs_xla]
  if prefill:
    gm = statistics.geometric_mean(prefill)
    lines.append(
      f"geomean speedup vs XLA over prefill problems: {gm:.2f}x (target >= {TARGETS['geomean_vs_xla_prefill']}x)"
    )
  worst = min((r for r in best.values() if r.vs_xla), key=lambda r: r.vs_xla, default=None)
  if worst is not None:
    lines.append(
      f"lowest speedup vs XLA: {worst.vs_xla:.2f}x on {anchor_of(worst.shape)} {worst.op} "
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
  benched = {(anchor_of(r.shape), r.op) for r in rows if anchor_of(r.shape)}
  for a, op in sorted(benched - set(best)):
    lines.append(f"{a} {op}: no kernel variant passed the check and was timed")
  return lines


def read_rows(path: Path) -> list[Row]:
  """The rows of a `ragtune bench` CSV: empty numbers None, empty text ''."""
  text = [f.name for f in dataclasses.fields(Row) if f.type == "str"]
  df = pd.read_csv(path, dtype={c: str for c in text}).fillna({c: "" for c in text})
  return [Row(**{k: (None if pd.isna(v) else v) for k, v in rec.items()}) for rec in df.to_dict("records")]


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", default=",".join(ANCHORS), help=f"anchors, comma-separated: {', '.join(ANCHORS)}")
  ap.add_argument("--op", action="append", help="fwd, dlhs, drhs (repeat or comma-separate) [default: all]")
  ap.add_argument("--lut", default=None, help="as ragtune bench --lut")
  ap.add_argument("--samples", default="10", help="profiler samples per variant")
  ap.add_argument("--csv", default=None, help="also keep the rows here")
  args = ap.parse_args(argv)
  try:
    names = chosen(args.only, ANCHORS, "anchor")
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  cmd = ["bench", str(SHAPE_FILE), "--samples", args.samples]
  cmd += [f"--shape={m},{k},{n}" for m, k, n, _, _ in (ANCHORS[a] for a in names)]
  cmd += [f"--op={o}" for o in args.op or []] + (["--lut", args.lut] if args.lut else [])
  with tempfile.TemporaryDirectory() as tmp:
    csv = Path(args.csv or Path(tmp) / "anchors.csv")
    rc = app([*cmd, "--csv", str(csv)], prog_name="ragtune", standalone_mode=False)
    rows = read_rows(csv) if csv.is_file() else []
  print("\n== targets")
  lines = target_summary(rows)
  print("\n".join(lines) if lines else "nothing timed (a CPU host times nothing), so no target to report")
  return rc or 0


if __name__ == "__main__":
  sys.exit(main())
