"""The Pythia suite's GPT-NeoX architectures, and width variants of them (transformers ``GPTNeoXForCausalLM``).

:func:`pythia_config` gives the released models' architectures exactly (the parameter
counts match the suite's published totals, :data:`PUBLISHED_PARAMETERS`). Shared by
all of them: untied input and output embeddings, LayerNorm (eps 1e-5) before
attention and MLP, parallel attention + MLP (``x + attn(ln1(x)) + mlp(ln2(x))``),
rotary positions on 25% of each head's dimensions (base 10000), attention and MLP
biases, a GELU MLP of width 4d, context 2048, and the GPT-NeoX-20B tokenizer's 50,277
tokens padded to 50,304 embedding rows -- except pythia-6.9b, whose released
checkpoint pads to 50,432 (its published total counts those 128 extra rows, in the
input and output embeddings: 2 * 128 * 4096 = 1,048,576 parameters).

Two depth regimes the paper compares within: 6 layers (14m d=128, 31m d=256,
70m d=512; head dimension 32, 32, 64) and 32 layers (2.8b d=2560, 6.9b d=4096;
head dimension 80, 128).

:func:`pythia_width_variant` keeps everything of a named model but the width (and so
the MLP width 4N) and, as asked, the vocabulary, heads, context and depth. By default
the head dimension is held fixed, so the number of heads grows with width.

Models are built with dropout 0 (so per-example gradients may be captured in either
mode) and ``"sdpa"`` attention, deterministic on the CPU for a fixed thread count.
Initialization is Pythia's own (the GPT-NeoX library's ``small_init`` and
``wang_init``, :func:`pythia_init`): normal with std ``sqrt(2 / (5 d))`` for the
embeddings and every weight matrix, except the two that write into the residual
stream (attention's output ``dense`` and the MLP's ``dense_4h_to_h``), whose std is
``2 / (L sqrt(d))``; biases 0, LayerNorms 1 and 0. transformers' default (std 0.02 at
every width) is far smaller than this at small d and trains a narrow model slowly;
``init="transformers"`` keeps it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model chain takes seconds to import: a process that builds none skips it
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

__all__ = ["PYTHIA_NAMES", "PUBLISHED_PARAMETERS", "ROTARY_PCT", "pythia_config", "pythia_width_variant",
           "build_pythia", "pythia_init", "count_parameters", "head_dim", "rotary_dims"]

PYTHIA_NAMES = ("pythia-14m", "pythia-31m", "pythia-70m", "pythia-160m", "pythia-2.8b", "pythia-6.9b")

# name: (width d, layers, heads, embedding rows)
_ARCHITECTURES = {
    "pythia-14m": (128, 6, 4, 50304),
    "pythia-31m": (256, 6, 8, 50304),
    "pythia-70m": (512, 6, 8, 50304),
    "pythia-160m": (768, 12, 12, 50304),
    "pythia-2.8b": (2560, 32, 32, 50304),
    "pythia-6.9b": (4096, 32, 32, 50432),
}

PUBLISHED_PARAMETERS = {
    "pythia-14m": 14_067_712,
    "pythia-31m": 30_494_720,
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
}
"""Total parameters, embeddings included, as the Pythia suite publishes them (model cards, paper table)."""

ROTARY_PCT = 0.25
ROTARY_BASE = 10000.0
CONTEXT = 2048


def _config(width: int, layers: int, heads: int, vocab_size: int, context: int) -> GPTNeoXConfig:
    from transformers import GPTNeoXConfig

    config = GPTNeoXConfig(
        vocab_size=vocab_size, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * width, hidden_act="gelu", rotary_pct=ROTARY_PCT, rotary_emb_base=ROTARY_BASE,
        max_position_embeddings=context, layer_norm_eps=1e-5, initializer_range=0.02, use_parallel_residual=True,
        attention_bias=True, tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
        classifier_dropout=0.0, use_cache=False, bos_token_id=0, eos_token_id=0,
    )
    config._attn_implementation = "sdpa"
    return config


def pythia_config(name: str) -> GPTNeoXConfig:
    """The architecture of the released ``name`` (one of :data:`PYTHIA_NAMES`), with dropout 0 and no KV cache."""
    if name not in _ARCHITECTURES:
        raise ValueError(f"unknown Pythia model {name!r}; choose one of {', '.join(PYTHIA_NAMES)}")
    width, layers, heads, vocab = _ARCHITECTURES[name]
    return _config(width, layers, heads, vocab, CONTEXT)


def head_dim(config: GPTNeoXConfig) -> int:
    """Dimensions per attention head, ``hidden_size / num_attention_heads``."""
    return config.hidden_size // config.num_attention_heads


def rotary_dims(head_dimension: int, pct: float = ROTARY_PCT) -> int:
    """How many of a head's dimensions get rotary positions: ``int(head_dim * pct)``, as GPT-NeoX computes it."""
    return int(head_dimension * pct)


