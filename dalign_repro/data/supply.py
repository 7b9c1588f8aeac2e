"""Can the data supply what an experiment asks for?  Checked before anything trains.

An experiment asks its data for a number of sequences per split: q pools of
``pool_size`` sequences from the train and held-out splits, ``eval_sequences`` for the
held-out loss, validation sequences for choosing the learning rate, and
``steps * batch_size`` training sequences.  Tensor slicing never complains:
``data.test[:1024]`` of a split with 746 sequences quietly returns 746, and the
experiment then reports a pool or a budget it never had.  And a long run on a small
corpus does not fail at all; it repeats the training text for many epochs, which
changes what the geometry measures (a memorized training set).

So an experiment calls these checks right after :func:`~dalign_repro.data.prepare_lm_data`:

* :func:`require_sequences` raises :class:`DataSupplyError` (a ``ValueError``) with the
  numbers and what to do when a split is too small;
* :func:`training_epochs` and :func:`check_epochs` compute how many passes the training
  run makes over its split and warn (:class:`RepeatedDataWarning`) above a threshold;
  the epoch count is returned so the caller records it in the provenance.

Typical use::

    data = prepare_lm_data(corpus, vocab_size=2048, seq_len=256)
    require_sequences("held-out", len(data.test), pool_size + eval_sequences, seq_len=256,
                      field=f"pool_size + eval_sequences = {pool_size + eval_sequences}")
    epochs = check_epochs(training_epochs(steps, batch_size, len(data.train)))
"""

from __future__ import annotations

import math
import warnings

__all__ = [
    "DataSupplyError",
    "RepeatedDataWarning",
    "DEFAULT_SUPPLY_HINT",
    "require_sequences",
    "training_epochs",
    "check_epochs",
]

DEFAULT_SUPPLY_HINT = "use a larger corpus (corpus='dir:/path' or 'hf:<dataset>') or ask for fewer"


class DataSupplyError(ValueError):
    """A data split holds fewer sequences than the experiment asks for."""


class RepeatedDataWarning(UserWarning):
    """A training run makes more passes over its training split than the threshold allows."""


def require_sequences(
    split: str,
    available: int,
    needed: int,
    *,
    seq_len: int,
    field: str,
    hint: str = DEFAULT_SUPPLY_HINT,
) -> int:
    """Raise :class:`DataSupplyError` unless ``available >= needed``; return ``needed``.

    Args:
        split: the split's name as the user knows it (``"train"``, ``"held-out"``, ``"validation"``).
        available: sequences the split holds (e.g. ``len(data.test)``).
        needed: sequences the experiment will take from it.
        seq_len: tokens per sequence, for the message.
        field: the setting(s) that ask for ``needed``, e.g. ``"pool_size=1024"`` or
            ``"pool_size + eval_sequences = 2048"``.
        hint: what to do instead.

    The message reads, e.g., ``held-out split has 746 sequences of 256 tokens;
    pool_size=1024 needs 278 more: use a larger corpus ... or ask for fewer``.
    """
    available, needed = int(available), int(needed)
    if available < 0 or needed < 0:
        raise ValueError(f"sequence counts must be >= 0, got available={available}, needed={needed}")
    if needed > available:
        raise DataSupplyError(f"{split} split has {available} sequences of {seq_len} tokens; "
                              f"{field} needs {needed - available} more: {hint}")
    return needed


def training_epochs(steps: int, batch_size: int, available_sequences: int) -> float:
    """Passes over the training split a run of ``steps`` batches of ``batch_size`` sequences makes."""
    if steps < 0 or batch_size < 1:
        raise ValueError(f"need steps >= 0 and batch_size >= 1, got steps={steps}, batch_size={batch_size}")
    if available_sequences < 1:
        raise DataSupplyError(f"the training split has {available_sequences} sequences; "
                              f"{steps} steps of {batch_size} need at least one: {DEFAULT_SUPPLY_HINT}")
    return steps * batch_size / available_sequences


def check_epochs(epochs: float, *, max_epochs: float = 4.0, stacklevel: int = 2) -> float:
    """Warn (:class:`RepeatedDataWarning`) when ``epochs > max_epochs``; return ``epochs``.

    The caller records the returned count in its provenance, warned or not, so a result
    computed on repeated text says so.  ``stacklevel`` is passed to :func:`warnings.warn`
    (2: the warning points at the caller of this function).
    """
    epochs = float(epochs)
    if not math.isfinite(epochs) or epochs < 0:
        raise ValueError(f"epochs must be a finite number >= 0, got {epochs}")
    if epochs > max_epochs:
        warnings.warn(
            f"training makes {epochs:.2f} passes over its training split (more than max_epochs={max_epochs:g}): "
            f"the model sees the same text again and again and may memorize it; "
            f"use a larger corpus (corpus='dir:/path' or 'hf:<dataset>') or fewer steps",
            RepeatedDataWarning,
            stacklevel=stacklevel,
        )
    return epochs
