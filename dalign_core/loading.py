"""Load a causal language model, its tokenizer and text examples for the ``dalign`` command.

Safety and offline behaviour:

* A model is a local checkpoint folder (``save_pretrained`` output) or a Hugging
  Face model id. Weights load from safetensors when the checkpoint has them; a
  ``pytorch_model.bin`` is read by transformers with ``torch.load(weights_only=True)``,
  so no pickled code ever runs. ``trust_remote_code`` is always off.
* A Hugging Face id is first looked up in the local cache. If it is not cached and
  the Hub is unreachable (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``, or no
  connection within a few seconds), loading fails at once with a :class:`LoadError`
  that says what to download and where to put it — never a hang.
* Text comes from a local file, or (network) from a Hugging Face dataset.
"""

from __future__ import annotations

import os
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
    "load_model",
    "load_tokenizer",
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


def _unreachable_message(kind: str, spec: str, flag: str, offline: str | None) -> str:
    """What to do when ``spec`` is neither local nor cached; ``offline`` names the offline variable set, if any."""
    reason = f"{offline} is set" if offline else "the Hugging Face Hub cannot be reached from here"
    return (
        f"{kind} {spec!r} is not a local {'folder' if kind == 'model' else 'file'}, it is not in the Hugging Face cache "
        f"({_hub_cache()}), and {reason}. Either download it on a machine with network access, e.g. "
        f"`hf download {spec}{' --repo-type dataset' if kind == 'dataset' else ''} --local-dir ./{spec.split('/')[-1]}`, "
        f"copy that folder here and pass {flag} ./{spec.split('/')[-1]}"
        + (" (a folder with config.json, model.safetensors and the tokenizer files)" if kind == "model" else "")
        + f"; or copy a Hugging Face cache that holds it to {_hub_cache()} (or point HF_HOME at it)"
        + (f"; or unset {offline} if this machine has network access" if offline else "")
        + "."
    )


def resolve_model_source(spec: str) -> ModelSource:
    """Decide whether ``spec`` is a local checkpoint folder or a Hub id, failing fast when neither can work."""
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"--model {spec!r} is a file; pass the checkpoint folder (save_pretrained output) instead")
        if not (path / "config.json").is_file():
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

    cached = try_to_load_from_cache(spec, "config.json")
    if isinstance(cached, str):
        return ModelSource(spec, spec, local=False, cached=True)
    offline = offline_variable()
    if offline or not _hub_reachable():
        raise LoadError(_unreachable_message("model", spec, "--model", offline))
    return ModelSource(spec, spec, local=False, cached=False)


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


def load_model(source: ModelSource | str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Load a causal LM from a :class:`ModelSource` (or spec) in eval mode on ``device``.

    ``dtype`` defaults to float32, whatever the stored dtype, so that capture and
    estimation are not limited by half precision.
    """
    if isinstance(source, str):
        source = resolve_model_source(source)
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(trust_remote_code=False, local_files_only=source.local_files_only)
    if source.local:
        kwargs["use_safetensors"] = True if _check_local_weights(Path(source.path)) else None
    try:
        config = AutoConfig.from_pretrained(source.path, **{k: v for k, v in kwargs.items() if k != "use_safetensors"})
        model = AutoModelForCausalLM.from_pretrained(
            source.path, config=config, dtype=dtype or torch.float32, **kwargs
        )
    except (OSError, ValueError, KeyError) as err:
        where = "folder" if source.local else ("cached model" if source.cached else "model id")
        hint = ""
        if source.cached:
            hint = (f" Its config is cached but other files are missing; download the whole model "
                    f"(`hf download {source.spec}`) while online.")
        raise LoadError(f"could not load the {where} {source.spec!r} as a causal language model: {err}.{hint}") from err
    return model.to(device).eval()


def load_tokenizer(source: ModelSource | str):
    """Load the tokenizer stored with the model, or at a folder or Hub id; ``trust_remote_code`` stays off."""
    if isinstance(source, str):
        folder = Path(source).expanduser()
        source = ModelSource(source, str(folder), local=True) if folder.is_dir() else resolve_model_source(source)
    if source.local:
        folder = Path(source.path)
        if not any((folder / name).exists() for name in _TOKENIZER_FILES):
            raise LoadError(
                f"folder {str(folder)!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}). Save the tokenizer "
                f"the model was trained with there (tokenizer.save_pretrained({str(folder)!r})), or pass --tokenizer "
                "PATH_OR_ID"
            )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.path, trust_remote_code=False,
                                             local_files_only=source.local_files_only)
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
    with path.open("r", encoding="utf-8", errors="replace") as handle:
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


def read_text_examples(path: str | os.PathLike, tokenizer, examples: int, seq_len: int,
                       split: str = "chunks") -> list[list[int]]:
    """Token id sequences from a UTF-8 text file.

    ``split="chunks"``: the file's token stream cut into consecutive windows of
    ``seq_len`` tokens (the last may be shorter); ``"lines"``: one example per
    non-empty line, truncated to ``seq_len``. No special tokens are added. Reads only
    as much of the file as it needs.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise LoadError(f"data file {str(path)!r} does not exist")
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
