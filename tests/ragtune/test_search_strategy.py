"""Staged search on a known synthetic cost surface over the real config space, with a fake timer."""

import dataclasses
import random

import pytest

from ragtune.candidates import search_space, search_strategy
from ragtune.problems.shapes import Problem


def _space(op="fwd", backend="pallas_gpu"):
  p = Problem(op, backend, "bfloat16", 4096, 4096, 14336, 8, "multinomial(seed=0)", (512,) * 8)
  return p, search_space.candidates(p)


def _surface(space, seed):
  """A smooth surface in the knobs' ranks with a random optimum, random weights and a
  coupling between the first two knobs, so the optimum is not found knob by knob alone."""
  rng = random.Random(seed)
  names = [f.name for f in dataclasses.fields(space[0])]
  ranks = {f: sorted({getattr(c, f) for c in space}, key=lambda v: (isinstance(v, str), v)) for f in names}
  target = rng.choice(space)
  weights = {f: rng.uniform(0.05, 0.6) for f in names}

  def r(c, f):
    vals = ranks[f]
    return vals.index(getattr(c, f)) / max(1, len(vals) - 1)

  def cost(c):
    t = 1.0
    for f in names:
      t *= 1 + weights[f] * (r(c, f) - r(target, f)) ** 2 * 4
    d01 = (r(c, names[0]) - r(target, names[0])) - (r(c, names[1]) - r(target, names[1]))
    return 1e-3 * t * (1 + 0.3 * d01**2)

  return cost


# The GPU space (hundreds of configs) is what a budget is for; the TPU space is 64 configs.
@pytest.mark.parametrize("op,backend", [("fwd", "pallas_gpu"), ("dlhs", "pallas_gpu"), ("drhs", "pallas_gpu")])
@pytest.mark.parametrize("seed", range(5))
def test_staged_search_finds_the_optimum_timing_a_fifth_of_the_space(op, backend, seed):
  p, space = _space(op, backend)
  cost = _surface(space, seed)
  budget = len(space) // 5
  strategy = search_strategy.Staged(space, budget, seeds=space[:1])
  timed = []
  history = search_strategy.run_offline(strategy, lambda c: timed.append(c) or cost(c))
  assert len(timed) == len(set(timed)) <= budget, "each candidate timed once, within the budget"
  best = min(cost(c) for c in space)
  found = min(t for t in history.values() if t is not None)
  assert found <= 1.03 * best, (found / best, len(timed), len(space))


def test_failed_candidates_do_not_stop_the_search():
  _, space = _space()
  cost = _surface(space, 7)
  bad = set(space[1::3])  # a third of the space fails (wrong, timeout, ...)
  history = search_strategy.run_offline(
    search_strategy.Staged(space, len(space) // 5), lambda c: None if c in bad else cost(c)
  )
  ok = [t for t in history.values() if t is not None]
  assert ok and min(ok) <= 1.03 * min(cost(c) for c in space if c not in bad)


def test_neighbours_differ_in_exactly_one_field_and_come_from_the_space():
  _, space = _space()
  c = space[0]
  nbs = search_strategy.neighbours(c, space)
  assert nbs and all(n in space for n in nbs)
  for n in nbs:
    assert sum(a != b for a, b in zip(dataclasses.astuple(n), dataclasses.astuple(c))) == 1


def test_without_budget_every_candidate_is_timed():
  _, space = _space("drhs")
  history = search_strategy.run_offline(search_strategy.make(space, None), lambda c: 1.0)
  assert list(history) == space


def test_search_quality_replays_a_recorded_sweep(tmp_path, capsys):
  import importlib.util
  import json
  from pathlib import Path

  from ragtune.records import store

  p, space = _space("drhs")
  cost = _surface(space, 3)
  dev = {"device_kind": "cpu", "platform": "cpu", "jax_version": "x"}
  rows = [store.make_row(p, store.candidate_id(c), c, "ok", interpret=False, device=dev, time_s=cost(c)) for c in space]
  (tmp_path / store.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
  path = Path(__file__).resolve().parents[2] / "benchmarks" / "search_quality.py"
  spec = importlib.util.spec_from_file_location("search_quality", path)
  sq = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(sq)
  (res,) = sq.replay(store.load_results([tmp_path]), budget_frac=0.2)
  assert res["space"] == len(space) and res["timed"] <= len(space) // 5 + 1 and res["ratio"] <= 1.03
  assert sq.main([str(tmp_path), "--budget", "10"]) == 0
  assert "found/best" in capsys.readouterr().out
