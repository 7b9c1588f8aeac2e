"""Every claim of the paper beside our verdict, computed from one profile's results files.

A claim is judged by the same code the chapters print their verdicts with
(:func:`dalign_core.report.describe.width_verdicts`, :mod:`dalign_core.studies.interventions`), so
the claims table and the chapters cannot disagree. Labels:

* **reproduced / contradicted / inconclusive / not estimable** for the width claims, a slope test whose
  verdict can go either way (:mod:`dalign_core.sweep.trend`; each row carries its slope, interval and the smallest
  slope the design detects), against the family's own claim: the paper's +0.50 for LLaMA, the sign alone for
  Pythia and ResNet-20 (:func:`dalign_core.report.describe.family_reference`);
* **reproduced / partly / contradicted / inconclusive** for the others, by the rule each row's ``rule`` states
  (an interval that holds a rule's threshold is inconclusive);
* **not run at this profile** when the results it needs do not exist, or do not cover
  it (the LLaMA numbers at N = 512 and 3072 exist only at the paper profile).

Every width row states its regime beside the paper's (``widths``, ``depth``, ``context`` or ``image_size``,
``train_tokens``, ``epochs``, ``d_align_median``, ``reference``, ``paper_regime``), all read from the results
files, and ``shown`` is its label as a page prints it: "… at this scale" where the regime is not the paper's.

Nothing here is typed by hand: a claim without results is "not run", never filled in.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats

from dalign_core.studies import growth
from dalign_core.studies import interventions as intervention_report
from dalign_core.studies.interventions.draws import FAMILY_NAMES
from dalign_core.geometry.misalignment import wilson_interval
from dalign_core.report.describe import (PAPER_REGIMES, SCALE, at_this_scale, judged_geometry, late_steps, reference_text,
                                sweep_records, width_verdicts)
from dalign_core.sweep.clock import clock_window
from dalign_core.sweep.trend import estimability
from dalign_core.report.results import read_table

__all__ = ["NOT_RUN", "RULES", "Row", "claims_table", "by_profile", "LLAMA_PAPER_D_ALIGN"]

NOT_RUN = "not run at this profile"
LLAMA_PAPER_D_ALIGN = {512: 3.9, 3072: 9.5}
"""The paper's d_align of its narrowest and widest LLaMA-style models."""
NUMBER_TOLERANCE = 0.25
"""A headline number is reproduced when ours lies within 25% of the paper's."""
TRACKING = {"reproduced": 0.7, "partly": 0.3}
"""Rank correlation of B_exact with the empirical misalignment rate: tracks (≥ 0.7), partly (≥ 0.3)."""

COVERAGE = 0.8
"""A certificate covers the rate on fresh examples when p̂ ≤ B_exact in at least this share of informative cells."""
UNINFORMATIVE = 0.5
"""A certificate of 0.5 or more certifies nothing (a coin flip): such cells are counted apart, never as support."""


