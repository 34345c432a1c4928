"""backend="mosaic_gpu" beyond test_conformance.py (which checks its numbers through
kernels.ragged_dot): export for CUDA (Mosaic GPU custom call), tgmm's larger tiles in jax's
Mosaic GPU interpreter on CPU, the pure helpers, and "auto" following a LUT that mixes backends.

jax's Mosaic GPU package imports absl (absl-py, in the test extra); without it these
tests skip. The interpreter runs the kernels as they are, except for two things it does
not model, handled here and in the kernels:
- its wgmma cannot read a transposed tile (transpose_rhs, drhs): tests/kernels/mgpu_interpret.py
  adds that, as Hopper's wgmma does for 16-bit inputs;
- it drops a store that runs past an array's end, where a GPU's TMA clips it: the kernels
  store no sub-tile that starts past the (64-padded) output.
Each interpreted kernel call simulates INTERPRET_NUM_SMS programs on host threads, so
shapes are small and each case is one call.
"""

import dataclasses
import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

pytest.importorskip("absl", reason="jax's Mosaic GPU package needs absl-py")

from conftest import np_ragged_dot_grads, plan_of, rand  # noqa: E402
from mgpu_interpret import transposed_wgmma  # noqa: E402

import kernels  # noqa: E402
from kernels.mosaic_gpu import gmm as mgpu_gmm  # noqa: E402
from kernels.mosaic_gpu import tgmm as mgpu_tgmm

rd = importlib.import_module("kernels.ragged_dot")  # the module; kernels.ragged_dot is the op

S = jax.ShapeDtypeStruct
MOSAIC = "mosaic_gpu_v2"
TRITON = "__gpu$xla.gpu.triton"
H100 = "NVIDIA H100 80GB HBM3"
SMALL = kernels.MosaicConfig(block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, group_m=2)


def export_for_h100(f, *args):
  dev = AbstractDevice(device_kind=H100, num_cores=None, platform="cuda")
  mesh = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,), abstract_device=dev)
  checks = [jax.export.DisabledSafetyCheck.custom_call(MOSAIC), jax.export.DisabledSafetyCheck.custom_call(TRITON)]
  with jax.sharding.use_abstract_mesh(mesh):
    exp = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args)
  return exp.mlir_module()


# --- export for CUDA ---------------------------------------------------------------------


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
@pytest.mark.parametrize(
  "m,k,n", [(37, 40, 24), (300, 72, 200), (1024, 512, 768)], ids=["smaller_than_blocks", "ragged", "block_multiples"]
)
def test_each_op_exports_to_one_mosaic_kernel(op, m, k, n):
  g, bf = 5, jnp.bfloat16
  cfg = kernels.registry.default_config("mosaic_gpu", op, "bfloat16", m, k, n, g, device_kind=H100)
  assert cfg.fits(op, "bfloat16", m, k, n, H100)
  common = dict(backend="mosaic_gpu", config=cfg, out_dtype=bf, interpret=False)
  gs, off = S((8,), jnp.int32), S((), jnp.int32)
  if op == "fwd":
    f = lambda x, w, s, o: rd.forward(x, w, s, group_offset=o, **common)
    args = (S((m, k), bf), S((g, k, n), bf), gs, off)
  elif op == "dlhs":
    f = lambda d, w, s, o: rd.grad_lhs(d, w, s, group_offset=o, **common)
    args = (S((m, n), bf), S((g, k, n), bf), gs, off)
  else:
    f = lambda x, d, s, o: rd.grad_rhs(x, d, s, num_groups=g, group_offset=o, **common)
    args = (S((m, k), bf), S((m, n), bf), gs, off)
  mod = export_for_h100(f, *args)
  assert mod.count(MOSAIC) == 1 and TRITON not in mod


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_grad_through_mosaic_exports_three_kernels(transpose_rhs):
  m, k, n, g = 200, 128, 96, 4

  def loss(x, w, s, off):
    y = kernels.ragged_dot(
      x, w, s, backend="mosaic_gpu", group_offset=off, transpose_rhs=transpose_rhs, interpret=False
    )
    return jnp.sum(y.astype(jnp.float32) ** 2)

  w = S((g, n, k) if transpose_rhs else (g, k, n), jnp.float16)
  mod = export_for_h100(jax.grad(loss, argnums=(0, 1)), S((m, k), jnp.float16), w, S((8,), jnp.int32), S((), jnp.int32))
  assert mod.count(MOSAIC) == 3  # fwd gmm, dlhs gmm (transposed read), drhs tgmm


def test_f32_output_and_sm_count_fallback_export():
  assert mgpu_gmm.num_sms() == mgpu_gmm.FALLBACK_NUM_SMS  # CPU host: no GPU to ask
  bf = jnp.bfloat16
  mod = export_for_h100(
    lambda x, w, s: mgpu_gmm.gmm(x, w, s, config=SMALL, out_dtype=jnp.float32),
    S((64, 64), bf),
    S((2, 64, 64), bf),
    S((2,), jnp.int32),
  )
  assert mod.count(MOSAIC) == 1


