"""The width claims' verdicts: the paper's regime beside ours, the reference each claim is judged against, the
slope tests at matched steps and at matched loss, why the training clock moves matched loss, and the tables
that show the verdicts and set our numbers beside the paper's.
"""

from __future__ import annotations

import math

import pandas as pd

from dalign_repro.sweep.clock import clock_diagnostics, clock_free_test
from dalign_repro.sweep.trend import (PAPER_SLOPE, SIGN, Verdict, estimability, label_for, not_estimable, run_summaries,
                                     slope_test, verdict)
from dalign_repro.report.describe.text import DASH, D_ALIGN_HTML, number, trained_rows

__all__ = ["WIDTH_CLAIMS", "PAPER_REGIMES", "SCALE", "at_this_scale", "scale_for", "family_reference",
           "reference_text", "judged_rows", "judged_geometry", "late_steps", "width_verdicts", "describe_clock",
           "describe_power", "paper_comparison", "verdict_table"]


WIDTH_CLAIMS = (  # (quantity, view): the claim's sentence, the quantity tested
    (("d_align", "late_window"), "d_align rises with width at {layer} ({pool} pool, matched steps)", "log d_align"),
    (("d_align", "matched_loss"), "d_align rises with width at {layer} ({pool} pool, matched held-out loss, "
                                  "training clock removed)", "log d_align"),
    (("p_misalign", "budget"), "The misalignment probability falls with width at (M, K) = ({M}, {K})", "logit p̂"),
)

PAPER_REGIMES = {
    "llama": "LLaMA-style, N = 512–3072 (depth, context and training tokens not stated)",
    "pythia": "pythia-14m/31m/70m (6 layers, d = 128–512) and pythia-2.8b/6.9b (32 layers, d = 2560–4096), "
              "released models trained on the Pile",
    "resnet": "ResNet-20 (16k/32k/64k channels, width multipliers k) on CIFAR-10 and CIFAR-100, 32×32 images, "
              "200 epochs",
}
"""The paper's regime of each family's width claim (a description of the paper: constant text)."""
_PAPER_WIDTHS = {"llama": {None: (512, 3072)}, "pythia": {6: (128, 512), 32: (2560, 4096)}}
_PAPER_EPOCHS = {"resnet": 200}
SCALE = " at this scale"
"""What a label adds where the regime judged is not the paper's."""


def at_this_scale(family: str, widths, depth: int | None = None, dataset: str | None = None,
                  epochs: float | None = None) -> bool:
    """Whether a regime differs from the paper's: LLaMA widths outside N = 512–3072; Pythia at a depth other than
    6 or 32 layers or widths outside that depth's d; ResNet-20 off CIFAR or short of the paper's 200 epochs."""
    family = family.split("_")[0]
    widths = [float(w) for w in widths]
    if family in _PAPER_WIDTHS:
        ranges = _PAPER_WIDTHS[family]
        span = ranges.get(None if family == "llama" else depth)
        if span is None or not widths or min(widths) < span[0] or max(widths) > span[1]:
            return True
    if family == "resnet":
        if not str(dataset or "").lower().startswith("cifar"):
            return True
        if epochs is not None and epochs < _PAPER_EPOCHS["resnet"]:
            return True
    return False


def scale_for(family: str, widths, depth: int | None = None, dataset: str | None = None,
              epochs: float | None = None) -> str:
    """:data:`SCALE` where the regime is not the paper's (:func:`at_this_scale`), else "": what a label adds."""
    return SCALE if at_this_scale(family, widths, depth, dataset, epochs) else ""


def family_reference(family: str | None) -> float:
    """The slope a family's d_align claim is judged against: the paper's +0.50 for LLaMA (its only number), the sign
    alone (:data:`~dalign_repro.sweep.trend.SIGN`) for Pythia and ResNet-20."""
    return PAPER_SLOPE if family is None or family.split("_")[0] == "llama" else SIGN


