"""Matched loss without the training clock: the width slope at matched held-out loss, read at the same steps.

Reading each run where its held-out loss crosses a common level
(:func:`~dalign_repro.sweep.trend.matched_loss_summaries`) mixes width with training time when wider runs get there
earlier and log d_align moves along training at every width. :func:`clock_free_test` compares the runs at the same
steps instead (a fixed effect per step, one summary per run) over the window where every width's loss
passes the common level (:func:`clock_window`); :func:`clock_diagnostics` measures the crossing steps and
the clock, and :func:`simulate_clock_labels` calibrates both readings on the committed runs' loss curves.

**Matched loss, decomposed** (:func:`matched_loss_decomposed`, what the width claims read). Each run is read where
its smoothed held-out loss first reaches the common level (log d_align interpolated between the checkpoints around
the crossing: one number per run, so the interval is clustered by run). A step-only model fitted on the same runs,
the mean over runs of log d_align at each checkpoint interpolated in the same way, says what d_align the clock alone
gives each run at its crossing step. The slope at matched loss is then exactly the sum of the slope of that clock
prediction on log width (how much the clock predicts) and the slope of the residual (the width term), which carries
its own t interval and the verdict. Where every run crosses at the same step the clock term is 0 and the width term
is the plain reading; where wider runs cross earlier and d_align moves along training, the clock term is what the
plain reading would otherwise credit to width.
The slope test, its labels and the run summaries are :mod:`dalign_repro.sweep.trend`'s.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
# scipy.stats is imported by the functions that use it: importing it costs 1.3 s of CPU, paid at start-up by
# every process importing this module (a dry run, a torchrun rank, --print-config) that never uses it.

from dalign_repro.sweep.trend import LABELS, PAPER_SLOPE, RUN, label_for, matched_loss_summaries, slope_test

__all__ = ["clock_window", "clock_free_summaries", "clock_free_test", "clock_diagnostics", "matched_loss_decomposed",
           "decomposed_summaries", "simulate_clock_labels"]


def clock_window(rows: pd.DataFrame, value: str = "d_align") -> int | None:
    """The first step of the window where every width's loss overlaps: the last checkpoint (after step 0) at or
    before the earliest step at which any run reaches the common held-out loss of
    :func:`~dalign_repro.sweep.trend.matched_loss_summaries`.

    From there to the end, each run's crossing of the common level lies inside the window, so a comparison at the
    same steps over the window covers the loss every width passes through. None where no run crosses.
    """
    crossings = matched_loss_summaries(rows, value, (0.0,))
    if crossings.empty:
        return None
    steps = sorted(s for s in rows.step.unique() if s > 0)
    before = [s for s in steps if s <= crossings.step.min() + 1e-9]
    return int(before[-1] if before else steps[0])


def _window_matrix(rows: pd.DataFrame, value: str, start: float) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Log ``value`` of runs (``width``, ``seed``) × the steps from ``start`` at which every run has a positive one:
    (runs, steps, runs × steps matrix)."""
    part = rows[(rows.step >= start) & (rows[value] > 0) & np.isfinite(rows[value].astype(float))]
    table = part.assign(y=np.log(part[value].astype(float))).pivot_table(index=list(RUN), columns="step", values="y")
    table = table.dropna(axis=1, how="any")
    return table.index.to_frame(index=False), table.columns.to_numpy(dtype=float), table.to_numpy()


