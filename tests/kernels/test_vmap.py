"""vmap of kernels.ragged_dot with only one of lhs, rhs, group_sizes batched, every backend.

jax.lax.ragged_dot itself refuses these ("NYI"), so the reference is a per-example loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from conftest import rand

B, M, K, N, G = 2, 24, 16, 16, 3
SIZES = jnp.array([[5, 0, 15], [0, 24, 0]], jnp.int32)  # sum < m, empty groups, one group


def _operands():
  return (rand(1, (M, K), jnp.float32), rand(2, (G, K, N), jnp.float32), SIZES[0],
          rand(3, (B, M, K), jnp.float32), rand(4, (B, G, K, N), jnp.float32), SIZES)


def _with_grads(f):
  """(out, (dlhs, drhs)) for a non-uniform cotangent, so the vjp is checked too."""
  w = jnp.linspace(-1.0, 1.0, M * N).reshape(M, N)

  def both(a, b, s):
    out, vjp = jax.vjp(lambda a, b: f(a, b, s), a, b)
    return out, vjp(w.astype(out.dtype))

  return both


@pytest.mark.parametrize("backend", ["xla", "pallas_gpu", "pallas_tpu"])
@pytest.mark.parametrize("batched", ["lhs", "rhs", "group_sizes"])
def test_vmap_one_operand_batched(backend, batched):
  lhs, rhs, gs, blhs, brhs, bgs = _operands()
  idx = ("lhs", "rhs", "group_sizes").index(batched)
  args = [lhs, rhs, gs]
  args[idx] = (blhs, brhs, bgs)[idx]
  axes = [None, None, None]
  axes[idx] = 0
  hi = jax.lax.Precision.HIGHEST
  ours = lambda a, b, s: kernels.ragged_dot(a, b, s, precision=hi, backend=backend)
  ref = jax.jit(_with_grads(lambda a, b, s: jax.lax.ragged_dot(a, b, s, precision=hi)))

  # One compile for forward and backward: interpret-mode kernels are slow to build.
  out, grads = jax.jit(jax.vmap(_with_grads(ours), in_axes=axes))(*args)
  for i in range(B):
    one = [a[i] if j == idx else a for j, a in enumerate(args)]
    want_out, want_grads = ref(*one)
    np.testing.assert_allclose(out[i], want_out, rtol=1e-5, atol=1e-5)
    for got, exp in zip(grads, want_grads):
      # Unbatched operands get a per-example gradient under vmap.
      np.testing.assert_allclose(got[i], exp, rtol=1e-5, atol=1e-5)


def test_vmap_xla_transposed_rhs_and_offset():
  """The xla path's other forms: rhs [g,n,k] and an expert shard with group_offset."""
  lhs, rhs, _, _, brhs, bgs = _operands()
  rhs_nk = jnp.swapaxes(brhs, 2, 3)
  out = jax.vmap(lambda b: kernels.ragged_dot(lhs, b, SIZES[0], transpose_rhs=True, backend="xla"))(rhs_nk)
  for i in range(B):
    np.testing.assert_allclose(out[i], jax.lax.ragged_dot(lhs, brhs[i], SIZES[0]), rtol=1e-5, atol=1e-5)
  shard = rhs[1:]  # groups 1 and 2 of 3
  out = jax.vmap(lambda s: kernels.ragged_dot(lhs, shard, s, group_offset=1, backend="xla"))(bgs)
  for i in range(B):
    full = jax.lax.ragged_dot(lhs, rhs, bgs[i])
    first = int(bgs[i][0])
    want = full.at[:first].set(0)  # group 0 is not in the shard
    np.testing.assert_allclose(out[i], want, rtol=1e-5, atol=1e-5)
