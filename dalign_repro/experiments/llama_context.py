"""The context study: d_align and its width trend against the length of one sample.

A sequence's shared q (the gradient of its mean next-token loss at a decoder layer,
summed over positions) adds up its tokens' gradients. The common part of those
gradients adds coherently while their noise partly averages out, so d_∥ and d_2, and
with them d_align, grow with the context T (measured on the cpu LLaMA models: 4-10x
from T = 16 to 64). The paper's d_align of 3.9-9.5 is far above what the cpu profile's
T = 128 models read (about 0.03). This experiment asks where our magnitudes meet the
paper's and whether the width slope changes with context.

The design holds everything but the context fixed, one sweep per context (told apart
by the ``context`` column of every table, as Pythia's depth regimes are):

* the LLaMA family of :mod:`dalign_repro.experiments.llama_width` (depth 2, head dim 32,
  vocabulary 2,048), with the rate fitted at the narrowest width and carried as 1/N;
* the same tokens per optimizer step at every context (``tokens_per_step``: batch
  ``tokens_per_step / T``), but never fewer than ``min_sequences_per_step`` sequences, and
  the same number of steps. At 2,048 tokens a step, T = 1,024 got 2 sequences and
  T = 2,048 one: 6 of 9 and 9 of 9 of those runs missed their bigram baseline, so
  context was confounded with how well the model trained. With at least 4 sequences a
  step, a long context sees more tokens than a short one; the runs table says whether
  each trained, and a context with fewer than two trained widths has no trend;
* the q pool, the evaluation set and the train pool each hold the same number of tokens
  at every context (``pool_tokens``: ``pool_tokens / T`` sequences), so every context is
  measured on the same held-out text and at the same cost;
* the corpus is the pinned packages' Python sources (:mod:`dalign_repro.data.python_sources`),
  split by whole package: its held-out package holds about 1,600 sequences of 2,048 tokens,
  where Shakespeare's held-out works hold 224 of 1,024.

Run without Jupyter: ``python -m dalign_repro.experiments.llama_context --profile cpu``
(``--dry-run`` projects the wall time first).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
# scipy.stats is imported by the functions that use it: importing it costs 1.3 s of CPU, paid at start-up by
# every process importing this module (a dry run, a torchrun rank, --print-config) that never uses it.

from dalign_repro.config import added_field, require_at_least
from dalign_repro.experiments.llama_width import Config as LlamaConfig
from dalign_repro.experiments._sweeps import sweep_experiment
from dalign_repro.families import family
from dalign_repro.sweep.trend import PAPER_D_ALIGN


@dataclass(frozen=True)
class Config(LlamaConfig):
    """The context study (defaults: the ``cpu`` profile; see ``PROFILES`` for the others).

    ``context``, ``batch_size``, ``pool_size``, ``eval_examples`` and ``validation_examples`` are set per
    context by :meth:`sweeps` from ``contexts``, ``tokens_per_step`` and ``pool_tokens``.
    """

    contexts: tuple[int, ...] = (128, 512, 1024)
    """T = 2,048 is left out at cpu: at 4 sequences a step it costs 4x the tokens of T = 128 a step (about 2 CPU-hours
    for its 9 runs on this machine), and at 1 sequence a step (2,048 tokens) none of its 9 runs beat the baseline."""
    tokens_per_step: int = 2048
    """Training tokens per optimizer step where that is at least ``min_sequences_per_step`` sequences: batch 16 x 128
    and 4 x 512; at T = 1,024 the floor holds (4 x 1,024 tokens)."""
    min_sequences_per_step: int = added_field(4, neutral=1)
    """The fewest sequences in one optimizer step. A probe at T = 1,024 with 4 x 1,024 tokens a step trained both
    widths it tried (held-out 4.195 and 4.057 against the bigram 4.386) where 2 x 1,024 trained neither."""
    pool_tokens: int = 131_072
    """Tokens in each q pool and in the evaluation set at every context: 1,024 sequences of 128, 64 of 2,048."""
    corpus: str = "python-sources"
    widths: tuple[int, ...] = (32, 64, 128)
    """N = 256 is left out at cpu: at T = 2,048 one of its captures costs 0.76 s per sequence on one core and its
    training 0.48 s per step (measured), about 3x N = 128, which the three contexts cannot afford on 2 cores."""
    seeds: int = 3
    run_sd: float | None = None
    checkpoint_steps: tuple[int, ...] = (0, 150, 300, 450, 500, 550, 600)
    """The late window (steps 450-600, the last quarter) holds 4 checkpoints; 0-300 show the trajectory."""
    all_layer_steps: tuple[int, ...] | None = (600,)
    train_pool_steps: tuple[int, ...] | None = (600,)
    checkpoint_pool_size: int | None = None
    budgets: tuple[tuple[int, int], ...] = ((4, 4), (8, 8), (16, 16))
    redundancy_examples: int = 0
    """The shared q of a LLaMA decoder layer is owned by no trained parameter (measured in the width chapter)."""
    unit_contexts: tuple[int, ...] = (32,)

    def __post_init__(self):
        require_at_least(self, {"min_sequences_per_step": 1})
        if not self.contexts or min(self.contexts) < 2:
            raise ValueError(f"contexts {self.contexts} must be one or more sequence lengths of at least 2 tokens")
        for field, value, least in (("tokens_per_step", self.tokens_per_step, 1), ("pool_tokens", self.pool_tokens, 4)):
            uneven = [t for t in self.contexts if value % t or value < least * t]
            if uneven:
                raise ValueError(f"{field}={value} must be a multiple of every context and hold at least {least} "
                                 f"sequence(s) of each; it does not at contexts {uneven}")
        short = [t for t in self.contexts if not self.budgets_at(t)]
        if short:
            raise ValueError(f"pool_tokens={self.pool_tokens} leaves no budget of {self.budgets} with M + K at most a "
                             f"quarter of the pool at contexts {short}; use a larger pool_tokens or smaller budgets")
        super().__post_init__()

    def sweeps(self) -> list["Config"]:
        """One sweep per context, each with the same tokens per step and per pool."""
        return [replace(self, contexts=(t,), context=t, batch_size=self.batch_at(t),
                        pool_size=self.pool_tokens // t, eval_examples=self.pool_tokens // t,
                        validation_examples=self.pool_tokens // t, capture_batch=min(self.capture_batch,
                                                                                       self.pool_tokens // t),
                        budgets=self.budgets_at(t), unit_contexts=tuple(u for u in self.unit_contexts if u <= t) or (t,))
                for t in self.contexts]

    def batch_at(self, context: int) -> int:
        """Sequences per optimizer step at ``context``: ``tokens_per_step / context``, at least ``min_sequences_per_step``."""
        return max(self.tokens_per_step // context, self.min_sequences_per_step)

    def budgets_at(self, context: int) -> tuple[tuple[int, int], ...]:
        """The budgets (M, K) a pool of ``pool_tokens / context`` sequences holds with M + K at most a quarter of it
        (the sweep's rule, so the two means share little): at cpu, (16, 16) is left out at T = 2,048 (64 sequences)."""
        return tuple(b for b in self.budgets if sum(b) <= self.pool_tokens // context // 4)


EXPERIMENT = sweep_experiment("llama_context", Config, "llama_context", description=__doc__)
FAMILY, TABLES = family("llama_context"), EXPERIMENT.tables
run = EXPERIMENT.run  # run(config, out_dir=None, force=False): the tables, skipped when current unless force
dry_run = EXPERIMENT.dry_run  # dry_run(config): build, time a few steps, project the wall time


# ---------------------------------------------------------------------------
# Reading the tables: d_align against context, and the width slope at each context

PAPER_BAND = PAPER_D_ALIGN
"""The paper's d_align of its trained LLaMA-style models (:data:`~dalign_repro.sweep.trend.PAPER_D_ALIGN`)."""
VALUES = ("d_align", "d_par", "d_2")


def _judged_rows(geometry: pd.DataFrame, layer: str, pool: str = "heldout") -> pd.DataFrame:
    ok = geometry.trained_ok.astype(bool) if "trained_ok" in geometry else True
    return geometry[ok & (geometry.layer == layer) & (geometry.pool == pool)]


def late_means(geometry: pd.DataFrame, layer: str, steps: int, pool: str = "heldout") -> pd.DataFrame:
    """Per run (context, width, seed): the geometric mean of d_align, d_∥ and d_2 over the last quarter of training.

    Only trained runs; an estimate that is 0 or less (its ‖μ‖⁴ estimated at or below 0) is left out of its run's mean,
    never floored, and ``dropped`` counts them. Columns: context, width, seed, d_align, d_par, d_2, checkpoints, dropped.
    """
    rows = _judged_rows(geometry, layer, pool)
    rows = rows[rows.step >= 0.75 * steps]
    out = []
    for (context, width, seed), run in rows.groupby(["context", "width", "seed"]):
        record = dict(context=int(context), width=int(width), seed=int(seed), checkpoints=len(run))
        for value in VALUES:
            positive = run[value][(run[value] > 0) & np.isfinite(run[value])]
            record[value] = float(np.exp(np.log(positive).mean())) if len(positive) else float("nan")
        record["dropped"] = int((run.d_align <= 0).sum())
        out.append(record)
    columns = ["context", "width", "seed", *VALUES, "checkpoints", "dropped"]
    return pd.DataFrame(out, columns=columns).astype({"context": int, "width": int, "seed": int, **dict.fromkeys(
        VALUES, float), "checkpoints": int, "dropped": int})


def _ols(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, int]:
    """Least squares of ``y`` on the columns of ``x``: (coefficients, their t-interval half-widths, residual df)."""
    from scipy import stats
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - x.shape[1]
    if df < 1:
        return coef, np.full(len(coef), np.nan), df
    sigma2 = float(((y - x @ coef) ** 2).sum() / df)
    se = np.sqrt(np.diag(sigma2 * np.linalg.pinv(x.T @ x)))
    return coef, stats.t.ppf(0.5 + confidence / 2, df) * se, df


def context_slopes(late: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per width and value: the slope of log value on log context over runs (seeds as replicates), with its interval.

    The theory of a sum of T token gradients predicts about 1 for d_∥ and 2 for d_2 when the tokens' noise is
    independent and their common part shared; correlated tokens give less. ``late`` holds trained runs only
    (:func:`late_means`), so a width's exponent is fitted over the contexts at which it trained; ``contexts`` names
    them ("/"-joined). Columns: width, value, slope, lo, hi, runs, contexts.
    """
    out = []
    for width, runs in late.groupby("width"):
        for value in VALUES:
            part = runs[np.isfinite(runs[value]) & (runs[value] > 0)]
            if part.context.nunique() < 2:
                continue
            x = np.column_stack([np.ones(len(part)), np.log(part.context)])
            coef, half, _ = _ols(x, np.log(part[value].to_numpy()), confidence)
            out.append(dict(width=int(width), value=value, slope=coef[1], lo=coef[1] - half[1], hi=coef[1] + half[1],
                            runs=len(part), contexts="/".join(str(int(t)) for t in sorted(part.context.unique()))))
    return pd.DataFrame(out, columns=["width", "value", "slope", "lo", "hi", "runs", "contexts"])


def slope_change(late: pd.DataFrame, confidence: float = 0.95) -> dict | None:
    """How the width slope of log d_align changes per unit log context: the log N x log T interaction.

    Fitted on the run means with a level per context (log d_align ~ context + log N + log N·log T), so the
    interaction compares width slopes within contexts, not levels across them. None with fewer than two contexts.
    """
    part = late[np.isfinite(late.d_align) & (late.d_align > 0)]
    contexts = sorted(part.context.unique())
    if len(contexts) < 2 or part.width.nunique() < 2:
        return None
    log_n = np.log(part.width.to_numpy()) - np.log(part.width).mean()
    log_t = np.log(part.context.to_numpy()) - np.log(part.context).mean()
    levels = np.column_stack([(part.context.to_numpy() == t).astype(float) for t in contexts])
    coef, half, df = _ols(np.column_stack([levels, log_n, log_n * log_t]), np.log(part.d_align.to_numpy()), confidence)
    return dict(change=coef[-1], lo=coef[-1] - half[-1], hi=coef[-1] + half[-1], df=df, runs=len(part))


def band_meeting(geometry: pd.DataFrame, layer: str, steps: int, band: tuple[float, float] = PAPER_BAND) -> pd.DataFrame:
    """Per context: the median over runs of the late-quarter d_align, the highest seed-mean d_align of any width at
    any checkpoint of training (every one after step 0; and that step), and the seed means at step 0 (the untrained
    models), each against the paper's band. Trained runs only.

    Columns: context, late_median, late_in_band, peak, peak_step, peak_width, peak_reaches_band, checkpoints (the
    checkpoints after step 0 read), init_low, init_high (the lowest and highest width's seed mean at step 0),
    init_reaches_band.
    """
    late = late_means(geometry, layer, steps)
    every = _judged_rows(geometry, layer)
    rows = every[every.step > 0]
    out = []
    for context in sorted(late.context.unique()):
        median = float(late[late.context == context].d_align.median())
        curve = rows[rows.context == context].groupby(["width", "step"]).d_align.mean()
        (width, step), peak = (curve.idxmax(), float(curve.max())) if len(curve) else ((None, None), float("nan"))
        init = every[(every.context == context) & (every.step == 0)].groupby("width").d_align.mean()
        low, high = (float(init.min()), float(init.max())) if len(init) else (float("nan"), float("nan"))
        out.append(dict(context=int(context), late_median=median, late_in_band=band[0] <= median <= band[1],
                        peak=peak, peak_step=step, peak_width=width, peak_reaches_band=peak >= band[0],
                        checkpoints=int(rows[rows.context == context].step.nunique()), init_low=low, init_high=high,
                        init_reaches_band=high >= band[0]))
    return pd.DataFrame(out)


def _fmt(value: float) -> str:
    return f"{value:.2g}" if abs(value) < 100 else f"{value:.0f}"


def describe_band(meeting: pd.DataFrame, band: tuple[float, float] = PAPER_BAND) -> str:
    """One generated sentence: at which context our late-training d_align (and its peak along training) meets the
    paper's band."""
    if meeting.empty:
        return "No run trained at this profile, so no context can be set beside the paper's band."
    late = ", ".join(f"{_fmt(r.late_median)} at $T = {r.context}$" for r in meeting.itertuples())
    inside = meeting[meeting.late_in_band]
    first_peak = meeting[meeting.peak_reaches_band]
    where = (f"it lies in the paper's band ({band[0]}–{band[1]}) from $T = {inside.context.min()}$"
             if len(inside) else f"at no context does it reach the paper's band ({band[0]}–{band[1]})")
    every = int(meeting.checkpoints.max()) if "checkpoints" in meeting and len(meeting) else 0
    peak = (f"; along training, a width's seed mean first reaches the band's lower end at $T = "
            f"{first_peak.context.min()}$ ({_fmt(first_peak.iloc[0].peak)} at step {int(first_peak.iloc[0].peak_step)}, "
            f"$N = {int(first_peak.iloc[0].peak_width)}$)" if len(first_peak) else
            f"; no width's seed mean reaches it at any of the {every} checkpoints of training either")
    text = (f"Over the last quarter of training the median $d_{{\\mathrm{{align}}}}$ of our runs is {late}: {where}"
            f"{peak}.")
    if "init_low" in meeting and np.isfinite(meeting.init_high).any():
        start = ", ".join(f"{_fmt(r.init_low)}–{_fmt(r.init_high)} at $T = {r.context}$" for r in meeting.itertuples())
        reach = meeting[meeting.init_reaches_band]
        text += (f" At step 0, before any training, the widths' seed means are {start}"
                 + (f": the untrained models reach the band from $T = {reach.context.min()}$, so a magnitude in the "
                    "paper's range is a statement about a stage of training, not of the trained models"
                    if len(reach) else ": below the band even before training") + ".")
    return text


def describe_context_slopes(slopes: pd.DataFrame) -> str:
    """One generated sentence: how d_∥, d_2 and d_align scale with context (median slope over widths, its range)."""
    if slopes.empty:
        return "Fewer than two contexts trained, so no scaling with context can be read."
    parts = []
    for value, name in (("d_par", "$d_\\parallel$"), ("d_2", "$d_2$"), ("d_align", "$d_{\\mathrm{align}}$")):
        part = slopes[slopes.value == value]
        if len(part):
            parts.append(f"{name} as $T^{{{part.slope.median():.2f}}}$ (per width {part.slope.min():.2f} to "
                         f"{part.slope.max():.2f})")
    spans = "; ".join(f"$N = {int(r.width)}$: $T = {r.contexts.replace('/', ', ')}$"
                      for r in slopes.drop_duplicates("width").itertuples())
    return ("Across contexts, at fixed width, from trained runs only (" + spans + "), " + ", ".join(parts)
            + ". Independent token noise around a shared "
            "mean would give exponents 1 and 2 for $d_\\parallel$ and $d_2$; smaller ones mean the tokens of one "
            "sequence share part of their noise.")


def describe_slope_change(change: dict | None, trend: pd.DataFrame) -> str:
    """One generated sentence: the width slope at each context (the judged test's label) and whether it changes."""
    judged = judged_slopes(trend)
    if judged.empty:
        return "No context's width slope was fitted at this profile."
    each = "; ".join(f"$T = {int(r.context)}$: {r.slope:+.2f} [{r.slope_lo:+.2f}, {r.slope_hi:+.2f}], {r.label}"
                     for r in judged.itertuples())
    text = f"The width slope of the late-quarter $\\log d_{{\\mathrm{{align}}}}$ per context: {each}."
    if change is None:
        return text
    holds = change["lo"] <= 0 <= change["hi"]
    return text + (f" Per unit of $\\log T$ the slope changes by {change['change']:+.2f} [{change['lo']:+.2f}, "
                   f"{change['hi']:+.2f}]: " + ("the interval holds 0, so this design cannot say that the width "
                                                "trend changes with context." if holds else
                                                ("the width trend steepens" if change["change"] > 0 else
                                                 "the width trend flattens") + " with context."))


def judged_slopes(trend: pd.DataFrame) -> pd.DataFrame:
    """The judged matched-steps width slope of each context (one row per context, its label and interval)."""
    if trend.empty or "judged" not in trend:
        return trend.iloc[0:0]
    rows = trend[trend.judged.astype(bool) & (trend.quantity == "d_align") & (trend.view == "late_window")]
    return rows.sort_values("context")


def context_figure(late: pd.DataFrame, band: tuple[float, float] = PAPER_BAND):
    """d_align (late-quarter geometric mean) against context, one line per width (seed geometric mean; points: runs),
    with the paper's band shaded. Returns the Figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  (plotting is optional: the plots extra)
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    from dalign_repro.report import figure_style as plots  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(plots.COLUMN_WIDTH, 3.6))
    ax.axhspan(*band, color="0.85", zorder=0, label="the paper's range")
    colours = plots.palette(late.width) if len(late) else {}
    for width, runs in late.groupby("width"):
        ok = runs[np.isfinite(runs.d_align) & (runs.d_align > 0)]
        ax.scatter(ok.context, ok.d_align, color=colours[width], s=14, alpha=0.6)
        mean = ok.groupby("context").d_align.apply(lambda v: float(np.exp(np.log(v).mean())))
        ax.plot(mean.index, mean.values, "o-", color=colours[width], label=f"$N = {width}$")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(late.context.unique()) if len(late) else [])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(plots.tick_label))
    ax.set_xlabel("context $T$ (tokens per sample)")
    ax.set_ylabel(plots.LABELS["d_align"] + " (last quarter)")
    plots.legend(ax, ncols=2)
    return fig


def slope_figure(trend: pd.DataFrame):
    """The judged width slope of each context with its 95% interval, beside 0 and the paper's +0.50. Returns the Figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from dalign_repro.report import figure_style as plots  # noqa: PLC0415
    from dalign_repro.sweep.trend import PAPER_SLOPE  # noqa: PLC0415

    judged = judged_slopes(trend)
    fig, ax = plt.subplots(figsize=(plots.COLUMN_WIDTH, 3.0))
    ax.axhline(0, color="0.4", lw=1)
    ax.axhline(PAPER_SLOPE, color="0.4", lw=1, ls="--", label=f"the paper's slope ({PAPER_SLOPE:+.2f})")
    if len(judged):
        x = np.arange(len(judged))
        ax.errorbar(x, judged.slope, yerr=[judged.slope - judged.slope_lo, judged.slope_hi - judged.slope],
                    fmt="o", capsize=4, color="C0", label="ours, 95% interval")
        ax.set_xticks(x, [f"$T = {int(t)}$" for t in judged.context])
        for i, slope in zip(x, judged.slope):  # a context with fewer than two trained widths has no slope
            if not np.isfinite(slope):
                ax.text(i, 0, "no slope", ha="center", va="bottom", color="0.4")
    ax.set_ylabel(r"slope of $\log d_{\mathrm{align}}$ on $\log N$")
    plots.legend(ax, ncols=2)
    return fig


def describe_costs(runs: pd.DataFrame) -> str:
    """One generated sentence: what each context's runs cost (training and measurement: the wall time each run's
    one-thread worker recorded, so it grows with whatever else the machine runs)."""
    if runs.empty or "seconds" not in runs or runs.seconds.isna().all():
        return "The runs' times were not recorded at this profile."
    per = runs.groupby("context").seconds.sum()
    widest = runs[runs.width == runs.width.max()].groupby("context").seconds.mean()
    return ("Training and measuring the runs of a context took, summed over the wall times its runs recorded on one "
            "thread each (so they include any other load on the machine), "
            + ", ".join(f"{_duration(per[t])} at $T = {t}$" for t in per.index)
            + f"; one run of the widest width ($N = {runs.width.max()}$) "
            + ", ".join(f"{widest[t]:.0f} s" for t in widest.index)
            + " (attention through PyTorch's fused scaled-dot-product kernel).")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def describe_trained_contexts(runs: pd.DataFrame, tokens_per_step: int, min_sequences: int = 1) -> str:
    """One generated sentence: the contexts where fewer than two widths trained, so no width trend can be read.

    ``min_sequences``: the config's ``min_sequences_per_step``, the floor under ``tokens_per_step / T`` sequences."""
    if runs.empty:
        return ""
    ok = runs.trained_ok.astype(bool)
    short = [t for t in sorted(runs.context.unique()) if runs[ok & (runs.context == t)].width.nunique() < 2]
    if not short:
        return "At every context at least two widths trained, so each has a width slope."
    counts = ", ".join(f"$T = {t}$ ({int((ok & (runs.context == t)).sum())} of {int((runs.context == t).sum())} "
                       f"runs trained, {max(tokens_per_step // t, min_sequences)} sequence(s) a step)" for t in short)
    return (f"At {counts} fewer than two widths beat the bigram baseline, so no width slope can be read there: the "
            "fixed number of steps did not suffice at these contexts.")


if __name__ == "__main__":
    EXPERIMENT.main()
