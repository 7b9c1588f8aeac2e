"""The options several ``dalign`` subcommands share, and their checks before anything is loaded.

Adding ``--arch`` and the data options to a subcommand's parser; reading ``--out``, ``--csv`` and ``--hidden``;
refusing, in one sentence, a ``--seq-len`` below 2, a ``--device`` this machine lacks, a ``--tokenizer`` that is a
file, a negative ``--seed``, and an ``--out`` that cannot be written, would overwrite one of the command's inputs, or
names an existing file whose content is not CSV text.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

__all__ = ["MAX_HIDDEN", "add_arch_options", "add_data_options", "is_local_data", "hidden_width_option", "check_seq_len_option", "out_file_option", "check_out", "local_input_paths", "check_common"]


def add_arch_options(parser: argparse.ArgumentParser) -> None:
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


def add_data_options(parser: argparse.ArgumentParser, required: bool) -> None:
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


def is_local_data(spec: str) -> bool:
    """True when ``--data`` names a local file (or a path meant as one), False for a Hugging Face dataset name."""
    return Path(spec).expanduser().exists() or spec.endswith((".txt", ".text", ".md")) or \
        spec.startswith((".", "/", "~"))


MAX_HIDDEN = 65_536
"""The widest inserted block ``dalign rank --hidden`` builds (its W1 is hidden x width floats)."""


def hidden_width_option(text: str) -> int:
    """``--hidden``: a whole number from 1 to :data:`MAX_HIDDEN` (``1e3`` reads as 1000)."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give the inserted block's width, e.g. 256")
    if not number.is_integer() or not 1 <= number <= MAX_HIDDEN:
        raise argparse.ArgumentTypeError(f"{text} is not a width from 1 to {MAX_HIDDEN}: the inserted block needs at "
                                         "least one unit, and a wider one would not fit in memory beside the model")
    return int(number)


def check_seq_len_option(args: argparse.Namespace) -> None:
    """``--seq-len``: at least 2 tokens (a next-token loss needs two)."""
    if args.seq_len < 2:
        raise ValueError(f"--seq-len must be at least 2 (a next-token loss needs two tokens), got {args.seq_len}")


def out_file_option(text: str) -> Path:
    """``--out``'s value as a path; an empty one (it would name the current folder) is a usage error."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a file name, e.g. --out geometry.csv")
    return Path(text)


def check_out(path: Path, inputs: tuple = (), flag: str = "--out") -> None:
    """Refuse an ``--out`` that cannot be written, or should not be, before any work.

    Refused: an empty name, a folder, a path under a file, a folder without write access,
    an existing file that is read-only, not a CSV (``.csv``) or, by its content, no CSV text
    (binary data, NUL bytes, not UTF-8: a file that only carries the name), and any of ``inputs``
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
        problem = _not_csv_text(path)
        if problem:
            raise ValueError(f"{flag} {str(path)!r} is named .csv but {problem}, so it is not a table this command "
                             "wrote and would be destroyed; choose a new file name (or move that file away first)")
        if not path.stat().st_mode & 0o222 or not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {str(path)!r} is read-only; choose another file name, or make it writable "
                             f"(chmod u+w {str(path)!r})")
    require_writable(flag, path, folder)


_CSV_PROBE_BYTES = 1 << 16


def _not_csv_text(path: Path) -> str:
    """Why the existing file ``path`` is not CSV text ("" when it is, or is empty): read from its first 64 KiB,
    which must be UTF-8 without NUL bytes (a table), not binary data that merely carries a .csv name."""
    import codecs

    try:
        with path.open("rb") as handle:
            head = handle.read(_CSV_PROBE_BYTES)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if b"\x00" in head:
        return "holds binary data (NUL bytes)"
    try:
        codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=len(head) < _CSV_PROBE_BYTES)
    except UnicodeDecodeError as err:
        return f"is not UTF-8 text (bytes {head[err.start:err.start + 4]!r} at byte offset {err.start})"
    return ""


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


def local_input_paths(source, data_path: Path | None, tokenizer: str | None) -> tuple:
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


def check_common(args: argparse.Namespace) -> None:
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
