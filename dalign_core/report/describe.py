"""Sentences a chapter prints about a width sweep, generated from its results tables.

Every sentence that describes our runs, or compares our numbers with the paper's,
comes from here: the chapter never types a number or a verdict. The inputs are the
tables :mod:`dalign_core.sweep.run` writes (``<family>_runs``, ``_lr``, ``_trend``,
``_misalignment``), read back with :func:`dalign_core.report.results.read_table`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from dalign_core.report.results import read_table
from dalign_core.sweep.run import lr_check
from dalign_core.sweep.trend import (PAPER_SLOPE, SIGN, Verdict, clock_diagnostics, clock_free_test, estimability,
                               label_for, not_estimable, run_summaries, slope_test, verdict)

__all__ = ["by_regime", "judged_only", "rerun_box", "sweep_records", "describe_accuracy", "describe_runs", "describe_learning_rates", "describe_final_geometry",
           "describe_rate_resolution", "width_verdicts", "judged_rows", "judged_geometry", "WIDTH_CLAIMS",
           "PAPER_REGIMES", "SCALE", "at_this_scale", "scale_for", "family_reference", "reference_text", "describe_clock", "trials", "describe_power", "describe_redundancy", "describe_bounds", "summarize", "styled", "runs_summary",
           "describe_trajectory", "describe_limiting_dimension", "describe_layers", "describe_budget",
           "describe_context", "describe_sample_choice", "paper_comparison", "verdict_table", "number"]

DASH = "—"
"""What a table shows where there is no value (never ``NaN``)."""
D_ALIGN_HTML = "d<sub>align</sub>"
"""d_align in a table header or cell (HTML; tables are not typeset as math)."""


def number(value: float, html: bool = False) -> str:
    """A number for a sentence: 3 significant digits, written as a power of ten outside 0.001 to 10,000.

    The power of ten is math (``$1.2 \\times 10^{-5}$``) for Markdown, or with ``html=True``
    HTML (``1.2×10<sup>−5</sup>``) for a table cell, which is not typeset.
    """
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    size = abs(value)
    if 1e-3 <= size < 1e3:
        return f"{value:.3g}"
    if 1e3 <= size < 1e4:
        return f"{value:,.0f}"
    exponent = math.floor(math.log10(size))
    mantissa = value / 10**exponent
    if round(mantissa, 2) in (10.0, -10.0):
        mantissa, exponent = mantissa / 10, exponent + 1
    if html:
        return f"{mantissa:.3g}×10<sup>{str(exponent).replace('-', '−')}</sup>"
    return f"${mantissa:.3g} \\times 10^{{{exponent}}}$"


_num = number


def _widths(frame: pd.DataFrame) -> str:
    return ", ".join(f"N={w}" for w in sorted(frame.width.unique()))


def by_regime(tables: dict[str, pd.DataFrame], column: str) -> dict:
    """Split every table by ``column`` (a Pythia depth, a ResNet data set): value → tables of that sweep alone."""
    values = sorted(tables["runs"][column].unique()) if column in tables["runs"] else []
    return {value: {name: (frame[frame[column] == value] if column in frame else frame)
                    for name, frame in tables.items()} for value in values}


def sweep_records(provenance: dict) -> list[dict]:
    """The per-sweep part of a width experiment's provenance: one record per regime of a family with sibling sweeps
    (``provenance["sweeps"]``: Pythia's depths, ResNet's data sets), else the provenance itself (one sweep)."""
    return provenance.get("sweeps") or [provenance]


def rerun_box(chapter: str, module: str | None, profile: str, provenance: dict | None, *, first: str = "",
              example: str = "", seconds: float | None = None, fresh: bool = True) -> str:
    """The "Rerun this chapter" box, as MyST (an admonition): the command; what a run from no checkpoint costs, at
    this profile and at the classroom profile ``lab`` (:func:`dalign_core.report.timings.fresh_run`: measured, or
    projected by the dry run and labelled so); the wall time the shown results took, and how many of their models
    were loaded from checkpoints that existed before that run (:func:`dalign_core.report.timings.loaded_before`); what
    must run first; how to change one parameter.

    Args:
        chapter: the notebook's stem (``"02_llama_width"``); module: the experiment (``"llama_width"``), or None.
        provenance: the provenance JSON of the chapter's main table (its ``wall_time_s`` and ``hardware``).
        first: what must run first, in words; example: a ``SET=`` value for the example override.
        seconds: the wall time when the chapter has no results table (measured in the notebook); ``fresh``: whether
            that run computed everything (False: it reused a cached model, so it is not a fresh run's cost).
    """
    from dalign_core.report import timings
    from dalign_core.config import default_results_dir

    lines = [f"`make notebooks ONLY={chapter} PROFILE={profile} FORCE=1` recomputes it"
             + (f" (without Jupyter: `python -m dalign_core.experiments.{module} --profile {profile} --force`)"
                if module else "") + "."]
    cost = timings.fresh_run(chapter, profile)
    if cost is not None:
        lines.append(f"A run from no checkpoint takes {cost.sentence()}.")
    elif provenance is None and seconds is not None and fresh:
        lines.append(f"A run from nothing takes what this build of the page took: {timings.duration(seconds)}.")
        seconds = None  # said once
    else:
        lines.append("What a run from no checkpoint costs at this profile has not been measured.")
    if profile != "lab":
        lab = timings.fresh_run(chapter, "lab")
        if lab is not None:
            lines.append(f"At the classroom profile, `make notebooks ONLY={chapter} PROFILE=lab` takes "
                         f"{lab.sentence()}.")
    wall = provenance.get("wall_time_s") if provenance else seconds
    if wall is not None and wall == wall:
        hardware = (provenance or {}).get("hardware", {})
        workers = hardware.get("workers")
        took = f"{wall:.0f} s" if wall < 60 else f"{wall / 60:.0f} min"
        lines.append(f"The results shown took {took}"
                     + (f" on {provenance.get('device', 'this machine')}" if provenance else "")
                     + (f" ({workers} worker process(es) of {hardware.get('threads_per_process', 1)} thread(s))"
                        if workers else "") + ("" if fresh else ", with the model the page had cached") + ".")
        folder = default_results_dir(profile)
        loaded, measured = timings.loaded_before(provenance or {}, folder if folder.is_dir() else None)
        if loaded:
            lines.append(f"That run loaded {loaded} of its {measured} measured models from the checkpoints of an "
                         "earlier one instead of training them, so a fresh run takes longer.")
    lines.append(f"Needs first: {first}." if first else "Nothing must run first.")
    if example:
        lines.append(f"To change one parameter: `make notebooks ONLY={chapter} SET='{example}'` (or `--set` on the "
                     "command line); the results go to a folder of their own, never over the profile's.")
    return ":::{admonition} Rerun this chapter\n:class: note\n\n" + " ".join(lines) + "\n:::"


def judged_only(tables: dict[str, pd.DataFrame], reduction: str) -> dict[str, pd.DataFrame]:
    """``tables`` with the geometry cut to the judged q reduction; the full geometry kept as ``geometry_all``."""
    geometry = tables["geometry"]
    judged = geometry[geometry.reduction == reduction] if "reduction" in geometry and len(geometry) else geometry
    return {**tables, "geometry": judged, "geometry_all": geometry}


def _reason(failure) -> str:
    return failure if isinstance(failure, str) and failure else "diverged"


def describe_accuracy(runs: pd.DataFrame, floor: float) -> str:
    """A classifier's test accuracy by width, against the floor below which a run failed."""
    if runs.empty or "test_accuracy" not in runs:
        return "No classifier was trained at this profile."
    accuracy = runs.groupby("width").test_accuracy.agg(["mean", "min"])
    text = "Test accuracy by width (mean over seeds; lowest seed): " + ", ".join(
        f"N={w}: {r['mean']:.3f} ({r['min']:.3f})" for w, r in accuracy.iterrows()) + "."
    below = runs[runs.test_accuracy < floor]
    return text + (f" {len(below)} of {len(runs)} runs fall below the floor of {floor:.2f} and count as failed."
                   if len(below) else f" Every run clears the floor of {floor:.2f}.")


def describe_runs(runs: pd.DataFrame) -> str:
    """Which runs failed (diverged, or did not beat the baseline) and how held-out loss moves with width."""
    if runs.empty:
        return "No run was made at this profile."
    failed = runs[~runs.trained_ok.astype(bool)]
    if len(failed):
        text = (f"**{len(failed)} of {len(runs)} runs failed** and are drawn in grey, outside every trend: "
                + "; ".join(f"N={r.width} seed {r.seed} ({_reason(getattr(r, 'failure', ''))})" for r in failed.itertuples())
                + ".")
    else:
        text = f"All {len(runs)} runs beat the baseline on held-out data."
    if "baseline_loss" in runs and runs.baseline_loss.notna().any():
        baselines = runs.baseline_loss.dropna().unique()
        text += (f" The baseline's held-out loss is {baselines[0]:.3f} nats." if len(baselines) == 1 else
                 f" The baseline's held-out loss is {baselines.min():.3f} to {baselines.max():.3f} nats.")
    loss = runs[runs.trained_ok.astype(bool)].groupby("width").heldout_loss.mean()
    if len(loss) > 1:
        text += " Mean held-out loss by width: " + ", ".join(f"N={w}: {v:.3f}" for w, v in loss.items()) + " nats; "
        rises = [f"N={a} to {b}" for a, b, x, y in zip(loss.index, loss.index[1:], loss, loss.iloc[1:]) if y > x]
        if not rises:
            text += "it falls with every increase of width, as it should when each width has a rate that fits it."
        elif loss.idxmin() == loss.index[-1]:
            text += (f"it is lowest at the widest width, though it does not fall at every step of width (it rises "
                     f"from {', '.join(rises)}).")
        else:
            text += (f"it is lowest at N={loss.idxmin()}, so the widest models are not the best trained even with "
                     "a fitted rate: read the width trends with that in mind.")
    return text


RATE_TIE = 0.005
"""Nats of validation loss below which two rates are a tie (well under the spread between seeds of one width)."""


def trials(lr: pd.DataFrame) -> pd.DataFrame:
    """The rate-fit rows without the full-length check rows (``check``)."""
    return lr[~lr.check.astype(bool)] if "check" in lr and len(lr) else lr


def describe_learning_rates(lr: pd.DataFrame, runs: pd.DataFrame | None = None) -> str:
    """The rate each width kept, whether the choice sat at the edge of the candidates, and the full-length check
    (of short trials, or of a rate carried from the narrowest width: :attr:`~dalign_core.sweep.family.SweepConfig.lr_fit`).
    ``runs`` (``<family>_runs``) names the rate each width's runs used where the rate was carried."""
    check = lr_check(lr) if len(lr) else {}
    lr = trials(lr)
    if lr.empty:
        return "No learning rate was fitted at this profile."
    chosen = lr[lr.chosen.astype(bool)].set_index("width").lr
    transfer = check.get("method") == "transfer"
    if transfer and check["passed"]:
        text = (f"The rate was fitted at N={check['fitted_width']} only, whose trials kept {check['fitted']:g} "
                "(lowest validation loss), and carried to every width by the grid's rule (μTransfer)")
        used = runs.groupby("width").lr.first() if runs is not None and len(runs) else None
        text += (": " + ", ".join(f"N={w}: {r:g}" for w, r in used.items()) + "." if used is not None else ".")
    else:
        text = "Learning rate kept per width (lowest validation loss): " + ", ".join(
            f"N={w}: {r:g}" for w, r in chosen.items()) + "."
    grids = lr.groupby("width").lr.agg(["min", "max", "count"])
    edge = [w for w, r in chosen.items() if grids.loc[w, "count"] > 1 and r in (grids.loc[w, "min"], grids.loc[w, "max"])]
    if edge:
        text += (f" At {', '.join(f'N={w}' for w in edge)} the kept rate is at the edge of that width's grid, so a "
                 "rate outside it might fit better.")
    else:
        text += (" The kept rate lies inside the fitted grid, with a worse rate on either side." if transfer and
                 check["passed"] else " Every kept rate lies inside its width's grid, with a worse rate on either side.")
    if len(chosen) > 2 and chosen.is_monotonic_decreasing and chosen.iloc[0] > chosen.iloc[-1]:
        text += " The best rate falls as width grows, as μP-style scaling predicts for Adam."
    if transfer:
        carried, neighbour = (f"{check[which]:g}" for which in ("carried", "neighbour"))
        text += (f" The trials ran {int(lr.steps.iloc[0])} steps each. Checked at full length at N={check['width']}, "
                 f"the carried rate {carried} gives a validation loss of {check['losses'][carried]:.4f} nats and its "
                 f"neighbour {neighbour} (on the side of the narrow fit's runner-up) "
                 f"{check['losses'][neighbour]:.4f}: ")
        if check["passed"]:
            text += (f"the carried rate wins by {check['margin']:.4f} nats" + (
                ", a tie at this resolution: the check cannot show the carried rate wrong, nor better than its "
                "neighbour." if check["margin"] < RATE_TIE else ", so the transfer holds at the widest width."))
        else:
            text += (f"the carried rate lost to its neighbour by {check['margin']:.4f} nats, so the transfer failed "
                     "and every width was fitted on its own grid (the rates above).")
    elif "steps" in lr and check:
        losses = ", ".join(f"{rate} gives {loss:.3f}" for rate, loss in check["losses"].items())
        text += (f" The trials ran {int(lr.steps.iloc[0])} steps each. Checked at full length at N={check['width']}, "
                 f"the two best short-trial rates give validation losses of: {losses}; "
                 + ("the short trials' choice also wins at full length."
                    if check["passed"] else
                    f"the full-length winner is {check['full_choice']:g}, not {check['short_choice']:g}, by "
                    f"{check['margin']:.4f} nats" + (": a tie at this resolution, so the short fit stands." if
                                                     check["margin"] < RATE_TIE else
                                                     ": the short trials misjudged the rate there, and the comparison "
                                                     "is only as fair as that fit.")))
    return text


def describe_rate_resolution(lr: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Whether one seed can pick the rate: the best rate's lead over the runner-up against the spread over seeds."""
    lr = trials(lr)
    if lr.empty or runs.empty:
        return ""
    finite = lr[lr.validation_loss.abs() != float("inf")]
    lead = finite.groupby("width").validation_loss.agg(lambda v: v.nsmallest(2).diff().iloc[-1] if len(v) > 1 else 0)
    ok = runs[runs.trained_ok.astype(bool)]
    spread = ok.groupby("width").heldout_loss.agg(lambda v: v.max() - v.min())
    widths = [w for w in lead.index if w in spread.index]
    if not widths:
        return ""
    text = ("The kept rate beats the runner-up by " + ", ".join(f"{lead[w]:.3f}" for w in widths) + " nats of "
            "validation loss at N = " + ", ".join(map(str, widths)) + "; at the kept rate the seeds' held-out "
            "losses spread over " + ", ".join(f"{spread[w]:.3f}" for w in widths) + " nats.")
    unresolved = [w for w in widths if lead[w] <= spread[w]]
    if unresolved:
        text += (f" At {', '.join(f'N={w}' for w in unresolved)} the seeds differ more than the two best rates do, so "
                 "the rate fitted on one seed is partly chance there: the comparison is only as fair as that fit.")
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


def describe_redundancy(redundancy: pd.DataFrame) -> str:
    """Whether the q the claims are judged on is a direction a trained parameter already owns."""
    if redundancy is None or redundancy.empty:
        return "No redundancy check was run at this profile."
    ok = redundancy[redundancy.trained_ok.astype(bool)] if "trained_ok" in redundancy else redundancy
    if ok.empty:
        return "No trained run was checked for redundancy at this profile."
    parts = []
    for reduction, part in ok.groupby("reduction", sort=False):
        fraction = part.fraction.astype(float)
        exact = part.exact.dropna() if "exact" in part else pd.Series(dtype=str)
        owner = f"; in {len(exact)} of {len(part)} runs it is exactly the gradient of `{exact.iloc[0]}`" \
            if len(exact) else ""
        parts.append(f"the {reduction} q: trained parameters' gradients explain {fraction.median():.0%} of its "
                     f"variance (median over {len(part)} runs, range {fraction.min():.0%}–{fraction.max():.0%})"
                     f"{owner}")
    text = "At the insertion point, on held-out examples, " + "; ".join(parts) + "."
    flagged = ok[ok.fraction.astype(float) > 0.9].reduction.unique()
    if len(flagged):
        text += (f" Above 90%, a q is a direction training already optimizes: its mean is driven toward zero at "
                 f"every width, so its $d_{{\\mathrm{{align}}}}$ says nothing about width ({', '.join(flagged)}).")
    return text


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
    alone (:data:`~dalign_core.sweep.trend.SIGN`) for Pythia and ResNet-20."""
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
    rows = _trained(geometry)
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
      (:func:`dalign_core.sweep.trend.clock_free_test`: runs compared at the same steps over the window where every
      width's loss passes the common level);
    * the misalignment probability falls with width at the judged (M, K) (logit p̂, same-law setting).

    Each is a slope test (:mod:`dalign_core.sweep.trend`) against the family's own claim (:func:`family_reference`):
    reproduced, contradicted, inconclusive, not estimable (d_align unresolved from 0 at most late checkpoints:
    :func:`dalign_core.sweep.trend.estimability`) or not run. With ``geometry`` (``<family>_geometry``) the d_align claims
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


def describe_final_geometry(geometry: pd.DataFrame, layer: str, step: int, pool: str = "heldout") -> str:
    """‖μ‖² and d_align by width at one checkpoint (seed means of trained runs), and whether each rises with width."""
    part = geometry[(geometry.step == step) & (geometry.layer == layer) & (geometry.pool == pool)]
    part = part[part.trained_ok.astype(bool)] if "trained_ok" in part else part
    if part.empty:
        return "No run trained at this profile."
    means = part.groupby("width")[["mean_sq", "d_align"]].mean()
    if len(means) < 2:
        return "Only one width trained, so there is no width comparison."
    sentences = []
    for column, name in (("mean_sq", "$\\|\\mu\\|^2$"), ("d_align", "$d_{\\mathrm{align}}$")):
        values = means[column]
        shape = ("rises with every increase of width" if values.is_monotonic_increasing else
                 "falls with every increase of width" if values.is_monotonic_decreasing else
                 f"is highest at N={values.idxmax()}, not monotone in width")
        sentences.append(f"{name} (seed mean, {'held-out' if pool == 'heldout' else pool} pool, step {step}) reads "
                         + ", ".join(f"{_num(v)} at N={w}" for w, v in values.items()) + f": it {shape}.")
    return " ".join(sentences)


def describe_bounds(misalignment: pd.DataFrame) -> str:
    """How often the empirical probability is consistent with B_exact and B_align where the theorem applies."""
    if misalignment.empty:
        return "No misalignment estimate was made at this profile."
    covered = misalignment[misalignment.b_exact.notna() & misalignment.trained_ok.astype(bool)]
    if covered.empty:
        return "No trained run has a misalignment estimate in the theorem's setting at this profile."
    under_exact = (covered.p_misalign_lo <= covered.b_exact).mean()
    under_align = (covered.p_misalign_lo <= covered.b_align).mean()
    slack = (covered.b_align / covered.p_misalign.clip(lower=1 / covered.trials)).median()
    return (f"Where the theorem applies (train and test means from one pool, {len(covered)} estimates), the "
            f"Wilson interval of the empirical probability reaches below $B_{{\\mathrm{{exact}}}}$ in "
            f"{under_exact:.0%} and below $B_{{\\mathrm{{align}}}}$ in {under_align:.0%} of them; the median "
            f"$B_{{\\mathrm{{align}}}}$ is {slack:.2g} times the empirical probability, the price of a one-number "
            "certificate.")


def styled(frame: pd.DataFrame, formats: dict | None = None, precision: int = 3):
    """``frame`` as a book table: no index, ``precision`` decimals, thousands separators, a dash for a missing value.

    ``formats`` maps a column to a format string or function (``{"lr": "{:g}"}``).
    """
    style = frame.style.hide(axis="index").format(precision=precision, thousands=",", na_rep=DASH)
    style = style.set_table_styles([{"selector": "th, td", "props": [("padding", "0.3em 0.75em")]}])
    for column, spec in (formats or {}).items():
        if column in frame:
            style = style.format(spec, subset=[column], na_rep=DASH)
    return style


def _spread(values: pd.Series, digits: int = 3) -> str:
    """``mean (min–max)`` of ``values``, or the one value; a dash for none."""
    values = values.dropna()
    if values.empty:
        return DASH
    if len(values) == 1 or values.min() == values.max():
        return f"{values.mean():.{digits}f}"
    return f"{values.mean():.{digits}f} ({values.min():.{digits}f}–{values.max():.{digits}f})"


def runs_summary(runs: pd.DataFrame, by: tuple[str, ...] = ("width",),
                 scores: tuple[tuple[str, str], ...] = (("heldout_loss", "held-out loss"),)) -> pd.DataFrame:
    """One row per width (and per ``by`` column) of the ``<family>_runs`` table, narrow enough for the column.

    Columns: the ``by`` values, the parameter count, the learning rate(s) the seeds
    used, each score as ``mean (min–max)`` over seeds (say so above the table), and how
    many seeds trained.
    """
    names = {"width": "width N", "depth": "layers", "dataset": "data"}
    rows = []
    if runs.empty:
        return pd.DataFrame(columns=[names.get(b, b) for b in by] + ["parameters", "learning rate"]
                            + [label for _, label in scores] + ["trained"])
    for key, part in runs.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = {names.get(b, b): value for b, value in zip(by, key)}
        row["parameters"] = f"{int(part.parameters.iloc[0]):,}" if "parameters" in part else DASH
        row["learning rate"] = ", ".join(f"{r:g}" for r in sorted(part.lr.unique())) if "lr" in part else DASH
        for column, label in scores:
            row[label] = _spread(part[column]) if column in part else DASH
        trained = int(part.trained_ok.astype(bool).sum()) if "trained_ok" in part else len(part)
        row["trained"] = f"{trained} of {len(part)}"
        rows.append(row)
    return pd.DataFrame(rows)


def _trained(table: pd.DataFrame) -> pd.DataFrame:
    return table[table.trained_ok.astype(bool)] if "trained_ok" in table and len(table) else table


def _factor(value: float) -> str:
    return _num(value) if value >= 1e4 else f"{value:,.0f}" if value >= 100 else f"{value:.2g}"


def describe_trajectory(geometry: pd.DataFrame, layer: str, steps: int, pool: str = "heldout") -> str:
    """How far d_align moves from initialization to the last checkpoint (seed means of trained runs)."""
    part = _trained(geometry)
    part = part[(part.layer == layer) & (part.pool == pool)] if len(part) else part
    held = part.groupby(["width", "step"]).d_align.mean().unstack() if len(part) else pd.DataFrame()
    if held.empty or 0 not in held or steps not in held:
        return "No run trained at this profile, so the trajectories above show failed runs only."
    start, end = held[0], held[steps]
    ratio = (start / end.where(end > 0)).dropna()
    if ratio.empty:
        change = "reaches 0"
    elif (ratio > 1).all():
        change = f"falls by a factor of {_factor(ratio.min())} to {_factor(ratio.max())}"
    elif (ratio < 1).all():
        change = f"rises by a factor of {_factor(1 / ratio.max())} to {_factor(1 / ratio.min())}"
    else:
        change = f"changes by a factor of {_factor(ratio.min())} to {_factor(ratio.max())} (start / end)"
    return (f"From initialization to step {steps} the {'held-out' if pool == 'heldout' else pool} "
            f"$d_{{\\mathrm{{align}}}}$ {change} across widths (seed means: " + ", ".join(
                f"{_num(a)} → {_num(b)} at $N = {w}$" for w, a, b in zip(held.index, start, end))
            + "). A width comparison is therefore only meaningful at a matched, stated stage of training.")


def describe_limiting_dimension(geometry: pd.DataFrame, layer: str, step: int, pool: str = "heldout") -> str:
    """Which of d_∥ and d_2 sets d_align = min(d_∥, d_2) at one checkpoint, and by how much.

    Runs whose unbiased ‖μ‖⁴ estimate is not positive (every dimension reads 0) and
    runs whose μᵀΣμ estimate is not positive (d_∥ infinite) are counted apart.
    """
    part = _trained(geometry)
    part = part[(part.layer == layer) & (part.pool == pool) & (part.step == step)] if len(part) else part
    part = part.dropna(subset=["d_par", "d_2"]) if len(part) else part
    if part.empty:
        return "No run trained at this profile."
    lost = (part.mean_sq_sq <= 0) if "mean_sq_sq" in part else (part.d_align <= 0)
    rest = part[~lost]
    infinite = int((rest.d_par == float("inf")).sum())
    by_d2 = int((rest.d_2 <= rest.d_par).sum())
    text = f"Of the {len(part)} trained runs at step {step}, "
    if lost.any():
        text += (f"{int(lost.sum())} have an unbiased $\\|\\mu\\|^4$ estimate that is not positive, so every "
                 "dimension reads 0 there: the mean is lost in the noise. ")
        text += f"Of the other {len(rest)}, " if len(rest) else ""
    if rest.empty:
        return text.rstrip() if lost.any() else text + "none has a positive estimate."
    text += f"$d_2 \\le d_\\parallel$ in {by_d2}"
    if infinite:
        text += (f" ({infinite} with a $\\mu^\\top\\Sigma\\mu$ estimate that is not positive, so $d_\\parallel$ "
                 "is infinite and not drawn)")
    text += (": the covariance energy $\\mathrm{tr}\\,\\Sigma^2$, not the spread along $\\mu$, sets "
             "$d_{\\mathrm{align}}$." if by_d2 * 2 > len(rest) else
             ": the spread along $\\mu$ ($\\mu^\\top\\Sigma\\mu$) mostly sets $d_{\\mathrm{align}}$.")
    finite = rest[(rest.d_2 > 0) & (rest.d_par < float("inf"))]
    ratio = finite.d_par / finite.d_2
    if len(ratio):
        text += f" Where both are finite and positive, $d_\\parallel / d_2$ ranges from {_factor(ratio.min())} to " \
                f"{_factor(ratio.max())}."
    return text


def describe_layers(geometry: pd.DataFrame, step: int, pool: str = "heldout") -> str:
    """The insertion point with the highest seed-mean d_align at each width, at one checkpoint."""
    part = _trained(geometry)
    part = part[(part.step == step) & (part.pool == pool)] if len(part) else part
    if part.empty:
        return "No run trained at this profile."
    means = part.groupby(["width", "layer"]).d_align.mean()
    best = means.groupby(level="width").idxmax().map(lambda key: key[1])
    text = "The highest $d_{\\mathrm{align}}$ sits at " + ", ".join(
        f"`{layer}` for $N = {w}$ ({_num(means[(w, layer)])})" for w, layer in best.items()) + "."
    if best.nunique() == 1 and len(best) > 1:
        text += " The best insertion point is the same at every width."
    elif len(best) > 1:
        text += f" The best insertion point changes with width ({best.nunique()} different layers)."
    return text


def describe_budget(misalignment: pd.DataFrame) -> str:
    """How the held-out/held-out misalignment probability moves with the budget M = K, per width."""
    part = _trained(misalignment)
    part = part[(part.setting == "heldout/heldout") & (part.M == part.K)] if len(part) else part
    curves = part.groupby(["width", "M"]).p_misalign.mean().unstack() if len(part) else pd.DataFrame()
    if curves.empty:
        return "No run trained at this profile."
    falling = [w for w, row in curves.iterrows() if row.is_monotonic_decreasing and row.iloc[-1] < row.iloc[0]]
    return (f"The misalignment probability falls with every increase of the budget at {len(falling)} of "
            f"{len(curves)} widths (from {curves.iloc[:, 0].mean():.2f} at $M = K = {curves.columns[0]}$ to "
            f"{curves.iloc[:, -1].mean():.2f} at $M = K = {curves.columns[-1]}$, averaged over widths): sample size "
            "lowers misalignment whatever the geometry.")


def describe_context(units: pd.DataFrame) -> str:
    """How the sequence-unit, shared-reduction d_align moves from the shortest to the longest context."""
    part = _trained(units)
    part = part[(part.unit == "sequence") & (part.reduction == "shared")] if len(part) else part
    table = part.pivot_table(index="width", columns="context", values="d_align") if len(part) else pd.DataFrame()
    if table.empty or table.shape[1] < 2:
        return "No run trained at this profile." if table.empty else "Only one context was measured."
    first, last = table.iloc[:, 0], table.iloc[:, -1]
    rise = (last / first.where(first > 0)).dropna()
    if rise.empty:
        return "The shortest context's $d_{\\mathrm{align}}$ is 0 at every width, so no ratio is given."
    direction = "rises" if (rise > 1).all() else "falls" if (rise < 1).all() else "changes"
    return (f"From context {table.columns[0]} to {table.columns[-1]}, the sequence-unit "
            f"$d_{{\\mathrm{{align}}}}$ {direction} by a factor of {_factor(rise.min())} to {_factor(rise.max())} "
            "across widths. A sequence sums its tokens' gradients, so per-token noise averages down as the context "
            "grows while the common part adds up: the unit of a sample is part of what $d_{\\mathrm{align}}$ "
            "measures, and numbers are comparable only at the same unit and context.")


def describe_sample_choice(units: pd.DataFrame, context: int | None = None) -> str:
    """The three sample choices at one context (default the longest): their d_align, and where it reads 0."""
    part = _trained(units)
    if part.empty:
        return "No run trained at this profile."
    context = context if context is not None else int(units.context.max())
    part = part[part.context == context]
    means = part.groupby(["unit", "reduction"]).d_align.median()
    text = (f"At context {context}, the median over widths of $d_{{\\mathrm{{align}}}}$ is " + ", ".join(
        f"{_num(value)} for {unit} / {reduction}" for (unit, reduction), value in means.items()) + ".")
    token = part[part.unit == "token"]
    if len(token):
        zero = int((token.d_align <= 0).sum())
        text += (f" With one token's own loss as the sample, the unbiased estimate of $\\|\\mu\\|^4$ is not "
                 f"positive in {zero} of {len(token)} cases ({int(token.n.iloc[0])} tokens each): a single "
                 "token's gradient is so noisy that its mean is lost, and $d_{\\mathrm{align}}$ reads 0."
                 if zero else " Every token-unit estimate is positive.")
    return text


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


REGIME_COLUMNS = ("depth", "dataset", "context")
"""The columns that tell a family's sibling sweeps apart (Pythia's depth regimes, ResNet's data sets, the context
study's contexts)."""


def summarize(results_dir: str | Path) -> str:
    """A plain-text summary of every width sweep in ``results_dir``: runs, rates and verdicts per regime (for a commit
    message)."""
    results_dir = Path(results_dir)
    lines = []
    for runs_csv in sorted(results_dir.glob("*_runs.csv")):
        family = runs_csv.name[: -len("_runs.csv")]
        runs, provenance = read_table(results_dir, f"{family}_runs")
        tables = {"runs": runs, **{name: read_table(results_dir, f"{family}_{name}")[0]
                                   for name in ("lr", "trend", "misalignment", "geometry")}}
        git = provenance.get("git", {})
        device = ", ".join(sorted({str(s.get("device")) for s in sweep_records(provenance)}))
        lines += [f"== {family} at profile {provenance.get('profile')}: {device}, "
                  f"{provenance.get('wall_time_s', 0) / 60:.1f} min, commit {str(git.get('commit'))[:10]}"
                  f"{' (dirty tree)' if git.get('dirty') else ''}"]
        column = next((c for c in REGIME_COLUMNS if c in tables["runs"]), None)
        regimes = by_regime(tables, column) if column else {None: tables}
        for regime, part in regimes.items():
            runs, misalignment = part["runs"], part["misalignment"]
            if regime is not None:
                lines.append(f"-- {column} {regime}")
            if not runs.empty:
                lines.append(runs[["width", "seed", "lr", "heldout_loss", "baseline_loss", "trained_ok"]].to_string(
                    index=False))
            lines += [describe_runs(runs), describe_learning_rates(part["lr"])]
            layer = misalignment.layer.iloc[0] if not misalignment.empty else ""
            scale = SCALE if len(runs) and at_this_scale(
                family, sorted(runs.width.unique()), depth=regime if column == "depth" else None,
                dataset=regime if column == "dataset" else None) else ""
            lines += ([v.sentence for v in width_verdicts(part["trend"], layer, geometry=part["geometry"],
                                                          family=family, scale=scale)] if layer else
                      ["No trend: nothing was measured."])
        lines.append("")
    for provenance_json in sorted(results_dir.glob("theory_*.json")):
        record = json.loads(provenance_json.read_text())
        lines.append(f"== {provenance_json.stem}: {record.get('rows')} rows in {record.get('wall_time_s')} s")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Summarize the width sweeps in a results folder.")
    parser.add_argument("results_dir", type=Path, help="e.g. results/gpu")
    print(summarize(parser.parse_args().results_dir))