def test_f32_inputs_are_refused_explicitly():
  """The op functions, called directly (test_conformance.py covers kernels.ragged_dot)."""
  x, w, gs = rand(0, (8, 16), jnp.float32), rand(1, (1, 16, 8), jnp.float32), jnp.array([8], jnp.int32)
  with pytest.raises(TypeError, match="one dtype among"):
    rd.forward(x, w, gs, backend="mosaic_gpu", config=SMALL, out_dtype=jnp.float32)
  with pytest.raises(TypeError, match="one dtype among"):
    rd.grad_rhs(
      x.astype(jnp.bfloat16),
      rand(2, (8, 8), jnp.float16),
      gs,
      num_groups=1,
      backend="mosaic_gpu",
      config=SMALL,
      out_dtype=jnp.float32,
    )


# --- numerics in the interpreter ------------------------------------------------------------

TOL = {jnp.bfloat16: 2e-2, jnp.float16: 5e-3}


def _check(out, ref64, dtype):
  scale = max(1.0, np.abs(ref64).max())
  np.testing.assert_allclose(np.asarray(out, np.float64), ref64, atol=TOL[dtype] * scale, rtol=TOL[dtype])


def _race_checked():
  """Interpreter params that also run its race detector (TMA reads past an array's end as zeros)."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  return InterpretGPUParams(detect_races=True, out_of_bounds_reads="uninitialized", uninitialized_memory="zero")


def _races_found() -> bool:
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks

  return gpu_callbacks.get_races().races_found


def _interpreted_gmm(lhs, rhs, sizes, offset, cfg, transpose_rhs):
  """gmm's f32 output in the interpreter, its race detector on (a race fails the case)."""
  with transposed_wgmma():
    out = mgpu_gmm.gmm(
      lhs,
      rhs,
      jnp.array(sizes, jnp.int32),
      config=cfg,
      out_dtype=jnp.float32,
      transpose_rhs=transpose_rhs,
      group_offset=jnp.int32(offset),
      interpret=_race_checked(),
    )
    out = np.asarray(out)
  assert not _races_found()
  return out


@pytest.mark.mgpu_interpret
@pytest.mark.parametrize(
  "cfg, transpose_rhs",
  [
    (kernels.MosaicConfig(64, 128, 64, 2, 2), False),  # consumers split the columns
    (kernels.MosaicConfig(128, 64, 64, 3, 1), True),  # consumers split the rows; rhs read transposed
  ],
  ids=["split-cols", "split-rows-transposed"],
)
def test_gmm_warp_specialized_in_interpreter(cfg, transpose_rhs):
  """gmm against float64 NumPy, with no race: group boundaries off 8-row multiples (a tile
  starts up to 7 rows before its group), an empty group, a group of several row tiles,
  rows past sum(group_sizes), group_offset (rows of other shards' groups are zeros), ragged
  k (padded to block_k) and n (a sub-tile past it stores nothing)."""
  m, k, n, sizes, offset, g = 230, 72, 136, [21, 0, 13, 150, 3, 9], 1, 4
  lhs = rand(12, (m, k), jnp.bfloat16)
  rhs = rand(13, (g, n, k) if transpose_rhs else (g, k, n), jnp.bfloat16)
  out = _interpreted_gmm(lhs, rhs, sizes, offset, cfg, transpose_rhs)
  rhs_kn = np.asarray(jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs, np.float64)
  ref, row = np.zeros((m, n)), sum(sizes[:offset])
  for i, size in enumerate(sizes[offset : offset + g]):
    ref[row : row + size] = np.asarray(lhs[row : row + size], np.float64) @ rhs_kn[i]
    row += size
  _check(out, ref, jnp.bfloat16)


# Routing whose groups' last row tiles (block_m 128, from 8-row boxes) end at each tail case:
# 1, 63, 64, 65, 127 and 128 rows, a group of 64 that fits one narrow cell, an empty group,
# rows of a group before the shard (group_offset 1) and after it, and rows past sum(sizes).
TAIL_SIZES, TAIL_OFFSET, TAIL_G, TAIL_M = [24, 129, 0, 63, 64, 191, 120, 186, 127, 40, 5], 1, 9, 1000
TAIL_ENDS = {1, 63, 64, 65, 127, 128}


def _last_tile_ends(cfg) -> set[int]:
  """Where each local group's last tile ends (gmm.tile_bounds' `end`), under gmm's own schedule."""
  seg, end, computed = mgpu_gmm.host_tiles(TAIL_SIZES, TAIL_M, TAIL_G, cfg, TAIL_OFFSET)
  last = np.r_[seg[1:] != seg[:-1], True]
  return set(end[last & (computed > 0)].tolist())


