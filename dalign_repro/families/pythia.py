"""The Pythia family: transformers' ``GPTNeoXForCausalLM`` with Pythia's architecture at a width and depth.

:func:`dalign_repro.models.pythia.pythia_width_variant` keeps everything of the released ``architecture`` but width,
heads, depth and vocabulary (parallel attention and MLP, LayerNorm, rotary on a quarter of each head, FFN 4d, untied
embeddings); the data, batches, held-out loss and baseline are every causal LM's
(:class:`~dalign_repro.families.lm.CausalLMFamily`). The insertion points are ``gpt_neox.layers.<i>``; the depth is
a regime column, so the two depth regimes of the Pythia chapter concatenate into one experiment's tables.

The config a Pythia spec reads is the Pythia chapter's (:class:`dalign_repro.experiments.pythia_width.Config`, one
depth regime of it: ``architecture``, ``depth``, ``heads`` with ``heads_at(width)``, ``insertion_layer``).
"""

from __future__ import annotations

from typing import Any

from dalign_repro.families.lm import CausalLMFamily
from dalign_repro.models.pythia import build_pythia, pythia_width_variant
from dalign_repro.sweep.family import Splits

__all__ = ["PythiaFamily"]


class PythiaFamily(CausalLMFamily):
    """Pythia-architecture causal LMs at a width and depth (see the module docstring)."""

    name = "pythia"
    layers = "gpt_neox.layers"
    reductions = ("full", "shared")
    """The shared q at ``gpt_neox.layers.l`` is exactly the gradient of that layer's trained
    ``mlp.dense_4h_to_h.bias`` (:mod:`dalign_core.capture.redundancy`): width claims are judged on the per-position q."""
    training_fields = ("architecture", "depth", "heads") + CausalLMFamily.training_fields
    modules = ("transformers.models.gpt_neox.modeling_gpt_neox",)

    def build(self, config: Any, width: int, seed: int, splits: Splits):
        shape = pythia_width_variant(config.architecture, width, vocab_size=splits.summary["vocab_size"],
                                     num_heads=config.heads_at(width), context=config.context, num_layers=config.depth)
        return build_pythia(shape, seed=seed)

    def model_name(self, config: Any, width: int) -> str:
        return f"pythia-d{width}-L{config.depth}"

    def columns(self, config: Any) -> dict:
        return {"depth": config.depth}
