"""The GPU kernels compiled (not interpreted) on a real GPU: each backend's per-device default
config and a draw from its search space, fwd and the vjp, against float64 NumPy.

Skipped on a host without a GPU. RAGTUNE_GPU_TESTS_INTERPRET=1 runs the pallas_gpu cases in
the interpreter on a CPU host instead, to check this file itself (slow: minutes).
"""

import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import np_ragged_dot, np_ragged_dot_grads

import kernels
from ragtune.candidates import search_space
from ragtune.problems.shapes import Problem

ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU and os.environ.get("RAGTUNE_GPU_TESTS_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not (ON_GPU or INTERPRET), reason="needs a GPU (or RAGTUNE_GPU_TESTS_INTERPRET=1)")
DEVICE_KIND = jax.devices()[0].device_kind if ON_GPU else "NVIDIA H100 80GB HBM3"
HOPPER = any(h in DEVICE_KIND for h in ("H100", "H200", "H800", "GH200"))
BACKENDS = ["pallas_gpu"] + (["mosaic_gpu"] if ON_GPU and HOPPER else [])
TOL = {jnp.bfloat16: 2e-2, jnp.float16: 5e-3}

CASES = {
  # name: (m, k, n, group_sizes): each has an empty group; some leave rows past sum(group_sizes)
  "ragged_mkn_sum_lt_m": (1000, 520, 776, [130, 0, 301, 77, 0, 250, 64, 90]),
  "block_multiples": (2048, 1024, 2048, [512, 256, 0, 768, 128, 384]),
  "decode_many_empty": (48, 1024, 512, [0] * 20 + [5, 0, 11, 3] + [0] * 6 + [20, 9]),
}
if INTERPRET:  # the interpreter is slow: one small case
  CASES = {"ragged_mkn_sum_lt_m": (200, 72, 136, [30, 0, 61, 17, 0, 50])}


def _inputs(m, k, n, sizes, dtype, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  g = len(sizes)
  lhs = jax.random.normal(k1, (m, k), jnp.float32).astype(dtype)
  rhs = (jax.random.normal(k2, (g, k, n), jnp.float32) / np.sqrt(k)).astype(dtype)
  dout = jax.random.normal(k3, (m, n), jnp.float32).astype(dtype)
  return lhs, rhs, dout, jnp.array(sizes, jnp.int32)


def _close(out, ref64, dtype, what):
  scale = np.abs(ref64).max() or 1.0
  err = np.abs(np.asarray(out, np.float64) - ref64).max() / scale
  assert np.isfinite(err) and err <= TOL[dtype], f"{what}: max|err|/max|ref| = {err:.3g} > {TOL[dtype]}"


def _configs(backend, m, k, n, g, dtype, draws):
  """Each op's default for this device, plus `draws` configs drawn from the op's search space."""
  out = {}
  for op in kernels.common.OPS:
    cfgs = [kernels.registry.default_config(backend, op, dtype, m, k, n, g, device_kind=DEVICE_KIND)]
    if draws:
      p = Problem(op, backend, dtype, m, k, n, g, "explicit", (m,) + (0,) * (g - 1))
      space = search_space.candidates(p, device_kind=DEVICE_KIND)[1:]
      cfgs += random.Random(f"{backend}{op}{m}").sample(space, min(draws, len(space)))
    out[op] = cfgs
  return out


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_fwd_and_vjp_match_numpy(case, backend, dtype):
  m, k, n, sizes = CASES[case]
  g = len(sizes)
  lhs, rhs, dout, gs = _inputs(m, k, n, sizes, dtype)
  ref = np_ragged_dot(lhs, rhs, gs)
  ref_dl, ref_dr = np_ragged_dot_grads(lhs, rhs, gs, dout)
  dt = kernels.lut.canonical_dtype(dtype)
  per_op = _configs(backend, m, k, n, g, dt, draws=0 if INTERPRET or dtype == jnp.float16 else 3)
  for i in range(max(len(c) for c in per_op.values())):
    config = {op: cfgs[min(i, len(cfgs) - 1)] for op, cfgs in per_op.items()}
    what = f"{backend} {case} {dt} configs {config}"
    f = jax.jit(lambda a, b: kernels.ragged_dot(a, b, gs, backend=backend, config=config, interpret=INTERPRET))
    out, vjp = jax.vjp(f, lhs, rhs)
    dl, dr = vjp(dout)
    _close(out, ref, dtype, "fwd " + what)
    assert not np.any(np.asarray(out, np.float32)[sum(sizes) :]), "rows past sum(group_sizes) must be 0: " + what
    _close(dl, ref_dl, dtype, "dlhs " + what)
    _close(dr, ref_dr, dtype, "drhs " + what)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_matches_lax_on_an_anchor_sized_problem(backend):
  """Mixtral's layer at 1024 tokens (m = 2048, top-2), bf16: kernels.ragged_dot with no config
  (the LUT or the device default) against jax.lax.ragged_dot on the same device."""
  m, k, n, g = (2048, 4096, 14336, 8) if ON_GPU else (64, 64, 128, 8)
  sizes = np.random.default_rng(0).multinomial(m, [1 / g] * g).tolist()
  lhs, rhs, _, gs = _inputs(m, k, n, sizes, jnp.bfloat16, seed=1)
  out = jax.jit(lambda a, b: kernels.ragged_dot(a, b, gs, backend=backend, interpret=INTERPRET))(lhs, rhs)
  ref = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32)
  _close(out, np.asarray(ref, np.float64), jnp.bfloat16, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_fp8_training_matches_the_recipe(backend):
  """fp8 training (quantize=) compiled: out, dlhs and drhs of jax.vjp, each default's kernel,
  against test_fp8_training.py's float64 emulation of the recipe by kernels.quant's bound;
  ragged groups, an empty one, sum < m, k and n off 128."""
  from test_fp8_training import _check_against_both, _grads, _problem

  if INTERPRET and backend != "pallas_gpu":
    pytest.skip("interpreted here: pallas_gpu only")
  x, w, dout, sizes = _problem(11, m=1000, k=520, n=776, sizes=(130, 0, 301, 77, 0, 250, 64, 90))
  got = _grads(x, w, dout, sizes, 0, len(sizes), backend, INTERPRET)
  _check_against_both(got, x, w, dout, sizes, 0, len(sizes))