def reference_text(family: str | None, quantity: str = "d_align") -> str:
    """What a width claim is judged against, and where it comes from (a claims-table column)."""
    if family_reference(family) == SIGN:
        return ("sign: falls (§2; the paper gives a direction, no number)" if quantity == "p_misalign" else
                "sign: rises (§1; the paper gives a direction, no number, for this family)")
    if quantity == "p_misalign":
        return (f"slope {-PAPER_SLOPE:+.2f} of logit p̂: the fall of logit B_align the paper's LLaMA rise implies "
                "(§1, §2)")
    return f"slope {PAPER_SLOPE:+.2f}: the paper's LLaMA 3.9 → 9.5 over N = 512 → 3072 (§1)"


def judged_rows(trend: pd.DataFrame) -> dict[tuple[str, str], pd.Series | None]:
    """The trend rows the width claims read (``judged``), by (quantity, view); None where a claim has none."""
    judged = trend[trend.judged.astype(bool)] if len(trend) and "judged" in trend else trend.iloc[0:0]
    out = {}
    for key, _, _ in WIDTH_CLAIMS:
        part = judged[(judged.quantity == key[0]) & (judged.view == key[1])] if len(judged) else judged
        out[key] = part.iloc[0] if len(part) else None
    return out


def judged_geometry(geometry: pd.DataFrame, trend: pd.DataFrame, layer: str | None,
                    pool: str = "heldout") -> pd.DataFrame:
    """The geometry rows the d_align claims read: trained runs at the judged layer, pool and q reduction (the
    reduction of the trend table's judged row)."""
    late = judged_rows(trend)[("d_align", "late_window")]
    layer = late["layer"] if late is not None else layer
    rows = trained_rows(geometry)
    if rows.empty:
        return rows
    rows = rows[(rows.layer == layer) & (rows.pool == pool)]
    if late is not None and "reduction" in rows and isinstance(late.get("reduction"), str):
        rows = rows[rows.reduction == late["reduction"]]
    return rows


def _relabel(row: pd.Series | None, reference: float, direction: int) -> dict | None:
    """A trend row judged against ``reference`` (the family's own claim) in place of the one the sweep wrote."""
    if row is None:
        return None
    row = row.to_dict()
    row.update(reference=reference, label=label_for(row["slope_lo"], row["slope_hi"], reference, direction))
    return row


def late_steps(rows: pd.DataFrame) -> list:
    """The checkpoints at or after two thirds of the last: the window the matched-steps claim reads."""
    return sorted(s for s in rows.step.unique() if 3 * s >= 2 * rows.step.max()) if len(rows) else []


