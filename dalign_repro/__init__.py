"""dalign_repro: the reproduction of the paper's experiments, built on :mod:`dalign_core`.

The rooms, bottom first (each imports only :mod:`dalign_core` and the rooms below it):

* :mod:`dalign_repro.config`: profiles, the experiments' config base class, results folders.
* :mod:`dalign_repro.data` and :mod:`dalign_repro.models`: corpora, tokenizers, image sets; the three families' models.
* :mod:`dalign_repro.training`: the training loop, checkpoints, worker processes and torchrun.
* :mod:`dalign_repro.sweep`: a family spec plugged into the shared width sweep, its trends and verdicts.
* :mod:`dalign_repro.report`: the results contract (tidy CSV + provenance JSON), figures, the chapters' sentences.
* :mod:`dalign_repro.studies`: the residual interventions and the growth study.
* :mod:`dalign_repro.claims`: the claims table the book's verdict page reads.
* :mod:`dalign_repro.experiments`: one module per chapter, each a config and a ``run``;
  ``python -m dalign_repro <experiment> --profile cpu`` runs one.

:mod:`dalign_core` never imports this package.
"""

__version__ = "0.1.0"
