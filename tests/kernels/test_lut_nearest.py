"""The LUT's nearest-entry rule on literal LUTs and queries, each answer worked out by hand.

`Lut.query` keeps the entries in the query's regime whose config fits, then takes the one
minimising |log2 m/m'| + 4 (|log2 k/k'| + |log2 n/n'|) + 0.5 |log2 g/g'|, ties to the larger
tuned m, then the larger k, n and g; with no backend named, the fastest measured entry at that shape, untimed ones last,
ties in the registry's order. test_lut_regime.py checks properties against `shape_distance`
itself; here every expected entry is a literal, so a changed weight or tie-break fails.
Each LUT is also tried in the reverse order, so an answer cannot come from insertion order.
"""

import pytest

import kernels
from kernels import lut as lut_mod

H100 = "NVIDIA H100 80GB HBM3"
TINY = kernels.TritonConfig(16, 16, 16, 2, 1)  # 1 KiB of shared memory: fits any shape
HUGE = kernels.TritonConfig(256, 256, 256, 8, 8)  # ~2 MiB of shared memory: fits none on an H100
MOSAIC = kernels.MosaicConfig(64, 128, 64, 2, 1)


def _entry(m, k, n, g, backend="pallas_gpu", config=None, **extra) -> kernels.Entry:
  if config is None and backend != "xla":
    config = TINY if backend == "pallas_gpu" else MOSAIC
  return kernels.Entry("fwd", backend, "bfloat16", m, k, n, g, config, extra)


def _luts(*entries):
  """The LUT of these entries, in the given order and reversed."""
  return [kernels.Lut(H100, entries), kernels.Lut(H100, entries[::-1])]


def _got(entries, m, k, n, g, backend="pallas_gpu"):
  """The (backend, m, k, n, g) that query returns, the same whatever the entries' order."""
  found = []
  for lut in _luts(*entries):
    e = lut.query("fwd", m, k, n, g, "bfloat16", backend=backend)
    found.append(None if e is None else (e.backend, e.m, e.k, e.n, e.g))
  assert found[0] == found[1], f"the answer depends on the entries' order: {found}"
  return found[0]


def _shape(e: kernels.Entry):
  return (e.backend, e.m, e.k, e.n, e.g)


def _why(e: kernels.Entry, m, k, n, g) -> str:
  """Why a LUT of `e` alone does not serve the query."""
  return kernels.Lut(H100, [e]).nearest_rejected("fwd", m, k, n, g, "bfloat16").reason


# --- the weights ----------------------------------------------------------------------


def test_a_k_or_n_step_costs_four_m_steps():
  """Query [1024,1024]x[8,1024,1024]: rows per group 1024/8 = 128."""
  m256 = _entry(256, 1024, 1024, 8)  # |log2 1024/256| = 2; rows 32 vs 128: 4x, in the regime
  k2x = _entry(1024, 2048, 1024, 8)  # 4 * |log2 1024/2048| = 4; k 2x apart: in the regime
  n_half = _entry(1024, 1024, 512, 8)  # 4 * |log2 1024/512| = 4
  assert _got([m256, k2x], 1024, 1024, 1024, 8) == _shape(m256)  # 2 < 4 (a weight of 0.25 gives k2x 0.25)
  assert _got([m256, n_half], 1024, 1024, 1024, 8) == _shape(m256)  # 2 < 4: n weighs as k does
  # k and n add: k 2x and n 2x is 4 * (1 + 1) = 8, farther than k 2x alone (4).
  kn = _entry(1024, 2048, 2048, 8)
  assert _got([kn, k2x], 1024, 1024, 1024, 8) == _shape(k2x)


