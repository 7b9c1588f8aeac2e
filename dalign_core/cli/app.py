"""The ``dalign`` command (also ``python -m dalign_core``).

``dalign estimate --model MODEL [--revision REV] --layer LAYER|all --data DATA --examples N [--m M --k K] [--out FILE]``
estimates the activation-gradient geometry at one or more insertion points of a
causal language model and prints ‖μ‖², d_∥, d_2 and d_align with jackknife
confidence intervals, and the misalignment certificates B_exact and B_align for
train/test budgets M and K: B_align at the d_align estimate and, the certificate,
at the lower end of its interval (1, and a note, when that interval reaches 0).
Inputs that would give wrong numbers (a checkpoint that does not match its config,
a tokenizer larger than the embedding, a --seq-len beyond the model's positions,
a --data file that is not UTF-8 text) are refused with one line on stderr, and an
--out that cannot be written is refused before anything is loaded. ``--layer all`` scans every residual block (decoder
layer) in one backward pass per batch and ranks them by d_align: where a block
inserted near zero output would have its training direction carry over to test
data best.

``--revision`` picks a checkpoint along training: a Hub branch, tag or commit
(``--model EleutherAI/pythia-70m --revision step1000``), or for a local folder its
subfolder ``<folder>/<revision>/`` (``--model ./pythia-70m --revision step1000``).

``dalign layers --model MODEL`` lists the insertion points; with ``--data`` it adds each
one's redundancy fraction (:mod:`dalign_core.capture.redundancy`) of the shared and the full q on
``--redundancy-examples`` examples: the share of q that trained parameters' gradients
already own (above 0.9, training drives ‖μ‖² to zero at any width and d_align there
says little about width). ``dalign estimate`` checks the q it measured the same way,
on up to ``--redundancy-examples`` of its examples, warns above 0.9 and writes the
fraction to the CSV (``redundancy``, ``redundant_with``).

``dalign rank --model MODEL --data DATA`` orders the insertion points by each predictor of
where to grow (:mod:`dalign_core.studies.growth.compute`): d_align, d_∥, d_2, ‖μ‖², μ_Mᵀg_K and B_align at
``--budgets``, and the plain baseline, the norm of the gradient of a zero-output block
inserted there; each with its interval, and the redundancy warning above 0.9. The first
half of the examples gives the train mean and the block gradient, the second half the
geometry and the held-out mean. Besides a causal LM folder and text, it takes any
``nn.Module`` built by ``--arch module:callable`` (``--arch torchvision.models:resnet18``,
``--arch-kwargs '{"num_classes": 10}'``) with ``--model`` a state dict (``.pt`` or
``.safetensors``) and ``--data`` a ``.pt`` file of ``{"inputs": …, "targets": …}``.
``--csv`` writes every number.
"""

from __future__ import annotations

import argparse
import io
import math
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch and the library load inside the commands, so Ctrl-C while they load is caught by main().

__all__ = ["main", "build_parser", "estimate", "rank", "format_table", "format_redundancy", "format_ranking"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dalign",
        description="Measure the effective alignment dimension d_align of a model's activation gradients.",
    )
    from dalign_core import __version__

    parser.add_argument("--version", action="version", version=f"dalign {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

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
    _add_arch_options(est)
    _add_data_options(est, required=True)
    est.add_argument("--examples", "-n", type=int, required=True, help="number of examples (sequences), at least 5")
    est.add_argument("--m", type=float, default=None, help="train budget M for the certificates (default: N)")
    est.add_argument("--k", type=float, default=None, help="test budget K for the certificates (default: N)")
    est.add_argument("--reduction", choices=("shared", "full"), default="shared",
                     help="shared: sum q over positions (dimension N, default); full: keep positions (T·N)")
    est.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals (default: 0.95)")
    est.add_argument("--sketch-dim", type=int, default=None, help="keep k-dim CountSketches of q instead of q")
    est.add_argument("--redundancy-examples", type=int, default=256,
                     help="check on up to this many of the examples whether q is already a trained parameter's "
                          "gradient (warns above a fraction of 0.9; 0: skip; default: 256)")
    est.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"), default="float32",
                     help="model dtype (default: float32)")
    est.add_argument("--out", type=_out_file, default=None,
                     help="write the results to this CSV file (atomically; never over an input or a non-CSV file)")
    est.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    lay = sub.add_parser("layers", help="list a model's residual blocks (insertion points)")
    lay.add_argument("--model", required=True,
                     help="local checkpoint folder or Hugging Face id; with --arch, a state dict file")
    lay.add_argument("--revision", default=None, help="checkpoint revision (Hub branch or local subfolder)")
    _add_arch_options(lay)
    lay.add_argument("--all-modules", action="store_true", help="list every named module, not only residual blocks")
    _add_data_options(lay, required=False)
    lay.add_argument("--redundancy-examples", type=int, default=64,
                     help="with --data: examples for each block's redundancy fraction (default: 64)")
    rank = sub.add_parser(
        "rank", help="order the insertion points by each predictor of where to grow",
        description=("Order a model's insertion points (residual blocks) by each predictor of where an inserted "
                     "zero-output block would help held-out loss most: d_align, d_par, d_2, ||mu||^2, mu_M.g_K and "
                     "B_align at the budgets, and the norm of the inserted block's gradient, with intervals."))
    rank.add_argument("--model", required=True,
                      help="local checkpoint folder or Hugging Face id of a causal LM; with --arch, a state dict "
                           "file (.pt or .safetensors) for the model --arch builds")
    rank.add_argument("--revision", default=None, help="checkpoint revision (Hub branch or local subfolder)")
    _add_arch_options(rank)
    _add_data_options(rank, required=True)
    rank.add_argument("--layer", default="all", help="insertion points, separated by commas (default: all blocks)")
    rank.add_argument("--examples", "-n", type=int, default=64,
                      help="examples: the first half train, the second held out (default: 64; at least 8)")
    rank.add_argument("--budgets", default=None,
                      help="budgets M = K of mu_M.g_K and B_align, separated by commas (default: n/8 and n/2)")
    rank.add_argument("--reduction", choices=("shared", "full"), default="shared",
                      help="shared: sum q over positions (default); full: keep positions")
    rank.add_argument("--hidden", type=_hidden_width, default=None,
                      help=f"width of the inserted block, 1 to {MAX_HIDDEN} (default: the layer's)")
    rank.add_argument("--seed", type=int, default=0, help="seed of the inserted block's W1 (default: 0)")
    rank.add_argument("--confidence", type=float, default=0.95, help="level of the intervals (default: 0.95)")
    rank.add_argument("--redundancy-examples", type=int, default=64,
                      help="examples of the redundancy check (warns above 0.9; 0: skip; default: 64)")
    rank.add_argument("--csv", type=_out_file, default=None,
                      help="write every number to this CSV file (atomically; never over an input or a non-CSV file)")
    return parser


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
"""The normalization torchvision's pretrained models expect (``--normalize imagenet``)."""


