"""The examples a ``dalign`` subcommand runs on.

* Text: token sequences from a UTF-8 text file (read only as far as needed; a file in another encoding is refused
  with the command that converts it) or, with network, a Hugging Face dataset; consecutive windows of
  ``--seq-len`` tokens or one example a line; right-padded batches whose padding every loss masks out.
* ``--arch`` models: ``(inputs, targets)`` from a ``.pt`` file of tensors, or images from a torchvision
  ``ImageFolder`` (one subfolder per class) under a stated transform.
"""

from __future__ import annotations

import argparse
import codecs
import os
import select
import stat
import sys
import warnings
from pathlib import Path
from typing import Iterable, Iterator

import torch

from dalign_core.environment import offline_variable
from dalign_core.cli.loading import LoadError, hub_reachable, unreachable_message

__all__ = ["check_data_file", "read_text_examples", "dataset_text_examples", "make_batches", "read_sequences",
           "arch_batches", "arch_examples"]


def _encode(tokenizer, text: str) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sequence longer than the model maximum": we cut windows ourselves
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chunks_from_texts(texts: Iterable[str], tokenizer, examples: int, seq_len: int, split: str) -> list[list[int]]:
    sequences: list[list[int]] = []
    if split == "lines":
        for text in texts:
            for line in text.splitlines():
                ids = _encode(tokenizer, line.strip())[:seq_len] if line.strip() else []
                if len(ids) >= 2:
                    sequences.append(ids)
                    if len(sequences) >= examples:
                        return sequences
        return sequences
    if split != "chunks":
        raise ValueError(f"split must be 'chunks' or 'lines', got {split!r}")
    buffer: list[int] = []
    for text in texts:
        buffer.extend(_encode(tokenizer, text))
        while len(buffer) >= seq_len:
            sequences.append(buffer[:seq_len])
            buffer = buffer[seq_len:]
            if len(sequences) >= examples:
                return sequences
    if buffer and len(buffer) >= 2 and len(sequences) < examples:
        sequences.append(buffer)  # the last, shorter window (padded later)
    return sequences


DATA_WAIT_S = 10.0
"""How long a --data pipe (or other stream) may stay silent before it is refused (``DALIGN_DATA_TIMEOUT``)."""


def _data_wait() -> float:
    """Seconds to wait for each read of a --data stream: ``DALIGN_DATA_TIMEOUT`` or :data:`DATA_WAIT_S`."""
    text = os.environ.get("DALIGN_DATA_TIMEOUT", "").strip()
    if not text:
        return DATA_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LoadError(f"DALIGN_DATA_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


def _stream_kind(path: Path) -> str:
    """"" for a regular file; "pipe (FIFO)" or "character device" for a stream --data reads with a timeout."""
    mode = path.stat().st_mode
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISFIFO(mode):
        return "pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "character device"
    kind = "socket" if stat.S_ISSOCK(mode) else "block device" if stat.S_ISBLK(mode) else "special file"
    raise LoadError(f"data path {str(path)!r} is a {kind}, not a regular file; --data needs a UTF-8 text file")


def _stream_blocks(path: Path, kind: str, block_bytes: int = 1 << 16) -> Iterator[str]:
    """The text of a pipe or device, block by block, each read waiting at most :func:`_data_wait` seconds.

    A FIFO that no process writes to would block ``open`` and ``read`` forever; here it is opened without
    blocking and every read waits for data with a timeout, so a silent stream is refused in one sentence."""
    wait = _data_wait()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise LoadError(f"data file {str(path)!r} ({kind}) cannot be opened: {err.strerror or err}") from err
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset = 0
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise LoadError(
                    f"data file {str(path)!r} is a {kind}, not a regular file, and nothing arrived on it within "
                    f"{wait:g} s (is a process writing to it?); pass a regular text file, or start the writer first "
                    "(DALIGN_DATA_TIMEOUT sets the wait)"
                )
            try:
                chunk = os.read(fd, block_bytes)
            except BlockingIOError:
                continue
            if b"\x00" in chunk:
                raise LoadError(f"data file {str(path)!r} ({kind}) sends binary data (NUL bytes at byte offset "
                                f"{offset + chunk.index(0)}), not UTF-8 text: --data needs text")
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                raise LoadError(f"data file {str(path)!r} ({kind}) is not UTF-8 text (bytes "
                                f"{chunk[err.start:err.start + 4]!r} near byte offset {offset + err.start}); convert "
                                "it, e.g. `iconv -f latin1 -t utf-8`, before it reaches --data") from err
            offset += len(chunk)
            if text:
                yield text
            if not chunk:  # end of the stream: every writer has closed it
                return
    finally:
        os.close(fd)


def _file_blocks(path: Path, block_chars: int = 1 << 20) -> Iterator[str]:
    kind = _stream_kind(path)
    if kind:
        yield from _stream_blocks(path, kind)
        return
    try:
        with path.open("r", encoding="utf-8-sig", errors="strict") as handle:  # a leading BOM is dropped
            block: list[str] = []
            size = 0
            for line in handle:
                block.append(line)
                size += len(line)
                if size >= block_chars:
                    yield "".join(block)
                    block, size = [], 0
            if block:
                yield "".join(block)
    except UnicodeDecodeError as err:
        raise LoadError(_not_utf8_message(path)) from err


def _first_undecodable(path: Path) -> tuple[int, int, bytes]:
    """(line number, byte offset, the bytes there) of the first byte sequence that is not UTF-8."""
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):  # b"\n" never occurs inside a UTF-8 sequence
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return number, offset + err.start, raw[err.start:err.start + 4]
            offset += len(raw)
    return 0, offset, b""


