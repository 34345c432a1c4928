"""backend="mosaic_blackwell" beyond test_conformance.py (which checks its numbers through
kernels.ragged_dot): export for CUDA, the kernels on two simulated SMs in jax's Mosaic GPU
interpreter (race detector on) where the persistent loop hands work between cells, the
config's rules, and what happens where the interpreter cannot run tcgen05.

jax's Mosaic GPU interpreter runs tcgen05 MMAs and tensor memory from jax 0.12 on; under
jax 0.10.2 the interpreted cases skip (and the refusal is tested). The CTA pair (cluster-
collective tensor memory) is not interpreted by any jax: tests/ragtune/test_aot_compile.py
compiles it for a B200.
"""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

pytest.importorskip("absl", reason="jax's Mosaic GPU package needs absl-py")

from conftest import np_ragged_dot, rand  # noqa: E402

import kernels  # noqa: E402
from kernels import registry  # noqa: E402
from kernels.mosaic_blackwell import config as bw_config  # noqa: E402
from kernels.mosaic_blackwell import gmm as bw_gmm  # noqa: E402
from kernels.mosaic_blackwell import tgmm as bw_tgmm  # noqa: E402

rd = importlib.import_module("kernels.ragged_dot")  # the module; kernels.ragged_dot is the op

S = jax.ShapeDtypeStruct
B200 = "NVIDIA B200"
BACKEND = registry.get("mosaic_blackwell")
UNSUPPORTED = BACKEND.interpret_unsupported()
interpreted = pytest.mark.skipif(bool(UNSUPPORTED), reason=UNSUPPORTED.get("fwd", ""))
Config = kernels.BlackwellConfig


def _export_for_b200(f, *args):
  dev = AbstractDevice(device_kind=B200, num_cores=None, platform="cuda")
  mesh = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,), abstract_device=dev)
  checks = [jax.export.DisabledSafetyCheck.custom_call("mosaic_gpu_v2")]
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_each_op_exports_to_one_mosaic_kernel(op):
  m, k, n, g, bf = 300, 72, 200, 5, jnp.bfloat16
  cfg = registry.default_config("mosaic_blackwell", op, "bfloat16", m, k, n, g, device_kind=B200)
  kw = dict(backend="mosaic_blackwell", config=cfg, out_dtype=bf, interpret=False)
  gs, off = S((g,), jnp.int32), S((), jnp.int32)
  if op == "fwd":
    f = lambda x, w, s, o: rd.forward(x, w, s, group_offset=o, **kw)
    args = (S((m, k), bf), S((g, k, n), bf), gs, off)
  elif op == "dlhs":
    f = lambda d, w, s, o: rd.grad_lhs(d, w, s, group_offset=o, **kw)
    args = (S((m, n), bf), S((g, k, n), bf), gs, off)
  else:
    f = lambda x, d, s, o: rd.grad_rhs(x, d, s, num_groups=g, group_offset=o, **kw)
    args = (S((m, k), bf), S((m, n), bf), gs, off)
  assert _export_for_b200(f, *args).count("mosaic_gpu_v2") == 1


# --- interpreted, two SMs ------------------------------------------------------------------


