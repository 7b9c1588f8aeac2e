"""Sentences and tables about a width sweep's runs: which trained, how the loss moves with width, the rates kept
and whether one seed can pick them.
"""

from __future__ import annotations

import pandas as pd

from dalign_repro.sweep.rates import lr_check
from dalign_repro.report.describe.text import DASH

__all__ = ["by_regime", "sweep_records", "judged_only", "describe_accuracy", "describe_runs", "RATE_TIE", "trials",
           "describe_learning_rates", "describe_rate_resolution", "runs_summary"]


def by_regime(tables: dict[str, pd.DataFrame], column: str) -> dict:
    """Split every table by ``column`` (a Pythia depth, a ResNet data set): value → tables of that sweep alone."""
    values = sorted(tables["runs"][column].unique()) if column in tables["runs"] else []
    return {value: {name: (frame[frame[column] == value] if column in frame else frame)
                    for name, frame in tables.items()} for value in values}


def sweep_records(provenance: dict) -> list[dict]:
    """The per-sweep part of a width experiment's provenance: one record per regime of a family with sibling sweeps
    (``provenance["sweeps"]``: Pythia's depths, ResNet's data sets), else the provenance itself (one sweep)."""
    return provenance.get("sweeps") or [provenance]


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
    (of short trials, or of a rate carried from the narrowest width: :attr:`~dalign_repro.sweep.family.SweepConfig.lr_fit`).
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
