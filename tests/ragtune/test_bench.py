"""`ragtune bench` on a CPU host: every variant checked, none timed; the timed path (tune-jax reads
CPU profiler events too) with a failing variant; tokamax's column; the CSV; bad input; which way
XLA compiled lax.ragged_dot, read from compiled HLO (a deviceless H100 compile where the compiler
is here). And benchmarks/bench_ragged_dot.py, which times the Pallas kernel interpreted and labelled."""

import csv
import dataclasses
import importlib.metadata
import importlib.util
import json
import signal
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiler_missing
from typer.testing import CliRunner

import kernels
from ragtune.cli.app import app
from ragtune.device import measure, xla_fit
from ragtune.deviceless import aot
from ragtune.lut import bench
from ragtune.problems import shapes
from ragtune.problems.shapes import GroupDist, Problem
from ragtune.run import estimate

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU host's behaviour")
TINY = "name: tiny\nops: [fwd]\nshapes:\n  - {m: 64, k: 32, n: 48, g: 4}\n"
TOKAMAX, TOKAMAX_WHY = bench.import_tokamax()
NO_H100_COMPILE = compiler_missing("h100")  # the gpu-compile extra's deviceless compiler


@pytest.fixture(autouse=True)
def _idle_host_calibration(monkeypatch):
  """Which problems a CPU host benches as they are follows the interpreter's speed here
  (bench.cpu_sized); pin it at an idle 2-core host's, so a busy host (a calibration measured
  beside other tests) does not change what these tests see."""
  idle = estimate.Calibration(
    step_s=1.4e-7, compile_s=0.9, matmul_flops=6e10, host="test", jax_version=jax.__version__, measured="pinned"
  )
  monkeypatch.setattr(estimate, "calibration", lambda: idle)


def _cpu_lut(path: Path, **changes) -> dict:
  """A LUT for this host whose pallas_gpu fwd entry at TINY's shape differs from the default."""
  m, k, n, g = 64, 32, 48, 4
  default = kernels.registry.default_config("pallas_gpu", "fwd", "bfloat16", m, k, n, g, device_kind="cpu")
  tuned = dataclasses.replace(default, **changes)
  lut = kernels.Lut("cpu", [kernels.Entry("fwd", "pallas_gpu", "bfloat16", m, k, n, g, tuned)])
  path.mkdir(parents=True, exist_ok=True)
  (path / "cpu.json").write_text(json.dumps(lut.to_dict()))
  return tuned.to_dict()


def _wrong_pallas(build):
  """measure.build_op, but pallas_gpu's op returns ones (a broken kernel, cheap to compile)."""

  def build_op(p, backend, config, interpret):
    if backend == "pallas_gpu":
      return lambda a, b, gs: jnp.ones((a.shape[0], b.shape[2]), a.dtype)
    return build(p, backend, config, interpret)

  return build_op


