"""Models with width as a parameter."""

from dalign_core.models.llama import LlamaWidthSpec, build_llama, count_parameters, ffn_width, llama_config

__all__ = ["LlamaWidthSpec", "build_llama", "count_parameters", "ffn_width", "llama_config"]
