"""Launch order of the GPU kernels: program_tile / launch_cell are bijections onto the work,
the band knob reaches its two extremes, and every band gives the same numbers."""

import itertools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import np_ragged_dot, rand
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import common, registry
from kernels.pallas_gpu import gmm as gpu_gmm
from kernels.pallas_gpu import tgmm as gpu_tgmm

HI = jax.lax.Precision.HIGHEST


@settings(max_examples=200, deadline=None)
@given(num_tiles=st.integers(1, 40), num_cols=st.integers(1, 12), group_m=st.integers(1, 50))
def test_gmm_program_tile_is_a_bijection(num_tiles, num_cols, group_m):
  cells = [gpu_gmm.program_tile(pid, num_tiles, num_cols, group_m) for pid in range(num_tiles * num_cols)]
  assert sorted(cells) == list(itertools.product(range(num_tiles), range(num_cols)))
  # Bands: slots of one band touch only its group_m tiles, and walk every column.
  for band_start in range(0, num_tiles, group_m):
    band = range(band_start, min(num_tiles, band_start + group_m))
    slots = range(band_start * num_cols, (band_start + len(band)) * num_cols)
    assert {cells[s][0] for s in slots} == set(band)


@settings(max_examples=100, deadline=None)
@given(groups=st.integers(1, 6), nk=st.integers(1, 7), nn=st.integers(1, 7), group_k=st.integers(1, 9))
def test_tgmm_program_tile_is_a_bijection_with_the_group_slowest(groups, nk, nn, group_k):
  cells = [gpu_tgmm.program_tile(pid, groups, nk, nn, group_k) for pid in range(groups * nk * nn)]
  assert sorted(cells) == list(itertools.product(range(groups), range(nk), range(nn)))
  assert [c[0] for c in cells] == sorted(c[0] for c in cells), "the group is the slowest axis"


def test_band_extremes_are_the_two_classic_orders():
  tiles, cols = 5, 3
  n_fastest = [gpu_gmm.program_tile(p, tiles, cols, 1) for p in range(tiles * cols)]
  m_fastest = [gpu_gmm.program_tile(p, tiles, cols, tiles) for p in range(tiles * cols)]
  assert n_fastest == [(t, c) for t in range(tiles) for c in range(cols)]
  assert m_fastest == [(t, c) for c in range(cols) for t in range(tiles)]
  assert m_fastest == [gpu_gmm.program_tile(p, tiles, cols, 1000) for p in range(tiles * cols)]


def test_program_tile_runs_on_ints_numpy_and_traced_int32():
  pids = np.arange(7 * 4)
  t_np, c_np = gpu_gmm.program_tile(pids, 7, 4, 3)
  traced = jax.jit(jax.vmap(lambda p, n: gpu_gmm.program_tile(p, n, 4, 3), in_axes=(0, None)))
  t_jx, c_jx = traced(jnp.asarray(pids, jnp.int32), jnp.int32(7))
  py = [gpu_gmm.program_tile(int(p), 7, 4, 3) for p in pids]
  assert [tuple(x) for x in zip(t_np, c_np)] == py == [tuple(x) for x in zip(np.asarray(t_jx), np.asarray(c_jx))]


@settings(max_examples=20, deadline=None)
@given(
  sizes=st.lists(st.integers(0, 70), min_size=1, max_size=8),
  slack=st.integers(0, 40),
  block_m=st.sampled_from([16, 32]),
  num_cols=st.integers(1, 5),
  group_m=st.integers(1, 6),
)
def test_launch_cell_covers_every_scheduled_tile_once_and_keeps_bands_in_a_group(
  sizes, slack, block_m, num_cols, group_m
):
  m = max(1, sum(sizes) + slack)
  g = len(sizes)
  starts, ends = common.segment_bounds(jnp.asarray(sizes, jnp.int32), m, jnp.int32(0), g)
  sched = common.tile_schedule(starts, ends, block_m, common.num_tiles_bound(m, block_m, g)).to_numpy()
  active = int(sched.active[0])
  pids = np.arange(active * num_cols)
  tile, col = gpu_gmm.launch_cell(
    pids, sched.tile_segment, sched.segment_first_tile, sched.segment_num_tiles, num_cols, group_m
  )
  assert sorted(zip(tile.tolist(), col.tolist())) == list(itertools.product(range(active), range(num_cols)))
  # Segments run in row order, so the slots of a band never hold tiles of two segments.
  assert (np.diff(sched.tile_segment[tile]) >= 0).all()