def test_cpu_run_checks_every_variant_times_none_and_writes_the_csv_beside_the_lut(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.yaml").write_text(TINY)
  tuned = _cpu_lut(tmp_path / "luts", block_m=16, num_warps=2)
  r = runner.invoke(app, ["bench", "tiny.yaml", "--lut", "luts"])
  assert r.exit_code == 0, r.output
  assert "device: cpu (cpu), jax " in r.output and f"LUT: {Path('luts/cpu.json')}" in r.output
  assert "none is timed" in r.output and "TF/s" not in r.output
  assert 'backend="auto" runs XLA\'s op here and reads no LUT' in r.output, "the LUT row is not auto's"
  rows = list(csv.DictReader((tmp_path / "luts" / "bench-tiny.csv").open()))
  assert not (tmp_path / "results").exists(), "the CSV goes beside the LUT"
  expected = ["LUT with backend=pallas_gpu (exact)", "pallas_gpu default [interpret]", bench.XLA]
  assert [row["variant"] for row in rows] == expected + [bench.TOKAMAX] * (TOKAMAX is not None) + [bench.DENSE]
  assert all(row["status"] == "ok" and row["shape"] == "[64,32]x[4,32,48]" for row in rows), rows  # not shrunk
  assert all(row[c] == "" for row in rows for c in ("ms", "tflops", "vs_peer", "timer")), "nothing is timed"
  assert all(0 < float(row["rel_error"]) < 0.02 for row in rows if row["variant"] != bench.DENSE)
  xla = next(row for row in rows if row["variant"] == bench.XLA)
  assert xla["config"] == f"path: {xla_fit.XLA_PATHS['dense']}", "jax expands ragged_dot itself on a CPU"
  assert (
    rows[0]["config"] != rows[1]["config"] and "block_m=16" in rows[0]["config"] and "num_warps=2" in rows[0]["config"]
  )
  assert tuned["block_m"] == 16


def test_a_failing_variant_is_reported_and_never_timed_the_rest_are_timed_together(tmp_path, monkeypatch):
  monkeypatch.setattr(measure, "build_op", _wrong_pallas(measure.build_op))
  sizes = tuple(int(s) for s in GroupDist().draw(64, 4))
  p = Problem("fwd", "pallas_gpu", "bfloat16", 64, 32, 48, 4, "multinomial(seed=0)", sizes, "t")
  run = bench.Bench("cpu", True, ("pallas_gpu",), None, TOKAMAX, TOKAMAX_WHY, {"bfloat16": 0.5}, 20.0, 3)
  rows = {r.variant: r for r in bench.bench_problem(p, run)}
  broken = rows["pallas_gpu default [interpret]"]
  assert broken.status.startswith("wrong: FAIL") and broken.failed and broken.ms is None and broken.rel_error > 0.5
  timed = [r for r in rows.values() if r.ms is not None]
  assert {r.variant for r in timed} == set(rows) - {broken.variant}
  assert {r.timer for r in timed} == {"tune-jax(samples=3)"}, "one timer run for all"
  xla = rows[bench.XLA]
  assert xla.vs_xla == 1.0 and xla.tflops == pytest.approx(measure.flops(p) / xla.ms * 1e-9)
  assert xla.pct_matmul_peak == pytest.approx(100 * xla.tflops / 0.5)
  best = min((r for r in timed if r.variant in bench.PEERS), key=lambda r: r.ms)
  assert {r.peer for r in timed} == {bench.PEERS[best.variant]} and best.vs_peer == 1.0
  lut = next(r for r in rows.values() if r.variant.startswith("LUT: "))  # auto on a CPU runs XLA
  assert lut.variant == "LUT: xla (no entry)" and lut.ms == xla.ms and lut.same_as == bench.XLA
  # The command says so and exits 1; on a CPU host nothing is timed either way.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.yaml").write_text(TINY)
  r = runner.invoke(app, ["bench", "tiny.yaml", "--csv", "out.csv"])
  assert r.exit_code == 1 and "wrong: FAIL" in r.output and "1 variant failed the check" in r.output
  assert (tmp_path / "out.csv").is_file() and not (tmp_path / "results").exists()


@pytest.mark.skipif(TOKAMAX is None, reason=f"tokamax: {TOKAMAX_WHY}")
@pytest.mark.parametrize("op", kernels.common.OPS)
def test_tokamax_column_matches_lax_for_each_op(op):
  """tokamax's XLA implementation, called with the dimension numbers of tokamax's own vjp."""
  p = Problem(op, "pallas_gpu", "float32", 40, 24, 32, 3, "explicit", (10, 0, 25))
  x = measure.make_inputs(p)
  got = jax.jit(bench.tokamax_op(TOKAMAX, op, device=False))(*measure.op_args(op, x))
  np.testing.assert_allclose(np.asarray(got), measure.reference(op, x).value, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(TOKAMAX is None, reason=f"tokamax: {TOKAMAX_WHY}")
def test_an_absent_tokamax_implementation_is_named_with_its_reason(monkeypatch):
  """tokamax registers an implementation only when its module imports; the name is then
  unknown to it. Here "triton" is taken out, and jax_triton made unimportable."""
  from tokamax._src.ops.ragged_dot import api

  assert bench.tokamax_missing("mosaic_gpu") is None and bench.tokamax_missing("xla") is None
  monkeypatch.setattr(api, "IMPLEMENTATIONS", {k: v for k, v in api.IMPLEMENTATIONS.items() if k != "triton"})
  monkeypatch.setitem(sys.modules, "jax_triton", None)
  monkeypatch.delitem(sys.modules, "tokamax._src.ops.ragged_dot.triton", raising=False)
  why = bench.tokamax_missing("triton")
  assert why.startswith(f"tokamax {importlib.metadata.version('tokamax')} has no 'triton' ragged_dot here"), why
  if importlib.util.find_spec("tokamax._src.ops.ragged_dot.triton"):  # 0.0.15+: native Triton
    assert "triton.py fails to import" in why and "jax_triton" in why, why
  assert why in bench.tokamax_gpu_note() and "GPU ragged_dot: mosaic_gpu;" in bench.tokamax_gpu_note()


# XLA's own text of the lax.ragged_dot fwd of dsv3-decode ([512,7168]x[256,7168,2048]) compiled
# deviceless for H100 by jaxlib 0.12.0.1 with --xla_gpu_experimental_use_ragged_dot_fusion and a
# target that says cuDNN 9.22 (gpu_device_info.dnn_version), as dumped (xla_dump_hlo_pass_re)
# before and after XLA's ragged-dot passes; metadata and shardings left out. The compile goes no
# further here: XLA aborts on a ragged-dot in a loop fusion once its cuDNN fusion is not built.
BEFORE_REWRITE = """
ENTRY %main.1 (a.1: bf16[512,7168], b.1: bf16[256,7168,2048], gs.1: s32[256]) -> bf16[512,2048] {
  %a.1 = bf16[512,7168]{1,0} parameter(0)
  %b.1 = bf16[256,7168,2048]{2,1,0} parameter(1)
  %gs.1 = s32[256]{0} parameter(2)
  ROOT %ragged_dot_general.1 = bf16[512,2048]{1,0} ragged-dot(%a.1, %b.1, %gs.1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
}
"""  # noqa: E501
CUDNN_FUSION = """
%add (lhs: s32[], rhs: s32[]) -> s32[] {
  %lhs = s32[] parameter(0)
  %rhs = s32[] parameter(1)
  ROOT %add = s32[] add(%lhs, %rhs)
}

%ragged_dot_fusion_ragged_dot_general.1.0_computation (a.0: bf16[512,7168], b.0: bf16[256,7168,2048], subtract.1: s32[256]) -> bf16[512,2048] {
  %a.0 = bf16[512,7168]{1,0} parameter(0)
  %b.0 = bf16[256,7168,2048]{2,1,0} parameter(1)
  %subtract.1 = s32[256]{0} parameter(2)
  ROOT %ragged_dot_general.1.1 = bf16[512,2048]{1,0} ragged-dot(%a.0, %b.0, %subtract.1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
}

ENTRY %main.1 (a.1: bf16[512,7168], b.1: bf16[256,7168,2048], gs.1: s32[256]) -> bf16[512,2048] {
  %a.1 = bf16[512,7168]{1,0} parameter(0)
  %b.1 = bf16[256,7168,2048]{2,1,0} parameter(1)
  %gs.1 = s32[256]{0} parameter(2)
  %constant = s32[] constant(0)
  %reduce-window = s32[256]{0} reduce-window(%gs.1, %constant), window={size=256 pad=255_0}, to_apply=%add
  %subtract = s32[256]{0} subtract(%reduce-window, %gs.1)
  ROOT %fusion = bf16[512,2048]{1,0} fusion(%a.1, %b.1, %subtract), kind=kCustom, calls=%ragged_dot_fusion_ragged_dot_general.1.0_computation, backend_config={"device_type":"DEVICE_TYPE_INVALID","force_earliest_schedule":false,"fusion_backend_config":{"kind":"__cudnn$fusion"},"operation_queue_id":"0","reification_cost":[]}
}
"""  # noqa: E501


def test_xla_path_tells_cudnn_from_a_kept_ragged_dot_and_from_the_dense_fallback():
  assert xla_fit.xla_path(CUDNN_FUSION) == "cudnn"
  assert xla_fit.xla_path(BEFORE_REWRITE) == "ragged_dot"
  # ROCm's form, made from the text above: the custom call openxla/xla#43210 names.
  call = 'custom-call(%a.1, %b.1, %gs.1), custom_call_target="__cublas$lt$groupedMatmul"'
  grouped = BEFORE_REWRITE.replace("ragged-dot(%a.1, %b.1, %gs.1)", call)
  assert xla_fit.xla_path(grouped) == "grouped_gemm"
  assert xla_fit.xla_path("HloModule empty") == "unknown"
  cpu = jax.jit(lambda a, b, gs: jax.lax.ragged_dot(a, b, gs))
  args = (jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5], jnp.int32))
  assert xla_fit.xla_path(cpu.lower(*args).compile().as_text()) == "dense"  # jax's own expansion on a CPU


