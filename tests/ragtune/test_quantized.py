"""Quantized experts through ragtune: shape files, a Hugging Face config's
quantization_config, the whole pipeline on a CPU (sweep -> verify -> export-lut -> a model
calling kernels.ragged_dot with the LUT, and training through it in fp8), and the fp8
kernels compiled for an H100."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiler_missing, needs_compiler
from typer.testing import CliRunner

import kernels
from kernels import quant, registry
from kernels.common import OPS
from kernels.ragged_dot import forward, resolve
from ragtune.cli.app import app
from ragtune.device import measure
from ragtune.deviceless import machine_code
from ragtune.errors import RagtuneError
from ragtune.problems import hf_config, shapes
from ragtune.problems.shapes import Problem
from ragtune.records import store

runner = CliRunner()


def _load(tmp_path, text):
  p = tmp_path / "q.yaml"
  p.write_text(text)
  return shapes.load_shape_set(p)


def test_shape_file_formats(tmp_path):
  spec = _load(
    tmp_path,
    """
dtype: float8_e4m3fn
scales: block128
backends: [pallas_gpu, xla]
shapes:
  - {m: 64, k: 256, n: 128, g: 4}
  - {m: 64, k: 256, n: 128, g: 4, scales: channelwise}
  - {m: 64, k: 256, n: 128, g: 4, dtype: bfloat16}
models:
  - {model: deepseek-v3, tokens: [8], dtype: shipped, projections: [up]}
""",
  )
  problems = shapes.expand(spec)
  fmts = {(p.m, p.k, p.n, p.backend): p.dtype for p in problems}
  assert {p.dtype for p in problems} == {"float8_e4m3fn:block128", "float8_e4m3fn:channelwise", "bfloat16"}
  assert fmts[(64, 7168, 2048, "xla")] == "float8_e4m3fn:block128"  # DeepSeek-V3's released format
  assert len({p.key for p in problems}) == len(problems)  # the format is in the key


@pytest.mark.parametrize(
  ("text", "message"),
  [
    (
      "dtype: float8_e4m3fn\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n",
      r"q.yaml:1: dtype: float8_e4m3fn operands need scales",
    ),
    ("dtype: bfloat16\nscales: block128\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n", r"q.yaml:1: dtype: scales apply to"),
    (
      "dtype: float8_e4m3fn\nscales: channelwise\nops: [fwd, dlhs]\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n",
      r"q.yaml:3: ops: float8_e4m3fn:channelwise operands are tuned forward only .*training formats "
      r"float8_e4m3fn:block128",
    ),
    (
      "dtype: float8_e4m3fn\nscales: block128\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1, scales: channelwise,"
      " ops: [fwd, drhs]}\n",
      r"q.yaml:4: shapes\[0\].ops: float8_e4m3fn:channelwise operands are tuned forward only",
    ),
    (
      "dtype: int8\nscales: block128\nbackends: [xla]\nops: [fwd, dlhs, drhs]\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n",
      r"q.yaml:4: ops: int8:block128 operands are tuned forward only",
    ),
    (
      "shapes:\n  - {m: 8, k: 8, n: 8, g: 1, scales: block128}\n",
      r"q.yaml:2: shapes\[0\].scales: scales apply to float8_e4m3fn or int8 operands, not bfloat16",
    ),
    ("models:\n  - {model: mixtral-8x7b, tokens: [8], dtype: shipped, scales: block128}\n", r"models\[0\].scales"),
    (
      "dtype: int8\nscales: channelwise\nbackends: [pallas_gpu]\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n",
      r"q.yaml:5: shapes\[0\]: int8:channelwise is computed by pallas_tpu, xla; backends lists pallas_gpu",
    ),
  ],
)
def test_shape_file_format_errors_name_the_key_and_line(tmp_path, text, message):
  with pytest.raises(RagtuneError, match=message):
    _load(tmp_path, text)


def test_ops_and_backends_a_format_lacks_are_left_out_with_a_reason(tmp_path):
  spec = _load(tmp_path, "dtype: float8_e4m3fn\nscales: channelwise\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n")
  skipped = []
  problems = shapes.expand(spec, ops=["fwd", "dlhs"], backends=["pallas_gpu", "mosaic_blackwell"], skipped=skipped)
  assert [(p.op, p.backend) for p in problems] == [("fwd", "pallas_gpu")]
  assert {why for *_, why in skipped} == {
    "quantized operands are forward only",
    "mosaic_blackwell computes no float8_e4m3fn:channelwise",
  }
  # The training format's gradients are tuned where asked for (--op), on the backends that
  # compute them, but where the backend's default does not fit the shape (no LUT would take it).
  spec = _load(tmp_path, "dtype: float8_e4m3fn\nscales: block128\nshapes:\n  - {m: 256, k: 256, n: 256, g: 2}\n")
  problems = shapes.expand(spec, ops=list(OPS), backends=["pallas_gpu", "xla", "mosaic_blackwell"])
  assert [(p.op, p.backend) for p in problems] == [(op, b) for op in OPS for b in ("pallas_gpu", "xla")]
  row = shapes._Row(256, 256, 256, 2, FMT, [128, 128], "test")
  unfit = type("Unfit", (), {"fits": lambda *a: False})()
  b = dataclasses.replace(registry.get("pallas_gpu"), default=lambda *a: unfit)
  assert shapes._untunable(b, "drhs", row).startswith(f"pallas_gpu tunes no drhs of {FMT}")
  assert shapes._untunable(b, "fwd", row) == ""


def test_training_format_ops(tmp_path):
  """A training format's row takes the ops it lists (or the file's); without any, the
  forward alone, as a serving file's rows always did. A model entry takes the file's."""
  spec = _load(
    tmp_path,
    """
