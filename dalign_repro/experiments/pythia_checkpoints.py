"""d_align along Pythia's released training checkpoints, per width (a figure the paper does not show).

The Pythia suite trained every size on the same data in the same order and released
the weights at many steps (git branches ``step<N>`` of each hub repository; the
pinned ones and what each is for: ``data_manifests/pythia_revisions.yaml``). Within a
depth regime (6 layers: 14m d=128, 31m d=256, 70m d=512; 32 layers: 2.8b, 6.9b) the
models differ only in width, so reading d_align at matched steps and matched relative
depth asks when in training wider models' activation gradients become better aligned.

For each (model, revision, layer) one row of ``results/<profile>/pythia_released.csv``:
q is the gradient of an example's mean next-token loss with respect to the output of
decoder layer ``gpt_neox.layers.<i>``, summed over positions (the ``shared``
reduction, dimension d = width), over a pool of ``examples`` windows of ``seq_len``
tokens of held-out text tokenized by the model's own tokenizer; d_align with a
jackknife interval, and the model's mean next-token loss on the same windows.

* Layers: each fraction f of ``layer_fractions`` names the output of block
  ``round(f * L)`` of L (at least the first), i.e. layer index ``i = round(f * L) - 1``,
  so 6- and 32-layer models are read at the same relative depth ``(i + 1) / L``.
* Text: ``"shakespeare"`` (default, offline: the 5 held-out works of the project
  corpus, whole works, never seen by our models; the Pile, Pythia's training data,
  may hold other editions of them), another :func:`~dalign_repro.data.load_corpus`
  name (its test split), or a UTF-8 text file. The pool is ``examples`` windows drawn
  at random (``seed``) from all whole windows of the documents.
* Checkpoints: ``models_dir=None`` reads the hub ids ``EleutherAI/<name>`` (network, or
  a Hugging Face cache that holds them); a folder reads ``<models_dir>/<name>/<revision>/``.
  Anything missing fails before any work, with the ``hf download`` commands to run.
  The smoke profile builds tiny GPT-NeoX checkpoints (:func:`make_tiny_checkpoints`)
  offline instead.

Run: ``python -m dalign_repro.experiments.pythia_checkpoints --profile gpu`` (network and
a GPU). Disk: 14m/31m/70m at 5 revisions about 1.5 GB; the paper profile adds 2.8b and
6.9b at about 5.6 GB and 13.8 GB per revision (about 100 GB in all; set HF_HOME).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from dalign_repro.training import distributed
from dalign_core.environment import offline_variable
from dalign_repro.config import ExperimentConfig
from dalign_repro.data import (TextCorpus, default_cache_dir, load_corpus, make_sequences, prepare_lm_data,
                              require_sequences)
from dalign_repro.experiments._runner import Experiment, register
from dalign_core.capture.hooks import accumulate_geometry
from dalign_core.cli.loading import (LoadError, ModelSource, hub_cache, hub_reachable, load_model, load_tokenizer,
                                 resolve_model_source)
from dalign_repro.models.pythia import build_pythia, pythia_width_variant
from dalign_repro.training.evaluation import evaluate_lm_loss

TABLES = ("pythia_released",)
COLUMNS = ["model", "width", "depth", "revision", "step", "layer", "relative_depth", "n", "d", "mean_sq", "d_par",
           "d_2", "d_align", "d_align_lo", "d_align_hi", "heldout_loss"]
HUB_ORG = "EleutherAI"
REVISIONS = ("step0", "step1000", "step8000", "step33000", "step143000")
SMALL = ("pythia-14m", "pythia-31m", "pythia-70m")


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """Which checkpoints, layers and text (defaults: the ``cpu`` profile, which needs network but no GPU)."""

    profile: str = "cpu"
    seed: int = 0
    names: tuple[str, ...] = SMALL
    revisions: tuple[str, ...] = REVISIONS
    models_dir: str | None = None
    """A folder of ``<name>/<revision>/`` checkpoints; None: the hub ids ``EleutherAI/<name>``."""
    tiny_checkpoints: bool = False
    """Build tiny GPT-NeoX checkpoints ``<models_dir>/<name>/<revision>/`` where missing (smoke); ``models_dir``
    defaults to ``<cache>/tiny-checkpoints`` (the data cache, ``$DALIGN_CACHE`` or ``<repo>/.cache/dalign``)."""
    layer_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    """Relative depths to read: fraction f -> the output of layer ``round(f * L) - 1`` (see :func:`layer_index`)."""
    text: str = "shakespeare"
    """Held-out text: a corpus name for :func:`~dalign_repro.data.load_corpus` (its test split) or a UTF-8 file."""
    examples: int = 128
    """Pool size n: windows per checkpoint (the same windows for every revision of a model)."""
    seq_len: int = 128
    batch_size: int = 16
    """Windows per forward+backward pass (memory only; the numbers do not depend on it)."""
    confidence: float = 0.95
    device: str = "auto"
    dtype: str = "float32"
    """Dtype the weights are loaded in (``torch.<dtype>``); float32 whatever the stored dtype by default."""

    def __post_init__(self):
        super().__post_init__()  # the checks every config shares (seed, NaN, device, ...)
        if not self.names or not self.revisions or not self.layer_fractions:
            raise ValueError("names, revisions and layer_fractions must each hold at least one entry")
        if not all(0 < f <= 1 for f in self.layer_fractions):
            raise ValueError(f"layer_fractions must lie in (0, 1], got {self.layer_fractions}")
        if self.examples < 5 or self.seq_len < 2 or self.batch_size < 1:
            raise ValueError(f"need examples >= 5, seq_len >= 2, batch_size >= 1; got {self.examples}, "
                             f"{self.seq_len}, {self.batch_size}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {self.confidence}")

    def checkpoints_dir(self) -> Path | None:
        """Where ``<name>/<revision>/`` folders are read (and, for ``tiny_checkpoints``, made); None: the hub."""
        if self.models_dir is not None:
            return Path(self.models_dir).expanduser()
        return default_cache_dir() / "tiny-checkpoints" if self.tiny_checkpoints else None


def layer_index(fraction: float, depth: int) -> int:
    """Decoder layer whose output lies after ``round(fraction * depth)`` of ``depth`` blocks (at least one)."""
    return min(depth, max(1, math.floor(fraction * depth + 0.5))) - 1


def step_of(revision: str) -> int | None:
    """N of a revision named ``step<N>``, else None."""
    match = re.fullmatch(r"step(\d+)", revision)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------------------
# Checkpoints


def make_tiny_checkpoints(folder: str | os.PathLike, revisions: tuple[str, ...] = ("step0", "step1000"), *,
                          corpus: "TextCorpus | str" = "shakespeare", width: int = 32, num_layers: int = 2,
                          vocab_size: int = 512, context: int = 64, batch_size: int = 16, lr: float = 3e-3,
                          seed: int = 0, cache_dir: str | os.PathLike | None = None) -> Path:
    """Write ``<folder>/<revision>/`` (config, safetensors weights, tokenizer) for each ``step<N>`` revision.

    A pythia-14m-shaped GPT-NeoX at ``width`` and ``num_layers`` with the project's BPE
    (``vocab_size``, trained on ``corpus``'s train documents; default the offline
    Shakespeare corpus), trained with AdamW for N steps of ``batch_size`` windows of 32
    tokens of those documents: offline stand-ins for Pythia's revisions. Existing
    revision folders are kept; each new one appears whole (written aside, then
    renamed). ``cache_dir``: the data cache for the tokenizer. Returns ``folder``.
    """
    from transformers import PreTrainedTokenizerFast

    from dalign_repro.data.tokenizer import EOS

    folder = Path(folder).expanduser()
    steps = {}
    for revision in revisions:
        if step_of(revision) is None:
            raise ValueError(f"tiny checkpoint revisions must be named step<N>, got {revision!r}")
        steps[revision] = step_of(revision)
    todo = {r: s for r, s in steps.items() if not (folder / r / "config.json").is_file()}
    if not todo:
        return folder
    corpus = load_corpus(corpus) if isinstance(corpus, str) else corpus
    data = prepare_lm_data(corpus, vocab_size=vocab_size, seq_len=32, cache_dir=cache_dir)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=data.tokenizer.tokenizer, eos_token=EOS, bos_token=EOS)
    config = pythia_width_variant("pythia-14m", width, vocab_size=data.vocab_size, num_layers=num_layers,
                                  context=context)
    config.bos_token_id = config.eos_token_id = data.tokenizer.eos_id
    model = build_pythia(config, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    done = 0
    for revision, step in sorted(todo.items(), key=lambda item: item[1]):
        for _ in range(step - done):
            batch = data.train[torch.randint(0, len(data.train), (batch_size,), generator=generator)]
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        done = step
        staging = Path(tempfile.mkdtemp(prefix=f".{revision}.", dir=folder))
        try:
            staging.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would outlive the rename
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            shutil.rmtree(folder / revision, ignore_errors=True)  # a folder without config.json: incomplete
            os.replace(staging, folder / revision)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _download_message(missing: list[tuple[str, str]], reason: str) -> str:
    commands = "\n".join(f"    hf download {hub_id} --revision {revision}" for hub_id, revision in missing)
    return (
        f"{len(missing)} Pythia checkpoint(s) are not in the Hugging Face cache ({hub_cache()}) and {reason}. "
        f"On a machine with network access run\n{commands}\nthen copy that cache here (or point HF_HOME at it); or "
        f"download into folders (`hf download <id> --revision <rev> --local-dir DIR/<name>/<rev>`) and run with "
        f"Config.for_profile(..., models_dir='DIR')."
    )


def resolve_checkpoints(config: Config) -> dict[tuple[str, str], ModelSource]:
    """Every (name, revision)'s :class:`ModelSource`, or one LoadError naming everything missing (no hang)."""
    folder = config.checkpoints_dir()
    pairs = [(name, revision) for name in config.names for revision in config.revisions]
    if folder is not None:
        sources, problems = {}, []
        for name, revision in pairs:
            try:
                sources[name, revision] = resolve_model_source(str(folder / name), revision=revision)
            except LoadError as err:
                problems.append(f"{name} {revision}: {err}")
        if problems:
            raise LoadError(f"{len(problems)} checkpoint(s) missing under {folder}:\n" + "\n".join(problems))
        return sources
    from huggingface_hub import try_to_load_from_cache

    missing = [(f"{HUB_ORG}/{name}", revision) for name, revision in pairs
               if not isinstance(try_to_load_from_cache(f"{HUB_ORG}/{name}", "config.json", revision=revision), str)]
    if missing:
        offline = offline_variable()
        if offline or not hub_reachable():
            reason = f"{offline} is set" if offline else "the Hugging Face Hub cannot be reached from here"
            raise LoadError(_download_message(missing, reason))
    return {(name, revision): resolve_model_source(f"{HUB_ORG}/{name}", revision=revision) for name, revision in pairs}