@pytest.mark.skipif(NO_H100_COMPILE is not None, reason=str(NO_H100_COMPILE))
@pytest.mark.parametrize("fusion_flag", [None, True])
def test_xla_path_of_a_deviceless_h100_compile_is_the_dense_fallback(fusion_flag):
  """lax.ragged_dot compiled for an H100 from this host: XLA expands it to one dense dot. With
  --xla_gpu_experimental_use_ragged_dot_fusion too: the cuDNN path also needs cuDNN >= 9.22
  (openxla/xla, ragged_dot_rewriter.h), which a compile-only target does not have here."""
  p = Problem("fwd", "pallas_gpu", "bfloat16", 512, 7168, 2048, 256, "explicit", (2,) * 256)
  fn = measure.build_op(p, kernels.registry.REFERENCE, None, False)
  mesh, _ = aot.target_mesh("h100")
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = [
    jax.ShapeDtypeStruct(s, d, sharding=sharded) for s, d in aot.op_arg_shapes("fwd", 512, 7168, 2048, 256, p.dtype)
  ]
  options = {} if fusion_flag is None else {"xla_gpu_experimental_use_ragged_dot_fusion": fusion_flag}
  with jax.set_mesh(mesh):
    hlo = jax.jit(fn).lower(*args).compile(compiler_options=options).as_text()
  assert xla_fit.xla_path(hlo) == "dense", hlo[:2000]
  assert "bf16[512,256,7168]" in hlo, "the lhs masked and broadcast over all 256 groups"


