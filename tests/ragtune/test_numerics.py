"""The check every candidate is judged by (ragtune.device.numerics.compare), against a float64
NumPy oracle written here: NaN and inf anywhere fail (the reference included), an error in the
last row or column is caught, an output over many steps of the device loop reads as one step,
per-element atol, the worst index, the region grid, and every output dtype; and the memory it
holds at DeepSeek-V3's drhs (XLA's memory analysis, nothing run)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiler_missing

from ragtune.device import numerics
from ragtune.problems import limits

SHAPES = [(37, 23), (3, 11, 17)]  # odd sizes: regions and steps of unequal rows


@pytest.fixture
def rng():
  seed = int(np.random.SeedSequence().entropy % 2**32)
  print(f"seed {seed}")  # shown on failure
  return np.random.default_rng(seed)


def oracle(ref, test, rtol, atol=None, grid=(2, 2)) -> dict:
  """What compare must report, in float64 NumPy."""
  r = np.asarray(ref, np.float32).astype(np.float64)
  t = np.asarray(test, np.float32).astype(np.float64)
  finite_r = np.isfinite(r)
  scale = float(np.abs(r[finite_r]).max(initial=0.0))
  a = rtol * max(scale, 1e-30) if atol is None else np.broadcast_to(np.asarray(atol, np.float32), r.shape)
  with np.errstate(invalid="ignore"):
    d = np.abs(t - r)
    bound = a + rtol * np.abs(r)
    bad = ~((d <= bound) & np.isfinite(bound))
  finite = np.isfinite(t) & finite_r
  worst = np.where(finite, d, np.inf)
  at = np.unravel_index(int(np.argmax(worst)), r.shape)
  cols = r.shape[-1]
  d2, f2, b2 = (x.reshape(-1, cols) for x in (d, finite, bad))
  regions = []
  for rows in np.array_split(np.arange(d2.shape[0]), grid[0]):
    regions.append([])
    for c in np.array_split(np.arange(cols), grid[1]):
      cell = np.ix_(rows, c)
      n = f2[cell].sum()
      regions[-1].append((d2[cell][f2[cell]].sum() / n if n else np.nan, 100 * b2[cell].sum() / b2[cell].size))
  return {
    "passed": not bad.any(),
    "n_bad": int(bad.sum()),
    "n_nan": int((~finite).sum()),
    "n_ref_nan": int((~finite_r).sum()),
    "max_diff": float(worst.max()),
    "mean_diff": float(d[finite].mean()) if finite.any() else np.nan,
    "median_diff": float(np.median(d[finite])) if finite.any() else np.nan,
    "worst_index": tuple(int(i) for i in at),
    "worst_ref": float(r[at]),
    "worst_test": float(t[at]),
    "atol": float(np.max(a)),
    "scale": scale,
    "regions": regions,
  }


def assert_matches(got: numerics.NumericsResult, want: dict):
  size = int(np.prod(got.shape))
  assert got.passed == want["passed"]
  assert round(got.pct_bad * size / 100) == want["n_bad"]
  assert (got.n_nan, got.n_ref_nan) == (want["n_nan"], want["n_ref_nan"])
  assert got.worst_index == want["worst_index"]
  np.testing.assert_equal((got.worst_ref, got.worst_test), (want["worst_ref"], want["worst_test"]))
  assert got.status == ("ok" if want["passed"] else "nan" if want["n_nan"] else "wrong")
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, equal_nan=True)
  close(got.max_diff, want["max_diff"])
  close(got.mean_diff, want["mean_diff"])
  close(got.median_diff, want["median_diff"])
  close(got.atol, want["atol"])
  close(got.rel_error, want["max_diff"] / want["scale"])
  assert len(got.regions) == len(want["regions"])
  for g_row, w_row in zip(got.regions, want["regions"]):
    for (g_mean, g_bad), (w_mean, w_bad) in zip(g_row, w_row, strict=True):
      close(g_mean, w_mean)
      assert g_bad == pytest.approx(w_bad, abs=1e-9)


def _pair(rng, shape, dtype, n_wrong=3, noise=1e-3):
  """ref in float32 and a test output in `dtype` near it, with n_wrong elements far off."""
  ref = rng.standard_normal(shape).astype(np.float32)
  test = ref + noise * rng.standard_normal(shape).astype(np.float32)
  flat = test.reshape(-1)
  flat[rng.choice(flat.size, n_wrong, replace=False)] += rng.uniform(2.0, 4.0, n_wrong).astype(np.float32)
  return ref, test.astype(jnp.dtype(dtype))


@pytest.mark.parametrize(
  ("shape", "dtype"), [(SHAPES[0], "float32"), (SHAPES[1], "float32"), (SHAPES[1], "bfloat16"), (SHAPES[0], "float16")]
)
def test_matches_the_float64_oracle(rng, shape, dtype):
  """Fresh random outputs in the dtypes a kernel returns, some elements wrong, one case all
  within tolerance; as jax arrays on the device and as NumPy arrays."""
  for n_wrong in (0, 4):
    ref, test = _pair(rng, shape, dtype, n_wrong)
    for r, t in ((jnp.asarray(ref), jnp.asarray(test)), (ref, test)):
      got = numerics.compare(r, t, rtol=2e-2)
      assert_matches(got, oracle(ref, test, 2e-2))
      assert got.passed == (n_wrong == 0)


def test_bfloat16_reference_and_float8_output(rng):
  """A reference in bfloat16 (read as it is, not rounded again) and an fp8 output, which
  rounds at 2^-4 of its value."""
  ref, test = _pair(rng, SHAPES[0], "float8_e4m3fn", n_wrong=4, noise=0.0)
  low = ref.astype(jnp.bfloat16)
  for r in (ref, low):
    got = numerics.compare(r, test, rtol=0.07)
    assert_matches(got, oracle(r, test, 0.07))
    assert got.pct_bad == pytest.approx(100 * 4 / ref.size)


@pytest.mark.parametrize("where", ["ref", "test"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
def test_nan_and_inf_anywhere_fail(rng, where, value):
  """One NaN or inf, in the reference or in the output, fails that element alone: the other
  elements are judged by the finite elements' scale; the report counts it and says where."""
  shape = SHAPES[0]
  ref, test = _pair(rng, shape, "float32", n_wrong=0)
  at = tuple(int(rng.integers(s)) for s in shape)
  (ref if where == "ref" else test)[at] = value
  got = numerics.compare(ref, test, rtol=2e-2)
  want = oracle(ref, test, 2e-2)
  assert_matches(got, want)
  assert not got.passed and got.status == "nan" and got.n_nan == 1 and got.worst_index == at
  assert got.pct_bad == pytest.approx(100 / np.prod(shape))
  assert got.n_ref_nan == (where == "ref")
  assert ("in the reference" in got.summary()) == (where == "ref")


