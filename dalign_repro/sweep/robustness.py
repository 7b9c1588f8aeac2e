"""Does a width verdict move with one width, one insertion point or one of the two dimensions? Its variants.

A slope on log width read from three or four widths can be carried by one of them, and a sign read at one insertion
point can be that point's alone. Beside each width verdict, :func:`width_variants` refits the same test

* without each width in turn (where at least two widths remain),
* at each other insertion point the sweep captured (its own late window: the checkpoints at or after two thirds of
  the last it has), and
* for d_∥ and d_2 separately (d_align = min(d_∥, d_2) is either of them at a checkpoint),

and :func:`survives` says whether the label, and the sign of the trend, hold in every variant. A chapter states
the sign of a trend (d_align "falls" or "rises" with width) only where it survives: every variant's interval lies
on the same side of 0 as the verdict's own.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

__all__ = ["VARIANT_COLUMNS", "width_variants", "survives", "variants_text"]

VARIANT_COLUMNS = ("variant", "kind", "slope", "slope_lo", "slope_hi", "label", "n_widths", "n_runs")
"""One row per variant: its name ("without N = 32", "at model.layers.1", "d_∥"), its kind (``width``, ``layer``,
``dimension``) and its slope test."""

_DIMENSIONS = (("d_par", "d_∥"), ("d_2", "d_2"))


def _late(rows: pd.DataFrame) -> list:
    return sorted(s for s in rows.step.unique() if 3 * s >= 2 * rows.step.max()) if len(rows) else []


def width_variants(rows: pd.DataFrame, layer: str | None, test: Callable[[pd.DataFrame, str], dict],
                   value: str = "d_align", dimensions: bool = True) -> pd.DataFrame:
    """The verdict's test refitted on each variant of the rows it read.

    Args:
        rows: the claim's rows at every insertion point (trained runs, the judged pool and reduction), one per
            (layer, width, seed, step), with ``value`` (and ``d_par``, ``d_2`` for the dimension variants).
        layer: the judged insertion point (the width variants and the dimension variants are read there).
        test: ``test(rows, value) -> dict`` with :func:`~dalign_repro.sweep.trend.slope_test`'s columns, applied to
            one layer's rows (it picks its own checkpoints: the late window, or the crossing of the common loss).
        dimensions: whether to add d_∥ and d_2 (a d_align claim; not the misalignment claim).

    Returns:
        :data:`VARIANT_COLUMNS`; a variant with fewer than two widths or three runs is left out.
    """
    out = []
    at_layer = rows[rows.layer == layer] if layer is not None and "layer" in rows else rows

    def add(name: str, kind: str, part: pd.DataFrame, quantity: str):
        if part.empty or part.width.nunique() < 2:
            return
        tested = test(part, quantity)
        if tested.get("label", "not run") == "not run":
            return
        out.append(dict(variant=name, kind=kind, slope=tested["slope"], slope_lo=tested["slope_lo"],
                        slope_hi=tested["slope_hi"], label=tested["label"], n_widths=tested["n_widths"],
                        n_runs=tested["n_runs"]))

    widths = sorted(at_layer.width.unique()) if len(at_layer) else []
    if len(widths) > 2:
        for width in widths:
            add(f"without N = {int(width)}", "width", at_layer[at_layer.width != width], value)
    if "layer" in rows:
        for other in sorted(set(rows.layer.dropna().unique()) - {layer}):
            add(f"at {other}", "layer", rows[rows.layer == other], value)
    if dimensions:
        for column, name in _DIMENSIONS:
            if column in at_layer:
                add(name, "dimension", at_layer, column)
    return pd.DataFrame(out, columns=list(VARIANT_COLUMNS))


def survives(main: dict, variants: pd.DataFrame) -> dict:
    """Whether the verdict's label and the sign of its trend hold in every variant.

    Returns ``label`` (every variant gives the main label), ``sign`` (+1 or −1 where the main interval and every
    variant's lie on that side of 0, else 0), ``variants`` (how many) and ``breaks`` (the variants whose interval
    holds 0 or lies on the other side, "/"-joined).
    """
    lo, hi = float(main.get("slope_lo", math.nan)), float(main.get("slope_hi", math.nan))
    side = 1 if lo > 0 else -1 if hi < 0 else 0
    breaks = []
    for row in variants.itertuples(index=False):
        if side == 0 or not (row.slope_lo > 0 if side > 0 else row.slope_hi < 0):
            breaks.append(row.variant)
    label = bool(len(variants)) and bool((variants.label == main.get("label")).all())
    sign = side if side != 0 and not breaks and np.isfinite([lo, hi]).all() else 0
    return dict(label=label, sign=sign, variants=len(variants), breaks="/".join(breaks) if side else "")


def variants_text(variants: pd.DataFrame) -> str:
    """"without N = 32 −0.10 [−0.36, +0.17]; at model.layers.1 +0.05 [−0.35, +0.45]; d_∥ +0.10 [+0.03, +0.18]"."""
    return "; ".join(f"{row.variant} {row.slope:+.2f} [{row.slope_lo:+.2f}, {row.slope_hi:+.2f}]"
                     for row in variants.itertuples(index=False))
