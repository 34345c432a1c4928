"""The LUT's regime gate: a tuned shape serves a query only with rows per group, k and n close.

Properties on hypothesis-drawn LUTs and queries, checked against an oracle written from the
rule itself (rows per group max(m, g) / g within ROWS_PER_GROUP_FACTOR, k and n within
DIM_FACTOR), and the reported case: a decode LUT must not drive prefill.
"""

from fractions import Fraction

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import lut as lut_mod
from kernels import target

KIND = jax.devices()[0].device_kind
TINY = kernels.TritonConfig(16, 16, 16, 2, 1)  # 1 KiB of shared memory: fits any shape on any device
# Qwen3-30B-A3B's MoE layer (Qwen/Qwen3-30B-A3B, config.json: hidden_size 2048,
# moe_intermediate_size 768, num_experts 128); m = tokens x num_experts_per_tok (8).
QWEN = dict(k=2048, n=768, g=128)
DECODE_TILE = kernels.TritonConfig(16, 64, 64, 4, 3)


def _ratio(a, b) -> Fraction:
  return Fraction(max(a, b), min(a, b))


def in_regime(e: kernels.Entry, m: int, k: int, n: int, g: int | None) -> bool:
  g = e.g if g is None else g
  rows = _ratio(Fraction(max(m, g), g), Fraction(max(e.m, e.g), e.g))
  return rows <= lut_mod.ROWS_PER_GROUP_FACTOR and max(_ratio(k, e.k), _ratio(n, e.n)) <= lut_mod.DIM_FACTOR


def _distance(e, m, k, n, g):
  return lut_mod.shape_distance(e, m, k, n, g)


M = st.one_of(st.integers(1, 256), st.integers(1, 1 << 14))  # small m: fewer rows than groups too
K = st.sampled_from([64, 96, 128, 192, 256, 384, 512, 768, 1024])
G = st.sampled_from([1, 2, 3, 8, 16, 128])
ENTRY = st.tuples(st.sampled_from(["pallas_gpu", "xla"]), M, K, K, G, st.floats(1e-6, 1e-3))


def _lut(drawn, scale: int = 1) -> kernels.Lut:
  entries = [
    kernels.Entry(
      "fwd",
      b,
      "bfloat16",
      m * scale,
      k * scale,
      n * scale,
      g * scale,
      TINY if b == "pallas_gpu" else None,
      {"time_s": t},
    )
    for b, m, k, n, g, t in drawn
  ]
  return kernels.Lut(KIND, entries)


def _shape(e):
  return None if e is None else (e.backend, e.m, e.k, e.n, e.g)


@settings(max_examples=150, deadline=None)
@given(drawn=st.lists(ENTRY, min_size=1, max_size=6), m=M, k=K, n=K, g=st.one_of(st.none(), G))
def test_query_respects_the_regime_and_keeps_the_distance_order(drawn, m, k, n, g):
  lut = _lut(drawn)
  for backend in ("pallas_gpu", None):
    own = [e for e in lut.entries() if backend in (None, e.backend)]
    passing = [e for e in own if in_regime(e, m, k, n, g)]
    got = lut.query("fwd", m, k, n, g, "bfloat16", backend=backend)
    why = lut.nearest_rejected("fwd", m, k, n, g, "bfloat16", backend=backend)
    if not passing:
      assert got is None
      if own:  # the nearest entry of all, and a reason
        assert why is not None and why.reason
        assert _distance(why.entry, m, k, n, g) == min(_distance(e, m, k, n, g) for e in own)
      else:
        assert why is None
      continue
    assert got is not None and why is None, "an entry in the regime is never passed over for the heuristic"
    assert in_regime(got, m, k, n, g)
    assert _distance(got, m, k, n, g) == min(_distance(e, m, k, n, g) for e in passing)
  # One entry alone: used exactly when it is in the regime.
  alone = kernels.Lut(KIND, lut.entries()[:1])
  e = alone.entries()[0]
  assert (alone.query("fwd", m, k, n, g, "bfloat16") == e) is in_regime(e, m, k, n, g)


@settings(max_examples=60, deadline=None)
@given(drawn=st.lists(ENTRY, min_size=1, max_size=6))
def test_exact_entries_always_pass(drawn):
  lut = _lut(drawn)
  for e in lut.entries():
    assert lut.query("fwd", e.m, e.k, e.n, e.g, "bfloat16", backend=e.backend) == e
    assert _shape(lut.query("fwd", e.m, e.k, e.n, e.g, "bfloat16"))[1:] == (e.m, e.k, e.n, e.g)


@settings(max_examples=100, deadline=None)
@given(drawn=st.lists(ENTRY, min_size=1, max_size=6), m=M, k=K, n=K, g=G, c=st.integers(2, 9))
def test_scaling_every_dim_alike_changes_nothing(drawn, m, k, n, g, c):
  small, big = _lut(drawn), _lut(drawn, scale=c)
  for backend in ("pallas_gpu", None):
    got = _shape(small.query("fwd", m, k, n, g, "bfloat16", backend=backend))
    scaled = _shape(big.query("fwd", m * c, k * c, n * c, g * c, "bfloat16", backend=backend))
    assert scaled == (None if got is None else (got[0], *(d * c for d in got[1:])))
    why = small.nearest_rejected("fwd", m, k, n, g, "bfloat16", backend=backend)
    why_big = big.nearest_rejected("fwd", m * c, k * c, n * c, g * c, "bfloat16", backend=backend)
    assert (why is None) == (why_big is None)


