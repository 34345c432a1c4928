"""Shape-set expansion: model presets, group-size distributions, search space validity."""

import importlib
import logging
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import TritonConfig
from ragtune.candidates import search_space
from ragtune.lut import export
from ragtune.problems import shapes
from ragtune.problems.presets import MODEL_PRESETS
from ragtune.records import store


def test_model_preset_expands_up_and_down():
  spec = shapes.ShapeSet.model_validate(
    {"ops": ["fwd", "drhs"], "models": [{"model": "Mixtral-8x7B", "tokens": [16, 4096]}]}
  )
  probs = shapes.expand(spec)
  dims = {(p.op, p.m, p.k, p.n, p.g) for p in probs}
  assert ("fwd", 32, 4096, 14336, 8) in dims and ("fwd", 32, 14336, 4096, 8) in dims  # up, down; m = tokens*top_k
  assert ("drhs", 8192, 4096, 14336, 8) in dims and len(probs) == 2 * 2 * 2
  assert all(sum(p.group_sizes) == p.m for p in probs)


@pytest.mark.parametrize("dist", ["uniform", "multinomial", "zipf"])
def test_group_size_distributions(dist):
  d = shapes.GroupDist(dist=dist, seed=3, empty_fraction=0.25, fill=0.9)
  sizes = d.draw(1000, 16)
  assert sizes.dtype == np.int32 and len(sizes) == 16 and sizes.sum() == 900 and (sizes >= 0).all()
  assert np.array_equal(sizes, d.draw(1000, 16)), "seeded draws repeat"
  if dist == "zipf":
    assert (sizes == 0).sum() >= 4


def test_shipped_shape_files_load():
  files = sorted(Path("shapes").glob("*.yaml"))
  assert {"smoke", "moe", "decode", "gpu_slice", "anchors", "qwen3-30b-a3b-ep8"} <= {f.stem for f in files}
  for f in files:
    probs = shapes.expand(shapes.load_shape_set(f))
    assert probs, f
    swept = {p.backend for p in probs}
    # The GPU sets list every GPU backend (a device sweeps those that compile for it); smoke
    # (the CPU pipeline check) and decode Triton only; the fp8 sets the backends with fp8
    # kernels (and XLA beside them); the TPU's quantized sets pallas_tpu.
    gpu = {"pallas_gpu", "mosaic_gpu", "mosaic_blackwell"}
    expected = {
      "smoke": {"pallas_gpu"},
      "decode": {"pallas_gpu"},
      "fp8_smoke": {"pallas_gpu"},
      "fp8": {"pallas_gpu", "mosaic_gpu", "xla"},
      "fp8_train": {"pallas_gpu", "mosaic_gpu", "xla"},
      "tpu_quant": {"pallas_tpu", "xla"},
      "tpu_quant_smoke": {"pallas_tpu"},
    }
    assert swept == expected.get(f.stem, gpu), f
    assert all(p.dtype in kernels.registry.get(p.backend).dtypes for p in probs), f


def test_backend_lists_in_yaml_and_on_the_command_line(tmp_path):
  spec = shapes.ShapeSet.model_validate(
    {"backends": ["pallas_gpu", "mosaic_gpu"], "shapes": [{"m": 64, "k": 32, "n": 32, "g": 2}]}
  )
  assert [p.backend for p in shapes.expand(spec)] == ["pallas_gpu", "mosaic_gpu"]
  from typer.testing import CliRunner

  from ragtune.cli.app import app

  f = tmp_path / "one.yaml"
  f.write_text("backends: [pallas_gpu]\nshapes:\n  - {m: 64, k: 32, n: 32, g: 2}\n")
  r = CliRunner().invoke(app, ["plan", str(f), "-o", str(tmp_path / "res"), "--backend", "pallas_gpu,mosaic_gpu"])
  assert r.exit_code == 0, r.output
  assert "pallas_gpu" in r.output and "mosaic_gpu" in r.output and "2 problems" in r.output


def test_search_space_is_valid_and_default_first():
  p = shapes.Problem("fwd", "pallas_gpu", "bfloat16", 100, 72, 40, 4, "x", (25, 25, 25, 25))
  cands = search_space.candidates(p)
  assert len(cands) == len(set(cands)) > 10
  assert all(isinstance(c, TritonConfig) and c.fits("fwd", "bfloat16", 100, 72, 40) for c in cands)
  assert all(c.block_n <= 64 and c.block_k <= 128 for c in cands), "blocks clamp to the shape"
  assert search_space.candidates(p, 3) == cands[:3]
  tp = shapes.Problem("fwd", "pallas_tpu", "bfloat16", 512, 1024, 2048, 8, "x", (64,) * 8)
  assert all(c.tk <= 1024 and c.tn <= 2048 for c in search_space.candidates(tp))


def _expand(*models, **spec):
  return shapes.expand(shapes.ShapeSet.model_validate({"models": list(models), **spec}))


