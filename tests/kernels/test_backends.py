"""The backend registry, Lut.query over backends, and backend="auto" following it op by op."""

import dataclasses
import json
import subprocess
import sys
import typing

import jax.numpy as jnp
import pytest
from conftest import entry_pick, plan_of

import kernels
from kernels import registry
from ragtune.candidates import search_space
from ragtune.problems import shapes

H100 = "NVIDIA H100 80GB HBM3"
G, M = kernels.TritonConfig, kernels.MosaicConfig
SHAPE = dict(m=512, k=256, n=384, g=4)


def test_registry_is_the_one_list_of_backends():
  assert kernels.registry.NAMES == tuple(registry.REGISTRY) == registry.NAMES
  assert set(typing.get_args(shapes.Backend)) == set(registry.NAMES)
  for name, b in registry.REGISTRY.items():
    assert b.name == name and callable(b.forward) and callable(b.grad_rhs)
    cfg = kernels.registry.default_config(name, "fwd", "bfloat16", 1024, 512, 768, 4, device_kind=H100)
    if b.config_type is None:
      assert cfg is None and kernels.registry.config_from_dict(name, {}) is None
      continue
    assert isinstance(cfg, b.config_type)
    assert kernels.registry.config_from_dict(name, cfg.to_dict()) == cfg  # what a LUT stores
    assert b.space("fwd", "bfloat16", 1024, 512, 768, H100)  # ragtune can tune every backend with knobs
  with pytest.raises(ValueError, match="backend must be one of"):
    kernels.registry.default_config("cuda_magic", "fwd", "bfloat16", 8, 8, 8, 1)


_NO_ABSL = """
import importlib.abc, sys
class NoAbsl(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name == "absl" or name.startswith("absl."):
      raise ImportError("absl is not installed (simulated)")
sys.meta_path.insert(0, NoAbsl())
import jax.numpy as jnp, kernels
assert "jax.experimental.pallas.mosaic_gpu" not in sys.modules
assert "jax.experimental.pallas.tpu" not in sys.modules, "Pallas TPU imported by import kernels"
y = kernels.ragged_dot(jnp.ones((4, 8)), jnp.ones((2, 8, 8)), jnp.array([2, 2]), backend="xla")
assert float(y.sum()) == 4 * 8 * 8
"""


def test_kernels_import_and_run_without_absl():
  """jax's Mosaic GPU package needs absl-py; kernels imports it only when mosaic_gpu runs, and
  jax's Pallas TPU package (a sixth of `import kernels`) only when pallas_tpu runs."""
  subprocess.run([sys.executable, "-c", _NO_ABSL], check=True)


@pytest.mark.parametrize(
  "field,value",
  [
    ("block_m", 32),
    ("block_n", 100),
    ("block_k", 32),
    ("max_concurrent_steps", 1),
    ("group_m", 0),
    ("group_m", True),
  ],
)
def test_mosaic_config_rejects_invalid(field, value):
  with pytest.raises(ValueError, match=f"MosaicConfig.{field}"):
    kernels.MosaicConfig(**{field: value})


