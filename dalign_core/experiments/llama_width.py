"""Width-controlled LLaMA-style models: d_align and misalignment against width.

For every width N and seed: train a LLaMA-style causal LM (transformers
``LlamaForCausalLM``; depth, head dimension, context, data, steps and optimizer
shared across widths), keep checkpoints along training, and at each checkpoint
capture one activation gradient q per sequence at every decoder layer (the
gradient of the sequence's mean next-token loss with respect to the layer's
output, summed over positions: the shared-bias reduction) on a train pool and a
held-out pool. Then:

* ``llama_geometry``: the estimated geometry (``||mu||^2``, ``d_par``, ``d_2``,
  ``d_align`` with intervals) per (width, seed, step, pool, layer), with the
  model's held-out loss beside the bigram baseline on the same tokens;
* ``llama_misalignment``: the empirical ``Pr(mu_M^T g_K <= 0)`` at the final
  checkpoint from resamples of disjoint subsets of the held-out pool (the
  theorem's setting: train and test means from the same law), beside B_exact and
  B_align from the estimated geometry, for a grid of budgets (M, K); and the
  same statistic with M drawn from the train pool (the growth question: does
  the training set's direction carry over to unseen text?);
* ``llama_sample_unit``: how the choice of sample unit (sequence or token),
  sequence length and reduction moves d_align at the final checkpoint.

A model whose held-out loss does not beat the bigram baseline is marked
``trained_ok = False``: a failed run, reported and never plotted as a data point.

Run without Jupyter: ``python -m dalign_core.experiments.llama_width --profile paper``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from dalign_core._tensor import resolve_device
from dalign_core.baselines import bigram_heldout_loss
from dalign_core.data import load_corpus, prepare_lm_data
from dalign_core.estimators import estimate_geometry
from dalign_core.hooks import accumulate_geometry, activation_gradients
from dalign_core.misalignment import misalignment_probability
from dalign_core.models.llama import LlamaWidthSpec, build_llama, count_parameters
from dalign_core.results import REPO_ROOT, ExperimentConfig, default_results_dir, results_current, write_table
from dalign_core.training import TrainConfig, evaluate_lm_loss, load_weights, train

TABLES = ("llama_geometry", "llama_misalignment", "llama_sample_unit")


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """Everything that determines the experiment's numbers (defaults: the ``cpu`` profile)."""

    profile: str = "cpu"
    seed: int = 0
    """Base seed; run r of a width uses seed ``seed + r`` for initialization and data order."""
    seeds: int = 3
    widths: tuple[int, ...] = (32, 64, 128, 256)
    depth: int = 2
    head_dim: int = 32
    context: int = 64
    vocab_size: int = 2048
    corpus: str = "shakespeare"
    """``"shakespeare"`` (offline, about 1.6M tokens at vocabulary 2048) or ``"hf:<dataset>[/<config>]"``
    (web text, needs network). The ``paper`` budget (82M tokens) repeats Shakespeare for dozens of
    epochs; where the GPU machine has network, pass ``corpus="hf:..."`` to train on fresh text."""
    batch_size: int = 32
    steps: int = 600
    lr: float = 3e-3
    warmup_steps: int = 60
    weight_decay: float = 0.1
    checkpoint_steps: tuple[int, ...] = (0, 10, 30, 100, 300, 600)
    pool_size: int = 256
    """Examples (sequences) per q pool, train and held-out."""
    capture_batch: int = 64
    eval_sequences: int = 1024
    """Held-out sequences scored for the held-out loss (model and bigram alike)."""
    insertion_layer: int = 0
    """The decoder layer whose output is the fixed insertion point (``model.layers.<i>``)."""
    budgets: tuple[tuple[int, int], ...] = ((4, 4), (16, 16), (32, 32), (64, 64), (128, 128))
    resamples: int = 100_000
    unit_contexts: tuple[int, ...] = (16, 32, 64)
    confidence: float = 0.95
    device: str = "auto"
    autocast_dtype: str | None = None

    PROFILES = {
        "smoke": dict(
            seeds=1, widths=(32, 64), context=32, vocab_size=512, steps=20, warmup_steps=2,
            checkpoint_steps=(0, 20), pool_size=16, capture_batch=8, eval_sequences=64, budgets=((2, 2), (4, 4)), resamples=2_000,
            unit_contexts=(16, 32),
        ),
        "cpu": {},
        "paper": dict(
            widths=(512, 1024, 1536, 2048, 2560, 3072), depth=8, head_dim=64, context=256, vocab_size=8192,
            eval_sequences=4096,
            batch_size=64, steps=5_000, lr=1e-3, warmup_steps=250, checkpoint_steps=(0, 100, 300, 1000, 2000, 5000),
            pool_size=1024, capture_batch=64, insertion_layer=3, unit_contexts=(64, 128, 256),
            budgets=((4, 4), (16, 16), (32, 32), (64, 64), (128, 128), (256, 256)), autocast_dtype="bfloat16",
        ),
    }

    def spec(self, width: int, vocab_size: int) -> LlamaWidthSpec:
        return LlamaWidthSpec(width=width, depth=self.depth, head_dim=self.head_dim, vocab_size=vocab_size,
                              context=self.context)

    @property
    def layer(self) -> str:
        return f"model.layers.{self.insertion_layer}"


