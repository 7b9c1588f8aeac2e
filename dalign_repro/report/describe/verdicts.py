"""The width claims' verdicts: the paper's regime beside ours, the reference each claim is judged against, the
slope tests at matched steps and at matched loss, why the training clock moves matched loss, and the tables
that show the verdicts and set our numbers beside the paper's.
"""

from __future__ import annotations

import math

import pandas as pd

from dalign_repro.sweep.clock import clock_diagnostics, matched_loss_decomposed
from dalign_repro.sweep.operating_point import implied_reference, misalignment_label, reference_sentence
from dalign_repro.sweep.robustness import survives, variants_text, width_variants
from dalign_repro.sweep.trend import (PAPER_D_ALIGN, PAPER_SLOPE, SIGN, Verdict, estimability, label_for, logit_clip,
                                     not_estimable, run_summaries, slope_test, verdict)
from dalign_repro.report.describe.text import DASH, D_ALIGN_HTML, number, trained_rows

__all__ = ["WIDTH_CLAIMS", "PAPER_REGIMES", "SCALE", "at_this_scale", "scale_for", "family_reference",
           "reference_text", "judged_rows", "judged_geometry", "late_steps", "width_verdicts", "describe_clock",
           "misalignment_cells", "misalignment_reference_text", "robustness_sentence",
           "describe_power", "paper_comparison", "verdict_table", "models_regime", "papers_regime_beside"]


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


def models_regime(name: str, widths, depths=(), d_align: float = math.nan) -> str:
    """One family's models of a study in words, for its regime: ``"LLaMA at widths 32–256, 4 layers, median
    $d_{\\mathrm{align}}$ 0.0112"`` (``d_align``: the median at the points the study read; NaN leaves it out)."""
    widths, depths = sorted(int(w) for w in widths), sorted({int(d) for d in depths if pd.notna(d)})
    text = f"{name} at widths {widths[0]}–{widths[-1]}" if len(widths) > 1 else f"{name} at width {widths[0]}"
    if depths:
        text += f", {' and '.join(map(str, depths))} layers"
    return text + (f", median $d_{{\\mathrm{{align}}}}$ {number(d_align)}" if math.isfinite(d_align) else "")


def papers_regime_beside() -> str:
    """The paper's regime in one clause, to set beside a study's (every verdict of the study is at this scale)."""
    llama = _PAPER_WIDTHS["llama"][None]
    pythia = max(high for _, high in _PAPER_WIDTHS["pythia"].values())
    return (f"The paper's models are far wider (LLaMA-style N = {llama[0]}–{llama[1]}, Pythia up to d = {pythia:,}, "
            f"ResNet-20 at 16k to 64k channels), its LLaMA-style ones with $d_{{\\mathrm{{align}}}}$ of "
            f"{PAPER_D_ALIGN[0]}–{PAPER_D_ALIGN[1]}: every verdict here is at this scale.")


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


def misalignment_cells(misalignment: pd.DataFrame | None, M: int, K: int, layer: str | None = None) -> pd.DataFrame:
    """The cells the misalignment claim reads: one per trained model at (M, K), the theorem's setting
    (held-out/held-out), at ``layer`` (the table's first where None)."""
    if misalignment is None or misalignment.empty:
        return pd.DataFrame(columns=["width", "seed", "M", "K", "p_misalign", "trials", "b_exact"])
    cells = misalignment[(misalignment.setting == "heldout/heldout") & misalignment.trained_ok.astype(bool)
                         & (misalignment.M == M) & (misalignment.K == K)]
    if "layer" in cells and len(cells):
        cells = cells[cells.layer == (layer if layer is not None else cells.layer.iloc[0])]
    return cells


def misalignment_reference_text(reference: dict, family: str | None = None) -> str:
    """The ``reference`` column of a misalignment row: the p̂ slope the paper's d_align slope implies at the design's
    own operating point, and how it was derived (:mod:`dalign_repro.sweep.operating_point`)."""
    if not math.isfinite(reference.get("slope", math.nan)):
        return ("sign: falls (§2; the paper's d_align slope could not be carried to p̂ here: no trained cell at the "
                "judged budget)")
    whose = "" if family is None or family.split("_")[0] == "llama" else " (the paper's LLaMA number: it gives none for this family)"
    return (f"slope {reference['slope']:+.2f} of logit p̂: the paper's d_align slope {PAPER_SLOPE:+.2f}{whose} carried to "
            f"p̂ at this design's (M, K) = ({reference['M']}, {reference['K']}) and measured d_∥, d_2 (median "
            f"B_exact {reference['b_exact']:.3g}): with d_∥, d_2 ∝ N^{PAPER_SLOPE:.2f}, r = B_exact/(1 − B_exact) "
            f"falls as N^−{PAPER_SLOPE:.2f} and a Gaussian μ_Mᵀg_K gives p = Φ(−r^−1/2); the median over "
            f"{reference['cells']} models (range {reference['lo']:+.2f} to {reference['hi']:+.2f}). The label reads "
            "the sign (below 0 reproduced, above 0 contradicted); the implied slope sizes the design")