dtype: float8_e4m3fn
scales: block128
backends: [xla]
shapes:
  - {m: 64, k: 256, n: 128, g: 4}
  - {m: 64, k: 256, n: 128, g: 2, ops: [fwd, dlhs, drhs]}
  - {m: 64, k: 256, n: 128, g: 1, ops: {drhs: 1}}
""",
  )
  got = sorted((p.g, p.op) for p in shapes.expand(spec))
  assert got == [(1, "drhs"), (2, "dlhs"), (2, "drhs"), (2, "fwd"), (4, "fwd")]
  spec = _load(
    tmp_path,
    "ops: [fwd, dlhs, drhs]\nbackends: [xla]\nmodels:\n  - {model: deepseek-v3, tokens: [8], dtype: shipped}\n",
  )
  assert {(p.op, p.dtype) for p in shapes.expand(spec)} == {(op, "float8_e4m3fn:block128") for op in OPS}


def test_ceilings_of_a_format_time_its_element_dtype():
  from ragtune.device import ceilings

  got = ceilings.measure_ceilings(["float8_e4m3fn:block128"], "cpu")
  assert got["matmul_tflops"]["float8_e4m3fn:block128"] > 0


def test_hf_config_quantization_config(tmp_path):
  base = {"hidden_size": 7168, "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8}
  cases = {
    "dsv3": ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "float8_e4m3fn", "block128"),
    "maverick": ({"quant_method": "fbgemm_fp8"}, "float8_e4m3fn", "channelwise"),
    "mxfp4": ({"quant_method": "mxfp4"}, "bfloat16", None),
  }
  for name, (q, dtype, scales) in cases.items():
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**base, "quantization_config": q}))
    text = hf_config.shape_file(path, tokens=[16])
    assert "quantization_config: quant_method" in text.splitlines()[1]  # after from-config's mark
    spec = _load(tmp_path, text)
    assert (spec.dtype, spec.scales) == (dtype, scales)
    assert spec.ops == ["fwd"]  # quantized: forward only; bfloat16: the default
  # --dtype overrides the config, and a plain config keeps bfloat16.
  path = tmp_path / "dsv3.json"
  assert "scales" not in hf_config.shape_file(path, tokens=[16], dtype="bfloat16")
  (tmp_path / "plain.json").write_text(json.dumps(base))
  assert "dtype: bfloat16" in hf_config.shape_file(tmp_path / "plain.json", tokens=[16])
  (tmp_path / "null.json").write_text(json.dumps({**base, "quantization_config": None}))
  assert "dtype: bfloat16" in hf_config.shape_file(tmp_path / "null.json", tokens=[16])


FMT = "float8_e4m3fn:block128"
# The training format's three ops: fwd on quantized operands (as served), dlhs and drhs on
# bfloat16 ones that the op quantizes (kernels.ragged_dot.train_op); XLA's entries beside.
FP8_SMOKE = """
dtype: float8_e4m3fn
scales: block128
ops: [fwd, dlhs, drhs]
backends: [{backend}, xla]
max_candidates: 1
shapes:
  - {{m: 40, k: 200, n: 96, g: 3}}
