"""What the intervention table says, and how it compares with the paper: every number and verdict computed.

The input is ``interventions.csv`` (:mod:`dalign_core.experiments.interventions`) and,
for the certificates, each family's ``<family>_geometry.csv``. Agreement and rates
carry Wilson intervals, so a rate of 0 or 1 still has an honest width.

**Retention** (paper: at small steps the observed change kept 96-99 % of the predicted
one: first order was accurate to 4 % or better). We read the retention at the config's
``small_step`` on every trained model and call the claim *reproduced* for a family when
the median departs from 1 by at most 4 % (either side: curvature along the step can
add to the decrease as well as take from it), *partly* by at most 10 %, *not
reproduced* otherwise. Beside it, the largest step at which first order still holds to
10 % says how small "small" must be.

**Sign** (paper: positive alignment consistently predicted a decrease). Among the
shared-bias draws with ``μ_Mᵀg_K > 0``, the share whose step lowered the held-out
loss: *reproduced* when at least 95 %, *partly* at least 80 %.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dalign_core.bounds import b_align, b_exact_from_moments
from dalign_core.misalignment import wilson_interval
from dalign_core.report import _num

__all__ = ["PAPER_RETENTION", "Z_BINS", "agreement", "sign_agreement", "retention_at", "first_order_range",
           "block_explained", "theory_vs_observation", "retention_verdict", "sign_verdict", "describe_retention",
           "describe_sign", "describe_lowest_bin", "FAMILY_NAMES"]

PAPER_RETENTION = (0.96, 0.99)
RETENTION_BANDS = {"reproduced": (0.96, 1.04), "partly": (0.90, 1.10)}
"""Median retention at the small step: within 4 % of 1 (the paper's largest departure), or within 10 %."""
SIGN_BANDS = {"reproduced": 0.95, "partly": 0.80}
FIRST_ORDER_TOLERANCE = 0.10
Z_BINS = (0.0, 0.25, 0.5, 1.0, 2.0, math.inf)
"""Edges of |μ_Mᵀg_K| / sd, the statistic's size against its spread over draws."""

FAMILY_NAMES = {"llama": "LLaMA", "pythia": "Pythia", "resnet": "ResNet-20"}
"""How a family is named in a sentence."""

_DRAW = ["family", "model", "width", "seed", "layer", "setting", "kind", "M", "K"]


def _with_interval(successes: int, trials: int, confidence: float = 0.95) -> dict:
    lo, hi = wilson_interval(successes, trials, confidence) if trials else (math.nan, math.nan)
    return {"agree": successes / trials if trials else math.nan, "agree_lo": lo, "agree_hi": hi, "draws": trials}


def agreement(frame: pd.DataFrame) -> pd.Series:
    """Whether each step moved the held-out loss the way first order said (strict signs; 0 counts as not)."""
    return (np.sign(frame.observed) == np.sign(frame.predicted)) & (frame.predicted != 0)


def sign_agreement(table: pd.DataFrame, by: tuple[str, ...] = ("family", "kind")) -> pd.DataFrame:
    """Sign agreement per group and per bin of ``z = |alignment| / sd`` (sd over the draws of one model,
    layer, setting and budget), with Wilson intervals. ``z_bin`` "all" pools the bins."""
    sign = table[table.study == "sign"].copy()
    spread = sign.groupby(_DRAW).alignment.transform("std")
    sign["z"] = sign.alignment.abs() / spread
    sign["z_bin"] = pd.cut(sign.z, Z_BINS, right=False).astype(str)
    sign["agrees"] = agreement(sign)
    rows = []
    for keys, group in sign.groupby(list(by)):
        keys = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        rows.append({**keys, "z_bin": "all", **_with_interval(int(group.agrees.sum()), len(group))})
        for z_bin, part in group.groupby("z_bin", sort=False):
            rows.append({**keys, "z_bin": z_bin, **_with_interval(int(part.agrees.sum()), len(part))})
    return pd.DataFrame(rows)


def retention_at(table: pd.DataFrame, step: float) -> pd.DataFrame:
    """The retention study's rows at ``train_decrease == step`` (one per model and kind)."""
    study = table[table.study == "retention"]
    return study[np.isclose(study.train_decrease, step, rtol=1e-9)]


def first_order_range(table: pd.DataFrame, tolerance: float = FIRST_ORDER_TOLERANCE) -> pd.DataFrame:
    """Per model and kind, the largest step δ up to which every retention lies within ``1 ± tolerance``."""
    rows = []
    for keys, curve in table[table.study == "retention"].groupby(["family", "model", "kind"]):
        curve = curve.sort_values("train_decrease")
        inside = (curve.retention - 1).abs() <= tolerance
        held = curve.train_decrease[inside.cumprod().astype(bool)]
        rows.append(dict(zip(["family", "model", "kind"], keys), largest_step=held.max() if len(held) else math.nan))
    return pd.DataFrame(rows)


def block_explained(table: pd.DataFrame) -> pd.DataFrame:
    """How far the shared-bias statistic explains the block: per family, the share of block steps whose held-out
    change has the sign ``−sign(μ_Mᵀg_K)`` of the same draw, and the rank correlation of the two alignments."""
    block = table[(table.study == "sign") & (table.kind == "block")]
    rows = []
    for family, group in block.groupby("family"):
        agrees = np.sign(group.observed) == -np.sign(group.bias_alignment)
        rows.append({"family": family, **_with_interval(int(agrees.sum()), len(group)),
                     "rank_correlation": group.alignment.rank().corr(group.bias_alignment.rank())})
    return pd.DataFrame(rows)


def theory_vs_observation(table: pd.DataFrame, geometry: pd.DataFrame) -> pd.DataFrame:
    """Per model, layer, setting and budget: how often μ_Mᵀg_K ≤ 0 (the misalignment the certificates bound), how
    often the step raised the held-out loss, and B_exact and B_align from the held-out pool's geometry at the final
    checkpoint (``heldout/heldout`` only: the setting the theorem covers)."""
    sign = table[(table.study == "sign") & (table.kind == "bias")]
    final = geometry[(geometry["pool"] == "heldout")]
    final = final[final.step == final.groupby(["family", "model", "seed"]).step.transform("max")]
    rows = []
    for keys, group in sign.groupby(["family", "model", "width", "seed", "layer", "setting", "M", "K"]):
        key = dict(zip(["family", "model", "width", "seed", "layer", "setting", "M", "K"], keys))
        misaligned = _with_interval(int((group.alignment <= 0).sum()), len(group))
        raised = _with_interval(int((group.observed > 0).sum()), len(group))
        bound = {"b_exact": math.nan, "b_align": math.nan}
        match = final[(final.model == key["model"]) & (final.seed == key["seed"]) & (final.layer == key["layer"])]
        if key["setting"] == "heldout/heldout" and len(match):
            g = match.iloc[0]
            bound = {"b_exact": b_exact_from_moments(g.mean_sq_sq, g.directional, g.cov_energy, key["M"], key["K"]),
                     "b_align": float(b_align(max(g.d_align, 0.0), key["M"], key["K"]))}
        rows.append({**key, "p_misaligned": misaligned["agree"], "p_misaligned_lo": misaligned["agree_lo"],
                     "p_misaligned_hi": misaligned["agree_hi"], "p_raised": raised["agree"],
                     "p_raised_lo": raised["agree_lo"], "p_raised_hi": raised["agree_hi"], "draws": len(group),
                     **bound})
    return pd.DataFrame(rows)


def _band(value: float, bands: dict[str, tuple[float, float]]) -> str:
    for label, (lo, hi) in bands.items():
        if lo <= value <= hi:
            return label
    return "not reproduced"


def retention_verdict(table: pd.DataFrame, step: float, kind: str = "bias") -> dict[str, tuple[str, float]]:
    """Family → (verdict, median retention at ``step``) over the trained models; see the module docstring."""
    rows = retention_at(table, step)
    rows = rows[rows.kind == kind]
    return {family: (_band(float(group.retention.median()), RETENTION_BANDS), float(group.retention.median()))
            for family, group in rows.groupby("family")}


def sign_verdict(table: pd.DataFrame, kind: str = "bias") -> dict[str, tuple[str, dict]]:
    """Family → (verdict, agreement with interval) among draws with positive alignment; see the module docstring."""
    sign = table[(table.study == "sign") & (table.kind == kind) & (table.alignment > 0)]
    out = {}
    for family, group in sign.groupby("family"):
        share = _with_interval(int((group.observed < 0).sum()), len(group))
        label = ("reproduced" if share["agree"] >= SIGN_BANDS["reproduced"] else
                 "partly" if share["agree"] >= SIGN_BANDS["partly"] else "not reproduced")
        out[family] = (label, share)
    return out


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def describe_retention(table: pd.DataFrame, step: float) -> str:
    """A sentence per family: median retention at ``step`` beside the paper's 96-99 %, and the first-order range."""
    ranges = first_order_range(table)
    lines = []
    for family, (label, median) in retention_verdict(table, step).items():
        mine = ranges[(ranges.family == family) & (ranges.kind == "bias")].largest_step
        reach = (f"first order holds to {int(FIRST_ORDER_TOLERANCE * 100)}% up to δ = {_num(mine.median())} nats "
                 f"(median over models)" if mine.notna().any() else "no step kept first order within 10%")
        larger = retention_at(table[table.family == family], step * 100)
        larger = float(larger[larger.kind == "bias"].retention.median()) if len(larger) else median
        side = ("less than predicted: the curvature along the step is positive" if larger < 1 else
                "more than predicted: the curvature along the step is negative")
        lines.append(f"- **{FAMILY_NAMES.get(family, family)}**: at δ = {_num(step)} nats the held-out change kept a median "
                     f"{_percent(median)} of the predicted one (paper: {PAPER_RETENTION[0]:.0%}–"
                     f"{PAPER_RETENTION[1]:.0%}): **{label}**; {reach}; at 100 times the step the loss changes {side}.")
    return "\n".join(lines) if lines else "No trained model was intervened on at this profile."


def describe_sign(table: pd.DataFrame) -> str:
    """A sentence per family: how often positive alignment came with a decrease of the held-out loss."""
    lines = []
    for family, (label, share) in sign_verdict(table).items():
        lines.append(f"- **{FAMILY_NAMES.get(family, family)}**: of {share['draws']} draws with $\\mu_M^\\top g_K > 0$, "
                     f"{_percent(share['agree'])} [{_percent(share['agree_lo'])}, {_percent(share['agree_hi'])}] "
                     f"lowered the held-out loss: **{label}**.")
    return "\n".join(lines) if lines else "No draw with positive alignment at this profile."


def describe_lowest_bin(agreement: pd.DataFrame) -> str:
    """Sign agreement where the statistic is smallest against its spread, beside the agreement over all draws."""
    first = str(pd.Interval(Z_BINS[0], Z_BINS[1], closed="left"))
    parts = []
    for family, group in agreement.groupby("family"):
        low, overall = group[group.z_bin == first], group[group.z_bin == "all"]
        if len(low) and len(overall):
            low, overall = low.iloc[0], overall.iloc[0]
            parts.append(f"{FAMILY_NAMES.get(family, family)} {_percent(low.agree)} [{_percent(low.agree_lo)}, "
                         f"{_percent(low.agree_hi)}] of {low.draws} draws (all draws: {_percent(overall.agree)})")
    if not parts:
        return ""
    return (f"Where $|\\mu_M^\\top g_K|$ is below {Z_BINS[1]:g} of its standard deviation, the signs agree in "
            + "; ".join(parts) + ".")
