"""Every named GPU (kernels/gpu_facts/) as a deviceless target: its defaults built by XLA's real
compiler and ptxas for it, read back from the machine code.

Per GPU, in a process of its own (jaxlib assembles a process's Mosaic GPU kernels for the first
GPU it compiled for): kernels.ragged_dot's forward and vjp on a small ragged problem with each
backend that compiles there; the Triton candidate of the largest shared memory at Mixtral's
shape, which must launch within the GPU's limit (its estimate is what keeps the search space
within it: test_gpus.py); fp8 where the GPU has fp8 tensor cores, and a clear refusal where it
has none. `ragtune compile shapes/anchors.yaml --target <gpu>` builds the anchors (docs/gpu.md).
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import gpu_compile_missing, needs_compiler

from kernels import gpus
from kernels.lut import device_slug
from ragtune.deviceless import aot

pytestmark = needs_compiler(gpu_compile_missing(), "deviceless compile tests")

# h100, h200 and b200 have tests of their own (test_aot_compile.py). One GPU of each compute
# capability runs by default; those that differ from it only in SMs, clock and memory run with
# RAGTUNE_GPU_TARGETS_ALL=1 (docs/gpu.md lists what `ragtune compile` built for each).
EACH_CAPABILITY = ("a100", "l4", "h20", "b300", "rtx-pro-6000")
SAME_CAPABILITY = ("l40s", "h100-pcie", "gh200", "gb200")
ALL = "RAGTUNE_GPU_TARGETS_ALL"
NEW = EACH_CAPABILITY + tuple(
  pytest.param(n, marks=pytest.mark.skipif(not os.environ.get(ALL), reason=f"{ALL}=1 runs it")) for n in SAME_CAPABILITY
)
SMALL = (200, 256, 192, 5)  # rows no block divides, k and n 16 bytes apart
MIXTRAL = (8192, 4096, 14336, 8)
MMA = {"ampere": "mma.sync", "ada": "mma.sync", "blackwell-rtx": "mma.sync", "hopper": "wgmma", "blackwell": "tcgen05"}
# pallas_gpu's fp8 forward: QMMA (fp8 mma.sync) on sm_89 and sm_120; on Hopper Triton's f16
# mma.sync (jax's lowering keeps fp8 off wgmma: docs/quantization.md); tcgen05 kind::f8f6f4.
FP8_MMA = {
  "ada": "mma.sync e4m3",
  "blackwell-rtx": "mma.sync e4m3",
  "hopper": "mma.sync f16",
  "blackwell": "tcgen05 f8f6f4",
}

_CHILD = """
import dataclasses, json, sys
import kernels
from kernels import gpus, registry
from ragtune.candidates import search_space
from ragtune.deviceless import aot
from ragtune.problems.shapes import Problem

name, small, mixtral = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
kind = gpus.gpu(name).device_kind
out = {}
for b in registry.REGISTRY.values():
  if b.own_kernels and b.runs_on("gpu", kind):
    out[b.name] = aot.compile_ragged_dot(name, *small, "bfloat16", backend=b.name)
p = Problem("fwd", "pallas_gpu", "bfloat16", *mixtral, "compile", ())
biggest = max(search_space.candidates(p, device_kind=kind), key=lambda c: c.smem_bytes("fwd", "bfloat16", *mixtral[:3]))
out["largest"] = aot.compile_op(name, "pallas_gpu", "fwd", "bfloat16", *mixtral, biggest)
out["fp8"] = aot.compile_ragged_dot(name, *small, "float8_e4m3fn:block128", backend="pallas_gpu")
print(json.dumps({k: dataclasses.asdict(r) for k, r in out.items()}))
"""


def _reports(name: str) -> dict[str, aot.CompileReport]:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  args = [sys.executable, "-c", _CHILD, name, json.dumps(SMALL), json.dumps(MIXTRAL)]
  done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  out = {}
  for key, d in json.loads(done.stdout.strip().splitlines()[-1]).items():
    kernels_ = tuple(aot.KernelReport(**k) for k in d.pop("kernels"))
    out[key] = aot.CompileReport(**{**d, "kernels": kernels_, "memory": None})
  return out


def _assert_clean(r: aot.CompileReport, limit: int, mma: str, count: int) -> None:
  assert r.ok, f"{r.outcome}: {r.error}"
  assert len(r.kernels) == count, [k.name for k in r.kernels]
  for k in r.kernels:
    assert k.spill_bytes == 0 and not k.loop_spills, k
    assert k.smem_bytes is not None and 0 < k.smem_bytes <= limit, k
    assert k.mma == mma, k
    assert k.fault() == (aot.OK, ""), k


@pytest.mark.parametrize("name", NEW)
def test_a_named_gpus_defaults_build_clean(name):
  g = gpus.gpu(name)
  limit, mma = g.arch.smem_per_block, MMA[g.arch.name]
  reports = _reports(name)
  assert {k for k in reports if k not in ("largest", "fp8")} == {
    b for b in ("pallas_gpu", "mosaic_gpu", "mosaic_blackwell") if b in reports
  }
  assert "pallas_gpu" in reports
  for backend in ("pallas_gpu", "mosaic_gpu", "mosaic_blackwell"):
    if backend in reports:  # fwd, dlhs and drhs of kernels.ragged_dot's vjp
      assert reports[backend].device_kind == g.device_kind
      _assert_clean(reports[backend], limit, mma, count=3)
  # it may spill (a sweep's deviceless compile prunes that), never overflow shared memory
  big = reports["largest"]
  assert big.outcome not in (aot.NO_FIT, aot.ERROR, aot.NO_KERNEL), f"{big.outcome}: {big.error}"
  assert len(big.kernels) == 1 and 0 < big.kernels[0].smem_bytes <= limit, big.kernels
  fp8 = reports["fp8"]
  if g.arch.fp8:
    fp8_mma, inputs = FP8_MMA[g.arch.name].split()
    _assert_clean(fp8, limit, fp8_mma, count=1)
    assert fp8.kernels[0].mma_inputs == inputs, fp8.kernels
  else:
    assert fp8.outcome == aot.UNSUPPORTED and "has no fp8 tensor cores" in fp8.error, fp8


def test_every_named_gpu_is_a_target_and_its_slug_names_a_product():
  for name, g in gpus.gpus().items():
    t = aot.resolve_target(name)
    assert t.platform == "gpu" and aot.proto_device_kind(t.spec) == g.device_kind
    assert f"core_count: {g.sms}\n" in t.spec and f"shared_memory_per_block_optin: {g.arch.smem_per_block}\n" in t.spec
    for v in g.variants:  # the first by the GPU's name, the others by their LUT slug
      assert aot.target_for_kind(v.device_kind) == (name if v is g.variants[0] else device_slug(v.device_kind))
      assert aot.proto_device_kind(aot.resolve_target(aot.target_for_kind(v.device_kind)).spec) == v.device_kind
