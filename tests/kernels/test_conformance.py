"""Every backend in kernels.registry keeps jax.lax.ragged_dot's contract.

Each test runs once per backend of the registry (a new backend joins by its registry line):
the forward and both gradients (dlhs, drhs through kernels.ragged_dot's custom_vjp), vmap,
expert-parallel shards (group_offset), empty groups and rows past sum(group_sizes), against
jax.lax.ragged_dot and a float64 NumPy reference on random inputs. A dtype a backend lacks
must raise its TypeError. Backends with knobs run interpreted: mosaic_gpu in jax's Mosaic
GPU interpreter (absl-py), whose wgmma reads transposed tiles with mgpu_interpret's help.
An interpreted kernel costs its compile more than its run, so a case traces its forward
and backward in one jit, and shapes stay small.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import np_ragged_dot, np_ragged_dot_grads, rand

import kernels
from kernels import common, registry

HI = jax.lax.Precision.HIGHEST
TOL = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 2e-2}
# Mosaic GPU's smallest tiles for every op (two 64-wide consumer shares), cheapest to
# interpret; the other backends run their defaults.
CONFIGS = {
  "mosaic_gpu": kernels.MosaicConfig(block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, group_m=2),
  # One config for the three ops: 128 TMEM lanes, a 128-deep step (drhs: 128 rows), one strip.
  "mosaic_blackwell": kernels.BlackwellConfig(block_m=128, block_n=64, block_k=128, max_concurrent_steps=2, group_m=2),
}
# The modules of the backends that jax's Mosaic GPU interpreter runs: where each one reads its
# interpreter params (interpret_params) and its count of simulated SMs (INTERPRET_NUM_SMS).
MGPU_MODULES = {
  "mosaic_gpu": ("kernels.mosaic_gpu.gmm", "kernels.mosaic_gpu.tgmm"),
  "mosaic_blackwell": ("kernels.mosaic_blackwell.gmm",),
}


@pytest.fixture(params=list(registry.REGISTRY))
def backend(request, monkeypatch, capsys):
  """A backend's name, inside what its interpreter needs. Mosaic GPU's runs with its race
  detector on, and a case fails if it reports a race (it prints one "RACE DETECTED" block
  per race). A backend whose kernels this jax's interpreter cannot run at all is skipped."""
  name = request.param
  if registry.get(name).interpreter != "mosaic_gpu":
    yield name
    return
  pytest.importorskip("absl", reason="jax's Mosaic GPU interpreter needs absl-py")
  unsupported = registry.get(name).interpret_unsupported()
  if set(unsupported) == set(common.OPS):
    pytest.skip(unsupported["fwd"])
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  from mgpu_interpret import transposed_wgmma

  modules = [importlib.import_module(m) for m in MGPU_MODULES[name]]
  checked = InterpretGPUParams(detect_races=True, out_of_bounds_reads="uninitialized", uninitialized_memory="zero")
  original = modules[0].interpret_params
  race_checked = lambda interpret, *rest: checked if interpret is True else original(interpret, *rest)
  for module in modules:
    monkeypatch.setattr(module, "interpret_params", race_checked)
  # One simulated SM: the numbers are the same, and it costs half the host threads;
  # tests/kernels/test_mosaic_gpu.py and test_mosaic_blackwell.py run two SMs for races.
  monkeypatch.setattr(modules[0], "INTERPRET_NUM_SMS", 1)
  with transposed_wgmma():
    yield name
  assert "RACE DETECTED" not in capsys.readouterr().out


def _widest(backend: str) -> str:
  """The most precise dtype the backend computes in."""
  return next(d for d in TOL if d in registry.get(backend).dtypes)


def _ragged_dot(backend, lhs, rhs, gs, config=None, **kw):
  config = config or CONFIGS.get(backend)
  return kernels.ragged_dot(lhs, rhs, gs, precision=HI, backend=backend, config=config, interpret=True, **kw)


def _fwd_and_grads(backend: str, transpose_rhs: bool = False, config=None):
  """jit (lhs, rhs, group_sizes, dout, group_offset) -> (out, dlhs, drhs): all three ops in
  one compile, which serves any group sizes and offset (they are traced). config: what
  ragged_dot takes (None: CONFIGS' or the backend's defaults)."""

  def f(lhs, rhs, gs, dout, offset=None):
    kw = {} if offset is None else {"group_offset": offset}
    ragged = lambda a, b: _ragged_dot(backend, a, b, gs, config, transpose_rhs=transpose_rhs, **kw)
    out, vjp = jax.vjp(ragged, lhs, rhs)
    return (out, *vjp(dout))

  return jax.jit(f)


