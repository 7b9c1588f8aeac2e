"""Load a causal language model, its tokenizer and text examples for the ``dalign`` command.

Safety and offline behaviour:

* A model is a local checkpoint folder (``save_pretrained`` output) or a Hugging
  Face model id, optionally at a revision (a branch, tag or commit of the Hub
  repository, e.g. Pythia's training checkpoints ``step1000``; for a local folder,
  the subfolder ``<folder>/<revision>/`` holding that checkpoint). Weights load
  from safetensors when the checkpoint has them; a ``pytorch_model.bin`` is read
  by transformers with ``torch.load(weights_only=True)``, so no pickled code ever
  runs; a pickle that needs more than plain tensors is refused with the steps to
  convert a trusted one to safetensors. ``trust_remote_code`` is always off.
* A checkpoint must fill the model its config describes: missing, unexpected or
  wrongly shaped tensors are refused (listed), never replaced by random
  initialization. A damaged safetensors file is refused before transformers opens it.
* A Hugging Face id is first looked up in the local cache. If it is not cached and
  the Hub is unreachable (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``, or no
  connection within a few seconds), loading fails at once with a :class:`LoadError`
  that says what to download and where to put it — never a hang.
* Text comes from a local file, or (network) from a Hugging Face dataset.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator
from urllib.parse import urlparse

import torch

from dalign_core._env import offline_variable

__all__ = [
    "LoadError",
    "ModelSource",
    "resolve_model_source",
    "revision_folders",
    "load_model",
    "load_tokenizer",
    "check_tokenizer_fits",
    "max_positions",
    "check_seq_len",
    "check_data_file",
    "read_text_examples",
    "dataset_text_examples",
    "make_batches",
]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
_PROBE_TIMEOUT_S = 3.0


class LoadError(RuntimeError):
    """A model, tokenizer or data set could not be loaded; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a local folder, or a Hub id (cached or to download)."""

    spec: str
    path: str
    local: bool
    cached: bool = False
    revision: str | None = None
    """The Hub revision (branch, tag or commit) or the local revision folder's name; None: the default."""

    @property
    def hub_revision(self) -> str | None:
        """What ``from_pretrained(revision=...)`` gets: the revision for a Hub id, None for a local folder."""
        return None if self.local else self.revision

    @property
    def local_files_only(self) -> bool:
        return self.local or self.cached


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # pragma: no cover - very old huggingface_hub
        return "~/.cache/huggingface/hub"


def _hub_reachable(timeout: float = _PROBE_TIMEOUT_S) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _unreachable_message(kind: str, spec: str, flag: str, offline: str | None, revision: str | None = None) -> str:
    """What to do when ``spec`` is neither local nor cached; ``offline`` names the offline variable set, if any."""
    reason = f"{offline} is set" if offline else "the Hugging Face Hub cannot be reached from here"
    at = f" at revision {revision!r}" if revision else ""
    name = spec.split("/")[-1]
    folder = f"./{name}/{revision}" if revision else f"./{name}"
    rev_flag = f" --revision {revision}" if revision else ""
    return (
        f"{kind} {spec!r}{at} is not a local {'folder' if kind == 'model' else 'file'}, it is not in the Hugging Face "
        f"cache ({_hub_cache()}), and {reason}. Either download it on a machine with network access, e.g. "
        f"`hf download {spec}{' --repo-type dataset' if kind == 'dataset' else ''}{rev_flag} --local-dir {folder}`, "
        f"copy that folder here and pass {flag} ./{name}{rev_flag}"
        + (" (a folder with config.json, model.safetensors and the tokenizer files)" if kind == "model" else "")
        + f"; or copy a Hugging Face cache that holds it to {_hub_cache()} (or point HF_HOME at it)"
        + (f"; or unset {offline} if this machine has network access" if offline else "")
        + "."
    )


