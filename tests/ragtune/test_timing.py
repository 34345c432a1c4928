"""The timer: tune-jax's profiler path (it also reads CPU device events), and a fallback
that names itself and its reason in the row's timer field."""

import jax
import jax.numpy as jnp
import numpy as np

from ragtune.device import measure


def _variants():
  a = jax.random.normal(jax.random.key(0), (384, 384), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (384, 384), jnp.float32)
  one = lambda x, y: x @ y

  def twelve(x, y):  # twelve times the work of `one`: a wide margin over a busy host's noise
    for _ in range(12):
      x = x @ y
    return x

  return {name: (fn, (a, b), measure.compile_fn(fn, (a, b))) for name, fn in (("one", one), ("twelve", twelve))}


def test_profiler_times_every_variant_and_orders_them():
  fns = _variants()
  times, timer = measure.time_variants(fns, on_device=True, samples=5)
  assert timer == "tune-jax(samples=5)", timer  # the profiler path ran; no fallback was taken
  assert set(times) == {"one", "twelve"} and all(np.isfinite(t) and t > 0 for t in times.values())
  # Each name gets its own variant's time. A CPU shared with other test workers has stretched one
  # variant's time by 2-4x here, so the margin asked for is well under the 12x of work.
  assert times["twelve"] > 3 * times["one"], times


def test_profiler_failure_falls_back_to_the_wall_clock_and_says_why(monkeypatch):
  import tune_jax

  def broken(*a, **k):
    raise RuntimeError("profiler produced no device plane")

  monkeypatch.setattr(tune_jax, "tune", broken)
  before = tune_jax.CONFIG.allow_fallback_timing
  times, timer = measure.time_variants(_variants(), on_device=True)
  assert (
    timer.startswith("wallclock-median(")
    and "tune-jax failed: RuntimeError: profiler produced no device plane" in timer
  )
  assert set(times) == {"one", "twelve"} and all(t > 0 for t in times.values())
  assert tune_jax.CONFIG.allow_fallback_timing == before  # tune-jax's config is restored


def test_tune_jax_own_fallback_is_not_taken_silently(monkeypatch):
  """If no profiler events name the variants, tune-jax would time on the host by itself and
  still look like tune-jax; here that becomes our labelled fallback instead."""
  import tune_jax.tuning as tuning

  monkeypatch.setattr(tuning, "_time_with_profiler", lambda *a, **k: {})
  _, timer = measure.time_variants(_variants(), on_device=True)
  assert (
    timer.startswith("wallclock-median(") and "tune-jax failed: RuntimeError: Could not find profiler results" in timer
  ), timer


def test_host_timer_on_cpu_hosts():
  times, timer = measure.time_variants(_variants(), on_device=False, warmup=1, iters=3)
  assert timer == "wallclock-median(warmup=1,iters=3)" and set(times) == {"one", "twelve"}
