"""The width claims' rows (§1, §2): per family and regime, the slope tests of
:func:`dalign_repro.report.describe.width_verdicts` with the regime beside the paper's, and the LLaMA numbers at
N = 512 and 3072.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dalign_repro.report.describe import (PAPER_REGIMES, SCALE, at_this_scale, judged_geometry, late_steps, reference_text,
                                sweep_records, width_verdicts)
from dalign_repro.sweep.clock import clock_window
from dalign_repro.sweep.trend import estimability
from dalign_repro.claims.rows import (NOT_RUN, Row, STALE, load_current, read_current, is_stale, regimes_of,
                                     regime_part, FAMILIES, CONTEXT_CHAPTER, scope_of, primary_layer)

__all__ = ["LLAMA_PAPER_D_ALIGN", "NUMBER_TOLERANCE", "width_rows", "llama_numbers"]


LLAMA_PAPER_D_ALIGN = {512: 3.9, 3072: 9.5}
"""The paper's d_align of its narrowest and widest LLaMA-style models."""
NUMBER_TOLERANCE = 0.25
"""A headline number is reproduced when ours lies within 25% of the paper's."""


_WIDTH_FAMILIES = FAMILIES + (("llama_context", "context", CONTEXT_CHAPTER),)
"""The families of the width claims: the context study is LLaMA with one regime per context."""


_WIDTH_CLAIMS = (  # claim, the paper's, what a run's summary is
    ("d_align rises with width (matched steps)", "rises (§1)", "late-window mean"),
    ("d_align rises with width (matched loss)", "rises (§1)", "same steps over the common-loss window"),
    ("misalignment falls with width at fixed (M, K)", "falls (§2)", "logit p̂"),
)
_QUANTITIES = ("d_align", "d_align", "p_misalign")
"""What each width claim tests (its reference: :func:`dalign_repro.report.describe.reference_text`)."""


def _regime(family: str, column: str | None, value, provenance: dict, rows: pd.DataFrame) -> dict:
    """A width row's regime columns, read from the sweep's provenance and its judged geometry rows."""
    record = next((r for r in sweep_records(provenance) if column is None or r.get(column) == value),
                  sweep_records(provenance)[0] if provenance else {})
    config, data = provenance.get("config", {}), record.get("data", {})
    widths = sorted(int(w) for w in rows.width.unique()) if len(rows) else []
    depth = record.get("depth", config.get("depth"))
    if depth is None and len(rows) and "model" in rows:  # ResNet-20: the depth is in the model's name
        found = pd.Series(rows.model.astype(str).unique()).str.extract(r"^resnet(\d+)")[0].dropna()
        depth = int(found.iloc[0]) if len(found) else None
    image = data.get("image_shape")
    language = image is None
    context = (value if column == "context" else data.get("seq_len", config.get("context"))) if language else None
    epochs = data.get("epochs")
    per_step = config.get("tokens_per_step") or (config.get("batch_size", 0) * (context or 0))
    if language and config.get("steps") and per_step:  # exact: the provenance rounds the epochs to 3 decimals
        tokens = int(config["steps"]) * int(per_step)
    else:
        tokens = (round(epochs * data["train_tokens"]) if language and epochs is not None and "train_tokens" in data
                  else None)
    dataset = value if column == "dataset" else record.get("dataset", config.get("dataset"))
    out = dict(widths="/".join(map(str, widths)), depth=float(depth) if depth is not None else math.nan,
               context=float(context) if context is not None else math.nan,
               image_size="×".join(str(d) for d in image[-2:]) if image else "",
               train_tokens=float(tokens) if tokens is not None else math.nan,
               epochs=float(epochs) if epochs is not None else math.nan,
               paper_regime=PAPER_REGIMES[family.split("_")[0]])
    out["at_this_scale"] = bool(widths) and at_this_scale(family, widths, depth, dataset, epochs)
    words = [f"N = {widths[0]}–{widths[-1]}" if widths else "", f"{depth} layers" if depth is not None else "",
             f"context {context}" if context is not None else "",
             f"{out['image_size']} {dataset} images" if image else "",
             f"{tokens:,} training tokens" if tokens is not None else "",
             f"{epochs:.2g} epochs" if epochs is not None else ""]
    out["regime"] = ", ".join(w for w in words if w)
    return out


def _judged_medians(trend: pd.DataFrame, geometry: pd.DataFrame | None, misalignment: pd.DataFrame,
                    layer: str | None) -> list[float]:
    """d_align at each width claim's judged point: the median over runs and checkpoints of the late window, of the
    clock-free window, and of the models at the judged budget."""
    rows = judged_geometry(geometry, trend, layer) if geometry is not None else None
    if rows is None or rows.empty:
        return [math.nan] * len(_WIDTH_CLAIMS)
    late = rows[rows.step.isin(late_steps(rows))].d_align
    start = clock_window(rows)
    window = rows[rows.step >= start].d_align if start is not None else late.iloc[0:0]
    budget = misalignment[(misalignment.setting == "heldout/heldout") & misalignment.trained_ok.astype(bool)]
    judged = trend[trend.judged.astype(bool) & (trend.view == "budget")] if "judged" in trend else trend.iloc[0:0]
    if len(judged) and len(budget):
        budget = budget[(budget.M == judged.M.iloc[0]) & (budget.K == judged.K.iloc[0])]
    return [float(late.median()), float(window.median()) if len(window) else math.nan,
            float(budget.d_align.median()) if len(budget) and "d_align" in budget else math.nan]


