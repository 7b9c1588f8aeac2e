"""LLaMA-style decoder at a chosen width (transformers ``LlamaForCausalLM``).

Held fixed across widths: depth, head dimension (so the number of heads grows with
width, ``n_heads = width / head_dim``), context length, vocabulary, RMSNorm, rotary
positions, SwiGLU FFN of width ``ffn_ratio * width`` rounded up to a multiple of
``ffn_multiple`` (LLaMA's 8/3 ratio, which keeps the FFN's parameter count at 8 N^2 like
a 4N GELU MLP), untied input and output embeddings, no biases, dropout 0, and the
transformers default initialization (normal, std ``initializer_range`` = 0.02 for all
widths, i.e. standard parameterization, not muP).

Attention is ``"sdpa"`` by default: on the CPU it is deterministic and gives bitwise
identical results from run to run with the same thread count; ``"eager"`` is the
reference implementation (slower; use it when a hook needs attention probabilities).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model chain takes seconds to import: a process that builds none skips it
    from transformers import LlamaConfig, LlamaForCausalLM

__all__ = ["LlamaWidthSpec", "ffn_width", "llama_config", "build_llama", "count_parameters"]


def ffn_width(width: int, ratio: float = 8 / 3, multiple: int = 32) -> int:
    """SwiGLU hidden width: ``ratio * width`` rounded up to a multiple of ``multiple``."""
    return int(multiple * math.ceil(ratio * width / multiple))


@dataclass(frozen=True)
class LlamaWidthSpec:
    """Architecture of one width-controlled model; every field but ``width`` is shared."""

    width: int
    depth: int = 4
    head_dim: int = 32
    vocab_size: int = 4096
    context: int = 128
    ffn_ratio: float = 8 / 3
    ffn_multiple: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    attn_implementation: str = "sdpa"

    def __post_init__(self):
        if self.width % self.head_dim:
            raise ValueError(f"width {self.width} is not a multiple of head_dim {self.head_dim}")
        for name in ("width", "depth", "head_dim", "vocab_size", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def n_heads(self) -> int:
        return self.width // self.head_dim

    @property
    def ffn_width(self) -> int:
        return ffn_width(self.width, self.ffn_ratio, self.ffn_multiple)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(n_heads=self.n_heads, ffn_width=self.ffn_width)
        return d


def llama_config(spec: LlamaWidthSpec) -> LlamaConfig:
    """The transformers config for ``spec`` (bos/eos/pad ids are irrelevant here and left unset)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.width,
        intermediate_size=spec.ffn_width,
        num_hidden_layers=spec.depth,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_heads,
        head_dim=spec.head_dim,
        hidden_act="silu",
        max_position_embeddings=spec.context,
        rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=spec.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = spec.attn_implementation
    return config


def build_llama(
    spec: "LlamaWidthSpec | int",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: "str | torch.device" = "cpu",
    **spec_fields,
) -> LlamaForCausalLM:
    """A freshly initialized model; the same ``(spec, seed)`` gives the same weights.

    ``spec`` is a :class:`LlamaWidthSpec` or a width, in which case ``spec_fields``
    (depth, head_dim, vocab_size, context, ...) complete it::

        build_llama(128, depth=4, head_dim=32, vocab_size=4096, context=128, seed=0)

    The global torch RNG is left as it was.
    """
    if not isinstance(spec, LlamaWidthSpec):
        spec = LlamaWidthSpec(width=int(spec), **spec_fields)
    elif spec_fields:
        raise TypeError("pass either a LlamaWidthSpec or a width with fields, not both")
    from transformers import LlamaForCausalLM

    config = llama_config(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model.to(device=device, dtype=dtype).train()


def count_parameters(model: torch.nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Number of parameters (optionally without the input embedding and the LM head)."""
    total = sum(p.numel() for p in model.parameters())
    if exclude_embeddings:
        total -= model.get_input_embeddings().weight.numel()
        head = model.get_output_embeddings()
        if head is not None and head.weight is not model.get_input_embeddings().weight:
            total -= head.weight.numel()
    return total