def _add_arch_options(parser: argparse.ArgumentParser) -> None:
    """``--arch`` (any nn.Module a callable builds) and how an image folder given as ``--data`` is read."""
    parser.add_argument("--arch", default=None, metavar="MODULE:CALLABLE",
                        help="build the model by calling this (e.g. torchvision.models:resnet18) and load --model, a "
                             "state dict, into it; --data is then a .pt file holding {'inputs': tensor, 'targets': "
                             "tensor} or an image folder (torchvision ImageFolder: one subfolder per class)")
    parser.add_argument("--arch-kwargs", default="{}", metavar="JSON",
                        help="keyword arguments of --arch as JSON (e.g. '{\"num_classes\": 10}')")
    parser.add_argument("--image-size", type=int, default=224,
                        help="with --arch and an image folder: each image is resized (shorter side) and center-"
                             "cropped to this many pixels (default: 224)")
    parser.add_argument("--normalize", choices=("imagenet", "none"), default="imagenet",
                        help="with --arch and an image folder: subtract ImageNet's channel means and divide by its "
                             "standard deviations, as torchvision's pretrained models expect (default), or not")


def _add_data_options(parser: argparse.ArgumentParser, required: bool) -> None:
    """The options that say which examples to read (``--data``) and how to run the model on them."""
    parser.add_argument("--data", required=required, default=None,
                        help="local UTF-8 text file, or a Hugging Face dataset name (network)"
                             + ("" if required else "; with it, each block's redundancy fraction is shown"))
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per example (default: 128)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per forward/backward pass (default: 16)")
    parser.add_argument("--split-mode", choices=("chunks", "lines"), default="chunks",
                        help="chunks: consecutive windows of --seq-len tokens (default); lines: one example per line")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder or id (default: the model's)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, … (default: cuda if available)")
    parser.add_argument("--dataset-config", default=None, help="Hugging Face dataset config name")
    parser.add_argument("--dataset-split", default="validation",
                        help="Hugging Face dataset split (default: validation)")
    parser.add_argument("--text-field", default="text", help="Hugging Face dataset text column (default: text)")


# ---------------------------------------------------------------------------
# Formatting


def _fmt(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"


def _ci(row: dict, name: str) -> str:
    lo, hi = row.get(f"{name}_lo"), row.get(f"{name}_hi")
    if lo is None or hi is None:
        return "-"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "none (see the note below)"
    return f"[{_fmt(lo)}, {_fmt(hi)}]"


def _undefined_note(records: list[dict]) -> str:
    """Why an interval is missing: d_par is infinite where mu' Sigma mu is estimated at or below 0."""
    unestimable = [r["layer"] for r in records
                   if not (math.isfinite(r.get("d_par_lo", 0.0)) and math.isfinite(r.get("d_par_hi", 0.0)))]
    if not unestimable:
        return ""
    return ("\nnote: d_par has no interval at " + ", ".join(unestimable) + ": mu' Sigma mu (the noise along the "
            "mean) is estimated at or below 0, so d_par = ||mu||^4 / mu' Sigma mu is unbounded in some jackknife "
            "replicates; d_align is then set by d_2. More examples narrow it.")


def _render(headers: list[str], rows: list[list[str]], align: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = []

    def line(cells):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    lines.append(line(headers))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(r) for r in rows)
    return "\n".join(lines)


def _uncertified(row: dict) -> bool:
    """True when the d_align interval reaches 0 (or is missing): these examples certify nothing."""
    low = row.get("d_align_lo")
    return low is None or not low > 0


def _certificate_note(records: list[dict], pct: str) -> str:
    """A warning when a d_align interval reaches 0, so that the B_align estimate is not read as a certificate."""
    weak = [r["layer"] for r in records if _uncertified(r)]
    if not weak:
        return ""
    n = records[0]["n"]
    where = "" if len(records) == 1 else f" at {len(weak)} of {len(records)} layers ({', '.join(weak[:5])}" + \
        (", …)" if len(weak) > 5 else ")")
    return (f"\nnote: the {pct} interval of d_align reaches 0{where}, so these n={n} examples certify nothing there "
            "(B_align at the interval's lower end is 1) and B_align at the estimate is not a certificate; "
            "use more examples (--examples) for one")


def format_table(records: list[dict], confidence: float) -> str:
    """Human-readable results: a detailed table for one layer, a ranked table for several.

    Besides B_align at the point estimate of d_align, each table shows the certificate
    B_align at the lower end of d_align's interval, and a note says where that
    interval reaches 0 (too wide for any certificate).
    """
    pct = f"{confidence * 100:g}%"
    if len(records) == 1:
        r = records[0]
        header = (f"layer {r['layer']}: n={r['n']} examples, d={r['d']} ({r['reduction']} reduction), "
                  f"{pct} jackknife intervals")
        budgets = f"(M={_fmt(r['M'])}, K={_fmt(r['K'])})"
        rows = [
            ["||mu||^2", _fmt(r["mean_sq"]), _ci(r, "mean_sq")],
            ["d_par", _fmt(r["d_par"]), _ci(r, "d_par")],
            ["d_2", _fmt(r["d_2"]), _ci(r, "d_2")],
            ["d_align", _fmt(r["d_align"]), _ci(r, "d_align")],
            [f"B_exact {budgets}", _fmt(r["b_exact"]), ""],
            [f"B_align {budgets}", _fmt(r["b_align"]), _ci(r, "b_align")],
            [f"B_align at d_align's {pct} lower end (certificate)", _fmt(r["b_align_at_lo"]), ""],
        ]
        table = _render(["quantity", "estimate", f"{pct} CI"], rows, ["l", "r", "l"])
        return header + "\n" + table + _certificate_note(records, pct) + _undefined_note(records)
    ranked = sorted(records, key=lambda r: r["rank"])
    rows = [
        [str(r["rank"]), r["layer"], _fmt(r["mean_sq"]), _fmt(r["d_par"]), _fmt(r["d_2"]), _fmt(r["d_align"]),
         _ci(r, "d_align"), _fmt(r["b_exact"]), _fmt(r["b_align"]), _fmt(r["b_align_at_lo"])]
        for r in ranked
    ]
    first = ranked[0]
    header = (
        f"{len(records)} insertion points, ranked by d_align (highest first: where an inserted block's training "
        f"direction would carry over to test data best)\n"
        f"n={first['n']} examples, d={first['d']} ({first['reduction']} reduction), {pct} jackknife intervals, "
        f"certificates at M={_fmt(first['M'])}, K={_fmt(first['K'])}; B_align@lo: the certificate, B_align at "
        f"d_align's {pct} lower end"
    )
    headers = ["rank", "layer", "||mu||^2", "d_par", "d_2", "d_align", f"d_align {pct} CI", "B_exact", "B_align",
               "B_align@lo"]
    table = _render(headers, rows, ["r", "l", "r", "r", "r", "r", "l", "r", "r", "r"])
    return header + "\n" + table + _certificate_note(ranked, pct) + _undefined_note(ranked)


CSV_COLUMNS = [
    "rank", "model", "revision", "layer", "layer_index", "data", "reduction", "seq_len", "n", "d", "M", "K",
    "confidence",
    "mean_sq", "mean_sq_lo", "mean_sq_hi", "mean_sq_se",
    "d_par", "d_par_lo", "d_par_hi", "d_par_se",
    "d_2", "d_2_lo", "d_2_hi", "d_2_se",
    "d_align", "d_align_lo", "d_align_hi", "d_align_se",
    "b_exact", "b_align", "b_align_lo", "b_align_hi", "b_align_at_lo",
    "mean_sq_sq", "directional", "cov_energy", "method", "sketch_dim", "wall_time_s",
    "redundancy", "redundant_with",
]


def _b_align_columns(row: dict, M: float, K: float) -> dict:
    """B_align at the d_align estimate and at its interval's ends; ``b_align_at_lo`` is the certificate.

    B_align falls as d_align grows, so ``b_align_lo``/``b_align_hi`` come from d_align's
    upper/lower end; a lower end at 0 gives 1: no certificate. A missing or NaN
    d_align gives NaN.
    """
    from dalign_core.geometry.bounds import b_align

    def at(d_align) -> float:
        if d_align is None or math.isnan(d_align):
            return math.nan
        return b_align(max(d_align, 0.0), M, K)

    at_low = at(row.get("d_align_lo"))
    return {"b_align": at(row["d_align"]), "b_align_lo": at(row.get("d_align_hi")), "b_align_hi": at_low,
            "b_align_at_lo": at_low}


def _block_indices(model) -> dict[str, int]:
    """Position of each residual block (insertion point) in forward order; {} for a model without blocks."""
    from dalign_core.capture.hooks import CaptureError, insertion_points

    try:
        return {name: i for i, name in enumerate(insertion_points(model))}
    except CaptureError:
        return {}


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse numeric options out of range, before anything is loaded."""
    if args.examples < 5:
        raise ValueError(f"--examples must be at least 5 (the intervals need n >= 5), got {args.examples}")
    if args.arch is None:
        _check_seq_len(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.sketch_dim is not None and args.sketch_dim < 1:
        raise ValueError(f"--sketch-dim must be at least 1, got {args.sketch_dim}")
    if args.redundancy_examples != 0 and args.redundancy_examples < 4:
        raise ValueError(f"--redundancy-examples must be 0 (skip the check) or at least 4 (the held-out fit needs "
                         f"them), got {args.redundancy_examples}")
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must lie strictly between 0 and 1, got {args.confidence}")
    for flag, value in (("--m", args.m), ("--k", args.k)):
        if value is not None and not (value >= 1 and math.isfinite(value)):
            raise ValueError(f"{flag} is a number of examples and must be a finite number, at least 1, got {value}")


def _is_local_data(spec: str) -> bool:
    """True when ``--data`` names a local file (or a path meant as one), False for a Hugging Face dataset name."""
    return Path(spec).expanduser().exists() or spec.endswith((".txt", ".text", ".md")) or \
        spec.startswith((".", "/", "~"))


MAX_HIDDEN = 65_536
"""The widest inserted block ``dalign rank --hidden`` builds (its W1 is hidden x width floats)."""


def _hidden_width(text: str) -> int:
    """``--hidden``: a whole number from 1 to :data:`MAX_HIDDEN` (``1e3`` reads as 1000)."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give the inserted block's width, e.g. 256")
    if not number.is_integer() or not 1 <= number <= MAX_HIDDEN:
        raise argparse.ArgumentTypeError(f"{text} is not a width from 1 to {MAX_HIDDEN}: the inserted block needs at "
                                         "least one unit, and a wider one would not fit in memory beside the model")
    return int(number)


def _check_seq_len(args: argparse.Namespace) -> None:
    """``--seq-len``: at least 2 tokens (a next-token loss needs two)."""
    if args.seq_len < 2:
        raise ValueError(f"--seq-len must be at least 2 (a next-token loss needs two tokens), got {args.seq_len}")


def _out_file(text: str) -> Path:
    """``--out``'s value as a path; an empty one (it would name the current folder) is a usage error."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a file name, e.g. --out geometry.csv")
    return Path(text)


def _check_out(path: Path, inputs: tuple = (), flag: str = "--out") -> None:
    """Refuse an ``--out`` that cannot be written, or should not be, before any work.

    Refused: an empty name, a folder, a path under a file, a folder without write access,
    an existing file that is read-only or not a CSV (``.csv``), and any of ``inputs``
    (``(what, path)`` pairs: the --data file, the model folder, the tokenizer; a folder
    protects every file in it).
    """
    import os

    from dalign_core.atomic import require_writable

    if not str(path).strip():
        raise ValueError(f"{flag} is empty; give a file name, e.g. {flag} geometry.csv")
    path = path.expanduser()
    for what, given in inputs:
        if _same_or_inside(path, Path(given).expanduser()):
            where = "is" if Path(given).expanduser().is_file() else "is a file in"
            raise ValueError(f"{flag} {str(path)!r} {where} {what} {str(given)!r}, an input of this command: writing "
                             f"the results there would destroy it; choose another file, e.g. {flag} geometry.csv")
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory; give a file name, e.g. {flag} {path / 'geometry.csv'}")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{flag} {str(path)!r} cannot be created: {str(folder)!r} is a file, not a folder; "
                         "choose a path inside a folder")
    if path.exists():
        if not path.is_file() or path.suffix.lower() != ".csv":
            raise ValueError(f"{flag} {str(path)!r} exists and is not a CSV file (.csv); it would be replaced: choose "
                             "a new file name or a .csv file")
        if not path.stat().st_mode & 0o222 or not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {str(path)!r} is read-only; choose another file name, or make it writable "
                             f"(chmod u+w {str(path)!r})")
    require_writable(flag, path, folder)


def _same_or_inside(path: Path, given: Path) -> bool:
    """True when the existing file ``path`` is ``given`` (a file: the same file, through any link) or lies in the
    folder ``given`` (or is one of its files, reached by another name)."""
    import os

    if not path.exists() or not given.exists():
        return False
    if given.is_dir():
        if path.resolve().is_relative_to(given.resolve()):
            return True
        others = [child for child in given.iterdir() if child.is_file()]
    else:
        others = [given]
    try:
        return any(os.path.samefile(path, other) for other in others)
    except OSError:
        return False


def _input_paths(source, data_path: Path | None, tokenizer: str | None) -> tuple:
    """The local inputs an ``--out`` must never overwrite: the data file, the model folder (and, for a revision
    subfolder, its parent, where the tokenizer may be) and a local tokenizer."""
    inputs = [("the --data file", data_path)] if data_path is not None else []
    if source is not None and source.local:
        inputs.append(("the model folder", Path(source.path)))
        if source.revision:
            inputs.append(("the model folder", Path(source.path).parent))
    if tokenizer and Path(tokenizer).expanduser().exists():
        inputs.append(("the --tokenizer folder", Path(tokenizer)))
    return tuple(inputs)


def _check_device(name: str) -> None:
    """Refuse a ``--device`` this command cannot compute on, saying which devices exist."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = "cpu" + (f", cuda, cuda:0 to cuda:{count - 1}" if count > 1 else ", cuda, cuda:0" if count else "")
    match = re.fullmatch(r"cuda:(\d+)", name)
    if name in ("auto", "cpu") or (name == "cuda" and count):
        return
    if match and int(match.group(1)) < count:
        return
    if name == "cuda" or match:
        what = "CUDA is not available on this machine" if not count else f"this machine has {count} CUDA device(s)"
        raise ValueError(f"--device {name!r}: {what}; the devices here are: {here} (or auto)")
    raise ValueError(f"--device {name!r} is not a device this command computes on; give cpu, cuda or cuda:N "
                     f"(here: {here}; default: auto)")


def _check_common(args: argparse.Namespace) -> None:
    """Checks of the options several commands share (--device, --tokenizer, --seed), before anything is loaded."""
    if getattr(args, "device", None) is not None:
        _check_device(args.device)
    tokenizer = getattr(args, "tokenizer", None)
    if tokenizer:
        path = Path(tokenizer).expanduser()
        if path.is_file():
            raise ValueError(f"--tokenizer {tokenizer!r} is a file; pass the folder that holds the tokenizer's files "
                             "(tokenizer.json, tokenizer_config.json: tokenizer.save_pretrained output) or a Hugging "
                             "Face id")
        if not path.exists() and tokenizer.startswith((".", "/", "~")):
            raise ValueError(f"--tokenizer {tokenizer!r} does not exist; pass a tokenizer folder or a Hugging Face id")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < 2**63:
        raise ValueError(f"--seed must be a whole number from 0 to 2**63 - 1, got {seed}")


def _write_csv(path: Path, records: list[dict]) -> None:
    import pandas as pd

    from dalign_core.atomic import atomic_write_text

    frame = pd.DataFrame(records)
    columns = CSV_COLUMNS + [c for c in frame.columns if c not in CSV_COLUMNS]
    frame = frame.reindex(columns=columns).sort_values("rank")
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    atomic_write_text(path, buffer.getvalue())  # temp file in the same folder, then os.replace


# ---------------------------------------------------------------------------
# Commands


def estimate(args: argparse.Namespace) -> list[dict]:
    """Run ``dalign estimate``; return one record per layer (also printed and optionally written)."""
    import torch
    from dalign_core._tensor import resolve_device
    from dalign_core.capture.hooks import accumulate_geometry, resolve_layers
    from dalign_core.cli.loading import (
        check_data_file,
        check_seq_len,
        check_tokenizer_fits,
        load_model,
        load_tokenizer,
        make_batches,
        resolve_model_source,
    )

    _check_numbers(args)
    device = resolve_device(args.device)
    if args.arch is not None:
        return _estimate_arch(args, device)
    source = resolve_model_source(args.model, revision=args.revision)  # fails fast, loads nothing
    data_path = Path(args.data).expanduser() if _is_local_data(args.data) else None
    if data_path is not None:
        check_data_file(data_path)
    if args.out is not None:  # before anything is loaded or computed; never over the data, model or tokenizer
        _check_out(args.out, _input_paths(source, data_path, args.tokenizer))
    start = time.perf_counter()

    tokenizer = load_tokenizer(args.tokenizer if args.tokenizer else source)
    model = load_model(source, device=device, dtype=getattr(torch, args.dtype))
    check_tokenizer_fits(tokenizer, model)
    check_seq_len(model, args.seq_len)
    layer_arg = args.layer if args.layer == "all" else [s.strip() for s in args.layer.split(",") if s.strip()]
    modules = resolve_layers(model, layer_arg)  # unknown names fail here, before any data is read
    block_index = _block_indices(model)

    sequences = _read_sequences(args, tokenizer, args.examples, data_path)
    if len(sequences) < 5:
        raise ValueError(
            f"{args.data} gives only {len(sequences)} example(s) of up to {args.seq_len} tokens; at least 5 are "
            "needed: use more text or a smaller --seq-len"
        )
    if len(sequences) < args.examples:
        print(f"note: {args.data} holds only {len(sequences)} examples of {args.seq_len} tokens; using all of them",
              file=sys.stderr)
    n = len(sequences)
    batches = make_batches(sequences, args.batch_size, pad_id=0)
    accumulators = accumulate_geometry(
        model, list(modules), batches, examples=n, reduction=args.reduction, sketch_dim=args.sketch_dim,
        progress=not args.quiet, desc=f"capture ({len(modules)} layer{'s' if len(modules) > 1 else ''})",
    )
    owned = {}
    if args.redundancy_examples:  # is the q just measured a trained parameter's gradient?
        owned = _redundancy_by_layer(model, list(modules), sequences[:args.redundancy_examples], args.batch_size,
                                     (args.reduction,), progress=not args.quiet)
    return _report_estimate(args, accumulators, owned, block_index, n, args.revision, time.perf_counter() - start)


def _estimate_arch(args: argparse.Namespace, device) -> list[dict]:
    """``dalign estimate --arch``: the model a callable builds, on tensors or an image folder; as :func:`estimate`."""
    import torch
    from dalign_core.capture.hooks import accumulate_geometry, resolve_layers
    from dalign_core.capture.redundancy import redundancy_rows

    if args.out is not None:  # never over the state dict or the examples
        _check_out(args.out, (("the --model file", Path(args.model)), ("the --data file or folder", Path(args.data))))
    start = time.perf_counter()
    model = _load_arch(args, device).to(getattr(torch, args.dtype))
    layer_arg = args.layer if args.layer == "all" else [s.strip() for s in args.layer.split(",") if s.strip()]
    modules = resolve_layers(model, layer_arg)
    block_index = _block_indices(model)
    inputs, targets = _arch_examples(args, args.examples)
    if inputs.is_floating_point():
        inputs = inputs.to(getattr(torch, args.dtype))
    n = len(targets)
    if n < 5:
        raise ValueError(f"{args.data} gives only {n} example(s); at least 5 are needed")
    if n < args.examples:
        print(f"note: {args.data} holds only {n} examples; using all of them", file=sys.stderr)
    batches = _arch_batches(inputs, targets, args.batch_size)
    accumulators = accumulate_geometry(
        model, list(modules), batches(0, n), examples=n, reduction=args.reduction, sketch_dim=args.sketch_dim,
        progress=not args.quiet, desc=f"capture ({len(modules)} layer{'s' if len(modules) > 1 else ''})",
    )
    owned = {}
    if args.redundancy_examples:
        rows = redundancy_rows(model, list(modules), _with_progress(batches(0, min(n, args.redundancy_examples)),
                                                                    "redundancy check", not args.quiet),
                               reductions=(args.reduction,))
        owned = {(row["layer"], row["reduction"]): row for row in rows}
    return _report_estimate(args, accumulators, owned, block_index, n, None, time.perf_counter() - start)


def _report_estimate(args: argparse.Namespace, accumulators: dict, owned: dict, block_index: dict, n: int,
                     revision: str | None, wall: float) -> list[dict]:
    """Rows of ``dalign estimate`` from each layer's accumulator: printed, warned about, written to ``--out``."""
    M = args.m if args.m is not None else n
    K = args.k if args.k is not None else n
    records = []
    for name, accumulator in accumulators.items():
        geometry = accumulator.result(args.confidence)
        row = geometry.to_row()
        row.update(
            model=args.model, revision=revision, layer=name, layer_index=block_index.get(name), data=args.data,
            reduction=args.reduction, seq_len=None if args.arch else args.seq_len, M=M, K=K,
            confidence=args.confidence, b_exact=geometry.b_exact(M, K), wall_time_s=round(wall, 3),
            **_b_align_columns(row, M, K),
        )
        check = owned.get((name, args.reduction))
        row.update(redundancy=check["fraction"] if check else None,
                   redundant_with=_owner(check) if check and _is_redundant(check) else None)
        records.append(row)
    ranked = sorted(records, key=lambda r: (-r["d_align"] if not math.isnan(r["d_align"]) else math.inf))
    for rank, row in enumerate(ranked, start=1):
        row["rank"] = rank
    print(format_table(records, args.confidence))
    for row in records:
        check = owned.get((row["layer"], args.reduction))
        if check and _is_redundant(check):
            print(_redundancy_warning(check), file=sys.stderr)
    if args.out is not None:
        _write_csv(args.out, records)
        print(f"wrote {args.out}")
    return records


def _read_sequences(args: argparse.Namespace, tokenizer, count: int, data_path: Path | None) -> list[list[int]]:
    """Up to ``count`` token sequences from ``--data`` (a local file when ``data_path`` is set, else a dataset)."""
    from dalign_core.cli.loading import dataset_text_examples, read_text_examples

    if data_path is not None:
        return read_text_examples(data_path, tokenizer, count, args.seq_len, args.split_mode)
    return dataset_text_examples(args.data, tokenizer, count, args.seq_len, config=args.dataset_config,
                                 split=args.dataset_split, text_field=args.text_field, mode=args.split_mode)


def _with_progress(batches: list, desc: str, progress: bool = True):
    """``batches`` behind a progress bar with an ETA on stderr (shown on a terminal only, never with --quiet)."""
    from tqdm import tqdm

    return tqdm(batches, desc=desc, unit="batch", leave=False, disable=None if progress else True)


def _redundancy_by_layer(model, layers: list[str], sequences, batch_size: int, reductions,
                         progress: bool = True) -> dict:
    """``(layer, reduction) -> row`` of :func:`dalign_core.capture.redundancy.redundancy_rows` on ``sequences`` (a progress
    bar with an ETA on a terminal: the check takes most of an ``estimate`` on a large model)."""
    from dalign_core.cli.loading import make_batches
    from dalign_core.capture.redundancy import redundancy_rows

    batches = _with_progress(make_batches(sequences, batch_size, pad_id=0),
                             f"redundancy check ({len(sequences)} examples)", progress)
    rows = redundancy_rows(model, layers, batches, reductions=reductions)
    return {(row["layer"], row["reduction"]): row for row in rows}


def _is_redundant(row: dict) -> bool:
    from dalign_core.capture.redundancy import REDUNDANT

    return row["fraction"] > REDUNDANT


def _owner(row: dict) -> str | None:
    """The trained parameter that owns q: the exact one, else the one explaining most of q on its own."""
    return row["exact"] or row["owner"]


def _redundancy_warning(row: dict) -> str:
    from dalign_core.capture.redundancy import REDUNDANT

    what = (f"is exactly the per-example gradient of the trained parameter {row['exact']}" if row["exact"] else
            f"lies {row['variance_explained']:.0%} in the span of trained parameters' gradients (most: {row['owner']})")
    other = "--reduction full or another layer" if row["reduction"] == "shared" else "another layer"
    return (f"warning: at {row['layer']} the {row['reduction']} q {what} (redundancy {row['fraction']:.2f} > "
            f"{REDUNDANT}, n={row['n']}); training drives its mean to zero at any width, so d_align there says "
            f"little about width: use {other}")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def format_redundancy(names: list[str], owned: dict, n: int, width: int = 80) -> str:
    """The ``dalign layers --data`` table: each block's redundancy fraction of the shared and the full q."""
    from dalign_core.capture.redundancy import REDUNDANT

    header = (f"redundancy of q at each block on n={n} examples: the share already owned by\n"
              f"trained parameters' gradients (held-out fit; 1 = exactly one's gradient).\n"
              f"Above {REDUNDANT}, training drives ||mu||^2 to 0 at any width (*).")
    rows = []
    for name in names:
        shared, full = owned[name, "shared"], owned[name, "full"]
        flag = "*" if _is_redundant(shared) or _is_redundant(full) else ""
        owner = _owner(shared) if _is_redundant(shared) else _owner(full) if _is_redundant(full) else None
        rows.append([name, f"{shared['fraction']:.2f}", f"{full['fraction']:.2f}", flag, owner or "-"])
    used = max(len("layer"), *(len(r[0]) for r in rows)) + 2 + 6 + 2 + 4 + 2 + 1 + 2
    for row in rows:
        row[-1] = _clip(row[-1], max(width - used, 8))
    return header + "\n" + _render(["layer", "shared", "full", "", "owned by"], rows, ["l", "r", "r", "l", "l"])


def _layers(args: argparse.Namespace) -> None:
    from dalign_core._tensor import resolve_device
    from dalign_core.capture.hooks import insertion_points
    from dalign_core.cli.loading import (
        check_data_file,
        check_seq_len,
        check_tokenizer_fits,
        load_model,
        load_tokenizer,
        resolve_model_source,
    )

    if args.data is not None and args.all_modules:
        raise ValueError("--all-modules lists names only; the redundancy column (--data) is for residual blocks: "
                         "drop one of them")
    if args.data is not None:
        if args.arch is None:
            _check_seq_len(args)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.data is not None and args.redundancy_examples < 4:
        raise ValueError(f"--redundancy-examples must be at least 4 (the held-out fit needs them), "
                         f"got {args.redundancy_examples}")
    if args.arch is not None:
        return _layers_arch(args)
    source = resolve_model_source(args.model, revision=args.revision)
    data_path = Path(args.data).expanduser() if args.data is not None and _is_local_data(args.data) else None
    if data_path is not None:
        check_data_file(data_path)
    device = resolve_device(args.device) if args.data is not None else "cpu"
    model = load_model(source, device=device)
    names = [n for n, _ in model.named_modules() if n] if args.all_modules else insertion_points(model)
    if args.data is None:
        for name in names:
            print(name)
        return
    tokenizer = load_tokenizer(args.tokenizer if args.tokenizer else source)
    check_tokenizer_fits(tokenizer, model)
    check_seq_len(model, args.seq_len)
    sequences = _read_sequences(args, tokenizer, args.redundancy_examples, data_path)
    if len(sequences) < 4:
        raise ValueError(f"{args.data} gives only {len(sequences)} example(s) of up to {args.seq_len} tokens; the "
                         "redundancy check needs at least 4: use more text or a smaller --seq-len")
    owned = _redundancy_by_layer(model, names, sequences, args.batch_size, ("shared", "full"))
    print(format_redundancy(names, owned, len(sequences)))


def _layers_arch(args: argparse.Namespace) -> None:
    """``dalign layers --arch``: the insertion points of the model a callable builds, with --data their redundancy."""
    from dalign_core._tensor import resolve_device
    from dalign_core.capture.hooks import insertion_points
    from dalign_core.capture.redundancy import redundancy_rows

    device = resolve_device(args.device) if args.data is not None else "cpu"
    model = _load_arch(args, device)
    names = [n for n, _ in model.named_modules() if n] if args.all_modules else insertion_points(model)
    if args.data is None:
        for name in names:
            print(name)
        return
    inputs, targets = _arch_examples(args, args.redundancy_examples)
    if len(targets) < 4:
        raise ValueError(f"{args.data} gives only {len(targets)} example(s); the redundancy check needs at least 4")
    batches = _arch_batches(inputs, targets, args.batch_size)(0, len(targets))
    rows = redundancy_rows(model, names, _with_progress(batches, "redundancy check"), reductions=("shared", "full"))
    owned = {(row["layer"], row["reduction"]): row for row in rows}
    print(format_redundancy(names, owned, len(targets)))


# ---------------------------------------------------------------------------
# dalign rank


RANK_LABELS = {"d_align": "d_align", "d_par": "d_par", "d_2": "d_2", "mean_sq": "||mu||^2", "grad_norm": "|grad|"}


def _rank_label(name: str) -> str:
    if name.startswith("alignment_"):
        return f"mu.g@{name.split('_')[1]}"
    if name.startswith("b_align_"):
        return f"B_align@{name.split('_')[2]}"
    return RANK_LABELS.get(name, name)


def _load_arch(args: argparse.Namespace, device):
    """The model ``--arch`` builds, with the state dict ``--model`` loaded into it (strictly), in eval mode."""
    import torch
    import importlib
    import json

    from dalign_core.cli.loading import LoadError

    module_name, _, attr = args.arch.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--arch must read module:callable (e.g. torchvision.models:resnet18), got {args.arch!r}")
    try:
        kwargs = json.loads(args.arch_kwargs)
    except json.JSONDecodeError as err:
        raise ValueError(f"--arch-kwargs is not JSON ({err}): write e.g. '{{\"num_classes\": 10}}'") from err
    if not isinstance(kwargs, dict):
        raise ValueError(f"--arch-kwargs must be a JSON object, got {args.arch_kwargs!r}")
    try:
        builder = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--arch {args.arch!r} cannot be imported: {err}") from err
    if not callable(builder):
        raise ValueError(f"--arch {args.arch!r} is a {type(builder).__name__}, not something to call")
    try:
        model = builder(**kwargs)
    except Exception as err:  # noqa: BLE001  (the user's code: any error is theirs to fix, in one line)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"--arch {args.arch!r} raised {type(err).__name__} when called with --arch-kwargs "
                         f"{json.dumps(kwargs)}{': ' + first if first else ''}; check --arch-kwargs") from err
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise ValueError(f"--arch {args.arch!r} returned a {type(model).__name__}, not a torch.nn.Module")
    path = Path(args.model).expanduser()
    if not path.is_file():
        raise LoadError(f"--model {args.model!r} does not exist or is not a file; with --arch it is the state dict "
                        "(torch.save(model.state_dict(), 'weights.pt') or a .safetensors file)")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise LoadError(f"--model {str(path)!r} is not a readable safetensors file ({str(err).strip() or 'damaged'}); "
                            "it may be cut short: save it again (safetensors.torch.save_file)") from err
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001  (a pickle that is more than tensors, or a damaged file)
            raise LoadError(f"--model {args.model!r} could not be read as a state dict of tensors: "
                            f"{str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from err
    if not isinstance(state, dict):
        raise LoadError(f"--model {args.model!r} holds a {type(state).__name__}, not a state dict; save "
                        "model.state_dict()")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise LoadError(f"--model {args.model!r} does not match the model {args.arch} builds "
                        f"({str(err).splitlines()[0]}); check --arch-kwargs") from err
    return model.to(device).eval()


def _image_transform(args: argparse.Namespace):
    """The transform an image folder is read with, and its description (printed, so the numbers can be redone)."""
    from torchvision import transforms

    steps = [transforms.Resize(args.image_size), transforms.CenterCrop(args.image_size), transforms.ToTensor()]
    said = f"Resize({args.image_size}) -> CenterCrop({args.image_size}) -> ToTensor()"
    if args.normalize == "imagenet":
        steps.append(transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD))
        said += f" -> Normalize(mean={IMAGENET_MEAN}, std={IMAGENET_STD})"
    return transforms.Compose(steps), said