"""


@pytest.mark.parametrize("backend", ["pallas_gpu", pytest.param("mosaic_gpu", marks=pytest.mark.mgpu_interpret)])
def test_fp8_pipeline_reaches_ragged_dot(tmp_path, backend):
  """Per-format LUT entries from a sweep to a model's call, on each backend that computes
  the format: pallas_gpu (Pallas interpret mode) and mosaic_gpu (jax's Mosaic GPU
  interpreter); fwd, dlhs and drhs of the training format, which a model's jax.grad through
  ragged_dot(quantize=) then runs with the LUT's configs."""
  unsupported = kernels.registry.get(backend).interpret_unsupported()
  if why := unsupported.get(f"fwd:{FMT}"):
    pytest.skip(why)
  spec = tmp_path / "fp8.yaml"
  spec.write_text(FP8_SMOKE.format(backend=backend))
  out = tmp_path / "results"
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  # The ops this jax's interpreter runs; a notice names the others.
  ops = [op for op in OPS if op not in unsupported]
  assert all(f"skipped 1 {backend} problem ({op} 1)" in r.output for op in unsupported if op in OPS), r.output
  rows = store.ResultsStore(out).rows()
  assert {r.problem.dtype for r in rows} == {FMT}
  assert {(r.problem.op, r.problem.backend) for r in rows} == {(op, "xla") for op in OPS} | {
    (op, backend) for op in ops
  }
  assert all(r.status == "ok" for r in rows), [r.error for r in rows]
  lut_file = tmp_path / "lut.json"
  r = runner.invoke(app, ["export-lut", str(out), "-o", str(lut_file)])
  assert r.exit_code == 0, r.output
  r = runner.invoke(app, ["verify", str(lut_file), "--op", ",".join(ops)])
  assert r.exit_code == 0 and " 0 failed" in r.output, r.output
  lut = kernels.Lut.from_file(lut_file)
  entries = {op: lut.query(op, 40, 200, 96, 3, FMT, backend=backend) for op in ops}
  assert all(e is not None and e.dtype == FMT and e.backend == backend for e in entries.values()), entries

  # A model's fp8 expert layer picks the tuned config up and matches the dequantized reference.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((40, 200), np.float32))
  w = jnp.asarray(rng.standard_normal((3, 200, 96), np.float32) / 14)
  lq, rq, ls, rs = quant.quantize_operands(x, w, FMT)
  gs = jnp.asarray([15, 0, 25], jnp.int32)
  with kernels.use_lut(lut):
    choice = kernels.explain(lq.shape, rq.shape, FMT, backend=backend)["fwd"]
    assert choice.source == "lut-exact" and choice.config == entries["fwd"].config
    out = kernels.ragged_dot(lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend=backend)
  value, squares = quant.reference_program(lq, rq, gs, ls, rs)()  # quant.reference and error_scale, run once
  ref = np.asarray(value)
  bound = quant.tolerance(FMT, 200, jnp.bfloat16).bound(ref, jnp.sqrt(squares))
  assert np.all(np.abs(np.asarray(out, np.float64) - ref) <= bound)
  if ops != list(OPS):
    return

  # Training in fp8 with the LUT: each op's config is its entry's, and the gradients are the
  # same recipe's as XLA computes it.
  x, w = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)

  def grads(name):
    loss = lambda a, b: jnp.sum(kernels.ragged_dot(a, b, gs, quantize=FMT, backend=name).astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=(0, 1))(x, w)

  with kernels.use_lut(lut):
    choices = resolve(None, backend, 40, 200, 96, 3, FMT)
    assert {op: (c.source, c.config) for op, c in choices.items() if op in ops} == {
      op: ("lut-exact", e.config) for op, e in entries.items()
    }
    got = grads(backend)
  for a, b in zip(got, grads("xla")):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)) and np.max(np.abs(a - b)) <= 0.05 * np.max(np.abs(b))


