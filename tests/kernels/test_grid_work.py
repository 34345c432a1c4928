"""Each backend's grid_work counts what its kernels launch: row tiles as the kernels'
schedule makes them, and grid steps as the pallas_call's grid."""

import math

import jax
import numpy as np
import pytest

from kernels import common, registry
from ragtune.device import measure
from ragtune.problems.shapes import Problem


@pytest.mark.parametrize("group_start, align", [(False, 1), (True, 1), (True, 8)])
@pytest.mark.parametrize("block_m", [8, 16, 64])
def test_row_tiles_are_the_tile_schedules(block_m, group_start, align):
  g, m = 5, 160
  bound = common.num_tiles_bound(m, block_m, g)
  schedule = jax.jit(
    lambda sizes: common.tile_schedule(
      *common.segment_bounds(sizes, m, 0, g), block_m, bound, group_start=group_start, align=align
    )
  )
  rng = np.random.default_rng(block_m)
  for _ in range(30):
    sizes = rng.integers(0, 40, g) * (rng.random(g) > 0.3)
    tiles, rest = common.row_tiles(tuple(int(s) for s in sizes), m, block_m, group_start, align)
    sched = schedule(np.asarray(sizes, np.int32))
    assert [0, *tiles, rest] == np.asarray(sched.segment_num_tiles).tolist(), sizes
    # Every row of [0, m) is covered by exactly one tile of its own segment.
    starts, ends = (np.asarray(a) for a in common.segment_bounds(np.asarray(sizes, np.int32), m, 0, g))
    owner = np.zeros(m, int)
    for t in range(int(sched.active[0])):
      seg, row0 = int(sched.tile_segment[t]), int(sched.tile_row_start[t])
      lo, hi = max(row0, starts[seg]), min(row0 + block_m, ends[seg])
      assert hi > lo, (t, sizes)
      if group_start:  # a tile starts in its segment (up to align - 1 rows before it); only the last is partial
        assert row0 > starts[seg] - align and row0 % align == 0, (t, sizes)
        assert row0 + block_m >= ends[seg] or lo == max(row0, starts[seg]) and hi == row0 + block_m, (t, sizes)
      owner[lo:hi] += 1
    assert (owner == 1).all(), sizes


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_grid_steps_are_the_pallas_calls_grid(op):
  p = Problem(op, "pallas_gpu", "bfloat16", 100, 48, 80, 3, "x", (30, 0, 60))
  b = registry.get(p.backend)
  for cfg in (b.default_config(op, p.dtype, p.m, p.k, p.n, p.g, "cpu"), b.config_type(16, 16, 32)):
    x = measure.make_inputs(p)
    jaxpr = jax.make_jaxpr(measure.build_op(p, p.backend, cfg, True))(*measure.op_args(op, x))
    (call,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    grid = call.params["grid_mapping"].grid
    work = b.grid_work(cfg, op, p.m, p.k, p.n, p.group_sizes)
    assert work.steps == math.prod(grid), (op, cfg)
    if op != "drhs":  # gmm: the row tiles its schedule made (its first operand's "active") x column blocks
      before = jaxpr.jaxpr.replace(eqns=jaxpr.jaxpr.eqns[: jaxpr.jaxpr.eqns.index(call)], outvars=[call.invars[0]])
      (packed,) = jax.core.eval_jaxpr(before, jaxpr.consts, *measure.op_args(op, x))
      rows, contraction, cols = common.op_dims(op, p.m, p.k, p.n)
      clamped = cfg.clamped(rows, contraction, cols)
      layout = common.ScheduleLayout(common.num_tiles_bound(rows, clamped.block_m, p.g), p.g + 2, 1)
      assert packed.shape == (layout.length,), (packed.shape, layout)
      tiles = int(layout.tables(np.asarray(packed))["active"][0])
      assert work.tile_steps == tiles * -(-cols // clamped.block_n), (op, cfg)
