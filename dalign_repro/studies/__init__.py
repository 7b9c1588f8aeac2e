"""The studies that load a sweep's trained models: one folder per study, its computation, sentences and figures.

* :mod:`dalign_repro.studies.interventions`: a step along μ_M, the sign, retention and certificates.
* :mod:`dalign_repro.studies.growth`: where to insert a block, and whether d_align ranks the points by gain.

May import: :mod:`dalign_repro.report` and everything below it.
"""