def clock_free_summaries(rows: pd.DataFrame, value: str, start: int) -> pd.DataFrame:
    """Per run: the mean over the window's steps of log ``value`` minus that step's mean over all runs.

    Step fixed effects, one summary per run: over the steps from ``start`` that every run has (a balanced window),
    this run mean of the step-demeaned values regressed on log width gives exactly the width slope of least squares
    with a fixed effect per step, and its t interval over runs is the interval clustered by run (each run's
    checkpoints share its initialization and data order, so the run, not the checkpoint, is the unit of
    replication). Rows whose ``value`` is 0 or less are left out, and a step some run lacks leaves the window.
    Columns ``width, seed, y, checkpoints``.
    """
    runs, _, logs = _window_matrix(rows, value, start)
    if logs.size == 0:
        return pd.DataFrame(columns=[*RUN, "y", "checkpoints"])
    demeaned = logs - logs.mean(axis=0, keepdims=True)
    return runs.assign(y=demeaned.mean(axis=1), checkpoints=logs.shape[1])


def clock_free_test(rows: pd.DataFrame, value: str = "d_align", reference: float = PAPER_SLOPE,
                    direction: int | None = None, confidence: float = 0.95) -> dict:
    """The matched-loss claim with the training clock removed: :func:`~dalign_repro.sweep.trend.slope_test` on
    :func:`clock_free_summaries` over the window from :func:`clock_window`. Adds ``start`` (the window's first step)
    and ``window_steps``."""
    start = clock_window(rows, value)
    if start is None:
        return {**slope_test(rows.iloc[0:0].assign(y=[]), reference, confidence, direction=direction),
                "start": math.nan, "window_steps": 0}
    summaries = clock_free_summaries(rows, value, start)
    steps = int(summaries.checkpoints.iloc[0]) if len(summaries) else 0
    return {**slope_test(summaries, reference, confidence, direction=direction), "start": start,
            "window_steps": steps}


def clock_diagnostics(rows: pd.DataFrame, value: str = "d_align", confidence: float = 0.95) -> dict:
    """Why matched steps and matched loss can disagree, measured on one sweep's judged rows.

    Returns:
        ``level`` (the common held-out loss, nats), ``crossing`` (width → median step at which its runs reach it),
        ``crossing_slope``/``_lo``/``_hi`` (log crossing step on log width, t interval over runs), ``time_slope``
        (log ``value`` per unit log step within a run over the window, pooled over runs), ``predicted`` (the
        matched-loss slope the clock alone gives: ``time_slope × crossing_slope``), ``matched`` (the matched-loss
        slope itself, with ``matched_lo``/``_hi``) and ``start`` (:func:`clock_window`). NaN where no run crosses.
    """
    nan = dict(level=math.nan, crossing={}, crossing_slope=math.nan, crossing_lo=math.nan, crossing_hi=math.nan,
               time_slope=math.nan, predicted=math.nan, matched=math.nan, matched_lo=math.nan, matched_hi=math.nan,
               start=math.nan)
    crossings = matched_loss_summaries(rows, value, (0.0,))
    if crossings.empty:
        return nan
    start = clock_window(rows, value)
    crossing = slope_test(crossings.assign(y=np.log(crossings.step.clip(lower=1e-9))), -1.0, confidence)
    matched = slope_test(crossings, PAPER_SLOPE, confidence)
    _, steps, logs = _window_matrix(rows, value, start)
    steps = np.log(steps)
    if logs.shape[1] > 1:
        xc = steps - steps.mean()
        time_slope = float(((logs - logs.mean(axis=1, keepdims=True)) @ xc).sum() / (len(logs) * (xc ** 2).sum()))
    else:
        time_slope = math.nan
    return dict(level=float(crossings.loss_level.iloc[0]),
                crossing={int(w): float(s) for w, s in crossings.groupby("width").step.median().items()},
                crossing_slope=crossing["slope"], crossing_lo=crossing["slope_lo"], crossing_hi=crossing["slope_hi"],
                time_slope=time_slope, predicted=time_slope * crossing["slope"], matched=matched["slope"],
                matched_lo=matched["slope_lo"], matched_hi=matched["slope_hi"], start=start)