def test_configs_share_a_launch_key_when_they_launch_alike():
  """pallas_gpu's launch_key (one timing per key) clamps group_m to the widest group's
  group-start tiles: two bands get one key exactly when gmm walks its cells in the same order.
  The middle group's 80 rows take 2 tiles from its first row (3 on the aligned grid)."""
  m, k, n, sizes, block_m, cols = 256, 64, 192, (60, 80, 116), 64, 3
  starts, ends = common.segment_bounds(jnp.asarray(sizes, jnp.int32), m, jnp.int32(0), len(sizes))
  bound = common.num_tiles_bound(m, block_m, len(sizes))
  sched = common.tile_schedule(starts, ends, block_m, bound, group_start=True).to_numpy()
  pids = np.arange(int(sched.active[0]) * cols)
  keys, orders = {}, {}
  for group_m in range(1, 6):
    cfg = kernels.TritonConfig(block_m, 64, 64, 4, 3, group_m=group_m)
    keys[group_m] = registry.get("pallas_gpu").launch_key(cfg, "fwd", m, k, n, sizes)
    cells = gpu_gmm.launch_cell(
      pids, sched.tile_segment, sched.segment_first_tile, sched.segment_num_tiles, cols, group_m
    )
    orders[group_m] = np.stack(cells).tolist()
  for a, b in itertools.combinations(keys, 2):
    assert (keys[a] == keys[b]) == (orders[a] == orders[b]), (a, b)


CFG = dict(block_m=16, block_k=16, block_n=16, num_warps=4, num_stages=2)


