"""The ``dalign`` command (also ``python -m dalign_core``): its parser, and the dispatch to each subcommand.

* ``dalign estimate`` (:mod:`~dalign_core.cli.estimate`): d_align and the misalignment certificates at one layer
  or every residual block.
* ``dalign layers`` (:mod:`~dalign_core.cli.layers`): a model's insertion points, with ``--data`` their redundancy.
* ``dalign rank`` (:mod:`~dalign_core.cli.rank`): the insertion points in the order of each predictor of where to
  grow.

A refused input is one line on stderr (``dalign: error: …``, exit status 1), a usage error argparse's (2), and
Ctrl-C ``dalign: interrupted`` (130), also while torch and the model load.

``--revision`` picks a checkpoint along training: a Hub branch, tag or commit
(``--model EleutherAI/pythia-70m --revision step1000``), or for a local folder its
subfolder ``<folder>/<revision>/`` (``--model ./pythia-70m --revision step1000``).
"""

from __future__ import annotations

import argparse
import re
import sys

from dalign_core.environment import env_flag
from dalign_core.cli.estimate import estimate
from dalign_core.cli.layers import layers_command
from dalign_core.cli.options import (MAX_HIDDEN, add_arch_options, add_data_options, check_common, hidden_width_option,
                                     out_file_option)
from dalign_core.cli.rank import rank

