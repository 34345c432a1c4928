"""A Hugging Face model's config.json -> a shape file for its MoE layers (`ragtune shapes from-config`).

The file is read locally; nothing is downloaded. Families name the four numbers of a MoE
layer differently; FIELDS lists, per number, the config fields that hold it, and the first
one present wins. The fields of each family (its public config.json on the Hugging Face Hub):
  Mixtral (mistralai/Mixtral-8x7B-v0.1): hidden_size, intermediate_size, num_local_experts,
    num_experts_per_tok;
  DeepSeek-V2/V3 (deepseek-ai/DeepSeek-V3): hidden_size, moe_intermediate_size,
    n_routed_experts, num_experts_per_tok (intermediate_size is the dense layers' width);
  Qwen2-MoE/Qwen3-MoE (Qwen/Qwen3-30B-A3B): hidden_size, moe_intermediate_size, num_experts,
    num_experts_per_tok (intermediate_size is the dense layers');
  Llama-4 (meta-llama/Llama-4-Scout-17B-16E): Mixtral's fields under text_config
    (intermediate_size_mlp is the dense layers');
  gpt-oss (openai/gpt-oss-20b): Mixtral's fields (also experts_per_token);
  OLMoE (allenai/OLMoE-1B-7B-0924): hidden_size, intermediate_size, num_experts,
    num_experts_per_tok;
  DBRX (databricks/dbrx-base): d_model, ffn_config.ffn_hidden_size,
    ffn_config.moe_num_experts, ffn_config.moe_top_k.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import yaml

from ragtune import filekind
from ragtune.errors import RagtuneError
from ragtune.filekind import FROM_CONFIG_MARK
from ragtune.problems import shapes
from ragtune.problems.presets import MoePreset

# Per MoePreset field, the config fields that hold it, tried in order: the experts' own width
# (moe_intermediate_size) before intermediate_size, which is the dense layers' where both exist.
FIELDS: dict[str, tuple[str, ...]] = {
  "hidden": ("hidden_size", "d_model"),
  "intermediate": ("moe_intermediate_size", "ffn_config.ffn_hidden_size", "intermediate_size"),
  "experts": ("n_routed_experts", "num_local_experts", "num_experts", "ffn_config.moe_num_experts"),
  "top_k": ("num_experts_per_tok", "experts_per_token", "ffn_config.moe_top_k"),
}
NESTED = "text_config"  # multimodal configs (Llama-4) keep the language model's fields here


@dataclasses.dataclass(frozen=True)
class ConfigLayer:
  """A config's MoE layer and, per MoePreset field, the config field it was read from; its
  weights' format from quantization_config (`weights`), and what that config said (`quant`,
  "" when it has none)."""

  layer: MoePreset
  fields: dict[str, str]
  weights: str = "bfloat16"
  quant: str = ""


def _weights_format(path: Path, q: Any) -> tuple[str, str]:
  """(format, what the config said) of a quantization_config, as transformers writes them:
  quant_method "fp8" with weight_block_size [128, 128] (DeepSeek-V3, Qwen3 FP8 releases) is
  float8_e4m3fn with block scales; "fbgemm_fp8" (per-channel weights, per-token dynamic
  activations: Llama-4 Maverick FP8) is channelwise. Any other method or block is not a
  format ragtune tunes: bfloat16, and the text says why."""
  if q is None:
    return "bfloat16", ""
  if not isinstance(q, dict):
    raise RagtuneError(f"{path}: quantization_config: expected an object, got {type(q).__name__}")
  method = q.get("quant_method")
  said = f"quant_method {method}" + (
    f", weight_block_size {q['weight_block_size']}" if "weight_block_size" in q else ""
  )
  if method == "fp8" and q.get("fmt", "e4m3") == "e4m3":
    block = q.get("weight_block_size")
    if block is None:
      return "bfloat16", said + " (per-tensor scales: not a scheme ragtune tunes; tuned as bfloat16)"
    if not isinstance(block, list):
      raise RagtuneError(f"{path}: quantization_config.weight_block_size: expected a list, got {block!r}")
    if block == [128, 128]:
      return "float8_e4m3fn:block128", said
    return "bfloat16", said + " (ragtune tunes 128x128 blocks only; tuned as bfloat16)"
  if method == "fbgemm_fp8":
    return "float8_e4m3fn:channelwise", said
  return "bfloat16", said + " (not a format ragtune tunes; tuned as bfloat16)"


def _lookup(config: dict[str, Any], dotted: str) -> Any:
  value: Any = config
  for part in dotted.split("."):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return value


def read_layer(path: Path) -> ConfigLayer:
  """The MoE layer of the config.json at `path`; errors name the file and the field (or what
  else the file is: a shape file, a LUT, a records file)."""
  filekind.check_input(Path(path), {filekind.Kind.HF_CONFIG}, "a model's config.json")
  try:
    config = json.loads(Path(path).read_text())
  except FileNotFoundError:
    raise RagtuneError(f"{path}: no such config file") from None
  except OSError as e:
    raise RagtuneError(f"{path}: cannot read ({e.strerror or e})") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RagtuneError(f"{path}: not a JSON file ({e})") from None
  if not isinstance(config, dict):
    raise RagtuneError(f"{path}: expected a JSON object (a model's config.json), got {type(config).__name__}")
  prefix = f"{NESTED}." if isinstance(config.get(NESTED), dict) else ""
  root = config[NESTED] if prefix else config
  values, fields = {}, {}
  for key, names in FIELDS.items():
    name = next((n for n in names if _lookup(root, n) is not None), None)
    if name is None:
      continue
    value = _lookup(root, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise RagtuneError(f"{path}: {prefix}{name}: expected a positive integer, got {value!r}")
    values[key], fields[key] = value, prefix + name
  missing = [key for key in FIELDS if key not in values]
  if missing:
    looked = "; ".join(f"{key}: {', '.join(prefix + n for n in FIELDS[key])}" for key in missing)
    raise RagtuneError(f"{path}: no MoE layer found (a dense model?); looked for {looked}")
  weights, quant = ("bfloat16", "")
  if "quantization_config" in config or "quantization_config" in root:
    weights, quant = _weights_format(path, root.get("quantization_config", config.get("quantization_config")))
  return ConfigLayer(MoePreset(**values), fields, weights, quant)


def default_name(path: Path) -> str:
  """The model's name from where its config lies: the file's own name unless it is config.json,
  else the folder holding it, or in a Hugging Face cache (models--ORG--NAME/snapshots/COMMIT/)
  the repository's name."""
  path = Path(path).resolve()
  repo = path.parent.parent.parent.name
  if path.name != "config.json":
    name = path.stem
  elif path.parent.parent.name == "snapshots" and repo.startswith("models--"):
    name = repo.split("--")[-1]
  else:
    name = path.parent.name
  return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._").lower() or "model"


