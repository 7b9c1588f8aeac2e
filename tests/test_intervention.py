"""Residual interventions: first order holds at small steps, curvature after, and the model is left bit for bit."""

import math

import pytest
import torch

from dalign_repro.studies.interventions import compute as intervention
from dalign_core.capture.hooks import activation_gradients
from dalign_core.capture.refusals import CaptureError
from dalign_repro.studies.interventions.compute import residual_block_step, shared_bias_step, train_decrease_steps
from dalign_repro.models.llama import LlamaWidthSpec, build_llama
from dalign_repro.models.resnet import resnet20

SPEC = LlamaWidthSpec(width=32, depth=2, head_dim=16, vocab_size=64, context=12)


def _lm(dtype=torch.float64):
    # transformers' RMSNorm computes in float32 whatever the model's dtype, so a loss difference below about 1e-8
    # is roundoff: the steps below are sized to stay above it.
    model = build_llama(SPEC, seed=0).to(dtype).eval()
    ids = torch.randint(0, SPEC.vocab_size, (24, SPEC.context), generator=torch.Generator().manual_seed(1))
    train = [{"input_ids": ids[:8]}, {"input_ids": ids[8:12]}]
    heldout = [{"input_ids": ids[12:24]}]
    return model, train, heldout


def _snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, model.training,
            [(n, dict(m._forward_hooks)) for n, m in model.named_modules()])


def _unchanged(model, snapshot):
    state, training, hooks = snapshot
    now = model.state_dict()
    assert now.keys() == state.keys() and all(torch.equal(now[k], state[k]) for k in state)
    assert model.training == training
    assert [(n, dict(m._forward_hooks)) for n, m in model.named_modules()] == hooks
    assert all(p.grad is None for p in model.parameters())


def test_bias_alignment_is_the_mean_q_inner_product_and_first_order_holds():
    model, train, heldout = _lm()
    before = _snapshot(model)
    steps = shared_bias_step(model, "model.layers.0", train, heldout, etas=(1e-4, 1e-3, 1.0))
    _unchanged(model, before)
    mu = torch.cat([activation_gradients(model, "model.layers.0", b) for b in train]).mean(0)
    g = torch.cat([activation_gradients(model, "model.layers.0", b) for b in heldout]).mean(0)
    assert steps[0].alignment == pytest.approx(float(mu.double() @ g.double()), rel=1e-5)
    assert steps[0].retention == pytest.approx(1.0, abs=5e-3)
    # second order: observed = predicted + (1/2) eta^2 u'Hu + O(eta^3)
    middle = steps[1]
    assert middle.observed - middle.predicted == pytest.approx(middle.second_order, rel=0.05)
    assert abs(steps[2].retention - 1) > 0.5  # at a large step curvature has taken over
    assert [s.eta for s in steps] == [1e-4, 1e-3, 1.0] and {s.kind for s in steps} == {"bias"}


def test_block_first_order_holds_over_a_wide_range_of_steps():
    model, train, heldout = _lm()
    before = _snapshot(model)
    steps = residual_block_step(model, "model.layers.1", train, heldout, etas=(0.1, 1.0), seed=3)
    _unchanged(model, before)
    assert steps[0].retention == pytest.approx(1.0, abs=5e-3) and steps[1].retention == pytest.approx(1.0, abs=5e-3)
    assert steps[1].predicted == pytest.approx(10 * steps[0].predicted)
    again = residual_block_step(model, "model.layers.1", train, heldout, etas=(0.1,), seed=3)
    assert again[0].alignment == steps[0].alignment  # W1 is drawn from the seed alone


def test_convolutional_insertion_in_eval_mode():
    model = resnet20(0.25, num_classes=4).double().eval()
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(12, 3, 32, 32, generator=g, dtype=torch.float64), torch.arange(12) % 4
    train, heldout = [(images[:6], labels[:6])], [(images[6:], labels[6:])]
    before = _snapshot(model)
    bias = shared_bias_step(model, "layer2.2", train, heldout, etas=(1e-5,))
    block = residual_block_step(model, "layer2.2", train, heldout, etas=(1e-5,))
    _unchanged(model, before)
    assert bias[0].retention == pytest.approx(1.0, abs=1e-3) and block[0].retention == pytest.approx(1.0, abs=1e-3)


