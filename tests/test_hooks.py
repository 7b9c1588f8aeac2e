"""dalign_core.capture: one-pass capture equals brute-force per-example autograd; refusals; model left unchanged."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from torch import nn

import _capture_reference as reference
from _autograd import z_gradient
from _capture_reference import VOCAB

from dalign_core.geometry.estimators import estimate_geometry
from dalign_core.capture.hooks import accumulate_geometry, activation_gradients, iter_activation_gradients
from dalign_core.capture.layers import insertion_points
from dalign_core.capture.refusals import CaptureError
from dalign_repro.models.resnet import BasicBlock, residual_block_names

transformers = pytest.importorskip("transformers")

# The same models and batches as the capture's bit-for-bit reference (tests/_capture_reference.py).
tiny_neox = reference.neox
tiny_resnet = reference.resnet


def tiny_llama(seed: int = 0):
    """The reference's two-layer Llama of width 32."""
    return reference.llama(seed)


def lm_batch(seed: int = 1, b: int = 5, T: int = 12):
    """The reference's right-padded batch (padding id 0) and each example's length."""
    batch = reference.lm_batch(seed, b, T)
    return batch, batch["attention_mask"].sum(dim=1).tolist()


def _brute_force(model, layer, make_input, loss_of) -> torch.Tensor:
    """∂ℓ/∂z for one example alone, by plain autograd on a copy of the model (independent of dalign_core)."""
    return z_gradient(model, layer, lambda m: m(make_input()), loss_of)


def _lm_loss(output, ids):
    logits = output.logits[0, :-1]
    return F.cross_entropy(logits.float(), ids[0, 1:])  # mean over the example's own next tokens


def _reduce(z_grad, reduction, channels_first=False):
    if reduction == "full":
        return z_grad.reshape(-1)
    return z_grad.sum(dim=(1, 2)) if channels_first else z_grad.sum(dim=0)


def snapshot(model):
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "modes": {n: m.training for n, m in model.named_modules()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
    }


def assert_unchanged(model, before):
    after = snapshot(model)
    assert after["modes"] == before["modes"]
    assert after["requires_grad"] == before["requires_grad"]
    assert before["state"].keys() == after["state"].keys()
    for key, value in before["state"].items():
        torch.testing.assert_close(after["state"][key], value, rtol=0, atol=0, equal_nan=True, msg=key)
    for key, value in before["grads"].items():
        assert (value is None) == (after["grads"][key] is None), key
        if value is not None:
            assert torch.equal(value, after["grads"][key]), key
    for name, module in model.named_modules():
        assert not module._forward_hooks, name
        assert not module._forward_pre_hooks, name
        assert not module._backward_hooks, name


@pytest.mark.parametrize("factory,layer", [(tiny_llama, "model.layers.0"), (tiny_neox, "gpt_neox.layers.1")])
@pytest.mark.parametrize("reduction", ["shared", "full"])
def test_lm_capture_matches_per_example_autograd(factory, layer, reduction):
    model = factory()
    head = model.get_output_embeddings().weight
    head.grad = torch.full_like(head, 0.5)  # an existing parameter gradient must survive untouched
    before = snapshot(model)
    batch, lengths = lm_batch()
    q = activation_gradients(model, layer, batch, reduction=reduction)
    T, N = batch["input_ids"].shape[1], model.config.hidden_size
    assert q.shape == (len(lengths), N if reduction == "shared" else T * N)
    for i, length in enumerate(lengths):
        ids = batch["input_ids"][i:i + 1, :length]
        expected = _reduce(_brute_force(model, layer, lambda: ids, lambda out: _lm_loss(out, ids)), reduction)
        if reduction == "full":  # padded positions get exactly zero gradient
            assert torch.all(q[i, length * N:] == 0)
            got = q[i, :length * N]
        else:
            got = q[i]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
        assert expected.abs().max() > 0
    assert_unchanged(model, before)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("reduction", ["shared", "full"])
def test_resnet_capture_matches_per_example_autograd(reduction, channels_last):
    """Also in NHWC memory order, whose gradients are strided differently: q is in logical (C, H, W) order."""
    model = tiny_resnet(channels_last=channels_last)
    before = snapshot(model)
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(4, 3, 16, 16, generator=generator)
    labels = torch.tensor([0, 3, 7, 3])
    layer = "layer2.1"
    q = activation_gradients(model, layer, images, labels, reduction=reduction)
    assert q.shape == (4, 32 if reduction == "shared" else 32 * 8 * 8)
    for i in range(4):
        expected = _brute_force(
            model, layer, lambda: images[i:i + 1], lambda out: F.cross_entropy(out, labels[i:i + 1])
        )
        torch.testing.assert_close(q[i], _reduce(expected, reduction, channels_first=True), rtol=1e-4, atol=1e-6)
    assert_unchanged(model, before)