def decomposed_summaries(rows: pd.DataFrame, value: str = "d_align") -> pd.DataFrame:
    """Per run: log ``value`` at its crossing of the common held-out loss, the step-only model's value there, and the
    residual.

    The crossing step is :func:`~dalign_repro.sweep.trend.matched_loss_summaries`' (base level, offset 0). Log
    ``value`` is interpolated linearly in step between the checkpoints every run has with a positive ``value`` (no
    floor under the log: a checkpoint some run reads 0 at leaves the grid for every run, so the step-only model
    stays balanced). The step-only model is the mean over runs of log ``value`` at each checkpoint of that grid,
    interpolated at the run's crossing step the same way.

    Returns:
        Columns ``width, seed, step`` (fractional crossing step), ``matched`` (log value at the crossing),
        ``clock`` (the step-only model there), ``y`` (``matched − clock``: the residual, which the width term
        regresses) and ``checkpoints`` (the grid's size).
    """
    columns = [*RUN, "step", "matched", "clock", "y", "checkpoints"]
    crossings = matched_loss_summaries(rows, value, (0.0,))
    if crossings.empty:
        return pd.DataFrame(columns=columns)
    runs, steps, logs = _window_matrix(rows, value, -np.inf)
    if logs.size == 0 or len(steps) < 1:
        return pd.DataFrame(columns=columns)
    at = crossings.set_index(list(RUN)).step
    clock_curve = logs.mean(axis=0)
    out = []
    for i, (width, seed) in enumerate(zip(runs.width, runs.seed)):
        step = at.get((width, seed), np.nan)
        if not np.isfinite(step):
            continue
        matched = float(np.interp(step, steps, logs[i]))
        clock = float(np.interp(step, steps, clock_curve))
        out.append(dict(width=width, seed=seed, step=float(step), matched=matched, clock=clock, y=matched - clock,
                        checkpoints=len(steps)))
    return pd.DataFrame(out, columns=columns)


def _ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    return float((xc * (y - y.mean())).sum() / sxx) if sxx > 0 else math.nan


def matched_loss_decomposed(rows: pd.DataFrame, value: str = "d_align", reference: float = PAPER_SLOPE,
                            direction: int | None = None, confidence: float = 0.95) -> dict:
    """The matched-loss claim, decomposed: the width slope read at a common held-out loss, the part the training
    clock predicts, and the residual width term with its interval (:func:`decomposed_summaries`).

    Returns :func:`~dalign_repro.sweep.trend.slope_test`'s columns for the width term (the residual: its ``label`` is
    the verdict), plus ``matched``/``matched_lo``/``matched_hi`` (the slope of log ``value`` at the crossing, its t
    interval over runs), ``clock`` (the slope of the step-only model's prediction: ``matched = clock + slope``
    exactly), ``level`` (the common loss, nats) and ``crossing`` (width → median crossing step).
    """
    summaries = decomposed_summaries(rows, value)
    tested = slope_test(summaries, reference, confidence, direction=direction)
    extra = dict(matched=math.nan, matched_lo=math.nan, matched_hi=math.nan, clock=math.nan, level=math.nan,
                 crossing={})
    if tested["label"] != "not run":
        plain = slope_test(summaries.assign(y=summaries.matched), reference, confidence, direction=direction)
        x = np.log(summaries.width.to_numpy(dtype=float))
        crossings = matched_loss_summaries(rows, value, (0.0,))
        extra.update(matched=plain["slope"], matched_lo=plain["slope_lo"], matched_hi=plain["slope_hi"],
                     clock=_ols_slope(x, summaries.clock.to_numpy(dtype=float)),
                     level=float(crossings.loss_level.iloc[0]),
                     crossing={int(w): float(s) for w, s in summaries.groupby("width").step.median().items()})
    return {**tested, **extra}