def test_refusals_and_an_error_midway_leave_the_model_as_it_was():
    model = resnet20(0.25, num_classes=4).train()  # BatchNorm in training mode couples the examples
    batch = [(torch.randn(4, 3, 32, 32), torch.arange(4))]
    with pytest.raises(CaptureError):
        shared_bias_step(model, "layer1.0", batch, batch, etas=(0.1,))
    model.eval()
    with pytest.raises(Exception, match="layer9"):
        shared_bias_step(model, "layer9.0", batch, batch, etas=(0.1,))
    before = _snapshot(model)
    bad = [(torch.randn(4, 3, 32, 32), torch.arange(4)), (torch.randn(4, 3, 32, 32), torch.arange(5))]
    with pytest.raises(Exception):
        residual_block_step(model, "layer1.0", bad, batch, etas=(0.1,))
    _unchanged(model, before)


def _evaluation():
    ids = torch.randint(0, SPEC.vocab_size, (16, SPEC.context), generator=torch.Generator().manual_seed(7))
    return [{"input_ids": ids[:10]}, {"input_ids": ids[10:]}]


def test_optimizer_steps_train_the_insertion_alone_and_restore_the_model_bit_for_bit():
    model, train, heldout = _lm(torch.float32)
    evaluation = _evaluation()
    before = _snapshot(model)
    steps = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-2,), eval_batches=evaluation,
                                 optimizer_steps=(1, 10, 100), optimizer_decrease=1e-2, curvature=False)
    _unchanged(model, before)
    for kind in ("bias", "block"):
        single, one, ten, hundred = [s for s in steps if s.kind == kind]
        assert [s.optimizer_steps for s in (single, one, ten, hundred)] == [0, 1, 10, 100]
        # one optimizer step is the single step of the same δ
        assert one.eta == single.eta and one.observed == single.observed and one.eval_observed == single.eval_observed
        assert {s.eval_n for s in (single, one, ten, hundred)} == {16}
        assert ten.eval_observed != one.eval_observed and hundred.eval_observed != ten.eval_observed
    # gradient descent on the M examples: their own loss keeps falling (the parameter really is trained)
    train_losses = []
    for n in (1, 10, 100):
        (_, row) = [s for s in train_decrease_steps(model, "model.layers.0", train, train, (1e-2,), kinds=("bias",),
                                                    optimizer_steps=(n,), curvature=False)]
        train_losses.append(row.observed)
    assert train_losses[0] > train_losses[1] > train_losses[2] and train_losses[0] < 0
    _unchanged(model, before)


def test_eval_observed_is_measured_on_the_evaluation_set():
    model, train, heldout = _lm()
    on_k = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-3,), eval_batches=heldout,
                                curvature=False)
    assert all(s.eval_observed == s.observed and s.eval_n == 12 for s in on_k)  # E = K: the same number
    on_e = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-3,), eval_batches=_evaluation(),
                                curvature=False)
    assert all(s.eval_observed != s.observed and s.eval_n == 16 for s in on_e)
    # first order on E is E's own gradient: −η⟨G_M, G_E⟩
    assert all(s.eval_observed == pytest.approx(s.eval_predicted, rel=0.05) for s in on_e)
    plain = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-3,), curvature=False)
    assert all(math.isnan(s.eval_observed) and s.eval_n == 0 for s in plain)


def test_changes_within_float32_roundoff_are_resolved_in_float64(monkeypatch):
    model, train, heldout = _lm(torch.float32)
    evaluation = _evaluation()
    before = _snapshot(model)
    plain = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-2,), eval_batches=evaluation,
                                 curvature=False)
    assert not any(s.eval_float64 for s in plain)
    monkeypatch.setattr(intervention, "ROUNDOFF_FLOAT32", 1.0)  # every change counts as within roundoff
    resolved = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-2,), eval_batches=evaluation,
                                    curvature=False)
    _unchanged(model, before)
    assert all(s.eval_float64 and not s.eval_tie for s in resolved)
    for a, b in zip(plain, resolved):
        assert b.eval_observed == pytest.approx(a.eval_observed, abs=1e-5) and b.eval_observed != a.eval_observed
    monkeypatch.setattr(intervention, "ROUNDOFF_FLOAT64", 1.0)  # and even in float64: a tie
    tied = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-2,), eval_batches=evaluation,
                                curvature=False)
    assert all(s.eval_tie for s in tied)


