"""Training loop: resume after an interruption gives bitwise the same weights (tiny Llama, CPU); evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from dalign_repro.training.baselines import bigram_heldout_loss
from dalign_repro.models import LlamaWidthSpec, build_llama
from dalign_repro.training.checkpoints import list_checkpoints, load_state, load_weights
from dalign_repro.training.evaluation import evaluate_lm_loss, evaluate_loss, lm_loss
from dalign_repro.training.loop import (
    TrainConfig,
    TrainResult,
    batch_indices,
    train,
)

SPEC = LlamaWidthSpec(width=32, depth=2, head_dim=16, vocab_size=48, context=16)


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SPEC.vocab_size, (30, SPEC.context), generator=g)


def _config(tmp, **kw):
    base = dict(steps=9, batch_size=4, lr=1e-2, warmup_steps=2, checkpoint_every=3,
                checkpoint_steps=(0, 4, 9), checkpoint_dir=str(tmp), progress=False)
    base.update(kw)
    return TrainConfig(**base)


class _Interrupt(Exception):
    pass


def _interrupting(at_call: int):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise _Interrupt
        return lm_loss(model, batch)

    return loss_fn


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_resume_after_interrupt_is_bitwise_identical(tmp_path):
    data = _data()
    full = build_llama(SPEC, seed=3)
    ref = train(full, data, _config(tmp_path / "full"))

    part = build_llama(SPEC, seed=3)
    with pytest.raises(_Interrupt):  # dies during step 8 (after the resume point at 6)
        train(part, data, _config(tmp_path / "part"), loss_fn=_interrupting(8))
    assert list(list_checkpoints(tmp_path / "part", resumable=True)) == [6]
    fresh = build_llama(SPEC, seed=3)
    res = train(fresh, data, _config(tmp_path / "part"))
    assert res.resumed_from == 6
    assert _same(fresh, full)
    assert [h["loss"] for h in res.history] == [h["loss"] for h in ref.history]
    frame = res.to_frame()
    assert list(frame.columns) == ["step", "loss", "lr"] and frame.step.tolist() == list(range(1, 10))
    assert frame.loss.tolist() == [h["loss"] for h in ref.history] and frame.lr.iloc[0] == _config(tmp_path).lr_at(0)
    assert sorted(res.checkpoints) == [0, 4, 9] == sorted(ref.checkpoints)
    # the requested checkpoints hold the same weights in both runs
    for step in (0, 4, 9):
        a, b = build_llama(SPEC, seed=0), build_llama(SPEC, seed=0)
        assert _same(load_weights(a, ref.checkpoints[step]), load_weights(b, res.checkpoints[step]))
    # step 0 is the untrained model
    assert _same(load_weights(build_llama(SPEC, seed=0), ref.checkpoints[0]), build_llama(SPEC, seed=3))
    # a finished run returns at once from disk
    again = train(build_llama(SPEC, seed=3), data, _config(tmp_path / "full"))
    assert again.resumed_from == 9 and len(again.history) == 9
    state = load_state(ref.checkpoints[9])  # weights_only=True loads it
    assert state["step"] == 9 and state["samples_seen"] == 36


def test_in_memory_run_matches_and_config_mismatch_raises(tmp_path):
    data = _data()
    disk = build_llama(SPEC, seed=1)
    train(disk, data, _config(tmp_path))
    mem = build_llama(SPEC, seed=1)
    res = train(mem, data, _config(tmp_path, checkpoint_dir=None))
    assert _same(disk, mem) and sorted(res.checkpoints) == [0, 4, 9]
    with pytest.raises(ValueError, match="different training config"):
        train(build_llama(SPEC, seed=1), data, _config(tmp_path, lr=2e-2))
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(build_llama(SPEC, seed=1), data, _config(tmp_path), resume=False)


def test_schedule_and_data_order():
    cfg = TrainConfig(steps=10, lr=1.0, warmup_steps=2, min_lr_ratio=0.1)
    lrs = [cfg.lr_at(s) for s in range(10)]
    assert lrs[0] == 0.5 and lrs[1] == 1.0 and abs(lrs[-1] - (0.1 + 0.9 * 0.5 * (1 + math.cos(7 / 8 * math.pi)))) < 1e-12
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))
    # each epoch visits every example once, in a seeded order
    seen = torch.cat([batch_indices(12, 4, seed=5, step=s) for s in range(3)])
    assert sorted(seen.tolist()) == list(range(12))
    assert not torch.equal(seen, torch.cat([batch_indices(12, 4, seed=6, step=s) for s in range(3)]))


def test_training_beats_bigram_on_learnable_stream():
    # a deterministic periodic stream: a tiny model must learn it far beyond the bigram
    period = torch.tensor([3, 7, 3, 9, 3, 11, 5, 7, 5, 9])
    stream = period.repeat(200)
    seqs = stream[: (len(stream) // 16) * 16].view(-1, 16)
    train_seqs, test_seqs = seqs[:100], seqs[100:]
    model = build_llama(SPEC, seed=0)
    before = evaluate_lm_loss(model, test_seqs)
    train(model, train_seqs, TrainConfig(steps=60, batch_size=8, lr=1e-2, warmup_steps=5, progress=False))
    after = evaluate_lm_loss(model, test_seqs)
    bigram = bigram_heldout_loss(train_seqs, test_seqs, SPEC.vocab_size)
    assert after < bigram < before


def test_empty_history_frame_keeps_its_columns():
    frame = TrainResult(history=[], checkpoints={}, final_step=0).to_frame()
    assert frame.empty and list(frame.columns) == ["step", "loss", "lr"]


def test_evaluate_loss_is_the_mean_over_examples_whatever_the_batch_size():
    # A classifier on (features, labels) tuples: the loop the ResNet experiments use.
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(23, 5, generator=g), torch.randint(0, 3, (23,), generator=g)
    classifier = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))
    classifier.train()

    def cross_entropy(model, batch):
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    with torch.no_grad():
        classifier.eval()
        exact = float(torch.nn.functional.cross_entropy(classifier(x), y))  # dropout off, as in evaluation
        classifier.train()
    for batch_size in (1, 5, 23, 64):  # 5 leaves a last batch of 3
        assert evaluate_loss(classifier, (x, y), cross_entropy, batch_size=batch_size) == pytest.approx(exact, rel=1e-6)
    assert classifier.training  # the mode is restored
    # For an LM on equal-length sequences, the default lm_loss gives evaluate_lm_loss's per-token mean.
    model, data = build_llama(SPEC, seed=0), _data()
    assert evaluate_loss(model, data, batch_size=7) == pytest.approx(evaluate_lm_loss(model, data), rel=1e-5)


def test_autocast_trains_and_evaluates_and_a_bad_dtype_is_named():
    data = _data()
    model = build_llama(SPEC, seed=0)
    res = train(model, data, TrainConfig(steps=2, batch_size=4, autocast_dtype="bfloat16", progress=False))
    assert all(math.isfinite(h["loss"]) for h in res.history)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast computes in bf16, keeps fp32 weights
    full = evaluate_lm_loss(model, data)
    assert evaluate_lm_loss(model, data, autocast_dtype="bfloat16") == pytest.approx(full, rel=0.05)
    with pytest.raises(ValueError, match="'bfloat' is not a torch dtype"):
        train(build_llama(SPEC, seed=0), data, TrainConfig(steps=1, autocast_dtype="bfloat", progress=False))


def test_deterministic_kernels_are_set_without_loading_the_compiler():
    """``deterministic_algorithms`` turns on torch's deterministic mode, warning only, as the public call does,
    without importing ``torch._inductor`` (a second of every process that trains), in a fresh process."""
    import subprocess
    import sys

    probe = ("import sys, torch\nfrom dalign_core.seeding import deterministic_algorithms\n"
             "assert not torch.are_deterministic_algorithms_enabled()\ndeterministic_algorithms()\n"
             "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
             " 'torch._inductor.config' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False"]