@pytest.fixture
def race_checked(monkeypatch, capsys):
  """Two simulated SMs and the race detector on; a case fails on any reported race."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  params = InterpretGPUParams(detect_races=True, out_of_bounds_reads="uninitialized", uninitialized_memory="zero")
  monkeypatch.setattr(bw_gmm, "INTERPRET_NUM_SMS", 2)
  yield params
  assert "RACE DETECTED" not in capsys.readouterr().out


@pytest.mark.mgpu_interpret
@interpreted
@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
def test_gmm_ring_and_accumulators_carry_across_cells(race_checked, transpose_rhs):
  """Three k steps through a ring of two stages, [128, 256] cells in bands of 2 over ragged
  groups: each SM runs several cells, so the ring's slots and the two TMEM accumulators are
  handed from cell to cell (and the loads of a cell overlap the last one's epilogue). Rows
  of no local group (group_offset 1 of 4 groups, 2 local; rows past the sum) come out 0."""
  m, k, n, sizes, off = 300, 192, 320, [30, 0, 170, 60], 1
  cfg = Config(block_m=128, block_n=256, block_k=64, max_concurrent_steps=2, group_m=2)
  x = rand(1, (m, k), "bfloat16")
  w = rand(2, (2, n, k) if transpose_rhs else (2, k, n), "bfloat16")
  gs = jnp.array(sizes, jnp.int32)
  out = bw_gmm.gmm(
    x,
    w,
    gs,
    config=cfg,
    out_dtype=jnp.float32,
    transpose_rhs=transpose_rhs,
    group_offset=jnp.int32(off),
    interpret=race_checked,
  )
  want = np_ragged_dot(x, w, gs, transpose_rhs=transpose_rhs, group_offset=off)
  np.testing.assert_allclose(np.asarray(out), want, atol=1e-3, rtol=1e-3)


@pytest.mark.mgpu_interpret
@interpreted
def test_tgmm_masks_neighbours_rows_and_zeroes_empty_groups(race_checked):
  """64-row steps over groups that start and end off the 8-row grid (the mask warpgroup
  zeroes a neighbour's rows before each MMA reads them), an empty group (a zero tile),
  k and n that need padding and more cells than SMs."""
  m, ka, kb, sizes = 260, 200, 136, [37, 0, 150, 61]
  cfg = Config(block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, group_m=2)
  a, b = rand(3, (m, ka), "bfloat16"), rand(4, (m, kb), "bfloat16")
  out = np.asarray(
    bw_tgmm.tgmm(
      a, b, jnp.array(sizes, jnp.int32), num_groups=4, config=cfg, out_dtype=jnp.float32, interpret=race_checked
    )
  )
  a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
  bounds = np.cumsum([0, *sizes])
  want = np.stack([a64[s:e].T @ b64[s:e] for s, e in zip(bounds[:-1], bounds[1:])])
  np.testing.assert_allclose(out, want, atol=1e-3, rtol=1e-3)
  assert not out[1].any()


@pytest.mark.skipif(not UNSUPPORTED, reason="this jax's interpreter runs tcgen05")
def test_an_interpreter_without_tcgen05_is_refused_clearly():
  x, w, gs = rand(5, (16, 64), "bfloat16"), rand(6, (2, 64, 64), "bfloat16"), jnp.array([8, 8], jnp.int32)
  with pytest.raises(NotImplementedError, match="mosaic_blackwell' cannot run fwd interpreted: jax .* no tcgen05"):
    kernels.ragged_dot(x, w, gs, backend="mosaic_blackwell", interpret=True)


@pytest.mark.parametrize("pair", [False, True], ids=["1cta", "pair"])
def test_every_output_row_is_stored_once_by_its_own_segment(pair):
  """The kernel's schedule (common.tile_schedule on the cell's rows) and each CTA's share of
  a cell (gmm.cta_rows, which the epilogue calls): every row of [0, m) is stored by exactly
  one CTA, for its own segment. This is how the pair's rows are proven: jax's interpreter
  cannot run a CTA pair's MMA ("collective_axis not supported yet" in jax 0.12)."""
  rng = np.random.default_rng(7)
  cfg = Config(block_m=128, cta_pair=pair)
  for _ in range(20):
    g, m = int(rng.integers(1, 9)), int(rng.integers(1, 2000)) // 8 * 8 + 8
    sizes = rng.multinomial(int(rng.integers(0, m + 1)), np.ones(g) / g)
    off, local = int(rng.integers(0, g)), int(rng.integers(1, g + 1))
    local = min(local, g - off)
    seg_starts, seg_ends = kernels.common.segment_bounds(jnp.array(sizes, jnp.int32), m, jnp.int32(off), local)
    rows = cfg.cell("fwd")[0]
    bound = kernels.common.num_tiles_bound(m, rows, local)
    sched = kernels.common.tile_schedule(seg_starts, seg_ends, rows, bound, group_start=True, align=8)
    owner = np.full(m, -1)
    for t in range(int(sched.active[0])):
      seg = int(sched.tile_segment[t])
      for cta in range(cfg.ctas):
        first, lo, count = (
          int(v) for v in bw_gmm.cta_rows(seg_starts[seg], seg_ends[seg], sched.tile_row_start[t], cta, 128)
        )
        stored = np.arange(first + lo, first + lo + count)
        assert (owner[stored] == -1).all(), "a row stored twice"
        owner[stored] = seg
    want = np.concatenate([np.full(int(e - s), i) for i, (s, e) in enumerate(zip(seg_starts, seg_ends))])
    np.testing.assert_array_equal(owner, want)


# --- the config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "field,value",
  [("block_m", 256), ("block_n", 512), ("block_k", 32), ("max_concurrent_steps", 1), ("group_m", 0), ("cta_pair", 1)],
)
def test_config_rejects_invalid(field, value):
  with pytest.raises(ValueError, match=f"BlackwellConfig.{field}"):
    Config(**{field: value})