def robustness_sentence(held: dict, variants: pd.DataFrame, label: str, quantity: str = "d_align",
                        direction: int = 1) -> str:
    """The sentence beside a width verdict: its variants, whether its label holds in each, and the direction of the
    trend only where it survives every variant (:func:`dalign_repro.sweep.robustness.survives`)."""
    if not held["variants"]:
        return ""
    text = f"Variants: {variants_text(variants)}. "
    text += (f"The label ({label}) holds in every variant. " if held["label"] else
             f"The label ({label}) does not hold in every variant "
             f"({', '.join(f'{v} {lab}' for v, lab in zip(variants.variant, variants.label) if lab != label)}). ")
    if held["sign"]:
        moves = "rises" if held["sign"] > 0 else "falls"
        text += (f"{quantity} {moves} with width in every variant: without any one width, at every insertion point"
                 + (" and for d_∥ and d_2 alike." if (variants.kind == "dimension").any() else "."))
    elif held["breaks"]:
        text += (f"Its sign does not survive ({held['breaks'].replace('/', ', ')} hold 0 or lie on the other side), "
                 "so no direction of the trend is read from it.")
    return text.strip()


def _every_layer(geometry: pd.DataFrame, trend: pd.DataFrame, pool: str) -> pd.DataFrame:
    """The judged pool and reduction's trained rows at every insertion point: what the layer variants read."""
    late = judged_rows(trend)[("d_align", "late_window")]
    rows = trained_rows(geometry)
    if rows.empty:
        return rows
    rows = rows[rows.pool == pool]
    if late is not None and "reduction" in rows and isinstance(late.get("reduction"), str):
        rows = rows[rows.reduction == late["reduction"]]
    return rows


def width_verdicts(trend: pd.DataFrame, layer: str | None = None, pool: str = "heldout", *,
                   geometry: pd.DataFrame | None = None, family: str | None = None,
                   scale: str = "", misalignment: pd.DataFrame | None = None) -> list[Verdict]:
    """The chapter's verdicts on the paper's width claims.

    * d_align rises with width at matched steps (each run's late-window mean of log d_align);
    * d_align rises with width at matched held-out loss, training clock removed
      (:func:`dalign_repro.sweep.clock.matched_loss_decomposed`: each run read where its held-out loss reaches the
      common level; the slope there is split into what a step-only model fitted on the same runs predicts, the
      clock, and the residual width term, which the label reads);
    * the misalignment probability falls with width at the judged (M, K) (logit p̂, same-law setting), read on its
      sign (:func:`dalign_repro.sweep.operating_point.misalignment_label`), with the fall the paper's d_align slope
      implies at the design's own operating point as its reference where ``misalignment`` (``<family>_misalignment``)
      is given.

    Each d_align claim is a slope test (:mod:`dalign_repro.sweep.trend`) against the family's own claim
    (:func:`family_reference`): reproduced, contradicted, inconclusive, not estimable (d_align unresolved from 0 at
    most late checkpoints: :func:`dalign_repro.sweep.trend.estimability`) or not run. With ``geometry``
    (``<family>_geometry``) the d_align claims are computed from its judged rows (:func:`judged_geometry`),
    checkpoints whose d_align reads 0 left out of their run's mean (no floor under the log), each beside its variants
    (without each width, at each insertion point, for d_∥ and d_2: :mod:`dalign_repro.sweep.robustness`), and its
    sentence states a direction of the trend only where that sign survives them (the variants' sentence is
    ``details["robustness"]``: :func:`robustness_sentence`); without it they read the trend
    table's judged rows (the matched-loss one is then the plain crossing, clock included). ``scale`` (:data:`SCALE`)
    follows each label. :attr:`~dalign_repro.sweep.trend.Verdict.details` holds what the claims table shows beside
    the label (``matched_slope``, ``clock_slope``, ``robustness``, ``variants``, ``label_survives``, ``sign_survives``,
    ``reference_slope``, ``reference``).
    """
    rows = judged_rows(trend)
    reference = family_reference(family)
    references = {"d_align": (reference, 1), "p_misalign": (-reference if reference else SIGN, -1)}
    judged = judged_geometry(geometry, trend, layer, pool) if geometry is not None else None
    every_layer = _every_layer(geometry, trend, pool) if geometry is not None else None
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
                def test(part: pd.DataFrame, value: str) -> dict:
                    return slope_test(run_summaries(part, value, late_steps(part), drop_zeros=True), ref,
                                      direction=direction)

                tested = test(judged, "d_align")
                note = (f"{counts['zeros']} late checkpoints whose d_align reads 0 are left out of their runs' means "
                        "(log 0 has no value)." if counts["zeros"] else "")
                details = {}
            else:
                def test(part: pd.DataFrame, value: str) -> dict:
                    return matched_loss_decomposed(part, value, ref, direction)

                tested = test(judged, "d_align")
                details = dict(matched_slope=tested["matched"], matched_slope_lo=tested["matched_lo"],
                               matched_slope_hi=tested["matched_hi"], clock_slope=tested["clock"],
                               matched_level=tested["level"])
                note = _decomposition_note(tested) if tested["label"] != "not run" else ""
            if tested["label"] != "not run" and every_layer is not None:
                variants = width_variants(every_layer, judged.layer.iloc[0], test)
                held = survives(tested, variants)
                details.update(robustness=robustness_sentence(held, variants, tested["label"]),
                               variants=variants_text(variants), label_survives=held["label"],
                               sign_survives=held["sign"], sign_breaks=held["breaks"])
                sign_holds = bool(held["sign"]) if held["variants"] else None
            else:
                sign_holds = None
            said = quantity if key[1] == "late_window" else f"{quantity} at matched loss (its width term, the clock out)"
            verdicts.append(verdict(tested, claim, quantity=said, direction=direction, scale=scale, note=note,
                                    sign_holds=sign_holds, details=details))
            continue
        if key[0] == "p_misalign" and row is not None:
            verdicts.append(_misalignment_verdict(row, claim, quantity, scale, misalignment, family))
            continue
        verdicts.append(verdict(_relabel(row, ref, direction), claim, quantity=quantity, direction=direction,
                                scale=scale))
    return verdicts


