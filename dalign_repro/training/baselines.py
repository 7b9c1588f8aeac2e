"""Count-based baselines for next-token loss: the bigram (and unigram) model.

A trained LM that does not beat the bigram baseline on the same held-out tokens is a
failed run, not a data point.

Positions: for ``(n, T)`` sequences the baseline scores exactly the positions a causal
LM is trained and evaluated on -- token ``t`` of each sequence from token ``t - 1``, for
``t = 1..T-1`` (see :func:`dalign_repro.training.evaluation.evaluate_lm_loss`).  A 1-D stream is
treated as one long sequence.

The add-k estimate ``p(b | a) = (c(a, b) + k) / (c(a) + k V)`` uses counts ``c`` of the
pairs in the TRAIN tokens.  ``k="auto"`` picks k from a grid by the loss on the last
10% of the train sequences (counts from the first 90%), then refits on all train
tokens; the held-out tokens never choose k.  Counts are kept sparse (sorted pair codes),
so memory is O(number of train pairs), not O(V^2).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["bigram_pairs", "BigramModel", "bigram_heldout_loss", "unigram_heldout_loss", "K_GRID"]

K_GRID: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


def bigram_pairs(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prev, next)`` int64 pairs: within each row of a 2-D ``(n, T)`` tensor, or along a 1-D stream."""
    t = torch.as_tensor(tokens).to(torch.int64)
    if t.ndim == 1:
        return t[:-1], t[1:]
    if t.ndim == 2:
        return t[:, :-1].reshape(-1), t[:, 1:].reshape(-1)
    raise ValueError(f"tokens must be 1-D or 2-D, got shape {tuple(t.shape)}")


class BigramModel:
    """Add-k smoothed bigram counts over a vocabulary of ``vocab_size`` ids."""

    def __init__(self, train_tokens: torch.Tensor, vocab_size: int, k: float):
        if k <= 0:
            raise ValueError(f"k must be > 0 (add-k smoothing), got {k}")
        prev, nxt = bigram_pairs(train_tokens)
        _check_range(prev, nxt, vocab_size, "train_tokens")
        self.vocab_size, self.k = int(vocab_size), float(k)
        codes = prev * vocab_size + nxt
        self.codes, self.counts = torch.unique(codes, sorted=True, return_counts=True)
        self.row_totals = torch.bincount(prev, minlength=vocab_size).to(torch.float64)
        self.n_pairs = int(prev.numel())

    def pair_counts(self, prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        """``c(prev, next)`` for each pair (float64)."""
        q = prev.to(torch.int64) * self.vocab_size + nxt.to(torch.int64)
        if self.codes.numel() == 0:
            return torch.zeros(q.shape, dtype=torch.float64)
        pos = torch.searchsorted(self.codes, q).clamp(max=self.codes.numel() - 1)
        found = self.codes[pos] == q
        return torch.where(found, self.counts[pos].to(torch.float64), torch.zeros((), dtype=torch.float64))

    def log_prob(self, prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        """``log p(next | prev)`` for each pair (float64, natural log)."""
        num = self.pair_counts(prev, nxt) + self.k
        den = self.row_totals[prev] + self.k * self.vocab_size
        return torch.log(num) - torch.log(den)

    def loss(self, tokens: torch.Tensor) -> float:
        """Mean cross-entropy in nats over the pairs of ``tokens`` (same positions as an LM's loss)."""
        prev, nxt = bigram_pairs(tokens)
        _check_range(prev, nxt, self.vocab_size, "tokens")
        if prev.numel() == 0:
            raise ValueError("no token pairs to score")
        return float(-self.log_prob(prev, nxt).mean())


def _check_range(prev, nxt, vocab_size, name):
    if prev.numel() and (min(int(prev.min()), int(nxt.min())) < 0 or max(int(prev.max()), int(nxt.max())) >= vocab_size):
        raise ValueError(f"{name} has ids outside [0, {vocab_size})")


def _select_k(train_tokens: torch.Tensor, vocab_size: int, grid: Sequence[float]) -> float:
    t = torch.as_tensor(train_tokens)
    if t.ndim == 2 and t.shape[0] >= 10:
        cut = int(t.shape[0] * 0.9)
        fit, val = t[:cut], t[cut:]
    else:
        flat = t.reshape(-1)
        cut = int(flat.numel() * 0.9)
        fit, val = flat[:cut], flat[cut:]
    losses = {k: BigramModel(fit, vocab_size, k).loss(val) for k in grid}
    return min(losses, key=losses.get)


def bigram_heldout_loss(
    train_tokens: torch.Tensor,
    heldout_tokens: torch.Tensor,
    vocab_size: int,
    *,
    k: "float | str" = "auto",
    k_grid: Sequence[float] = K_GRID,
    return_k: bool = False,
):
    """Held-out cross-entropy (nats per predicted token) of the add-k bigram model.

    Args:
        train_tokens: ``(n, T)`` train sequences or a 1-D train stream (counts).
        heldout_tokens: ``(m, T)`` held-out sequences (or a stream) to score.
        vocab_size: the tokenizer's vocabulary size V.
        k: the add-k pseudo-count, or ``"auto"`` (chosen on a train-internal split).
        return_k: also return the k used.
    """
    if k == "auto":
        k = _select_k(train_tokens, vocab_size, k_grid)
    loss = BigramModel(train_tokens, vocab_size, float(k)).loss(heldout_tokens)
    return (loss, float(k)) if return_k else loss


def unigram_heldout_loss(train_tokens: torch.Tensor, heldout_tokens: torch.Tensor, vocab_size: int,
                         *, k: float = 1.0) -> float:
    """Held-out cross-entropy of add-k unigram frequencies, on the same positions (tokens 1..T-1)."""
    _, nxt_train = bigram_pairs(train_tokens)
    _, nxt = bigram_pairs(heldout_tokens)
    counts = torch.bincount(nxt_train, minlength=vocab_size).to(torch.float64) + k
    logp = torch.log(counts) - math.log(float(counts.sum()))
    return float(-logp[nxt].mean())
