"""The LLaMA family: width-controlled ``LlamaForCausalLM`` on a text corpus, and its depth and context regimes.

transformers' ``LlamaForCausalLM`` (:func:`dalign_repro.models.llama.build_llama`) with depth, head dimension,
context, vocabulary and data held fixed and only the width N (and so the number of heads) varied. The data, batches,
held-out loss and bigram baseline are every causal LM's (:class:`~dalign_repro.families.lm.CausalLMFamily`); the
insertion points are the decoder layers' outputs, ``model.layers.<i>``, the primary one ``insertion_layer``.

The config a LLaMA spec reads is the width chapter's (:class:`dalign_repro.experiments.llama_width.Config`, a
:class:`~dalign_repro.families.lm.LMSweepConfig` with ``depth``, ``head_dim``, ``insertion_layer`` and
``unit_contexts``) or one of its subclasses (the depth-4 and the context experiments').

Beside the sweep's tables, ``llama_sample_unit`` (:func:`sample_unit_rows`) shows how the choice of sample moves
d_align at the final checkpoint (first seed of each width, held-out pool, primary insertion point):

* ``sequence / shared``: one sample is one sequence, its q summed over positions, at contexts truncated to
  ``unit_contexts``;
* ``sequence / full``: every position kept (dimension T·N);
* ``token / shared``: one sample is one token's own next-token loss, at a position drawn uniformly in each pool
  sequence, so the ``pool_size`` token samples come from distinct sequences and are independent. (A position's
  slice of the *sequence* loss gradient would not be the token's own loss; tokens share a sequence's attention, so
  each needs its own backward pass, which one token per sequence gives in a batch.)
"""

from __future__ import annotations

from typing import Any

import torch

from dalign_core.capture.hooks import activation_gradients
from dalign_core.capture.losses import IGNORE_INDEX
from dalign_core.geometry.estimators import estimate_geometry
from dalign_repro.families.lm import CausalLMFamily
from dalign_repro.models.llama import LlamaWidthSpec, build_llama
from dalign_repro.sweep.family import Splits

__all__ = ["LlamaFamily", "LlamaDepthFamily", "LlamaContextFamily", "sample_unit_rows", "token_targets"]


class LlamaFamily(CausalLMFamily):
    """LLaMA-style causal LMs on a text corpus (see the module docstring)."""

    name = "llama"
    training_fields = ("depth", "head_dim") + CausalLMFamily.training_fields
    extra_tables = ("sample_unit",)
    layers = "model.layers"
    modules = ("transformers.models.llama.modeling_llama",)

    def build(self, config: Any, width: int, seed: int, splits: Splits):
        spec = LlamaWidthSpec(width=width, depth=config.depth, head_dim=config.head_dim,
                              vocab_size=splits.summary["vocab_size"], context=config.context)
        return build_llama(spec, seed=seed)

    def model_name(self, config: Any, width: int) -> str:
        return f"llama-N{width}-L{config.depth}"

    def extra_rows(self, config: Any, model, heldout_pool: torch.Tensor, run: dict) -> dict[str, list[dict]]:
        first_seed = run["seed"] == config.seed  # the study compares choices on one model; seeds would multiply its cost
        rows = sample_unit_rows(config, model, self.primary_layer(config), heldout_pool, run) if first_seed else []
        return {"sample_unit": rows}


class LlamaDepthFamily(LlamaFamily):
    """The LLaMA family with the depth as a regime column and no sample-unit study (the growth study's models)."""

    name = "llama_depth"
    extra_tables = ()

    def columns(self, config: Any) -> dict:
        return {"depth": config.depth}

    def extra_rows(self, config: Any, model, heldout_pool, run: dict) -> dict[str, list[dict]]:
        return {}  # the sample-unit study belongs to the width chapter


class LlamaContextFamily(LlamaFamily):
    """The LLaMA family with the context as a regime column (the context chapter's sweeps)."""

    name = "llama_context"
    extra_tables = ()

    def columns(self, config: Any) -> dict:
        return {"context": config.context}

    def model_name(self, config: Any, width: int) -> str:
        return f"llama-N{width}-L{config.depth}-T{config.context}"

    def extra_rows(self, config: Any, model, heldout_pool, run: dict) -> dict[str, list[dict]]:
        return {}  # the sample-unit study belongs to the width chapter


def token_targets(sequences: torch.Tensor, seed: int) -> torch.Tensor:
    """Labels ``(n, T)`` that keep one target per sequence of ``sequences`` ``(n, T)``, at a uniform position in
    1..T-1 drawn from ``seed`` (the rest ``IGNORE_INDEX``)."""
    n, length = sequences.shape
    positions = torch.randint(1, length, (n,), generator=torch.Generator().manual_seed(seed))
    labels = torch.full_like(sequences, IGNORE_INDEX)
    rows = torch.arange(n)
    labels[rows, positions] = sequences[rows, positions]
    return labels


def sample_unit_rows(config: Any, model, layer: str, sequences: torch.Tensor, run: dict) -> list[dict]:
    """d_align at ``layer`` for each (sample unit, context, reduction) on ``(n, T)`` sequences; see the module
    docstring. One row per (context of ``config.unit_contexts``, variant), stamped with ``run``'s identity."""
    rows = []
    checked = False  # the determinism self-check once per model: at its first capture
    for context in config.unit_contexts:
        truncated = sequences[:, :context]
        labels = token_targets(truncated, run["seed"])
        full, token = [], []
        for start in range(0, len(truncated), config.capture_batch):
            batch = truncated[start:start + config.capture_batch]
            full.append(activation_gradients(model, layer, {"input_ids": batch}, reduction="full",
                                             check_determinism=not checked))
            checked = True
            token.append(activation_gradients(model, layer, {"input_ids": batch},
                                              labels[start:start + config.capture_batch], reduction="shared",
                                              check_determinism=False))
        full = torch.cat(full)  # (n, context * N): the sequence loss's gradient at every position
        variants = {("sequence", "shared"): full.reshape(len(full), context, -1).sum(dim=1),
                    ("sequence", "full"): full, ("token", "shared"): torch.cat(token)}
        for (unit, reduction), Q in variants.items():
            geometry = estimate_geometry(Q, confidence=config.confidence)
            rows.append(dict(
                family="llama", model=run["model"], width=run["width"], seed=run["seed"], layer=layer, unit=unit,
                context=context, reduction=reduction, n=geometry.n, d=geometry.d, mean_sq=geometry.mean_sq,
                d_par=geometry.d_par, d_2=geometry.d_2, d_align=geometry.d_align,
                d_align_lo=geometry.intervals["d_align"].lo, d_align_hi=geometry.intervals["d_align"].hi,
                trained_ok=run["trained_ok"],
            ))
    return rows