def _lax(lhs, rhs, gs, dout, transpose_rhs=False):
  """jax.lax.ragged_dot's (out, dlhs, drhs) in float32 from the same inputs; drhs in rhs's layout."""
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  rhs_kn = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
  out, vjp = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs, precision=HI), f32(lhs), f32(rhs_kn))
  dlhs, drhs = vjp(f32(dout))
  return out, dlhs, jnp.swapaxes(drhs, 1, 2) if transpose_rhs else drhs


def _close(got, want, dtype, what=""):
  """Within the dtype's tolerance of `want`, scaled by its largest value."""
  want = np.asarray(want, np.float64)
  tol = TOL[jnp.dtype(dtype).name]
  scale = max(1.0, float(np.abs(want).max(initial=0.0)))
  np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=tol * scale, rtol=tol, err_msg=what)


def _operands(seed, m, k, n, g, dtype, transpose_rhs=False):
  """lhs [m,k], rhs [g,k,n] ([g,n,k] transposed) and a cotangent [m,n], fresh per seed."""
  return (
    rand(seed, (m, k), dtype),
    rand(seed + 1, (g, n, k) if transpose_rhs else (g, k, n), dtype),
    rand(seed + 2, (m, n), dtype),
  )


def _refuses(backend, dtype):
  return pytest.raises(TypeError, match=f"backend '{backend}' supports lhs/rhs dtypes .* got {dtype} x")


def _check(backend, dtype, m, k, n, group_sizes, transpose_rhs=False, seed=0, config=None):
  """Forward, dlhs and drhs against lax and NumPy, for each group sizes in `group_sizes`
  (one compile serves them all); rows past sum(group_sizes) and the weights of empty groups
  get exact zeros."""
  lhs, rhs, dout = _operands(seed, m, k, n, len(group_sizes[0]), dtype, transpose_rhs)
  f = _fwd_and_grads(backend, transpose_rhs, config)
  for sizes in group_sizes:
    gs = jnp.array(sizes, jnp.int32)
    out, dlhs, drhs = f(lhs, rhs, gs, dout)
    lax_out = jax.lax.ragged_dot(lhs, jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs, gs, precision=HI)
    assert out.shape == lax_out.shape and out.dtype == lax_out.dtype
    assert dlhs.shape == lhs.shape and drhs.shape == rhs.shape and dlhs.dtype == drhs.dtype == lhs.dtype
    np_want = (
      np_ragged_dot(lhs, rhs, gs, transpose_rhs=transpose_rhs),
      *np_ragged_dot_grads(lhs, rhs, gs, dout, transpose_rhs=transpose_rhs),
    )
    for name, got, want, want64 in zip(
      ("out", "dlhs", "drhs"), (out, dlhs, drhs), _lax(lhs, rhs, gs, dout, transpose_rhs), np_want
    ):
      _close(got, want, dtype, f"{name} vs lax, group sizes {sizes}")
      _close(got, want64, dtype, f"{name} vs NumPy, group sizes {sizes}")
    routed = sum(sizes)
    assert not np.any(np.asarray(out, np.float32)[routed:]), f"rows past sum({sizes}) must be 0"
    assert not np.any(np.asarray(dlhs, np.float32)[routed:]), f"and so their lhs gradient ({sizes})"
    empty = [i for i, size in enumerate(sizes) if size == 0]
    assert not np.any(np.asarray(drhs, np.float32)[empty]), f"an empty group's weight gradient is 0 ({sizes})"


GROUP_SIZES = [
  [9, 0, 13, 0, 6],  # empty groups, sum < m
  [0, 0, 37, 0, 0],  # every row in one group
  [0, 0, 0, 0, 0],  # nothing routed
  [7, 8, 9, 6, 7],  # every group, every row
]


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
def test_group_sizes(backend, transpose_rhs):
  """In the backend's widest dtype, rhs [g,k,n] or [g,n,k]."""
  _check(backend, _widest(backend), 37, 40, 24, GROUP_SIZES, transpose_rhs)


