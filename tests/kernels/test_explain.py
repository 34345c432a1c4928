"""kernels.explain, the DEBUG log of config decisions, and plain-dict configs."""

import importlib
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import rand

import kernels

rd = importlib.import_module("kernels.ragged_dot")  # the module; kernels.ragged_dot is the op


def _configs(*args):
  return {op: c.config for op, c in rd.resolve(*args).items()}


KIND = jax.devices()[0].device_kind
TUNED = kernels.TritonConfig(16, 32, 16, 2, 2)


def _lut():
  return kernels.Lut(
    KIND, [kernels.Entry("fwd", "pallas_gpu", "bfloat16", 64, 256, 512, 8, TUNED)], source="/tmp/some-lut.json"
  )


def test_explain_sources():
  kernels.lut.set_active_lut(_lut())
  exact = kernels.explain((64, 256), (8, 256, 512), jnp.bfloat16, backend="pallas_gpu")
  assert set(exact) == {"fwd", "dlhs", "drhs"}
  f = exact["fwd"]
  assert (f.backend, f.config, f.source, f.tuned_shape, f.distance) == (
    "pallas_gpu",
    TUNED,
    "lut-exact",
    (64, 256, 512, 8),
    0.0,
  )
  assert f.lut == "/tmp/some-lut.json"
  # No dlhs/drhs entries: the heuristic, the same config ragged_dot would pick.
  for op in ("dlhs", "drhs"):
    assert exact[op].source == "heuristic" and exact[op].tuned_shape is None
    assert exact[op].config == kernels.registry.default_config(
      "pallas_gpu", op, "bfloat16", 64, 256, 512, 8, device_kind=KIND
    )

  near = kernels.explain((100, 256), (8, 512, 256), "bfloat16", transpose_rhs=True, backend="pallas_gpu")["fwd"]
  assert near.source == "lut-nearest" and near.config == TUNED and near.tuned_shape == (64, 256, 512, 8)
  assert near.distance == pytest.approx(math.log2(100 / 64))
  assert "tuned [64,256]x[8,256,512]" in str(near)

  other = kernels.explain((64, 256), (8, 256, 512), jnp.float32, backend="pallas_gpu")["fwd"]
  assert other.source == "heuristic", "a LUT entry of another dtype is not used"
  xla = kernels.explain((64, 256), (8, 256, 512), jnp.bfloat16, backend="xla")
  assert all(c.source == "none" and c.config is None for c in xla.values())
  with pytest.raises(ValueError, match="contraction mismatch"):
    kernels.explain((64, 256), (8, 128, 512), jnp.bfloat16)
  with pytest.raises(TypeError, match="supports lhs/rhs dtypes"):
    kernels.explain((64, 256), (8, 256, 512), jnp.float16, backend="pallas_tpu")


def test_explain_says_why_no_lut_entry_was_used():
  """A default or XLA's op with no rejected entry to show still says why: no LUT loaded, no
  entry of that op, or (auto where no tunable backend compiles) no LUT asked at all."""
  kernels.lut.set_active_lut(kernels.Lut(KIND, source=None))  # what the default search finds without a LUT
  fwd = kernels.explain((64, 256), (8, 256, 512), jnp.bfloat16, backend="pallas_gpu")["fwd"]
  assert fwd.source == "heuristic" and "no LUT loaded for device" in fwd.why
  assert "ragtune export-lut" in str(fwd) and "RAGTUNE_LUT" in str(fwd)
  kernels.lut.set_active_lut(_lut())
  dlhs = kernels.explain((64, 256), (8, 256, 512), jnp.bfloat16, backend="pallas_gpu")["dlhs"]
  assert dlhs.why == "the LUT /tmp/some-lut.json has no dlhs bfloat16 pallas_gpu entry" and dlhs.why in str(dlhs)
  if kernels.registry.auto_backend(jax.devices()[0].platform, KIND) == "xla":  # a CPU host
    for c in kernels.explain((64, 256), (8, 256, 512), jnp.bfloat16).values():
      assert (c.backend, c.source) == ("xla", "none")
      assert "no backend with configs runs compiled here" in str(c) and "backend=" in c.why
  # An explicit backend="xla" is the caller's choice: nothing to explain.
  assert all(not c.why for c in kernels.explain((64, 256), (8, 256, 512), jnp.bfloat16, backend="xla").values())


