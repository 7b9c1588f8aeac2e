"""A checkpoint's ``tokenizer.json`` read by the ``tokenizers`` library alone, where that is what transformers reads.

Why: transformers' ``AutoTokenizer`` reads the model's config to find the tokenizer class, and importing a model's
config class pulls in transformers' image and video utilities (and with them torchvision and torch's compiler). A
generic fast tokenizer (``tokenizer_class`` ``TokenizersBackend`` or ``PreTrainedTokenizerFast``, what
``save_pretrained`` of a ``tokenizers`` tokenizer writes) is the ``tokenizer.json`` as it is, so
``tokenizers.Tokenizer.from_file`` gives the same token ids without transformers. (Loading the model itself still
imports its config class, and with it those utilities: measured on transformers 5.24, ``dalign estimate`` on a LLaMA
loads 3,279 modules against 3,286 through ``AutoTokenizer``; ``benchmarks/bench_command.py`` prints where the time
goes.)

When transformers would change the tokenizer it reads, :func:`read_tokenizer_file` returns None and the caller uses
``AutoTokenizer``: a model-specific class (``GPTNeoXTokenizer``, ``LlamaTokenizer``, …, which may rebuild the
tokenizer from its own defaults), a ``tokenizer_config.json`` option this module does not know to be inert, a special
or added token that transformers would add because ``tokenizer.json`` lacks it, or a vocabulary above 100,000 tokens
(transformers patches some of those).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FileTokenizer", "read_tokenizer_file"]

GENERIC_CLASSES = (None, "TokenizersBackend", "PreTrainedTokenizerFast")
"""``tokenizer_class`` values whose tokenizer transformers takes from ``tokenizer.json`` unchanged."""
INERT_KEYS = frozenset({
    "backend", "tokenizer_class", "model_max_length", "clean_up_tokenization_spaces", "padding_side",
    "truncation_side", "model_input_names", "added_tokens_decoder", "name_or_path", "processor_class",
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens", "extra_special_tokens",
})
"""``tokenizer_config.json`` keys that leave the ids of ``tokenizer(text, add_special_tokens=False)`` as
``tokenizer.json`` gives them (special and added tokens are checked to be in it already)."""
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
MAX_VOCAB = 100_000
"""Above this transformers may patch the pre-tokenizer (some Mistral tokenizers): left to it."""


class FileTokenizer:
    """The tokenizer of a ``tokenizer.json``, called as a transformers tokenizer is by the ``dalign`` commands.

    ``len(tokenizer)`` is the vocabulary with added tokens (as transformers counts it), and
    ``tokenizer(text, add_special_tokens=False)["input_ids"]`` the token ids of ``text`` (a list of ints).
    """

    def __init__(self, backend, path: Path):
        self.backend = backend
        self.path = path

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True, verbose: bool = True) -> dict[str, list[int]]:
        if add_special_tokens:  # transformers may rebuild the post-processor for these: not reproduced here
            raise ValueError("FileTokenizer encodes without special tokens only: pass add_special_tokens=False")
        encoding = self.backend.encode(text, add_special_tokens=False)
        return {"input_ids": encoding.ids, "attention_mask": encoding.attention_mask}

    def __repr__(self) -> str:
        return f"FileTokenizer({str(self.path)!r}, {len(self)} tokens)"


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _config_tokens(config: dict) -> list[str] | None:
    """Every special and added token the config names, or None when one of them is written in a form not known."""
    tokens = []
    for key in SPECIAL_KEYS:
        if config.get(key) is not None:
            tokens.append(_token_text(config[key]))
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key) or []
        if isinstance(extra, dict):
            extra = list(extra.values())
        if not isinstance(extra, list):
            return None
        tokens += [_token_text(token) for token in extra]
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        return None
    tokens += [_token_text(token) for token in decoder.values()]
    return None if any(token is None for token in tokens) else tokens


def read_tokenizer_file(tokenizer_json: Path, tokenizer_config: Path | None) -> FileTokenizer | None:
    """The :class:`FileTokenizer` of ``tokenizer_json``, or None where transformers would read it otherwise.

    ``tokenizer_config``: the ``tokenizer_config.json`` beside it (None or a missing file: none).
    """
    config: dict = {}
    if tokenizer_config is not None and tokenizer_config.is_file():
        try:
            config = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # transformers says what is wrong with it
        if not isinstance(config, dict):
            return None
    if config.get("tokenizer_class") not in GENERIC_CLASSES or not set(config) <= INERT_KEYS:
        return None
    tokens = _config_tokens(config)
    if tokens is None:
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(tokenizer_json))
    except Exception:  # noqa: BLE001  (tokenizers raises a bare Exception for a damaged file: transformers reports it)
        return None
    added = backend.get_added_tokens_decoder()
    if any(token not in {each.content for each in added.values()} for token in tokens) or \
            backend.get_vocab_size(with_added_tokens=True) > MAX_VOCAB:
        return None
    for index, entry in (config.get("added_tokens_decoder") or {}).items():  # the same token, with the same options
        have = added.get(int(index)) if str(index).isdigit() else None
        if not isinstance(entry, dict) or have is None or \
                any(getattr(have, key, None) != value for key, value in entry.items() if key != "__type"):
            return None
    return FileTokenizer(backend, tokenizer_json)