def test_what_a_config_cannot_drive_is_said():
  assert "block_m = 128" in Config(block_m=64).valid_for("fwd")
  assert Config(block_m=64, block_k=128).valid_for("drhs") is None
  assert "block_k = 256" in Config(block_k=128, cta_pair=True).valid_for("drhs")
  assert "64-wide halves" in Config(block_n=64, cta_pair=True).valid_for("fwd")
  # A pair's cell is two CTAs' rows; each CTA loads half the rhs columns.
  assert Config(cta_pair=True).cell("fwd") == (256, 256)
  assert Config(block_k=256, cta_pair=True).cell("drhs") == (256, 256)


def test_b200_defaults_fit_shared_and_tensor_memory():
  limit = kernels.common.gpu_smem_limit(B200)
  for op in kernels.common.OPS:
    cfg = registry.default_config("mosaic_blackwell", op, "bfloat16", 8192, 4096, 14336, 8, device_kind=B200)
    assert cfg.fits(op, "bfloat16", 8192, 4096, 14336, B200) and not cfg.cta_pair
    assert 2 * cfg.block_n <= bw_config.TMEM_COLS and cfg.smem_bytes(op, "bfloat16", 0, 0, 0) <= limit


def test_space_holds_pairs_where_the_problem_is_tall_enough():
  """Both 1-CTA and CTA-pair configs for a prefill problem, every one fitting; no pair for a
  decode batch (fwd: fewer rows than a pair's cell) or a drhs whose k is below 256."""
  for op in kernels.common.OPS:
    space = BACKEND.space(op, "bfloat16", 8192, 4096, 14336, B200)
    assert {c.cta_pair for c in space} == {False, True}, op
    assert all(c.fits(op, "bfloat16", 8192, 4096, 14336, B200) for c in space)
  assert not any(c.cta_pair for c in BACKEND.space("fwd", "bfloat16", 64, 4096, 14336, B200))
  assert not any(c.cta_pair for c in BACKEND.space("drhs", "bfloat16", 8192, 128, 14336, B200))


def test_launch_key_caps_the_band_at_the_widest_group():
  cfg = Config(group_m=16)
  key = BACKEND.launch_key(cfg, "fwd", 1024, 512, 512, (300, 0, 100))
  assert key == dataclasses.replace(cfg, group_m=3)  # 300 rows from row 0: three 128-row tiles
  pair = Config(group_m=16, cta_pair=True)
  assert BACKEND.launch_key(pair, "fwd", 1024, 512, 512, (300, 0, 100)).group_m == 2  # 256-row cells


def test_a_pairs_cluster_barriers_count_one_arrival_a_cta():
  """A cluster barrier's num_arrivals counts per CTA (Mosaic multiplies it by the CTAs an
  arrival reaches): 2 would wait for arrivals that never come, a hang no interpreter or
  compiler here can show."""
  bars = bw_gmm.barriers(Config(cta_pair=True))
  assert isinstance(bars["store_done"], type(bw_gmm.plgpu.ClusterBarrier(collective_axes=("x",))))
  assert bars["store_done"].num_arrivals == 1
