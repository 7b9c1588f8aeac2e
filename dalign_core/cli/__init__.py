"""The ``dalign`` command: one module per subcommand, the options they share, and the loading of a user's model and
data.

* :mod:`~dalign_core.cli.app`: the parser and the dispatch to each subcommand (``dalign_core.cli:main``).
* :mod:`~dalign_core.cli.estimate`: ``dalign estimate``, d_align and the certificates at one layer or every block.
* :mod:`~dalign_core.cli.layers`: ``dalign layers``, the insertion points and their redundancy.
* :mod:`~dalign_core.cli.rank`: ``dalign rank``, the insertion points by each predictor of where to grow.
* :mod:`~dalign_core.cli.options`: the options several subcommands share, and their checks before anything loads.
* :mod:`~dalign_core.cli.output`: numbers, plain-text tables and progress bars as every subcommand prints them.
* :mod:`~dalign_core.cli.redundancy_check`: the redundancy check every subcommand runs, and its warning.
* :mod:`~dalign_core.cli.loading`: models from a folder, a hub id or ``--arch``, and their tokenizers.
* :mod:`~dalign_core.cli.llama`: a plain LLaMA folder built without transformers (a fast start, the same numbers).
* :mod:`~dalign_core.cli.tokenizer_file`: a generic ``tokenizer.json`` read by ``tokenizers`` alone (a fast start).
* :mod:`~dalign_core.cli.examples`: the examples: text files and datasets as token batches, tensor files, image
  folders; a --data pipe read with a timeout.
* :mod:`~dalign_core.cli.regular_files`: no pipe, socket or device in a model or tokenizer folder; a --revision
  inside --model.
* :mod:`~dalign_core.cli.failures`: one line for what the user's model or data raised, naming the model, the
  submodule and the layer.

Only :mod:`~dalign_core.cli.loading` (with :mod:`~dalign_core.cli.llama`) and :mod:`~dalign_core.cli.examples` import
torch when loaded; the others load it inside the commands, so ``dalign --help`` is instant and Ctrl-C while torch
loads is caught.

May import anything of the library; nothing imports it but ``python -m dalign_core``, and
:mod:`dalign_repro.experiments.pythia_checkpoints` its model loading.
"""

from dalign_core.cli.app import main

__all__ = ["main"]