RULES = {
    "d_align rises with width (matched steps)":
        "slope of each run's late-window mean of log d_align on log width: reproduced when its 95% t interval lies "
        "above 0; contradicted when it lies below the family's reference (LLaMA: the paper's slope +0.50; Pythia and "
        "ResNet-20, for which the paper gives no number: 0); inconclusive when it holds a threshold; not estimable "
        "when the interval of ‖μ‖² holds 0 at more than half the late checkpoints (checkpoints whose d_align reads "
        "0 are left out of a run's mean: no floor under the log)",
    "d_align rises with width (matched loss)":
        "the same test with the training clock removed: runs compared at the same steps (a fixed effect per step, "
        "one summary per run, so clustered by run) over the checkpoints from the last one before any run reaches "
        "the common held-out loss, where every width's loss passes that level",
    "misalignment falls with width at fixed (M, K)":
        "the same test on logit p̂ at the judged (M, K): reproduced below 0, contradicted above the family's "
        "reference (LLaMA: −0.50, the fall the paper's d_align rise implies for logit B_align; else 0)",
    "d_align from N = 512 to 3072": f"both within {NUMBER_TOLERANCE:.0%} of the paper's; partly when d_align rises; "
                                    "contradicted when neither holds",
    "empirical ≤ B_exact ≤ B_align":
        f"out of sample: B_exact from the held-out pool covers p̂ resampled from disjoint evaluation examples in "
        f"≥ {COVERAGE:.0%} of the (model, budget) cells whose B_exact is below {UNINFORMATIVE} (the Wilson interval "
        f"of that share above {COVERAGE:.0%}: reproduced; below: contradicted; else inconclusive). B_exact ≤ "
        "B_align is an identity and is not tested",
    "certificates track the empirical rate":
        f"rank correlation across models of B_exact with p̂ on fresh examples, median over the budgets whose median "
        f"B_exact is below {UNINFORMATIVE}, with a 95% bootstrap interval over models; the rule reads its lower end: "
        f"≥ {TRACKING['reproduced']} reproduced, ≥ {TRACKING['partly']} partly, the whole interval below "
        f"{TRACKING['partly']} contradicted, else (or when no budget's certificates are informative) inconclusive",
    "misalignment falls with M and K":
        "every model: the largest budget's interval of p̂ below the smallest's (reproduced; partly in some models; "
        "contradicted when it lies above it in every model; else inconclusive)",
    "positive alignment predicts a decrease":
        f"per family and setting, on evaluation examples the step never saw, at the judged single step: "
        f"P(ΔL_E < 0 | μ_Mᵀg_K > 0) and its difference from P(ΔL_E < 0 | ≤ 0), 95% intervals over models resampled "
        f"(at least the Wilson/Newcombe width); reproduced when the difference lies above 0 and the first reaches "
        f"{intervention_report.SIGN_BANDS['reproduced']:.0%} (partly {intervention_report.SIGN_BANDS['partly']:.0%}); "
        f"partly when the first is high and the difference lies below {intervention_report.PREDICTION_MARGIN:.0%} "
        f"(a step along μ_M helps whatever its alignment); contradicted when the first lies below "
        f"{intervention_report.SIGN_BANDS['partly']:.0%}; inconclusive when an interval holds a threshold; "
        f"{intervention_report.FAILS['sign']}",
    "retention at small steps":
        "out of sample: on draws that predict a decrease, the median of ΔL_E over the first-order prediction from "
        "g_K, at the smallest δ where first order still holds on K (the same-sample curve, Taylor's theorem, "
        "within 10% of 1), with a 95% interval over models resampled: reproduced within 1 ± 10%, contradicted "
        "outside, inconclusive holding an edge; not estimable when E was measured only where first order breaks on K",
    growth.CLAIM:
        f"per grown model with at least {growth.MIN_POINTS} insertion points whose gains on held-out examples are told "
        f"apart (spread across points ≥ {growth.NOISE_RATIO:g} standard errors of one point's gain, in at least half "
        "the models), the regret of growing at d_align's top point against a random choice (its expectation) and "
        "the block-gradient norm's top point, at the longest growth budget: reproduced when both advantages' 95% t "
        "intervals over models lie above 0, contradicted when either lies below 0, inconclusive otherwise or when "
        "leaving out one model changes the label; not estimable with fewer points, inconclusive below the noise "
        "(simulated at the cpu Pythia design: with an effect ≥ 80% reproduced, without ≤ 5%)",
}
"""Each claim's rule, as the chapter states it."""


@dataclass(frozen=True)
class Row:
    """One claim at one scope, judged."""

    claim: str
    scope: str
    paper: str
    """What the paper reports, and where (section of its experiments)."""
    ours: str
    verdict: str
    chapter: str
    """The book chapter whose figure shows our data."""
    slope: float = math.nan
    slope_lo: float = math.nan
    slope_hi: float = math.nan
    detectable: float = math.nan
    """For a width claim: the slope on log width, its 95% interval and the smallest slope the design detects."""
    widths: str = ""
    """The widths judged, "/"-joined (a width claim's regime; empty elsewhere)."""
    depth: float = math.nan
    """Layers (blocks of a transformer; 20 for ResNet-20)."""
    context: float = math.nan
    """Tokens per sequence (language models)."""
    image_size: str = ""
    """Height × width of an input image (ResNet-20)."""
    train_tokens: float = math.nan
    """Tokens each run trained on (language models): passes over the training split × its tokens."""
    epochs: float = math.nan
    """Passes over the training split."""
    d_align_median: float = math.nan
    """Ours at the judged point: the median over runs and checkpoints of d_align at the checkpoints the claim reads."""
    reference: str = ""
    """What the row is judged against (a number or a sign) and where it comes from."""
    paper_regime: str = ""
    """The paper's regime for the claim (a description of the paper)."""
    regime: str = ""
    """Ours, in words, from the columns above."""
    at_this_scale: bool = False
    """Whether our regime differs from the paper's (:func:`dalign_core.report.describe.at_this_scale`)."""
    shown: str = ""
    """The label as a page shows it: the verdict, with " at this scale" where ``at_this_scale``."""

    def __post_init__(self):
        if not self.shown:
            scale = SCALE if self.at_this_scale and self.verdict != NOT_RUN else ""
            object.__setattr__(self, "shown", ("not run" if self.verdict == NOT_RUN else self.verdict) + scale)


