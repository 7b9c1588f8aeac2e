"""The small stand-in model of the "your own model" chapters (07 and 08's first exercise), trained once and cached.

:func:`shakespeare_llama` trains a byte-level BPE tokenizer on a few works of Shakespeare and a LLaMA-style decoder
from ``transformers`` on them with AdamW, exactly as a reader would train any model, and keeps the trained weights
(and the training losses) in the data cache, ``$DALIGN_CACHE/your_model/<recipe hash>/``. A later build of the book
with the same recipe (sizes, seed, rate, corpus text, library versions) loads them instead of training again: the
book rebuilds in minutes, and the numbers are those of the same weights. ``fresh=True`` trains anyway.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DemoModel", "shakespeare_llama"]

VOCAB = 512
"""Tokens of the demo's BPE tokenizer (its byte alphabet and merges, and one pad token)."""


@dataclass
class DemoModel:
    """What :func:`shakespeare_llama` returns.

    Attributes:
        tokenizer: a ``PreTrainedTokenizerFast`` (byte-level BPE, :data:`VOCAB` tokens, pad ``<pad>``).
        model: the ``LlamaForCausalLM``, in eval mode.
        train_ids: the training text as one 1-D tensor of token ids.
        losses: the training loss of each AdamW step, in nats.
        trained: True when this call trained it, False when it was loaded from the cache.
        corpus: the loaded corpus (train / validation / test works).
    """

    tokenizer: object
    model: object
    train_ids: object
    losses: list[float]
    trained: bool
    corpus: object = field(repr=False, default=None)


def _tokenizer(train_text: str):
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([train_text], trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>")


def shakespeare_llama(width: int, layers: int, steps: int, seed: int = 0, *, context: int = 64, batch: int = 16,
                      lr: float = 3e-3, works: int = 4, fresh: bool = False, cache_dir: Path | str | None = None
                      ) -> DemoModel:
    """A LLaMA-style decoder of ``width`` and ``layers`` trained for ``steps`` AdamW steps (rate ``lr``) on batches of
    ``batch`` random windows of ``context`` tokens from the first ``works`` training works of Shakespeare.

    Seeded by ``seed`` (``torch.manual_seed``): the same recipe gives the same weights, so the cache
    (``cache_dir``, default ``$DALIGN_CACHE/your_model``) keeps one copy per recipe. ``fresh``: train even when
    cached (the cache is then rewritten).
    """
    import torch
    import transformers

    from dalign_core.atomic import atomic_path
    from dalign_repro.data.manifest import default_cache_dir
    from dalign_repro.data.corpora import load_corpus

    if min(width, layers, steps, context, batch, works) < 1 or width % 4:
        raise ValueError(f"shakespeare_llama: width={width} must be a positive multiple of 4 (4 heads), and layers, "
                         f"steps, context, batch and works at least 1 (got {layers}, {steps}, {context}, {batch}, "
                         f"{works})")
    corpus = load_corpus("shakespeare")
    train_text = "\n".join(corpus.train_texts[:works])
    torch.manual_seed(seed)
    tokenizer = _tokenizer(train_text)
    train_ids = torch.tensor(tokenizer(train_text)["input_ids"])
    recipe = dict(width=width, layers=layers, steps=steps, seed=seed, context=context, batch=batch, lr=lr,
                  vocab=VOCAB, torch=torch.__version__, transformers=transformers.__version__,
                  text=hashlib.sha256(train_text.encode()).hexdigest())
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "your_model"
    cached = folder / key
    if not fresh and (cached / "losses.json").is_file():
        model = transformers.LlamaForCausalLM.from_pretrained(cached).eval()
        losses = json.loads((cached / "losses.json").read_text())
        return DemoModel(tokenizer, model, train_ids, losses, False, corpus)

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=len(tokenizer), max_position_embeddings=2 * context))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(train_ids) - context, (batch,))
        windows = torch.stack([train_ids[s:s + context] for s in starts])
        loss = model(input_ids=windows, labels=windows).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model = model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder))  # written whole, then renamed into place
    try:
        model.save_pretrained(staging)
        (staging / "recipe.json").write_text(json.dumps(recipe, indent=1, sort_keys=True) + "\n")
        with atomic_path(staging / "losses.json") as tmp:
            Path(tmp).write_text(json.dumps(losses) + "\n")
        if cached.exists():
            shutil.rmtree(cached)
        staging.rename(cached)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # a read-only cache: the model is still returned
    return DemoModel(tokenizer, model, train_ids, losses, True, corpus)
