"""The theory, checked on synthetic data with a known mean and covariance.

Three studies, each written as a tidy table under ``results/<profile>/``:

* ``theory_alignment``: on a grid of (noise law, covariance spectrum, d, M, K,
  signal-to-noise), Monte Carlo of ``mu_M^T g_K`` against its exact mean and
  variance, and the empirical ``Pr(mu_M^T g_K <= 0)`` beside ``B_exact`` and ``B_align``.
* ``theory_estimators``: U-statistic and plug-in estimates of ``tr(Sigma^2)``,
  ``mu^T Sigma mu`` and ``d_align`` over many replicates as d/n grows.
* ``theory_sketch``: the CountSketch estimate's error against the sketch size k.

Run without Jupyter: ``python -m dalign_repro.experiments.theory --profile cpu``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from dalign_core.geometry import bounds
from dalign_core.geometry.estimators import estimate_geometry, plugin_geometry
from dalign_repro.config import ExperimentConfig, require, require_at_least, require_items
from dalign_repro.experiments._runner import Experiment, register
from dalign_core.geometry.synthetic import NOISE_LAWS, SPECTRA, SyntheticQ, mean_norm_for_snr

TABLES = ("theory_alignment", "theory_estimators", "theory_sketch")


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """Grid sizes and Monte Carlo budgets of the theory checks (defaults: the ``cpu`` profile)."""

    profile: str = "cpu"
    seed: int = 0
    noise_laws: tuple[str, ...] = NOISE_LAWS
    spectra: tuple[str, ...] = SPECTRA
    dims: tuple[int, ...] = (8, 64)
    budgets: tuple[tuple[int, int], ...] = ((2, 8), (16, 16))
    snrs: tuple[float, ...] = (0.5, 1.0, 2.0)
    trials: int = 20_000
    estimator_n: int = 64
    estimator_dims: tuple[int, ...] = (8, 32, 128, 512, 2048)
    estimator_replicates: int = 100
    estimator_d_2: float = 4.0
    sketch_d: int = 4096
    sketch_n: int = 256
    sketch_sizes: tuple[int, ...] = (64, 256, 1024, 4096)
    sketch_replicates: int = 5

    def __post_init__(self):
        """Every field checked where the config is built: one line naming the field, its value and what is allowed."""
        super().__post_init__()
        for name, known in (("noise_laws", NOISE_LAWS), ("spectra", SPECTRA)):
            chosen = getattr(self, name)
            require(self, name, bool(chosen) and all(item in known for item in chosen),
                    f"it must be a non-empty selection of {', '.join(known)}")
        require_items(self, "dims", 1)
        require_items(self, "budgets", 1, pairs=True)
        require(self, "snrs", bool(self.snrs) and all(isinstance(snr, (int, float)) and math.isfinite(snr) and snr > 0
                                                      for snr in self.snrs),
                "it must be a non-empty list of positive finite signal-to-noise ratios (the mean's norm is set from "
                "each: a ratio of 0 or less has no mean of that sign)")
        require_at_least(self, dict(trials=2, estimator_n=5, estimator_replicates=1, sketch_d=1, sketch_n=5,
                                    sketch_replicates=1))
        require_items(self, "estimator_dims", 1)
        require(self, "estimator_d_2", self.estimator_d_2 > 0 and math.isfinite(self.estimator_d_2),
                "it must be a positive finite number (the true d_2 of the estimator study's law)")
        require_items(self, "sketch_sizes", 1, most=self.sketch_d)


def _rng(seed: int, *key: int) -> np.random.Generator:
    """An independent generator for each cell, so cells do not depend on the order they run in."""
    return np.random.default_rng(np.random.SeedSequence([seed, *key]))


def alignment_study(config: Config) -> pd.DataFrame:
    """Monte Carlo of ``mu_M^T g_K`` against the exact moments and both certificates, one row per cell."""
    rows = []
    cells = list(itertools.product(config.noise_laws, config.spectra, config.dims, config.budgets, config.snrs))
    for index, (noise, spectrum_kind, d, (M, K), snr) in enumerate(tqdm(cells, desc="alignment grid", leave=False, disable=None)):
        rng = _rng(config.seed, 1, index)
        law = SyntheticQ.random(d, spectrum_kind, noise, 1.0, rng)
        sigma = law.sigma
        unit = law.mu
        law.mu = unit * mean_norm_for_snr(snr, float(unit @ sigma @ unit), float((sigma * sigma).sum()), M, K)
        mean_exact = bounds.alignment_mean(law.mu)
        var_exact = bounds.alignment_variance(law.mu, sigma, M, K)
        dims = bounds.effective_dims(law.mu, sigma)
        stat = np.einsum("td,td->t", law.sample_means(config.trials, M, rng), law.sample_means(config.trials, K, rng))
        T = config.trials
        mean_mc, var_mc = float(stat.mean()), float(stat.var(ddof=1))
        fourth = float(((stat - mean_mc) ** 4).mean())
        p = float((stat <= 0).mean())
        rows.append(dict(
            noise=noise, spectrum=spectrum_kind, d=d, M=M, K=K, snr=snr, trials=T,
            mean_exact=mean_exact, mean_mc=mean_mc, mean_mc_se=math.sqrt(var_mc / T),
            var_exact=var_exact, var_mc=var_mc, var_mc_se=math.sqrt(max(fourth - var_mc**2, 0.0) / T),
            p_misalign=p, p_misalign_se=math.sqrt(p * (1 - p) / T),
            b_exact=bounds.b_exact(law.mu, sigma, M, K), b_align=bounds.b_align(dims.d_align, M, K),
            d_par=dims.d_par, d_2=dims.d_2, d_align=dims.d_align, n_eff=bounds.n_eff(M, K),
        ))
    table = pd.DataFrame(rows)
    for moment in ("mean", "var"):
        table[f"{moment}_rel_err"] = table[f"{moment}_mc"] / table[f"{moment}_exact"] - 1.0
        table[f"{moment}_rel_se"] = table[f"{moment}_mc_se"] / table[f"{moment}_exact"]
    return table


def estimator_study(config: Config) -> pd.DataFrame:
    """U-statistic and plug-in estimates over replicates at fixed n as d grows; one row per (d, replicate, method).

    The law has a flat spectrum (``tr Sigma = d``) and ``||mu||^2 = sqrt(d_2 tr Sigma^2)``,
    so the true ``d_align = d_2 = config.estimator_d_2`` at every d while the plug-in's
    ``tr(S^2)`` bias, about ``d^2 / n``, grows with d.
    """
    rows = []
    for d_index, d in enumerate(tqdm(config.estimator_dims, desc="estimator study", leave=False, disable=None)):
        rng = _rng(config.seed, 2, d_index)
        law = SyntheticQ.random(d, "flat", "gaussian", 1.0, rng, rotate=False)
        law.mu = law.mu * (config.estimator_d_2 * law.cov_energy) ** 0.25
        truth = dict(mean_sq=bounds.alignment_mean(law.mu), directional=law.directional, cov_energy=law.cov_energy)
        truth["d_align"] = bounds.dims_from_moments(truth["mean_sq"] ** 2, law.directional, law.cov_energy).d_align
        for replicate in range(config.estimator_replicates):
            Q = law.sample(config.estimator_n, rng)
            for geometry in (estimate_geometry(Q), plugin_geometry(Q)):
                row = dict(d=d, n=config.estimator_n, replicate=replicate, method=geometry.method)
                for name, true_value in truth.items():
                    row[name] = getattr(geometry, name)
                    row[f"{name}_true"] = true_value
                rows.append(row)
    return pd.DataFrame(rows)


def sketch_study(config: Config) -> pd.DataFrame:
    """Relative error of sketched against exact U-statistics on the same rows, one row per (k, replicate)."""
    rows = []
    d, n = config.sketch_d, config.sketch_n
    for replicate in tqdm(range(config.sketch_replicates), desc="sketch study", leave=False, disable=None):
        rng = _rng(config.seed, 3, replicate)
        law = SyntheticQ.random(d, "power", "gaussian", 1.0, rng, rotate=False)
        law.mu = law.mu * (4.0 * law.cov_energy) ** 0.25
        Q = law.sample(n, rng)
        exact = estimate_geometry(Q)
        effective_rank = float(law.eigenvalues.sum()) ** 2 / law.cov_energy
        for k in config.sketch_sizes:
            sketched = estimate_geometry(Q, sketch_dim=k, seed=replicate)
            row = dict(d=d, n=n, k=k, replicate=replicate, effective_rank=effective_rank)
            for name in ("mean_sq", "cov_energy", "d_align"):
                row[f"{name}_rel_err"] = getattr(sketched, name) / getattr(exact, name) - 1.0
            rows.append(row)
    return pd.DataFrame(rows)


def compute(config: Config, out_dir: Path | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """The three studies' tables, with each study's wall time in the provenance (``out_dir`` is not needed)."""
    tables, seconds = {}, {}
    for name, study in zip(TABLES, (alignment_study, estimator_study, sketch_study)):
        start = time.perf_counter()
        tables[name] = study(config)
        seconds[name] = round(time.perf_counter() - start, 2)
    return tables, {"study_seconds": seconds}


EXPERIMENT = register(Experiment("theory", Config, TABLES, compute, description=__doc__))
run = EXPERIMENT.run  # run(config, out_dir=None, force=False): the three studies' tables, skipped when current

if __name__ == "__main__":
    EXPERIMENT.main()
