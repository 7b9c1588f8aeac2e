"""Whether the certificates track the steps: the share of draws with μ_Mᵀg_K > 0 beside 1 − B_align.

Per model, layer, setting and budget (:func:`theory_vs_observation`), the share of draws with positive
alignment and how often the step raised the loss on E, beside B_exact, B_align and ``1 − B_align`` from the
held-out pool's shared-q geometry at the final checkpoint; :func:`describe_positive_share` says in how many
cells the share's interval reaches the bound it must clear.
"""

from __future__ import annotations

import math

import pandas as pd

from dalign_core.geometry.bounds import b_align, b_exact_from_moments
from dalign_repro.studies.interventions.draws import wilson_rate, single_steps, measured_changes, percent, family_name

__all__ = ["theory_vs_observation", "describe_positive_share"]


def _final_geometry(geometry: pd.DataFrame) -> pd.DataFrame:
    """The held-out pool's geometry at each run's final checkpoint, for the shared reduction (the bias's q)."""
    final = geometry[geometry["pool"] == "heldout"]
    if "reduction" in final:
        final = final[final.reduction == "shared"]
    return final[final.step == final.groupby(["family", "model", "seed"]).step.transform("max")]


def theory_vs_observation(table: pd.DataFrame, geometry: pd.DataFrame, step: float) -> pd.DataFrame:
    """Per model, layer, setting and budget (shared bias, single step ``step``): the share of draws with
    ``μ_Mᵀg_K > 0`` and with ``≤ 0`` (the misalignment the certificates bound), how often the step raised the loss
    on E, and B_exact, B_align and ``1 − B_align`` from the held-out pool's shared-q geometry at the final
    checkpoint (``heldout/heldout`` only: the setting the theorem covers)."""
    sign = single_steps(table, step)
    sign = sign[sign.kind == "bias"] if len(sign) else sign
    final = _final_geometry(geometry) if len(geometry) else geometry
    keys_of = ["family", "model", "width", "seed", "layer", "setting", "M", "K"]
    rows = []
    for keys, group in (sign.groupby(keys_of) if len(sign) else ()):
        key = dict(zip(keys_of, keys))
        positive = wilson_rate(int((group.alignment > 0).sum()), len(group))
        kept, change, ties = measured_changes(group, "eval")
        raised = wilson_rate(int((change > 0).sum()), len(kept))
        bound = {"b_exact": math.nan, "b_align": math.nan}
        match = final[(final.model == key["model"]) & (final.seed == key["seed"]) & (final.layer == key["layer"])]
        if key["setting"] == "heldout/heldout" and len(match):
            g = match.iloc[0]
            bound = {"b_exact": b_exact_from_moments(g.mean_sq_sq, g.directional, g.cov_energy, key["M"], key["K"]),
                     "b_align": float(b_align(max(g.d_align, 0.0), key["M"], key["K"]))}
        rows.append({**key, "share_positive": positive[0], "share_positive_lo": positive[1],
                     "share_positive_hi": positive[2], "p_misaligned": 1 - positive[0],
                     "p_misaligned_lo": 1 - positive[2], "p_misaligned_hi": 1 - positive[1],
                     "p_raised": raised[0], "p_raised_lo": raised[1], "p_raised_hi": raised[2],
                     "draws": len(group), "ties": ties, **bound, "one_minus_b_align": 1 - bound["b_align"]})
    return pd.DataFrame(rows)


def describe_positive_share(rates: pd.DataFrame) -> str:
    """The share of draws with positive alignment beside 1 − B_align (held-out/held-out, where the bound applies)."""
    covered = rates[(rates.setting == "heldout/heldout")].dropna(subset=["b_align"]) if len(rates) else rates
    if covered.empty:
        return "No held-out/held-out cell has a certificate at this profile."
    parts = []
    for family, part in covered.groupby("family"):
        above = int((part.share_positive_hi + 1e-12 >= part.one_minus_b_align).sum())
        parts.append(f"{family_name(family)}: median share {percent(part.share_positive.median())} against median "
                     f"$1 - B_{{\\mathrm{{align}}}}$ = {percent(part.one_minus_b_align.median())}; the share's interval "
                     f"reaches $1 - B_{{\\mathrm{{align}}}}$ in {above} of {len(part)} cells")
    return ("Share of draws with $\\mu_M^\\top g_K > 0$ beside the lower bound $1 - B_{\\mathrm{align}}$ it must "
            "clear: " + "; ".join(parts) + ".")