def test_debug_log_once_per_shape(caplog):
  kernels.lut.set_active_lut(_lut())
  rd._logged.clear()
  f = lambda m: jax.eval_shape(
    lambda a, b, g: kernels.ragged_dot(a, b, g, backend="pallas_gpu"),
    jax.ShapeDtypeStruct((m, 256), jnp.bfloat16),
    jax.ShapeDtypeStruct((8, 256, 512), jnp.bfloat16),
    jax.ShapeDtypeStruct((8,), jnp.int32),
  )
  with caplog.at_level(logging.DEBUG, logger="kernels"):
    f(64), f(64), f(64), f(100)
  lines = [r.getMessage() for r in caplog.records if r.name == "kernels"]
  assert len(lines) == 2, lines
  assert "[64,256]x[8,256,512]" in lines[0] and "fwd: pallas_gpu" in lines[0] and "lut-exact" in lines[0]
  assert "lut-nearest" in lines[1] and "heuristic" in lines[1]
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="kernels"):
    f(32)
  assert not [r for r in caplog.records if r.name == "kernels"], "nothing is logged above DEBUG"


def test_far_miss_logged_once_at_info(caplog, monkeypatch):
  """A shape whose LUT entries are all in another regime says so once, at INFO; a shape the
  LUT serves, and later calls of the same shape, say nothing."""
  kernels.lut.set_active_lut(_lut())
  rd._misses_logged.clear()
  f = lambda m, dtype=jnp.bfloat16: jax.eval_shape(
    lambda a, b, g: kernels.ragged_dot(a, b, g, backend="pallas_gpu"),
    jax.ShapeDtypeStruct((m, 256), dtype),
    jax.ShapeDtypeStruct((8, 256, 512), dtype),
    jax.ShapeDtypeStruct((8,), jnp.int32),
  )
  with caplog.at_level(logging.INFO, logger="kernels"):
    f(64), f(100), f(4096), f(4096), f(4096)
    f(4096, jnp.float32)  # no float32 entries: nothing to reject
  lines = [r.getMessage() for r in caplog.records if r.name == "kernels"]
  assert lines == [
    "ragged_dot fwd [4096,256]x[8,256,512] bfloat16: nearest tuned [64,256]x[8,256,512] (pallas_gpu) not used: "
    "rows per group 8 tuned vs 512 here (>4x apart); running pallas_gpu's heuristic"
  ]
  # The set of logged shapes is bounded: once full, new misses are not logged.
  caplog.clear()
  monkeypatch.setattr(rd, "_MISSES_LOGGED_MAX", len(rd._misses_logged))
  with caplog.at_level(logging.INFO, logger="kernels"):
    f(8192)
  assert not [r for r in caplog.records if r.name == "kernels"]


def test_plain_dict_configs():
  cfg = kernels.TritonConfig(32, 16, 16, 4, 2)
  single = _configs(cfg.to_dict(), "pallas_gpu", 64, 32, 48, 3, jnp.float32)
  assert single == {"fwd": cfg, "dlhs": cfg, "drhs": cfg}
  per_op = rd.resolve({"dlhs": cfg.to_dict()}, "pallas_gpu", 64, 32, 48, 3, jnp.float32)
  assert per_op["dlhs"].config == cfg and per_op["dlhs"].source == "explicit"
  assert per_op["fwd"].source == "heuristic"
  tpu = _configs({"fwd": {"tm": 16, "tk": 128, "tn": 128}}, "pallas_tpu", 64, 32, 48, 3, jnp.float32)
  assert tpu["fwd"] == kernels.TpuConfig(16, 128, 128)
  assert _configs({}, "xla", 64, 32, 48, 3, jnp.float32) == {"fwd": None, "dlhs": None, "drhs": None}

  lhs, rhs, gs = rand(1, (64, 32), jnp.float32), rand(2, (3, 32, 48), jnp.float32), jnp.array([20, 0, 40], jnp.int32)
  out = kernels.ragged_dot(lhs, rhs, gs, backend="pallas_gpu", config=cfg.to_dict(), precision="highest")
  np.testing.assert_allclose(out, jax.lax.ragged_dot(lhs, rhs, gs, precision="highest"), rtol=1e-5, atol=1e-5)

  with pytest.raises(ValueError, match=r"config\['fwd'\]: unknown TritonConfig field\(s\) \['block_mm'\]"):
    kernels.ragged_dot(lhs, rhs, gs, backend="pallas_gpu", config={"block_mm": 64})
  with pytest.raises(ValueError, match="power of two"):
    kernels.ragged_dot(lhs, rhs, gs, backend="pallas_gpu", config={"fwd": {"block_m": 48}})
  with pytest.raises(ValueError, match="config keys must be among"):
    kernels.ragged_dot(lhs, rhs, gs, backend="pallas_gpu", config={"forward": cfg})
  with pytest.raises(TypeError, match="no knobs"):
    kernels.ragged_dot(lhs, rhs, gs, backend="xla", config={"fwd": {"block_m": 16}})