def _decomposition_note(tested: dict) -> str:
    crossing = ", ".join(f"N={w} at step {s:.0f}" for w, s in tested["crossing"].items())
    return (f"Each run is read where its held-out loss first reaches {tested['level']:.3f} nats ({crossing}; medians "
            f"over seeds): there the slope is {tested['matched']:+.2f} [{tested['matched_lo']:+.2f}, "
            f"{tested['matched_hi']:+.2f}]; a step-only model fitted on the same runs (their mean log d_align at each "
            f"checkpoint) predicts {tested['clock']:+.2f} of it (the training clock), and the width term left, "
            f"{tested['slope']:+.2f} [{tested['slope_lo']:+.2f}, {tested['slope_hi']:+.2f}], is what the label reads.")


def _misalignment_verdict(row: pd.Series, claim: str, quantity: str, scale: str, misalignment: pd.DataFrame | None,
                          family: str | None) -> Verdict:
    """The misalignment claim read on its sign, with the reference the paper's d_align slope implies at the design's
    operating point, and its variants without each width."""
    tested = row.to_dict()
    tested.update(reference=SIGN, label=misalignment_label(tested["slope_lo"], tested["slope_hi"]))
    cells = misalignment_cells(misalignment, int(row["M"]), int(row["K"]), row.get("layer"))
    implied = implied_reference(cells)
    details = dict(reference_slope=implied["slope"], reference=misalignment_reference_text(implied, family))
    note = ""
    if len(cells) and tested["label"] != "not run":
        logits = cells.assign(y=logit_clip(cells.p_misalign, cells.trials))

        def test(part: pd.DataFrame, value: str) -> dict:
            out = slope_test(part, SIGN, direction=-1)
            return {**out, "label": misalignment_label(out["slope_lo"], out["slope_hi"])}

        variants = width_variants(logits, row.get("layer"), test, value="y", dimensions=False)
        held = survives(tested, variants)
        details.update(robustness=robustness_sentence(held, variants, tested["label"], quantity="p̂"),
                       variants=variants_text(variants), label_survives=held["label"], sign_survives=held["sign"],
                       sign_breaks=held["breaks"])
    said = reference_sentence(implied, float(tested["slope_lo"]), float(tested["slope_hi"]),
                              float(tested["detectable"]))
    text = ("The paper reports no slope of p̂; this claim is judged on its sign (a fall: the interval below 0)"
            + (f", and {said}" if said else ""))
    return verdict(tested, claim, quantity=quantity, direction=-1, scale=scale, note=note, details=details,
                   reference_text=text,
                   sign_holds=bool(details["sign_survives"]) if "sign_survives" in details else None)


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
                 f"step over the checkpoints from step {int(clock['start'])}, at every width alike, so to first order "
                 f"the clock accounts for a matched-loss slope of {clock['predicted']:+.2f} (the product of the two; "
                 "the step-only model of the verdict is the exact split), against the "
                 f"{clock['matched']:+.2f} [{clock['matched_lo']:+.2f}, {clock['matched_hi']:+.2f}] read at the "
                 "crossings. " + ("That is why matched loss and matched steps disagree here: read at the crossing, "
                                  f"a wider run is read {'earlier' if hi < 0 else 'later'}, where every run's "
                                  f"$d_{{\\mathrm{{align}}}}$ is "
                                  f"{'higher' if (clock['time_slope'] < 0) == (hi < 0) else 'lower'}. "
                                  if (hi < 0 or lo > 0) else
                                  "Here the clock cannot make matched loss and matched steps disagree by much. ")
                 + "The verdict therefore splits the matched-loss slope in two: the part a step-only model fitted on "
                 "the same runs (their mean log d_align at each checkpoint, read at each run's crossing step) "
                 "predicts, which is the clock, and the width term left, which carries its own interval and the "
                 "label.")
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