def _not_utf8_message(path: Path) -> str:
    """Why ``path`` is not UTF-8 text, and the command that converts it."""
    with path.open("rb") as handle:
        head = handle.read(1 << 16)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return (f"data file {str(path)!r} is UTF-16 text, not UTF-8: convert it, e.g. "
                f"`iconv -f utf-16 -t utf-8 {path} > {path}.utf8`, and pass the converted file")
    if b"\x00" in head:
        return (f"data file {str(path)!r} looks binary (it holds NUL bytes), not UTF-8 text: --data needs a "
                "plain text file")
    line, offset, found = _first_undecodable(path)
    return (
        f"data file {str(path)!r} is not UTF-8 text (bytes {found!r} at line {line}, byte offset {offset}); "
        f"convert it from its encoding, e.g. from Latin-1: `iconv -f latin1 -t utf-8 {path} > {path}.utf8` "
        "(`file -i` tells the encoding), and pass the converted file"
    )


def check_data_file(path: str | os.PathLike) -> Path:
    """``path`` as a Path if it is a readable file; a LoadError for a missing path or a directory."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise LoadError(f"data path {str(path)!r} is a directory; --data needs a UTF-8 text file (one file)")
    if not path.exists():
        raise LoadError(f"data file {str(path)!r} does not exist")
    if not os.access(path, os.R_OK):  # a pipe or /dev/fd/N is not a regular file, and is read with a timeout
        raise LoadError(f"data file {str(path)!r} cannot be read (no read permission)")
    _stream_kind(path)  # a socket or a block device is refused here; a pipe is read with a timeout
    return path


def read_text_examples(path: str | os.PathLike, tokenizer, examples: int, seq_len: int,
                       split: str = "chunks") -> list[list[int]]:
    """Token id sequences from a UTF-8 text file.

    ``split="chunks"``: the file's token stream cut into consecutive windows of
    ``seq_len`` tokens (the last may be shorter); ``"lines"``: one example per
    non-empty line, truncated to ``seq_len``. No special tokens are added. Reads only
    as much of the file as it needs. A file that is not UTF-8 (binary, Latin-1,
    UTF-16, …) is refused with a :class:`LoadError` that says how to convert it.
    """
    path = check_data_file(path)
    return _chunks_from_texts(_file_blocks(path), tokenizer, examples, seq_len, split)


def dataset_text_examples(name: str, tokenizer, examples: int, seq_len: int, *, config: str | None = None,
                          split: str = "validation", text_field: str = "text",
                          mode: str = "chunks") -> list[list[int]]:
    """Token id sequences from a Hugging Face dataset (streamed; needs network or a cached copy)."""
    offline = offline_variable(include_datasets=True)  # read before the line below may set one
    if offline or not hub_reachable():
        # Let datasets (which reads this once, at import) try its cache without network calls.
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets

        stream = datasets.load_dataset(name, config, split=split, streaming=True)
        texts = (record[text_field] for record in stream)
        return _chunks_from_texts(texts, tokenizer, examples, seq_len, mode)
    except KeyError as err:
        raise LoadError(f"dataset {name!r} has no text field {text_field!r}; pass --text-field") from err
    except Exception as err:  # datasets raises many types (ConnectionError, FileNotFoundError, DatasetNotFoundError)
        if offline or not hub_reachable(1.0):
            raise LoadError(unreachable_message("dataset", name, "--data", offline) +
                            " (for a local text file, pass its path)") from err
        raise LoadError(f"could not read dataset {name!r} (config {config!r}, split {split!r}): {err}") from err


def make_batches(sequences: list[list[int]], batch_size: int, pad_id: int = 0) -> list[dict[str, torch.Tensor]]:
    """Right-padded ``{"input_ids", "attention_mask"}`` batches (padding is masked out of every loss)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, seq in enumerate(chunk):
            ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, :len(seq)] = 1
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def read_sequences(args: argparse.Namespace, tokenizer, count: int, data_path: Path | None) -> list[list[int]]:
    """Up to ``count`` token sequences from ``--data`` (a local file when ``data_path`` is set, else a dataset)."""
    if data_path is not None:
        return read_text_examples(data_path, tokenizer, count, args.seq_len, args.split_mode)
    return dataset_text_examples(args.data, tokenizer, count, args.seq_len, config=args.dataset_config,
                                 split=args.dataset_split, text_field=args.text_field, mode=args.split_mode)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
"""The normalization torchvision's pretrained models expect (``--normalize imagenet``)."""


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
        file = Path(folder.samples[index][0])
        if not file.is_file():
            raise LoadError(f"{str(file)!r} in the image folder is not a regular file (a pipe, device or socket), "
                            "which could block reading it forever; remove it or replace it with an image")
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


def arch_examples(args: argparse.Namespace, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of an ``--arch`` model: from a ``.pt`` file of tensors or an image folder."""
    path = Path(args.data).expanduser()
    if path.is_dir():
        return _image_folder_examples(args, path, examples)
    return _tensor_examples(args.data, examples)


def arch_batches(inputs, targets, batch_size: int):
    """``batches(lo, hi)``: the pairs ``(inputs, targets)`` of examples lo to hi, ``batch_size`` at a time."""
    return lambda lo, hi: [(inputs[i:min(i + batch_size, hi)], targets[i:min(i + batch_size, hi)])
                           for i in range(lo, hi, batch_size)]


def _tensor_examples(spec: str, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` from a ``.pt`` file holding a dict with those keys (or a pair), at most ``examples``."""


    path = Path(spec).expanduser()
    if path.exists() and not path.is_file():
        raise LoadError(f"--data {spec!r} is not a regular file (a pipe, device or socket), which torch.load cannot "
                        "read; with --arch it is a .pt file of {'inputs': tensor, 'targets': tensor} (torch.save) "
                        "or an image folder")
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
