"""Causal language models in the width sweep: what the LLaMA and Pythia families share.

Both train on one text corpus split by whole documents into train, validation and
held-out test (:func:`dalign_repro.data.load_corpus`), tokenized by the project's BPE
tokenizer into sequences of ``context`` tokens. One sample is one sequence; its loss
is the mean next-token cross-entropy over the sequence, so q at a decoder layer is
the gradient of that loss with respect to the layer's output, summed over positions:
the gradient of a zero-initialized residual bias shared over positions (the
``shared`` reduction). A trained model must beat the add-k bigram model on the same
held-out tokens, or it is a failed run.

A family subclasses :class:`CausalLMFamily` and says only how to build its model at
a width and where its insertion points are (:mod:`dalign_repro.families.llama`,
:mod:`dalign_repro.families.pythia`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dalign_repro.training.baselines import bigram_heldout_loss
from dalign_repro.config import require
from dalign_repro.data import load_corpus, prepare_lm_data
from dalign_repro.sweep.family import Family, Splits, SweepConfig
from dalign_repro.training.evaluation import evaluate_lm_loss

__all__ = ["LMSweepConfig", "CausalLMFamily", "check_corpus"]


@dataclass(frozen=True)
class LMSweepConfig(SweepConfig):
    """The fields every language-model sweep adds: the text and how it is cut into samples."""

    context: int = 128
    """Tokens per sequence (one sample)."""
    vocab_size: int = 2048
    """Size of the BPE vocabulary trained on the corpus's train split."""
    corpus: str = "shakespeare"
    """``"shakespeare"`` (offline: 33 train, 4 validation and 5 held-out works, about 1.45M / 178k / 230k
    tokens at vocabulary 2048), ``"dir:/path"`` (a folder of .txt or .jsonl files) or ``"hf:<dataset>"``."""

    def __post_init__(self):
        super().__post_init__()
        check_corpus(self)


def check_corpus(config) -> None:
    """Refuse a ``dir:`` corpus whose folder does not exist (or an empty ``dir:``/``hf:`` name) before any work;
    other names are checked by :func:`dalign_repro.data.load_corpus` when the data is loaded."""
    kind, sep, rest = str(config.corpus).partition(":")
    if not sep or kind not in ("dir", "hf"):
        return
    require(config, "corpus", bool(rest.strip()),
            f"'{kind}:' needs a {'folder' if kind == 'dir' else 'data set'} after it, e.g. "
            + ("dir:/path/to/folder" if kind == "dir" else "hf:<owner>/<dataset>"))
    if kind == "dir":
        folder = Path(rest).expanduser()
        require(config, "corpus", folder.is_dir(),
                f"the folder {str(folder)!r} does not exist or is not a folder; give a folder of .txt or .jsonl files")


class CausalLMFamily(Family):
    """Data, batches, held-out loss and baseline of a causal LM sweep (see the module docstring)."""

    training_fields = ("context", "vocab_size", "corpus")
    layers: str = ""
    """The dotted path of the model's decoder layers (``"model.layers"``): layer ``i`` is an insertion point."""

    def insertion_points(self, config: LMSweepConfig, model) -> list[str]:
        return [f"{self.layers}.{i}" for i in range(config.depth)]

    def primary_layer(self, config: LMSweepConfig) -> str:
        return f"{self.layers}.{config.insertion_layer}"

    def load_data(self, config: LMSweepConfig) -> Splits:
        data = prepare_lm_data(load_corpus(config.corpus), vocab_size=config.vocab_size, seq_len=config.context)
        return Splits(train=data.train, validation=data.validation, test=data.test,
                      unit=f"sequences of {config.context} tokens", summary=data.summary())

    def batches(self, examples: torch.Tensor, batch_size: int) -> list:
        return [{"input_ids": examples[i:i + batch_size]} for i in range(0, len(examples), batch_size)]

    def heldout_metric(self, model, examples: torch.Tensor, config: LMSweepConfig) -> float:
        return evaluate_lm_loss(model, examples, batch_size=config.capture_batch, autocast_dtype=config.autocast_dtype)

    def baseline(self, splits: Splits, examples: torch.Tensor, config: LMSweepConfig) -> float:
        return bigram_heldout_loss(splits.train, examples, splits.summary["vocab_size"])