def test_one_problem_per_op_and_shape_and_big_ones_shrink_on_a_cpu_host():
  problems = shapes.expand(shapes.load_shape_set(ROOT / "shapes" / "anchors.yaml"))
  assert len(problems) == 36  # 4 shapes x 3 ops x 3 backends
  on_gpu = bench.bench_problems(problems, device=True)
  assert len(on_gpu) == 12 and {(p.m, p.k, p.n, p.g) for p in on_gpu} == {(p.m, p.k, p.n, p.g) for p in problems}
  on_cpu = bench.bench_problems(problems, device=False)  # too big for the interpreter: shrunk
  assert {(p.m, p.k, p.n, p.g) for p in on_cpu} == {
    (32, 128, 448, 8),
    (32, 224, 64, 8),
    (512, 224, 64, 8),
    (512, 64, 224, 8),
  }
  assert all(sum(p.group_sizes) == p.m and len(p.group_sizes) == p.g for p in on_cpu)
  smoke = shapes.expand(shapes.load_shape_set(ROOT / "shapes" / "smoke.yaml"))
  assert bench.bench_problems(smoke, device=False) == smoke  # a LUT tuned on them applies exactly


def test_a_shape_listed_for_several_backends_is_benched_once_on_a_cpu_host():
  """A CPU host benches one interpreted backend; the Mosaic GPU interpreter's cost of a shape
  does not shrink a second copy of it (benchmarks/gpu_run.py's small problem ran twice)."""
  spec = shapes.ShapeSet.model_validate(
    {"ops": ["fwd"], "backends": ["pallas_gpu", "mosaic_gpu"], "shapes": [{"m": 96, "k": 64, "n": 80, "g": 4}]}
  )
  problems = shapes.expand(spec)
  assert len(problems) == 2
  (p,) = bench.bench_problems(problems, device=False)
  assert (p.m, p.k, p.n, p.g) == (96, 64, 80, 4)


def test_default_csv_is_beside_the_lut_but_never_in_the_kernels_package(tmp_path):
  results = Path("results/cpu")
  assert bench.default_csv(tmp_path / "cpu.json", results, "moe") == tmp_path / "bench-moe.csv"
  assert bench.default_csv(None, results, "moe") == results / "bench-moe.csv"
  bundled = kernels.lut.BUNDLED_DIR / "cpu.json"
  assert bench.default_csv(bundled, results, "moe") == results / "bench-moe.csv"