SHAPES = {
  # name: (m, k, n, group_sizes)
  "tiny_k8_n16": (19, 8, 16, [4, 10, 5]),
  "single_group": (21, 16, 40, [21]),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_shapes(backend, case):
  m, k, n, sizes = SHAPES[case]
  _check(backend, _widest(backend), m, k, n, [sizes], seed=10)


# Many small groups whose boundaries fall off every block grid (no row sum is a multiple of
# 16), one longer than a 64-row tile, m a multiple of 64: group-start row tiles of the last
# groups and of the rows past sum(group_sizes) run past m, and every tile but a group's last
# reaches into the next group's rows.
SMALL_GROUPS = [
  [5, 12, 3, 0, 17, 9, 70, 2, 13, 30, 7, 19, 21],  # sum 208 < m
  [5, 12, 3, 0, 17, 9, 70, 2, 13, 30, 7, 19, 69],  # sum m: the last group ends at m
]


def test_many_small_groups_off_the_block_grid(backend):
  _check(backend, _widest(backend), 256, 24, 40, SMALL_GROUPS, seed=15)


# The Mosaic backends' defaults for the GPUs they are tuned for, the tiles a GPU runs, which
# CONFIGS' small ones do not reach: [128, 256] cells (tgmm's [128, 256] of [k, n]), stored in
# [64, 64] sub-tiles, four a consumer (Hopper), or [128, 64] strips (Blackwell). On m, k and n
# off every block: 100 rows a group keep the 128-row cells (decode's 96 or fewer take 64), and
# n 328 and k 72 (padded to 384 and 128) leave two sub-tiles past the padded output after two
# stored ones in the last column block of fwd, dlhs and drhs; an empty group, a group starting
# off 8 rows, rows past sum(group_sizes).
DEVICE_KINDS = {"mosaic_gpu": "NVIDIA H100 80GB HBM3", "mosaic_blackwell": "NVIDIA B200"}
DEFAULTS_SHAPE = (300, 72, 328, [130, 0, 141])


@pytest.mark.parametrize("backend", list(DEVICE_KINDS), indirect=True)
def test_device_defaults(backend):
  m, k, n, sizes = DEFAULTS_SHAPE
  dtype = _widest(backend)
  kind = DEVICE_KINDS[backend]
  config = {op: registry.default_config(backend, op, dtype, m, k, n, len(sizes), kind) for op in common.OPS}
  _check(backend, dtype, m, k, n, [sizes], seed=25, config=config)


@pytest.mark.parametrize("dtype", common.DTYPES)
def test_dtypes(backend, dtype):
  """Each dtype the backend has, in and out of all three ops; the others refused."""
  m, k, n, sizes = 50, 64, 48, [20, 0, 25]
  if dtype in registry.get(backend).dtypes:
    _check(backend, dtype, m, k, n, [sizes], seed=20)
    return
  lhs, rhs, _ = _operands(20, m, k, n, len(sizes), dtype)
  with _refuses(backend, dtype):
    _ragged_dot(backend, lhs, rhs, jnp.array(sizes, jnp.int32))


@pytest.mark.parametrize(
  "lhs_dt,rhs_dt,pet",
  [
    ("bfloat16", "float32", None),
    ("bfloat16", "bfloat16", "float32"),
    ("float16", "float32", None),
    ("bfloat16", "float16", None),
  ],
)
def test_mixed_dtypes_follow_lax(backend, lhs_dt, rhs_dt, pet):
  """Inputs promote as lax promotes them, and the output takes lax's dtype; a backend that
  lacks the promoted dtype refuses it."""
  lhs, rhs, gs = rand(30, (24, 32), lhs_dt), rand(31, (2, 32, 16), rhs_dt), jnp.array([10, 9], jnp.int32)
  ref = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=pet)
  compute = jnp.promote_types(lhs_dt, rhs_dt).name
  if compute not in registry.get(backend).dtypes:
    with _refuses(backend, lhs_dt):
      _ragged_dot(backend, lhs, rhs, gs, preferred_element_type=pet)
    return
  out = _ragged_dot(backend, lhs, rhs, gs, preferred_element_type=pet)
  assert out.dtype == ref.dtype
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
def test_group_offset_shards(backend, transpose_rhs):
  """rhs holding 2 of 6 groups at every offset matches NumPy's shard, forward and grads;
  the shards of an expert-parallel split sum to the whole problem's output and dlhs, and
  their drhs stack into the whole drhs."""
  m, k, n, sizes, local = 50, 72, 80, [5, 0, 12, 20, 0, 9], 2
  dtype = _widest(backend)
  lhs, rhs, dout = _operands(40, m, k, n, len(sizes), dtype, transpose_rhs)
  gs = jnp.array(sizes, jnp.int32)
  f = _fwd_and_grads(backend, transpose_rhs)
  shards = {}
  for off in range(len(sizes) - local + 1):
    out, dlhs, drhs = shards[off] = f(lhs, rhs[off : off + local], gs, dout, jnp.int32(off))
    kw = dict(transpose_rhs=transpose_rhs, group_offset=off)
    _close(out, np_ragged_dot(lhs, rhs[off : off + local], gs, **kw), dtype)
    for got, want in zip((dlhs, drhs), np_ragged_dot_grads(lhs, rhs[off : off + local], gs, dout, **kw)):
      _close(got, want, dtype)
  split = [shards[off] for off in range(0, len(sizes), local)]
  whole = _lax(lhs, rhs, gs, dout, transpose_rhs)
  _close(sum(np.asarray(s[0], np.float64) for s in split), whole[0], dtype)
  _close(sum(np.asarray(s[1], np.float64) for s in split), whole[1], dtype)
  _close(np.concatenate([s[2] for s in split]), whole[2], dtype)


