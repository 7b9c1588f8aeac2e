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
import numpy as np

from dalign_repro.sweep.clock import decomposed_summaries
from dalign_repro.sweep.trend import estimability
from dalign_repro.claims.rows import (NOT_RUN, Row, STALE, load_current, read_current, is_stale, regimes_of,
                                     regime_part, FAMILIES, CONTEXT_CHAPTER, scope_of, primary_layer)

__all__ = ["LLAMA_PAPER_D_ALIGN", "NUMBER_TOLERANCE", "CROSS_MACHINE", "FEWER_THAN_TWO", "width_rows", "llama_numbers",
           "seed_spread", "spread_sentence", "reduce_duplicates"]


LLAMA_PAPER_D_ALIGN = {512: 3.9, 3072: 9.5}
"""The paper's d_align of its narrowest and widest LLaMA-style models."""
NUMBER_TOLERANCE = 0.25
"""A headline number is reproduced when ours lies within 25% of the paper's."""


CROSS_MACHINE = dict(family="llama", width=32, seed=0, heldout_loss=(4.153882, 4.153927), d_align_median=0.012,
                     d_align_max=0.195)
"""The one cross-machine rerun measured (FINDINGS.md, commit c4908c0): LLaMA N = 32 seed 0 of the cpu profile
retrained on another machine of the same kind (same packages, 2 threads). Held-out loss (committed, rerun) and
the median and largest relative change of d_align over its checkpoints. Its per-checkpoint table was not committed:
these four numbers are what was reported."""

FEWER_THAN_TWO = "fewer than two trained widths"
"""What a regime's row says where no slope can be fitted because fewer than two of its widths trained."""

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
    if config.get("min_sequences_per_step") and context:  # the context study: at least that many sequences a step
        per_step = max(int(per_step), int(config["min_sequences_per_step"]) * int(context))
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
    """d_align at each width claim's judged point: the median over runs and checkpoints of the late window; the
    median over runs of d_align interpolated where each run reaches the common held-out loss; the median over the
    models at the judged budget."""
    rows = judged_geometry(geometry, trend, layer) if geometry is not None else None
    if rows is None or rows.empty:
        return [math.nan] * len(_WIDTH_CLAIMS)
    late = rows[rows.step.isin(late_steps(rows))].d_align
    crossings = decomposed_summaries(rows, "d_align")
    budget = misalignment[(misalignment.setting == "heldout/heldout") & misalignment.trained_ok.astype(bool)]
    judged = trend[trend.judged.astype(bool) & (trend.view == "budget")] if "judged" in trend else trend.iloc[0:0]
    if len(judged) and len(budget):
        budget = budget[(budget.M == judged.M.iloc[0]) & (budget.K == judged.K.iloc[0])]
    return [float(late.median()), float(np.exp(crossings.matched).median()) if len(crossings) else math.nan,
            float(budget.d_align.median()) if len(budget) and "d_align" in budget else math.nan]


def seed_spread(rows: pd.DataFrame, value: str = "d_align") -> dict:
    """How far two seeds of one width lie apart at one checkpoint: the median over widths, checkpoints after step 0
    and pairs of seeds of |Δ log ``value``|, and of |Δ held-out loss| at the last checkpoint (nats). NaN with fewer
    than two seeds a width."""
    logs, losses = [], []
    rows = rows[(rows.step > 0) & (rows[value] > 0)]
    for (_, step), part in rows.groupby(["width", "step"]):
        y = np.log(part[value].to_numpy(dtype=float))
        logs += [abs(a - b) for i, a in enumerate(y) for b in y[i + 1:]]
        if step == rows.step.max() and "heldout_loss" in part:
            loss = part.heldout_loss.to_numpy(dtype=float)
            losses += [abs(a - b) for i, a in enumerate(loss) for b in loss[i + 1:]]
    return dict(d_align=float(np.median(logs)) if logs else math.nan,
                heldout_loss=float(np.median(losses)) if losses else math.nan, pairs=len(logs))


def spread_sentence(seeds: dict) -> str:
    """Beside a width verdict: the measured cross-machine spread (:data:`CROSS_MACHINE`) against the seed spread."""
    if not np.isfinite(seeds["d_align"]):
        return ""
    machine, loss = CROSS_MACHINE["d_align_median"], abs(np.diff(CROSS_MACHINE["heldout_loss"])[0])
    seed_pct = math.expm1(seeds["d_align"])
    text = (f"Across machines (LLaMA N = {CROSS_MACHINE['width']} seed {CROSS_MACHINE['seed']} retrained on another "
            f"machine) d_align per checkpoint moved by a median {machine:.1%} (at most "
            f"{CROSS_MACHINE['d_align_max']:.1%}) and the held-out loss by {loss:.1g} nats; between two seeds of one "
            f"width here d_align at one checkpoint differs by a median {seed_pct:.0%}")
    if np.isfinite(seeds["heldout_loss"]):
        text += f" and the final held-out loss by {seeds['heldout_loss']:.2g} nats"
    ratio = seed_pct / machine
    text += (f": the machine spread is {ratio:.0f}× smaller than the seed spread, which the interval over seeds "
             "already carries" if ratio > 1 else ": the machine spread is as large as the seed spread")
    return text + "."


