"""The width sweep every family shares: the family spec, the plan of jobs, the measurement, the trend tests.

* :mod:`~dalign_core.sweep.family`: what a model family answers (:class:`~dalign_core.sweep.family.Family`) and
  the sweep's config (:class:`~dalign_core.sweep.family.SweepConfig`).
* :mod:`~dalign_core.sweep.lm_family`: the shared answers of causal language models.
* :mod:`~dalign_core.sweep.run`: rates, seeds, geometry along training, misalignment, as a grid of jobs.
* :mod:`~dalign_core.sweep.measure`: one trained run's measurement: q along training, misalignment, redundancy.
* :mod:`~dalign_core.sweep.trend`: width against d_align with a seed bootstrap, and the verdicts' tests.

May import: :mod:`dalign_core.training`, :mod:`dalign_core.capture`, :mod:`dalign_core.geometry`,
:mod:`dalign_core.data` and the top-level helpers.
"""
