"""Sentences a chapter prints about a width sweep, generated from its results tables.

Every sentence that describes our runs, or compares our numbers with the paper's,
comes from here: the chapter never types a number or a verdict. The inputs are the
tables :mod:`dalign_core.sweep` writes (``<family>_runs``, ``_lr``, ``_trend``,
``_misalignment``), read back with :func:`dalign_core.results.read_table`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from dalign_core.results import read_table
from dalign_core.trend import Verdict, verdict

__all__ = ["by_regime", "describe_accuracy", "describe_runs", "describe_learning_rates", "describe_final_geometry",
           "describe_rate_resolution", "width_verdicts", "describe_bounds", "summarize"]


def _widths(frame: pd.DataFrame) -> str:
    return ", ".join(f"N={w}" for w in sorted(frame.width.unique()))


def by_regime(tables: dict[str, pd.DataFrame], column: str) -> dict:
    """Split every table by ``column`` (a Pythia depth, a ResNet data set): value → tables of that sweep alone."""
    values = sorted(tables["runs"][column].unique()) if column in tables["runs"] else []
    return {value: {name: (frame[frame[column] == value] if column in frame else frame)
                    for name, frame in tables.items()} for value in values}


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
    loss = runs[runs.trained_ok.astype(bool)].groupby("width").heldout_loss.mean()
    if len(loss) > 1:
        text += " Mean held-out loss by width: " + ", ".join(f"N={w}: {v:.3f}" for w, v in loss.items()) + " nats; "
        if loss.is_monotonic_decreasing:
            text += "it falls with every increase of width, as it should when each width has a rate that fits it."
        else:
            text += (f"it is lowest at N={loss.idxmin()}, so the widest models are not the best trained even with "
                     "a fitted rate: read the width trends with that in mind.")
    return text


def describe_learning_rates(lr: pd.DataFrame) -> str:
    """The rate each width kept, and whether the choice sat at the edge of the candidates."""
    if lr.empty:
        return "No learning rate was fitted at this profile."
    chosen = lr[lr.chosen.astype(bool)].set_index("width").lr
    text = "Learning rate kept per width (lowest validation loss): " + ", ".join(
        f"N={w}: {r:g}" for w, r in chosen.items()) + "."
    grids = lr.groupby("width").lr.agg(["min", "max", "count"])
    edge = [w for w, r in chosen.items() if grids.loc[w, "count"] > 1 and r in (grids.loc[w, "min"], grids.loc[w, "max"])]
    if edge:
        text += (f" At {', '.join(f'N={w}' for w in edge)} the kept rate is at the edge of that width's grid, so a "
                 "rate outside it might fit better.")
    else:
        text += " Every kept rate lies inside its width's grid, with a worse rate on either side."
    if len(chosen) > 2 and chosen.is_monotonic_decreasing and chosen.iloc[0] > chosen.iloc[-1]:
        text += " The best rate falls as width grows, as μP-style scaling predicts for Adam."
    return text


def describe_rate_resolution(lr: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Whether one seed can pick the rate: the best rate's lead over the runner-up against the spread over seeds."""
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


def width_verdicts(trend: pd.DataFrame, layer: str, pool: str = "heldout") -> list[Verdict]:
    """The chapter's verdicts on the paper's width claims, from the ``<family>_trend`` table.

    * d_align rises with width at matched steps (every checkpoint of the last third);
    * d_align rises with width at matched held-out loss (every level);
    * the misalignment probability falls with width at fixed (M, K) (every budget, same-law setting).
    """
    def rows(**match) -> pd.DataFrame:
        if trend.empty:
            return trend
        keep = pd.Series(True, index=trend.index)
        for column, value in match.items():
            keep &= trend[column] == value
        return trend[keep]

    step_rows = rows(quantity="d_align", view="matched_step", layer=layer, pool=pool)
    if not step_rows.empty:
        step_rows = step_rows[step_rows.last_third.astype(bool)]
    return [
        verdict(step_rows, f"d_align rises with width at {layer} ({pool} pool, matched steps)",
                where="checkpoints in the last third of training"),
        verdict(rows(quantity="d_align", view="matched_loss", layer=layer, pool=pool),
                f"d_align rises with width at {layer} ({pool} pool, matched held-out loss)",
                where="matched-loss levels"),
        verdict(rows(quantity="p_misalign", view="budget", layer=layer, setting="heldout/heldout"),
                "The misalignment probability falls with width at fixed (M, K)", direction="falls",
                where="budgets"),
    ]


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
        sentences.append(f"{name} (seed mean, {pool} pool, step {step}) reads " + ", ".join(
            f"{v:.3g} at N={w}" for w, v in values.items()) + f": it {shape}.")
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
            f"Wilson interval of the empirical probability reaches below B_exact in {under_exact:.0%} and below "
            f"B_align in {under_align:.0%} of them; the median B_align is {slack:.2g} times the empirical "
            "probability, the price of a one-number certificate.")


def summarize(results_dir: str | Path) -> str:
    """A plain-text summary of every width sweep in ``results_dir``: runs, rates and verdicts (for a commit message)."""
    results_dir = Path(results_dir)
    lines = []
    for runs_csv in sorted(results_dir.glob("*_runs.csv")):
        family = runs_csv.name[: -len("_runs.csv")]
        runs, provenance = read_table(results_dir, f"{family}_runs")
        lr, _ = read_table(results_dir, f"{family}_lr")
        trend, _ = read_table(results_dir, f"{family}_trend")
        misalignment, _ = read_table(results_dir, f"{family}_misalignment")
        git = provenance.get("git", {})
        lines += [f"== {family} at profile {provenance.get('profile')}: {provenance.get('device')}, "
                  f"{provenance.get('wall_time_s', 0) / 60:.1f} min, commit {str(git.get('commit'))[:10]}"
                  f"{' (dirty tree)' if git.get('dirty') else ''}"]
        if not runs.empty:
            lines.append(runs[["width", "seed", "lr", "heldout_loss", "baseline_loss", "trained_ok"]].to_string(
                index=False))
        lines += [describe_runs(runs), describe_learning_rates(lr)]
        layer = misalignment.layer.iloc[0] if not misalignment.empty else ""
        lines += [v.sentence for v in width_verdicts(trend, layer)] if layer else ["No trend: nothing was measured."]
        lines.append("")
    for provenance_json in sorted(results_dir.glob("theory_*.json")):
        record = json.loads(provenance_json.read_text())
        lines.append(f"== {provenance_json.stem}: {record.get('rows')} rows in {record.get('wall_time_s')} s")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Summarize the width sweeps in a results folder.")
    parser.add_argument("results_dir", type=Path, help="e.g. results/gpu")
    print(summarize(parser.parse_args().results_dir))
