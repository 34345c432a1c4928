"""Which candidates of a problem to time, and in what order: a small pluggable strategy.

A strategy sees the pruned candidate list (search_space.candidates) and the results so
far, and proposes the next batch; an empty batch ends the problem. Configs are treated
generically: frozen dataclasses whose fields are knobs. Two configs are neighbours when
they have the same type and differ in exactly one field.

- Exhaustive: every candidate, in the given order (the default without --budget).
- Staged(budget): stage 1 times a coarse design (the default, the nearest LUT entry's
  config, then configs spread over the space by farthest-point sampling on the knobs'
  ranks); stage 2 spends the rest on one-knob neighbours of the best few, until the
  budget is spent. When the best few have no untried neighbour left, the design is
  extended (farthest from everything tried) instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

# History: candidate -> seconds, or None when it failed (compile error, wrong, timeout, ...).
History = dict[Any, "float | None"]


class Strategy(Protocol):
  def next_batch(self, history: History) -> list: ...


class Exhaustive:
  def __init__(self, candidates: Sequence):
    self.candidates = list(candidates)

  def next_batch(self, history: History) -> list:
    return [c for c in self.candidates if c not in history]


def _fields(c) -> tuple[str, ...]:
  return tuple(f.name for f in dataclasses.fields(c))


def neighbours(c, space: Sequence) -> list:
  """Configs of `space` of the same type as `c` that differ from it in exactly one field."""
  names = _fields(c)
  out = []
  for o in space:
    if type(o) is not type(c) or o == c:
      continue
    if sum(getattr(o, f) != getattr(c, f) for f in names) == 1:
      out.append(o)
  return out


def _coordinates(space: Sequence) -> dict[Hashable, tuple[float, ...]]:
  """Each config as the normalised rank of each of its knob values (0..1 per knob)."""
  names = _fields(space[0])
  ranks = {}
  for f in names:
    values = sorted({getattr(c, f) for c in space}, key=lambda v: (isinstance(v, str), v))
    ranks[f] = {v: (i / (len(values) - 1) if len(values) > 1 else 0.0) for i, v in enumerate(values)}
  return {c: tuple(ranks[f][getattr(c, f)] for f in names) for c in space}


def coarse_design(space: Sequence, n: int, seeds: Sequence = ()) -> list:
  """Up to n configs spread over the space: greedy farthest-point from the seeds."""
  if not space or n <= 0:
    return []
  coords = _coordinates(space)
  chosen = [s for s in dict.fromkeys(seeds) if s in coords][:n]
  if not chosen:
    chosen = [space[0]]
  dist = {c: min(math.dist(coords[c], coords[s]) for s in chosen) for c in space}
  while len(chosen) < min(n, len(space)):
    nxt = max(space, key=lambda c: dist[c])  # ties: the earliest in the (seeded) order
    if dist[nxt] == 0:
      break
    chosen.append(nxt)
    for c in space:
      dist[c] = min(dist[c], math.dist(coords[c], coords[nxt]))
  return chosen


class Staged:
  """Coarse design, then one-knob neighbours of the best few, within `budget` candidates."""

  def __init__(
    self,
    candidates: Sequence,
    budget: int,
    seeds: Sequence = (),
    *,
    stage1_share: float = 0.4,
    top: int = 3,
    batch: int = 4,
  ):
    self.space = list(dict.fromkeys(candidates))
    self.budget = max(1, budget)
    self.seeds = [s for s in seeds if s is not None]
    self.stage1 = max(1, min(len(self.space), int(self.budget * stage1_share)))
    self.top, self.batch = top, batch
    self._stage1_done = False

  def next_batch(self, history: History) -> list:
    left = self.budget - len(history)
    if left <= 0 or not self.space:
      return []
    if not self._stage1_done:
      self._stage1_done = True
      design = coarse_design(self.space, self.stage1, self.seeds)
      todo = [c for c in design if c not in history][:left]
      if todo:
        return todo
    ok = sorted(((t, i, c) for i, (c, t) in enumerate(history.items()) if t is not None), key=lambda x: x[:2])
    coords = self._coords()
    batch: list = []
    for _, _, best in ok[: self.top]:
      # Nearest values of each knob first: the coarse design already sampled the far ones.
      nbs = sorted(neighbours(best, self.space), key=lambda nb: math.dist(coords[nb], coords[best]))
      for nb in nbs:
        if nb not in history and nb not in batch:
          batch.append(nb)
      if len(batch) >= self.batch:
        break  # climb from the very best first; the next round sees its results
    if not batch:  # the best few have no untried neighbour: spread out further instead
      tried = list(history)
      batch = [c for c in coarse_design(self.space, len(tried) + self.batch, tried) if c not in history]
    return batch[: min(left, self.batch)]

  def _coords(self):
    if not hasattr(self, "_coord_cache"):
      self._coord_cache = _coordinates(self.space)
    return self._coord_cache


WEIGHT_RANGE = (0.5, 2.0)  # a problem's budget: between half and twice the one given


def weighted_budgets(calls: dict[str, int], budget: int | None) -> dict[str, int | None]:
  """Per problem key, its share of `budget` by its calls a step (a captured shape file's
  `ops: {op: calls}`; 1 elsewhere): budget x calls / the mean of the set's calls, within
  WEIGHT_RANGE of budget and at least 1, so a step's hot problems are searched longer and the
  sweep's total stays near budget x problems. None (no budget) stays None."""
  if not budget or not calls:
    return dict.fromkeys(calls, budget)
  mean = sum(calls.values()) / len(calls)
  lo, hi = WEIGHT_RANGE
  return {key: max(1, round(budget * min(hi, max(lo, c / mean)))) for key, c in calls.items()}


def make(candidates: Sequence, budget: int | None, seeds: Sequence = ()) -> Strategy:
  return Staged(candidates, budget, seeds) if budget else Exhaustive(candidates)


def run_offline(strategy: Strategy, cost) -> History:
  """Drive a strategy with a cost function instead of a device (tests, benchmarks)."""
  history: History = {}
  while True:
    batch = strategy.next_batch(history)
    if not batch:
      return history
    for c in batch:
      history[c] = cost(c)