VB, VM, VK, VN, VG = 2, 24, 16, 16, 3
V_SIZES = jnp.array([[5, 0, 15], [0, 24, 0]], jnp.int32)  # sum < m, empty groups, one group


def _vmapped(backend, batched, transpose_rhs=False, group_offset=None):
  """(dtype, (out, dlhs, drhs) under vmap with one of lhs, rhs, group_sizes batched, the
  (lhs, rhs, group_sizes, dout) of each example); the cotangent is not uniform."""
  g = VG if group_offset is None else VG - group_offset
  dtype = _widest(backend)
  lhs = rand(50, (VB, VM, VK) if batched == "lhs" else (VM, VK), dtype)
  rhs_shape = (g, VN, VK) if transpose_rhs else (g, VK, VN)
  rhs = rand(51, (VB, *rhs_shape) if batched == "rhs" else rhs_shape, dtype)
  gs = V_SIZES if batched == "group_sizes" else V_SIZES[0]
  dout = jnp.linspace(-1.0, 1.0, VM * VN).reshape(VM, VN).astype(dtype)
  offset = None if group_offset is None else jnp.int32(group_offset)
  axes = tuple(0 if name == batched else None for name in ("lhs", "rhs", "group_sizes"))
  f = _fwd_and_grads(backend, transpose_rhs)
  # Unbatched operands get a per-example gradient under vmap.
  got = jax.jit(jax.vmap(lambda a, b, s: f(a, b, s, dout, offset), in_axes=axes))(lhs, rhs, gs)
  one = lambda x, i, name: x[i] if name == batched else x
  return dtype, got, [(one(lhs, i, "lhs"), one(rhs, i, "rhs"), one(gs, i, "group_sizes"), dout) for i in range(VB)]


def _one_vmap_case_for_mosaic(backend: str, kept: bool) -> None:
  """The Mosaic GPU kernels are batched by plgpu.kernel's own vmap rule, whichever operands
  vmap batches: one more grid axis, each batched operand's ref and the output's sliced per
  example. Their interpreter (three simulated warpgroups a CTA) is the slowest, so they run
  two of the forms: group sizes batched, alone and over a group_offset shard."""
  if registry.get(backend).interpreter == "mosaic_gpu" and not kept:
    pytest.skip("plgpu.kernel's vmap rule batches every operand alike; the Mosaic GPU backends run two vmap forms")


@pytest.mark.parametrize("batched", ["lhs", "rhs", "group_sizes"])
def test_vmap_one_operand_batched(backend, batched):
  """jax.lax.ragged_dot refuses these ("NYI"): the reference is a per-example loop."""
  _one_vmap_case_for_mosaic(backend, batched == "group_sizes")
  dtype, got, examples = _vmapped(backend, batched)
  for i, args in enumerate(examples):
    for batch, want in zip(got, _lax(*args)):
      _close(batch[i], want, dtype)


@pytest.mark.parametrize(
  "batched,transpose_rhs,group_offset",
  [("rhs", True, None), ("group_sizes", False, 1)],
  ids=["rhs_nk", "group_sizes_offset"],
)
def test_vmap_other_forms(backend, batched, transpose_rhs, group_offset):
  """rhs [g,n,k] batched; group sizes batched for rhs holding groups 1 and 2 of 3."""
  _one_vmap_case_for_mosaic(backend, group_offset is not None)
  dtype, got, examples = _vmapped(backend, batched, transpose_rhs, group_offset)
  kw = dict(transpose_rhs=transpose_rhs, group_offset=group_offset or 0)
  for i, (lhs, rhs, gs, dout) in enumerate(examples):
    want = (np_ragged_dot(lhs, rhs, gs, **kw), *np_ragged_dot_grads(lhs, rhs, gs, dout, **kw))
    for batch, w in zip(got, want):
      _close(batch[i], w, dtype)
