"""Byte-level BPE tokenizer (``tokenizers`` library) and fixed-length LM sequences.

The tokenizer is trained on the TRAIN split only and cached on disk under
``<cache>/tokenizers/bpe-<key>/tokenizer.json``, where ``key`` is the sha256 of the
training texts, the settings (vocabulary size, minimum merge frequency, special tokens,
pre-tokenizer options) and the ``tokenizers`` version.  The file is written under a
temporary name and renamed, so a half-written tokenizer is never picked up.

A document is encoded as its tokens followed by one end-of-text token; documents are
concatenated into one stream per split (train, validation, test), which :func:`make_sequences` cuts into
non-overlapping windows of ``seq_len`` tokens (the tail shorter than ``seq_len`` is
dropped).  A causal LM trained on a window predicts its tokens 1..seq_len-1 from the
ones before, i.e. ``seq_len - 1`` predictions per sequence.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import safetensors.torch
import tokenizers
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dalign_repro.data.manifest import default_cache_dir
from dalign_core.atomic import atomic_path

__all__ = [
    "BPESettings",
    "BPETokenizer",
    "LMData",
    "tokenizer_cache_key",
    "train_bpe",
    "encode_cached",
    "make_sequences",
    "prepare_lm_data",
]

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class BPESettings:
    """Everything besides the texts that determines the trained tokenizer."""

    vocab_size: int = 4096
    min_frequency: int = 2
    special_tokens: tuple[str, ...] = (EOS,)
    add_prefix_space: bool = False

    def __post_init__(self):
        if self.vocab_size < 256 + len(self.special_tokens) + 1:
            raise ValueError(f"vocab_size must exceed the 256 byte symbols plus special tokens, got {self.vocab_size}")
        if EOS not in self.special_tokens:
            raise ValueError(f"special_tokens must include {EOS!r}")


def tokenizer_cache_key(texts: Iterable[str], settings: BPESettings) -> str:
    """sha256 (hex) of the training texts (in order), the settings and the tokenizers version."""
    h = hashlib.sha256()
    meta = {"settings": asdict(settings), "tokenizers": tokenizers.__version__, "format": 1}
    h.update(json.dumps(meta, sort_keys=True).encode())
    n = 0
    for text in texts:
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(hashlib.sha256(data).digest())
        n += 1
    h.update(n.to_bytes(8, "little"))
    return h.hexdigest()


class BPETokenizer:
    """A trained byte-level BPE tokenizer with tensor helpers.

    Attributes:
        tokenizer: the underlying ``tokenizers.Tokenizer``.
        path: its ``tokenizer.json`` on disk (None if never saved).
        cache_key: the key it was cached under.
        cache_hit: True if it was loaded from the cache rather than trained.
    """

    def __init__(self, tokenizer: Tokenizer, path: Path | None = None, cache_key: str = "", cache_hit: bool = False):
        self.tokenizer = tokenizer
        self.path = path
        self.cache_key = cache_key
        self.cache_hit = cache_hit
        eos = tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError(f"tokenizer has no {EOS!r} token")
        self.eos_id: int = eos

    @classmethod
    def load(cls, path: "str | os.PathLike") -> "BPETokenizer":
        """Load a saved ``tokenizer.json``."""
        return cls(Tokenizer.from_file(str(path)), path=Path(path))

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the model's embedding size)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of one text, int64, shape ``(n,)`` (no end-of-text token)."""
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.int64)

    def encode_documents(self, texts: Sequence[str], *, eos: bool = True) -> torch.Tensor:
        """One int64 stream: each document's ids followed by the end-of-text id (if ``eos``)."""
        ids: list[int] = []
        for enc in self.tokenizer.encode_batch(list(texts)):
            ids.extend(enc.ids)
            if eos:
                ids.append(self.eos_id)
        return torch.tensor(ids, dtype=torch.int64)

    def decode(self, ids) -> str:
        """Text of a sequence of ids (tensor or list)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, key={self.cache_key[:12]}, cache_hit={self.cache_hit})"


def _new_tokenizer(settings: BPESettings) -> tuple[Tokenizer, trainers.BpeTrainer]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=settings.add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        min_frequency=settings.min_frequency,
        special_tokens=list(settings.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def train_bpe(
    texts: Sequence[str],
    vocab_size: int = 4096,
    *,
    min_frequency: int = 2,
    cache_dir: "str | os.PathLike | None" = None,
    use_cache: bool = True,
) -> BPETokenizer:
    """Train (or load from the cache) a byte-level BPE on ``texts`` -- pass the TRAIN split only.

    Args:
        texts: training documents, in a fixed order (the order is part of the cache key).
        vocab_size: total vocabulary including the byte alphabet and ``<|endoftext|>``;
            4096-8192 for the experiments.
        min_frequency: minimum pair count for a merge.
        cache_dir: data cache root (default ``$DALIGN_CACHE`` or ``<repo>/.cache/dalign``);
            the tokenizer goes to ``<cache_dir>/tokenizers/bpe-<key[:20]>/tokenizer.json``.
        use_cache: False trains afresh and does not write the cache.
    """
    texts = list(texts)
    if not texts:
        raise ValueError("train_bpe needs at least one training text")
    settings = BPESettings(vocab_size=int(vocab_size), min_frequency=int(min_frequency))
    key = tokenizer_cache_key(texts, settings)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "tokenizers" / f"bpe-{key[:20]}" / "tokenizer.json"
    if use_cache and path.is_file():
        return BPETokenizer(Tokenizer.from_file(str(path)), path=path, cache_key=key, cache_hit=True)
    tok, trainer = _new_tokenizer(settings)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if not use_cache:
        return BPETokenizer(tok, path=None, cache_key=key, cache_hit=False)
    with atomic_path(path, suffix=".part") as tmp:
        tok.save(str(tmp))
        meta = {"key": key, "settings": asdict(settings), "tokenizers": tokenizers.__version__,
                "n_texts": len(texts), "n_chars": sum(map(len, texts))}
        (path.parent / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return BPETokenizer(tok, path=path, cache_key=key, cache_hit=False)


def make_sequences(tokens: torch.Tensor, seq_len: int, *, stride: int | None = None) -> torch.Tensor:
    """Cut a 1-D token stream into windows of ``seq_len`` tokens, shape ``(n, seq_len)``.

    Windows start at ``0, stride, 2*stride, ...`` (``stride`` defaults to ``seq_len``:
    non-overlapping); a tail shorter than ``seq_len`` is dropped.  Deterministic, no
    shuffling (the training loop draws its own order).  Returns a contiguous copy.
    """
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D stream, got shape {tuple(tokens.shape)}")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2 (a causal LM predicts seq_len - 1 tokens), got {seq_len}")
    stride = seq_len if stride is None else int(stride)
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if tokens.numel() < seq_len:
        raise ValueError(f"a stream of {tokens.numel()} tokens is shorter than seq_len={seq_len}")
    return tokens.unfold(0, seq_len, stride).contiguous().to(torch.int64)


def encode_cached(tok: BPETokenizer, texts: Sequence[str]) -> torch.Tensor:
    """:meth:`BPETokenizer.encode_documents` with an on-disk cache beside the tokenizer.

    The stream is stored as ``tokens-<key>.safetensors`` in the tokenizer's folder, keyed
    by the tokenizer's cache key and the texts; written atomically.  Without a saved
    tokenizer (``tok.path is None``) it just encodes.
    """
    if tok.path is None or not tok.cache_key:
        return tok.encode_documents(texts)
    h = hashlib.sha256(tok.cache_key.encode())
    for text in texts:
        h.update(hashlib.sha256(text.encode("utf-8")).digest())
    path = Path(tok.path).parent / f"tokens-{h.hexdigest()[:20]}.safetensors"
    if path.is_file():
        return safetensors.torch.load_file(str(path))["ids"]
    ids = tok.encode_documents(texts)
    with atomic_path(path, suffix=".part") as tmp:
        safetensors.torch.save_file({"ids": ids}, str(tmp))
    return ids


@dataclass
class LMData:
    """Tokenized train, validation and held-out sequences for a causal LM.

    ``validation`` comes last and defaults to an empty ``(0, seq_len)`` tensor, so data
    built without a validation split (``LMData(train, test, tokenizer, seq_len)``) keeps
    working; code that needs validation sequences should check with
    :func:`~dalign_repro.data.supply.require_sequences`.
    """

    train: torch.Tensor
    """int64 ``(n_train, seq_len)``, windows of the train stream."""
    test: torch.Tensor
    """int64 ``(n_test, seq_len)``, windows of the held-out stream."""
    tokenizer: BPETokenizer
    seq_len: int
    source: str = ""
    validation: torch.Tensor | None = None
    """int64 ``(n_validation, seq_len)``, windows of the validation stream (for choosing the
    learning rate; never a q pool, never test text); ``(0, seq_len)`` when the corpus has none."""

    def __post_init__(self):
        if self.validation is None:
            self.validation = torch.empty((0, self.seq_len), dtype=torch.int64)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def summary(self) -> dict:
        out: dict = {"source": self.source, "vocab_size": self.vocab_size, "seq_len": self.seq_len}
        splits = {"train": self.train, "validation": self.validation, "test": self.test}
        out.update({f"n_{name}_seqs": int(x.shape[0]) for name, x in splits.items()})
        out.update({f"{name}_tokens": int(x.numel()) for name, x in splits.items()})
        out["tokenizer_key"] = self.tokenizer.cache_key
        return out


def _windows(split: str, stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """:func:`make_sequences` of one split's stream, with an error that names the split."""
    if stream.numel() < seq_len:
        raise ValueError(f"the {split} split encodes to {stream.numel()} tokens, fewer than one sequence of "
                         f"seq_len={seq_len}; use a larger corpus or a shorter context")
    return make_sequences(stream, seq_len)


def prepare_lm_data(
    corpus,
    vocab_size: int = 4096,
    seq_len: int = 128,
    *,
    cache_dir: "str | os.PathLike | None" = None,
    min_frequency: int = 2,
) -> LMData:
    """Train/load the BPE on ``corpus.train_texts`` and cut every split into sequences.

    ``corpus`` is a :class:`~dalign_repro.data.text.TextCorpus` (anything with
    ``train_texts``, ``test_texts`` and optionally ``validation_texts`` and ``source``).
    The tokenizer never sees the validation or test texts.  A corpus without validation
    documents gives an empty ``(0, seq_len)`` validation tensor.
    """
    tok = train_bpe(corpus.train_texts, vocab_size, min_frequency=min_frequency, cache_dir=cache_dir)
    texts = {"train": corpus.train_texts, "validation": tuple(getattr(corpus, "validation_texts", ())),
             "test": corpus.test_texts}
    windows = {split: _windows(split, encode_cached(tok, t), seq_len) for split, t in texts.items()
               if t or split != "validation"}
    return LMData(train=windows["train"], test=windows["test"], validation=windows.get("validation"),
                  tokenizer=tok, seq_len=seq_len, source=getattr(corpus, "source", ""))