_EXPERIMENTS = {"llama": "llama_width", "llama_context": "llama_context", "pythia": "pythia_width",
                "resnet": "resnet_width", "interventions": "interventions", "growth": "growth"}
"""The experiment whose profile config wrote each table (by the longest prefix of the table's name)."""
STALE = "results of an earlier design of this experiment: rerun its chapter"
"""What a claim reads in place of a result when its table was written by another config than the profile's."""


def _current(results: Path, name: str, provenance: dict) -> bool:
    """Whether ``name`` was written by the current config of the folder's profile (its config hash).

    A folder of overrides (``<profile>+<hash>``) or of no known profile is taken as it is.
    """
    prefixes = [key for key in _EXPERIMENTS if name == key or name.startswith(key + "_")]
    experiment = _EXPERIMENTS[max(prefixes, key=len)] if prefixes else None
    if experiment is None or "+" in results.name:
        return True
    from importlib import import_module

    config = import_module(f"dalign_core.experiments.{experiment}").Config
    if results.name not in config.PROFILES:
        return True
    return provenance.get("config_hash") == config.for_profile(results.name).config_hash()


def _load(results: Path, name: str) -> tuple[pd.DataFrame | None, dict]:
    """The table and its provenance; (None, {}) when it does not exist or another config than the profile's wrote
    it (:func:`_stale`)."""
    try:
        table, provenance = read_table(results, name)
    except FileNotFoundError:
        return None, {}
    return (table, provenance) if _current(results, name, provenance) else (None, {})


def _read(results: Path, name: str) -> pd.DataFrame | None:
    """The table alone (:func:`_load`)."""
    return _load(results, name)[0]


def _stale(results: Path, name: str) -> bool:
    """Whether ``name`` exists but was written by another config than the profile's (an earlier design).

    Asked where :func:`_read` gave None, so only the provenance is read: the table's checksum was checked there."""
    path = results / f"{name}.json"
    if not (path.is_file() and (results / f"{name}.csv").is_file()):
        return False
    return not _current(results, name, json.loads(path.read_text()))


def _regimes(table: pd.DataFrame | None, column: str | None) -> list:
    if table is None or table.empty:
        return []
    return sorted(table[column].unique()) if column and column in table else [None]


def _part(table: pd.DataFrame, column: str | None, value) -> pd.DataFrame:
    return table if column is None or column not in table else table[table[column] == value]


_FAMILIES = (  # family, the column that tells its regimes apart, chapter
    ("llama", None, "02_llama_width"),
    ("pythia", "depth", "03_pythia_width"),
    ("resnet", "dataset", "04_resnet_width"),
)
CONTEXT_CHAPTER = "09_llama_context"
"""The chapter whose figures show the context study."""
_WIDTH_FAMILIES = _FAMILIES + (("llama_context", "context", CONTEXT_CHAPTER),)
"""The families of the width claims: the context study is LLaMA with one regime per context."""
_REGIME_NAMES = {"depth": "{} layers", "dataset": "{}", "context": "context {}"}
_NOT_RUN_REGIME = {"context": "context study"}
"""The scope of a regime column's family that has not run, where the family alone names another sweep."""
_WIDTH_CLAIMS = (  # claim, the paper's, what a run's summary is
    ("d_align rises with width (matched steps)", "rises (§1)", "late-window mean"),
    ("d_align rises with width (matched loss)", "rises (§1)", "same steps over the common-loss window"),
    ("misalignment falls with width at fixed (M, K)", "falls (§2)", "logit p̂"),
)
_QUANTITIES = ("d_align", "d_align", "p_misalign")
"""What each width claim tests (its reference: :func:`dalign_core.report.describe.reference_text`)."""