def test_mosaic_smem_bounds_and_defaults():
  big = M(block_m=256, block_n=256, block_k=64, max_concurrent_steps=4)
  # Four stages of [256, 64] + [64, 256] operands and the epilogue's 2 x 2 [64, 64] slots.
  assert big.smem_bytes("fwd", "bfloat16", 8192, 4096, 4096) == (4 * 64 * 512 + 4 * 64 * 64) * 2
  assert not big.fits("fwd", "bfloat16", 8192, 4096, 4096, H100)
  # The persistent loop allocates every stage whatever k is; two stages fit.
  assert not big.fits("fwd", "bfloat16", 8192, 64, 4096, H100)
  assert dataclasses.replace(big, max_concurrent_steps=2).fits("fwd", "bfloat16", 8192, 64, 4096, H100)
  for op in kernels.common.OPS:
    cfg = kernels.registry.default_config("mosaic_gpu", op, "bfloat16", 8192, 4096, 14336, 8, device_kind=H100)
    assert cfg.fits(op, "bfloat16", 8192, 4096, 14336, H100)
    small = kernels.registry.default_config("mosaic_gpu", op, "bfloat16", 8192, 4096, 14336, 8, device_kind="NVIDIA L4")
    assert small.fits(op, "bfloat16", 8192, 4096, 14336, "NVIDIA L4")
  cands = search_space.candidates(
    shapes.Problem("drhs", "mosaic_gpu", "bfloat16", 4096, 1024, 7168, 8, "x", (512,) * 8), device_kind=H100
  )
  assert len(cands) > 10 and all(c.fits("drhs", "bfloat16", 4096, 1024, 7168, H100) for c in cands)
  assert all(1024 % c.block_k == 0 and 7168 % c.block_n == 0 for c in cands[1:])


# --- Lut.query across backends --------------------------------------------------------------------------


def _entry(op, backend, cfg, time_s, **shape):
  s = dict(SHAPE, **shape)
  return kernels.Entry(op, backend, "bfloat16", s["m"], s["k"], s["n"], s["g"], cfg, {"time_s": time_s})


def _mixed_lut(winners):
  """Entries of three backends for each op at SHAPE; `winners[op]` is the fastest there."""
  configs = {"pallas_gpu": G(64, 64, 128, 4, 3), "mosaic_gpu": M(64, 128, 128, 2, 1), "xla": None}
  entries = []
  for op in kernels.common.OPS:
    for backend, cfg in configs.items():
      entries.append(_entry(op, backend, cfg, 1e-4 if backend == winners[op] else 2e-4))
    # A faster entry at a farther shape must not win: the nearest shape decides first.
    entries.append(_entry(op, "pallas_gpu", configs["pallas_gpu"], 1e-6, m=64))
  return kernels.Lut(H100, entries)


def test_query_returns_the_fastest_backend_for_each_op(tmp_path):
  winners = {"fwd": "pallas_gpu", "dlhs": "mosaic_gpu", "drhs": "xla"}
  lut = _mixed_lut(winners)
  path = tmp_path / "lut.json"
  path.write_text(json.dumps(lut.to_dict()))
  lut = kernels.Lut.from_file(path)  # xla entries (config {}) survive the round trip
  for op, backend in winners.items():
    got = entry_pick(lut.query(op, SHAPE["m"], SHAPE["k"], SHAPE["n"], SHAPE["g"], jnp.bfloat16))
    assert got[0] == backend
    assert (got[1] is None) == (backend == "xla")
  # Near a tuned shape (m moves with tokens) the same winners hold.
  assert entry_pick(lut.query("dlhs", 600, 256, 384, 4, "bfloat16"))[0] == "mosaic_gpu"
  assert entry_pick(lut.query("fwd", 512, 256, 384, 4, "float16")) is None  # no float16 entries
  assert entry_pick(lut.query("fwd", 512, 1 << 20, 1 << 20, 4, "bfloat16")) is None  # too far


def test_query_skips_configs_that_do_not_fit_and_ranks_untimed_last():
  huge = M(256, 256, 128, 8, 1)  # ~1 MiB of shared memory for a long k
  lut = kernels.Lut(
    H100,
    [
      _entry("fwd", "mosaic_gpu", huge, 1e-6),
      _entry("fwd", "pallas_gpu", G(64, 64, 128, 4, 3), None),
      _entry("fwd", "xla", None, 5e-4),
    ],
  )
  assert entry_pick(lut.query("fwd", SHAPE["m"], SHAPE["k"], SHAPE["n"], SHAPE["g"], "bfloat16"))[0] == "xla"


