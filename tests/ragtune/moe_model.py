"""A small MoE layer as a model writes it, for ragtune.capture's tests: a router, top-k, rows
sorted by expert, the up and down projections as grouped matmuls, and the weighted combine.
`rd` is the grouped matmul: jax.lax.ragged_dot, kernels.ragged_dot or megablox's gmm."""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import kernels

EXPERTS, TOP_K, HIDDEN, FFN, TOKENS = 8, 2, 16, 32, 24


def init(seed: int = 0, layers: int | None = None) -> dict:
  k = jax.random.split(jax.random.key(seed), 3)
  lead = () if layers is None else (layers,)
  return {
    "router": jax.random.normal(k[0], lead + (HIDDEN, EXPERTS)),
    "up": jax.random.normal(k[1], lead + (EXPERTS, HIDDEN, FFN)) * 0.1,
    "down": jax.random.normal(k[2], lead + (EXPERTS, FFN, HIDDEN)) * 0.1,
  }


def tokens(seed: int = 1, n: int = TOKENS):
  return jax.random.normal(jax.random.key(seed), (n, HIDDEN))


def route(p, x):
  """(combine weights, row order by expert, group sizes): the router's top-k."""
  w, idx = lax.top_k(x @ p["router"], TOP_K)
  flat = idx.reshape(-1)
  return w, jnp.argsort(flat), jnp.bincount(flat, length=EXPERTS).astype(jnp.int32)


def layer(p, x, rd=lax.ragged_dot):
  w, order, gs = route(p, x)
  xs = jnp.repeat(x, TOP_K, axis=0)[order]
  h = jax.nn.silu(rd(xs, p["up"], gs))
  y = rd(h, p["down"], gs)
  y = jnp.zeros_like(y).at[order].set(y).reshape(x.shape[0], TOP_K, HIDDEN)
  return (y * jax.nn.softmax(w)[..., None]).sum(1)


def loss(p, x, rd=lax.ragged_dot):
  return (layer(p, x, rd) ** 2).mean()


@functools.partial(jax.jit, static_argnames="rd")
def train_step(p, x, rd=lax.ragged_dot):
  return jax.grad(loss)(p, x, rd)


@functools.partial(jax.jit, static_argnames="rd")
def serve_step(p, x, rd=lax.ragged_dot):
  return layer(p, x, rd)


@jax.jit
def scanned_train_step(p, x):
  """Layers stacked under lax.scan, each rematerialized in the backward (jax.checkpoint)."""

  def stack(p, x):
    body = jax.checkpoint(lambda h, pl: (layer(pl, h) + h, None))
    return (lax.scan(body, x, p)[0] ** 2).mean()

  return jax.grad(stack)(p, x)


def ep_layer(p, x, mesh):
  """Expert parallel over mesh axis "x": each rank holds EXPERTS/n experts and multiplies all
  the rows of its groups (kernels.ragged_dot's group_offset); the outputs are summed."""
  n = mesh.shape["x"]
  w, order, gs = route(p, x)
  xs = jnp.repeat(x, TOP_K, axis=0)[order]

  def body(xs, gs, up, down):
    off = lax.axis_index("x") * (EXPERTS // n)
    h = jax.nn.silu(kernels.ragged_dot(xs, up, gs, group_offset=off))
    return lax.psum(kernels.ragged_dot(h, down, gs, group_offset=off), "x")

  shard = lambda a: jax.sharding.reshard(a, P("x"))
  y = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("x"), P("x")), out_specs=P())(
    xs, gs, shard(p["up"]), shard(p["down"])
  )
  y = jnp.zeros_like(y).at[order].set(y).reshape(x.shape[0], TOP_K, HIDDEN)
  return (y * jax.nn.softmax(w)[..., None]).sum(1)


def dp_layer(p, x, mesh):
  """Data parallel over mesh axis "x": each rank routes its own tokens."""
  return jax.shard_map(lambda x: layer(p, x), mesh=mesh, in_specs=P("x"), out_specs=P("x"))(
    jax.sharding.reshard(x, P("x"))
  )


def make_train():
  """For `ragtune shapes from-function moe_model:make_train`: (step, args)."""
  return train_step, (init(), tokens())


def step_args():
  """For `--args moe_model:step_args`."""
  return init(), tokens()
