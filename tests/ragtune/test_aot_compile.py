"""The GPU kernels compiled by XLA's real GPU compiler, deviceless, on this CPU host.

ragtune.deviceless.aot compiles for a named GPU (its facts in kernels/gpu_facts/) all the way to machine
code: Triton and Mosaic GPU lowering, LLVM and ptxas. These tests read the cubins:
registers, spills, shared memory, and which instructions the kernels are built from. They
say nothing of speed or of runtime races; see test_gpu_compiled.py for a real GPU.

Needs the `gpu-compile` extra and JAX_PLATFORMS=cpu (conftest.py sets it on a host with no
NVIDIA device). Skipped where either is missing, except under CI, where that is a failure.
"""

import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import gpu_compile_missing, needs_compiler

import kernels
from kernels.common import gpu_smem_limit
from ragtune import provenance
from ragtune.candidates import search_space
from ragtune.deviceless import aot, machine_code
from ragtune.problems.shapes import Problem

H100 = "NVIDIA H100 80GB HBM3"
B200 = "NVIDIA B200"
BF16 = "bfloat16"


_UNAVAILABLE = gpu_compile_missing()
pytestmark = needs_compiler(_UNAVAILABLE, "deviceless compile tests")

# shapes/anchors.yaml's problems (Mixtral 8x7B prefill; DeepSeek-V3 decode, prefill up and
# down) and a ragged shape no block divides.
ANCHORS = {
  "mixtral": (8192, 4096, 14336, 8),
  "dsv3_decode": (512, 7168, 2048, 256),
  "dsv3_up": (131072, 7168, 2048, 256),
  "dsv3_down": (131072, 2048, 7168, 256),
  "ragged": (1000, 1000, 1000, 8),
}
# Odd shapes where defaults spilled on jax 0.10.2: dlhs at [1000,520]x[3,520,776] (mosaic_gpu,
# a k loop of a count ptxas knew), and rows not 16 bytes apart (pallas_gpu, no cp.async: k 333
# and n 555). The defaults' tests take them in place of "ragged" (1000 no block divides either,
# which built clean before).
ODD = {"odd_520_776": (1000, 520, 776, 3), "odd_333_555": (777, 333, 555, 5)}
SHAPES = {**{a: s for a, s in ANCHORS.items() if a != "ragged"}, **ODD}
GPU_BACKENDS = ("pallas_gpu", "mosaic_gpu")


H100_SMEM = gpu_smem_limit(H100)


def _assert_clean(report, *, smem_limit=H100_SMEM, mma="wgmma", kernels_expected=None):
  assert report.ok, f"{report.outcome}: {report.error}"
  assert report.kernels, "no ragtune kernel found in the machine code"
  if kernels_expected is not None:
    assert len(report.kernels) == kernels_expected, [k.name for k in report.kernels]
  for k in report.kernels:
    assert k.spill_bytes == 0 and k.stack_bytes == 0, k
    assert k.smem_bytes is not None and 0 < k.smem_bytes <= smem_limit, k
    assert k.mma == mma, k
    assert not k.serialized_wgmma, k


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("anchor", list(SHAPES))
def test_h100_defaults_compile_clean_fwd_and_vjp(anchor, backend):
  """kernels.ragged_dot as a model calls it, forward and vjp, with the H100 defaults:
  three kernels, no spills, within shared memory, wgmma; TMA for Mosaic GPU (its wrapper pads),
  cp.async for Triton where the operands' rows are 16 bytes apart (else plain loads)."""
  m, k, n, g = SHAPES[anchor]
  report = aot.compile_ragged_dot("h100", m, k, n, g, BF16, backend=backend)
  _assert_clean(report, kernels_expected=3)
  rows_16_bytes_apart = all(d * kernels.common.itemsize(BF16) % 16 == 0 for d in (k, n))
  copy = "tma" if backend == "mosaic_gpu" else "cp.async" if rows_16_bytes_apart else "ld/st"
  assert all(kr.copy == copy for kr in report.kernels), report.kernels
  if backend == "mosaic_gpu":
    _assert_warp_specialized(report)