def _scope(family: str, column: str | None, value) -> str:
    """"Pythia, 6 layers" for a regime; the family's name alone where it has one regime or has not run ("LLaMA,
    context study" for the context study, whose family name alone is the width sweep's)."""
    name = FAMILY_NAMES[family.split("_")[0]]
    if column is None:
        return name
    if value is None:
        return f"{name}, {_NOT_RUN_REGIME[column]}" if column in _NOT_RUN_REGIME else name
    return f"{name}, {_REGIME_NAMES[column].format(value)}"


def _primary_layer(misalignment: pd.DataFrame) -> str | None:
    """The primary insertion point of a sweep: the layer its misalignment study used."""
    layers = misalignment.layer.dropna().unique() if "layer" in misalignment else []
    return layers[0] if len(layers) else None


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


def _width_rows(results: Path) -> list[Row]:
    """The paper's width claims, one row per family and regime, with the regime beside the paper's."""
    rows = []
    for family, column, chapter in _WIDTH_FAMILIES:
        trend, misalignment = _read(results, f"{family}_trend"), _read(results, f"{family}_misalignment")
        geometry, provenance = _load(results, f"{family}_geometry")
        runs = _read(results, f"{family}_runs")
        # a regime whose runs all failed has no trend rows: it is reported from the runs table, not left out
        regimes = sorted(set(_regimes(trend, column)) | set(_regimes(runs, column))) if misalignment is not None else []
        if not regimes:
            ours = STALE if _stale(results, f"{family}_trend") else "—"
            rows += [Row(claim, _scope(family, column, None), paper, ours, NOT_RUN, chapter,
                         reference=reference_text(family, quantity), paper_regime=PAPER_REGIMES[family.split("_")[0]])
                     for (claim, paper, _), quantity in zip(_WIDTH_CLAIMS, _QUANTITIES)]
            continue
        for value in regimes:
            trend_part, mis_part = _part(trend, column, value), _part(misalignment, column, value)
            geometry_part = _part(geometry, column, value) if geometry is not None else None
            layer = _primary_layer(mis_part)
            judged_at = judged_geometry(geometry_part, trend_part, layer) if geometry_part is not None else None
            regime = _regime(family, column, value, provenance,
                             judged_at if judged_at is not None else pd.DataFrame(columns=["width"]))
            scale = SCALE if regime["at_this_scale"] else ""
            judged_rows = width_verdicts(trend_part, layer, geometry=geometry_part, family=family, scale=scale)
            medians = _judged_medians(trend_part, geometry_part, mis_part, layer)
            for (claim, paper, where), quantity, judged, median in zip(_WIDTH_CLAIMS, _QUANTITIES, judged_rows,
                                                                        medians):
                label = NOT_RUN if judged.label == "not run" else judged.label
                untrained = _untrained(_part(runs, column, value)) if label == NOT_RUN and runs is not None else None
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
                rows.append(Row(claim, _scope(family, column, value), paper, ours, label, chapter, judged.slope,
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


def _llama_numbers(results: Path) -> Row:
    geometry = _read(results, "llama_geometry")
    paper = "3.9 at N = 512 → 9.5 at N = 3072 (§1)"
    if geometry is None or not set(LLAMA_PAPER_D_ALIGN) <= set(geometry.width):
        ours = STALE if _stale(results, "llama_geometry") else "—"
        return Row("d_align from N = 512 to 3072", "LLaMA", paper, ours, NOT_RUN, "02_llama_width")
    final = geometry[(geometry.pool == "heldout") & geometry.trained_ok.astype(bool)]
    layer = _primary_layer(_read(results, "llama_misalignment"))
    final = final[(final.step == final.step.max()) & (final.layer == layer)]
    ours = {w: float(final[final.width == w].d_align.mean()) for w in LLAMA_PAPER_D_ALIGN}
    close = all(abs(ours[w] / v - 1) <= NUMBER_TOLERANCE for w, v in LLAMA_PAPER_D_ALIGN.items())
    label = "reproduced" if close else "partly" if ours[3072] > ours[512] else "contradicted"
    return Row("d_align from N = 512 to 3072", "LLaMA", paper, f"{ours[512]:.3g} → {ours[3072]:.3g}", label,
               "02_llama_width")


def _label(holds: int, total: int, reversed_: int = 0) -> str:
    """All of ``total`` hold: reproduced; some: partly; the opposite in all: contradicted; else inconclusive."""
    if total and holds == total:
        return "reproduced"
    return "partly" if holds else "contradicted" if total and reversed_ == total else "inconclusive"


def tracking_interval(budgets: list[pd.DataFrame], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
                      ) -> tuple[float, float, float, int]:
    """The tracking statistic and its interval: per budget the rank correlation of ``b_exact`` with ``p_misalign``
    across rows, the median over ``budgets``; its percentile interval resamples the models (``model, seed``: a
    model's rows at every layer and budget go together). Returns (median ρ, lo, hi, models); NaN without a budget."""
    if not budgets:
        return math.nan, math.nan, math.nan, 0
    key = lambda g: (g.model.astype(str) + "|" + g.seed.astype(str)).to_numpy()  # noqa: E731
    models = sorted(set().union(*(set(key(g)) for g in budgets)))
    # per budget: each model's (B_exact, p̂) rows, so a resample is a concatenation of arrays
    parts = [{m: g[["b_exact", "p_misalign"]].to_numpy(float)[key(g) == m] for m in models} for g in budgets]

    def statistic(picked: list[str]) -> float:
        values = []
        for part in parts:
            rows = np.concatenate([part[m] for m in picked])
            values.append(stats.spearmanr(rows[:, 0], rows[:, 1]).statistic if len(rows) > 2 and
                          np.ptp(rows[:, 0]) > 0 and np.ptp(rows[:, 1]) > 0 else math.nan)
        return float(np.nanmedian(values)) if np.isfinite(values).any() else math.nan

    rho = statistic(models)
    rng = np.random.default_rng(seed)
    boot = np.array([statistic([models[i] for i in rng.integers(0, len(models), len(models))])
                     for _ in range(resamples)])
    boot = boot[np.isfinite(boot)]
    if not np.isfinite(rho) or not len(boot):
        return rho, math.nan, math.nan, len(models)
    tail = 100 * (1 - confidence) / 2
    return rho, float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail)), len(models)