def test_tp_ep_and_fused_gate_up_make_one_ranks_problem():
  q = MODEL_PRESETS["qwen3-30b-a3b"]
  got = {
    p.source: (p.m, p.k, p.n, p.g)
    for p in _expand({"model": "qwen3-30b-a3b", "tokens": [4096, 1], "ep": 8, "tp": 2, "fused_gate_up": True})
  }
  # Up: gate and up fused (2 x intermediate), column-split over tp; down: row-split; 1/ep of experts and rows.
  assert got == {
    "qwen3-30b-a3b:gate_up:tokens=4096:ep=8:tp=2": (
      4096 * q.top_k // 8,
      q.hidden,
      2 * q.intermediate // 2,
      q.experts // 8,
    ),
    "qwen3-30b-a3b:down:tokens=4096:ep=8:tp=2": (4096 * q.top_k // 8, q.intermediate // 2, q.hidden, q.experts // 8),
    "qwen3-30b-a3b:gate_up:tokens=1:ep=8:tp=2": (1, q.hidden, q.intermediate, q.experts // 8),
    "qwen3-30b-a3b:down:tokens=1:ep=8:tp=2": (1, q.intermediate // 2, q.hidden, q.experts // 8),
  }
  mix = MODEL_PRESETS["mixtral-8x7b"]
  fused = {
    p.source: (p.m, p.k, p.n, p.g) for p in _expand({"model": "mixtral-8x7b", "tokens": [16], "fused_gate_up": True})
  }
  assert fused == {
    "mixtral-8x7b:gate_up:tokens=16": (16 * mix.top_k, mix.hidden, 2 * mix.intermediate, mix.experts),
    "mixtral-8x7b:down:tokens=16": (16 * mix.top_k, mix.intermediate, mix.hidden, mix.experts),
  }
  # A share of rows that is not whole rounds up: 1 token x top-2 over 8 ranks, 12 tokens x 2 / 8.
  rounded = _expand({"model": "mixtral-8x7b", "tokens": [1, 12], "ep": 8, "projections": ["up"]})
  assert [(p.m, p.g, sum(p.group_sizes)) for p in rounded] == [(1, 1, 1), (math.ceil(24 / 8), 1, 3)]


def test_an_explicit_layer_is_its_preset():
  pre = MODEL_PRESETS["deepseek-v3"]
  given = {"tokens": [64], "ep": 8, "group_sizes": {"dist": "zipf"}}
  explicit = _expand({"name": "DeepSeek-V3-copy", **pre._asdict(), **given})
  preset = _expand({"model": "deepseek-v3", **given})
  same = lambda probs: [(p.source.split(":", 1)[1], p.m, p.k, p.n, p.g, p.group_dist, p.group_sizes) for p in probs]
  assert same(explicit) == same(preset) and explicit[0].source.startswith("deepseek-v3-copy:up:")
  both = shapes.ShapeSet.model_validate({"models": [{"name": "mine", **pre._asdict(), **given}]})
  assert len(shapes.select(shapes.expand(both), models=["Mine"])) == 2, "--model picks an explicit layer by name"


@pytest.mark.parametrize("dist", ["uniform", "multinomial", "zipf"])
def test_an_ep_rank_draws_its_slice_of_the_routing(dist):
  d = shapes.GroupDist(dist=dist, seed=2, empty_fraction=0.5, fill=0.9)
  sizes, rank = d.draw_shard(100, 64, 8)
  assert sizes.dtype == np.int32 and len(sizes) == 8 and sizes.sum() == 90 and 0 <= rank < 8
  assert np.array_equal(d.draw_shard(1000, 16, 1)[0], d.draw(1000, 16)), "ep=1 is the plain draw"
  if dist == "zipf":
    assert (sizes == 0).any(), "the slice keeps the empty experts"
    # Steep routing: the rank that holds the hottest expert is the busiest, and its rows stay skewed.
    hot, _ = shapes.GroupDist(dist="zipf", alpha=3, empty_fraction=0).draw_shard(1000, 64, 8)
    assert hot.max() > 700
  else:
    assert rank == 0


def test_an_exported_ep_entry_is_exact_for_a_ranks_call(caplog):
  # The LUT a sweep of EP problems exports, and one rank's call: its rows, its g/ep experts'
  # weights, every group's sizes and its group_offset. The lookup must be exact.
  kind = jax.devices()[0].device_kind
  problems = _expand(
    {"model": "qwen3-30b-a3b", "tokens": [64], "ep": 8, "projections": ["up"]},
    {"name": "tiny", "hidden": 64, "intermediate": 32, "experts": 8, "top_k": 2, "tokens": [16], "ep": 4},
    backends=["pallas_gpu"],
  )
  dev = {"device_kind": kind, "platform": "cpu", "jax_version": jax.__version__}
  rows = []
  for p in problems:
    cfg = search_space.candidates(p, 1, device_kind=kind)[0]
    rows.append(store.make_row(p, store.candidate_id(cfg), cfg, "ok", interpret=False, device=dev, time_s=1e-3))
  (lut,) = export.build_luts(rows).values()
  kernels.lut.set_active_lut(lut)
  # What each rank holds, from the layers themselves: rows tokens*top_k/ep, experts/ep experts.
  q = MODEL_PRESETS["qwen3-30b-a3b"]
  fwd = kernels.explain(
    (64 * q.top_k // 8, q.hidden), (q.experts // 8, q.hidden, q.intermediate), "bfloat16", backend="pallas_gpu"
  )["fwd"]
  assert (fwd.backend, fwd.source) == ("pallas_gpu", "lut-exact"), fwd
  offset = 2 * (8 // 4)  # rank 2 of 4; any rank's call looks up the same local shape
  call = lambda lhs, rhs, gs: kernels.ragged_dot(lhs, rhs, gs, group_offset=offset, backend="pallas_gpu")
  importlib.import_module("kernels.ragged_dot")._logged.clear()
  with caplog.at_level(logging.DEBUG, logger="kernels"):
    jax.eval_shape(  # the decision, as a traced call makes it; the conformance suite checks its numbers
      call,
      jax.ShapeDtypeStruct((16 * 2 // 4, 64), jnp.bfloat16),
      jax.ShapeDtypeStruct((8 // 4, 64, 32), jnp.bfloat16),
      jax.ShapeDtypeStruct((8,), jnp.int32),  # every group's sizes
    )
  (line,) = [r.getMessage() for r in caplog.records if r.name == "kernels"]
  assert "fwd: pallas_gpu" in line and "<- lut-exact" in line.split(";")[0], line
