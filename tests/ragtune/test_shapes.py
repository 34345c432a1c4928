"""Shape-set expansion: model presets, group-size distributions, search space validity."""

import numpy as np
import pytest

from kernels import TritonConfig
from ragtune import search_space, shapes


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
  for name in ("smoke", "moe", "decode", "gpu_slice"):
    probs = shapes.expand(shapes.load_shape_set(f"shapes/{name}.yaml"))
    assert probs, name
    swept = {p.backend for p in probs}
    # moe and gpu_slice sweep both GPU backends; smoke (the CPU pipeline check) Triton only.
    assert swept == ({"pallas_gpu", "mosaic_gpu"} if name in ("moe", "gpu_slice") else {"pallas_gpu"}), name


def test_backend_lists_in_yaml_and_on_the_command_line(tmp_path):
  spec = shapes.ShapeSet.model_validate(
    {"backends": ["pallas_gpu", "mosaic_gpu"], "shapes": [{"m": 64, "k": 32, "n": 32, "g": 2}]}
  )
  assert [p.backend for p in shapes.expand(spec)] == ["pallas_gpu", "mosaic_gpu"]
  from typer.testing import CliRunner

  from ragtune.cli import app

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