def test_explicit_lm_targets_and_tuple_batches():
    model = tiny_llama()
    batch, _ = lm_batch(b=4)  # every example keeps scored tokens after the first 4
    labels = batch["input_ids"].clone()
    labels[:, :4] = -100  # only score the later tokens
    q = activation_gradients(model, "model.layers.1", batch, labels)
    ids = batch["input_ids"][:1]

    def loss(out):
        return F.cross_entropy(out.logits[0, :-1], labels[0, 1:], ignore_index=-100)

    expected = _brute_force(model, "model.layers.1", lambda: ids, loss).sum(dim=0)
    torch.testing.assert_close(q[0], expected, rtol=1e-4, atol=1e-6)
    # the iterator form accepts (inputs, targets) pairs and agrees with the one-shot form
    rows = list(iter_activation_gradients(model, "model.layers.1", [(batch, labels)]))
    torch.testing.assert_close(rows[0], q)


def test_several_layers_in_one_pass_and_streaming_geometry():
    model = tiny_llama()
    batches = [lm_batch(seed=s, b=4)[0] for s in range(3)]
    for b in batches:
        b["attention_mask"][:] = 1
    together = [activation_gradients(model, "all", b) for b in batches]
    assert list(together[0]) == insertion_points(model) == ["model.layers.0", "model.layers.1"]
    single = torch.cat([activation_gradients(model, "model.layers.1", b) for b in batches])
    torch.testing.assert_close(torch.cat([t["model.layers.1"] for t in together]), single)
    accumulators = accumulate_geometry(model, "all", batches, examples=10)
    assert set(accumulators) == {"model.layers.0", "model.layers.1"}
    acc = accumulators["model.layers.1"]
    assert acc.n == 10
    streamed, direct = acc.result(), estimate_geometry(single[:10])
    assert streamed.d_align == pytest.approx(direct.d_align, rel=1e-6)
    assert streamed.mean_sq == pytest.approx(direct.mean_sq, rel=1e-6)
    one = accumulate_geometry(model, "model.layers.0", iter(batches))
    assert one.n == 12


def test_several_reductions_from_one_backward_pass_match_separate_captures():
    """reduction=[...] gives each reduction's accumulators bit for bit as separate calls, from one pass per batch."""
    model = tiny_llama()
    batches = [lm_batch(seed=s, b=4)[0] for s in range(3)]
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    together = accumulate_geometry(model, "all", batches, reduction=["full", "shared"], check_determinism=False)
    assert len(calls) == len(batches)  # one forward per batch for both reductions
    handle.remove()
    assert list(together) == ["full", "shared"]
    for reduction, by_layer in together.items():
        alone = accumulate_geometry(model, "all", batches, reduction=reduction)
        for name, accumulator in by_layer.items():
            assert torch.equal(accumulator.gram(), alone[name].gram())
            assert accumulator.result().d_align == alone[name].result().d_align
    one_layer = accumulate_geometry(model, "model.layers.1", batches, reduction=("shared", "full"), examples=10)
    assert list(one_layer) == ["shared", "full"] and one_layer["full"].n == 10
    with pytest.raises(ValueError, match=r"reduction must be one of .* list of distinct ones"):
        accumulate_geometry(model, "all", batches, reduction=["full", "full"])
    with pytest.raises(ValueError, match=r"reduction must be one of"):
        accumulate_geometry(model, "all", batches, reduction=["full", "mean"])