def width_verdicts(trend: pd.DataFrame, layer: str | None = None, pool: str = "heldout", *,
                   geometry: pd.DataFrame | None = None, family: str | None = None,
                   scale: str = "") -> list[Verdict]:
    """The chapter's verdicts on the paper's width claims.

    * d_align rises with width at matched steps (each run's late-window mean of log d_align);
    * d_align rises with width at matched held-out loss with the training clock removed
      (:func:`dalign_repro.sweep.clock.clock_free_test`: runs compared at the same steps over the window where every
      width's loss passes the common level);
    * the misalignment probability falls with width at the judged (M, K) (logit p̂, same-law setting).

    Each is a slope test (:mod:`dalign_repro.sweep.trend`) against the family's own claim (:func:`family_reference`):
    reproduced, contradicted, inconclusive, not estimable (d_align unresolved from 0 at most late checkpoints:
    :func:`dalign_repro.sweep.trend.estimability`) or not run. With ``geometry`` (``<family>_geometry``) the d_align claims
    are computed from its judged rows (:func:`judged_geometry`), checkpoints whose d_align reads 0 left out of their
    run's mean (no floor under the log); without it they read the trend table's judged rows (the matched-loss one
    is then the plain crossing, clock included). ``scale`` (:data:`SCALE`) follows each label.
    """
    rows = judged_rows(trend)
    reference = family_reference(family)
    references = {"d_align": (reference, 1), "p_misalign": (-reference if reference else SIGN, -1)}
    judged = judged_geometry(geometry, trend, layer, pool) if geometry is not None else None
    verdicts = []
    for key, claim, quantity in WIDTH_CLAIMS:
        row = rows[key]
        fields = dict(layer=layer if row is None else row["layer"], pool=pool, M="M", K="K")
        if row is None and key[0] == "p_misalign":
            claim = "The misalignment probability falls with width at fixed (M, K)"
        if row is not None and key[0] == "p_misalign":
            fields.update(M=int(row["M"]), K=int(row["K"]))
        if judged is None or judged.empty:  # the trend table's plain crossing: the clock is still in it
            claim = claim.replace(", training clock removed", "")
        claim = claim.format(**fields)
        ref, direction = references[key[0]]
        if judged is not None and len(judged) and key[0] == "d_align":
            late = late_steps(judged)
            counts = estimability(judged[judged.step.isin(late)])
            if not counts["estimable"]:
                verdicts.append(not_estimable(claim, counts, scale))
                continue
            if key[1] == "late_window":
                tested = slope_test(run_summaries(judged, "d_align", late, drop_zeros=True), ref,
                                    direction=direction)
                note = (f"{counts['zeros']} late checkpoints whose d_align reads 0 are left out of their runs' means "
                        "(log 0 has no value)." if counts["zeros"] else "")
            else:
                tested = clock_free_test(judged, "d_align", ref, direction)
                note = (f"Runs are compared at the same steps from step {int(tested['start'])}, where every "
                        "width's held-out loss passes the common level (a fixed effect per step, one summary per run)."
                        if tested["label"] != "not run" else "")
            verdicts.append(verdict(tested, claim, quantity=quantity, direction=direction, scale=scale, note=note))
            continue
        verdicts.append(verdict(_relabel(row, ref, direction), claim, quantity=quantity, direction=direction,
                                scale=scale))
    return verdicts


def describe_clock(rows: pd.DataFrame) -> str:
    """Why matched steps and matched loss can disagree, from one sweep's judged geometry rows
    (:func:`judged_geometry`): the step at which each width reaches the common loss, how fast log d_align moves with
    the step within a run, and the matched-loss slope that clock alone predicts beside the one observed."""
    clock = clock_diagnostics(rows) if len(rows) else None
    if clock is None or not clock["crossing"]:
        return "No run reached a common held-out loss, so there is no matched-loss comparison at this profile."
    steps = ", ".join(f"{s:.0f} at N={w}" for w, s in clock["crossing"].items())
    lo, hi = clock["crossing_lo"], clock["crossing_hi"]
    text = (f"Matched loss is not matched training time. The common held-out loss, {clock['level']:.3f} nats (the "
            f"highest final loss of any run), is reached at step {steps} (medians over seeds); the slope of the log "
            f"crossing step on $\\log N$ is {clock['crossing_slope']:+.2f}, 95% interval [{lo:+.2f}, {hi:+.2f}]")
    if hi < 0:
        text += ", so wider runs are read earlier in training"
    elif lo > 0:
        text += ", so wider runs are read later in training"
    else:
        text += ", so the widths are read at about the same time and the clock barely moves this comparison"
    if math.isfinite(clock["time_slope"]):
        text += (f". Within a run, $\\log d_{{\\mathrm{{align}}}}$ moves by {clock['time_slope']:+.2f} per unit of log "
                 f"step over the checkpoints from step {int(clock['start'])}, at every width alike, so the clock alone "
                 f"predicts a matched-loss slope of {clock['predicted']:+.2f} (the product of the two), against the "
                 f"{clock['matched']:+.2f} [{clock['matched_lo']:+.2f}, {clock['matched_hi']:+.2f}] read at the "
                 "crossings. " + ("That is why matched loss and matched steps disagree here: read at the crossing, "
                                  f"a wider run is read {'earlier' if hi < 0 else 'later'}, where every run's "
                                  f"$d_{{\\mathrm{{align}}}}$ is "
                                  f"{'higher' if (clock['time_slope'] < 0) == (hi < 0) else 'lower'}. "
                                  if (hi < 0 or lo > 0) else
                                  "Here the clock cannot make matched loss and matched steps disagree by much. ")
                 + "The verdict therefore compares the runs at the same steps over the window in which every width's "
                 "loss passes the common level: the comparison spans matched loss, and the clock is held fixed.")
    else:
        text += "."
    return text


