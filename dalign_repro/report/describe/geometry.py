"""Sentences about what a width sweep measured: d_align along training and at the last checkpoint, which of d_∥
and d_2 sets it, the layers, the misalignment bounds and budgets, the sample unit and context, and whether
the judged q is a direction a trained parameter already owns.
"""

from __future__ import annotations

import pandas as pd

from dalign_repro.report.describe.text import number, trained_rows

__all__ = ["describe_trajectory", "describe_limiting_dimension", "describe_layers", "describe_final_geometry",
           "describe_bounds", "describe_budget", "describe_context", "describe_sample_choice", "describe_redundancy"]


def _factor(value: float) -> str:
    return number(value) if value >= 1e4 else f"{value:,.0f}" if value >= 100 else f"{value:.2g}"


def describe_trajectory(geometry: pd.DataFrame, layer: str, steps: int, pool: str = "heldout") -> str:
    """How far d_align moves from initialization to the last checkpoint (seed means of trained runs)."""
    part = trained_rows(geometry)
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
                f"{number(a)} → {number(b)} at $N = {w}$" for w, a, b in zip(held.index, start, end))
            + "). A width comparison is therefore only meaningful at a matched, stated stage of training.")


def describe_limiting_dimension(geometry: pd.DataFrame, layer: str, step: int, pool: str = "heldout") -> str:
    """Which of d_∥ and d_2 sets d_align = min(d_∥, d_2) at one checkpoint, and by how much.

    Runs whose unbiased ‖μ‖⁴ estimate is not positive (every dimension reads 0) and
    runs whose μᵀΣμ estimate is not positive (d_∥ infinite) are counted apart.
    """
    part = trained_rows(geometry)
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
    part = trained_rows(geometry)
    part = part[(part.step == step) & (part.pool == pool)] if len(part) else part
    if part.empty:
        return "No run trained at this profile."
    means = part.groupby(["width", "layer"]).d_align.mean()
    best = means.groupby(level="width").idxmax().map(lambda key: key[1])
    text = "The highest $d_{\\mathrm{align}}$ sits at " + ", ".join(
        f"`{layer}` for $N = {w}$ ({number(means[(w, layer)])})" for w, layer in best.items()) + "."
    if best.nunique() == 1 and len(best) > 1:
        text += " The best insertion point is the same at every width."
    elif len(best) > 1:
        text += f" The best insertion point changes with width ({best.nunique()} different layers)."
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
                         + ", ".join(f"{number(v)} at N={w}" for w, v in values.items()) + f": it {shape}.")
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


def describe_budget(misalignment: pd.DataFrame) -> str:
    """How the held-out/held-out misalignment probability moves with the budget M = K, per width."""
    part = trained_rows(misalignment)
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
    part = trained_rows(units)
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
    part = trained_rows(units)
    if part.empty:
        return "No run trained at this profile."
    context = context if context is not None else int(units.context.max())
    part = part[part.context == context]
    means = part.groupby(["unit", "reduction"]).d_align.median()
    text = (f"At context {context}, the median over widths of $d_{{\\mathrm{{align}}}}$ is " + ", ".join(
        f"{number(value)} for {unit} / {reduction}" for (unit, reduction), value in means.items()) + ".")
    token = part[part.unit == "token"]
    if len(token):
        zero = int((token.d_align <= 0).sum())
        text += (f" With one token's own loss as the sample, the unbiased estimate of $\\|\\mu\\|^4$ is not "
                 f"positive in {zero} of {len(token)} cases ({int(token.n.iloc[0])} tokens each): a single "
                 "token's gradient is so noisy that its mean is lost, and $d_{\\mathrm{align}}$ reads 0."
                 if zero else " Every token-unit estimate is positive.")
    return text


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