def test_training_gradients_are_judged_by_their_blocks():
  """A training format's dlhs and drhs are judged on the operands as train_op quantizes them,
  elementwise by quant.tolerance over their contraction: the kernel passes, and one that
  reads a group's token block from the neighbouring group, or drops a group's last token
  block, fails; so does a dlhs that takes another expert's weight scales."""
  p = Problem("drhs", "pallas_gpu", FMT, 300, 136, 128, 3, "explicit", (130, 0, 150))
  x = measure.make_inputs(p)
  assert x["lhs"].dtype == jnp.bfloat16 and "rhs" not in x and "lhs_scale" not in x
  ref = measure.reference("drhs", x, measure.out_dtype(p), p.dtype)
  blocks = quant.token_blocks(x["group_sizes"], p.m, None, p.g)
  a_t, a_s = quant.quantize_tokens(x["lhs"], blocks, "float8_e4m3fn")
  b_t, b_s = quant.quantize_tokens(x["dout"], blocks, "float8_e4m3fn")
  cfg = registry.default_config("pallas_gpu", "drhs", FMT, p.m, p.k, p.n, p.g)
  drhs = registry.get("pallas_gpu").grad_rhs_quantized

  def check(first, count):
    out = drhs(a_t, b_t, a_s, b_s, first, count, config=cfg, out_dtype=jnp.bfloat16, interpret=True)
    return measure.check(p, out, ref).passed

  assert check(blocks.first, blocks.count)
  assert list(blocks.count) == [2, 0, 2]
  assert not check(blocks.first.at[2].add(-1), blocks.count)  # group 2 starts in group 0's last block
  assert not check(blocks.first, blocks.count.at[2].add(-1))

  q = Problem("dlhs", "xla", FMT, 96, 136, 256, 3, "explicit", (40, 0, 56))
  y = measure.make_inputs(q)
  ref = measure.reference("dlhs", y, measure.out_dtype(q), q.dtype)
  assert measure.check(q, jax.jit(measure.build_op(q, "xla", None, False))(*measure.op_args("dlhs", y)), ref).passed
  dq, ds = quant.quantize(y["dout"], "float8_e4m3fn", (1, quant.BLOCK))
  rq, rs = quant.quantize_weights(y["rhs"], "float8_e4m3fn")
  kw = dict(backend="xla", out_dtype=jnp.bfloat16, transpose_rhs=True)
  wrong = forward(dq, rq, y["group_sizes"], lhs_scale=ds, rhs_scale=jnp.roll(rs, 1, 0).swapaxes(1, 2), **kw)
  assert not measure.check(q, wrong, ref).passed