TRAINING_FIELDS = ("depth", "head_dim", "context", "vocab_size", "corpus", "batch_size", "steps", "lr", "warmup_steps",
                   "weight_decay", "checkpoint_steps", "autocast_dtype")
"""The config fields that determine the trained weights (with width and seed)."""


def checkpoint_root(config: Config) -> Path:
    """Where training checkpoints live: ``checkpoints/<profile>/llama_width/<training hash>``.

    The hash covers only :data:`TRAINING_FIELDS`, so changing how the models are
    measured (pools, budgets, resamples) reuses the trained models. Override the
    root with ``DALIGN_CHECKPOINTS``.
    """
    root = Path(os.environ.get("DALIGN_CHECKPOINTS") or REPO_ROOT / "checkpoints")
    fields = {name: getattr(config, name) for name in TRAINING_FIELDS}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return root / config.profile / "llama_width" / key


def _pool_batches(sequences: torch.Tensor, batch_size: int):
    return [{"input_ids": sequences[i:i + batch_size]} for i in range(0, len(sequences), batch_size)]


def _geometry_rows(accumulators, base: dict, confidence: float) -> list[dict]:
    rows = []
    for layer, accumulator in accumulators.items():
        geometry = accumulator.result(confidence)
        rows.append({**base, "layer": layer, **geometry.to_row()})
    return rows