def test_the_k_weight_is_four_exactly():
  """Fewer rows than groups: every entry below holds one row per group (max(m, g) / g = 1), so
  m may move 16x or 32x within the regime. Query [1,1024]x[256,1024,1024]."""
  k2x = _entry(1, 2048, 1024, 256)  # 4 * 1 = 4
  m16 = _entry(16, 1024, 1024, 256)  # log2 16 = 4: a tie with k2x, to the larger m
  m32 = _entry(32, 1024, 1024, 256)  # log2 32 = 5
  assert _got([k2x, m16], 1, 1024, 1024, 256) == _shape(m16)  # 4 = 4, m 16 > 1 (weight 3: k2x at 3 wins)
  assert _got([k2x, m32], 1, 1024, 1024, 256) == _shape(k2x)  # 4 < 5 (weight 5: a tie, m32 wins)


def test_a_g_step_costs_half_an_m_step():
  """Query [1,1024]x[64,1024,1024]: one row per group, here and in every entry."""
  g4x = _entry(1, 1024, 1024, 256)  # 0.5 * log2 256/64 = 0.5 * 2 = 1
  m4x = _entry(4, 1024, 1024, 64)  # log2 4 = 2
  m2x = _entry(2, 1024, 1024, 64)  # log2 2 = 1: a tie with g4x, to the larger m
  assert _got([g4x, m4x], 1, 1024, 1024, 64) == _shape(g4x)  # 1 < 2 (weight 1: a tie, m4x wins)
  assert _got([g4x, m2x], 1, 1024, 1024, 64) == _shape(m2x)  # 1 = 1, m 2 > 1 (weight 0.25: g4x at 0.5 wins)
  # A query with no g (megablox's LutFn) leaves g out: g4x is at 0, m2x at 1.
  assert _got([g4x, m2x], 1, 1024, 1024, None) == _shape(g4x)


def test_shape_distance_by_hand():
  e = _entry(1024, 1024, 1024, 8)
  assert lut_mod.shape_distance(e, 1024, 1024, 1024, 8) == 0
  assert lut_mod.shape_distance(e, 256, 1024, 1024, 8) == 2  # |log2 256/1024|
  assert lut_mod.shape_distance(e, 1024, 512, 1024, 8) == 4  # 4 * 1
  assert lut_mod.shape_distance(e, 1024, 1024, 4096, 8) == 8  # 4 * 2
  assert lut_mod.shape_distance(e, 1024, 1024, 1024, 32) == 1  # 0.5 * 2
  assert lut_mod.shape_distance(e, 1024, 1024, 1024, None) == 0  # no g: not counted
  assert lut_mod.shape_distance(e, 4096, 2048, 512, 2) == 2 + 4 * (1 + 1) + 0.5 * 2 == 11


# --- the tie-breaks -------------------------------------------------------------------


def test_a_tie_in_distance_goes_to_the_larger_tuned_m():
  """Query m=1024: m 512 and m 2048 are each one log2 step away."""
  below, above = _entry(512, 1024, 1024, 8), _entry(2048, 1024, 1024, 8)
  assert _got([below, above], 1024, 1024, 1024, 8) == _shape(above)
  assert _got([below, above], 1024, 1024, 1024, 8, backend=None) == _shape(above)


def test_the_rejected_nearest_takes_the_same_tie_break():
  """Query [1024,1024]x[8,1024,1024], rows per group 128: m 64 (rows 8, 16x) and m 16384
  (rows 2048, 16x) are both out of the regime, each log2 16 = 4 away: the larger m is named."""
  for lut in _luts(_entry(64, 1024, 1024, 8), _entry(16384, 1024, 1024, 8)):
    assert lut.query("fwd", 1024, 1024, 1024, 8, "bfloat16") is None
    why = lut.nearest_rejected("fwd", 1024, 1024, 1024, 8, "bfloat16")
    assert (why.entry.m, why.reason) == (16384, "rows per group 2048 tuned vs 128 here (>4x apart)")