def test_nan_in_both_at_one_element_counts_once(rng):
  ref, test = _pair(rng, SHAPES[0], "float32", n_wrong=0)
  ref[3, 4] = test[3, 4] = np.nan
  got = numerics.compare(ref, test, rtol=2e-2)
  assert not got.passed and (got.n_nan, got.n_ref_nan) == (1, 1)


@pytest.mark.parametrize("chunk", [None, 5 * 23], ids=["one-step", "steps"])
def test_an_error_only_in_the_last_row_or_column_is_caught(rng, monkeypatch, chunk):
  """37 rows in steps of 5: the last step's slice overlaps the one before (rows 32..36), so a
  loop that drops the rest of the rows, or the overlap, misses it."""
  if chunk:
    monkeypatch.setattr(numerics, "CHUNK", chunk)
  shape = SHAPES[0]
  for at in ((shape[0] - 1, int(rng.integers(shape[1]))), (int(rng.integers(shape[0])), shape[1] - 1)):
    ref, test = _pair(rng, shape, "float32", n_wrong=0)
    test[at] += 1.0
    got = numerics.compare(ref, test, rtol=2e-2)
    assert not got.passed and got.worst_index == at, (at, got.summary())
    assert_matches(got, oracle(ref, test, 2e-2))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_an_output_over_many_steps_reads_as_one_step(rng, monkeypatch, shape):
  """The same report whether the loop takes the output in one step or in steps of 2 rows
  (the last one overlapping), with NaN and wrong elements spread over the steps."""
  ref, test = _pair(rng, shape, "bfloat16", n_wrong=5)
  flat = np.asarray(test, np.float32).reshape(-1)
  flat[rng.choice(flat.size, 2, replace=False)] = np.nan
  test = flat.reshape(shape).astype(jnp.bfloat16)
  atol = np.abs(rng.standard_normal(shape)).astype(np.float32) * 1e-2
  for kw in ({}, {"atol": atol}):
    one = numerics.compare(ref, test, rtol=2e-2, **kw)
    monkeypatch.setattr(numerics, "CHUNK", 2 * shape[-1])
    many = numerics.compare(ref, test, rtol=2e-2, **kw)
    monkeypatch.undo()
    assert_matches(many, oracle(ref, test, 2e-2, kw.get("atol")))
    for field in ("passed", "pct_bad", "n_nan", "worst_index", "worst_ref", "worst_test", "max_diff", "atol"):
      np.testing.assert_equal(getattr(many, field), getattr(one, field), err_msg=field)
    np.testing.assert_allclose(np.asarray(many.regions), np.asarray(one.regions), rtol=1e-6)


def test_atol_per_element(rng):
  """An element passes by its own atol, not its neighbour's; a broadcastable atol (one per
  column) reads as its full array; a NaN or inf atol fails its element."""
  shape = SHAPES[0]
  ref = rng.standard_normal(shape).astype(np.float32)
  atol = np.full(shape, 1e-3, np.float32)
  test = ref.copy()
  test[1, 2] += 0.5  # within its own atol only
  atol[1, 2] = 1.0
  test[2, 2] += 0.75  # beyond its own
  got = numerics.compare(ref, test, rtol=1e-3, atol=atol)
  assert_matches(got, oracle(ref, test, 1e-3, atol))
  assert not got.passed and got.pct_bad == pytest.approx(100 / ref.size) and got.worst_index == (2, 2)
  assert got.atol == 1.0
  atol[2, 2] = 1.0
  assert numerics.compare(ref, test, rtol=1e-3, atol=atol).passed
  per_col = np.full(shape[1], 1e-3, np.float32)
  per_col[2] = 1.0
  assert_matches(numerics.compare(ref, test, rtol=1e-3, atol=per_col), oracle(ref, test, 1e-3, per_col))
  assert numerics.compare(ref, test, rtol=1e-3, atol=per_col).passed
  for bad in (np.nan, np.inf):
    atol[5, 6] = bad
    got = numerics.compare(ref, test, rtol=1e-3, atol=atol)
    assert not got.passed and got.pct_bad == pytest.approx(100 / ref.size), bad