def test_xla_entry_with_a_config_is_refused():
  bad = {"op": "fwd", "backend": "xla", "dtype": "bfloat16", "m": 8, "k": 8, "n": 8, "g": 1, "config": {"block_m": 64}}
  data = {
    "schema": kernels.lut.SCHEMA,
    "schema_version": kernels.lut.SCHEMA_VERSION,
    "device_kind": H100,
    "entries": [bad],
  }
  with pytest.raises(kernels.LutError, match="has no config"):
    kernels.Lut.from_dict(data)


def test_resolve_explicit_backend_and_configs_under_auto(monkeypatch):
  s = (SHAPE["m"], SHAPE["k"], SHAPE["n"], SHAPE["g"], jnp.bfloat16)
  kernels.lut.set_active_lut(_mixed_lut({"fwd": "xla", "dlhs": "xla", "drhs": "xla"}))
  # On this CPU host "auto" is xla, except for an op given a config of another backend.
  plan = plan_of("auto", {"fwd": M()}, *s)
  assert plan == {"fwd": ("mosaic_gpu", M()), "dlhs": ("xla", None), "drhs": ("xla", None)}
  # An explicit backend takes its own LUT entries (query with a backend), not the per-shape winner.
  plan = plan_of("mosaic_gpu", None, *s)
  assert all(name == "mosaic_gpu" and cfg == M(64, 128, 128, 2, 1) for name, cfg in plan.values())
  with pytest.raises(TypeError, match="must be a MosaicConfig"):
    plan_of("mosaic_gpu", G(), *s)
  from kernels.ragged_dot import default_interpret

  assert default_interpret("mosaic_gpu") and not default_interpret("xla")
  monkeypatch.setattr(kernels.target, "current", lambda: kernels.target.Target("gpu", H100, 132))
  assert not default_interpret("mosaic_gpu") and not default_interpret("pallas_gpu")


def test_auto_falls_back_to_mosaic_on_hopper_and_blackwell_where_pallas_triton_is_gone(monkeypatch):
  """ "auto" keeps pallas_gpu on Hopper (but for drhs) and Blackwell; a jax without Pallas Triton gets
  mosaic_gpu on Hopper and mosaic_blackwell on a B200 (an Ampere GPU then gets xla), and
  asking for pallas_gpu by name says why not."""
  reg = kernels.registry
  assert reg.get("pallas_gpu").unavailable() == ""  # this jax ships it
  assert reg.auto_backend("gpu", H100) == "pallas_gpu"
  # drhs goes to mosaic_gpu's tgmm on Hopper (op_priority), in the 16-bit dtypes it computes.
  assert [reg.auto_backend("gpu", H100, "bfloat16", op=op) for op in ("fwd", "dlhs", "drhs")] == [
    "pallas_gpu",
    "pallas_gpu",
    "mosaic_gpu",
  ]
  assert reg.auto_backend("gpu", H100, "float16", op="drhs") == reg.auto_backend("gpu", H100, op="drhs") == "mosaic_gpu"
  assert reg.auto_backend("gpu", H100, "float32", op="drhs") == "pallas_gpu"
  assert reg.auto_backend("gpu", "NVIDIA B200", "bfloat16", op="drhs") == "pallas_gpu"
  assert reg.auto_backend("tpu", "TPU v5 lite", "bfloat16", op="drhs") == "pallas_tpu"
  gone = dataclasses.replace(reg.get("pallas_gpu"), unavailable=lambda: "jax 9.9 has no Pallas Triton")
  monkeypatch.setitem(reg.REGISTRY, "pallas_gpu", gone)
  assert reg.auto_backend("gpu", H100) == "mosaic_gpu"
  assert reg.auto_backend("gpu", "NVIDIA B200") == "mosaic_blackwell"
  assert reg.auto_backend("gpu", "NVIDIA A100-SXM4-80GB") == "xla"
  with pytest.raises(ValueError, match="'pallas_gpu' is not available: jax 9.9 has no Pallas Triton; use backend="):
    reg.check_device("pallas_gpu", "gpu", H100)