def _decode_lut() -> kernels.Lut:
  return kernels.Lut(
    KIND,
    [kernels.Entry("fwd", "pallas_gpu", "bfloat16", m, QWEN["k"], QWEN["n"], QWEN["g"], DECODE_TILE) for m in (16, 64)],
  )


@pytest.mark.parametrize("m,here", [(1024, "8"), (65536, "512"), (262144, "2048")])
def test_a_decode_lut_does_not_drive_prefill(m, here):
  """The reported case: entries tuned at m=16 and 64 were taken for these m at distances 4, 10
  and 12, within the old cut-off of 12, and their decode tile replaced the 128-row default."""
  lut = _decode_lut()
  k, n, g = QWEN["k"], QWEN["n"], QWEN["g"]
  assert lut.query("fwd", m, k, n, g, "bfloat16", backend="pallas_gpu") is None
  why = lut.nearest_rejected("fwd", m, k, n, g, "bfloat16", backend="pallas_gpu")
  assert (why.entry.m, why.reason) == (64, f"rows per group 1 tuned vs {here} here (>4x apart)")

  kernels.lut.set_active_lut(lut)
  fwd = kernels.explain((m, k), (g, k, n), jnp.bfloat16, backend="pallas_gpu")["fwd"]
  default = kernels.registry.default_config("pallas_gpu", "fwd", "bfloat16", m, k, n, g, device_kind=KIND)
  assert (fwd.source, fwd.config, fwd.rejected) == ("heuristic", default, why)
  assert fwd.config != DECODE_TILE
  assert str(fwd).endswith(
    f"<- heuristic (nearest tuned [64,2048]x[128,2048,768] (pallas_gpu) not used: rows per group 1 tuned vs {here} "
    "here (>4x apart))"
  )


def test_a_decode_lut_still_serves_decode():
  """Rows per group count from one (fewer rows than groups: one row per routed group)."""
  kernels.lut.set_active_lut(_decode_lut())
  for m in (1, 100, 512):  # 512 rows over 128 groups: 4 a group, the edge of the regime
    fwd = kernels.explain((m, 2048), (128, 2048, 768), jnp.bfloat16, backend="pallas_gpu")["fwd"]
    assert (fwd.source, fwd.config, fwd.rejected) == ("lut-nearest", DECODE_TILE, None), m
  assert kernels.explain((513, 2048), (128, 2048, 768), jnp.bfloat16, backend="pallas_gpu")["fwd"].source == "heuristic"


def test_an_up_projection_entry_does_not_serve_the_down_projection():
  lut = _decode_lut()
  assert lut.query("fwd", 64, 768, 2048, 128, "bfloat16") is None
  why = lut.nearest_rejected("fwd", 64, 768, 2048, 128, "bfloat16")
  assert why.reason == "k 2048 tuned vs 768 here (>2x apart); n 768 tuned vs 2048 here (>2x apart)"
  # No entries of this op or dtype: nothing to reject.
  assert lut.nearest_rejected("dlhs", 64, 2048, 768, 128, "bfloat16") is None
  assert lut.nearest_rejected("fwd", 64, 2048, 768, 128, "float32") is None


def test_a_config_that_does_not_fit_is_reported():
  huge = kernels.TritonConfig(256, 256, 256, 8, 8)  # ~2 MiB of shared memory at bf16
  lut = kernels.Lut(KIND, [kernels.Entry("fwd", "pallas_gpu", "bfloat16", 4096, 4096, 4096, 8, huge)])
  why = lut.nearest_rejected("fwd", 4096, 4096, 4096, 8, "bfloat16")
  assert why.reason == f"its config does not fit this shape on {KIND!r}"


def test_auto_says_why_an_entry_of_a_backend_that_does_not_run_here_was_skipped(monkeypatch):
  b200 = "NVIDIA B200"
  monkeypatch.setattr(target, "current", lambda: target.Target("gpu", b200, 148))
  mosaic = kernels.MosaicConfig(64, 128, 64, 2, 1)
  kernels.lut.set_active_lut(
    kernels.Lut(b200, [kernels.Entry("fwd", "mosaic_gpu", "bfloat16", 512, 256, 384, 4, mosaic)])
  )
  fwd = kernels.explain((512, 256), (4, 256, 384), jnp.bfloat16)["fwd"]
  assert (fwd.backend, fwd.source) == ("pallas_gpu", "heuristic")
  assert (fwd.rejected.entry.backend, fwd.rejected.reason) == ("mosaic_gpu", "mosaic_gpu does not run on 'NVIDIA B200'")
  # Under auto, an entry of another backend in another regime is the one reported.
  kernels.lut.set_active_lut(kernels.Lut(b200, [kernels.Entry("fwd", "xla", "bfloat16", 16, 256, 384, 4, None)]))
  fwd = kernels.explain((4096, 256), (4, 256, 384), jnp.bfloat16)["fwd"]
  assert (fwd.backend, fwd.source, fwd.rejected.entry.backend) == ("pallas_gpu", "heuristic", "xla")
  assert fwd.rejected.reason == "rows per group 4 tuned vs 1024 here (>4x apart)"
