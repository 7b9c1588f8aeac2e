"""The capture records no parameter's graph: q bit for bit what it was before, equal to torch.func's, and every
``requires_grad`` flag restored exactly, also after an error or a Ctrl-C."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import _capture_reference as reference
from dalign_core.capture import gradients
from dalign_core.capture.gradients import _restore_requires_grad, parameters_frozen
from dalign_core.capture.hooks import accumulate_geometry, activation_gradients
from dalign_core.capture.redundancy import redundancy_rows

pytest.importorskip("transformers")


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference was written on one thread
    yield
    torch.set_num_threads(threads)


def _flags(model) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in model.named_parameters()}


def test_q_is_bit_identical_to_the_saved_reference(one_thread):
    saved, same_machine = reference.reference_for_this_machine()
    captured = reference.capture_all(activation_gradients)
    collected = reference.redundancy_all()
    assert captured.keys() == saved["capture"].keys() and collected.keys() == saved["redundancy"].keys()
    for part, got in (("capture", captured), ("redundancy", collected)):
        for key, want in saved[part].items():
            if same_machine:  # the same torch on the same CPU: the same bits
                assert torch.equal(got[key], want), (part, key)
            else:  # other kernels may round differently: float precision
                torch.testing.assert_close(got[key], want, rtol=1e-5, atol=1e-7, msg=f"{part} {key}")


def test_q_is_bit_identical_to_the_capture_that_records_parameters(monkeypatch, one_thread):
    """Machine-independent: the same capture with every parameter recording its graph, as before, in this process."""
    frozen = reference.capture_all(activation_gradients)
    collected = reference.redundancy_all()
    monkeypatch.setattr(gradients, "parameters_frozen", lambda model, keep=(): contextlib.nullcontext())
    recording = reference.capture_all(activation_gradients)
    assert frozen.keys() == recording.keys()
    for key in frozen:
        assert torch.equal(frozen[key], recording[key]), key
    for key, rows in reference.redundancy_all().items():
        assert torch.equal(collected[key], rows), key


def _func_rows(model, layer: str, ids: torch.Tensor) -> torch.Tensor:
    """Shared q by torch.func: vmap over examples of grad w.r.t. a zero perturbation added to the layer output."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    state = {}

    def add_delta(module, args, output):
        return (output[0] + state["delta"], *output[1:]) if isinstance(output, tuple) else output + state["delta"]

    def loss_one(delta, row):
        state["delta"] = delta
        out = functional_call(model, (params, buffers), args=(row.unsqueeze(0),), kwargs={"use_cache": False})
        return F.cross_entropy(out.logits[0, :-1].float(), row[1:])

    handle = dict(model.named_modules())[layer].register_forward_hook(add_delta)
    try:
        zeros = torch.zeros(*ids.shape, model.config.hidden_size)
        return vmap(grad(loss_one))(zeros, ids).sum(dim=1)
    finally:
        handle.remove()


@pytest.mark.parametrize("factory,layer", [(reference.llama, "model.layers.0"), (reference.neox, "gpt_neox.layers.1")])
@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_q_equals_torch_func(factory, layer):
    model = factory()
    ids = reference.lm_batch(b=6, T=16)["input_ids"]
    want = _func_rows(model, layer, ids)
    got = activation_gradients(model, layer, {"input_ids": ids})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_no_parameter_records_a_graph_during_the_forward_and_all_are_restored():
    model = reference.llama()
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen by its owner: must stay frozen
    before = _flags(model)
    seen = []
    handle = model.model.norm.register_forward_hook(
        lambda module, args, output: seen.append(any(p.requires_grad for p in model.parameters())))
    try:
        accumulate_geometry(model, ["model.layers.0", "model.layers.1"], [reference.lm_batch()]).keys()
    finally:
        handle.remove()
    assert seen and not any(seen)  # the batch's forward and the self-check's: no parameter required gradients
    assert _flags(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_the_redundancy_check_records_only_its_candidates():
    model = reference.neox()
    before = _flags(model)
    recording = []
    handle = model.gpt_neox.final_layer_norm.register_forward_hook(
        lambda module, args, output: recording.append({n for n, p in model.named_parameters() if p.requires_grad}))
    try:
        rows = redundancy_rows(model, "gpt_neox.layers.1", [reference.lm_batch(), reference.lm_batch(seed=5)],
                               reductions=("shared",))
    finally:
        handle.remove()
    from dalign_core.capture.redundancy import candidate_parameters

    assert recording and all(names == set(candidate_parameters(model, "gpt_neox.layers.1")) for names in recording)
    assert rows[0]["exact"] == "gpt_neox.layers.1.mlp.dense_4h_to_h.bias"
    assert _flags(model) == before


class _Raises(nn.Module):
    """A model whose forward raises ``error`` after its first block has run."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        self.head.bias.requires_grad_(False)
        self.error = error

    def forward(self, x):
        self.block(x)
        assert not any(p.requires_grad for p in self.parameters())  # frozen while the forward runs
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("the model failed"), KeyboardInterrupt()])
def test_requires_grad_is_restored_after_an_error_and_after_ctrl_c(error):
    model = _Raises(error).eval()
    before = _flags(model)
    assert before == {"block.weight": True, "block.bias": True, "head.weight": True, "head.bias": False}
    # a model's own error reaches the caller as the project's ModelError (naming the submodule that raised); Ctrl-C
    # as itself
    from dalign_core.capture.refusals import ModelError

    with pytest.raises(ModelError if isinstance(error, Exception) else type(error)):
        activation_gradients(model, "block", torch.randn(5, 4), torch.zeros(5, dtype=torch.long))
    assert _flags(model) == before


class _Flag:
    """A stand-in parameter whose ``requires_grad_`` is interrupted by Ctrl-C the first ``interruptions`` times."""

    def __init__(self, interruptions: int):
        self.requires_grad, self.interruptions = False, interruptions

    def requires_grad_(self, value: bool):
        if self.interruptions:
            self.interruptions -= 1
            raise KeyboardInterrupt
        self.requires_grad = value


def test_a_ctrl_c_during_the_restoration_still_restores_every_flag():
    flags = [_Flag(0), _Flag(2), _Flag(0), _Flag(1)]
    with pytest.raises(KeyboardInterrupt):
        _restore_requires_grad(flags)
    assert all(flag.requires_grad for flag in flags)
    _restore_requires_grad([_Flag(0)])  # no interruption: nothing raised


def test_parameters_frozen_keeps_what_it_is_asked_to_and_counts_tied_parameters_once():
    model = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 6))
    model[1].weight = model[0].weight  # tied
    with parameters_frozen(model, keep=[model[1].bias]):
        assert [p.requires_grad for p in model.parameters()] == [False, True]
    assert all(p.requires_grad for p in model.parameters())
