"""kernels.gpus: the named GPUs' facts files and the rules each compute capability sets
(shared memory, which backends compile, auto's pick, fp8), the fallback for a GPU with no
facts file, and which LUT serves which device. No compiler here: test_gpu_targets.py builds
every named GPU's defaults deviceless."""

import json
import logging

import pytest

import kernels
from kernels import gpus, registry
from kernels.lut import device_slug
from ragtune.candidates import search_space
from ragtune.problems.shapes import Problem

# The GPUs issue "every NVIDIA GPU a JAX user has" names, and those named before.
NAMED = ("a100", "l40s", "l4", "h20", "h100-pcie", "gh200", "rtx-pro-6000", "gb200", "b300", "h100", "h200", "b200")
BF16, BLOCK128, CHANNELWISE = "bfloat16", "float8_e4m3fn:block128", "float8_e4m3fn:channelwise"


def test_every_named_gpu_has_a_facts_file_with_a_source_for_each_figure():
  assert set(NAMED) <= set(gpus.gpus())
  for g in gpus.gpus().values():
    for key in gpus.REQUIRED:
      assert g.sources[key].strip(), (g.name, key)
    assert g.sms > 0 and g.l2_bytes > 0 and 0.3 < g.clock_ghz < 3.5, g
    assert set(g.tflops) <= set(gpus.PEAK_CLASSES) and g.tflops["bf16"] > 0, g
    # fp8 and int8 run at twice bf16's rate where the chip has them (B300's int8 is cut: absent)
    assert all(g.tflops[c] == pytest.approx(2 * g.tflops["bf16"], rel=0.02) for c in ("fp8", "int8") if c in g.tflops)
    assert ("fp8" in g.tflops) == g.arch.fp8, g.name
    for v in g.variants:
      assert v.device_kind.startswith("NVIDIA ") and v.memory_bytes > 8 << 30 and v.memory_bytes_per_s > 2e11, v


def test_each_device_kind_has_its_own_lut_slug():
  kinds = [v.device_kind for g in gpus.gpus().values() for v in g.variants]
  slugs = [device_slug(k) for k in kinds]
  assert len(set(slugs)) == len(kinds)
  # 40 GB and 80 GB, SXM and PCIe: four LUT names of one GPU
  a100 = [device_slug(v.device_kind) for v in gpus.gpu("a100").variants]
  assert a100 == ["nvidia-a100-sxm4-80gb", "nvidia-a100-sxm4-40gb", "nvidia-a100-80gb-pcie", "nvidia-a100-pcie-40gb"]


def test_a_facts_file_without_a_source_is_refused(tmp_path, monkeypatch):
  text = (gpus.FACTS_DIR / "l4.toml").read_text().replace('sms = "deviceQuery', 'not_sms = "deviceQuery')
  (tmp_path / "l4.toml").write_text(text)
  monkeypatch.setattr(gpus, "FACTS_DIR", tmp_path)
  gpus.gpus.cache_clear()
  try:
    with pytest.raises(gpus.FactsError, match=r"l4.toml: sources: no source for sms"):
      gpus.gpus()
  finally:
    monkeypatch.undo()
    gpus.gpus.cache_clear()


@pytest.mark.parametrize(
  "capability, arch, smem_kib, mma, fp8",
  [
    ("8.0", "ampere", 163, "mma.sync", False),
    ("8.6", "ampere-ga10x", 99, "mma.sync", False),
    ("8.9", "ada", 99, "mma.sync", True),
    ("9.0", "hopper", 227, "wgmma", True),
    ("10.0", "blackwell", 227, "tcgen05", True),
    ("10.3", "blackwell", 227, "tcgen05", True),
    ("12.0", "blackwell-rtx", 99, "mma.sync", True),
    ("7.5", "other", 99, "mma.sync", False),
  ],
)
def test_the_rules_of_each_compute_capability(capability, arch, smem_kib, mma, fp8):
  a = gpus.arch_of_capability(capability)
  assert (a.name, a.smem_per_block, a.mma, a.fp8) == (arch, smem_kib * 1024, mma, fp8)


# Per named GPU: the backends that compile for it and auto's pick for bf16 and fp8 operands.
RUNS = {
  "ampere": ({"pallas_gpu", "xla"}, "pallas_gpu", "xla"),
  "ada": ({"pallas_gpu", "xla"}, "pallas_gpu", "pallas_gpu"),
  "hopper": ({"pallas_gpu", "mosaic_gpu", "xla"}, "pallas_gpu", "mosaic_gpu"),
  "blackwell": ({"pallas_gpu", "mosaic_blackwell", "xla"}, "pallas_gpu", "pallas_gpu"),
  "blackwell-rtx": ({"pallas_gpu", "xla"}, "pallas_gpu", "pallas_gpu"),
}


