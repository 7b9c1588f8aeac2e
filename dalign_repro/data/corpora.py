"""The text corpora by name: one dispatcher over the loaders of :mod:`~dalign_repro.data.text` (Shakespeare, a
folder, a hub data set) and :mod:`~dalign_repro.data.python_sources` (the pinned packages' sources)."""

from __future__ import annotations

from dalign_repro.data.python_sources import load_python_sources
from dalign_repro.data.text import TextCorpus, load_hf_text, load_shakespeare, load_text_dir

__all__ = ["load_corpus"]


def load_corpus(name: str = "shakespeare", **kwargs) -> TextCorpus:
    """Dispatch by name: ``"shakespeare"`` (offline default), ``"python-sources"``
    (:mod:`dalign_repro.data.python_sources`), ``"dir:<folder>"`` or ``"hf:<dataset>[/<config>]"``.

    ``kwargs`` go to :func:`load_shakespeare`, :func:`load_text_dir` or :func:`load_hf_text`.
    """
    if name == "shakespeare":
        return load_shakespeare(**kwargs)
    if name == "python-sources":
        return load_python_sources(**kwargs)
    if name.startswith("dir:"):
        if not name[4:]:
            raise ValueError("corpus 'dir:' needs a folder: 'dir:/path/to/folder' (of .txt and/or .jsonl files)")
        return load_text_dir(name[4:], **kwargs)
    if name.startswith("hf:"):
        parts = name[3:].split("/")
        if len(parts) == 3:  # owner/dataset/config
            kwargs.setdefault("config_name", parts[2])
            parts = parts[:2]
        return load_hf_text("/".join(parts), **kwargs)
    raise ValueError(f"unknown corpus {name!r}; use 'shakespeare' (the offline default), 'python-sources' (the "
                     "pinned packages' sources, data_manifests/python_sources.yaml), 'dir:/path/to/folder' "
                     "(a folder of .txt and/or .jsonl files) or 'hf:<owner>/<dataset>[/<config>]'")