def _assert_warp_specialized(report):
  """Mosaic GPU v2: a producer warpgroup gives registers to two consumers (setmaxnreg) within
  the pool of its 3 x 128 threads, wgmma at least 128 wide, one wgmma left in flight in the
  loop and no local memory in it."""
  for kr in report.kernels:
    assert kr.setmaxnreg and kr.hgmma_n >= 128 and kr.loops_wait_one and not kr.loop_spills, kr
    assert kr.threads == 384 and kr.setmaxnreg_demand <= kr.register_pool, kr


def test_h200_mosaic_defaults_compile_warp_specialized():
  m, k, n, g = ANCHORS["mixtral"]
  report = aot.compile_ragged_dot("h200", m, k, n, g, BF16, backend="mosaic_gpu")
  _assert_clean(report, kernels_expected=3)
  _assert_warp_specialized(report)


def _drawn_configs(backend: str, count: int, seed: str):
  """A draw of (problem, config) from the backend's H100 search space, fixed by `seed`, spread
  over the anchor problems and the three ops."""
  rng = random.Random(f"{seed}|{backend}")
  out = []
  for i in range(count):
    anchor = list(ANCHORS)[i % len(ANCHORS)]
    op = kernels.common.OPS[(i // len(ANCHORS)) % 3]
    m, k, n, g = ANCHORS[anchor]
    p = Problem(op, backend, BF16, m, k, n, g, "explicit", (m,) + (0,) * (g - 1))
    space = search_space.candidates(p, device_kind=H100)
    out.append((p, rng.choice(space)))
  return out


# 8 a backend (the first 8 of the 20 drawn before CI ran two stacks, then 12 before it ran
# three GPU backends' deviceless builds), in chunks so that pytest-xdist spreads the compiles
# over the cores.
DRAWS, CHUNKS, SEED = 8, 4, "0"


@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_h100_search_space_draws_compile_clean(backend, chunk):
  """Whatever the search space offers the tuner compiles: 8 drawn configs per backend,
  no compile error, no overflow, no spill, no serialized wgmma."""
  bad = []
  for p, cfg in _drawn_configs(backend, DRAWS, SEED)[chunk::CHUNKS]:
    r = aot.compile_op("h100", backend, p.op, p.dtype, p.m, p.k, p.n, p.g, cfg)
    if not r.ok:
      bad.append(f"{p.op} {p.shape_label} {cfg}: {r.outcome} {r.error[:200]}")
  assert not bad, "\n".join(bad)


# (rule, op, config it prunes, what the compiler must show). Mixtral's shape.
PRUNED = [
  ("acc > 128/thread", "fwd", kernels.TritonConfig(128, 64, 256, 4, 3), "spill"),
  ("acc > 128/thread", "drhs", kernels.TritonConfig(64, 256, 128, 4, 3), "spill"),
  ("2 warps, tile >= 64x64", "fwd", kernels.TritonConfig(64, 64, 128, 2, 3), "mma.sync"),
  ("mosaic consumer acc > 64x256", "fwd", kernels.MosaicConfig(256, 256, 64, 2, 4), "spill"),
]


@pytest.mark.parametrize("rule,op,cfg,expect", PRUNED, ids=[f"{r}-{o}" for r, o, _, _ in PRUNED])
def test_each_pruning_rule_against_the_compiler(rule, op, cfg, expect):
  """A config each static rule of ragtune/candidates/search_space.py prunes is really bad on H100,
  and the boundary configs it keeps are clean (test_h100_search_space_draws_compile_clean)."""
  m, k, n, g = ANCHORS["mixtral"]
  backend = "mosaic_gpu" if isinstance(cfg, kernels.MosaicConfig) else "pallas_gpu"
  p = Problem(op, backend, BF16, m, k, n, g, "explicit", (m,) + (0,) * (g - 1))
  assert cfg.fits(op, BF16, m, k, n, H100)
  assert cfg not in search_space.candidates(p, device_kind=H100)[1:], f"{rule}: no longer pruned"
  r = aot.compile_op("h100", backend, op, BF16, m, k, n, g, cfg)
  if expect == "spill":
    assert r.outcome in (aot.SPILL, aot.LOOP_SPILL) and r.kernels[0].spill_bytes > 0, (r.outcome, r.kernels)
  else:  # no warpgroup: mma.sync (with a few bytes of spill, too)
    assert r.kernels and r.kernels[0].mma == expect, (r.outcome, r.kernels)


def test_the_economy_rules_prune_configs_that_compile_clean():
  """Rules 3 and 4 of search_space._gpu_config_ok are about the timing budget, not the
  compiler, as their comment says: what they prune compiles clean (wgmma, no spill)."""
  m, k, n, g = ANCHORS["dsv3_up"]
  for op, cfg in (
    ("fwd", kernels.TritonConfig(64, 64, 256, 4, 3)),
    ("drhs", kernels.TritonConfig(64, 64, 256, 4, 3)),
    ("fwd", kernels.TritonConfig(64, 64, 64, 8, 3)),
  ):
    p = Problem(op, "pallas_gpu", BF16, m, k, n, g, "explicit", (m,) + (0,) * (g - 1))
    assert cfg not in search_space.candidates(p, device_kind=H100)
    _assert_clean(aot.compile_op("h100", "pallas_gpu", op, BF16, m, k, n, g, cfg), kernels_expected=1)


def test_mosaic_k_loop_waits_for_the_previous_wgmma():
  """The race fix: every loop that issues wgmma in both Mosaic kernels holds a
  `WARPGROUP.DEPBAR.LE gsb0, 0x1` (plgpu.wgmma_wait(1)), so a pipeline step's buffers are
  not refilled while the previous step's wgmma still reads them. The control compiles the
  gmm without the wait: the check must see the difference."""
  m, k, n, g = ANCHORS["mixtral"]
  for op in kernels.common.OPS:
    cfg = kernels.registry.default_config("mosaic_gpu", op, BF16, m, k, n, g, device_kind=H100)
    r = aot.compile_op("h100", "mosaic_gpu", op, BF16, m, k, n, g, cfg)
    _assert_clean(r, kernels_expected=1)
    assert r.kernels[0].loops_wait_one, (op, r.kernels[0])


def test_mosaic_tgmm_default_is_warp_specialized_and_clean():
  """tgmm's default on DeepSeek-V3 down's drhs: a producer warpgroup gives registers back
  and two consumers take more (two setmaxnreg), TMA loads and stores, wgmma with one left
  in flight in the loop, no spill and no serialized wgmma."""
  m, k, n, g = ANCHORS["dsv3_down"]
  cfg = kernels.registry.default_config("mosaic_gpu", "drhs", BF16, m, k, n, g, device_kind=H100)
  r = aot.compile_op("h100", "mosaic_gpu", "drhs", BF16, m, k, n, g, cfg)
  _assert_clean(r, kernels_expected=1)
  (kr,) = r.kernels
  assert kr.copy == "tma" and kr.counts.get("UTMASTG") and kr.loops_wait_one, kr
  assert kr.counts.get("USETMAXREG") == 2, kr


def test_tgmm_register_plan_fits_and_the_plan_that_hung_is_a_deadlock(monkeypatch):
  """tgmm's setmaxnreg plan on the ragged shape that hung on an H100: 24 + 2 x 240 registers a
  lane, all of its 3 x 168. The plan that hung (a producer at 32, so jax's pipeline gave the
  consumers 240: 65,536 of 64,512) builds clean in ptxas; the machine code's check refuses it."""
  from kernels.mosaic_gpu import tgmm

  m, k, n, g = 1000, 520, 776, 8
  cfg = kernels.registry.default_config("mosaic_gpu", "drhs", BF16, m, k, n, g, device_kind=H100)
  r = aot.compile_op("h100", "mosaic_gpu", "drhs", BF16, m, k, n, g, cfg)
  _assert_clean(r, kernels_expected=1)
  (kr,) = r.kernels
  assert (kr.threads, kr.registers, kr.setmaxnreg_demand, kr.register_pool) == (384, 168, 64512, 64512), kr
  monkeypatch.setattr(tgmm, "pipeline_registers", lambda kernel: 32)
  r = aot.compile_op("h100", "mosaic_gpu", "drhs", BF16, m, k, n, g, cfg)
  assert r.outcome == aot.DEADLOCK, (r.outcome, r.error)
  assert "asks for 65536 registers of a CTA launched with 64512 (384 threads x 168)" in r.error, r.error


def test_the_wait_check_sees_a_missing_wait(monkeypatch):
  from jax.experimental.pallas import mosaic_gpu as plgpu

  monkeypatch.setattr(plgpu, "wgmma_wait", lambda n: None)
  m, k, n, g = ANCHORS["mixtral"]
  cfg = kernels.registry.default_config("mosaic_gpu", "fwd", BF16, m, k, n, g, device_kind=H100)
  r = aot.compile_op("h100", "mosaic_gpu", "fwd", BF16, m, k, n, g, cfg)
  assert r.ok and r.kernels[0].counts.get("HGMMA")
  assert not r.kernels[0].loops_wait_one


@pytest.mark.parametrize(
  "backend,cfg",
  [
    ("pallas_gpu", kernels.TritonConfig(256, 256, 256, 8, 4)),
    ("mosaic_gpu", kernels.MosaicConfig(256, 256, 128, 8, 1)),
  ],
)
def test_a_config_over_shared_memory_is_a_clean_no_fit(backend, cfg):
  m, k, n, g = ANCHORS["mixtral"]
  assert not cfg.fits("fwd", BF16, m, k, n, H100)
  r = aot.compile_op("h100", backend, "fwd", BF16, m, k, n, g, cfg)
  assert r.outcome == aot.NO_FIT, (r.outcome, r.error)
  assert "shared memory" in r.error.lower() and "\n" not in r.error


def test_b200_pallas_gpu_compiles_and_mosaic_gpu_is_refused_clearly():
  m, k, n, g = ANCHORS["mixtral"]
  r = aot.compile_ragged_dot("b200", m, k, n, g, BF16, backend="pallas_gpu")
  _assert_clean(r, smem_limit=gpu_smem_limit(B200), mma="tcgen05", kernels_expected=3)
  r = aot.compile_ragged_dot("b200", m, k, n, g, BF16, backend="mosaic_gpu")
  assert r.outcome == aot.UNSUPPORTED
  assert "hopper (9.0) GPUs only" in r.error and "pallas_gpu" in r.error
  # The same through kernels.ragged_dot itself: one clear ValueError, not the compiler's.
  mesh, _ = aot.target_mesh("b200")
  S = jax.ShapeDtypeStruct
  with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"hopper \(9\.0\) GPUs only"):
    jax.eval_shape(
      lambda a, b, s: kernels.ragged_dot(a, b, s, backend="mosaic_gpu", interpret=False),
      S((64, 128), jnp.bfloat16),
      S((2, 128, 128), jnp.bfloat16),
      S((2,), jnp.int32),
    )


def _assert_tcgen05(report, *, pair: bool):
  """Blackwell: tcgen05 MMAs (a CTA pair's with pair) into allocated tensor memory, TMA
  copies, no spills and no local memory in the MMA or epilogue loops."""
  _assert_clean(report, smem_limit=gpu_smem_limit(B200), mma="tcgen05.2cta" if pair else "tcgen05")
  for kr in report.kernels:
    assert kr.tmem_alloc and kr.cta_pair == pair and kr.copy == "tma" and not kr.loop_spills, kr
    # No warpgroup moves registers (the TMA and MMA warps need few, the epilogue's keep theirs).
    assert kr.threads in (256, 384) and not kr.setmaxnreg and kr.setmaxnreg_demand is None, kr
    assert kr.counts.get("LDTM") and kr.counts.get("UTCBAR"), kr.counts  # the epilogue reads TMEM


# jaxlib assembles every Mosaic GPU kernel of a process for the GPU of its first one (jax
# 0.10.2 and 0.12.0.1: after an H100 kernel, a B200 kernel's PTX goes to ptxas as sm_90a, "SM
# version specified by .target is higher than default SM version assumed"). The B200 Mosaic
# builds therefore run in a process of their own, as `ragtune compile --target b200` does.
_FRESH = """
import dataclasses, json, sys
import kernels
from ragtune.deviceless import aot
B200 = "NVIDIA B200"
out = []
for kind, op, m, k, n, g, pair in json.loads(sys.argv[1]):
  if kind == "ragged_dot":
    r = aot.compile_ragged_dot("b200", m, k, n, g, "bfloat16", backend="mosaic_blackwell")
  else:
    cfg = kernels.registry.default_config("mosaic_blackwell", op, "bfloat16", m, k, n, g, device_kind=B200)
    cfg = dataclasses.replace(cfg, cta_pair=pair, block_k=256 if pair and op == "drhs" else cfg.block_k)
    assert cfg.fits(op, "bfloat16", m, k, n, B200), cfg
    r = aot.compile_op("b200", "mosaic_blackwell", op, "bfloat16", m, k, n, g, cfg)
  out.append(dataclasses.asdict(r))
print(json.dumps(out))
"""


def _b200_in_a_fresh_process(cases: list) -> list:
  """aot reports of each (kind, op, m, k, n, g, pair) case, built in a new Python process."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run(
    [sys.executable, "-c", _FRESH, json.dumps(cases)], capture_output=True, text=True, env=env, timeout=900
  )
  assert done.returncode == 0, done.stderr[-3000:]
  reports = []
  for d in json.loads(done.stdout.strip().splitlines()[-1]):
    kernels_ = tuple(aot.KernelReport(**k) for k in d.pop("kernels"))
    reports.append(aot.CompileReport(**{**d, "kernels": kernels_, "memory": None}))
  return reports


def test_b200_mosaic_blackwell_defaults_compile_clean_fwd_and_vjp():
  """kernels.ragged_dot with mosaic_blackwell's B200 defaults, forward and vjp, on a prefill
  anchor (DeepSeek-V3's take the same kernels with other k and n), decode's and the odd shapes:
  three tcgen05 kernels with tensor memory, clean."""
  anchors = ("mixtral", "dsv3_decode", *ODD)
  cases = [("ragged_dot", "fwd", *SHAPES[a], False) for a in anchors]
  for anchor, report in zip(anchors, _b200_in_a_fresh_process(cases)):
    _assert_tcgen05(report, pair=False)
    assert len(report.kernels) == 3, (anchor, [k.name for k in report.kernels])


def test_b200_cta_pair_compiles_to_2cta_mma():
  """The cta_pair knob builds cta_group::2 MMAs (UTCHMMA.2CTA) over a pair's tensor memory,
  for each op."""
  cases = [("op", op, *ANCHORS["mixtral"], True) for op in kernels.common.OPS]
  for report in _b200_in_a_fresh_process(cases):
    _assert_tcgen05(report, pair=True)


def test_verify_target_b200_compiles_mosaic_blackwell_entries(tmp_path):
  """`ragtune verify --target b200` builds a LUT's mosaic_blackwell entries, a CTA pair's too
  (the console script: a process of its own)."""
  m, k, n, g = ANCHORS["dsv3_decode"]
  fwd = kernels.registry.default_config("mosaic_blackwell", "fwd", BF16, m, k, n, g, device_kind=B200)
  entries = [
    kernels.Entry("fwd", "mosaic_blackwell", BF16, m, k, n, g, fwd),
    kernels.Entry("dlhs", "mosaic_blackwell", BF16, m, k, n, g, dataclasses.replace(fwd, cta_pair=True)),
  ]
  path = tmp_path / "lut.json"
  path.write_text(json.dumps(kernels.Lut(B200, entries).to_dict()))
  ragtune = shutil.which("ragtune") or pytest.fail("the ragtune console script is not installed")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "COLUMNS": "220"}
  r = subprocess.run([ragtune, "verify", str(path), "--target", "b200"], capture_output=True, text=True, env=env)
  out = r.stdout + r.stderr
  assert r.returncode == 0, out
  assert "compiled 2 of 2 entries for b200" in out and "2 ok, 0 failed" in out, out


def test_b200_auto_with_a_mosaic_lut_entry_falls_back_to_pallas_gpu():
  """A LUT (forced onto a B200) whose fastest entry is mosaic_gpu: "auto" skips it and
  compiles pallas_gpu for every op."""
  m, k, n, g = ANCHORS["mixtral"]
  mosaic = kernels.MosaicConfig(128, 128, 64, 4, 4)
  entries = [kernels.Entry(op, "mosaic_gpu", BF16, m, k, n, g, mosaic, {"time_s": 1e-4}) for op in kernels.common.OPS]
  kernels.lut.set_active_lut(kernels.Lut(B200, entries))
  r = aot.compile_ragged_dot("b200", m, k, n, g, BF16, backend="auto")
  _assert_clean(r, smem_limit=gpu_smem_limit(B200), mma="tcgen05", kernels_expected=3)
  names = sorted(kr.name.split("__")[0] for kr in r.kernels)  # XLA suffixes a second copy "__1"
  assert names == ["ragtune_gmm", "ragtune_gmm", "ragtune_tgmm"], names


def test_a_build_whose_machine_code_shows_no_kernel_is_no_kernel_not_ok(monkeypatch):
  """A reader that finds none of the kernels a program runs (as jaxlib 0.12's nested stream
  once hid them) checked nothing: NO_KERNEL, naming the cubins it read, never OK; the same
  for another library's kernels that `kernel` picks. XLA's own op has no kernel to find."""
  m, k, n, g = 256, 128, 128, 2
  r = aot.compile_op("h100", "xla", "fwd", BF16, m, k, n, g, None)
  assert r.outcome == aot.OK and not r.kernels, r
  ragged_dot = lambda a, b, gs: kernels.ragged_dot(a, b, gs, backend="pallas_gpu", interpret=False)
  r = aot.compile_fn("h100", ragged_dot, *aot.op_arg_shapes("fwd", m, k, n, g, BF16), kernel=lambda kc: False)
  assert r.outcome == aot.NO_KERNEL and not r.kernels and "held none of the picked kernels (" in r.error, r
  monkeypatch.setattr(machine_code, "read_cubin", lambda cubin, tool: [])
  cfg = kernels.registry.default_config("pallas_gpu", "fwd", BF16, m, k, n, g, device_kind=H100)
  r = aot.compile_op("h100", "pallas_gpu", "fwd", BF16, m, k, n, g, cfg)
  assert r.outcome == aot.NO_KERNEL and not r.ok, r
  cubins = int(re.search(r"(\d+) cubins read", r.error).group(1))
  assert cubins > 0 and r.error.startswith("the machine code held no ragtune_* kernel"), r.error


def test_xla_assembles_with_the_ptxas_of_the_cuda_folder_ragtune_names(tmp_path, monkeypatch):
  """The compile hands XLA provenance.cuda_data_dir, and XLA assembles with its ptxas, the
  one provenance records: not a ptxas first on PATH (a host's own CUDA), which XLA ran when
  jax named it no folder (jax 0.10 to 0.12 beside the gpu-compile extra's cu13 wheels)."""
  real = provenance.cuda_data_dir()
  assert real and provenance.xla_ptxas() == str(Path(real) / "bin" / "ptxas"), "the gpu-compile extra's nvcc wheel"
  calls = tmp_path / "calls"
  for folder, body in (("named", f'echo "$@" >> {calls}\nexec {real}/bin/ptxas "$@"'), ("on_path", "exit 1")):
    (tmp_path / folder / "bin").mkdir(parents=True)
    (tmp_path / folder / "bin" / "ptxas").write_text(f"#!/bin/sh\n{body}\n")
    (tmp_path / folder / "bin" / "ptxas").chmod(0o755)
  monkeypatch.setattr(provenance, "cuda_data_dir", lambda: str(tmp_path / "named"))
  monkeypatch.setenv("PATH", f"{tmp_path / 'on_path' / 'bin'}:{os.environ['PATH']}")
  m, k, n, g = 264, 136, 144, 3  # a kernel no other test builds: XLA caches what it assembled
  cfg = kernels.registry.default_config("pallas_gpu", "fwd", BF16, m, k, n, g, device_kind=H100)
  r = aot.compile_op("h100", "pallas_gpu", "fwd", BF16, m, k, n, g, cfg)
  assert r.ok and r.kernels, r
  assert calls.exists() and "-arch=sm_90a" in calls.read_text(), "XLA assembled with the named folder's ptxas"


def test_serialized_wgmma_and_loop_spills_are_seen():
  """ptxas's C7511 (wgmma serialized for want of registers) compiles, yet runs several times
  slower; the reader must flag it. jax's own warp-specialized Hopper matmul at 128x256
  tiles per warpgroup hits it and stores and reloads its accumulator in the k loop; at
  128x128 it is clean. Both move registers to their consumers (setmaxnreg), and their
  widest wgmma is the tile's width."""
  from jax.experimental import serialize_executable
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  hm = pytest.importorskip("jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu")
  mesh, _ = aot.target_mesh("h100")
  spec = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  flags = {}
  for tile_n in (256, 128):
    try:
      cfg = hm.TuningConfig(tile_m=128, tile_n=tile_n, tile_k=64, max_concurrent_steps=2)
    except TypeError as e:
      pytest.skip(f"this jax's hopper_matmul_mgpu.TuningConfig differs: {e}")
    with jax.set_mesh(mesh):
      c = (
        jax.jit(lambda a, b, o: hm.matmul(a, b, o, cfg))
        .lower(spec((4096, 4096)), spec((4096, 4096)), spec((4096, 4096)))
        .compile()
      )
    (k,) = machine_code.read_executable(serialize_executable.serialize(c)[0], only=b"mosaic")
    flags[tile_n] = (k.serialized_wgmma, k.loop_spills > 0, k.setmaxnreg, k.hgmma_n)
  assert flags == {256: (True, True, True, 256), 128: (False, False, True, 128)}


# The problem that took 0.23 ms (fwd) and 0.21 ms (dlhs) on an H100 where XLA's ragged_dot took
# 0.04: XLA ran the tile schedule's jnp.searchsorted as a while loop (3 trips, 4 thunks each),
# which cuts the program's CUDA graph and sends each of its kernels from the host on every call,
# beside 10 small fusions. n 128 here, so no operand is padded: every XLA kernel is the schedule's.
SMALL = (96, 64, 128, 4)


@pytest.mark.parametrize("op", kernels.common.OPS)
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_the_tile_schedule_is_two_small_fusions_and_no_loop(backend, op):
  """Each op of a small problem compiles to its kernel and at most two small XLA fusions for
  its group metadata (drhs's row bounds, gmm's tile schedule: one cumulative sum and one buffer
  of every table), and no loop."""
  m, k, n, g = SMALL
  cfg = kernels.registry.default_config(backend, op, BF16, m, k, n, g, device_kind=H100)
  r = aot.compile_op("h100", backend, op, BF16, m, k, n, g, cfg)
  _assert_clean(r, kernels_expected=1)
  assert not r.loops and len(r.xla_kernels) <= 2, r.thunks
  assert [t for t in r.thunks if t.split()[0] not in ("kCustomKernel", "kCustomCall")] == [], r.thunks