def width_rows(results: Path) -> list[Row]:
    """The paper's width claims, one row per family and regime, with the regime beside the paper's."""
    rows = []
    for family, column, chapter in _WIDTH_FAMILIES:
        trend, misalignment = read_current(results, f"{family}_trend"), read_current(results, f"{family}_misalignment")
        geometry, provenance = load_current(results, f"{family}_geometry")
        runs = read_current(results, f"{family}_runs")
        # a regime whose runs all failed has no trend rows: it is reported from the runs table, not left out
        regimes = sorted(set(regimes_of(trend, column)) | set(regimes_of(runs, column))) if misalignment is not None else []
        if not regimes:
            ours = STALE if is_stale(results, f"{family}_trend") else "—"
            rows += [Row(claim, scope_of(family, column, None), paper, ours, NOT_RUN, chapter,
                         reference=reference_text(family, quantity), paper_regime=PAPER_REGIMES[family.split("_")[0]])
                     for (claim, paper, _), quantity in zip(_WIDTH_CLAIMS, _QUANTITIES)]
            continue
        for value in regimes:
            trend_part, mis_part = regime_part(trend, column, value), regime_part(misalignment, column, value)
            geometry_part = regime_part(geometry, column, value) if geometry is not None else None
            layer = primary_layer(mis_part)
            judged_at = judged_geometry(geometry_part, trend_part, layer) if geometry_part is not None else None
            regime = _regime(family, column, value, provenance,
                             judged_at if judged_at is not None else pd.DataFrame(columns=["width"]))
            scale = SCALE if regime["at_this_scale"] else ""
            judged_rows = width_verdicts(trend_part, layer, geometry=geometry_part, family=family, scale=scale)
            medians = _judged_medians(trend_part, geometry_part, mis_part, layer)
            for (claim, paper, where), quantity, judged, median in zip(_WIDTH_CLAIMS, _QUANTITIES, judged_rows,
                                                                        medians):
                label = NOT_RUN if judged.label == "not run" else judged.label
                untrained = _untrained(regime_part(runs, column, value)) if label == NOT_RUN and runs is not None else None
                if untrained:
                    label, ours = "not estimable", untrained
                elif label == NOT_RUN:
                    ours = "—"
                elif label == "not estimable":
                    counts = estimability(judged_at[judged_at.step.isin(late_steps(judged_at))])
                    ours = (f"the interval of ‖μ‖² holds 0 at {counts['holds_zero']} of {counts['checkpoints']} late "
                            f"checkpoints (d_align is 0 at {counts['zeros']}): no slope of log d_align to fit")
                else:
                    ours = (f"slope {judged.slope:+.2f} [{judged.slope_lo:+.2f}, {judged.slope_hi:+.2f}] on log width "
                            f"({where}); detects ≥ {judged.detectable:.2f}")
                if label != NOT_RUN and regime["at_this_scale"]:
                    ours += f"; {label}{SCALE} ({regime['regime']})"
                rows.append(Row(claim, scope_of(family, column, value), paper, ours, label, chapter, judged.slope,
                                judged.slope_lo, judged.slope_hi, judged.detectable, d_align_median=median,
                                reference=reference_text(family, quantity), **regime))
    return rows


def _untrained(runs: pd.DataFrame) -> str | None:
    """Why a regime that ran has no slope: fewer than two of its widths have a run that beat the baseline (None when
    it did not run at all, or has two such widths)."""
    if runs is None or runs.empty:
        return None
    ok = runs[runs.trained_ok.astype(bool)]
    if ok.width.nunique() >= 2:
        return None
    trained = ", ".join(f"N = {w}" for w in sorted(ok.width.unique())) or "none"
    return (f"{len(ok)} of {len(runs)} runs beat the bigram baseline (widths with a trained run: {trained}): "
            "a width slope needs two trained widths")


def llama_numbers(results: Path) -> Row:
    geometry = read_current(results, "llama_geometry")
    paper = "3.9 at N = 512 → 9.5 at N = 3072 (§1)"
    if geometry is None or not set(LLAMA_PAPER_D_ALIGN) <= set(geometry.width):
        ours = STALE if is_stale(results, "llama_geometry") else "—"
        return Row("d_align from N = 512 to 3072", "LLaMA", paper, ours, NOT_RUN, "02_llama_width")
    final = geometry[(geometry.pool == "heldout") & geometry.trained_ok.astype(bool)]
    layer = primary_layer(read_current(results, "llama_misalignment"))
    final = final[(final.step == final.step.max()) & (final.layer == layer)]
    ours = {w: float(final[final.width == w].d_align.mean()) for w in LLAMA_PAPER_D_ALIGN}
    close = all(abs(ours[w] / v - 1) <= NUMBER_TOLERANCE for w, v in LLAMA_PAPER_D_ALIGN.items())
    label = "reproduced" if close else "partly" if ours[3072] > ours[512] else "contradicted"
    return Row("d_align from N = 512 to 3072", "LLaMA", paper, f"{ours[512]:.3g} → {ours[3072]:.3g}", label,
               "02_llama_width")