def _valid_heads(width: int) -> list[int]:
    return [h for h in range(1, width + 1)
            if width % h == 0 and rotary_dims(width // h) >= 2 and rotary_dims(width // h) % 2 == 0]


def pythia_width_variant(name: str, width: int, *, vocab_size: int, num_heads: int | None = None,
                         context: int | None = None, num_layers: int | None = None) -> GPTNeoXConfig:
    """``name``'s architecture at hidden size ``width`` (MLP width ``4 * width``) and vocabulary ``vocab_size``.

    ``num_heads`` defaults to ``width / head_dim`` of the named model (head dimension
    held fixed); ``context`` (max positions) and ``num_layers`` default to the named
    model's. The head dimension must leave an even number >= 2 of rotary dimensions
    (``int(head_dim / 4)``), i.e. head_dim >= 8.
    """
    base = pythia_config(name)
    if width < 1 or vocab_size < 1:
        raise ValueError(f"width and vocab_size must be >= 1, got width={width}, vocab_size={vocab_size}")
    if num_heads is None:
        if width % head_dim(base):
            raise ValueError(
                f"width {width} is not a multiple of {name}'s head dimension {head_dim(base)}; pick a width that "
                f"is, or pass num_heads (one of {_valid_heads(width) or 'none: no head count works'})")
        num_heads = width // head_dim(base)
    if num_heads < 1 or width % num_heads:
        raise ValueError(f"width {width} is not divisible by num_heads={num_heads}; "
                         f"use one of {_valid_heads(width) or 'none: no head count works'}")
    rotary = rotary_dims(width // num_heads)
    if rotary < 2 or rotary % 2:
        raise ValueError(
            f"{num_heads} heads of dimension {width // num_heads} give {rotary} rotary dimensions "
            f"(int({width // num_heads} * {ROTARY_PCT})); rotary needs an even number >= 2: use num_heads in "
            f"{_valid_heads(width) or 'none: the width is too small for rotary heads'}")
    layers = base.num_hidden_layers if num_layers is None else int(num_layers)
    context = base.max_position_embeddings if context is None else int(context)
    if layers < 1 or context < 2:
        raise ValueError(f"num_layers must be >= 1 and context >= 2, got {layers} and {context}")
    return _config(width, layers, num_heads, vocab_size, context)


_RESIDUAL_WRITERS = ("attention.dense.weight", "mlp.dense_4h_to_h.weight")


@torch.no_grad()
def pythia_init(model: GPTNeoXForCausalLM, generator: torch.Generator | None = None) -> GPTNeoXForCausalLM:
    """Re-initialize ``model`` in place as Pythia was (see the module docstring); returns it."""
    width, layers = model.config.hidden_size, model.config.num_hidden_layers
    small, wang = (2 / (5 * width)) ** 0.5, 2 / (layers * width ** 0.5)
    for name, parameter in model.named_parameters():
        if parameter.ndim >= 2:
            std = wang if name.endswith(_RESIDUAL_WRITERS) else small
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
        elif "norm" in name:  # input_layernorm, post_attention_layernorm, final_layer_norm
            parameter.fill_(1.0 if name.endswith("weight") else 0.0)
        else:
            parameter.zero_()
    return model


def build_pythia(config: GPTNeoXConfig, seed: int = 0, init: str = "pythia") -> GPTNeoXForCausalLM:
    """A freshly initialized float32 model on the CPU; the same ``(config, seed)`` gives the same weights.

    ``init``: ``"pythia"`` (small_init and wang_init, :func:`pythia_init`) or
    ``"transformers"`` (normal, std 0.02). Dropout is forced to 0 and attention to
    ``"sdpa"`` on a copy of ``config``. The model is returned in training mode
    (dropout-free, so capture works in either mode); the global torch RNG is left as it was.
    """
    if init not in ("pythia", "transformers"):
        raise ValueError(f"init must be 'pythia' or 'transformers', got {init!r}")
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig.from_dict(config.to_dict())
    config.attention_dropout = config.hidden_dropout = config.classifier_dropout = 0.0
    config.use_cache = False
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTNeoXForCausalLM(config)
    if init == "pythia":
        pythia_init(model, torch.Generator().manual_seed(seed))
    return model.to(dtype=torch.float32).train()


def count_parameters(config: GPTNeoXConfig) -> int:
    """Total parameters (embeddings and LM head included) of ``config``'s model, built on the meta device."""
    from transformers import GPTNeoXForCausalLM

    with torch.device("meta"):
        model = GPTNeoXForCausalLM(config)
    return sum(p.numel() for p in model.parameters())
