"""The certificates-track rule (dalign_repro.claims.certificates.tracking_interval / tracking_label), simulated at the
committed cpu design: the LLaMA models and budgets whose certificates are informative."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dalign_repro.claims import certificates as claims
from dalign_repro.config import REPO_ROOT


def _design() -> list[pd.DataFrame]:
    """The committed LLaMA cpu cells the rule reads: fresh-example p̂ per (model, seed, layer) at the informative
    budgets."""
    table = pd.read_csv(REPO_ROOT / "results" / "cpu" / "llama_misalignment.csv")
    fresh = table[(table.setting == "evaluation/evaluation") & table.trained_ok.astype(bool)]
    budgets = [g for _, g in fresh.groupby(["M", "K"]) if len(g) > 2]
    return [g for g in budgets if g.b_exact.median() < claims.UNINFORMATIVE]


def _simulated(design: list[pd.DataFrame], correlation: float, rng) -> list[pd.DataFrame]:
    """The design's rows with (B_exact, p̂) drawn from a Gaussian copula of the given correlation; a model keeps its
    latent value across budgets (certificates of one model move together, as in the data)."""
    models = sorted(set().union(*(set(g.model + "|" + g.seed.astype(str)) for g in design)))
    latent = dict(zip(models, rng.normal(size=len(models))))
    out = []
    for g in design:
        z = np.array([latent[m] for m in g.model + "|" + g.seed.astype(str)]) + 0.3 * rng.normal(size=len(g))
        noise = rng.normal(size=len(g))
        p = correlation * z + np.sqrt(max(1 - correlation ** 2, 0)) * noise * z.std()
        out.append(g.assign(b_exact=z, p_misalign=p))
    return out


def test_tracking_rule_reads_the_lower_end():
    assert claims.tracking_label(0.72, 0.95) == "reproduced"
    assert claims.tracking_label(0.35, 0.95) == "partly"
    assert claims.tracking_label(0.29, 0.95) == "inconclusive"
    assert claims.tracking_label(-0.4, 0.25) == "contradicted"
    assert claims.tracking_label(float("nan"), float("nan")) == "inconclusive"
    assert claims.tracking_interval([]) [3] == 0


def test_tracking_is_calibrated_at_the_committed_cpu_design():
    """With certificates that track the rate closely (rank correlation about 0.95) the rule says reproduced most of
    the time; with none it says reproduced (or partly) at most 5% of the time."""
    design = _design()
    assert design and len(set(design[0].model + design[0].seed.astype(str))) >= 10
    rng = np.random.default_rng(0)

    def labels(correlation, trials=40):
        found = []
        for _ in range(trials):
            _, lo, hi, _ = claims.tracking_interval(_simulated(design, correlation, rng), resamples=200,
                                                    seed=int(rng.integers(1 << 30)))
            found.append(claims.tracking_label(lo, hi))
        return {label: found.count(label) / trials for label in set(found)}

    effect = labels(0.99)
    assert effect.get("reproduced", 0) >= 0.8, effect
    null = labels(0.0)
    assert null.get("reproduced", 0) + null.get("partly", 0) <= 0.05, null
