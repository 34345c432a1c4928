"""Each backend's grid_work counts what its kernels launch: row tiles as the kernels'
schedule makes them, and grid steps as the pallas_call's grid."""

import math

import jax
import numpy as np
import pytest

from kernels import common, registry
from ragtune import measure
from ragtune.shapes import Problem


@pytest.mark.parametrize("block_m", [8, 16, 64])
def test_row_tiles_are_the_tile_schedules(block_m):
  g, m = 5, 160
  bound = common.num_tiles_bound(m, block_m, g)
  schedule = jax.jit(lambda sizes: common.tile_schedule(*common.segment_bounds(sizes, m, 0, g), block_m, bound))
  rng = np.random.default_rng(block_m)
  for _ in range(30):
    sizes = rng.integers(0, 40, g) * (rng.random(g) > 0.3)
    tiles, rest = common.row_tiles(tuple(int(s) for s in sizes), m, block_m)
    assert [0, *tiles, rest] == np.asarray(schedule(np.asarray(sizes, np.int32)).segment_num_tiles).tolist(), sizes


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_grid_steps_are_the_pallas_calls_grid(op):
  p = Problem(op, "pallas_gpu", "bfloat16", 100, 48, 80, 3, "x", (30, 0, 60))
  b = registry.get(p.backend)
  for cfg in (b.default_config(op, p.dtype, p.m, p.k, p.n, p.g, "cpu"), b.config_type(16, 16, 32)):
    x = measure.make_inputs(p)
    jaxpr = jax.make_jaxpr(measure.build_op(p, p.backend, cfg, True))(*measure.op_args(op, x))
    (call,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    grid = call.params["grid_mapping"].grid
    assert b.grid_work(cfg, op, p.m, p.k, p.n, p.group_sizes).steps == math.prod(grid), (op, cfg)
