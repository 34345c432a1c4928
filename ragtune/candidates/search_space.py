"""Candidate configs for a problem: its backend's search space (kernels/<backend>/config.py),
one config per distinct launch, the default first, in a fixed shuffled order."""

from __future__ import annotations

import random

from kernels import registry
from kernels.lut import current_device_kind
from ragtune.problems.shapes import Problem


def launch_key(cfg, p: Problem):
  """What `cfg` launches on `p` (the backend's launch_key): configs with the same key run
  the same kernel the same way."""
  return registry.get(p.backend).launch_key(cfg, p.op, p.m, p.k, p.n, tuple(p.group_sizes))


def candidates(p: Problem, max_candidates: int | None = None, seed: int = 0, device_kind: str | None = None) -> list:
  """The default config first, then the rest of the valid space in a fixed shuffled order.

  device_kind: the device being tuned (default: this host's first device); it bounds
  shared memory and picks the default. The order depends only on the problem and seed, so
  a resumed sweep with the same max_candidates picks the same subset.
  """
  backend = registry.get(p.backend)
  if backend.config_type is None:
    return []
  if device_kind is None:
    device_kind = current_device_kind()
  default = backend.default_config(p.op, p.dtype, p.m, p.k, p.n, p.g, device_kind)
  unique = list(dict.fromkeys(backend.space(p.op, p.dtype, p.m, p.k, p.n, device_kind)))
  random.Random(f"{seed}|{p.key}").shuffle(unique)
  ordered, seen = [], set()
  for cfg in [default] + unique:  # one config per distinct launch, the default first
    key = launch_key(cfg, p)
    if key not in seen:
      seen.add(key)
      ordered.append(cfg)
  return ordered[:max_candidates] if max_candidates else ordered