def describe_power(config, trend: pd.DataFrame) -> str:
    """What the design can detect: the plan it was sized by, and the slope the realized runs detect."""
    plan = config.power_plan()
    judged = judged_rows(trend)[("d_align", "late_window")]
    parts = []
    if plan:
        parts.append(
            f"**Sized to decide.** The design was sized before it ran: with a run's late-window mean of "
            f"$\\log d_{{\\mathrm{{align}}}}$ scattering by an SD of {plan['run_sd']:.2f} within a width (measured on "
            f"earlier runs), {plan['seeds']} seeds at each of {plan['widths']} widths give a standard error of "
            f"{plan['se']:.2f} for the slope, detect slopes of {plan['detectable']:.2f} or more with 80% power, and "
            f"find the paper's slope (+{PAPER_SLOPE:.2f}) with probability {plan['power']:.0%}; "
            f"{plan['seeds_needed']} seeds per width would reach 80%.")
    if judged is not None and judged["label"] != "not run":
        parts.append(f"The runs themselves scatter by an SD of {float(judged['sigma']):.2f} around the fitted line, "
                     f"so this table detects slopes of {float(judged['detectable']):.2f} or more.")
    return " ".join(parts)


def paper_comparison(ours: pd.DataFrame, paper: dict) -> pd.DataFrame:
    """Our seed-mean d_align at our narrowest and widest width beside the paper's two numbers.

    ``ours``: rows of trained runs with ``width`` and ``d_align`` (one checkpoint, one
    pool); ``paper``: ``{width: d_align}``. One row per quantity (the two widths,
    d_align at each, the two ratios) and one column each for the paper and for us
    (seed mean, with the range over seeds): three columns, no empty cell.
    """
    rows = ["narrowest width N", f"{D_ALIGN_HTML} there", "widest width N", f"{D_ALIGN_HTML} there",
            "widest / narrowest width", f"widest / narrowest {D_ALIGN_HTML}"]
    table = pd.DataFrame({"": rows})
    if len(paper) >= 2:
        (w0, v0), (w1, v1) = sorted(paper.items())[0], sorted(paper.items())[-1]
        table["paper"] = [f"{w0:,}", f"{v0:.2g}", f"{w1:,}", f"{v1:.2g}", f"{w1 / w0:.3g}", f"{v1 / v0:.2g}"]
    stats = ours.groupby("width").d_align.agg(["mean", "min", "max"]) if len(ours) else pd.DataFrame()
    if len(stats) >= 2:
        first, last = stats.iloc[0], stats.iloc[-1]

        def spread(row) -> str:
            return f"{number(row['mean'], True)} ({number(row['min'], True)} to {number(row['max'], True)})"

        table["ours: seed mean (range)"] = [
            f"{stats.index[0]:,}", spread(first), f"{stats.index[-1]:,}", spread(last),
            f"{stats.index[-1] / stats.index[0]:.3g}",
            f"{last['mean'] / first['mean']:.2g}" if first["mean"] > 0 else DASH]
    return table


def verdict_table(verdicts: dict, label: str) -> pd.DataFrame:
    """One row per claim and regime: ``{regime: [Verdict, ...]}`` → regime, claim, verdict (with " at this scale"
    where the regime is not the paper's), slope [interval], detects."""
    def slope(v: Verdict) -> str:
        return DASH if math.isnan(v.slope) else f"{v.slope:+.2f} [{v.slope_lo:+.2f}, {v.slope_hi:+.2f}]"

    rows = [{label: regime, "claim": v.claim.replace("heldout", "held-out").replace("d_align", D_ALIGN_HTML),
             "verdict": v.shown, "slope [95%]": slope(v),
             "detects": DASH if math.isnan(v.detectable) else f"{v.detectable:.2f}"}
            for regime, found in verdicts.items() for v in found]
    return pd.DataFrame(rows, columns=[label, "claim", "verdict", "slope [95%]", "detects"])