def test_at_the_nearest_shape_the_fastest_backend_wins():
  q = (1024, 1024, 1024, 8)
  pallas = _entry(*q, "pallas_gpu", time_s=2e-3)
  mosaic = _entry(*q, "mosaic_gpu", time_s=1e-3)
  xla = _entry(*q, "xla", time_s=3e-3)
  assert _got([pallas, mosaic, xla], *q, backend=None) == _shape(mosaic)  # 1e-3 < 2e-3 < 3e-3
  # Named, a backend's own entry is taken whatever the others' times.
  assert _got([pallas, mosaic, xla], *q, backend="xla") == _shape(xla)
  # Time counts only at the nearest shape: a far faster xla entry one m step away loses.
  fast_far = _entry(2048, 1024, 1024, 8, "xla", time_s=1e-6)
  assert _got([pallas, fast_far], *q, backend=None) == _shape(pallas)


@pytest.mark.parametrize("no_time", [{}, {"time_s": None}, {"time_s": 0}, {"time_s": -1.0}, {"time_s": True}])
def test_an_untimed_entry_ranks_after_every_timed_one(no_time):
  q = (1024, 1024, 1024, 8)
  slow = _entry(*q, "pallas_gpu", time_s=10.0)
  untimed = _entry(*q, "xla", **no_time)
  assert _got([slow, untimed], *q, backend=None) == _shape(slow)


def test_equal_times_and_no_times_go_to_the_registry_order():
  """kernels.registry.NAMES: pallas_gpu, mosaic_gpu, mosaic_blackwell, pallas_tpu, xla."""
  assert kernels.registry.NAMES.index("pallas_gpu") < kernels.registry.NAMES.index("mosaic_gpu")
  assert kernels.registry.NAMES.index("mosaic_gpu") < kernels.registry.NAMES.index("xla")
  q = (1024, 1024, 1024, 8)
  assert _got([_entry(*q, "xla"), _entry(*q, "pallas_gpu")], *q, backend=None)[0] == "pallas_gpu"
  assert _got([_entry(*q, "xla"), _entry(*q, "mosaic_gpu")], *q, backend=None)[0] == "mosaic_gpu"
  same = [_entry(*q, "xla", time_s=1e-3), _entry(*q, "mosaic_gpu", time_s=1e-3), _entry(*q, "pallas_gpu", time_s=1e-3)]
  assert _got(same, *q, backend=None)[0] == "pallas_gpu"


# --- the regime gate ------------------------------------------------------------------


def test_rows_per_group_four_times_apart_serve_and_one_row_more_does_not():
  """Query m=1024, g=8: 128 rows per group."""
  four = _entry(4096, 1024, 1024, 8)  # 4096/8 = 512 = 4 * 128: in
  over = _entry(4104, 1024, 1024, 8)  # 4104/8 = 513 > 512: out
  quarter = _entry(256, 1024, 1024, 8)  # 32 = 128/4: in
  under = _entry(248, 1024, 1024, 8)  # 31 < 32: out
  for e in (four, quarter):
    assert _got([e], 1024, 1024, 1024, 8) == _shape(e)
  for e, reason in ((over, "rows per group 513 tuned vs 128 here"), (under, "rows per group 31 tuned vs 128 here")):
    assert _got([e], 1024, 1024, 1024, 8) is None
    assert _why(e, 1024, 1024, 1024, 8) == f"{reason} (>4x apart)"


def test_k_and_n_twice_apart_serve_and_a_little_more_does_not():
  """Query k = n = 1024."""
  served = [_entry(1024, 2048, 1024, 8), _entry(1024, 512, 1024, 8), _entry(1024, 1024, 2048, 8)]
  for e in served:
    assert _got([e], 1024, 1024, 1024, 8) == _shape(e)
  for e, reason in (
    (_entry(1024, 2050, 1024, 8), "k 2050 tuned vs 1024 here (>2x apart)"),
    (_entry(1024, 511, 1024, 8), "k 511 tuned vs 1024 here (>2x apart)"),
    (_entry(1024, 1024, 2050, 8), "n 2050 tuned vs 1024 here (>2x apart)"),
    (_entry(1024, 1024, 511, 8), "n 511 tuned vs 1024 here (>2x apart)"),
  ):
    assert _got([e], 1024, 1024, 1024, 8) is None
    assert _why(e, 1024, 1024, 1024, 8) == reason


