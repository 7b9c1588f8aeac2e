"""The ``dalign`` command: one module per subcommand, and the loading of a user's model and data.

* :mod:`~dalign_core.cli.app`: the parser and the subcommands.
* :mod:`~dalign_core.cli.loading`: models from a folder, a hub id or ``--arch``; text, tensor and image data.

May import anything of the library; nothing imports it but ``python -m dalign_core``.
"""

from dalign_core.cli.app import main

__all__ = ["main"]