@pytest.mark.parametrize("name", NAMED)
def test_backends_and_autos_pick_on_each_named_gpu(name):
  g = gpus.gpu(name)
  runs, bf16, fp8 = RUNS[g.arch.name]
  for kind in (v.device_kind for v in g.variants):
    assert {b.name for b in registry.REGISTRY.values() if b.runs_on("gpu", kind)} == runs, kind
    assert registry.auto_backend("gpu", kind) == bf16
    assert registry.auto_backend("gpu", kind, BLOCK128) == registry.auto_backend("gpu", kind, CHANNELWISE) == fp8
    assert kernels.common.gpu_smem_limit(kind) == g.arch.smem_per_block


def test_a_backend_that_cannot_compile_for_a_gpu_says_why_by_compute_capability():
  with pytest.raises(ValueError, match=r"'mosaic_gpu' compiles for hopper \(9\.0\) GPUs only, not 'NVIDIA A100-SXM4"):
    registry.check_device("mosaic_gpu", "gpu", "NVIDIA A100-SXM4-80GB")
  rtx = gpus.gpu("rtx-pro-6000").device_kind
  with pytest.raises(ValueError, match=r"blackwell \(10\.x\) GPUs only, not .*\(12\.0, blackwell-rtx\); use backend="):
    registry.check_device("mosaic_blackwell", "gpu", rtx)
  # fp8 below sm_89: Triton cannot convert to e4m3 there; XLA's path (which upcasts) can
  with pytest.raises(ValueError, match=r"cannot compute float8_e4m3fn:block128: .*no fp8 tensor cores.*'xla'"):
    registry.check_device("pallas_gpu", "gpu", "NVIDIA A100-PCIE-40GB", BLOCK128)
  registry.check_device("pallas_gpu", "gpu", "NVIDIA A100-PCIE-40GB", BF16)
  registry.check_device("pallas_gpu", "gpu", "NVIDIA L4", BLOCK128)
  assert registry.activation_quantizer("gpu", "NVIDIA A100-SXM4-80GB", BLOCK128) is None
  assert registry.activation_quantizer("gpu", "NVIDIA L40S", BLOCK128) is not None


def test_a_gpu_with_no_facts_file_is_placed_by_its_compute_capability_once(caplog):
  kind = "NVIDIA GeForce RTX 4090 (test)"
  assert gpus.arch(kind) is gpus.OTHER and gpus.how_placed(kind) == "unknown"
  with caplog.at_level(logging.WARNING, logger="kernels"):
    gpus.note_capability(kind, "8.9")
    gpus.note_capability(kind, "8.9")
  said = [r.getMessage() for r in caplog.records if kind in r.getMessage()]
  assert len(said) == 1 and "compute capability 8.9 as ada" in said[0] and "99 KiB" in said[0], said
  assert gpus.arch(kind).name == "ada" and gpus.how_placed(kind) == "compute capability 8.9"
  assert registry.auto_backend("gpu", kind, BLOCK128) == "pallas_gpu"
  # a kind with a facts file keeps its file's facts, whatever a device says
  gpus.note_capability("NVIDIA L4", "9.0")
  assert gpus.arch("NVIDIA L4").name == "ada"
  # no capability and no facts: words of the name, else the careful arch (an RTX A3000 is no A30)
  assert gpus.arch("NVIDIA H800").name == "hopper" and gpus.how_placed("NVIDIA H800") == "name"
  assert gpus.arch("NVIDIA Tesla T4").name == gpus.arch("NVIDIA RTX A3000 Laptop GPU").name == "other"
  assert "its compute capability is unknown here" in gpus.fp8_refusal("NVIDIA Tesla T4")
  # a ROCm device's capability names no NVIDIA arch: nothing recorded, nothing raised
  gpus.note_capability("AMD Instinct MI300X (test)", "gfx942")
  assert gpus.arch("AMD Instinct MI300X (test)") is gpus.OTHER


PROBLEMS = {"mixtral": (8192, 4096, 14336, 8), "dsv3_decode": (512, 7168, 2048, 256), "small": (96, 64, 80, 4)}


@pytest.mark.parametrize("name", NAMED)
def test_every_candidate_a_named_gpu_keeps_fits_its_shared_memory(name):
  """The search space a sweep draws from on that GPU (ragtune.candidates.search_space), for
  every backend that compiles there, op and format it computes there: no candidate asks for
  more shared memory than a block may opt into (test_gpu_targets.py compiles the largest)."""
  g = gpus.gpu(name)
  limit, kind = g.arch.smem_per_block, g.device_kind
  seen = 0
  for b in registry.REGISTRY.values():
    if b.config_type is None or not b.runs_on("gpu", kind):
      continue
    for fmt in (BF16, "float32", BLOCK128):
      if fmt not in b.dtypes or not b.runs_on("gpu", kind, fmt):
        continue
      for op in ("fwd", "dlhs", "drhs"):
        for m, k, n, groups in PROBLEMS.values():
          p = Problem(op, b.name, fmt, m, k, n, groups, "multinomial", ())
          for cfg in search_space.candidates(p, device_kind=kind):
            assert cfg.smem_bytes(op, fmt, m, k, n) <= limit, (name, b.name, fmt, op, cfg)
            seen += 1
  assert seen > 100, seen