def shape_file(
  path: Path,
  *,
  tokens: list[int],
  ep: int = 1,
  tp: int = 1,
  fused_gate_up: bool = False,
  dtype: str | None = None,
  name: str | None = None,
) -> str:
  """The text of a shape file with one explicit `models:` entry for the config's MoE layer;
  checked as a shape file is, and errors name the config file and the key. dtype None: the
  format of the config's quantization_config (forward only), else bfloat16."""
  found = read_layer(path)
  name = name or default_name(path)
  entry = {"name": name, **found.layer._asdict(), "tokens": tokens, "ep": ep, "tp": tp, "fused_gate_up": fused_gate_up}
  element, _, scales = (dtype or found.weights).partition(":")
  data: dict[str, Any] = {"name": name, "dtype": element}
  if scales:  # quantized operands are tuned forward only
    data.update(scales=scales, ops=["fwd"])
  data["models"] = [entry]
  # A rule broken names what the user gave: the config's field, or the option.
  given = lambda loc: (
    found.fields.get(loc[-1]) or "--" + {"scales": "dtype"}.get(loc[-1], str(loc[-1])).replace("_", "-")
  )
  shapes.validate(data, lambda loc: f"{path}: {given(loc)}")
  read = ", ".join(f"{field} {getattr(found.layer, key)}" for key, field in found.fields.items())
  if found.quant:
    read += f"; quantization_config: {found.quant}"
  head = f"{FROM_CONFIG_MARK}\n# From {path}: {read}.\n"
  return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