def _image_folder_examples(args: argparse.Namespace, path: Path, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, class indices)`` of up to ``examples`` images of a torchvision ``ImageFolder`` (one subfolder per
    class), drawn in a fixed shuffled order (seed ``--seed`` where the command has one, else 0) so the classes
    mix; the transform is printed."""
    import torch
    from dalign_core.cli.loading import LoadError

    if args.image_size < 1:
        raise ValueError(f"--image-size must be at least 1 pixel, got {args.image_size}")
    try:
        from torchvision import datasets
    except ImportError as err:
        raise LoadError(f"--data {str(path)!r} is a folder of images, which needs torchvision: pip install "
                        "'dalign[vision]'") from err
    transform, said = _image_transform(args)
    try:
        folder = datasets.ImageFolder(str(path), transform=transform)
    except (FileNotFoundError, OSError) as err:
        raise LoadError(f"--data {str(path)!r} is not an image folder torchvision reads ({str(err).strip()}); give "
                        "a folder with one subfolder of images per class, or a .pt file of tensors") from err
    order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(getattr(args, "seed", 0) or 0))
    chosen = order[:examples].tolist()
    images, labels = [], []
    for index in chosen:
        try:
            image, label = folder[index]
        except Exception as err:  # noqa: BLE001  (PIL raises many kinds for a damaged image)
            raise LoadError(f"{folder.samples[index][0]} could not be read as an image ({type(err).__name__}: "
                            f"{str(err).strip()}); remove it or replace it") from err
        images.append(image)
        labels.append(label)
    print(f"images: {len(chosen)} of {len(folder)} in {path} ({len(folder.classes)} classes: "
          f"{', '.join(folder.classes[:5])}{', …' if len(folder.classes) > 5 else ''}), transform {said}",
          file=sys.stderr)
    return torch.stack(images), torch.tensor(labels)


def _arch_examples(args: argparse.Namespace, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of an ``--arch`` model: from a ``.pt`` file of tensors or an image folder."""
    path = Path(args.data).expanduser()
    if path.is_dir():
        return _image_folder_examples(args, path, examples)
    return _tensor_examples(args.data, examples)