# torch and the library load inside the commands, so Ctrl-C while they load is caught by main().

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    """The ``dalign`` command's parser: ``--version`` and the subcommands ``estimate``, ``layers`` and ``rank``."""
    parser = argparse.ArgumentParser(
        prog="dalign",
        description="Measure the effective alignment dimension d_align of a model's activation gradients.",
    )
    from dalign_core import __version__

    parser.add_argument("--version", action="version", version=f"dalign {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_estimate(sub)
    _add_layers(sub)
    _add_rank(sub)
    return parser


def _add_estimate(sub) -> None:
    """``dalign estimate``'s options: the model, the layer, the data, the budgets and the output."""
    est = sub.add_parser(
        "estimate",
        help="estimate d_align and the misalignment certificates at one layer or every residual block",
        description=(
            "Estimate the geometry of q = dℓ/dz at the output z of a layer from N held-out examples "
            "(one forward+backward pass per batch) and print d_align with confidence intervals and the "
            "certificates B_exact, B_align for budgets M (train) and K (test)."
        ),
    )
    est.add_argument("--model", required=True,
                     help="local checkpoint folder (save_pretrained output) or Hugging Face id; with --arch, a state "
                          "dict file (.pt or .safetensors) for the model --arch builds")
    est.add_argument("--revision", default=None,
                     help="checkpoint revision: a Hub branch, tag or commit (e.g. step1000), or for a local folder "
                          "its subfolder <model>/<revision>/ (default: the model's main checkpoint)")
    est.add_argument("--layer", required=True,
                     help="module path as in model.named_modules() (e.g. model.layers.1), several separated by commas, "
                          "or 'all' for every residual block")
    add_arch_options(est)
    add_data_options(est, required=True)
    est.add_argument("--examples", "-n", type=int, required=True, help="number of examples (sequences), at least 5")
    est.add_argument("--m", type=float, default=None, help="train budget M for the certificates (default: N)")
    est.add_argument("--k", type=float, default=None, help="test budget K for the certificates (default: N)")
    est.add_argument("--reduction", choices=("shared", "full"), default="shared",
                     help="shared: sum q over positions (dimension N, default); full: keep positions (T·N)")
    est.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals (default: 0.95)")
    est.add_argument("--sketch-dim", type=int, default=None, help="keep k-dim CountSketches of q instead of q")
    est.add_argument("--redundancy-examples", type=int, default=None,
                     help="check on up to this many of the examples whether q is already a trained parameter's "
                          "gradient (warns above a fraction of 0.9; 0: skip; default: 64, a fraction of the "
                          "estimate's time; --thorough-redundancy: every example)")
    est.add_argument("--thorough-redundancy", action="store_true",
                     help="run the redundancy check on every example (--examples): a tighter fraction, several "
                          "times the capture's time")
    est.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"), default="float32",
                     help="model dtype (default: float32)")
    est.add_argument("--out", type=out_file_option, default=None,
                     help="write the results to this CSV file (atomically; never over an input or a non-CSV file)")
    est.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _add_layers(sub) -> None:
    """``dalign layers``' options: the model, and with data the redundancy check of each block."""
    lay = sub.add_parser("layers", help="list a model's residual blocks (insertion points)")
    lay.add_argument("--model", required=True,
                     help="local checkpoint folder or Hugging Face id; with --arch, a state dict file")
    lay.add_argument("--revision", default=None, help="checkpoint revision (Hub branch or local subfolder)")
    add_arch_options(lay)
    lay.add_argument("--all-modules", action="store_true", help="list every named module, not only residual blocks")
    add_data_options(lay, required=False)
    lay.add_argument("--redundancy-examples", type=int, default=64,
                     help="with --data: examples for each block's redundancy fraction (default: 64)")
    lay.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _add_rank(sub) -> None:
    """``dalign rank``'s options: the model, the data, the points, the budgets, the inserted block and the CSV."""
    rank = sub.add_parser(
        "rank", help="order the insertion points by each predictor of where to grow",
        description=("Order a model's insertion points (residual blocks) by each predictor of where an inserted "
                     "zero-output block would help held-out loss most: d_align, d_par, d_2, ||mu||^2, mu_M.g_K and "
                     "B_align at the budgets, and the norm of the inserted block's gradient, with intervals."))
    rank.add_argument("--model", required=True,
                      help="local checkpoint folder or Hugging Face id of a causal LM; with --arch, a state dict "
                           "file (.pt or .safetensors) for the model --arch builds")
    rank.add_argument("--revision", default=None, help="checkpoint revision (Hub branch or local subfolder)")
    add_arch_options(rank)
    add_data_options(rank, required=True)
    rank.add_argument("--layer", default="all", help="insertion points, separated by commas (default: all blocks)")
    rank.add_argument("--examples", "-n", type=int, default=64,
                      help="examples: the first half train, the second held out (default: 64; at least 8)")
    rank.add_argument("--budgets", default=None,
                      help="budgets M = K of mu_M.g_K and B_align, separated by commas (default: n/8 and n/2)")
    rank.add_argument("--reduction", choices=("shared", "full"), default="shared",
                      help="shared: sum q over positions (default); full: keep positions")
    rank.add_argument("--hidden", type=hidden_width_option, default=None,
                      help=f"width of the inserted block, 1 to {MAX_HIDDEN} (default: the layer's)")
    rank.add_argument("--seed", type=int, default=0, help="seed of the inserted block's W1 (default: 0)")
    rank.add_argument("--confidence", type=float, default=0.95, help="level of the intervals (default: 0.95)")
    rank.add_argument("--redundancy-examples", type=int, default=64,
                      help="examples of the redundancy check (warns above 0.9; 0: skip; default: 64)")
    rank.add_argument("--csv", type=out_file_option, default=None,
                      help="write every number to this CSV file (atomically; never over an input or a non-CSV file)")
    rank.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dalign`` console script; returns the exit status."""
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as err:  # argparse exits on --help (0) and usage errors (2)
            return int(err.code or 0)
        return _run(args)
    except KeyboardInterrupt:  # Ctrl-C, also while torch and the model are still loading
        print("dalign: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; a refused input is one line on stderr and exit status 1."""
    from dalign_core.capture.refusals import CaptureError, ModelError
    from dalign_core.cli.failures import failure_line, missing_package_line
    from dalign_core.cli.loading import LoadError

    try:
        check_common(args)
        if args.command == "estimate":
            estimate(args)
        elif args.command == "layers":
            layers_command(args)
        elif args.command == "rank":
            rank(args)
    except (LoadError, CaptureError, ValueError, OSError) as err:
        if isinstance(err, ModelError) and env_flag("DALIGN_DEBUG"):
            raise
        text = failure_line(err, args) if isinstance(err, ModelError) else str(err)
        one_line = re.sub(r"\s*\n\s*", " ", text.strip())  # a message quoted from a library may span lines
        print(f"dalign: error: {one_line}", file=sys.stderr)
        return EXIT_ERROR
    except ModuleNotFoundError as err:  # an optional package a model or data needs: say which, and how to install it
        if env_flag("DALIGN_DEBUG"):
            raise
        print(f"dalign: error: {missing_package_line(err)}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as err:  # noqa: BLE001  (the user's model or data, any type: one line; our own bug: raised)
        line = None if env_flag("DALIGN_DEBUG") else failure_line(err, args)
        if line is None:
            raise
        print("dalign: error: " + re.sub(r"\s*\n\s*", " ", line.strip()), file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