@pytest.mark.parametrize("family", ["pythia", "resnet"])
def test_one_capture_for_both_sweep_reductions_is_bit_identical_to_one_per_reduction(family):
    """The sweep's families with two reductions (Pythia and ResNet-20, ``("full", "shared")``): one capture pass per
    batch for both gives each reduction's accumulated rows and Gram bit for bit as a capture per reduction (the old
    sweep), with the determinism check on the first batch as at the sweep's first capture of a model."""
    if family == "pythia":
        model = _small_pythia()
        batches = [lm_batch(seed=s, b=4)[0] for s in range(3)]
    else:
        model = tiny_resnet()
        generator = torch.Generator().manual_seed(7)
        batches = [(torch.randn(4, 3, 16, 16, generator=generator), torch.randint(0, 10, (4,), generator=generator))
                   for _ in range(3)]
    reductions = ("full", "shared")
    sizes = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: sizes.append(
        (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[0]), with_kwargs=True)
    together = accumulate_geometry(model, "all", batches, reduction=list(reductions))
    handle.remove()
    assert sizes == [4, 1, 4, 4]  # one pass per batch for both reductions, and example 0 once for the check
    assert list(together) == list(reductions)
    for reduction in reductions:
        alone = accumulate_geometry(model, "all", batches, reduction=reduction)
        assert list(together[reduction]) == list(alone) and len(alone) >= 2
        for name, accumulator in together[reduction].items():
            assert accumulator.n == alone[name].n == 12
            assert torch.equal(accumulator.rows(), alone[name].rows()), (reduction, name)
            assert torch.equal(accumulator.gram(), alone[name].gram()), (reduction, name)
            assert accumulator.result().to_row() == alone[name].result().to_row()


def test_resnet_blocks_are_insertion_points():
    model = tiny_resnet()
    assert insertion_points(model) == residual_block_names(model)
    assert all(isinstance(dict(model.named_modules())[n], BasicBlock) for n in insertion_points(model))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(0.27e6, rel=0.01)


def test_frozen_parameters_still_work():
    model = tiny_llama()
    for p in model.parameters():
        p.requires_grad_(False)
    before = snapshot(model)
    batch, _ = lm_batch()
    reference = activation_gradients(tiny_llama(), "model.layers.0", batch)
    torch.testing.assert_close(activation_gradients(model, "model.layers.0", batch), reference)
    assert_unchanged(model, before)


# ---------------------------------------------------------------------------
# Refusals, each leaving the model exactly as it was


def _expect_refusal(model, layer, inputs, targets=None, match=""):
    before = snapshot(model)
    with pytest.raises(CaptureError, match=match):
        activation_gradients(model, layer, inputs, targets)
    assert_unchanged(model, before)


def test_refuses_batchnorm_in_training_mode():
    model = tiny_resnet().train()
    _expect_refusal(model, "layer1.0", torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long), match="BatchNorm")
    model = tiny_resnet()
    model.layer1[0].bn1.track_running_stats = False
    model.layer1[0].bn1.running_mean = None
    model.layer1[0].bn1.running_var = None
    _expect_refusal(model, "layer1.0", torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long),
                    match="running statistics")


def test_refuses_active_dropout():
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.ReLU(), nn.Linear(8, 3)).train()
    _expect_refusal(model, "0", torch.randn(5, 6), torch.zeros(5, dtype=torch.long), match="dropout")
    # p = 0 in training mode is fine: nothing random happens
    model[1].p = 0.0
    assert activation_gradients(model, "0", torch.randn(5, 6), torch.zeros(5, dtype=torch.long)).shape == (5, 8)


def test_refuses_transformers_attention_dropout_in_training_mode():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, attention_dropout=0.1,
    )
    model = transformers.LlamaForCausalLM(config).train()
    batch, _ = lm_batch()
    _expect_refusal(model, "model.layers.0", batch, match="attention dropout")
    model.eval()  # in eval mode the attention dropout is off
    assert activation_gradients(model, "model.layers.0", batch).shape == (5, 32)


def test_refuses_unknown_layer_with_nearest_names():
    model = tiny_llama()
    batch, _ = lm_batch()
    _expect_refusal(model, "model.layer.1", batch, match=r"nearest names: model\.layers\.1")


def test_refuses_non_finite_loss():
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    batch, _ = lm_batch()
    _expect_refusal(model, "model.layers.0", batch, match="non-finite loss")


def test_refuses_examples_without_target_tokens_and_shared_modules():
    model = tiny_llama()
    batch, _ = lm_batch()
    batch["attention_mask"][2, 1:] = 0
    _expect_refusal(model, "model.layers.0", batch, match="no target token")
    shared = nn.Linear(4, 4)
    looped = nn.Sequential(shared, nn.ReLU(), shared)
    _expect_refusal(looped, "0", torch.randn(4, 4), torch.zeros(4, dtype=torch.long), match="ran 2 times")


