"""vmap support for ops whose own batching rule cannot take every mix of batched operands."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def broadcast_vmap(impl, *args):
  """impl(*args), batchable whichever of `args` vmap batches.

  Under vmap the unbatched arguments are broadcast to the batch, so `impl`'s own batching
  rule only ever sees all of them batched. custom_vmap has no reverse-mode rule, so
  differentiate through `kernels.ragged_dot` (its custom_vjp), not through `impl`.
  """
  @jax.custom_batching.custom_vmap
  def call(*a):
    return impl(*a)

  @call.def_vmap
  def _rule(axis_size, in_batched, *a):
    a = [x if b else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, b in zip(a, in_batched)]
    return jax.vmap(impl)(*a), True

  return call(*args)