def test_steps_stated_against_training_are_fractions_of_one_optimizer_step():
    """δ = fraction × (first-order decrease of one optimizer step): AdamW's first step on a new parameter moves every
    coordinate by lr (lr ‖G_M‖₁), SGD's by lr G_M (lr ‖G_M‖²); the rows carry the fraction, the grid rows NaN."""
    model, train, heldout = _lm()
    before = _snapshot(model)
    lr = 1e-3
    steps = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-4,), kinds=("bias",), curvature=False,
                                 eval_batches=heldout, step_fractions=(0.1, 1.0),
                                 step_scale=intervention.optimizer_step_decrease("adamw", lr))
    _unchanged(model, before)
    grid, tenth, whole = steps
    assert math.isnan(grid.step_fraction) and (tenth.step_fraction, whole.step_fraction) == (0.1, 1.0)
    mu = torch.cat([activation_gradients(model, "model.layers.0", b) for b in train]).mean(0).double()
    assert whole.train_decrease == pytest.approx(lr * float(mu.abs().sum()), rel=1e-4)
    assert tenth.train_decrease == pytest.approx(0.1 * whole.train_decrease)
    assert whole.eta == pytest.approx(whole.train_decrease / float(mu @ mu), rel=1e-4)
    assert math.isfinite(whole.eval_observed) and whole.eval_n == 12
    sgd = intervention.optimizer_step_decrease("sgd", 0.1)
    assert sgd(torch.tensor([3.0, 4.0], dtype=torch.float64)) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="step_scale"):
        train_decrease_steps(model, "model.layers.0", train, heldout, (1e-4,), step_fractions=(0.1,))
    with pytest.raises(ValueError, match="optimizer"):
        intervention.optimizer_step_decrease("lion", 0.1)


def test_only_the_chosen_grid_steps_are_measured_on_the_evaluation_set():
    """``eval_decreases`` picks the grid's δ measured on E (the others' ΔL_E is NaN); every step fraction is measured,
    the measured rows equal those of a run that measures every δ, and a δ off the grid is refused; ``eval_kinds``
    likewise picks the kinds."""
    model, train, heldout = _lm()
    common = dict(kinds=("bias",), curvature=False, eval_batches=heldout, step_fractions=(0.3,),
                  step_scale=intervention.optimizer_step_decrease("adamw", 1e-3))
    every = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-4, 1e-2), **common)
    chosen = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-4, 1e-2), eval_decreases=(1e-2,),
                                  **common)
    assert math.isnan(chosen[0].eval_observed) and chosen[0].observed == every[0].observed
    assert chosen[1].eval_observed == every[1].eval_observed and math.isfinite(chosen[1].eval_observed)
    assert chosen[2].eval_observed == every[2].eval_observed and chosen[2].step_fraction == 0.3
    with pytest.raises(ValueError, match="eval_decreases"):
        train_decrease_steps(model, "model.layers.0", train, heldout, (1e-4,), eval_decreases=(1e-3,), **common)
    both = dict(common, kinds=("bias", "block"))
    bias_only = train_decrease_steps(model, "model.layers.0", train, heldout, (1e-2,), eval_kinds=("bias",), **both)
    assert [s.kind for s in bias_only] == ["bias", "bias", "block", "block"]
    assert all(math.isfinite(s.eval_observed) for s in bias_only[:2])
    assert all(math.isnan(s.eval_observed) for s in bias_only[2:])
    with pytest.raises(ValueError, match="eval_kinds"):
        train_decrease_steps(model, "model.layers.0", train, heldout, (1e-4,), eval_kinds=("gate",), **common)
