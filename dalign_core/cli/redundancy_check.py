"""The redundancy check of the ``dalign`` subcommands (:mod:`dalign_core.capture.redundancy`): per layer, the
share of q that trained parameters' gradients already own, who owns it, and the warning above 0.9."""

from __future__ import annotations

from dalign_core.cli.output import with_progress

__all__ = ["QUICK_EXAMPLES", "redundancy_by_layer", "is_redundant", "owner_of", "redundancy_warning"]

QUICK_EXAMPLES = 64
"""Examples of ``dalign estimate``'s redundancy check by default (``--thorough-redundancy``: every example). The
check runs one backward pass per example: on a 2-layer LLaMA of width 128 (sequences of 64 tokens, one thread, a
loaded machine) 64 examples cost 0.8 to 1.0 times the capture and estimate of 256, 256 examples 3.2 to 3.7 times
(``benchmarks/bench_redundancy.py`` prints its share of the command). 64 is what ``dalign layers`` and ``dalign
rank`` take. An exact owner (a trained bias whose gradient is q, row for row) shows at any number of examples; the
held-out share of the others is fitted on fewer coordinates (at most a quarter of the examples), a lower bound."""


def redundancy_by_layer(model, layers: list[str], sequences, batch_size: int, reductions,
                         progress: bool = True) -> dict:
    """``(layer, reduction) -> row`` of :func:`dalign_core.capture.redundancy.redundancy_rows` on ``sequences`` (a progress
    bar with an ETA on a terminal: the check takes most of an ``estimate`` on a large model)."""
    from dalign_core.cli.examples import make_batches
    from dalign_core.capture.redundancy import redundancy_rows

    batches = with_progress(make_batches(sequences, batch_size, pad_id=0),
                             f"redundancy check ({len(sequences)} examples)", progress)
    rows = redundancy_rows(model, layers, batches, reductions=reductions)
    return {(row["layer"], row["reduction"]): row for row in rows}


def is_redundant(row: dict) -> bool:
    from dalign_core.capture.redundancy import REDUNDANT

    return row["fraction"] > REDUNDANT


def owner_of(row: dict) -> str | None:
    """The trained parameter that owns q: the exact one, else the one explaining most of q on its own."""
    return row["exact"] or row["owner"]


def redundancy_warning(row: dict) -> str:
    from dalign_core.capture.redundancy import REDUNDANT

    what = (f"is exactly the per-example gradient of the trained parameter {row['exact']}" if row["exact"] else
            f"lies {row['variance_explained']:.0%} in the span of trained parameters' gradients (most: {row['owner']})")
    other = "--reduction full or another layer" if row["reduction"] == "shared" else "another layer"
    return (f"warning: at {row['layer']} the {row['reduction']} q {what} (redundancy {row['fraction']:.2f} > "
            f"{REDUNDANT}, n={row['n']}); training drives its mean to zero at any width, so d_align there says "
            f"little about width: use {other}")