def _fit_many(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """OLS slopes of every row of ``y`` (trials × runs) on ``x`` (runs) and their t half-widths, as slope_test fits."""
    from scipy import stats
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    centred = y - y.mean(axis=1, keepdims=True)
    fitted = centred @ xc / sxx
    residual = centred - fitted[:, None] * xc
    df = len(x) - 2
    return fitted, stats.t.ppf(1 - (1 - confidence) / 2, df) * np.sqrt((residual ** 2).sum(axis=1) / df / sxx)


def simulate_clock_labels(rows: pd.DataFrame, slope: float, *, value: str = "d_align",
                          reference: float = PAPER_SLOPE, direction: int | None = None, trials: int = 1000,
                          confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Label shares of the clock-free test and of the plain matched-loss test on synthetic sweeps with a clock.

    The synthetic sweep keeps the committed runs as they are in all but log ``value``: their widths, checkpoints
    and held-out loss curves (so wider runs reach the common loss at the steps they did, earlier). Its log
    ``value`` is a width-free time trend (the mean over widths of each step's width means), plus ``slope`` · log N,
    plus the residual trajectory of a run drawn with replacement from the committed runs (its value minus its
    width's mean at each step, scaled by √(s/(s−1)) for the s seeds of that mean): the noise between runs and
    between the checkpoints of one run, their tails and their correlation along training kept. With ``slope = 0``
    the only path from width to ``value`` is the clock.

    ``decomposed`` is the width term of :func:`matched_loss_decomposed`: the reading at each run's crossing minus the
    step-only model (the synthetic sweep's mean over runs at each step) interpolated there.

    Returns:
        One row per test (``clock_free``, ``matched_loss``, ``decomposed``), one column per label of
        :data:`~dalign_repro.sweep.trend.LABELS` (shares).
    """
    start = clock_window(rows, value)
    runs, steps, matrix = _window_matrix(rows, value, -np.inf)
    widths = runs.width.to_numpy()
    width_means = np.stack([matrix[widths == w].mean(axis=0) for w in widths])
    seeds = runs.groupby("width").seed.transform("size").to_numpy(dtype=float)[:, None]
    residuals = (matrix - width_means) * np.sqrt(seeds / np.maximum(seeds - 1, 1))
    time_trend = np.mean([matrix[widths == w].mean(axis=0) for w in np.unique(widths)], axis=0)
    x = np.log(runs.width.to_numpy(dtype=float))
    # the plain matched-loss reading: log value interpolated at each run's committed crossing step
    crossings = matched_loss_summaries(rows, value, (0.0,)).set_index(list(RUN)).step
    at = np.array([crossings.get((w, s), np.nan) for w, s in zip(runs.width, runs.seed)])
    upper = np.clip(np.searchsorted(steps, at), 1, len(steps) - 1)
    weight = np.clip((at - steps[upper - 1]) / (steps[upper] - steps[upper - 1]), 0, 1)
    window = steps >= (start if start is not None else np.inf)
    rng = np.random.default_rng(seed)
    drawn = residuals[rng.integers(0, len(residuals), size=(trials, len(residuals)))]  # trials × runs × steps
    synthetic = time_trend + slope * x[:, None] + drawn
    out = {}
    if window.sum() and np.isfinite(at).all():
        inside = synthetic[:, :, window]
        clock_free = (inside - inside.mean(axis=1, keepdims=True)).mean(axis=2)
        matched = (synthetic[:, np.arange(len(x)), upper - 1] * (1 - weight)
                   + synthetic[:, np.arange(len(x)), upper] * weight)
        curve = synthetic.mean(axis=1)  # trials × steps: the step-only model of each synthetic sweep
        clock = curve[:, upper - 1] * (1 - weight) + curve[:, upper] * weight
        for name, y in (("clock_free", clock_free), ("matched_loss", matched), ("decomposed", matched - clock)):
            fitted, half = _fit_many(x, y, confidence)
            labels = [label_for(lo, hi, reference, direction) for lo, hi in zip(fitted - half, fitted + half)]
            out[name] = pd.Series(labels).value_counts().reindex(list(LABELS), fill_value=0) / trials
    return pd.DataFrame(out).T.reindex(columns=list(LABELS))