def test_the_gate_comes_before_the_distance():
  """Query [1024,1024]x[8,1024,1024]: m 4104 is log2 4104/1024 ~ 2.003 away but 513 rows per
  group (>4x 128); k 2048 is 4 away and in the regime: it is taken."""
  near_out, far_in = _entry(4104, 1024, 1024, 8), _entry(1024, 2048, 1024, 8)
  assert _got([near_out, far_in], 1024, 1024, 1024, 8) == _shape(far_in)


def test_fewer_rows_than_groups_count_as_one_row_per_group():
  """Query [1,1024]x[128,1024,1024]: max(1, 128) / 128 = 1 row per group. An entry at m 128
  (1 row per group) serves it though m is 128x apart; m 512 (4 rows) too; m 640 (5) does not."""
  for m in (128, 512):
    assert _got([_entry(m, 1024, 1024, 128)], 1, 1024, 1024, 128) == ("pallas_gpu", m, 1024, 1024, 128)
  assert _got([_entry(640, 1024, 1024, 128)], 1, 1024, 1024, 128) is None


def test_a_query_with_no_g_takes_the_entrys_g_for_the_gate():
  """An entry at m 64, g 8 (8 rows per group): a megablox query (no g) at m 256 has 256/8 = 32
  rows per group, 4x: served; at m 264, 33 > 32: not."""
  e = _entry(64, 1024, 1024, 8)
  assert _got([e], 256, 1024, 1024, None) == _shape(e)
  assert _got([e], 264, 1024, 1024, None) is None


# --- exact matches --------------------------------------------------------------------


def test_an_exact_entry_wins_over_a_faster_one_nearby():
  q = (1000, 1000, 1000, 8)
  exact = _entry(*q, "pallas_gpu", time_s=1.0)
  near = _entry(1024, 1024, 1024, 8, "xla", time_s=1e-6)  # log2 1.024 ~ 0.034: 0.034 + 4 * 2 * 0.034 ~ 0.31 away
  assert _got([exact, near], *q, backend=None) == _shape(exact)
  assert _got([exact, near], *q) == _shape(exact)


def test_an_exact_entry_whose_config_does_not_fit_gives_way_to_the_nearest_that_fits():
  q = (4096, 4096, 4096, 8)
  exact = _entry(*q, config=HUGE)
  near = _entry(2048, 4096, 4096, 8)  # 1 away
  far = _entry(4096, 8192, 4096, 8)  # 4 away
  assert _got([exact, near, far], *q) == _shape(near)
  assert _why(exact, *q) == f"its config does not fit this shape on {H100!r}"


def test_a_tie_at_the_same_m_goes_to_the_larger_k_then_n_then_g():
  """Query [1024,1024]x[8,1024,1024]; every entry has m 1024, so the m tie-break cannot decide."""
  k2x = _entry(1024, 2048, 1024, 8)  # 4 * |log2 1024/2048| = 4
  k_half = _entry(1024, 512, 1024, 8)  # 4 * |log2 1024/512| = 4: a tie, to the larger k
  assert _got([k2x, k_half], 1024, 1024, 1024, 8) == _shape(k2x)
  n2x = _entry(1024, 1024, 2048, 8)  # 4: ties with k2x too; k 1024 < 2048, so k2x
  assert _got([k2x, n2x], 1024, 1024, 1024, 8) == _shape(k2x)
  n_half = _entry(1024, 1024, 512, 8)  # 4: same k as n2x, to the larger n
  assert _got([n2x, n_half], 1024, 1024, 1024, 8) == _shape(n2x)
  # No g in the query: entries that differ only in g are at distance 0 from it, to the larger g.
  g8, g16 = _entry(1024, 1024, 1024, 8), _entry(1024, 1024, 1024, 16)
  assert _got([g8, g16], 1024, 1024, 1024, None) == _shape(g16)