# ---------------------------------------------------------------------------
# Text


def evaluation_documents(text: str) -> tuple[list[str], str]:
    """The held-out documents and a description: a UTF-8 file, or a corpus name's test split."""
    path = Path(text).expanduser()
    if path.is_file():
        return [path.read_text(encoding="utf-8")], f"file:{path.resolve()}"
    if text.startswith((".", "/", "~")) or text.endswith((".txt", ".text", ".md")):
        raise FileNotFoundError(f"text file {text!r} does not exist")
    corpus = load_corpus(text)
    return list(corpus.test_texts), f"{corpus.source} test split ({', '.join(corpus.test_names)})"


def evaluation_windows(tokenizer, documents: list[str], config: Config) -> tuple[torch.Tensor, int]:
    """``(examples, seq_len)`` token windows drawn at random (``config.seed``) from every document's whole windows.

    Windows never cross a document boundary. Returns the pool and how many windows
    there were to draw from.
    """
    windows = []
    for document in documents:
        ids = torch.tensor(tokenizer(document, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.long)
        if ids.numel() >= config.seq_len:
            windows.append(make_sequences(ids, config.seq_len))
    available = sum(len(w) for w in windows)
    require_sequences("held-out", available, config.examples, seq_len=config.seq_len,
                      field=f"examples={config.examples}")
    windows = torch.cat(windows)
    pick = torch.randperm(len(windows), generator=torch.Generator().manual_seed(config.seed))[:config.examples]
    return windows[pick.sort().values], available


# ---------------------------------------------------------------------------
# The experiment


def _parameters(name: str) -> float:
    """Rough parameter count from a Pythia name (``pythia-6.9b`` -> 6.9e9): the cost that balances the ranks' shares."""
    match = re.search(r"(\d+(?:\.\d+)?)([mb])$", name)
    return float(match.group(1)) * (1e6 if match.group(2) == "m" else 1e9) if match else 1e6


def _measure(config: Config, name: str, revision: str, source: ModelSource, documents: list[str], device,
             pools: dict) -> dict:
    """One checkpoint's rows (one per layer) and its provenance entry."""
    tokenizer = load_tokenizer(source)
    model = load_model(source, device=device, dtype=getattr(torch, config.dtype))
    if name not in pools:  # one pool per model: its revisions share the tokenizer
        pools[name] = evaluation_windows(tokenizer, documents, config)
    pool, available = pools[name]
    depth = model.config.num_hidden_layers
    indices = sorted({layer_index(f, depth) for f in config.layer_fractions})
    layers = [f"gpt_neox.layers.{i}" for i in indices]
    batches = [{"input_ids": pool[i:i + config.batch_size]} for i in range(0, len(pool), config.batch_size)]
    accumulators = accumulate_geometry(model, layers, batches, examples=len(pool), reduction="shared",
                                       desc=f"{name} {revision}")
    loss = evaluate_lm_loss(model, pool, batch_size=config.batch_size)
    rows = []
    for i, layer in zip(indices, layers):
        geometry = accumulators[layer].result(config.confidence)
        interval = geometry.intervals["d_align"]
        rows.append(dict(
            model=name, width=model.config.hidden_size, depth=depth, revision=revision, step=step_of(revision),
            layer=layer, relative_depth=(i + 1) / depth, n=geometry.n, d=geometry.d, mean_sq=geometry.mean_sq,
            d_par=geometry.d_par, d_2=geometry.d_2, d_align=geometry.d_align, d_align_lo=interval.lo,
            d_align_hi=interval.hi, heldout_loss=loss,
        ))
    checkpoint = dict(source=source.spec, path=source.path, commit=getattr(model.config, "_commit_hash", None),
                      windows_available=available)
    del model, accumulators
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"rows": rows, "checkpoint": checkpoint}