def tracking_label(lo: float, hi: float) -> str:
    """The tracking rule reads the interval's lower end: ``reproduced`` at ≥ 0.7, ``partly`` at ≥ 0.3;
    ``contradicted`` when the whole interval lies below 0.3; ``inconclusive`` when it holds 0.3."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    if lo >= TRACKING["reproduced"]:
        return "reproduced"
    if lo >= TRACKING["partly"]:
        return "partly"
    return "contradicted" if hi < TRACKING["partly"] else "inconclusive"


def _certificate_rows(results: Path) -> list[Row]:
    rows = []
    for family, column, chapter in _FAMILIES:
        table = _read(results, f"{family}_misalignment")
        same = None if table is None else table[(table.setting == "heldout/heldout") & table.trained_ok.astype(bool)]
        fresh_all = None if table is None else table[(table.setting == "evaluation/evaluation")
                                                     & table.trained_ok.astype(bool)]
        for value in _regimes(same, column) or [None]:
            scope = _scope(family, column, value)
            part = _part(same, column, value) if same is not None else None
            fresh = _part(fresh_all, column, value) if fresh_all is not None else None
            if part is None or part.empty:
                for claim, paper in (("empirical ≤ B_exact ≤ B_align", "ordered (§2)"),
                                     ("certificates track the empirical rate", "track (§2)"),
                                     ("misalignment falls with M and K", "falls (§2)")):
                    ours = STALE if _stale(results, f"{family}_misalignment") else "—"
                    rows.append(Row(claim, scope, paper, ours, NOT_RUN, chapter))
                continue
            # Out of sample: the held-out pool's B_exact against p̂ resampled from disjoint evaluation examples.
            # (On the pool that gave B_exact, p̂ ≤ B_exact is Cantelli's inequality on that pool's own law.)
            if fresh is None or fresh.empty:
                rows.append(Row("empirical ≤ B_exact ≤ B_align", scope, "ordered (§2)",
                                "no p̂ on fresh examples in these results", NOT_RUN, chapter))
                fresh = part.iloc[0:0]
            else:
                informative = fresh[fresh.b_exact < UNINFORMATIVE]
                covered = int((informative.p_misalign <= informative.b_exact + 1e-12).sum())
                n = len(informative)
                lo, hi = wilson_interval(covered, n) if n else (math.nan, math.nan)
                label = ("inconclusive" if n == 0 else "reproduced" if lo >= COVERAGE else
                         "contradicted" if hi < COVERAGE else "inconclusive")
                ours = (f"p̂ on fresh examples ≤ B_exact in {covered} of {n} informative cells "
                        f"({covered / n:.0%}, Wilson [{lo:.0%}, {hi:.0%}])" if n else "no informative cell")
                ours += f"; {len(fresh) - n} cells with B_exact ≥ {UNINFORMATIVE} left out as uninformative"
                rows.append(Row("empirical ≤ B_exact ≤ B_align", scope, "ordered (§2)", ours, label, chapter))
            # Within one budget, across models: does the certificate follow the differences between models? (Across
            # budgets both fall with M + K, which would make any certificate look as if it tracked.) p̂ comes from
            # fresh examples, so a shared estimation error cannot make the two agree.
            # Only budgets whose median certificate is informative: ranking certificates of 0.5 or more against p̂
            # would credit a bound that certifies nothing.
            budgets = [g for _, g in fresh.groupby(["M", "K"]) if len(g) > 2]
            informative = [g for g in budgets if g.b_exact.median() < UNINFORMATIVE]
            rho, rho_lo, rho_hi, models = tracking_interval(informative)
            tracks = tracking_label(rho_lo, rho_hi)
            if np.isfinite(rho):
                ours = (f"rank correlation {rho:.2f} [{rho_lo:.2f}, {rho_hi:.2f}] of B_exact with p̂ on fresh "
                        f"examples across {models} models (median over the {len(informative)} of {len(budgets)} "
                        f"budgets whose median B_exact is below {UNINFORMATIVE}; 95% bootstrap over models)")
            elif budgets and not informative:
                ours, tracks = (f"median B_exact ≥ {UNINFORMATIVE} at every budget: the certificates certify "
                                "nothing to track", "inconclusive")
            else:
                ours, tracks = "—", NOT_RUN
            rows.append(Row("certificates track the empirical rate", scope, "track (§2)", ours, tracks, chapter))
            holds = reversed_ = total = 0
            for _, model in part.groupby(["model", "seed"]):
                model = model.assign(size=model.M + model.K).sort_values("size")
                if len(model) < 2:
                    continue
                small, large = model.iloc[0], model.iloc[-1]
                total += 1
                holds += int(large.p_misalign_hi < small.p_misalign_lo)
                reversed_ += int(large.p_misalign_lo > small.p_misalign_hi)
            rows.append(Row("misalignment falls with M and K", scope, "falls (§2)",
                            f"{holds} of {total} models" if total else "—",
                            _label(holds, total, reversed_) if total else NOT_RUN, chapter))
    return rows


def _intervention_rows(results: Path) -> list[Row]:
    (table, provenance), chapter = _load(results, "interventions"), "05_interventions"
    claims = (("positive alignment predicts a decrease", "consistently (§3)"), ("retention at small steps", "96–99% (§3)"))
    if table is None or table.empty or "eval_observed" not in table:  # an older table: no change on fresh examples
        ours = STALE if table is not None or _stale(results, "interventions") else "—"
        return [Row(claim, name, paper, ours, NOT_RUN, chapter) for claim, paper in claims
                for name in FAMILY_NAMES.values()]
    step = provenance["config"]["sign_step"]
    rows = []
    prediction = intervention_report.sign_prediction(table, step)
    for r in prediction.itertuples():
        scope = f"{FAMILY_NAMES.get(r.family, r.family)}, {intervention_report.SETTING_NAMES.get(r.setting, r.setting)}"
        rows.append(Row(claims[0][0], scope, claims[0][1],
                        f"on fresh examples at δ = {step:g}, {r.models} models: P(fall | μ_Mᵀg_K > 0) {r.p_pos:.1%} "
                        f"[{r.p_pos_lo:.1%}, {r.p_pos_hi:.1%}] of {r.n_pos}; P(fall | ≤ 0) {r.p_nonpos:.1%} of "
                        f"{r.n_nonpos}; difference {r.difference:+.2f} [{r.difference_lo:+.2f}, "
                        f"{r.difference_hi:+.2f}]; AUC {r.auc:.2f} [{r.auc_lo:.2f}, {r.auc_hi:.2f}]; {r.ties} ties "
                        f"left out; {r.reason}", r.label, chapter))
    curve = intervention_report.out_of_sample_retention(table)
    for family, v in intervention_report.out_of_sample_verdict(curve).items():
        r = v.get("row")
        ours = v["reason"] if r is None else (
            f"on fresh examples at δ = {r['train_decrease']:g} ({r['source']} study, {r['draws']} draws predicting a "
            f"decrease): ΔL_E kept {r['from_g']:.1%} [{r['from_g_lo']:.1%}, {r['from_g_hi']:.1%}] of the prediction "
            f"from g_K ({r['from_mu']:.1%} of that from μ_M); on K {r['same_sample']:.1%} (Taylor's theorem); "
            + v["reason"])
        rows.append(Row(claims[1][0], FAMILY_NAMES.get(family, family), claims[1][1], ours, v["label"], chapter))
    return rows


GROWTH_PAPER = "not a claim of the paper: ours, on its motivation (model growth)"


def _growth_rows(results: Path) -> list[Row]:
    """The growth claim (ours, beyond the paper), one row per family, judged at the longest budget of the table by
    :func:`growth.decision`; the ρ difference (:func:`growth.verdict`) is stated beside it, not judged."""
    table, chapter = _read(results, "growth"), "08_growth"
    if table is None or table.empty:
        ours = STALE if _stale(results, "growth") else "—"
        return [Row(growth.CLAIM, name, GROWTH_PAPER, ours, NOT_RUN, chapter) for name in FAMILY_NAMES.values()]
    scores = growth.score(table, ["d_align", "grad_norm"])
    rows = []
    for family in [f for f in FAMILY_NAMES if f in set(table.family)]:
        judged = growth.decision(table, family=family)
        rho = growth.verdict(scores, family=family)
        ratios = ", ".join(f"{ratio:.2f}" for _, ratio in judged.ratios)
        ours = (f"{judged.reason}; spread/SE per model {ratios}" if not judged.regret else
                f"{judged.reason}; regret (nats) " + ", ".join(f"{name.replace('_', ' ')} {m:.2g} [{lo:.2g}, {hi:.2g}]"
                                                              for name, (m, lo, hi) in judged.regret.items())
                + f"; leave-one-out lower end [{judged.leave_one_out[0]:.2g}, {judged.leave_one_out[1]:.2g}]")
        if rho.label != "not run":
            ours += f"; ρ difference (d_align − gradient norm) {rho.slope:+.2f} [{rho.slope_lo:+.2f}, {rho.slope_hi:+.2f}]"
        ours += f"; {judged.of} models, {int(table.budget_steps.max())} steps"
        rows.append(Row(growth.CLAIM, FAMILY_NAMES[family], GROWTH_PAPER, ours,
                        NOT_RUN if judged.label == "not run" else judged.label, chapter))
    return rows


SECTIONS: tuple[Callable[[Path], list[Row]], ...] = (
    _width_rows, lambda results: [_llama_numbers(results)], _certificate_rows, _intervention_rows, _growth_rows)


def claims_table(results: str | Path) -> pd.DataFrame:
    """The claims table of one profile's results folder: one row per (claim, scope), in the paper's order."""
    rows = [row for section in SECTIONS for row in section(Path(results))]
    table = pd.DataFrame([row.__dict__ for row in rows])
    return table.assign(rule=table.claim.map(RULES))


def by_profile(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (claim, scope), one verdict column per profile (``profile → claims table``).

    Rows keep the paper's order. A family that has not run at a profile has a single
    row without its regime ("Pythia"); where another profile names the regimes
    ("Pythia, 6 layers"), those rows stand for it and read "not run at this profile".
    """
    keys: list[tuple[str, str]] = []
    for table in tables.values():
        keys += [key for key in zip(table.claim, table.scope) if key not in keys]
    judged = {key for table in tables.values() for key, verdict in zip(zip(table.claim, table.scope), table.verdict)
              if verdict != NOT_RUN}  # a family's own row that was judged somewhere stays (LLaMA beside its contexts)
    specific = {(claim, scope.split(",")[0]) for claim, scope in keys if "," in scope} - judged
    keys = [key for key in keys if key not in specific]
    order = {claim: i for i, claim in enumerate(RULES)}
    keys.sort(key=lambda key: order.get(key[0], len(order)))  # stable: scopes keep their order within a claim
    columns = {name: table.set_index(["claim", "scope"]).verdict.to_dict() for name, table in tables.items()}
    return pd.DataFrame([{"claim": claim, "scope": scope,
                          **{name: verdicts.get((claim, scope), NOT_RUN) for name, verdicts in columns.items()}}
                         for claim, scope in keys])