@pytest.mark.mgpu_interpret
@pytest.mark.parametrize(
  "cfg, transpose_rhs",
  [
    (kernels.MosaicConfig(128, 128, 64, 2, 2, narrow_tail=True), False),  # narrow cells: consumers of 64x64
    (kernels.registry.default_config("mosaic_gpu", "fwd", "bfloat16", 8192, 4096, 14336, 8, H100), True),
  ],
  ids=["128x128", "h100-default-transposed"],
)
def test_gmm_narrow_tail_cells_in_interpreter(cfg, transpose_rhs, monkeypatch):
  """narrow_tail: a cell whose rows fit in its first 64 runs as a 64-row cell, the consumers
  splitting its columns. Against jax.lax.ragged_dot and float64 NumPy, with the race detector,
  on a routing whose groups end at every tail case (the schedule is checked to), with ragged k
  (more steps than pipeline stages) and n (a narrow consumer's share past the padded n stores
  nothing). The kernel is checked to build both cells' wgmma: each consumer's 64 x block_n/2
  narrow one and its 64 x block_n wide one."""
  assert cfg.narrow_tail_applies("fwd") and cfg.block_m == 128
  assert TAIL_ENDS <= _last_tile_ends(cfg), sorted(_last_tile_ends(cfg))
  built = []
  wgmma = mgpu_gmm.plgpu.wgmma
  monkeypatch.setattr(
    mgpu_gmm.plgpu, "wgmma", lambda acc, a, b, **kw: built.append(acc.shape) or wgmma(acc, a, b, **kw)
  )
  m, k, n, sizes, offset, g = TAIL_M, 72 + 4 * cfg.block_k, 136, TAIL_SIZES, TAIL_OFFSET, TAIL_G
  assert -(-k // cfg.block_k) > cfg.max_concurrent_steps
  lhs = rand(20, (m, k), jnp.bfloat16)
  rhs = rand(21, (g, n, k) if transpose_rhs else (g, k, n), jnp.bfloat16)
  out = _interpreted_gmm(lhs, rhs, sizes, offset, cfg, transpose_rhs)
  assert set(built) == {(64, cfg.block_n // 2), (64, cfg.block_n)}, set(built)
  rhs_kn = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
  lo, hi = sum(sizes[:offset]), sum(sizes[: offset + g])
  local = jnp.array(sizes[offset : offset + g], jnp.int32)
  lax_out = jax.lax.ragged_dot(lhs[lo:hi], rhs_kn, local, preferred_element_type=jnp.float32)
  ref = np.zeros((m, n))
  ref[lo:hi] = np.concatenate(
    [
      np.asarray(x, np.float64) @ np.asarray(w, np.float64)
      for x, w in zip(np.split(lhs[lo:hi], np.cumsum(sizes[offset : offset + g])[:-1]), rhs_kn)
    ]
  )
  _check(out, ref, jnp.bfloat16)
  np.testing.assert_allclose(out[lo:hi], np.asarray(lax_out), rtol=1e-5, atol=1e-5)
  assert not out[:lo].any() and not out[hi:].any()


def test_narrow_tail_config_rules():
  """narrow_tail applies to fwd/dlhs on 16-bit operands with 128-row cells of 128+ columns, when
  set (a config that does not set it, as one saved before it existed, has it off); the search
  space offers those configs with it and without, the others without (as the defaults show
  them), and nothing twice."""
  bf16 = "bfloat16"
  assert kernels.MosaicConfig(128, 256, narrow_tail=True).narrow_tail_applies("fwd", bf16)
  assert kernels.MosaicConfig(128, 128, narrow_tail=True).narrow_tail_applies("dlhs", bf16)
  assert not kernels.MosaicConfig(128, 256).narrow_tail_applies("fwd", bf16)
  assert not kernels.registry.config_from_dict("mosaic_gpu", dict(block_m=128, block_n=256)).narrow_tail
  for cfg, op, fmt in (
    (kernels.MosaicConfig(128, 64, narrow_tail=True), "fwd", bf16),  # halves of 32 columns
    (kernels.MosaicConfig(64, 256, narrow_tail=True), "fwd", bf16),  # 64-row cells already
    (kernels.MosaicConfig(256, 128, narrow_tail=True), "fwd", bf16),
    (kernels.MosaicConfig(64, 256, 128, narrow_tail=True), "drhs", bf16),
    (kernels.MosaicConfig(128, 256, 128, narrow_tail=True), "fwd", "float8_e4m3fn:channelwise"),
  ):
    assert not cfg.narrow_tail_applies(op, fmt), (cfg, op, fmt)
  with pytest.raises(ValueError, match="narrow_tail must be true or false"):
    kernels.MosaicConfig(narrow_tail=1)
  space = kernels.registry.get("mosaic_gpu").space("fwd", bf16, 131072, 7168, 2048, H100)
  assert len(space) == len(set(space))
  on = {c for c in space if c.narrow_tail}
  assert on and all(c.narrow_tail_applies("fwd", bf16) for c in on)
  assert {dataclasses.replace(c, narrow_tail=False) for c in on} < set(space)  # and each without it
  moot = [c for c in space if not dataclasses.replace(c, narrow_tail=True).narrow_tail_applies("fwd", bf16)]
  assert moot and not any(c.narrow_tail for c in moot)
  for op, m in (("drhs", 131072), ("fwd", 512)):  # tgmm's steps; decode's 64-row cells
    assert not kernels.registry.default_config("mosaic_gpu", op, bf16, m, 7168, 2048, 256, H100).narrow_tail
  assert kernels.registry.default_config("mosaic_gpu", "fwd", bf16, 131072, 7168, 2048, 256, H100).narrow_tail_applies(
    "fwd", bf16
  )


def _fp8_gmm(lq, rq, gs, ls, rs, offset, g, cfg, transpose_rhs):
  """mgpu gmm of the groups [offset, offset + g) of quantized operands, interpreted with the
  race detector on, weights given [g, n, k] (transpose_rhs) or [g, k, n]; float64 out."""
  shard = rq[offset : offset + g]
  out = mgpu_gmm.gmm(
    lq,
    shard.swapaxes(1, 2) if transpose_rhs else shard,
    gs,
    config=cfg,
    out_dtype=jnp.bfloat16,
    transpose_rhs=transpose_rhs,
    group_offset=jnp.int32(offset),
    interpret=_race_checked(),
    lhs_scale=ls,
    rhs_scale=rs[offset : offset + g],
  )
  return np.asarray(out, np.float64)


@pytest.mark.mgpu_interpret
def test_fp8_channelwise_gmm_in_interpreter():
  """fp8 gmm with channelwise scales (kernels.quant) against the dequantized reference by
  its elementwise bound, with no race, on weights stored [g, n, k] and [g, k, n] (transposed
  by the wrapper: an 8-bit wgmma reads its B k-major only): group starts off 8-row multiples,
  an empty group, rows past sum(group_sizes), group_offset, ragged k and n, scales of each
  expert and row times powers of two up to 2^6 apart."""
  from kernels import quant

  if why := kernels.registry.get("mosaic_gpu").interpret_unsupported().get("fwd:float8_e4m3fn:channelwise"):
    pytest.skip(why)
  m, k, n, sizes, offset, g = 230, 200, 300, [21, 0, 13, 150, 3, 9], 1, 4
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((m, k), np.float32))
  w = jnp.asarray(rng.standard_normal((len(sizes), k, n), np.float32) / 14)
  lq, rq, ls, rs = quant.quantize_operands(x, w, "float8_e4m3fn:channelwise")
  ls = ls * jnp.asarray(2.0 ** rng.integers(-3, 4, (m, 1)), jnp.float32)
  rs = rs * jnp.asarray(2.0 ** rng.integers(-6, 7, (len(sizes), 1, 1)), jnp.float32)
  gs = jnp.array(sizes, jnp.int32)
  value, squares = quant.reference_program(lq, rq, gs, ls, rs)()  # quant.reference and error_scale, run once
  ref = np.asarray(value, np.float64)
  bound = quant.tolerance("float8_e4m3fn:channelwise", k, jnp.bfloat16).bound(ref, jnp.sqrt(squares))
  local = np.zeros(m, bool)
  local[sizes[0] : sum(sizes[: offset + g])] = True
  cfg = kernels.MosaicConfig(128, 256, 128, 2, 2)
  for transpose_rhs in (True, False):
    with transposed_wgmma():
      out = _fp8_gmm(lq, rq, gs, ls, rs, offset, g, cfg, transpose_rhs)
    assert not _races_found()
    np.testing.assert_array_equal(out[~local], 0.0)
    assert np.all(np.abs(out - ref)[local] <= bound[local]), transpose_rhs


@pytest.mark.mgpu_interpret
def test_fp8_block128_gmm_in_interpreter():
  """fp8 gmm with 128x128 block scales, each k step's wgmma promoted into the main
  accumulator with that block's scales, against the dequantized reference by its elementwise
  bound, with no race: both consumer splits (128x128 cells by rows over [g, n, k] weights,
  64x256 by columns over [g, k, n] ones, transposed by the wrapper), 128x256 cells (two 64x256
  consumers, each promoting its two 128-column halves in turn), and 256-deep steps of two k
  blocks, each in its own step accumulator, by rows and by columns (the last step's second
  block past k); ragged m, k (a partial last k block) and n (a partial last n block, and
  columns past n in a cell); group starts off 8-row multiples, an empty group, rows past
  sum(group_sizes), group_offset; scales of each row and k block, and of each expert's block,
  times powers of two up to 2^3 and 2^6 apart, one expert's all 2^12 up and one row's 2^12
  down. Then the mutation: one expert's scales of two k blocks swapped (a kernel reading the
  wrong k block's scale, or a 256-deep step mixing its halves) must fail the bound. And k of
  one partial block (100) under 256-deep steps."""
  from kernels import quant

  fmt = "float8_e4m3fn:block128"
  if why := kernels.registry.get("mosaic_gpu").interpret_unsupported().get(f"fwd:{fmt}"):
    pytest.skip(why)
  m, k, n, sizes, offset, g = 230, 300, 300, [21, 0, 13, 150, 3, 9], 1, 4
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((m, k), np.float32))
  w = jnp.asarray(rng.standard_normal((len(sizes), k, n), np.float32) / 14)
  lq, rq, ls, rs = quant.quantize_operands(x, w, fmt)
  ls = ls * jnp.asarray(2.0 ** rng.integers(-3, 4, ls.shape), jnp.float32)
  rs = rs * jnp.asarray(2.0 ** rng.integers(-6, 7, rs.shape), jnp.float32)
  rs, ls = rs.at[3].multiply(2.0**12), ls.at[40].multiply(2.0**-12)  # expert 3 holds rows 34..183
  gs = jnp.array(sizes, jnp.int32)
  local = np.zeros(m, bool)
  local[sizes[0] : sum(sizes[: offset + g])] = True

  value, squares = quant.reference_program(lq, rq, gs, ls, rs)()  # quant.reference and error_scale, run once
  ref = np.asarray(value, np.float64)
  bound = quant.tolerance(fmt, k, jnp.bfloat16).bound(ref, jnp.sqrt(squares))

  def run(cfg, transpose_rhs, rhs_scale):
    return _fp8_gmm(lq, rq, gs, ls, rhs_scale, offset, g, cfg, transpose_rhs)

  def within(out):
    return np.abs(out - ref)[local] <= bound[local]

  by_rows, by_cols = kernels.MosaicConfig(128, 128, 128, 2, 2), kernels.MosaicConfig(64, 256, 128, 2, 2)
  wide = kernels.MosaicConfig(128, 256, 128, 2, 2)  # two 64x256 consumers, promoted a 128-column half at a time
  # 256-deep steps (two step accumulators each), by rows and by columns: k's 3 blocks make the
  # last step's second half read past k.
  pair_rows, pair_cols = kernels.MosaicConfig(128, 128, 256, 2, 2), kernels.MosaicConfig(64, 256, 256, 2, 2)
  cases = ((by_rows, True), (by_cols, False), (wide, True), (pair_rows, True), (pair_cols, False))
  for cfg, transpose_rhs in cases:
    out = run(cfg, transpose_rhs, rs)
    assert not _races_found()
    np.testing.assert_array_equal(out[~local], 0.0)
    assert np.all(within(out)), (cfg, transpose_rhs)
  swapped = rs.at[3, 0, 1].set(rs[3, 1, 1]).at[3, 1, 1].set(rs[3, 0, 1])  # expert 3, columns 128..255
  for cfg in (by_rows, pair_rows):  # pair_rows: the two halves of one step
    assert not np.all(within(run(cfg, True, swapped))), cfg
  # k of one partial block under a 256-deep step: the [128, 256] boxes run past k on both operands.
  lq1, rq1, ls1, rs1 = quant.quantize_operands(x[:, :100], w[:, :100], fmt)
  value, squares = quant.reference_program(lq1, rq1, gs, ls1, rs1)()
  ref1 = np.asarray(value, np.float64)
  bound1 = quant.tolerance(fmt, 100, jnp.bfloat16).bound(ref1, jnp.sqrt(squares))
  out = _fp8_gmm(lq1, rq1, gs, ls1, rs1, offset, g, pair_rows, True)
  assert not _races_found() and np.all((np.abs(out - ref1) <= bound1)[local])


def test_fp8_config_rules():
  fmt, cfg = "float8_e4m3fn:channelwise", kernels.MosaicConfig(128, 256, 128, 3, 16)
  assert cfg.fits("fwd", fmt, 8192, 4096, 14336, H100)
  assert not cfg.fits("dlhs", fmt, 8192, 4096, 14336, H100)
  assert "block_k = 128" in kernels.MosaicConfig(128, 256, 64).valid_for("fwd", fmt)
  assert "64x256 consumer tiles" in kernels.MosaicConfig(128, 128, 128).valid_for("fwd", fmt)
  space = kernels.registry.get("mosaic_gpu").space("fwd", fmt, 8192, 4096, 14336, H100)
  assert space and all(c.fits("fwd", fmt, 8192, 4096, 14336, H100) for c in space)


def test_fp8_block128_config_rules():
  """Block scales: two 64x256, 64x128 or 64x64 consumers, each holding a main and a step
  accumulator and promoting one 128-column block of the scales at a time; 256-deep steps (two
  step accumulators) only on shares of at most 64x128; 128x128 cells of 256-deep steps for
  prefill, 64x256 of 128-deep ones for decode; forward only."""
  from kernels.mosaic_gpu import config as mcfg

  fmt, backend = "float8_e4m3fn:block128", kernels.registry.get("mosaic_gpu")
  assert kernels.MosaicConfig(128, 256, 128).valid_for("fwd", fmt) is None
  for cfg in (kernels.MosaicConfig(256, 128, 128), kernels.MosaicConfig(256, 256, 128)):
    assert "64x256 or 64x128 or 64x64 consumer tiles" in cfg.valid_for("fwd", fmt)
  # fp8 training: dlhs is the forward's kernel and rule; drhs one tile (FP8_DRHS_TILE)
  assert kernels.MosaicConfig(128, 128, 128).valid_for("dlhs", fmt) is None
  assert "block scales only" in kernels.MosaicConfig(128, 256, 128).valid_for("dlhs", "float8_e4m3fn:channelwise")
  assert kernels.MosaicConfig(128, 128, 128).valid_for("drhs", fmt) is None
  assert "(128, 128, 128)" in kernels.MosaicConfig(64, 128, 128).valid_for("drhs", fmt)
  assert "block scales only" in kernels.MosaicConfig(128, 128, 128).valid_for("drhs", "float8_e4m3fn:channelwise")
  drhs = backend.space("drhs", fmt, 8192, 7168, 2048, H100)
  assert drhs and all(c.fits("drhs", fmt, 8192, 7168, 2048, H100) for c in drhs)
  assert backend.default("drhs", fmt, 8192, 7168, 2048, 8, H100).fits("drhs", fmt, 8192, 7168, 2048, H100)
  assert "at most 64x128" in kernels.MosaicConfig(128, 256, 256).valid_for("fwd", fmt)
  assert "block_k = 128" in kernels.MosaicConfig(128, 128, 256).valid_for("fwd", "float8_e4m3fn:channelwise")
  for cfg in (
    kernels.MosaicConfig(128, 128, 256),
    kernels.MosaicConfig(64, 256, 256),
    kernels.MosaicConfig(128, 64, 256),
  ):
    assert cfg.valid_for("fwd", fmt) is None, cfg
  for m, g, want in ((131072, 256, (128, 128, 256, 3)), (8192, 8, (128, 128, 256, 3)), (512, 256, (64, 256, 128, 5))):
    cfg = backend.default("fwd", fmt, m, 7168, 2048, g, H100)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.max_concurrent_steps) == want
    assert cfg.fits("fwd", fmt, m, 7168, 2048, H100)
  space = backend.space("fwd", fmt, 131072, 7168, 2048, H100)
  tiles = {c.consumer_tile("fwd")[:2] for c in space}
  assert space and tiles == set(mcfg.FP8_BLOCK_CONSUMER_TILES)
  pairs = {c.consumer_tile("fwd")[:2] for c in space if c.block_k == 256}
  assert pairs == {(64, 128), (64, 64)}
  # k is padded to its 128-block whatever block_k: an odd count of blocks keeps 256 in the space.
  assert any(c.block_k == 256 for c in backend.space("fwd", fmt, 131072, 7296, 2048, H100))
  # 256-deep steps are block128's only: 16-bit operands and channelwise take at most 128.
  assert "at most 128 of k" in kernels.MosaicConfig(128, 128, 256).valid_for("fwd")
  # A device with less shared memory than Hopper, where two 256-deep stages do not fit: 128-deep steps.
  small = backend.default("fwd", fmt, 131072, 7168, 2048, 256, None)
  assert small.block_k == 128 and small.fits("fwd", fmt, 131072, 7168, 2048, None)
  assert all(c.fits("fwd", fmt, 131072, 7168, 2048, H100) for c in space)
  assert backend.space("dlhs", "float8_e4m3fn:channelwise", 131072, 7168, 2048, H100) == []
  # A stage carries its [block_k / 128, block_m] f32 row scales beside the operands.
  cfg = kernels.MosaicConfig(128, 128, 128, 5)
  assert cfg.smem_bytes("fwd", fmt, 1, 1, 1) - cfg.smem_bytes("fwd", "float8_e4m3fn:channelwise", 1, 1, 1) == (
    5 * 128 * 4 - (2 * (64 + 128) * 4 + 1024)
  )
  pair = kernels.MosaicConfig(128, 128, 256, 3)
  assert pair.smem_bytes("fwd", fmt, 1, 1, 1) == 3 * (256 * (128 + 128) + 2 * 128 * 4) + 2 * 64 * 64 * 2


