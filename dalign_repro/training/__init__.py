"""Training and where it runs: the loop, its checkpoints and losses, the device, the processes.

* :mod:`~dalign_repro.training.loop`: the seeded, resumable training loop (config, data order, optimizer, data parallel).
* :mod:`~dalign_repro.training.checkpoints`: checkpoint folders written atomically, listed, loaded and pruned.
* :mod:`~dalign_repro.training.evaluation`: the causal LM loss, held-out evaluation and eval mode.
* :mod:`~dalign_repro.training.baselines`: the bigram baseline a language model must beat to count as trained.
* :mod:`~dalign_core.device`: where this process computes, resolved once: its torchrun rank, device, threads.
* :mod:`~dalign_repro.training.workers`: one-thread worker processes over a job grid, and the machine they use.
* :mod:`~dalign_repro.training.distributed`: torchrun's process group and the job grid its ranks share.
* :mod:`~dalign_repro.training.sharded`: one q pool's rows spread over the ranks, merged into one Gram estimate.

May import: :mod:`dalign_core.geometry`, :mod:`dalign_core.capture` and the top-level helpers.
"""
