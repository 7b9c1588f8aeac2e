"""Training and where it runs: the loop, the baselines a trained model must beat, and the processes.

* :mod:`~dalign_core.training.loop`: the seeded, resumable training loop, its losses and evaluation.
* :mod:`~dalign_core.training.baselines`: the bigram baseline a language model must beat to count as trained.
* :mod:`~dalign_core.training.workers`: one-thread worker processes over a job grid, and the machine they use.
* :mod:`~dalign_core.training.distributed`: the same grid shared by ``torchrun`` ranks, and merged Gram sums.

May import: :mod:`dalign_core.geometry`, :mod:`dalign_core.capture` and the top-level helpers.
"""
