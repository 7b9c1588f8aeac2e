"""The intervention study: does the alignment of μ_M with g_K predict what a step along μ_M does?

* :mod:`~dalign_core.studies.interventions.compute`: the draws and the steps, on one trained model.
* :mod:`~dalign_core.studies.interventions.report`: the readings (sign as a prediction, retention, tracking).
* :mod:`~dalign_core.studies.interventions.plots`: the chapter's figures.
"""