def _one_error_line(result) -> str:
  lines = [l for l in result.output.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and result.exit_code == 2, result.output
  return lines[0]


def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.yaml").write_text(TINY)
  other = kernels.Lut("NVIDIA H100 80GB HBM3", [])
  (tmp_path / "h100.json").write_text(json.dumps(other.to_dict()))
  (tmp_path / "adir").mkdir()
  before = sorted(p.name for p in tmp_path.iterdir())
  line = _one_error_line(runner.invoke(app, ["bench", "tiny.yaml", "--lut", "h100.json"]))
  assert line == "error: h100.json: LUT was tuned on 'NVIDIA H100 80GB HBM3' but this device is 'cpu'"
  line = _one_error_line(runner.invoke(app, ["bench", "tiny.yaml", "--lut", "adir"]))
  assert "adir: no LUT for device 'cpu' (looked for cpu.json" in line
  line = _one_error_line(runner.invoke(app, ["bench", "tiny.yaml", "--csv", "adir"]))
  assert line == "error: adir: is a folder, but the --csv file must be a file"
  line = _one_error_line(runner.invoke(app, ["bench", "tiny.yaml", "--model", "gpt-5"]))
  assert "--model gpt-5: unknown model" in line
  assert sorted(p.name for p in tmp_path.iterdir()) == before and not list((tmp_path / "adir").iterdir())


def test_bench_ragged_dot_times_pallas_interpret_beside_xla(capsys):
  spec = importlib.util.spec_from_file_location("bench_ragged_dot", ROOT / "benchmarks" / "bench_ragged_dot.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  script.main(
    ["--m", "48", "--k", "32", "--n", "32", "--g", "2", "--dtype", "float32", "--warmup", "1", "--iters", "2"]
  )
  out = capsys.readouterr().out
  rows = {line.split("  ")[0].strip() for line in out.splitlines()[-3:]}
  assert rows == {
    "pallas_gpu [INTERPRET mode, CPU emulation: not GPU/TPU speed]",
    "xla ragged_dot",
    "dense matmul, same FLOPs",
  }, out
  assert "NOTE: no pallas_gpu hardware here" in out and "check vs lax: PASS" in out
  marker = " (deprecated upstream)" if kernels.registry.get("pallas_gpu").deprecated() else ""
  assert f"config: fwd: pallas_gpu{marker} TritonConfig(" in out and "<- heuristic" in out


def test_a_quantized_problem_has_a_bf16_row_of_the_same_shape(tmp_path, monkeypatch):
  """Beside the fp8 kernels, XLA's dequantized path, tokamax and dense: our bf16 kernel on
  the same values, unscaled, so unchecked against the quantized reference, and run; for the
  training format's fwd, dlhs and drhs alike."""
  monkeypatch.chdir(tmp_path)
  spec = "dtype: float8_e4m3fn\nscales: block128\nops: [fwd, dlhs, drhs]\nshapes:\n  - {m: 40, k: 256, n: 128, g: 2}\n"
  (tmp_path / "q.yaml").write_text(spec)
  r = runner.invoke(app, ["bench", "q.yaml", "--csv", "b.csv"])
  assert r.exit_code == 0, r.output
  by_op = {}
  for row in csv.DictReader((tmp_path / "b.csv").open()):
    by_op.setdefault(row["op"], {})[row["variant"]] = row
  assert set(by_op) == {"fwd", "dlhs", "drhs"}
  for op, rows in by_op.items():
    bf16 = rows[bench.BF16]
    assert bf16["status"] == "ok" and bf16["rel_error"] == "" and bf16["config"].startswith("pallas_gpu: block_m="), op
    assert bf16["dtype"] == rows[bench.XLA]["dtype"] == "float8_e4m3fn:block128"
    assert float(rows[bench.XLA]["rel_error"]) < 0.02, op


@pytest.mark.parametrize("stopped_in", [1, 2])
def test_sigterm_stops_with_one_line_and_the_csv_of_the_finished_problems(tmp_path, monkeypatch, stopped_in):
  """A batch scheduler's SIGTERM: exit 143 (130 is Ctrl-C's), the line says where the rows so far
  are, or that there are none; the CSV holds every finished problem's rows, and is never partial."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "two.yaml").write_text(TINY + "  - {m: 64, k: 32, n: 40, g: 4}\n")
  calls = []

  def bench_problem(p, b):
    calls.append(p)
    if len(calls) == stopped_in:
      signal.raise_signal(signal.SIGTERM)
    return [bench.Row(p.source, p.shape_label, p.op, p.dtype, "variant", rel_error=0.001)]

  monkeypatch.setattr(bench, "bench_problem", bench_problem)
  r = runner.invoke(app, ["bench", "two.yaml", "--csv", "out.csv"])
  assert r.exit_code == 143, r.output
  last = r.output.strip().splitlines()[-1]
  if stopped_in == 1:
    assert last == "interrupted: no problem finished; no CSV written" and not (tmp_path / "out.csv").exists()
  else:
    assert last == "interrupted: the rows so far are in out.csv", r.output
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert [(row["shape"], row["variant"]) for row in rows] == [("[64,32]x[4,32,48]", "variant")]
  assert "Traceback" not in r.output