def test_gmm_refuses_a_config_its_consumers_cannot_split():
  x = jnp.zeros((64, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="consumer warpgroups"):
    mgpu_gmm.gmm(
      x,
      jnp.zeros((1, 64, 64), jnp.bfloat16),
      jnp.array([64]),
      config=kernels.MosaicConfig(64, 64, 64),
      out_dtype=jnp.float32,
    )


@pytest.mark.mgpu_interpret
def test_tgmm_warp_specialized_in_interpreter():
  """tgmm against float64 NumPy, with no race: group boundaries off 8-row multiples, an
  empty group, a group of more steps than stages, rows past sum(group_sizes), group_offset,
  ragged ka and kb padded to 64 inside a 128-wide b tile (a skipped sub-tile)."""
  m, ka, kb, sizes, offset, g = 210, 72, 40, [37, 0, 13, 140, 5, 5], 1, 4
  a, b = rand(8, (m, ka), jnp.bfloat16), rand(9, (m, kb), jnp.bfloat16)
  with transposed_wgmma():
    out = mgpu_tgmm.tgmm(
      a,
      b,
      jnp.array(sizes, jnp.int32),
      num_groups=g,
      block_m=64,
      tile_a=128,
      tile_b=128,
      group_m=2,
      max_concurrent_steps=2,
      out_dtype=jnp.float32,
      group_offset=jnp.int32(offset),
      interpret=_race_checked(),
    )
    out = np.asarray(out)
  assert not _races_found()
  ref = np_ragged_dot_grads(a, np.zeros((g, kb, ka)), jnp.array(sizes), b, transpose_rhs=True, group_offset=offset)[1]
  assert out.shape == (g, ka, kb) and not np.any(out[0]), "the empty group's tile is zeros"
  _check(out, ref.transpose(0, 2, 1), jnp.bfloat16)


@pytest.mark.mgpu_interpret
def test_grad_rhs_transposed_in_interpreter():
  """drhs with transpose_rhs ([g,n,k]: the consumers split b's columns), a row step larger
  than every group, a consumer whose columns lie past k, and an empty group."""
  m, k, n, sizes = 90, 40, 72, [30, 0, 41]
  lhs, dout, gs = rand(10, (m, k), jnp.bfloat16), rand(11, (m, n), jnp.bfloat16), jnp.array(sizes, jnp.int32)
  cfg = kernels.MosaicConfig(block_m=128, block_n=64, block_k=128, max_concurrent_steps=2, group_m=1)
  assert cfg.valid_for("drhs") is None
  with transposed_wgmma():
    drhs = rd.grad_rhs(
      lhs,
      dout,
      gs,
      num_groups=3,
      backend="mosaic_gpu",
      config=cfg,
      out_dtype=jnp.bfloat16,
      transpose_rhs=True,
      interpret=_race_checked(),
    )
    drhs = np.asarray(drhs, np.float64)
  assert not _races_found()
  rhs = jnp.zeros((3, n, k), jnp.bfloat16)
  _, lax_vjp = jax.vjp(lambda w: jax.lax.ragged_dot(lhs, jnp.swapaxes(w, 1, 2), gs), rhs)
  assert drhs.shape == (3, n, k)
  _check(drhs, np.asarray(lax_vjp(dout)[0], np.float64), jnp.bfloat16)
  _check(drhs, np_ragged_dot_grads(lhs, rhs, gs, dout, transpose_rhs=True)[1], jnp.bfloat16)


def test_tgmm_refuses_a_consumer_share_under_64():
  a = jnp.zeros((64, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="multiple of 64 output rows or columns, got 32"):
    mgpu_tgmm.tgmm(
      a,
      a,
      jnp.array([64]),
      num_groups=1,
      block_m=64,
      tile_a=64,
      tile_b=64,
      group_m=1,
      max_concurrent_steps=2,
      out_dtype=jnp.float32,
    )


def test_interpret_unsupported_is_what_the_interpreter_cannot_run():
  """The backend says which ops jax's interpreter here cannot run (a sweep on a CPU skips
  them): dlhs and drhs, which read a tile transposed in wgmma, and fp8's forward, which reads
  its weights so too, exactly when the interpreter's wgmma reads its operands by index ranges
  alone (jax < 0.11). Running the kernel itself to see it fail would hang: one warpgroup
  raises while the others wait at a barrier."""
  from jax._src.pallas.mosaic.interpret import utils as interpret_utils
  from jax._src.state.types import TransposeTransform
  from mgpu_interpret import INTERPRETER_READS_TRANSPOSES

  unsupported = kernels.registry.get("mosaic_gpu").interpret_unsupported()
  transposed = {"dlhs", "drhs", "fwd:float8_e4m3fn:channelwise", "fwd:float8_e4m3fn:block128"}
  assert set(unsupported) == (set() if INTERPRETER_READS_TRANSPOSES else transposed)
  if unsupported:
    with pytest.raises(AttributeError, match="indices"):
      interpret_utils.to_range((TransposeTransform((1, 0)),))


def test_interpreting_on_a_small_pool_warns_once(monkeypatch):
  """Where XLA:CPU's pool is left too small for the interpreter (kernels.registry.interpreter_env),
  the first interpreted kernel says how to start the process; the next one says nothing."""
  for var in ("PJRT_NPROC", "NPROC"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setattr(mgpu_gmm, "host_cores", lambda: 2)
  monkeypatch.setattr(mgpu_gmm, "_pool_warned", False)
  with pytest.warns(RuntimeWarning, match="can deadlock on .* cores: start the process with PJRT_NPROC=8"):
    mgpu_gmm.interpret_params(True)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    mgpu_gmm.interpret_params(True)
    monkeypatch.setattr(mgpu_gmm, "host_cores", lambda: 64)
    monkeypatch.setattr(mgpu_gmm, "_pool_warned", False)
    mgpu_gmm.interpret_params(True)  # a pool large enough: no warning
    assert mgpu_gmm.interpret_params(False) is None


# --- pure helpers ----------------------------------------------------------------------------


def test_pad_to_multiple_pads_only_when_needed():
  x = jnp.ones((5, 64))
  assert mgpu_gmm.pad_to_multiple(x, 1, 64) is x
  y = mgpu_gmm.pad_to_multiple(x, 0, 8)
  assert y.shape == (8, 64) and not np.any(np.asarray(y)[5:])


# --- backend="auto" following a LUT that mixes backends ---------------------------------------


def _custom_calls(mod):
  return {"pallas_gpu": mod.count(TRITON), "mosaic_gpu": mod.count(MOSAIC)}


@pytest.mark.parametrize(
  "winners",
  [
    {"fwd": "pallas_gpu", "dlhs": "mosaic_gpu", "drhs": "xla"},
    {"fwd": "mosaic_gpu", "dlhs": "xla", "drhs": "pallas_gpu"},
    {"fwd": "xla", "dlhs": "pallas_gpu", "drhs": "mosaic_gpu"},
  ],
  ids=lambda w: "-".join(w.values()),
)
def test_auto_exports_each_op_with_its_lut_winner(monkeypatch, winners):
  """What this proves: given a GPU platform and the active LUT, "auto" picks each op's
  backend with Lut.query and each op lowers to that backend's kernel (Triton, Mosaic GPU,
  or plain XLA). The target is faked for resolve, which runs outside the export's
  abstract H100 mesh; on a real GPU kernels.target says "gpu" by itself."""
  from test_backends import SHAPE, _mixed_lut

  monkeypatch.setattr(kernels.target, "current", lambda: kernels.target.Target("gpu", H100, 132))
  kernels.lut.set_active_lut(_mixed_lut(winners))
  m, k, n, g = SHAPE["m"], SHAPE["k"], SHAPE["n"], SHAPE["g"]
  bf = jnp.bfloat16
  plan = plan_of("auto", None, m, k, n, g, bf)
  assert {op: name for op, (name, _) in plan.items()} == winners

  fwd = export_for_h100(
    lambda x, w, s: kernels.ragged_dot(x, w, s), S((m, k), bf), S((g, k, n), bf), S((g,), jnp.int32)
  )
  expect = {name: int(winners["fwd"] == name) for name in ("pallas_gpu", "mosaic_gpu")}
  assert _custom_calls(fwd) == expect

  def loss(x, w, s):
    return jnp.sum(kernels.ragged_dot(x, w, s).astype(jnp.float32) ** 2)

  grad = export_for_h100(jax.grad(loss, argnums=(0, 1)), S((m, k), bf), S((g, k, n), bf), S((g,), jnp.int32))
  per_backend = {name: sum(w == name for w in winners.values()) for name in ("pallas_gpu", "mosaic_gpu")}
  assert _custom_calls(grad) == per_backend


def test_auto_without_an_applicable_entry_falls_back_op_by_op(monkeypatch):
  """With no LUT entry, "auto" on Hopper runs fwd and dlhs on pallas_gpu and drhs on
  mosaic_gpu's tgmm (its op_priority) in 16-bit; float32, which mosaic_gpu does not compute,
  runs all three on pallas_gpu."""
  monkeypatch.setattr(kernels.target, "current", lambda: kernels.target.Target("gpu", H100, 132))
  kernels.lut.set_active_lut(kernels.Lut(H100, []))

  def loss(x, w, s, backend):
    return jnp.sum(kernels.ragged_dot(x, w, s, backend=backend).astype(jnp.float32) ** 2)

  def exported(backend, dtype):
    args = (S((256, 128), dtype), S((4, 128, 192), dtype), S((4,), jnp.int32))
    return export_for_h100(jax.grad(lambda x, w, s: loss(x, w, s, backend), argnums=(0, 1)), *args)

  bf = jnp.bfloat16
  assert {op: name for op, (name, _) in plan_of("auto", None, 256, 128, 192, 4, bf).items()} == {
    "fwd": "pallas_gpu",
    "dlhs": "pallas_gpu",
    "drhs": "mosaic_gpu",
  }
  assert _custom_calls(exported("auto", bf)) == {"pallas_gpu": 2, "mosaic_gpu": 1}
  assert _custom_calls(exported("auto", jnp.float32)) == {"pallas_gpu": 3, "mosaic_gpu": 0}
  # A plain dict (the README's) is the device backend's config for every op; fp8 training
  # keeps its three ops on one backend (format_priority), whatever op_priority says.
  readme = {"block_m": 64, "block_k": 64, "block_n": 128, "num_warps": 4, "num_stages": 3}
  for config in (readme, {"drhs": readme}):
    plan = plan_of("auto", config, 256, 128, 192, 4, bf)
    assert {op: name for op, (name, _) in plan.items()} == {
      "fwd": "pallas_gpu",
      "dlhs": "pallas_gpu",
      "drhs": "pallas_gpu",
    }
  plan = plan_of("auto", None, 256, 256, 256, 4, "float8_e4m3fn:block128")
  assert {name for name, _ in plan.values()} == {"mosaic_gpu"} and len(plan) == 3
  # An explicit backend means that backend, whatever the LUT says.
  from test_backends import _mixed_lut

  kernels.lut.set_active_lut(_mixed_lut({"fwd": "xla", "dlhs": "xla", "drhs": "xla"}))
  assert _custom_calls(exported("mosaic_gpu", bf)) == {"pallas_gpu": 0, "mosaic_gpu": 3}
  assert _custom_calls(exported("pallas_gpu", bf)) == {"pallas_gpu": 3, "mosaic_gpu": 0}


def test_register_split_shares_out_the_ctas_pool():
  """setmaxnreg moves registers within what the CTA was launched with: 3 warpgroups start at
  168 a thread (504 a lane of a warpgroup), so a producer at 40 leaves two consumers 232, at
  24 it leaves 240, and at 32 it leaves 232 too, not the 240 that hung tgmm."""
  common = kernels.common
  assert (common.launch_registers(384), common.launch_registers(256), common.launch_registers(128)) == (168, 255, 255)
  assert [common.register_split(3, p, 2) for p in (24, 32, 40, 48)] == [240, 232, 232, 224]
  for producer in range(24, 257, 8):
    try:
      share = common.register_split(3, producer, 2)
    except ValueError:
      assert producer + 2 * 168 > 504, producer  # only a producer that starves the consumers
      continue
    assert producer + 2 * share <= 3 * 168 and share % 8 == 0, (producer, share)
  for bad in (20, 30, 264):
    with pytest.raises(ValueError, match="multiple of 8"):
      common.register_split(3, bad, 2)


def test_mosaic_pipelines_ask_for_what_the_pool_holds(monkeypatch):
  """Each kernel's producer count makes jax's pipeline ask its consumers for no more than the
  pool leaves; tgmm's old 32 is refused before it can build a kernel that hangs."""
  from kernels.mosaic_gpu import config

  for kernel in ("gmm", "tgmm"):
    producer = config.pipeline_registers(kernel)
    assert producer + config.CONSUMERS * config.jax_consumer_registers(producer, config.CONSUMERS) <= 3 * 168
  monkeypatch.setitem(config.PRODUCER_REGISTERS, "tgmm", 32)
  with pytest.raises(ValueError, match="240 each .* over the 232 .* wait forever"):
    config.pipeline_registers("tgmm")


def test_the_consumer_split_is_jaxs_own():
  """config.jax_consumer_registers is what jax's emit_pipeline_warp_specialized sets (its
  private _compute_registers, on whichever jax runs): the check above means nothing if it
  drifts."""
  from kernels.mosaic_gpu import config

  pipeline = importlib.import_module("jax._src.pallas.mosaic_gpu.pipeline")
  if not hasattr(pipeline, "_compute_registers"):
    pytest.fail(f"jax {jax.__version__} has no pipeline._compute_registers: read how its pipeline splits registers")
  for producer in range(24, 257, 8):
    for consumers in (1, 2, 3):
      assert pipeline._compute_registers(producer, consumers) == config.jax_consumer_registers(producer, consumers)