def test_sass_names_the_mma_inputs():
  sass = """
        Function : fp8_wgmma
        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;
        /*0020*/                   EXIT ;
        Function : f16_mma
        /*0010*/                   HMMA.16816.F32 R36, R112, R34, R36 ;
        /*0020*/                   EXIT ;
        Function : bf16_wgmma
        /*0010*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8].tnspB, R24 ;
        /*0020*/                   EXIT ;
        Function : fp8_tcgen05
        /*0010*/                   UTCQMMA gdesc[UR10], gdesc[UR18], tmem[UR46], tmem[UR44], idesc[UR45], UPT ;
        /*0020*/                   EXIT ;
"""
  facts = machine_code.sass_facts(sass)
  assert facts["fp8_wgmma"].mma_inputs == "e4m3" and facts["fp8_wgmma"].hgmma_n == 128
  assert facts["fp8_wgmma"].counts == {"QGMMA": 1}
  assert facts["f16_mma"].mma_inputs == "f16"
  assert facts["bf16_wgmma"].mma_inputs == "bf16"
  assert facts["fp8_tcgen05"].mma_inputs == "f8f6f4" and facts["fp8_tcgen05"].counts == {"UTCQMMA": 1}


@needs_compiler(
  compiler_missing("h100") or (None if machine_code.find_tool("cuobjdump") else "no cuobjdump"),
  "deviceless compile tests",
)
@pytest.mark.parametrize(
  ("target", "backend", "fmt", "mma", "inputs"),
  [
    # jax's Triton lowering leaves tt.dot's max_num_imprecise_acc at 0, and Triton keeps an fp8
    # dot that must accumulate in full f32 off wgmma: it converts the fp8 values (exactly) to
    # f16 and runs mma.sync.
    ("h100", "pallas_gpu", "float8_e4m3fn:channelwise", "mma.sync", "f16"),
    ("h100", "pallas_gpu", "float8_e4m3fn:block128", "mma.sync", "f16"),
    ("h100", "mosaic_gpu", "float8_e4m3fn:channelwise", "wgmma", "e4m3"),  # QGMMA: fp8 wgmma
    ("h100", "mosaic_gpu", "float8_e4m3fn:block128", "wgmma", "e4m3"),  # and a step accumulator
    # Blackwell's tcgen05 accumulates fp8 in f32: Triton takes it (UTCQMMA, kind::f8f6f4).
    ("b200", "pallas_gpu", "float8_e4m3fn:block128", "tcgen05", "f8f6f4"),
  ],
)
def test_fp8_defaults_compile_clean(target, backend, fmt, mma, inputs):
  """The fp8 defaults build with no spill, on the MMAs they are known to use. mosaic_gpu's
  block128 default promotes each 256-deep step's first k block while the second block's wgmma
  runs: its loop waits for all but one wgmma, then issues FMAs (at least half of a 64x128
  share's 64 a thread) before the wait for all; the other kernels issue none under a wgmma."""
  from ragtune.deviceless import aot

  report = aot.compile_ragged_dot(target, 8192, 4096, 14336, 8, fmt, backend=backend)
  assert report.ok, f"{report.outcome}: {report.error}"
  (k,) = report.kernels
  assert k.spill_bytes == 0 and k.loop_spills == 0 and k.mma == mma and k.mma_inputs == inputs, k
  # ptxas's C7511 (wgmma serialized) and a setmaxnreg plan over the CTA's pool are what a GPU enforces.
  assert not k.serialized_wgmma and (k.setmaxnreg_demand or 0) <= (k.register_pool or 0), k
  if (backend, fmt) == ("mosaic_gpu", "float8_e4m3fn:block128"):
    assert k.loops_wait_one and k.fma_under_wgmma >= 32, k
  else:
    assert k.fma_under_wgmma == 0, k