def _lut(kind: str) -> dict:
  lut = kernels.lut
  return {"schema": lut.SCHEMA, "schema_version": lut.SCHEMA_VERSION, "device_kind": kind, "entries": []}


def test_a_lut_serves_the_gpus_of_its_compute_capability_and_sm_count(tmp_path, monkeypatch):
  for kind in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"):
    (tmp_path / f"{device_slug(kind)}.json").write_text(json.dumps(_lut(kind)))
  # another product of the GPU it was tuned on, and another GPU of the same SMs and arch
  for device, tuned in (("NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-80GB"), ("NVIDIA H200", "NVIDIA H100 80GB HBM3")):
    monkeypatch.setattr(kernels.lut, "current_device_kind", lambda d=device: d)
    assert kernels.load_lut(tmp_path).device_kind == tuned
    assert kernels.lut.serves(tuned, device)
  # 114 SMs against 132: a persistent grid sized for one does not fit the other
  monkeypatch.setattr(kernels.lut, "current_device_kind", lambda: "NVIDIA H100 PCIe")
  with pytest.raises(kernels.LutError, match=r"no LUT for device 'NVIDIA H100 PCIe'"):
    kernels.load_lut(tmp_path)
  with pytest.raises(kernels.LutError, match=r"H100 SXM is 9\.0, 132 SMs, H100 PCIe 9\.0, 114 SMs\); pass force=True"):
    kernels.load_lut(tmp_path / "nvidia-h100-80gb-hbm3.json")
  assert kernels.load_lut(tmp_path / "nvidia-h100-80gb-hbm3.json", force=True).device_kind == "NVIDIA H100 80GB HBM3"
  assert not kernels.lut.serves("NVIDIA B200", "NVIDIA GB200")  # 148 SMs against 152


def test_datasheet_peaks_by_format():
  assert gpus.peaks("NVIDIA H100 80GB HBM3", BF16) == (989.4, 3350.0)
  assert gpus.peaks("NVIDIA H100 80GB HBM3", BLOCK128)[0] == 1978.9
  assert gpus.peaks("NVIDIA A100-SXM4-40GB", BLOCK128) == (None, 1555.0)  # no fp8 tensor cores
  assert gpus.peaks("cpu") == (None, None)


def _auto_16bit(kind: str) -> str:
  """auto's bf16 fallback, and its drhs one where that differs (Backend.op_priority)."""
  every, drhs = registry.auto_backend("gpu", kind), registry.auto_backend("gpu", kind, op="drhs")
  return every if drhs == every else f"{every} (drhs: {drhs})"


def _doc_cells(g: gpus.Gpu) -> list[str]:
  """docs/gpu.md's "Which GPUs" row of a named GPU, all but its last (deviceless) column."""
  kind = g.device_kind
  fp8 = g.tflops.get("fp8")
  return [
    f"{g.title} (`{g.name}`)",
    "<br>".join(f"`{device_slug(v.device_kind)}`" for v in g.variants),
    f"{g.capability[0]}.{g.capability[1]}",
    g.arch.name,
    f"{g.arch.smem_per_block // 1024} KiB",
    ", ".join(b.name for b in registry.REGISTRY.values() if b.own_kernels and b.runs_on("gpu", kind)),
    f"{_auto_16bit(kind)} / {registry.auto_backend('gpu', kind, BLOCK128)}",
    f"{g.tflops['bf16']:g} / {f'{fp8:g}' if fp8 else '-'}",
    " / ".join(f"{v.memory_bytes_per_s / 1e9:,.0f}" for v in g.variants),
  ]


def test_the_docs_table_of_named_gpus_says_what_the_facts_and_rules_say():
  text = (gpus.FACTS_DIR.parent.parent / "docs" / "gpu.md").read_text()
  rows = {
    cells[0]: cells
    for line in text.splitlines()
    if line.startswith("| ") and "(`" in line
    for cells in [[c.strip() for c in line.strip().strip("|").split(" | ")]]
  }
  for g in gpus.gpus().values():
    want = _doc_cells(g)
    assert want[0] in rows, f"docs/gpu.md has no row for {g.name}"
    assert rows[want[0]][: len(want)] == want, g.name