def _arch_batches(inputs, targets, batch_size: int):
    """``batches(lo, hi)``: the pairs ``(inputs, targets)`` of examples lo to hi, ``batch_size`` at a time."""
    return lambda lo, hi: [(inputs[i:min(i + batch_size, hi)], targets[i:min(i + batch_size, hi)])
                           for i in range(lo, hi, batch_size)]


def _tensor_examples(spec: str, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` from a ``.pt`` file holding a dict with those keys (or a pair), at most ``examples``."""
    import torch
    from dalign_core.cli.loading import LoadError

    path = Path(spec).expanduser()
    if not path.is_file():
        raise LoadError(f"--data {spec!r} does not exist; with --arch it is a .pt file of "
                        "{'inputs': tensor, 'targets': tensor} (torch.save) or an image folder (one subfolder per "
                        "class)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001
        raise LoadError(f"--data {spec!r} could not be read as tensors: {type(err).__name__}") from err
    pair = (data.get("inputs"), data.get("targets")) if isinstance(data, dict) else \
        tuple(data) if isinstance(data, (tuple, list)) and len(data) == 2 else (None, None)
    if not all(isinstance(t, torch.Tensor) for t in pair) or pair[0].shape[0] != pair[1].shape[0]:
        raise LoadError(f"--data {spec!r} must hold {{'inputs': tensor, 'targets': tensor}} (or a pair) with one "
                        "example per row of each")
    return pair[0][:examples], pair[1][:examples]


def _growth_evidence() -> str:
    """One sentence: what this project's own growth results (the largest profile present) say of d_align as a guide
    to where to grow, computed by :func:`dalign_core.studies.growth.compute.decision`; "none found" outside a checkout with results."""
    from dalign_core.studies.growth import compute as growth
    from dalign_core.config import REPO_ROOT
    from dalign_core.report.results import read_table

    for profile in ("paper", "gpu", "cpu"):
        try:
            table, _ = read_table(REPO_ROOT / "results" / profile, "growth")
        except (FileNotFoundError, ValueError, KeyError):
            continue
        if table.empty:
            continue
        judged = growth.decision(table)
        return (f"the project's growth results ({profile} profile, {judged.of} grown models) say of d_align as a guide "
                f"to where to grow: {judged.label} ({judged.reason}).")
    return "no growth results of this project were found here: nothing says how well d_align guides growth."


def _order_text(rows: list[dict], name: str, index: dict) -> str:
    """The points by predictor ``name``, best first, "=" between exact ties and ">" otherwise."""
    ranked = sorted(rows, key=lambda r: r[f"rank_{name}"])
    text = str(index[ranked[0]["layer"]])
    for before, after in zip(ranked, ranked[1:]):
        tie = before[name] == after[name] or (math.isnan(before[name]) and math.isnan(after[name]))
        text += (" = " if tie else " > ") + str(index[after["layer"]])
    return text


def format_ranking(rows: list[dict], names: list[str], owned: dict, n: int, reduction: str, confidence: float,
                   width: int = 80, evidence: str | None = None) -> str:
    """The ``dalign rank`` report: the points (with redundancy), the main predictors with intervals, the recommended
    point (d_align's first) and those whose d_align interval overlaps it, each predictor's order (exact ties as "=";
    an order identical to d_align's named once, not repeated), and ``evidence``: what the project's growth results
    say of d_align as a guide (default: :func:`_growth_evidence`)."""
    import textwrap

    from dalign_core.capture.redundancy import REDUNDANT

    pct = f"{confidence * 100:g}%"
    half = n // 2
    header = (f"{len(rows)} insertion points, n={n} examples ({half} train: the train mean and the block gradient; "
              f"{n - half} held out: the geometry and the held-out mean), {reduction} q, {pct} intervals. "
              f"red.: the share of q that trained parameters' gradients already own (above {REDUNDANT}: *).")
    legend = []
    for i, row in enumerate(rows):
        check = owned.get(row["layer"])
        legend.append([str(i), row["layer"], f"{check['fraction']:.2f}" if check else "-",
                       "*" if check and _is_redundant(check) else ""])
    used = max(4, *(len(r[1]) for r in legend))
    for r in legend:
        r[1] = _clip(r[1], min(used, width - 16))
    points = _render(["#", "layer", "red.", ""], legend, ["r", "l", "r", "l"])

    def pm(row, name):
        lo, hi = row[f"{name}_lo"], row[f"{name}_hi"]
        if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
            return f"{row[name]:.3g}"
        return f"{row[name]:.3g} ± {(hi - lo) / 2:.2g}"

    alignment = next(name for name in names if name.startswith("alignment_"))
    shown = [("d_align", "d_align"), ("mean_sq", "||mu||^2"), (alignment, _rank_label(alignment)),
             ("grad_norm", "|grad|")]
    values = _render(["#"] + [label for _, label in shown],
                     [[str(i)] + [pm(row, name) for name, _ in shown] for i, row in enumerate(rows)],
                     ["r"] + ["r"] * len(shown))
    index = {row["layer"]: i for i, row in enumerate(rows)}
    top = min(rows, key=lambda r: r["rank_d_align"])
    lo, hi = top.get("d_align_lo"), top.get("d_align_hi")
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        overlap = "its d_align has no interval here, so no other point is ruled out"
    else:
        close = [index[r["layer"]] for r in rows if r is not top and r.get("d_align_lo") is not None
                 and not math.isnan(r["d_align_lo"]) and r["d_align_lo"] <= hi and r["d_align_hi"] >= lo]
        overlap = (f"the d_align intervals of {', '.join(f'#{i}' for i in sorted(close))} overlap it: the data do "
                   "not tell those points apart" if close else "no other point's d_align interval overlaps it")
    recommended = f"recommended by d_align: #{index[top['layer']]} ({top['layer']}); {overlap}."
    lines = ["order by each predictor (best first, by #; =: a tie; B_align: lowest first):"]
    reference = _order_text(rows, "d_align", index)
    same = []
    for name in names:
        text = _order_text(rows, name, index)
        if name != "d_align" and text == reference:
            same.append(_rank_label(name))
            continue
        label = f"{_rank_label(name):<11} "
        parts = textwrap.wrap(text, width=width - len(label), break_on_hyphens=False)
        lines += [(label if k == 0 else " " * len(label)) + part for k, part in enumerate(parts)]
    if same:
        lines += textwrap.wrap(f"same order as d_align: {', '.join(same)}", width)
    evidence = _growth_evidence() if evidence is None else evidence
    return ("\n".join(textwrap.wrap(header, width)) + "\n" + points + "\n\n" + values + "\n\n"
            + "\n".join(textwrap.wrap(recommended, width)) + "\n" + "\n".join(lines) + "\n\n"
            + "\n".join(textwrap.wrap(evidence, width)))


def rank(args: argparse.Namespace) -> list[dict]:
    """Run ``dalign rank``; return one record per insertion point (also printed and optionally written)."""
    from dalign_core._tensor import resolve_device
    from dalign_core.studies.growth import compute as growth
    from dalign_core.capture.hooks import insertion_points, resolve_layers
    from dalign_core.capture.redundancy import redundancy_rows

    if args.examples < 8:
        raise ValueError(f"--examples must be at least 8 (two halves of at least 4), got {args.examples}")
    if args.redundancy_examples != 0 and args.redundancy_examples < 4:
        raise ValueError(f"--redundancy-examples must be 0 (skip) or at least 4, got {args.redundancy_examples}")
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must lie strictly between 0 and 1, got {args.confidence}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.arch is None:
        _check_seq_len(args)
    device = resolve_device(args.device)
    if args.arch is not None:
        if args.csv is not None:  # never over the state dict or the tensors it reads
            _check_out(args.csv, (("the --model file", Path(args.model)), ("the --data file", Path(args.data))),
                       flag="--csv")
        model = _load_arch(args, device)
        inputs, targets = _arch_examples(args, args.examples)
        n = len(targets)
        batches = _arch_batches(inputs, targets, args.batch_size)
    else:
        from dalign_core.cli.loading import (check_data_file, check_seq_len, check_tokenizer_fits, load_model,
                                         load_tokenizer, make_batches, resolve_model_source)

        source = resolve_model_source(args.model, revision=args.revision)
        data_path = Path(args.data).expanduser() if _is_local_data(args.data) else None
        if data_path is not None:
            check_data_file(data_path)
        if args.csv is not None:  # before anything is loaded; never over the data, model or tokenizer
            _check_out(args.csv, _input_paths(source, data_path, args.tokenizer), flag="--csv")
        tokenizer = load_tokenizer(args.tokenizer if args.tokenizer else source)
        model = load_model(source, device=device)
        check_tokenizer_fits(tokenizer, model)
        check_seq_len(model, args.seq_len)
        sequences = _read_sequences(args, tokenizer, args.examples, data_path)
        n = len(sequences)
        batches = lambda lo, hi: make_batches(sequences[lo:hi], args.batch_size, pad_id=0)  # noqa: E731
    if n < 8:
        raise ValueError(f"{args.data} gives only {n} example(s); at least 8 are needed (two halves of 4)")
    layers = list(resolve_layers(model, args.layer if args.layer == "all" else
                                 [s.strip() for s in args.layer.split(",") if s.strip()]))
    if len(layers) < 2:
        print("note: one insertion point: there is nothing to order", file=sys.stderr)
    half = n // 2
    try:
        budgets = (sorted({int(b) for b in args.budgets.split(",") if b.strip()}) if args.budgets else
                   sorted({max(2, half // 4), half}))
    except ValueError as err:
        raise ValueError(f"--budgets must be whole numbers separated by commas, got {args.budgets!r}") from err
    if not budgets or budgets[0] < 2 or budgets[-1] > min(half, n - half):
        raise ValueError(f"--budgets {budgets} must lie in [2, {min(half, n - half)}] (half of the {n} examples)")
    measured = growth.predictors(model, layers, batches(half, n), batches(0, half), reduction=args.reduction,
                                 budgets=budgets, hidden=args.hidden, block_seed=args.seed,
                                 confidence=args.confidence, random_key=args.seed)
    names = [name for name in growth.predictor_names(budgets) if name != "random"]
    rows = growth.point_rows(measured, names)
    owned = {}
    if args.redundancy_examples:
        checked = redundancy_rows(model, layers, _with_progress(batches(0, min(n, args.redundancy_examples)),
                                                                "redundancy check"), reductions=(args.reduction,))
        owned = {row["layer"]: row for row in checked}
    block_index = {name: i for i, name in enumerate(insertion_points(model))} if args.layer == "all" else {}
    for row in rows:
        check = owned.get(row["layer"])
        row.update(model=args.model, data=args.data, n=n, reduction=args.reduction, confidence=args.confidence,
                   layer_index=block_index.get(row["layer"]),
                   redundancy=check["fraction"] if check else None,
                   redundant_with=_owner(check) if check and _is_redundant(check) else None)
    print(format_ranking(rows, names, owned, n, args.reduction, args.confidence))
    for layer in layers:
        check = owned.get(layer)
        if check and _is_redundant(check):
            print(_redundancy_warning(check), file=sys.stderr)
    if args.csv is not None:
        import pandas as pd

        from dalign_core.atomic import atomic_write_text

        buffer = io.StringIO()
        pd.DataFrame(rows).to_csv(buffer, index=False)
        atomic_write_text(args.csv, buffer.getvalue())
        print(f"wrote {args.csv}")
    return rows


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
    from dalign_core.capture.hooks import CaptureError
    from dalign_core.cli.loading import LoadError

    try:
        _check_common(args)
        if args.command == "estimate":
            estimate(args)
        elif args.command == "layers":
            _layers(args)
        elif args.command == "rank":
            rank(args)
    except (LoadError, CaptureError, ValueError, OSError) as err:
        one_line = re.sub(r"\s*\n\s*", " ", str(err).strip())  # a message quoted from a library may span lines
        print(f"dalign: error: {one_line}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