def revision_folders(folder: str | os.PathLike) -> list[str]:
    """Names of the subfolders of ``folder`` that hold a checkpoint (a ``config.json``), sorted; [] if none."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return []
    names = [p.name for p in folder.iterdir() if p.is_dir() and (p / "config.json").is_file()]

    def key(name: str):  # step0 < step1000 < step143000, then the rest by name
        digits = name[4:] if name.startswith("step") else ""
        return (0, int(digits), name) if digits.isdigit() else (1, 0, name)

    return sorted(names, key=key)


def _local_revision(path: Path, spec: str, revision: str) -> ModelSource:
    """The checkpoint ``<path>/<revision>/`` of a revision-folder layout, or a LoadError listing those present."""
    sub = path / revision
    if sub.is_dir() and (sub / "config.json").is_file():
        return ModelSource(spec, str(sub), local=True, revision=revision)
    present = revision_folders(path)
    if sub.is_dir():
        problem = f"{str(sub)!r} has no config.json (it must be the output of model.save_pretrained(folder))"
    else:
        problem = f"model folder {str(path)!r} has no revision folder {revision!r}"
    listing = (f"revisions present: {', '.join(present)}" if present else
               "it holds no revision folders (subfolders with a config.json)")
    layout = f" Expected layout: {path}/<revision>/config.json, e.g. `hf download <id> --revision {revision} " \
             f"--local-dir {path}/{revision}`."
    if (path / "config.json").is_file():
        layout += " The folder itself is a single checkpoint: drop --revision to use it."
    raise LoadError(f"{problem}; {listing}.{layout}")


def resolve_model_source(spec: str, revision: str | None = None) -> ModelSource:
    """Decide whether ``spec`` is a local checkpoint folder or a Hub id, failing fast when neither can work.

    ``revision``: for a Hub id, the branch, tag or commit to load (e.g. ``"step1000"``);
    for a local folder, the subfolder ``<spec>/<revision>/`` that holds the checkpoint.
    """
    revision = revision or None
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"--model {spec!r} is a file; pass the checkpoint folder (save_pretrained output) instead")
        if revision is not None:
            return _local_revision(path, spec, revision)
        if not (path / "config.json").is_file():
            present = revision_folders(path)
            if present:
                raise LoadError(f"model folder {str(path)!r} holds one checkpoint per revision ({', '.join(present)}); "
                                "choose one with --revision")
            raise LoadError(
                f"model folder {str(path)!r} has no config.json; it must be the output of model.save_pretrained(folder)"
            )
        return ModelSource(spec, str(path), local=True)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or os.sep in spec.replace("/", "")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        looks_like_path = True
    if looks_like_path:
        raise LoadError(f"model folder {spec!r} does not exist (and it is not a Hugging Face model id)")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(spec, "config.json", revision=revision)
    if isinstance(cached, str):
        return ModelSource(spec, spec, local=False, cached=True, revision=revision)
    offline = offline_variable()
    if offline or not _hub_reachable():
        raise LoadError(_unreachable_message("model", spec, "--model", offline, revision))
    return ModelSource(spec, spec, local=False, cached=False, revision=revision)


def _check_local_weights(folder: Path) -> bool:
    """True if the folder has safetensors weights; raise if it has no weights we may load."""
    if any(folder.glob("*.safetensors")):
        return True
    if any(folder.glob("pytorch_model*.bin")):
        return False  # transformers reads these with torch.load(weights_only=True)
    raise LoadError(
        f"model folder {str(folder)!r} has no weights (model.safetensors or pytorch_model.bin); "
        "save them with model.save_pretrained(folder)"
    )


def _check_safetensors_files(folder: Path) -> None:
    """Refuse a truncated or corrupt ``*.safetensors`` file by reading its header (no tensor data)."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as err:
            raise LoadError(
                f"{str(file)!r} is not a valid safetensors file ({err}); it is probably truncated or corrupt: "
                "download or save the checkpoint again (model.save_pretrained(folder))"
            ) from err


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """Silence transformers' loading report and progress bar: :func:`_check_loading_info` reports what matters."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _listing(keys, limit: int = 8) -> str:
    keys = sorted(str(k) for k in keys)
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _tied_to_loaded(model, missing: set[str]) -> set[str]:
    """Missing parameter names that share their storage with a loaded parameter (tied weights)."""
    loaded = {p.data_ptr() for name, p in model.named_parameters(remove_duplicate=False) if name not in missing}
    tied = set()
    for name in missing:
        try:
            if model.get_parameter(name).data_ptr() in loaded:
                tied.add(name)
        except AttributeError:
            continue
    return tied


def _check_loading_info(model, info: dict, where: str) -> None:
    """Refuse a checkpoint whose tensors do not fill the model: missing, unexpected or mismatched names."""
    missing = set(info.get("missing_keys") or ())
    missing -= _tied_to_loaded(model, missing)
    unexpected = set(info.get("unexpected_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) the model needs are missing ({_listing(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) in the checkpoint are not in the model ({_listing(unexpected)})")
    if mismatched:
        shapes = [f"{name} {tuple(stored)} in the checkpoint, {tuple(wanted)} in the config"
                  for name, stored, wanted in sorted(mismatched)[:4]]
        more = f" and {len(mismatched) - 4} more" if len(mismatched) > 4 else ""
        problems.append(f"{len(mismatched)} tensor shape(s) differ from the config ({'; '.join(shapes)}{more})")
    if problems:
        raise LoadError(
            f"the checkpoint in {where} does not match its config.json: {'; '.join(problems)}. These weights would be "
            "random, so nothing is computed; use the config.json saved with these weights (model.save_pretrained(folder) "
            "writes both)"
        )


def _unpickler_detail(err: Exception) -> str:
    """What torch's weights-only unpickler objected to (e.g. ``Unsupported global: GLOBAL print``), or ''."""
    _, _, after = str(err).partition("WeightsUnpickler error:")
    lines = [line.strip() for line in after.splitlines() if line.strip()]
    return lines[0].split(" was not an allowed global")[0][:120] if lines else ""