@pytest.mark.parametrize("group_m", [1, 2, 3, 64])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_gives_the_same_numbers_for_every_band(group_m, transpose_rhs):
  m, k, n, sizes = 150, 40, 56, [30, 0, 61, 7, 35]  # 10 row tiles, 4 column blocks, an empty group
  g = len(sizes)
  lhs = rand(1, (m, k), jnp.float32)
  rhs = rand(2, (g, n, k) if transpose_rhs else (g, k, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  cfg = kernels.TritonConfig(**CFG, group_m=group_m)
  out = gpu_gmm.gmm(
    lhs, rhs, gs, config=cfg, out_dtype=jnp.float32, transpose_rhs=transpose_rhs, precision=(HI, HI), interpret=True
  )
  ref = np_ragged_dot(lhs, rhs, sizes, transpose_rhs=transpose_rhs)
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, atol=1e-4, rtol=1e-4)
  assert not np.asarray(out)[sum(sizes) :].any()


def _reversed_launch(monkeypatch):
  """Run gmm's programs last to first (the interpreter runs them in launch order): a tile
  that wrote rows of the next segment would then overwrite that segment's own results."""
  cell = gpu_gmm.launch_cell

  def reversed_cell(pid, tile_segment, segment_first_tile, segment_num_tiles, num_col_blocks, group_m):
    last = segment_first_tile.shape[0] - 1
    slots = (segment_first_tile[last] + segment_num_tiles[last]) * num_col_blocks
    return cell(slots - 1 - pid, tile_segment, segment_first_tile, segment_num_tiles, num_col_blocks, group_m)

  monkeypatch.setattr(gpu_gmm, "launch_cell", reversed_cell)


def test_gmm_stores_only_its_own_segments_rows_in_any_order(monkeypatch):
  """Group-start tiles reach into the next group's rows and past m (a multiple of block_m);
  whatever order the programs run in, each row holds its own group's product."""
  m, k, n, sizes = 64, 24, 16, [5, 0, 20, 3, 29]  # tiles start at rows 0, 5, 21, 25, 28, 44 and 57 (to 73 > m)
  lhs, rhs = rand(8, (m, k), jnp.float32), rand(9, (len(sizes), k, n), jnp.float32)
  _reversed_launch(monkeypatch)
  cfg = kernels.TritonConfig(**CFG, group_m=2)
  out = gpu_gmm.gmm(
    lhs, rhs, jnp.array(sizes, jnp.int32), config=cfg, out_dtype=jnp.float32, precision=(HI, HI), interpret=True
  )
  np.testing.assert_allclose(np.asarray(out, np.float64), np_ragged_dot(lhs, rhs, sizes), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("group_k", [1, 2, 5])
def test_tgmm_gives_the_same_numbers_for_every_band(group_k):
  m, k, n, sizes = 90, 48, 40, [20, 0, 41, 9]  # 3 k blocks x 3 n blocks per group; sum < m
  lhs, dout = rand(3, (m, k), jnp.float32), rand(4, (m, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  cfg = kernels.TritonConfig(**CFG, group_k=group_k)
  out = gpu_tgmm.tgmm(
    lhs, dout, gs, num_groups=4, config=cfg, out_dtype=jnp.float32, precision=(HI, HI), interpret=True
  )
  _, vjp = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs, precision=HI), lhs, jnp.zeros((4, k, n)))
  np.testing.assert_allclose(out, vjp(dout)[1], atol=1e-4, rtol=1e-4)
  assert not np.asarray(out)[1].any(), "an empty group's gradient is 0"


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_unmasked_fast_path_when_dims_are_block_multiples(op):
  """m, k and n all multiples of the blocks: loads carry no k or n bounds masks."""
  m, k, n, sizes = 64, 32, 48, [16, 0, 40]
  lhs, rhs, dout = rand(5, (m, k), jnp.float32), rand(6, (3, k, n), jnp.float32), rand(7, (m, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  cfg = kernels.TritonConfig(**CFG, group_m=2, group_k=2)
  f = lambda a, b: kernels.ragged_dot(a, b, gs, precision=HI, backend="pallas_gpu", config=cfg)
  r = lambda a, b: jax.lax.ragged_dot(a, b, gs, precision=HI)
  if op == "fwd":
    np.testing.assert_allclose(f(lhs, rhs), r(lhs, rhs), atol=1e-5)
    return
  got = jax.vjp(f, lhs, rhs)[1](dout)
  want = jax.vjp(r, lhs, rhs)[1](dout)
  i = 0 if op == "dlhs" else 1
  np.testing.assert_allclose(got[i], want[i], atol=1e-5)


def _loads(jaxpr):
  """(ref shape, mask or None) of every load in a kernel's jaxpr, its loops and conds included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "masked_load":
      ref, _, mask, _ = eqn.params["args_tree"].unflatten(eqn.invars)
      yield ref.aval.shape, mask
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _loads(sub)


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_masks_lhs_rows_past_m_when_m_is_a_block_multiple(transpose_rhs):
  """A group-start tile may start anywhere, so its rows can run past m for any m: every lhs
  load is masked (on a GPU an unmasked one reads past the array; the interpreter would drop
  those rows at the store and never notice)."""
  m, k, n, g = 64, 32, 48, 3
  cfg = kernels.TritonConfig(**CFG)
  rhs = jnp.zeros((g, n, k) if transpose_rhs else (g, k, n))
  f = lambda x, w, s: gpu_gmm.gmm(x, w, s, config=cfg, out_dtype=jnp.float32, transpose_rhs=transpose_rhs)
  jaxpr = jax.make_jaxpr(f)(jnp.zeros((m, k)), rhs, jnp.zeros((g,), jnp.int32))
  (call,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
  masks = [mask for shape, mask in _loads(call.params["jaxpr"]) if shape == (m, k)]
  assert masks and all(mask is not None for mask in masks)