def compute(config: Config, out_dir: Path | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """The ``pythia_released`` table and provenance extras (checkpoint paths and commits, the text).

    Each (model, revision) is a job (:mod:`dalign_repro.training.distributed`): under torchrun the
    ranks share them, each on its own GPU, and rank 0 merges the table (the other ranks
    return ``({}, {})``). With ``out_dir`` every finished checkpoint is kept in
    ``<out_dir>/partial/`` until the table is written, so a rerun measures only the rest.
    """
    ctx = distributed.init(config.device)
    with distributed.main_first():  # rank 0 builds the tiny checkpoints and fills the caches; the others read them
        if config.tiny_checkpoints:
            for name in config.names:
                make_tiny_checkpoints(config.checkpoints_dir() / name, config.revisions)
        sources = resolve_checkpoints(config)  # everything missing fails here, before any work
        documents, text_source = evaluation_documents(config.text)
    device = distributed.local_device(config.device)
    jobs = [distributed.Job(f"{name}@{revision}", cost=_parameters(name), payload=(name, revision))
            for name, revision in sources]
    folder = Path(out_dir) / "partial" / f"pythia_released-{config.config_hash()}" if out_dir is not None else None
    pools: dict = {}
    results = distributed.run_jobs(folder, jobs, lambda job, group: _measure(
        config, *job.payload, sources[job.payload], documents, device, pools), collect="main")
    if not ctx.is_main:
        return {}, {}
    rows = [row for job in jobs for row in results[job.name]["rows"]]
    checkpoints = {job.name: results[job.name]["checkpoint"] for job in jobs}
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["step"] = table["step"].astype("Int64")
    if folder is not None:
        distributed.remove_jobs(folder)
    return {"pythia_released": table}, dict(checkpoints=checkpoints, text=text_source, device=str(device))


EXPERIMENT = register(Experiment("pythia_checkpoints", Config, TABLES, compute, sharded=True, description=__doc__))
run = EXPERIMENT.run  # run(config, out_dir=None, force=False): pythia_released, skipped when current

if __name__ == "__main__":
    EXPERIMENT.main()  # a missing checkpoint (LoadError) ends in one line naming the downloads, as any refused run