def test_iterator_leaves_no_hooks_when_abandoned():
    model = tiny_llama()
    batch, _ = lm_batch()
    before = snapshot(model)
    iterator = iter_activation_gradients(model, "model.layers.0", [batch, batch, batch])
    next(iterator)
    assert_unchanged(model, before)  # between batches nothing is attached
    del iterator
    assert_unchanged(model, before)


def test_layer_returning_a_tuple():
    class TupleBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(6, 6)

        def forward(self, x):
            return x + torch.tanh(self.linear(x)), None  # hidden states first, as older decoder layers do

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = TupleBlock()
            self.head = nn.Linear(6, 3)

        def forward(self, x):
            return self.head(self.block(x)[0])

    torch.manual_seed(0)
    model = Net().eval()
    x, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 1, 0])
    q = activation_gradients(model, "block", x, y)
    for i in range(5):
        expected = _brute_force(model, "block", lambda: x[i:i + 1], lambda out: F.cross_entropy(out, y[i:i + 1]))
        torch.testing.assert_close(q[i], expected)


# ---------------------------------------------------------------------------
# Labels in the batch, precision, and arguments of the wrong type


def test_labels_in_the_batch_are_honoured_like_transformers_labels():
    model = tiny_llama()
    batch, _ = lm_batch(b=4)
    labels = batch["input_ids"].clone()
    labels[:, :4] = -100  # score only the later tokens
    plain = activation_gradients(model, "model.layers.1", batch)
    with_labels = activation_gradients(model, "model.layers.1", {**batch, "labels": labels})
    assert not torch.allclose(with_labels, plain, rtol=1e-3, atol=1e-6)  # the mask changes the loss, hence q
    torch.testing.assert_close(with_labels, activation_gradients(model, "model.layers.1", batch, labels))
    ids = batch["input_ids"][:1]

    def loss(out):
        return F.cross_entropy(out.logits[0, :-1], labels[0, 1:], ignore_index=-100)

    expected = _brute_force(model, "model.layers.1", lambda: ids, loss).sum(dim=0)
    torch.testing.assert_close(with_labels[0], expected, rtol=1e-4, atol=1e-6)
    # the streaming forms read them too
    acc = accumulate_geometry(model, "model.layers.1", [{**batch, "labels": labels}])
    torch.testing.assert_close(acc.result().mean_sq, estimate_geometry(with_labels).mean_sq)
    # labels given twice are ambiguous
    before = snapshot(model)
    with pytest.raises(ValueError, match="labels one way only"):
        activation_gradients(model, "model.layers.1", {**batch, "labels": labels}, labels)
    assert_unchanged(model, before)


def test_float64_model_keeps_float64_precision():
    model = tiny_llama().double()
    batch, _ = lm_batch(b=3)
    batch["attention_mask"][:] = 1
    q = activation_gradients(model, "model.layers.0", batch)
    assert q.dtype == torch.float64
    ids = batch["input_ids"][:1]

    def loss(out):
        return F.cross_entropy(out.logits[0, :-1], ids[0, 1:])  # float64 throughout

    expected = _brute_force(model, "model.layers.0", lambda: ids, loss).sum(dim=0)
    torch.testing.assert_close(q[0], expected, rtol=1e-10, atol=1e-13)  # a float32 loss would miss by ~1e-7


@pytest.mark.parametrize("layer,match", [
    (3, r"layer must be a submodule name.*got 3 \(int\)"),
    ([3], r"layer must be a submodule name.*list of int"),
    (None, r"layer must be a submodule name"),
])
def test_layer_of_the_wrong_type_is_a_value_error(layer, match):
    model = tiny_llama()
    batch, _ = lm_batch()
    before = snapshot(model)
    for call in (lambda: activation_gradients(model, layer, batch),
                 lambda: accumulate_geometry(model, layer, [batch])):
        with pytest.raises(ValueError, match=match):
            call()
    assert_unchanged(model, before)


