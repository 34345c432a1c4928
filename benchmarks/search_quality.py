"""Replay a recorded full sweep with a budget: how close does the staged search get?

  python benchmarks/search_quality.py results/nvidia-h100-80gb-hbm3 --budget 40
  python benchmarks/search_quality.py results/cpu/records.jsonl --budget-frac 0.2

For each problem, the recorded candidates are the space and their recorded times the
cost (a failed candidate costs its slot and gives no time). The staged search
(ragtune/candidates/search_strategy.py) runs against those times, as a sweep with --budget would,
and its best is compared with the exhaustive best. Only meaningful on a sweep that timed
the whole pruned space (no --max-candidates, no --budget).
"""

import argparse
import statistics
import sys
from pathlib import Path

import kernels
from ragtune.candidates import search_strategy
from ragtune.records import store


def replay(records, budget=None, budget_frac=None):
  """One result dict per problem with at least one ok candidate."""
  by_problem = {}
  for r in records:
    if not r.baseline:
      by_problem.setdefault(r.problem.key, []).append(r)
  out = []
  for key, rs in sorted(by_problem.items()):
    cost = {}
    for r in rs:
      cfg = kernels.registry.config_from_dict(r.problem.backend, r.config)
      cost[cfg] = r.time_s if r.ok else None
    ok = [t for t in cost.values() if t is not None]
    if not ok:
      continue
    space = list(cost)
    b = budget or max(1, round(len(space) * budget_frac))
    p = rs[0].problem
    default = kernels.registry.default_config(
      p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind=rs[0].device_kind
    )
    seeds = [default] if default in cost else []
    hist = search_strategy.run_offline(search_strategy.Staged(space, b, seeds), lambda c: cost[c])
    found = [t for t in hist.values() if t is not None]
    best_found = min(found) if found else float("inf")
    out.append(
      {
        "problem": key,
        "space": len(space),
        "timed": len(hist),
        "exhaustive_s": min(ok),
        "found_s": best_found,
        "ratio": best_found / min(ok),
      }
    )
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("results", nargs="+", help="results folders or records.jsonl files")
  g = ap.add_mutually_exclusive_group()
  g.add_argument("--budget", type=int, help="candidates per problem")
  g.add_argument("--budget-frac", type=float, default=0.2, help="share of each problem's space (default 0.2)")
  args = ap.parse_args(argv)
  res = replay(store.load_results([Path(p) for p in args.results]), args.budget, args.budget_frac)
  if not res:
    print("no problem with a correct candidate in these results", file=sys.stderr)
    return 1
  print(f"{'problem':<58} {'space':>5} {'timed':>5} {'exhaustive ms':>13} {'found ms':>9} {'found/best':>10}")
  for r in res:
    print(
      f"{r['problem'][:58]:<58} {r['space']:>5} {r['timed']:>5} {r['exhaustive_s'] * 1e3:>13.4g} "
      f"{r['found_s'] * 1e3:>9.4g} {r['ratio']:>10.3f}"
    )
  ratios = [r["ratio"] for r in res]
  within = sum(x <= 1.03 for x in ratios)
  print(
    f"{len(res)} problems: median found/best {statistics.median(ratios):.3f}, worst {max(ratios):.3f}, "
    f"{within} within 3%; timed {sum(r['timed'] for r in res)} of {sum(r['space'] for r in res)} candidates"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