@needs_compiler(
  compiler_missing("h100") or (None if machine_code.find_tool("cuobjdump") else "no cuobjdump"),
  "deviceless compile tests",
)
def test_fp8_training_compiles_for_h100():
  """jax.grad through ragged_dot(quantize=) on mosaic_gpu, built for an H100: the forward's
  and dlhs's gmm and drhs's tgmm, each on fp8 wgmma (QGMMA) with no spill; and `ragtune
  compile`'s per-op build (aot.compile_op: what a sweep times) of the training drhs."""
  from ragtune.deviceless import aot

  m, k, n, g = 4096, 7168, 2048, 32  # DeepSeek-V3 up's k and n
  report = aot.compile_ragged_dot("h100", m, k, n, g, FMT, backend="mosaic_gpu", train=True)
  assert report.ok, f"{report.outcome}: {report.error}"
  mmas = [kern for kern in report.kernels if kern.mma != "none"]  # not the quantizers' kernels, where the op has them
  assert len(mmas) == 3 and sum("tgmm" in kern.name for kern in mmas) == 1, report.kernels
  assert all(kern.mma == "wgmma" and kern.mma_inputs == "e4m3" for kern in mmas), mmas
  assert all(kern.spill_bytes == 0 for kern in report.kernels), report.kernels
  cfg = registry.default_config("mosaic_gpu", "drhs", FMT, m, k, n, g, device_kind=aot.device_kind("h100"))
  (kern,) = [
    kern for kern in aot.compile_op("h100", "mosaic_gpu", "drhs", FMT, m, k, n, g, cfg).kernels if kern.mma != "none"
  ]
  assert "tgmm" in kern.name and kern.mma_inputs == "e4m3" and kern.spill_bytes == 0, kern


TPU_SMOKE = """dtype: int8
scales: block128
ops: [fwd]
backends: [pallas_tpu]
max_candidates: 2
shapes:
  - {m: 40, k: 200, n: 136, g: 3, group_sizes: [15, 0, 25]}
  - {m: 40, k: 200, n: 136, g: 3, dtype: float8_e4m3fn, scales: channelwise, group_sizes: [15, 0, 25]}
"""


def test_tpu_quantized_pipeline_reaches_ragged_dot(tmp_path):
  """pallas_tpu's int8 and fp8 gmm (interpreted) from a sweep to a model's call: per-format
  LUT entries, verified, taken by kernels.ragged_dot; megablox's LutFn keeps to plain entries."""
  spec = tmp_path / "q.yaml"
  spec.write_text(TPU_SMOKE)
  out = tmp_path / "results"
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  rows = store.ResultsStore(out).rows()
  assert {(r.problem.dtype, r.problem.backend) for r in rows} >= {
    ("int8:block128", "pallas_tpu"),
    ("float8_e4m3fn:channelwise", "pallas_tpu"),
  }
  assert all(r.status == "ok" for r in rows), [r.error for r in rows]
  lut_file = tmp_path / "lut.json"
  assert runner.invoke(app, ["export-lut", str(out), "-o", str(lut_file)]).exit_code == 0
  r = runner.invoke(app, ["verify", str(lut_file)])
  assert r.exit_code == 0 and " 0 failed" in r.output, r.output
  lut = kernels.Lut.from_file(lut_file)
  assert lut.lut_fn()(40, 200, 136) is None  # no bf16 entry: megablox gets none of these tilings
  rng = np.random.default_rng()
  x = jnp.asarray(rng.standard_normal((40, 200), np.float32))
  w = jnp.asarray(rng.standard_normal((3, 200, 136), np.float32) / 14)
  gs = jnp.asarray([15, 0, 25], jnp.int32)
  for fmt in ("int8:block128", "float8_e4m3fn:channelwise"):
    entry = lut.query("fwd", 40, 200, 136, 3, fmt, backend="pallas_tpu")
    assert entry is not None and entry.dtype == fmt
    lq, rq, ls, rs = quant.quantize_operands(x, w, fmt)
    with kernels.use_lut(lut):
      choice = kernels.explain(lq.shape, rq.shape, fmt, backend="pallas_tpu")["fwd"]
      assert choice.source == "lut-exact" and choice.config == entry.config
      got = kernels.ragged_dot(lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend="pallas_tpu")
    value, squares = quant.reference_program(lq, rq, gs, ls, rs)()
    bound = quant.tolerance(fmt, 200, jnp.bfloat16).bound(np.asarray(value), jnp.sqrt(squares))
    assert np.all(np.abs(np.asarray(got, np.float64) - np.asarray(value)) <= bound), fmt