def test_worst_index_is_the_first_largest_in_row_major_order():
  ref = np.zeros((6, 5), np.float32)
  test = ref.copy()
  test[4, 1] = test[2, 3] = test[5, 0] = 3.0  # ties: (2, 3) comes first
  test[1, 4] = 2.0
  got = numerics.compare(ref, test, rtol=1e-2, atol=0.1)
  assert got.worst_index == (2, 3) and (got.worst_ref, got.worst_test) == (0.0, 3.0) and got.max_diff == 3.0


def test_region_grid_by_hand():
  """6 x 5 in a 2 x 2 grid: rows [0,3) and [3,6), columns [0,3) and [3,5) (np.array_split)."""
  ref = np.ones((6, 5), np.float32)
  test = ref.copy()
  test[0, 0] += 0.5  # top-left: 1 of 9 bad
  test[1, 3] += 0.25  # top-right: 2 of 6 bad
  test[2, 4] += 0.75
  test[5, 1] = np.nan  # bottom-left: 1 of 9 bad, not in its mean
  got = numerics.compare(ref, test, rtol=0.0, atol=0.1)
  assert len(got.regions) == 2 and len(got.regions[0]) == 2
  (tl, tr), (bl, br) = got.regions
  assert tl == pytest.approx((0.5 / 9, 100 / 9))
  assert tr == pytest.approx((1.0 / 6, 100 * 2 / 6))
  assert bl == pytest.approx((0.0, 100 / 9))
  assert br == (0.0, 0.0)
  assert got.pct_bad == pytest.approx(100 * 4 / 30) and got.n_nan == 1


def test_empty_output_passes():
  got = numerics.compare(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), rtol=1e-2)
  assert got.passed and got.worst_index == () and got.pct_bad == 0.0


def test_shape_mismatch_is_an_error():
  with pytest.raises(ValueError, match="shape mismatch"):
    numerics.compare(np.zeros((2, 3)), np.zeros((3, 2)), rtol=1e-2)


NO_H100_COMPILE = compiler_missing("h100")
DSV3_DRHS = (256, 7168, 2048)  # [g, k, n] of DeepSeek-V3 prefill's drhs: 3.76e9 elements


@pytest.mark.parametrize("target", [None, "h100"], ids=["here", "deviceless-h100"])
def test_the_check_holds_slices_not_the_output(target):
  """At DeepSeek-V3's drhs (a 15 GB float32 reference and a 7.5 GB bf16 output, per-element
  atol another 15 GB) the compiled check's temporaries are within a few slices of
  limits.STEP_ELEMENTS: no full-size widened copy, mask or difference."""
  if target and NO_H100_COMPILE is not None:
    pytest.skip(str(NO_H100_COMPILE))
  for per_element in (False, True):
    fn = functools.partial(numerics._reduce, region_grid=(2, 2), default_atol=not per_element)
    atol = (DSV3_DRHS if per_element else (), jnp.float32)
    args = ((DSV3_DRHS, jnp.float32), (DSV3_DRHS, jnp.bfloat16), atol, ((), jnp.float32))
    if target:
      from ragtune.deviceless import aot

      temp = aot.compile_fn(target, fn, *args, expect_kernel=False).memory.temp
    else:
      structs = [jax.ShapeDtypeStruct(s, d) for s, d in args]
      temp = jax.jit(fn).lower(*structs).compile().memory_analysis().temp_size_in_bytes
    assert temp <= 4 * limits.CHECK_SLICES * limits.STEP_ELEMENTS + (1 << 20), (per_element, temp)


def test_the_check_gets_the_outputs_as_they_are(monkeypatch):
  """compare hands the device's arrays to the jitted check as they are: an eager reshape of a
  drhs's [g, k, n] (or an eager cast or broadcast of a per-element atol) would copy it, a full
  float32 reference more on the device."""
  seen = []
  real = numerics._reduce
  monkeypatch.setattr(numerics, "_reduce", lambda *args, **kw: seen.append(args) or real(*args, **kw))
  ref = jnp.ones((3, 4, 5), jnp.float32)
  test = jnp.ones((3, 4, 5), jnp.bfloat16)
  atol = jnp.full((3, 4, 5), 0.5, jnp.float16)
  assert numerics.compare(ref, test, rtol=2e-2, atol=atol).passed
  (args,) = seen
  assert args[0] is ref and args[1] is test and args[2] is atol
