"""custom_vjp: dlhs and drhs of every backend against jax.vjp of jax.lax.ragged_dot and NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from conftest import rand

HI = jax.lax.Precision.HIGHEST


def _np_grads(lhs, rhs, gs, dout, group_offset=0):
  lhs, rhs, dout = (np.asarray(a, np.float64) for a in (lhs, rhs, dout))
  dl, dr = np.zeros_like(lhs), np.zeros_like(rhs)
  start = 0
  for gi, size in enumerate(np.asarray(gs)):
    end = min(start + int(size), lhs.shape[0])
    local = gi - group_offset
    if 0 <= local < rhs.shape[0]:
      dl[start:end] = dout[start:end] @ rhs[local].T
      dr[local] = lhs[start:end].T @ dout[start:end]
    start = end
  return dl, dr


@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu", "xla"])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_vjp_matches_lax_and_numpy(backend, transpose_rhs):
  m, k, n, sizes = 41, 24, 40, [12, 0, 20, 4]  # empty group, sum < m, ragged blocks
  lhs, rhs, dout = rand(1, (m, k), jnp.float32), rand(2, (4, k, n), jnp.float32), rand(3, (m, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  w = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
  f = jax.jit(lambda a, b: kernels.ragged_dot(a, b, gs, precision=HI, backend=backend, transpose_rhs=transpose_rhs))
  _, vjp = jax.vjp(f, lhs, w)
  dl, dw = vjp(dout)
  _, vjp_ref = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs, precision=HI), lhs, rhs)
  rdl, rdw = vjp_ref(dout)
  if transpose_rhs:
    dw = jnp.swapaxes(dw, 1, 2)
  np.testing.assert_allclose(dl, rdl, atol=1e-5)
  np.testing.assert_allclose(dw, rdw, atol=1e-5)
  ndl, ndw = _np_grads(lhs, rhs, gs, dout)
  np.testing.assert_allclose(dl, ndl, atol=1e-4)
  np.testing.assert_allclose(dw, ndw, atol=1e-4)
  assert not np.any(np.asarray(dw)[1]), "an empty group's weight gradient is 0"


@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu", "xla"])
def test_vjp_bf16_dtypes(backend):
  m, k, n, sizes = 48, 32, 32, [20, 0, 24]
  lhs, rhs, dout = rand(4, (m, k), jnp.bfloat16), rand(5, (3, k, n), jnp.bfloat16), rand(6, (m, n), jnp.bfloat16)
  gs = jnp.array(sizes, jnp.int32)
  _, vjp = jax.vjp(lambda a, b: kernels.ragged_dot(a, b, gs, backend=backend), lhs, rhs)
  dl, dw = vjp(dout)
  assert dl.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  ndl, ndw = _np_grads(lhs, rhs, gs, dout)
  np.testing.assert_allclose(np.asarray(dl, np.float64), ndl, atol=2e-2 * max(1, np.abs(ndl).max()))
  np.testing.assert_allclose(np.asarray(dw, np.float64), ndw, atol=2e-2 * max(1, np.abs(ndw).max()))


@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu", "xla"])
def test_vjp_with_group_offset(backend):
  m, k, n, sizes = 30, 16, 24, [5, 9, 0, 8]
  lhs, rhs, dout = rand(7, (m, k), jnp.float32), rand(8, (4, k, n), jnp.float32), rand(9, (m, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  shard = rhs[1:3]
  _, vjp = jax.vjp(lambda a, b: kernels.ragged_dot(a, b, gs, precision=HI, backend=backend,
                                                   group_offset=jnp.int32(1)), lhs, shard)
  dl, dw = vjp(dout)
  ndl, ndw = _np_grads(lhs, shard, gs, dout, group_offset=1)
  np.testing.assert_allclose(dl, ndl, atol=1e-4)
  np.testing.assert_allclose(dw, ndw, atol=1e-4)


def test_per_op_configs_are_used_in_backward():
  """A mapping config reaches each op's kernel (told apart by num_stages), and values stay right."""
  m, k, n, sizes = 40, 32, 48, [10, 25, 5]
  lhs, rhs, dout = rand(10, (m, k), jnp.float32), rand(11, (3, k, n), jnp.float32), rand(12, (m, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  cfgs = {"fwd": kernels.TritonConfig(16, 16, 16, 4, 5), "dlhs": kernels.TritonConfig(32, 16, 32, 4, 6),
          "drhs": kernels.TritonConfig(16, 32, 16, 4, 7)}
  f = lambda a, b: kernels.ragged_dot(a, b, gs, precision=HI, backend="pallas_gpu", config=cfgs)
  jaxpr = str(jax.make_jaxpr(lambda a, b, d: jax.vjp(f, a, b)[1](d))(lhs, rhs, dout))
  for stages in (5, 6, 7):
    assert f"num_stages={stages}" in jaxpr
  _, vjp = jax.vjp(f, lhs, rhs)
  dl, dw = vjp(dout)
  ndl, ndw = _np_grads(lhs, rhs, gs, dout)
  np.testing.assert_allclose(dl, ndl, atol=1e-4)
  np.testing.assert_allclose(dw, ndw, atol=1e-4)
