"""Forward results of every backend against jax.lax.ragged_dot and a float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import kernels
from conftest import np_ragged_dot, rand

BACKENDS = ["pallas_gpu", "pallas_tpu", "xla"]
HI = jax.lax.Precision.HIGHEST
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2, jnp.float16: 5e-3}


def _check(out, lhs, rhs, gs, dtype, **kw):
  ref64 = np_ragged_dot(lhs, rhs, gs, **kw)
  scale = max(1.0, np.abs(ref64).max())
  np.testing.assert_allclose(np.asarray(out, np.float64), ref64, atol=TOL[dtype] * scale, rtol=TOL[dtype])


CASES = {
    # name: (m, k, n, group_sizes)
    "ragged_edges_empty_groups_sum_lt_m": (37, 40, 24, [9, 0, 13, 0, 6]),
    "tiny_k8_n16": (19, 8, 16, [4, 10, 5]),
    "all_rows_one_group": (33, 24, 20, [0, 33, 0]),
    "single_group": (21, 16, 40, [21]),
    "nothing_routed": (10, 16, 16, [0, 0]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_lax_and_numpy(backend, case):
  m, k, n, sizes = CASES[case]
  g = len(sizes)
  lhs, rhs = rand(1, (m, k), jnp.float32), rand(2, (g, k, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  out = kernels.ragged_dot(lhs, rhs, gs, precision=HI, backend=backend)
  lax_out = jax.lax.ragged_dot(lhs, rhs, gs, precision=HI)
  assert out.shape == lax_out.shape and out.dtype == lax_out.dtype
  np.testing.assert_allclose(out, lax_out, atol=1e-5, rtol=1e-5)
  _check(out, lhs, rhs, gs, jnp.float32)
  assert not np.any(np.asarray(out)[sum(sizes):]), "rows past sum(group_sizes) must be 0"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_dtypes(backend, dtype):
  if backend == "pallas_tpu" and dtype == jnp.float16:
    with pytest.raises(TypeError, match="supports lhs/rhs dtypes"):
      kernels.ragged_dot(rand(3, (8, 16), dtype), rand(4, (1, 16, 8), dtype), jnp.array([8], jnp.int32), backend=backend)
    return
  m, k, n, sizes = 50, 64, 48, [20, 0, 25]
  lhs, rhs = rand(3, (m, k), dtype), rand(4, (3, k, n), dtype)
  gs = jnp.array(sizes, jnp.int32)
  out = kernels.ragged_dot(lhs, rhs, gs, backend=backend)
  assert out.dtype == jax.lax.ragged_dot(lhs, rhs, gs).dtype == dtype
  _check(out, lhs, rhs, gs, dtype)


@pytest.mark.parametrize("backend", ["pallas_gpu", "xla"])
@pytest.mark.parametrize("lhs_dt,rhs_dt,pet", [(jnp.bfloat16, jnp.float32, None), (jnp.bfloat16, jnp.bfloat16, jnp.float32),
                                               (jnp.float16, jnp.float32, None)])
def test_mixed_dtypes_follow_lax(backend, lhs_dt, rhs_dt, pet):
  lhs, rhs, gs = rand(5, (24, 32, ), lhs_dt), rand(6, (2, 32, 16), rhs_dt), jnp.array([10, 9], jnp.int32)
  out = kernels.ragged_dot(lhs, rhs, gs, preferred_element_type=pet, backend=backend)
  ref = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=pet)
  assert out.dtype == ref.dtype
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transpose_rhs(backend):
  m, k, n, sizes = 45, 40, 56, [10, 0, 30, 3]
  lhs, rhs_t = rand(7, (m, k), jnp.float32), rand(8, (4, n, k), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  out = kernels.ragged_dot(lhs, rhs_t, gs, precision=HI, backend=backend, transpose_rhs=True)
  _check(out, lhs, rhs_t, gs, jnp.float32, transpose_rhs=True)


@pytest.mark.parametrize("backend", ["pallas_gpu", "xla"])
def test_many_groups_g512(backend):
  g, m, k, n = 512, 300, 16, 16
  sizes = np.random.default_rng(0).multinomial(m - 20, np.full(g, 1 / g)).astype(np.int32)
  lhs, rhs = rand(9, (m, k), jnp.float32), rand(10, (g, k, n), jnp.float32)
  out = kernels.ragged_dot(lhs, rhs, jnp.asarray(sizes), precision=HI, backend=backend)
  _check(out, lhs, rhs, sizes, jnp.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_offset_shards_sum_to_whole(backend):
  m, k, n, sizes = 40, 24, 32, [5, 0, 12, 8, 0, 9]
  lhs, rhs = rand(11, (m, k), jnp.float32), rand(12, (6, k, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  parts = []
  for shard in range(3):
    off = jnp.int32(2 * shard)
    part = kernels.ragged_dot(lhs, rhs[2 * shard:2 * shard + 2], gs, precision=HI, backend=backend,
                              group_offset=off)
    _check(part, lhs, rhs[2 * shard:2 * shard + 2], gs, jnp.float32, group_offset=2 * shard)
    parts.append(part)
  np.testing.assert_allclose(sum(parts), jax.lax.ragged_dot(lhs, rhs, gs, precision=HI), atol=1e-5)


_jit_gpu = jax.jit(lambda a, b, gs: kernels.ragged_dot(
    a, b, gs, precision=HI, backend="pallas_gpu",
    config=kernels.TritonConfig(block_m=16, block_k=16, block_n=16, num_warps=4, num_stages=2, group_m=3)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 20), min_size=5, max_size=5).filter(lambda s: sum(s) <= 70))
def test_hypothesis_group_sizes_pallas_gpu(sizes):
  """Random group sizes with zeros and slack; one compile (sizes are traced) reused."""
  lhs, rhs = rand(13, (70, 24), jnp.float32), rand(14, (5, 24, 20), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  out = _jit_gpu(lhs, rhs, gs)
  _check(out, lhs, rhs, gs, jnp.float32)
  np.testing.assert_allclose(out, jax.lax.ragged_dot(lhs, rhs, gs, precision=HI), atol=1e-5)


def test_shard_map_expert_parallel():
  """Experts split over a 2-device mesh; each shard uses its group_offset; psum rebuilds the whole."""
  from jax.sharding import AxisType, PartitionSpec as P

  mesh = jax.make_mesh((2,), ("ep",), axis_types=(AxisType.Auto,))
  m, k, n, sizes = 32, 16, 16, [6, 0, 10, 7]
  lhs, rhs, gs = rand(15, (m, k), jnp.float32), rand(16, (4, k, n), jnp.float32), jnp.array(sizes, jnp.int32)

  def local(x, w, g):
    off = (jax.lax.axis_index("ep") * w.shape[0]).astype(jnp.int32)
    y = kernels.ragged_dot(x, w, g, precision=HI, backend="pallas_gpu", group_offset=off, interpret=True)
    return jax.lax.psum(y, "ep")

  f = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("ep"), P()), out_specs=P(), check_vma=False)
  np.testing.assert_allclose(jax.jit(f)(lhs, rhs, gs), jax.lax.ragged_dot(lhs, rhs, gs, precision=HI), atol=1e-5)


@pytest.mark.parametrize("call,exc,match", [
    (lambda x, w, g: kernels.ragged_dot(x[0], w, g), ValueError, "lhs must be a 2-D"),
    (lambda x, w, g: kernels.ragged_dot(x, w[0], g), ValueError, "rhs must be a 3-D"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g[:2]), ValueError, "group count mismatch"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g.astype(jnp.float32)), TypeError, "group_sizes must be an integer"),
    (lambda x, w, g: kernels.ragged_dot(x[:, :5], w, g), ValueError, "contraction mismatch"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g, backend="cuda"), ValueError, "backend must be one of"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g, backend="pallas_gpu", config=kernels.TpuConfig()), TypeError,
     "must be a TritonConfig"),
    (lambda x, w, g: kernels.ragged_dot(x, w, g, config={"bwd": None}), ValueError, "config keys"),
])
def test_bad_arguments_are_named(call, exc, match):
  x, w, g = rand(1, (8, 16), jnp.float32), rand(2, (3, 16, 4), jnp.float32), jnp.array([2, 3, 3], jnp.int32)
  with pytest.raises(exc, match=match):
    call(x, w, g)


@pytest.mark.parametrize("field,value", [("block_m", 48), ("block_k", 8), ("block_n", 512), ("num_warps", 3),
                                         ("num_stages", 0), ("group_m", 0), ("group_k", 2000)])
def test_gpu_config_rejects_invalid(field, value):
  with pytest.raises(ValueError, match=f"TritonConfig.{field}"):
    kernels.TritonConfig(**{field: value})


def test_tpu_config_rejects_misaligned():
  with pytest.raises(ValueError, match="TpuConfig.tk"):
    kernels.TpuConfig(tm=128, tk=100, tn=128)
