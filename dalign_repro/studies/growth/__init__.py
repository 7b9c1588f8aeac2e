"""The growth study: where to grow a trained model, and do the alignment statistics rank insertion points by the gain?

The paper's motivation is model growth (Net2Net, progressive stacking, LiGO): a method
must decide *where* an expansion still helps on unseen data, and the paper offers
d_align and B_align as the certificate. This study measures, at every candidate
insertion point of a trained model (each residual block's output z), the statistics a
growth method could read off *before* growing, then grows there and measures what
growing actually brought, and scores how well each statistic ranked the points. The
claim tested ("d_align ranks insertion points better than the gradient-norm baseline")
is this project's, not the paper's: the paper certifies the sign of one step at one
point; it does not compare points.

* :mod:`dalign_core.growth.predicting`: what a growth method reads before growing (:func:`predictors`; in the
  core, since ``dalign rank`` reports it).
* :mod:`~dalign_repro.studies.growth.growing`: the zero-output block and what training it alone brings (:func:`grow`).
* :mod:`~dalign_repro.studies.growth.scoring`: how well each predictor ranked the points (:func:`score`,
  :func:`verdict`).
* :mod:`~dalign_repro.studies.growth.deciding`: the claim's decision on regrets (:func:`decision`).

Every public name of the four modules is importable from here (``from dalign_repro.studies import growth``).
"""

from __future__ import annotations

from dalign_repro.studies.growth.deciding import (DECISION_CLAIM, MIN_POINTS, NOISE_RATIO, FIXED_RULES, noise, regrets,
                                                 Decision, decision, simulate_decision)
from dalign_core.growth.predicting import (BASE_PREDICTORS, predictor_names, SIGN, PointStats, predictors, order,
                                           point_rows)
from dalign_repro.studies.growth.growing import (ZeroOutputBlock, inserted, block_for, grow, seeded_batches)
from dalign_repro.studies.growth.scoring import (CLAIM, RHO_CLAIM, CALIBRATION, spearman, spearman_interval,
                                                MODEL_KEYS, model_keys, score, first_choice,
                                                t_interval, summarize, label_for, verdict)

__all__ = ["BASE_PREDICTORS", "predictor_names", "SIGN", "PointStats", "predictors", "ZeroOutputBlock", "inserted",
           "block_for", "grow", "seeded_batches", "CLAIM", "RHO_CLAIM", "CALIBRATION", "spearman",
           "spearman_interval", "MODEL_KEYS", "model_keys", "score", "first_choice", "order", "point_rows",
           "t_interval", "summarize", "label_for", "verdict", "DECISION_CLAIM", "MIN_POINTS", "NOISE_RATIO",
           "FIXED_RULES", "noise", "regrets", "Decision", "decision", "simulate_decision"]