def train_and_measure(config: Config, width: int, run: int, data, baseline_loss: float):
    """Train one (width, seed) model and measure it along its checkpoints.

    Returns (geometry rows, misalignment rows, sample-unit rows, summary dict).
    """
    device = resolve_device(config.device)
    seed = config.seed + run
    spec = config.spec(width, data.vocab_size)
    model = build_llama(spec, seed=seed, device=device)
    train_config = TrainConfig(
        steps=config.steps, batch_size=config.batch_size, lr=config.lr, warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay, seed=seed, autocast_dtype=config.autocast_dtype,
        checkpoint_dir=str(checkpoint_root(config) / f"width{width}_seed{seed}"),
        checkpoint_every=max(config.steps // 4, 1), checkpoint_steps=config.checkpoint_steps,
        progress=sys.stderr.isatty(),
    )
    base = dict(family="llama", model=f"llama-N{width}-L{config.depth}", width=width, depth=config.depth, seed=seed,
                parameters=count_parameters(model), baseline_loss=baseline_loss)
    try:
        result = train(model, data.train, train_config, description=f"N={width} seed={seed}")
    except FloatingPointError as err:  # diverged: a failed run, reported, never measured
        print(f"  N={width} seed={seed}: training diverged ({err})")
        return [], [], [], {**base, "heldout_loss": float("nan"), "trained_ok": False,
                            "final_train_loss": float("nan"), "failure": str(err)}
    model.eval()
    heldout_loss = evaluate_lm_loss(model, data.test[: config.eval_sequences], batch_size=64)
    base.update(heldout_loss=heldout_loss, trained_ok=heldout_loss < baseline_loss,
                final_train_loss=result.history[-1]["loss"] if result.history else float("nan"))
    trained_ok = base["trained_ok"]
    pools = {"train": data.train[: config.pool_size], "heldout": data.test[: config.pool_size]}
    layers = [f"model.layers.{i}" for i in range(config.depth)]
    geometry_rows, misalignment_rows = [], []
    final_grams = {}
    for step in sorted(result.checkpoints):
        load_weights(model, result.checkpoints[step])
        model.eval()
        for pool_name, sequences in pools.items():
            accumulators = accumulate_geometry(model, layers, _pool_batches(sequences, config.capture_batch),
                                               device=device)
            geometry_rows += _geometry_rows(accumulators, {**base, "step": step, "pool": pool_name},
                                            config.confidence)
            if step == config.steps:
                final_grams[pool_name] = accumulators[config.layer]
    # Misalignment at the fixed insertion point of the final model.
    heldout = final_grams["heldout"]
    heldout_geometry = heldout.result(config.confidence)
    cross = heldout.rows()  # q rows of the held-out pool, shape (n, N)
    train_rows = final_grams["train"].rows()
    for M, K in config.budgets:
        if M + K > heldout.n:
            continue
        same_law = misalignment_probability(None, C=heldout.gram(), one_pool=True, M=M, K=K,
                                            trials=config.resamples, seed=seed)
        transfer = misalignment_probability(train_rows, cross, M=M, K=K, trials=config.resamples, seed=seed)
        for setting, estimate in (("heldout/heldout", same_law), ("train/heldout", transfer)):
            misalignment_rows.append(dict(
                family=base["family"], model=base["model"], width=width, seed=seed, layer=config.layer,
                setting=setting, M=M, K=K, trials=estimate.trials, p_misalign=estimate.p_misalign,
                p_misalign_se=estimate.p_misalign_se, b_exact=heldout_geometry.b_exact(M, K),
                b_align=heldout_geometry.b_align(M, K), d_align=heldout_geometry.d_align,
                trained_ok=trained_ok,
            ))
    unit_rows = sample_unit_rows(config, model, pools["heldout"], base)
    return geometry_rows, misalignment_rows, unit_rows, base


def sample_unit_rows(config: Config, model, sequences: torch.Tensor, base: dict) -> list[dict]:
    """d_align at the insertion point for each (sample unit, context length, reduction) choice."""
    rows = []
    for context in config.unit_contexts:
        truncated = sequences[:, :context]
        full = torch.cat([
            activation_gradients(model, config.layer, {"input_ids": batch["input_ids"]}, reduction="full")
            for batch in _pool_batches(truncated, config.capture_batch)
        ])  # (n, context * N): the gradient at every position of every sequence
        n, width = full.shape[0], base["width"]
        # As many token samples as sequence samples, drawn from distinct (sequence, position) pairs.
        generator = torch.Generator().manual_seed(base["seed"])
        tokens = torch.randperm(n * context, generator=generator)[:n].to(full.device)
        per_token = full.reshape(n * context, width)[tokens]
        variants = {
            ("sequence", "shared"): full.reshape(n, context, width).sum(dim=1),
            ("sequence", "full"): full,
            ("token", "shared"): per_token,
        }
        for (unit, reduction), Q in variants.items():
            geometry = estimate_geometry(Q, confidence=config.confidence)
            rows.append(dict(
                family=base["family"], model=base["model"], width=base["width"], seed=base["seed"],
                layer=config.layer, unit=unit, context=context, reduction=reduction, n=geometry.n, d=geometry.d,
                mean_sq=geometry.mean_sq, d_par=geometry.d_par, d_2=geometry.d_2, d_align=geometry.d_align,
                d_align_lo=geometry.intervals["d_align"].lo, d_align_hi=geometry.intervals["d_align"].hi,
                trained_ok=base["trained_ok"],
            ))
    return rows


def run_summary(provenance: dict) -> pd.DataFrame:
    """One row per trained model (width, seed, parameters, losses, ``trained_ok``) from a results provenance."""
    columns = ["width", "seed", "parameters", "final_train_loss", "heldout_loss", "baseline_loss", "trained_ok"]
    return pd.DataFrame(provenance["runs"])[columns]


def trained_only(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of models that beat the bigram baseline (an empty table stays empty)."""
    return table[table.trained_ok.astype(bool)] if "trained_ok" in table else table


def describe_runs(runs: pd.DataFrame) -> str:
    """Plain-language sentences on which runs failed the bigram check and how held-out loss moves with width."""
    failed = runs[~runs.trained_ok]
    if len(failed):
        text = (f"**{len(failed)} of {len(runs)} runs failed** to beat the bigram baseline and are excluded from the "
                "figures: " + ", ".join(f"N={r.width} seed {r.seed}" for r in failed.itertuples()) + ".")
    else:
        text = f"All {len(runs)} runs beat the bigram baseline on held-out text."
    loss_by_width = runs[runs.trained_ok].groupby("width").heldout_loss.mean()
    if len(loss_by_width) > 1:
        text += " Mean held-out loss by width: " + ", ".join(f"N={w}: {v:.3f}" for w, v in loss_by_width.items())
        if loss_by_width.is_monotonic_decreasing:
            text += " nats; it falls with every increase of width."
        else:
            text += (f" nats; it is lowest at N={loss_by_width.idxmin()}: with one learning rate and step budget "
                     "shared by all widths, the widest models are not the best trained, the price of a matched budget.")
    return text


def run(config: Config, out_dir: str | Path | None = None, force: bool = False) -> Path:
    """Train every (width, seed), measure, and write the three tables to ``out_dir``.

    Skips the work when tables for this exact config already exist, unless ``force``.
    Training resumes from checkpoints after an interruption. Returns the results folder.
    """
    out_dir = Path(out_dir) if out_dir is not None else default_results_dir(config.profile)
    if not force and results_current(out_dir, TABLES, config):
        print(f"llama_width: results for config {config.config_hash()} already in {out_dir}; skipping "
              "(use force=True to rerun)")
        return out_dir
    started = time.perf_counter()
    torch.use_deterministic_algorithms(True, warn_only=True)
    corpus = load_corpus(config.corpus)
    data = prepare_lm_data(corpus, vocab_size=config.vocab_size, seq_len=config.context)
    baseline_loss = bigram_heldout_loss(data.train, data.test[: config.eval_sequences], data.vocab_size)
    print(f"llama_width: {data.summary()}; bigram held-out loss {baseline_loss:.3f} nats")
    geometry, misalignment, units, runs = [], [], [], []
    jobs = [(width, run) for width in config.widths for run in range(config.seeds)]
    for width, run in tqdm(jobs, desc="llama width runs", disable=None):
        job_start = time.perf_counter()
        g, m, u, summary = train_and_measure(config, width, run, data, baseline_loss)
        geometry += g
        misalignment += m
        units += u
        runs.append(summary)
        status = "ok" if summary["trained_ok"] else "FAILED (does not beat the bigram baseline)"
        print(f"  N={width:5d} seed={summary['seed']}: held-out loss {summary['heldout_loss']:.3f} "
              f"(bigram {baseline_loss:.3f}) {status}; {time.perf_counter() - job_start:.0f} s")
    wall = time.perf_counter() - started
    extra = dict(data=data.summary(), runs=runs, device=str(resolve_device(config.device)))
    for name, rows in zip(TABLES, (geometry, misalignment, units)):
        write_table(pd.DataFrame(rows), out_dir, name, config, wall, **extra)
    print(f"llama_width: wrote {', '.join(TABLES)} to {out_dir} in {wall:.0f} s")
    return out_dir


if __name__ == "__main__":
    from dalign_core.experiments._cli import run_cli

    run_cli(Config, run, description=__doc__.splitlines()[0])
