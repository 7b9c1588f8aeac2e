"""Data: manifests (verified files), text corpora, the BPE tokenizer and supply checks.

Typical use::

    from dalign_repro.data import load_corpus, prepare_lm_data, require_sequences
    corpus = load_corpus("shakespeare")               # or "dir:/path/to/folder", "hf:<dataset>"
    data = prepare_lm_data(corpus, vocab_size=4096, seq_len=128)
    data.train, data.validation, data.test            # LongTensor (n, 128) each
    require_sequences("held-out", len(data.test), 1024, seq_len=128, field="pool_size=1024")

May import: the top-level helpers (``dalign_core.environment``, ``dalign_core.atomic``, ``config``) only.
"""

from dalign_repro.data.images import IMAGE_SETS, ImageData, ImageFormatError, load_images
from dalign_repro.data.manifest import (
    ChecksumError,
    DataMissingError,
    Manifest,
    Source,
    default_cache_dir,
    fetch,
    load_manifest,
    sha256_file,
    verify_file,
)
from dalign_repro.data.supply import (
    DataSupplyError,
    RepeatedDataWarning,
    check_epochs,
    require_sequences,
    training_epochs,
)
from dalign_repro.data.corpora import load_corpus
from dalign_repro.data.text import (
    TextCorpus,
    load_hf_text,
    load_shakespeare,
    load_text_dir,
    read_text_dir,
    split_documents,
)
from dalign_repro.data.tokenizer import (
    BPESettings,
    BPETokenizer,
    encode_cached,
    LMData,
    make_sequences,
    prepare_lm_data,
    tokenizer_cache_key,
    train_bpe,
)

__all__ = [
    "ChecksumError",
    "DataMissingError",
    "Manifest",
    "Source",
    "default_cache_dir",
    "fetch",
    "load_manifest",
    "sha256_file",
    "verify_file",
    "DataSupplyError",
    "RepeatedDataWarning",
    "check_epochs",
    "require_sequences",
    "training_epochs",
    "TextCorpus",
    "load_corpus",
    "load_hf_text",
    "load_shakespeare",
    "load_text_dir",
    "read_text_dir",
    "split_documents",
    "BPESettings",
    "BPETokenizer",
    "encode_cached",
    "LMData",
    "make_sequences",
    "prepare_lm_data",
    "tokenizer_cache_key",
    "train_bpe",
    "IMAGE_SETS",
    "ImageData",
    "ImageFormatError",
    "load_images",
]
