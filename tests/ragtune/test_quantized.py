"""Quantized experts through ragtune: shape files, a Hugging Face config's
quantization_config, the whole pipeline on a CPU (sweep -> verify -> export-lut -> a model
calling kernels.ragged_dot with the LUT), and the fp8 kernels compiled for an H100."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiler_missing, needs_compiler
from typer.testing import CliRunner

import kernels
from kernels import quant
from ragtune.cli.app import app
from ragtune.deviceless import machine_code
from ragtune.errors import RagtuneError
from ragtune.problems import hf_config, shapes
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
      r"q.yaml:3: ops: float8_e4m3fn:channelwise operands are tuned forward only",
    ),
    (
      "shapes:\n  - {m: 8, k: 8, n: 8, g: 1, scales: block128}\n",
      r"q.yaml:2: shapes\[0\].scales: scales apply to float8_e4m3fn or int8 operands, not bfloat16",
    ),
    ("models:\n  - {model: mixtral-8x7b, tokens: [8], dtype: shipped, scales: block128}\n", r"models\[0\].scales"),
    (
      "dtype: int8\nscales: channelwise\nbackends: [pallas_gpu]\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n",
      r"q.yaml:5: shapes\[0\]: int8:channelwise is computed by xla; backends lists pallas_gpu",
    ),
  ],
)
def test_shape_file_format_errors_name_the_key_and_line(tmp_path, text, message):
  with pytest.raises(RagtuneError, match=message):
    _load(tmp_path, text)


def test_ops_and_backends_a_format_lacks_are_left_out_with_a_reason(tmp_path):
  spec = _load(tmp_path, "dtype: float8_e4m3fn\nscales: block128\nshapes:\n  - {m: 8, k: 8, n: 8, g: 1}\n")
  skipped = []
  problems = shapes.expand(spec, ops=["fwd", "dlhs"], backends=["pallas_gpu", "mosaic_blackwell"], skipped=skipped)
  assert [(p.op, p.backend) for p in problems] == [("fwd", "pallas_gpu")]
  assert {why for *_, why in skipped} == {
    "quantized operands are forward only",
    "mosaic_blackwell computes no float8_e4m3fn:block128",
  }


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


FP8_SMOKE = """
dtype: float8_e4m3fn
scales: block128
ops: [fwd]
backends: [{backend}]
max_candidates: 1
shapes:
  - {{m: 40, k: 200, n: 96, g: 3}}
"""


@pytest.mark.parametrize("backend", ["pallas_gpu", pytest.param("mosaic_gpu", marks=pytest.mark.mgpu_interpret)])
def test_fp8_pipeline_reaches_ragged_dot(tmp_path, backend):
  """Per-format LUT entries from a sweep to a model's call, on each backend that computes
  the format: pallas_gpu (Pallas interpret mode) and mosaic_gpu (jax's Mosaic GPU interpreter)."""
  if why := kernels.registry.get(backend).interpret_unsupported().get("fwd:float8_e4m3fn:block128"):
    pytest.skip(why)
  spec = tmp_path / "fp8.yaml"
  spec.write_text(FP8_SMOKE.format(backend=backend))
  out = tmp_path / "results"
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
  assert r.exit_code == 0, r.output
  rows = store.ResultsStore(out).rows()
  assert {r.problem.dtype for r in rows} == {"float8_e4m3fn:block128"}
  assert all(r.status == "ok" for r in rows), [r.error for r in rows]
  lut_file = tmp_path / "lut.json"
  r = runner.invoke(app, ["export-lut", str(out), "-o", str(lut_file)])
  assert r.exit_code == 0, r.output
  r = runner.invoke(app, ["verify", str(lut_file)])
  assert r.exit_code == 0 and " 0 failed" in r.output, r.output
  lut = kernels.Lut.from_file(lut_file)
  entry = lut.query("fwd", 40, 200, 96, 3, "float8_e4m3fn:block128", backend=backend)
  assert entry is not None and entry.dtype == "float8_e4m3fn:block128" and entry.backend == backend

  # A model's fp8 expert layer picks the tuned config up and matches the dequantized reference.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((40, 200), np.float32))
  w = jnp.asarray(rng.standard_normal((3, 200, 96), np.float32) / 14)
  lq, rq, ls, rs = quant.quantize_operands(x, w, "float8_e4m3fn:block128")
  gs = jnp.asarray([15, 0, 25], jnp.int32)
  with kernels.use_lut(lut):
    choice = kernels.explain(lq.shape, rq.shape, "float8_e4m3fn:block128", backend=backend)["fwd"]
    assert choice.source == "lut-exact" and choice.config == entry.config
    out = kernels.ragged_dot(lq, rq, gs, lhs_scale=ls, rhs_scale=rs, backend=backend)
  value, squares = quant.reference_program(lq, rq, gs, ls, rs)()  # quant.reference and error_scale, run once
  ref = np.asarray(value)
  bound = quant.tolerance("float8_e4m3fn:block128", 200, jnp.bfloat16).bound(ref, jnp.sqrt(squares))
  assert np.all(np.abs(np.asarray(out, np.float64) - ref) <= bound)


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
