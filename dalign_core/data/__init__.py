"""Data: manifests (verified files), text corpora and the BPE tokenizer.

Typical use::

    from dalign_core.data import load_shakespeare, prepare_lm_data
    corpus = load_shakespeare()                       # verified archive -> TextCorpus
    data = prepare_lm_data(corpus, vocab_size=4096, seq_len=128)
    data.train, data.test                             # LongTensor (n, 128) each
"""

from dalign_core.data.manifest import (
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
from dalign_core.data.text import TextCorpus, load_corpus, load_hf_text, load_shakespeare, split_documents
from dalign_core.data.tokenizer import (
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
    "TextCorpus",
    "load_corpus",
    "load_hf_text",
    "load_shakespeare",
    "split_documents",
    "BPESettings",
    "BPETokenizer",
    "encode_cached",
    "LMData",
    "make_sequences",
    "prepare_lm_data",
    "tokenizer_cache_key",
    "train_bpe",
]
