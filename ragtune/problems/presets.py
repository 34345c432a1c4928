"""Real MoE layer shapes: hidden k, expert intermediate n, routed experts g, top_k.

Each value is read from the model's public configuration (a Hugging Face model repo's
config.json unless noted); the config field names are given per model, as they differ.
"""

from typing import NamedTuple


class MoePreset(NamedTuple):
  hidden: int
  intermediate: int
  experts: int
  top_k: int


MODEL_PRESETS: dict[str, MoePreset] = {
  # mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size, intermediate_size,
  # num_local_experts, num_experts_per_tok.
  "mixtral-8x7b": MoePreset(4096, 14336, 8, 2),
  # mistralai/Mixtral-8x22B-v0.1 config.json: same fields.
  "mixtral-8x22b": MoePreset(6144, 16384, 8, 2),
  # deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size, moe_intermediate_size,
  # n_routed_experts, num_experts_per_tok (shared experts are a dense matmul, not here).
  "deepseek-v2-lite": MoePreset(2048, 1408, 64, 6),
  # deepseek-ai/DeepSeek-V3 config.json: same fields as DeepSeek-V2-Lite.
  "deepseek-v3": MoePreset(7168, 2048, 256, 8),
  # Qwen/Qwen3-30B-A3B config.json: hidden_size, moe_intermediate_size, num_experts,
  # num_experts_per_tok.
  "qwen3-30b-a3b": MoePreset(2048, 768, 128, 8),
  # Qwen/Qwen3-235B-A22B config.json: same fields.
  "qwen3-235b-a22b": MoePreset(4096, 1536, 128, 8),
  # meta-llama/Llama-4-Scout-17B-16E config.json, text_config: hidden_size,
  # intermediate_size (the experts'; intermediate_size_mlp is the dense layers'),
  # num_local_experts, num_experts_per_tok.
  "llama-4-scout": MoePreset(5120, 8192, 16, 1),
  # meta-llama/Llama-4-Maverick-17B-128E config.json, text_config: same fields.
  "llama-4-maverick": MoePreset(5120, 8192, 128, 1),
  # openai/gpt-oss-20b config.json: hidden_size, intermediate_size, num_local_experts,
  # num_experts_per_tok (also experts_per_token).
  "gpt-oss-20b": MoePreset(2880, 2880, 32, 4),
  # openai/gpt-oss-120b config.json: same fields.
  "gpt-oss-120b": MoePreset(2880, 2880, 128, 4),
  # allenai/OLMoE-1B-7B-0924 config.json: hidden_size, intermediate_size, num_experts,
  # num_experts_per_tok.
  "olmoe-1b-7b": MoePreset(2048, 1024, 64, 8),
  # databricks/dbrx-base config.json: d_model, ffn_config.ffn_hidden_size,
  # ffn_config.moe_num_experts, ffn_config.moe_top_k.
  "dbrx": MoePreset(6144, 10752, 16, 4),
  # GitHub xai-org/grok-1, run.py TransformerConfig: emb_size=48*128, widening_factor=8,
  # num_experts=8, num_selected_experts=2; model.py ffn_size() gives
  # int(8 * 6144) * 2 // 3 = 32768.
  "grok-1": MoePreset(6144, 32768, 8, 2),
}

# The format of a preset's released expert weights where it is not bfloat16 (common.FORMATS;
# a shape file's `dtype: shipped`).
SHIPPED_FORMATS: dict[str, str] = {
  # deepseek-ai/DeepSeek-V3 config.json quantization_config: quant_method fp8, fmt e4m3,
  # weight_block_size [128, 128], activation_scheme dynamic (1x128 activation blocks,
  # arXiv:2412.19437 section 3.3).
  "deepseek-v3": "float8_e4m3fn:block128",
}
