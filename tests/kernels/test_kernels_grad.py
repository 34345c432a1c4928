"""custom_vjp beyond test_conformance.py: a config per op reaches each op's kernel."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import np_ragged_dot_grads, rand

import kernels

HI = jax.lax.Precision.HIGHEST


def test_per_op_configs_are_used_in_backward():
  """A mapping config reaches each op's kernel (told apart by num_stages), and values stay right."""
  m, k, n, sizes = 40, 32, 48, [10, 25, 5]
  lhs, rhs, dout = rand(10, (m, k), jnp.float32), rand(11, (3, k, n), jnp.float32), rand(12, (m, n), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  cfgs = {
    "fwd": kernels.TritonConfig(16, 16, 16, 4, 5),
    "dlhs": kernels.TritonConfig(32, 16, 32, 4, 6),
    "drhs": kernels.TritonConfig(16, 32, 16, 4, 7),
  }
  f = lambda a, b: kernels.ragged_dot(a, b, gs, precision=HI, backend="pallas_gpu", config=cfgs)
  jaxpr = str(jax.make_jaxpr(lambda a, b, d: jax.vjp(f, a, b)[1](d))(lhs, rhs, dout))
  for stages in (5, 6, 7):
    assert f"num_stages={stages}" in jaxpr
  _, vjp = jax.vjp(f, lhs, rhs)
  dl, dw = vjp(dout)
  ndl, ndw = np_ragged_dot_grads(lhs, rhs, gs, dout)
  np.testing.assert_allclose(dl, ndl, atol=1e-4)
  np.testing.assert_allclose(dw, ndw, atol=1e-4)
