"""``python -m dalign_core`` runs the ``dalign`` command (see :mod:`dalign_core.cli.app`)."""

import sys

from dalign_core.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