def reduce_duplicates(rows: list[Row]) -> list[Row]:
    """One row per test: where two width rows of one scope carry the same estimate and interval (to 1e-9), the second
    is the first test under another name here; it is dropped and the first says so (its ``same_as`` and ``ours``)."""
    out: list[Row] = []
    for row in rows:
        twin = next((kept for kept in out if kept.scope == row.scope and np.isfinite(row.slope)
                     and np.allclose([kept.slope, kept.slope_lo, kept.slope_hi], [row.slope, row.slope_lo, row.slope_hi],
                                     rtol=1e-9, atol=1e-12)), None)
        if twin is None:
            out.append(row)
            continue
        why = (f"the test of \"{row.claim}\" reduces to this one here (the same estimate and interval to every "
               f"digit: {row.slope:+.6f} [{row.slope_lo:+.6f}, {row.slope_hi:+.6f}]), so it is reported once")
        index = out.index(twin)
        out[index] = Row(**{**twin.__dict__, "ours": f"{twin.ours}; {why}",
                            "same_as": "/".join(n for n in (twin.same_as, row.claim) if n)})
    return out


def width_rows(results: Path, only: tuple[str, ...] | None = None) -> list[Row]:
    """The paper's width claims, one row per family and regime, with the regime beside the paper's.

    ``only``: the families to judge (``"llama"``, ``"pythia"``, ``"resnet"``, ``"llama_context"``; all where None),
    so a chapter can show its own rows as the claims table computes them without judging every family."""
    rows = []
    for family, column, chapter in _WIDTH_FAMILIES:
        if only is not None and family not in only:
            continue
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
            judged_rows = width_verdicts(trend_part, layer, geometry=geometry_part, family=family, scale=scale,
                                         misalignment=mis_part)
            medians = _judged_medians(trend_part, geometry_part, mis_part, layer)
            spread = seed_spread(judged_at) if judged_at is not None and len(judged_at) else None
            regime_rows = []
            for (claim, paper, where), quantity, judged, median in zip(_WIDTH_CLAIMS, _QUANTITIES, judged_rows,
                                                                        medians):
                label = NOT_RUN if judged.label == "not run" else judged.label
                untrained = _untrained(regime_part(runs, column, value)) if label == NOT_RUN and runs is not None else None
                details = dict(judged.details)
                shown = ""
                if untrained:
                    label, ours = "not estimable", untrained
                    shown = f"not estimable: {FEWER_THAN_TWO}" if untrained.startswith(FEWER_THAN_TWO) else ""
                elif label == NOT_RUN:
                    ours = "—"
                elif label == "not estimable":
                    counts = estimability(judged_at[judged_at.step.isin(late_steps(judged_at))])
                    ours = (f"the interval of ‖μ‖² holds 0 at {counts['holds_zero']} of {counts['checkpoints']} late "
                            f"checkpoints (d_align is 0 at {counts['zeros']}): no slope of log d_align to fit")
                elif quantity == "d_align" and "matched_slope" in details:
                    ours = (f"width term {judged.slope:+.2f} [{judged.slope_lo:+.2f}, {judged.slope_hi:+.2f}] on log "
                            f"width at matched held-out loss ({details['matched_level']:.3f} nats): the slope read "
                            f"there is {details['matched_slope']:+.2f} [{details['matched_slope_lo']:+.2f}, "
                            f"{details['matched_slope_hi']:+.2f}], of which a step-only model fitted on the same runs "
                            f"predicts {details['clock_slope']:+.2f} (the clock); detects ≥ {judged.detectable:.2f}")
                else:
                    ours = (f"slope {judged.slope:+.2f} [{judged.slope_lo:+.2f}, {judged.slope_hi:+.2f}] on log width "
                            f"({where}); detects ≥ {judged.detectable:.2f}")
                    if quantity == "p_misalign" and np.isfinite(details.get("reference_slope", math.nan)):
                        ours += f"; the paper's d_align slope implies {details['reference_slope']:+.2f} here"
                if label != NOT_RUN and regime["at_this_scale"]:
                    ours += f"; {label}{SCALE} ({regime['regime']})"
                survived = {name: float(details[name]) if name in details else math.nan
                            for name in ("label_survives", "sign_survives")}
                judged_now = label not in (NOT_RUN, "not estimable")
                regime_rows.append(Row(
                    claim, scope_of(family, column, value), paper, ours, label, chapter, judged.slope,
                    judged.slope_lo, judged.slope_hi, judged.detectable, d_align_median=median,
                    reference=details.get("reference") or reference_text(family, quantity),
                    reference_slope=details.get("reference_slope", math.nan),
                    matched_slope=details.get("matched_slope", math.nan),
                    matched_slope_lo=details.get("matched_slope_lo", math.nan),
                    matched_slope_hi=details.get("matched_slope_hi", math.nan),
                    clock_slope=details.get("clock_slope", math.nan), robustness=details.get("robustness", ""),
                    **survived,
                    seed_spread=math.expm1(spread["d_align"]) if spread and judged_now else math.nan,
                    machine_spread=CROSS_MACHINE["d_align_median"] if spread and judged_now else math.nan,
                    spread=spread_sentence(spread) if spread and judged_now else "", shown=shown, **regime))
            rows += reduce_duplicates(regime_rows)
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
    return (f"{FEWER_THAN_TWO}: {len(ok)} of {len(runs)} runs beat the bigram baseline (widths with a trained run: "
            f"{trained}), and a width slope needs two trained widths")


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