@pytest.mark.parametrize("make_inputs,match", [
    (lambda b: {**b, "input_ids": b["input_ids"].float()}, r"input_ids must be an integer tensor.*float32"),
    (lambda b: b["input_ids"].float(), r"must be an integer tensor.*float32"),
    (lambda b: {**b, "input_ids": b["input_ids"].tolist()}, r"input_ids must be an integer tensor.*list of list"),
    (lambda b: b["input_ids"].tolist(), r"inputs must be a tensor or a mapping"),
    (lambda b: {**b, "input_ids": b["input_ids"] + VOCAB}, rf"token id \d+, outside the model's embedding of {VOCAB}"),
    (lambda b: {**b, "labels": b["input_ids"].float()}, r"labels\) must be an integer tensor"),
])
def test_inputs_of_the_wrong_type_are_refused_at_the_boundary(make_inputs, match):
    model = tiny_llama()
    batch, _ = lm_batch()
    before = snapshot(model)
    with pytest.raises(ValueError, match=match):
        activation_gradients(model, "model.layers.0", make_inputs(batch))
    with pytest.raises(ValueError, match=match):
        accumulate_geometry(model, "model.layers.0", [make_inputs(batch)])
    assert_unchanged(model, before)


def test_accumulate_geometry_arguments_are_checked():
    model = tiny_llama()
    batch, _ = lm_batch()
    with pytest.raises(ValueError, match=r"batches must be an iterable of batches.*\[batch\]"):
        accumulate_geometry(model, "model.layers.0", batch)  # one batch, not a list of batches
    with pytest.raises(ValueError, match=r"batches must be an iterable.*int64 tensor of shape \(5, 12\)"):
        accumulate_geometry(model, "model.layers.0", batch["input_ids"])
    with pytest.raises(ValueError, match=r"examples must be a positive int.*2.5"):
        accumulate_geometry(model, "model.layers.0", [batch], examples=2.5)
    with pytest.raises(ValueError, match=r"sketch_dim must be a positive int"):
        accumulate_geometry(model, "model.layers.0", [batch], sketch_dim="8")
    with pytest.raises(ValueError, match=r"reduction must be one of"):
        activation_gradients(model, "model.layers.0", batch, reduction="mean")
    with pytest.raises(ValueError, match=r"model must be a torch.nn.Module"):
        activation_gradients(model.state_dict(), "model.layers.0", batch)


# ---------------------------------------------------------------------------
# The causal-LM loss shifts the labels, not the logits: q bit for bit as before, without the logits' copy


def _legacy_per_example_loss(output, inputs, targets=None, task="auto"):
    """The causal-LM loss as it was before (cross-entropy on a copy of ``logits[:, :-1]``), the reference."""
    from dalign_core.capture import losses

    logits = losses.logits_of(output)
    if logits.ndim != 3 or task == "classification":
        return losses.per_example_loss(output, inputs, targets, task)
    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    labels = (inputs["input_ids"] if isinstance(inputs, dict) else inputs) if targets is None else targets
    labels = labels.clone()
    if mask is not None:
        labels = labels.masked_fill(mask == 0, losses.IGNORE_INDEX)
    shift_labels = labels[:, 1:]
    token_loss = F.cross_entropy(
        losses._at_least_float32(logits[:, :-1].flatten(0, 1)), shift_labels.flatten(),
        ignore_index=losses.IGNORE_INDEX, reduction="none",
    ).view(shift_labels.shape)
    return token_loss.sum(dim=1) / (shift_labels != losses.IGNORE_INDEX).sum(dim=1)


def _small_llama(dtype=torch.float32):
    from dalign_repro.models.llama import build_llama

    return build_llama(32, depth=2, head_dim=8, vocab_size=VOCAB, context=64, seed=3, dtype=dtype).eval()


def _small_pythia():
    from dalign_repro.models.pythia import build_pythia, pythia_width_variant

    config = pythia_width_variant("pythia-70m", 32, vocab_size=VOCAB, num_heads=4, context=64, num_layers=2)
    return build_pythia(config, seed=3).eval()


@pytest.mark.parametrize("factory,dtype", [(_small_llama, torch.float32), (_small_llama, torch.bfloat16),
                                           (_small_pythia, torch.float32)])
