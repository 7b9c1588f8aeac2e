"""The intervention study: does the alignment of μ_M with g_K predict what a step along μ_M does?

What the intervention table says, and how it compares with the paper: every number and verdict computed.

**Two checks of one sign.** Each step is measured twice: on the K examples whose mean
gradient g_K gave the alignment ``μ_Mᵀg_K`` (``observed``), and on the evaluation set E,
examples the step never saw (``eval_observed``). On K, at a small step,
``ΔL_K = −η μ_Mᵀg_K + O(η²)``: the sign agrees with the alignment by Taylor's theorem
(the *same-sample check*, algebra; a disagreement there is roundoff or curvature). On E
the sign agrees only if what M and K share is also what fresh examples share (the
*out-of-sample check*, evidence). The sign claim is judged on E.

* :mod:`~dalign_repro.studies.interventions.compute`: the draws and the steps, on one trained model.
* :mod:`~dalign_repro.studies.interventions.draws`: the rows every reading counts, rates with Wilson intervals, the
  names a sentence uses.
* :mod:`~dalign_repro.studies.interventions.signs`: the sign as the paper reads it (and its calibration).
* :mod:`~dalign_repro.studies.interventions.retention`: retention at small steps, on K and out of sample on E.
* :mod:`~dalign_repro.studies.interventions.tracking`: the share of positive draws beside the certificates.
* :mod:`~dalign_repro.studies.interventions.prediction`: the sign as a prediction of a fall on E (the claims table's
  rule).
* :mod:`~dalign_repro.studies.interventions.plots`: the chapter's figures (matplotlib; imported on its own).

Every public name of the modules but the figures is importable from here
(``from dalign_repro.studies import interventions``).
"""

from __future__ import annotations

from dalign_repro.studies.interventions.compute import (Intervention, shared_bias_step, residual_block_step,
                                                       train_decrease_steps, train_decrease_draws,
                                                       optimizer_step_decrease, KINDS, ROUNDOFF_FLOAT32,
                                                       ROUNDOFF_FLOAT64)
from dalign_repro.studies.interventions.draws import (PAPER_RETENTION, CLOSE_TO_ONE, SIGN_BANDS, FIRST_ORDER_TOLERANCE,
                                                     Z_BINS, FAMILY_NAMES, FAILS, DRAW_COLUMNS, wilson_rate,
                                                     share_with_interval, column_or, single_steps, measured_changes,
                                                     judged_steps, percent, percent_interval, family_name, steps_text,
                                                     model_key, percentile_interval, BOOTSTRAP_RESAMPLES,
                                                     SETTING_NAMES)
from dalign_repro.studies.interventions.signs import (conditional_decrease, agreement, sign_agreement, sign_verdict,
                                                     sign_design, simulate_sign_verdict, describe_sign_calibration,
                                                     block_explained, describe_sign, describe_steps,
                                                     describe_lowest_bin)
from dalign_repro.studies.interventions.retention import (retention_curve, retention_verdict, describe_retention,
                                                         OUT_OF_SAMPLE_TOLERANCE, out_of_sample_steps,
                                                         out_of_sample_retention, out_of_sample_verdict,
                                                         describe_out_of_sample, simulate_out_of_sample_verdict,
                                                         out_of_sample_design, describe_out_of_sample_calibration)
from dalign_repro.studies.interventions.tracking import (theory_vs_observation, describe_positive_share)
from dalign_repro.studies.interventions.prediction import (PREDICTION_MARGIN, auc_text, prediction_label,
                                                          sign_prediction, prediction_design, simulate_prediction_verdict,
                                                          describe_prediction, describe_prediction_calibration)

__all__ = ["Intervention", "shared_bias_step", "residual_block_step", "train_decrease_steps", "train_decrease_draws",
           "optimizer_step_decrease", "KINDS", "ROUNDOFF_FLOAT32", "ROUNDOFF_FLOAT64", "PAPER_RETENTION",
           "CLOSE_TO_ONE", "SIGN_BANDS", "FIRST_ORDER_TOLERANCE", "Z_BINS", "FAMILY_NAMES", "FAILS", "DRAW_COLUMNS",
           "wilson_rate", "share_with_interval", "column_or", "single_steps", "measured_changes", "judged_steps",
           "percent", "percent_interval", "family_name", "steps_text", "model_key", "percentile_interval",
           "BOOTSTRAP_RESAMPLES", "SETTING_NAMES", "conditional_decrease", "agreement", "sign_agreement",
           "sign_verdict", "sign_design", "simulate_sign_verdict", "describe_sign_calibration", "block_explained",
           "describe_sign", "describe_steps", "describe_lowest_bin", "retention_curve", "retention_verdict",
           "describe_retention", "auc_text",
           "OUT_OF_SAMPLE_TOLERANCE", "out_of_sample_steps", "out_of_sample_retention",
           "out_of_sample_verdict", "describe_out_of_sample", "simulate_out_of_sample_verdict",
           "out_of_sample_design", "describe_out_of_sample_calibration",
           "theory_vs_observation", "describe_positive_share", "PREDICTION_MARGIN", "prediction_label",
           "sign_prediction", "prediction_design", "simulate_prediction_verdict", "describe_prediction",
           "describe_prediction_calibration"]
