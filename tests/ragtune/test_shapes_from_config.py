"""`ragtune shapes from-config`: a Hugging Face config.json of each family -> the preset's shapes."""

import json

import pytest
from typer.testing import CliRunner

from ragtune.cli.app import app
from ragtune.problems import hf_config, shapes
from ragtune.problems.presets import MODEL_PRESETS

runner = CliRunner()

# Each family's config.json fields (ragtune/problems/presets.py cites them), filled in with the preset's
# values. The "decoy" fields are the dense layers' widths these configs also carry; their values
# here are made up, to show that they are not read.
CONFIGS = {
  "mixtral-8x7b": lambda p: {
    "model_type": "mixtral",
    "hidden_size": p.hidden,
    "intermediate_size": p.intermediate,
    "num_local_experts": p.experts,
    "num_experts_per_tok": p.top_k,
  },
  "deepseek-v3": lambda p: {
    "model_type": "deepseek_v3",
    "hidden_size": p.hidden,
    "intermediate_size": 3 * p.intermediate,  # decoy
    "moe_intermediate_size": p.intermediate,
    "n_routed_experts": p.experts,
    "n_shared_experts": 1,
    "num_experts_per_tok": p.top_k,
  },
  "qwen3-30b-a3b": lambda p: {
    "model_type": "qwen3_moe",
    "hidden_size": p.hidden,
    "intermediate_size": 3 * p.intermediate,  # decoy
    "moe_intermediate_size": p.intermediate,
    "num_experts": p.experts,
    "num_experts_per_tok": p.top_k,
  },
  "llama-4-scout": lambda p: {
    "model_type": "llama4",
    "text_config": {
      "hidden_size": p.hidden,
      "intermediate_size": p.intermediate,
      "intermediate_size_mlp": 2 * p.intermediate,  # decoy
      "num_local_experts": p.experts,
      "num_experts_per_tok": p.top_k,
    },
    "vision_config": {"hidden_size": 3 * p.hidden, "intermediate_size": 3 * p.intermediate},  # decoy
  },
  "gpt-oss-20b": lambda p: {
    "model_type": "gpt_oss",
    "hidden_size": p.hidden,
    "intermediate_size": p.intermediate,
    "num_local_experts": p.experts,
    "experts_per_token": p.top_k,
  },
  "olmoe-1b-7b": lambda p: {
    "model_type": "olmoe",
    "hidden_size": p.hidden,
    "intermediate_size": p.intermediate,
    "num_experts": p.experts,
    "num_experts_per_tok": p.top_k,
  },
  "dbrx": lambda p: {
    "model_type": "dbrx",
    "d_model": p.hidden,
    "ffn_config": {"ffn_hidden_size": p.intermediate, "moe_num_experts": p.experts, "moe_top_k": p.top_k},
  },
}


def _config(tmp_path, preset: str):
  folder = tmp_path / preset
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps(CONFIGS[preset](MODEL_PRESETS[preset])))
  return folder / "config.json"


def _problems(spec: dict | shapes.ShapeSet):
  spec = spec if isinstance(spec, shapes.ShapeSet) else shapes.ShapeSet.model_validate(spec)
  return [(p.source.split(":", 1)[1], p.op, p.dtype, p.m, p.k, p.n, p.g, p.group_sizes) for p in shapes.expand(spec)]


@pytest.mark.parametrize("preset", list(CONFIGS))
def test_a_config_gives_its_presets_shapes(tmp_path, preset):
  out = tmp_path / "out" / "model.yaml"
  r = runner.invoke(app, ["shapes", "from-config", str(_config(tmp_path, preset)), "-o", str(out)])
  assert r.exit_code == 0, r.output
  written = shapes.load_shape_set(out)
  assert written.models[0].name == preset, "named after the config's folder"
  assert _problems(written) == _problems({"models": [{"model": preset, "tokens": [16, 4096]}]})


def test_layouts_and_options_pass_through(tmp_path):
  config = _config(tmp_path, "qwen3-30b-a3b")
  args = ["--tokens", "64,8192", "--ep", "8", "--tp", "2", "--fused-gate-up", "--dtype", "float16", "--name", "Q3"]
  r = runner.invoke(app, ["shapes", "from-config", str(config), *args])  # no -o: the file on stdout
  assert r.exit_code == 0, r.output
  (tmp_path / "printed.yaml").write_text(r.stdout)
  written = shapes.load_shape_set(tmp_path / "printed.yaml")
  layout = {"tokens": [64, 8192], "ep": 8, "tp": 2, "fused_gate_up": True}
  assert _problems(written) == _problems({"dtype": "float16", "models": [{"model": "qwen3-30b-a3b", **layout}]})
  assert r.stdout.splitlines()[1].startswith(
    f"# From {config}: hidden_size 2048, moe_intermediate_size 768, num_experts 128,"
  )
  assert sorted(p.name for p in tmp_path.iterdir()) == ["printed.yaml", "qwen3-30b-a3b"], "nothing else written"


def test_default_name_of_a_hub_cache_snapshot(tmp_path):
  snapshot = tmp_path / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / ("0" * 40)
  assert hf_config.default_name(snapshot / "config.json") == "qwen3-30b-a3b"
  assert hf_config.default_name(tmp_path / "Mixtral 8x7B" / "config.json") == "mixtral-8x7b"
  assert hf_config.default_name(tmp_path / "dbrx-base.json") == "dbrx-base"