def test_causal_lm_capture_is_bit_identical_to_the_sliced_logits_loss(monkeypatch, factory, dtype):
    from dalign_core.capture import gradients, losses

    model = factory() if factory is _small_pythia else factory(dtype)
    batch, _ = lm_batch(b=4, T=12)  # right padding: lengths 12, 9, 5, 12
    labels = batch["input_ids"].clone()
    labels[:, :3] = -100
    layers = ["all", "all"]
    cases = [(batch, None), (batch, labels)]
    new = [activation_gradients(model, layer, b, t, reduction=r) for (b, t), layer in zip(cases, layers)
           for r in ("shared", "full")]
    output = model(**batch)
    new_loss = losses.per_example_loss(output, batch, labels)
    monkeypatch.setattr(gradients, "per_example_loss", _legacy_per_example_loss)
    old = [activation_gradients(model, layer, b, t, reduction=r) for (b, t), layer in zip(cases, layers)
           for r in ("shared", "full")]
    assert torch.equal(new_loss, _legacy_per_example_loss(output, batch, labels))
    for got, expected in zip(new, old):
        for name in expected:
            assert torch.equal(got[name], expected[name]), name
    monkeypatch.undo()
    acc_new = accumulate_geometry(model, "model.layers.1" if factory is _small_llama else "gpt_neox.layers.1", [batch])
    monkeypatch.setattr(gradients, "per_example_loss", _legacy_per_example_loss)
    acc_old = accumulate_geometry(model, "model.layers.1" if factory is _small_llama else "gpt_neox.layers.1", [batch])
    assert torch.equal(acc_new.gram(), acc_old.gram())


def test_causal_lm_loss_takes_no_slice_of_the_logits():
    model = _small_llama()
    batch, _ = lm_batch()
    from dalign_core.capture.losses import per_example_loss

    output = model(**batch)
    loss = per_example_loss(output, batch)
    # walk the graph from the loss down to the logits: no slicing or copying node stands on the logits
    logits_node = output.logits.grad_fn
    seen, stack, parents_of_logits = set(), [loss.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for parent, _ in node.next_functions:
            if parent is logits_node:
                parents_of_logits.append(type(node).__name__)
            elif parent is not None and parent is not logits_node:
                stack.append(parent)
    assert parents_of_logits and not any("Slice" in n or "Copy" in n or "Clone" in n for n in parents_of_logits), \
        parents_of_logits


# ---------------------------------------------------------------------------
# Capture refuses what the graph shows it cannot do right


class _Head(nn.Module):
    """``head(post(block(x)))`` with a configurable step between the block and the head."""

    def __init__(self, post):
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)
        self.post = post

    def forward(self, x):
        return self.head(self.post(self, self.block(x)))


def _xy(b=5):
    generator = torch.Generator().manual_seed(4)
    return torch.randn(b, 6, generator=generator), torch.tensor([0, 1, 2, 1, 0, 2, 2, 1][:b])


def test_refuses_an_in_place_operation_after_the_insertion_point():
    x, y = _xy()
    model = _Head(lambda self, h: F.relu(h, inplace=True)).eval()
    _expect_refusal(model, "block", x, y, match=r"in-place operation modified the output of 'block' after it was "
                                                  r"produced.*capture at another layer.*replace the in-place")
    model.post = lambda self, h: F.relu(h)  # the same model without the in-place op is fine
    assert activation_gradients(model, "block", x, y).abs().max() > 0
    # frozen parameters: the hook's leaf z cannot be modified in place; the error says why all the same
    model = _Head(lambda self, h: h.mul_(2)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    _expect_refusal(model, "block", x, y, match=r"in-place operation modified the output of 'block'")
    # iterator and streaming forms refuse too
    with pytest.raises(CaptureError, match="in-place"):
        accumulate_geometry(_Head(lambda self, h: h.add_(1)).eval(), "block", [(x, y)])


def test_refuses_torchvision_resnet18_at_a_batchnorm_followed_by_an_in_place_relu():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4).eval()
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 3])
    _expect_refusal(model, "layer1.0.bn1", images, labels,
                    match=r"in-place operation modified the output of 'layer1\.0\.bn1'")
    assert activation_gradients(model, "layer1.0", images, labels).shape == (2, 64)  # a block output is fine


@pytest.mark.parametrize("post,match", [
    (lambda self, h: self.block.weight.sum() * 0 + torch.no_grad()(torch.tanh)(h), "no gradient reaches the output of 'block'"),
    (lambda self, h: h.detach() + self.block.bias, "no gradient reaches the output of 'block'"),
    (lambda self, h: torch.zeros_like(h) + self.block.bias, "no gradient reaches the output of 'block'"),
])
def test_refuses_a_loss_that_reaches_the_layer_only_through_no_grad_or_not_at_all(post, match):
    x, y = _xy()
    _expect_refusal(_Head(post).eval(), "block", x, y, match=match)