def _unpickling_message(spec: str, err: Exception) -> str:
    """A refused pickle (it names a function or class, so loading it could run code) or a damaged one."""
    detail = _unpickler_detail(err)
    if not detail.startswith("Unsupported global"):
        return (f"the pickle checkpoint (pytorch_model.bin) of {spec!r} cannot be read ({detail or err}); it is "
                "probably truncated or corrupt: download or save the checkpoint again")
    return (
        f"the pickle checkpoint (pytorch_model.bin) of {spec!r} was refused because loading it could run code "
        f"(torch.load with weights_only=True found more than tensors: {detail}). If you trust where it came from, "
        "convert it once to safetensors in a trusted session: model = AutoModelForCausalLM.from_pretrained(folder, "
        "weights_only=False); model.save_pretrained(new_folder, safe_serialization=True), copy the tokenizer files "
        "there too, and pass --model new_folder"
    )


def _load_error(source: ModelSource, err: Exception) -> LoadError:
    where = "folder" if source.local else ("cached model" if source.cached else "model id")
    hint = ""
    if source.cached:
        rev = f" --revision {source.revision}" if source.revision else ""
        hint = (f" Its config is cached but other files are missing; download the whole model "
                f"(`hf download {source.spec}{rev}`) while online.")
    at = f" at revision {source.revision!r}" if source.revision else ""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return LoadError(f"could not load the {where} {source.spec!r}{at} as a causal language model: {reason}.{hint}")


def load_model(source: ModelSource | str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               revision: str | None = None):
    """Load a causal LM from a :class:`ModelSource` (or spec) in eval mode on ``device``.

    ``dtype`` defaults to float32, whatever the stored dtype, so that capture and
    estimation are not limited by half precision. A Hub source loads at its
    ``revision``; ``revision`` applies to a string ``source`` (see :func:`resolve_model_source`).

    Raises:
        LoadError: no or damaged weights, a pickle that ``weights_only`` refuses, or
            a checkpoint whose tensors do not match the config (missing, unexpected
            or differently shaped; tied weights are fine).
    """
    if isinstance(source, str):
        source = resolve_model_source(source, revision)
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(trust_remote_code=False, local_files_only=source.local_files_only, revision=source.hub_revision)
    if source.local:
        kwargs["use_safetensors"] = True if _check_local_weights(Path(source.path)) else None
        _check_safetensors_files(Path(source.path))
    try:
        config = AutoConfig.from_pretrained(source.path, **{k: v for k, v in kwargs.items() if k != "use_safetensors"})
        with _transformers_quiet():
            model, info = AutoModelForCausalLM.from_pretrained(
                source.path, config=config, dtype=dtype or torch.float32, output_loading_info=True,
                ignore_mismatched_sizes=True, **kwargs
            )
    except pickle.UnpicklingError as err:
        raise LoadError(_unpickling_message(source.spec, err)) from err
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
        raise _load_error(source, err) from err
    _check_loading_info(model, info, f"{'folder' if source.local else 'model'} {source.spec!r}")
    from dalign_core.capture.hooks import causal_lm_problem  # transformers' own warning about it is silenced above

    problem = causal_lm_problem(model)
    if problem:
        raise LoadError(f"{'folder' if source.local else 'model'} {source.spec!r} is not a causal language model: "
                        f"{problem}; pass a causal LM (GPT-2, LLaMA, Pythia, ...)")
    return model.to(device).eval()


