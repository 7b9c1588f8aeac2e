"""The width sweep every family shares: the family spec, the plan of jobs, the measurement, the trend tests.

* :mod:`~dalign_repro.sweep.family`: what a model family answers (:class:`~dalign_repro.sweep.family.Family`) and
  the sweep's config (:class:`~dalign_repro.sweep.family.SweepConfig`).
  Each family's spec is registered in :mod:`dalign_repro.families`; the sweep is handed one and calls only its
  answers.
* :mod:`~dalign_repro.sweep.pools`: the data checked to supply a config, and the example pools every run shares.
* :mod:`~dalign_repro.sweep.trained`: one (width, seed, rate) run trained or loaded, and where its checkpoints live.
* :mod:`~dalign_repro.sweep.plan`: the grid of jobs (rate trials, the fit's full-length check, measured runs) and
  their costs.
* :mod:`~dalign_repro.sweep.rates`: the learning rate fitted to each width, and the check of that fit.
* :mod:`~dalign_repro.sweep.measure`: one trained run's measurement: q along training, misalignment, redundancy.
* :mod:`~dalign_repro.sweep.run`: the sweep itself (the steps in order, run as the grid of jobs) and its tables,
  the trend table among them.
* :mod:`~dalign_repro.sweep.projection`: the dry run: each width timed, the whole sweep's time projected.
* :mod:`~dalign_repro.sweep.trend`: the slope of a quantity on log width (one summary per run, a t interval over
  runs), its labels, power and calibration, and the verdicts' sentences.
* :mod:`~dalign_repro.sweep.clock`: the matched-loss slope with the training clock removed, and its calibration.

May import: :mod:`dalign_repro.training`, :mod:`dalign_core.capture`, :mod:`dalign_core.geometry`,
:mod:`dalign_repro.data` and the top-level helpers.
"""
