"""The growth study: grow a zero-output block at each insertion point and rank the points.

* :mod:`~dalign_core.studies.growth.compute`: the predictors, the growth itself, the scores and the decision.
"""
