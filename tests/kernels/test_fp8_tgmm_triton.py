"""pallas_gpu's fp8 weight gradient (tgmm.tgmm_quantized, Backend.grad_rhs_quantized), the drhs of
DeepSeek-V3's fp8 training recipe, in the interpreter: against float64 NumPy of its formula and
the xla backend's reference, on quant.token_blocks' padded token axis built from random rows;
its config rules; and the kernel compiled deviceless for an H100.

The products of fp8 values are exact in f32, so the only error is the f32 accumulation (and the
scaling): a result within RTOL of the root sum of squares of its terms.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gpu_compile_missing, needs_compiler

import kernels
from kernels import quant
from kernels.pallas_gpu import config as tconfig
from kernels.pallas_gpu import tgmm
from kernels.pallas_gpu.config import TritonConfig
from kernels.xla import ops as xla_ops

FMT = "float8_e4m3fn:block128"
H100 = "NVIDIA H100 80GB HBM3"
RTOL = 1e-5
# (m, ka, kb, group sizes): ka and kb off every block; empty groups (first, middle, last), a
# group of one row, one of 128 exactly, one over two blocks; sum(sizes) < m.
CASE = (420, 200, 72, [0, 70, 0, 1, 128, 150, 0])


def _inputs(m, ka, kb, sizes, seed=0, group_offset=None, g_local=None):
  """fp8 values and scales of random rows x [m, ka] and dout [m, kb] on the padded token axis.
  Rows are scaled by random powers of two, so block scales differ by up to 2^6 along tokens."""
  rng = np.random.default_rng(seed)
  row = 2.0 ** rng.integers(-3, 4, (m, 1))
  x = jnp.asarray(rng.standard_normal((m, ka)) * row, jnp.float32)
  dout = jnp.asarray(rng.standard_normal((m, kb)) * row[::-1], jnp.float32)
  g = len(sizes) if g_local is None else g_local
  blocks = quant.token_blocks(jnp.asarray(sizes, jnp.int32), m, group_offset, g)
  a_t, a_s = quant.quantize_tokens(x, blocks, "float8_e4m3fn")
  b_t, b_s = quant.quantize_tokens(dout, blocks, "float8_e4m3fn")
  return a_t, b_t, a_s, b_s, blocks.first, blocks.count


def _numpy(a_t, b_t, a_s, b_s, first, count):
  """float64 (out [g, ka, kb], root sum of squares of each output's terms)."""
  a = np.asarray(a_t.astype(jnp.float32), np.float64)
  b = np.asarray(b_t.astype(jnp.float32), np.float64)
  a_s, b_s = np.asarray(a_s, np.float64), np.asarray(b_s, np.float64)
  g = len(first)
  out = np.zeros((g, a.shape[0], b.shape[0]))
  squares = np.zeros_like(out)
  for i in range(g):
    for j in range(int(first[i]), int(first[i] + count[i])):
      blk = slice(j * quant.BLOCK, (j + 1) * quant.BLOCK)
      scale = np.outer(a_s[j], b_s[j])
      out[i] += (a[:, blk] @ b[:, blk].T) * scale
      squares[i] += (a[:, blk] ** 2 @ (b[:, blk] ** 2).T) * scale**2
  return out, np.sqrt(squares)


def _within(got, ref, root, rtol=RTOL):
  """Elementwise, for a float32 result: |got - ref| <= rtol * root."""
  return np.abs(np.asarray(got, np.float64) - ref) <= rtol * root


def _run(args, cfg, out_dtype=jnp.float32):
  return tgmm.tgmm_quantized(*args, config=cfg, out_dtype=out_dtype, interpret=True)


@pytest.mark.parametrize(
  "cfg",
  [
    TritonConfig(32, 64, 32, 4, 2, group_k=2),
    TritonConfig(64, 128, 64, 4, 3),
    TritonConfig(128, 64, 32, 8, 3, group_k=3),
    TritonConfig(16, 256, 128, 4, 2),  # the kernel takes any step dividing 128 (fits wants >= 32)
  ],
  ids=lambda c: f"m{c.block_m}k{c.block_k}n{c.block_n}g{c.group_k}",
)
def test_matches_numpy_and_xla(cfg):
  m, ka, kb, sizes = CASE
  args = _inputs(m, ka, kb, sizes)
  out = _run(args, cfg)
  assert out.shape == (len(sizes), ka, kb) and out.dtype == jnp.float32
  ref, root = _numpy(*args)
  xla = xla_ops.tgmm_quantized(*args[:4], args[5], out_dtype=jnp.float32)
  assert np.all(_within(out, ref, root)), np.abs(np.asarray(out) - ref).max()
  assert np.all(_within(xla, ref, root)), "the xla reference strays from float64 NumPy"
  assert np.all(_within(out, np.asarray(xla, np.float64), root, 2 * RTOL))
  empty = [i for i, s in enumerate(sizes) if s == 0]
  assert not np.any(np.asarray(out)[empty])  # empty groups run no step and store zeros
  assert np.all(np.abs(ref[[i for i, s in enumerate(sizes) if s]]).max(axis=(1, 2)) > 0)


def test_bf16_output_and_a_group_offset_shard():
  """Groups [2, 5) of 7 (expert parallelism: token_blocks lays out the local ones only), out in bf16."""
  m, ka, kb, sizes = CASE
  args = _inputs(m, ka, kb, sizes, seed=1, group_offset=2, g_local=3)
  out = _run(args, TritonConfig(64, 64, 64, 4, 2), jnp.bfloat16)
  assert out.shape == (3, ka, kb) and out.dtype == jnp.bfloat16
  ref, root = _numpy(*args)
  got = np.asarray(out.astype(jnp.float32), np.float64)
  assert np.all(np.abs(got - ref) <= RTOL * root + 2.0**-8 * np.abs(ref))


def test_swapped_block_scales_fail_the_bound():
  """Mutation: two 128-token blocks of one group exchange their lhs scales. The sum over the
  group is not the same, and the bound sees it."""
  m, ka, kb, sizes = CASE
  a_t, b_t, a_s, b_s, first, count = args = _inputs(m, ka, kb, sizes)
  ref, root = _numpy(*args)
  i = int(np.argmax(np.asarray(count)))
  j0, j1 = int(first[i]), int(first[i]) + 1
  assert count[i] >= 2 and np.any(np.asarray(a_s[j0] != a_s[j1]))
  swapped = a_s.at[j0].set(a_s[j1]).at[j1].set(a_s[j0])
  cfg = TritonConfig(64, 128, 64, 4, 2)
  assert np.all(_within(_run(args, cfg), ref, root))
  assert not np.all(_within(_run((a_t, b_t, swapped, b_s, first, count), cfg), ref, root))


def test_transpose_rhs_through_the_backend(monkeypatch):
  """grad_rhs's convention: the config in the [g, k, n] frame; transpose_rhs gives [g, n, k],
  the kernel run with a and b and block_k and block_n swapped. Same as the xla backend's."""
  m, ka, kb, sizes = CASE
  args = _inputs(m, ka, kb, sizes, seed=2)
  ref, root = _numpy(*args)
  seen, real = [], tgmm.tgmm_quantized

  def spy(*a, config, **kw):
    seen.append(config)
    return real(*a, config=config, **kw)

  monkeypatch.setattr(tgmm, "tgmm_quantized", spy)
  cfg = TritonConfig(64, 128, 32, 4, 2)
  b = kernels.registry.get("pallas_gpu")
  out = b.grad_rhs_quantized(*args, config=cfg, out_dtype=jnp.float32, transpose_rhs=True, interpret=True)
  assert out.shape == (len(sizes), kb, ka)
  assert seen == [dataclasses.replace(cfg, block_k=32, block_n=128)]
  assert np.all(_within(out, ref.swapaxes(1, 2), root.swapaxes(1, 2)))
  xla = kernels.registry.get("xla").grad_rhs_quantized(*args, out_dtype=jnp.float32, transpose_rhs=True)
  assert np.all(_within(out, np.asarray(xla, np.float64), root.swapaxes(1, 2), 2 * RTOL))
  plain = b.grad_rhs_quantized(*args, config=cfg, out_dtype=jnp.float32, interpret=True)
  assert plain.shape == (len(sizes), ka, kb) and np.all(_within(plain, ref, root))


def test_a_step_must_divide_the_scale_block():
  args = _inputs(*CASE)
  with pytest.raises(ValueError, match="block_m must divide 128, got 256"):
    _run(args, TritonConfig(256, 64, 64, 4, 2))
  with pytest.raises(ValueError, match="whole 128-blocks"):
    tgmm.tgmm_quantized(args[0][:, :100], args[1][:, :100], *args[2:], config=TritonConfig(), out_dtype=jnp.float32)


def test_config_rules():
  """drhs of the training format: steps of 32, 64 or 128 tokens, at most 64 accumulator values
  a thread; other formats' dlhs and drhs are not computed; the training format's dlhs is the
  forward's kernel and rule; the default and every candidate of the space fit."""
  m, k, n, g = 8192, 7168, 2048, 8
  b = kernels.registry.get("pallas_gpu")
  assert TritonConfig(128, 128, 128, 8, 3).fits("drhs", FMT, m, k, n, H100)
  assert TritonConfig(32, 256, 64, 8, 3).fits("drhs", FMT, m, k, n, H100)  # no 128-column rule on the output
  assert not TritonConfig(128, 128, 128, 4, 3).fits("drhs", FMT, m, k, n, H100)  # 128 values a thread: spilled
  assert not TritonConfig(256, 64, 64, 8, 3).fits("drhs", FMT, m, k, n, H100)  # straddles two scale blocks
  assert not TritonConfig(16, 128, 128, 8, 3).fits("drhs", FMT, m, k, n, H100)  # below TOKEN_STEP_MIN
  assert not TritonConfig(128, 128, 128, 8, 3).fits("drhs", "float8_e4m3fn:channelwise", m, k, n, H100)
  assert TritonConfig(128, 128, 128, 8, 3).fits("dlhs", FMT, m, k, n, H100)
  assert not TritonConfig(128, 64, 256, 8, 3).fits("dlhs", FMT, m, k, n, H100)  # 256 columns: two scale blocks
  assert not TritonConfig(128, 128, 128, 8, 3).fits("dlhs", "float8_e4m3fn:channelwise", m, k, n, H100)
  assert tconfig.token_step_violation(64) == "" and "got 256" in tconfig.token_step_violation(256)
  space = b.space("drhs", FMT, m, k, n, H100)
  assert space and {c.block_m for c in space} == {32, 64, 128}
  assert all(c.fits("drhs", FMT, m, k, n, H100) for c in space)
  assert b.space("dlhs", FMT, m, k, n, H100) and b.space("drhs", "float8_e4m3fn:channelwise", m, k, n, H100) == []
  for kind in (H100, "NVIDIA B200", "NVIDIA A100-SXM4-80GB", None):
    d = b.default("drhs", FMT, m, k, n, g, kind)
    assert (d.block_m, d.block_k, d.block_n, d.num_warps, d.num_stages) == (128, 128, 128, 8, 3), d
    assert d.fits("drhs", FMT, m, k, n, kind), d
  # Few rows: the kernel steps over a padded token axis of at least one 128-token block, so
  # the step is not clamped to the rows, and the default and the space still fit.
  for rows in (8, 40, 128):
    d = b.default("drhs", FMT, rows, 64, 48, 2, H100)
    assert d.block_m == 128 and d.fits("drhs", FMT, rows, 64, 48, H100), (rows, d)
    space = b.space("drhs", FMT, rows, 64, 48, H100)
    assert {c.block_m for c in space} == {32, 64, 128}, rows


@needs_compiler(gpu_compile_missing(), "deviceless compile tests")
def test_h100_default_compiles_clean():
  """The H100 default at DeepSeek-V3's size (ka 7168, kb 2048, 8192 tokens, 8 groups), deviceless:
  built, no spill, within shared memory. jax's Triton lowering leaves the fp8 dot's
  max_num_imprecise_acc at 0, so Triton runs it as f16 mma.sync (the fp8 values converted
  exactly), as it does the fp8 forward (tests/ragtune/test_quantized.py)."""
  from ragtune.deviceless import aot

  ka, kb, t, g = 7168, 2048, 8192, 8
  cfg = kernels.registry.get("pallas_gpu").default("drhs", FMT, t, ka, kb, g, H100)
  grad = kernels.registry.get("pallas_gpu").grad_rhs_quantized

  def fn(a_t, b_t, a_s, b_s, first, count):
    return grad(a_t, b_t, a_s, b_s, first, count, config=cfg, out_dtype=jnp.float32)

  f8, f32, i32 = jnp.float8_e4m3fn, jnp.float32, jnp.int32
  shapes = [((ka, t), f8), ((kb, t), f8), ((t // 128, ka), f32), ((t // 128, kb), f32), ((g,), i32), ((g,), i32)]
  report = aot.compile_fn("h100", fn, *shapes)
  assert report.ok, f"{report.outcome}: {report.error}"
  (kr,) = report.kernels
  assert kr.name.startswith("ragtune_tgmm_quantized"), kr
  assert kr.spill_bytes == 0 and kr.stack_bytes == 0 and kr.loop_spills == 0, kr
  assert kr.smem_bytes is not None and 0 < kr.smem_bytes <= cfg.smem_bytes("drhs", FMT, t, ka, kb), kr
  assert (kr.mma, kr.mma_inputs, kr.copy) == ("mma.sync", "f16", "cp.async"), kr
