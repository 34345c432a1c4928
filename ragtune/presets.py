"""Real MoE layer shapes (hidden k, expert intermediate n, experts g, top_k).

Source: the public model configs as summarised in shared/ANCHORS.md.
"""

from typing import NamedTuple


class MoePreset(NamedTuple):
  hidden: int
  intermediate: int
  experts: int
  top_k: int


MODEL_PRESETS: dict[str, MoePreset] = {
    "mixtral-8x7b": MoePreset(4096, 14336, 8, 2),
    "mixtral-8x22b": MoePreset(6144, 16384, 8, 2),
    "deepseek-v2-lite": MoePreset(2048, 1408, 64, 6),
    "deepseek-v3": MoePreset(7168, 2048, 256, 8),
    "qwen3-30b-a3b": MoePreset(2048, 768, 128, 8),
    "qwen3-235b-a22b": MoePreset(4096, 1536, 128, 8),
    "llama-4-scout": MoePreset(5120, 8192, 16, 1),
    "llama-4-maverick": MoePreset(5120, 8192, 128, 1),
    "gpt-oss-20b": MoePreset(2880, 2880, 32, 4),
    "gpt-oss-120b": MoePreset(2880, 2880, 128, 4),
    "olmoe-1b-7b": MoePreset(2048, 1024, 64, 8),
    "dbrx": MoePreset(6144, 10752, 16, 4),
    "grok-1": MoePreset(6144, 32768, 8, 2),
}