def test_refuses_a_forward_under_no_grad():
    class NoGrad(_Head):
        def forward(self, x):
            h = self.block(x)
            with torch.no_grad():
                return self.head(h)

    x, y = _xy()
    _expect_refusal(NoGrad(lambda self, h: h).eval(), "block", x, y,
                    match=r"loss does not depend on the output of \['block'\].*torch.no_grad")


def test_refuses_compiled_models_and_names_the_uncompiled_module():
    x, y = _xy()
    model = _Head(lambda self, h: torch.tanh(h)).eval()
    reference = activation_gradients(model, "block", x, y)
    compiled = torch.compile(model, backend="eager")
    for layer in ("block", "_orig_mod.block"):
        _expect_refusal(compiled, layer, x, y, match=r"compiled with torch.compile.*model\._orig_mod")
        with pytest.raises(CaptureError, match="torch.compile"):
            accumulate_geometry(compiled, layer, [(x, y)])
    assert torch.equal(activation_gradients(compiled._orig_mod, "block", x, y), reference)
    inner = _Head(lambda self, h: torch.tanh(h)).eval()
    inner.head = torch.compile(inner.head, backend="eager")
    with pytest.raises(CaptureError, match=r"submodule 'head' is compiled.*head\._orig_mod"):
        activation_gradients(inner, "block", x, y)
    in_place = _Head(lambda self, h: torch.tanh(h)).eval()
    in_place.compile(backend="eager")
    with pytest.raises(CaptureError, match=r"compiled in place with \.compile\(\)"):
        activation_gradients(in_place, "block", x, y)


@pytest.mark.parametrize("post", [
    lambda self, h: F.dropout(h, 0.2, training=True),  # random although the model is in eval mode
    lambda self, h: F.batch_norm(h, None, None, training=True),  # batch statistics: cannot run on one example
    lambda self, h: F.batch_norm(h.view(-1, 2, 4), None, None, training=True).view(-1, 8),  # can, differently
])
def test_refuses_a_forward_that_is_random_or_couples_examples_in_eval_mode(post):
    x, y = _xy(8)
    model = _Head(post).eval()
    match = r"the model is not deterministic in eval mode: dropout or batch statistics in training mode\?"
    _expect_refusal(model, "block", x, y, match=match)
    with pytest.raises(CaptureError, match=match):
        accumulate_geometry(model, "block", [(x, y), (x, y)])
    with pytest.raises(CaptureError, match=match):
        next(iter_activation_gradients(model, "block", [(x, y)]))
    # the check can be switched off (then q is what the forward gives)
    assert activation_gradients(model, "block", x, y, check_determinism=False).shape == (8, 8)


def test_determinism_check_costs_one_more_pass_of_the_first_batch_only():
    sizes = []

    class Counting(_Head):
        def forward(self, x):
            sizes.append(x.shape[0])
            return super().forward(x)

    x, y = _xy(8)
    model = Counting(lambda self, h: torch.tanh(h)).eval()
    acc = accumulate_geometry(model, "block", [(x, y)] * 3)
    assert sizes == [8, 1, 8, 8] and acc.n == 24  # example 0 recomputed alone (1/8 of a batch)
    sizes.clear()
    unchecked = accumulate_geometry(model, "block", [(x, y)] * 3, check_determinism=False)
    assert sizes == [8, 8, 8]
    assert torch.equal(acc.gram(), unchecked.gram())  # the check never changes q
    with pytest.raises(ValueError, match="check_determinism must be True or False"):
        activation_gradients(model, "block", x, y, check_determinism="yes")


def test_deterministic_models_pass_the_check():
    # padded causal-LM batches, a BatchNorm ResNet in eval mode, several layers
    model = tiny_llama()
    batch, _ = lm_batch()
    assert set(activation_gradients(model, "all", batch)) == {"model.layers.0", "model.layers.1"}
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    assert activation_gradients(tiny_resnet(), "layer2.0", images, torch.tensor([1, 2, 3])).shape == (3, 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_first_batch_accumulates_in_float32(dtype):
    model = tiny_llama().to(dtype)
    batch, _ = lm_batch(b=4)
    batch["attention_mask"][:] = 1
    acc = accumulate_geometry(model, "model.layers.0", [batch, batch])
    assert acc.dtype == torch.float32 and acc.rows().dtype == torch.float32 and acc.gram().dtype == torch.float64
    q = activation_gradients(model, "model.layers.0", batch)
    assert q.dtype == torch.float32
    assert torch.equal(acc.rows()[:4], q)
