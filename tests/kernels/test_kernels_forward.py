"""kernels.ragged_dot's forward beyond test_conformance.py: many groups, hypothesis-drawn group
sizes, expert parallelism under shard_map, and what bad arguments and configs raise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import np_ragged_dot, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels

HI = jax.lax.Precision.HIGHEST
TOL = 2e-5


def _check(out, lhs, rhs, gs):
  """float32 output against the float64 reference."""
  ref64 = np_ragged_dot(lhs, rhs, gs)
  scale = max(1.0, np.abs(ref64).max())
  np.testing.assert_allclose(np.asarray(out, np.float64), ref64, atol=TOL * scale, rtol=TOL)


@pytest.mark.parametrize("backend", ["pallas_gpu", "xla"])
def test_many_groups_g512(backend):
  g, m, k, n = 512, 300, 16, 16
  sizes = np.random.default_rng(0).multinomial(m - 20, np.full(g, 1 / g)).astype(np.int32)
  lhs, rhs = rand(9, (m, k), jnp.float32), rand(10, (g, k, n), jnp.float32)
  out = kernels.ragged_dot(lhs, rhs, jnp.asarray(sizes), precision=HI, backend=backend)
  _check(out, lhs, rhs, sizes)


_jit_gpu = jax.jit(
  lambda a, b, gs: kernels.ragged_dot(
    a,
    b,
    gs,
    precision=HI,
    backend="pallas_gpu",
    config=kernels.TritonConfig(block_m=16, block_k=16, block_n=16, num_warps=4, num_stages=2, group_m=3),
  )
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 20), min_size=5, max_size=5).filter(lambda s: sum(s) <= 70))
def test_hypothesis_group_sizes_pallas_gpu(sizes):
  """Random group sizes with zeros and slack; one compile (sizes are traced) reused."""
  lhs, rhs = rand(13, (70, 24), jnp.float32), rand(14, (5, 24, 20), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  out = _jit_gpu(lhs, rhs, gs)
  _check(out, lhs, rhs, gs)
  np.testing.assert_allclose(out, jax.lax.ragged_dot(lhs, rhs, gs, precision=HI), atol=1e-5)


def test_shard_map_expert_parallel():
  """Experts split over a 2-device mesh; each shard uses its group_offset; psum rebuilds the whole."""
  from jax.sharding import AxisType
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((2,), ("ep",), axis_types=(AxisType.Auto,))
  m, k, n, sizes = 32, 16, 16, [6, 0, 10, 7]
  lhs, rhs, gs = rand(15, (m, k), jnp.float32), rand(16, (4, k, n), jnp.float32), jnp.array(sizes, jnp.int32)

  def local(x, w, g):
    off = (jax.lax.axis_index("ep") * w.shape[0]).astype(jnp.int32)
    y = kernels.ragged_dot(x, w, g, precision=HI, backend="pallas_gpu", group_offset=off, interpret=True)
    return jax.lax.psum(y, "ep")

  f = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("ep"), P()), out_specs=P(), check_vma=False)
  np.testing.assert_allclose(jax.jit(f)(lhs, rhs, gs), jax.lax.ragged_dot(lhs, rhs, gs, precision=HI), atol=1e-5)


@pytest.mark.parametrize(
  "call,exc,match",
  [
    (lambda x, w, g: kernels.ragged_dot(x[0], w, g), ValueError, "lhs must be a 2-D"),
    (lambda x, w, g: kernels.ragged_dot(x, w[0], g), ValueError, "rhs must be a 3-D"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g[:2]), ValueError, "group count mismatch"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g.astype(jnp.float32)), TypeError, "group_sizes must be an integer"),
    (lambda x, w, g: kernels.ragged_dot(x[:, :5], w, g), ValueError, "contraction mismatch"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g, backend="cuda"), ValueError, "backend must be one of"),
    (
      lambda x, w, g: kernels.ragged_dot(x, w, g, backend="pallas_gpu", config=kernels.TpuConfig()),
      TypeError,
      "must be a TritonConfig",
    ),
    (lambda x, w, g: kernels.ragged_dot(x, w, g, config={"bwd": None}), ValueError, "config keys"),
  ],
)
def test_bad_arguments_are_named(call, exc, match):
  x, w, g = rand(1, (8, 16), jnp.float32), rand(2, (3, 16, 4), jnp.float32), jnp.array([2, 3, 3], jnp.int32)
  with pytest.raises(exc, match=match):
    call(x, w, g)


@pytest.mark.parametrize(
  "field,value",
  [
    ("block_m", 48),
    ("block_k", 8),
    ("block_n", 512),
    ("num_warps", 3),
    ("num_stages", 0),
    ("group_m", 0),
    ("group_k", 2000),
  ],
)
def test_gpu_config_rejects_invalid(field, value):
  with pytest.raises(ValueError, match=f"TritonConfig.{field}"):
    kernels.TritonConfig(**{field: value})


def test_tpu_config_rejects_misaligned():
  with pytest.raises(ValueError, match="TpuConfig.tk"):
    kernels.TpuConfig(tm=128, tk=100, tn=128)