def check_tokenizer_fits(tokenizer, model) -> None:
    """Refuse a tokenizer that can produce token ids beyond the model's input embedding."""
    embedding = model.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise LoadError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding only {rows}, so some token ids "
            "have no embedding: use the tokenizer the model was trained with (--tokenizer)"
        )


def _position_field(model) -> tuple[str, int] | None:
    """(name, value) of the config field that bounds the sequence length; None if the config states none."""
    from dalign_core.capture.hooks import _position_limit  # noqa: PLC0415  (one reading of the config's position fields)

    return _position_limit(model)


def max_positions(model) -> int | None:
    """The longest sequence the model's config allows (``max_position_embeddings``, ``n_positions``); None if unstated."""
    field = _position_field(model)
    return field[1] if field else None


def check_seq_len(model, seq_len: int) -> None:
    """Refuse sequences longer than the model's maximum position count."""
    field = _position_field(model)
    if field is not None and seq_len > field[1]:
        name, limit = field
        raise LoadError(
            f"--seq-len {seq_len} is longer than the {limit} positions the model was built for "
            f"(config.{name}); use --seq-len {limit} or less"
        )


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in _TOKENIZER_FILES)


def load_tokenizer(source: ModelSource | str, revision: str | None = None):
    """Load the tokenizer stored with the model, or at a folder or Hub id; ``trust_remote_code`` stays off.

    ``revision`` applies to a string ``source`` as in :func:`resolve_model_source`. A
    local revision folder without tokenizer files uses its parent folder's, so a
    layout ``<folder>/{tokenizer.json, step0/, step1000/, ...}`` stores it once.
    """
    if isinstance(source, str):
        folder = Path(source).expanduser()
        if folder.is_dir() and revision is None:
            source = ModelSource(source, str(folder), local=True)
        else:
            source = resolve_model_source(source, revision)
    if source.local:
        folder = Path(source.path)
        if source.revision and not _has_tokenizer(folder) and _has_tokenizer(folder.parent):
            folder = folder.parent
            source = ModelSource(source.spec, str(folder), local=True, revision=source.revision)
        if not _has_tokenizer(folder):
            raise LoadError(
                f"folder {str(folder)!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}). Save the tokenizer "
                f"the model was trained with there (tokenizer.save_pretrained({str(folder)!r})), or pass --tokenizer "
                "PATH_OR_ID"
            )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.path, trust_remote_code=False,
                                             local_files_only=source.local_files_only, revision=source.hub_revision)
    except (OSError, ValueError, KeyError) as err:
        raise LoadError(f"could not load a tokenizer from {source.spec!r}: {err}") from err


# ---------------------------------------------------------------------------
# Text → token sequences


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


def _file_blocks(path: Path, block_chars: int = 1 << 20) -> Iterator[str]:
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
    if not os.access(path, os.R_OK):  # a pipe or /dev/fd/N is not a regular file, and is fine to read
        raise LoadError(f"data file {str(path)!r} cannot be read (no read permission)")
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
    if offline or not _hub_reachable():
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
        if offline or not _hub_reachable(1.0):
            raise LoadError(_unreachable_message("dataset", name, "--data", offline) +
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
