"""The redundancy check: is q at an insertion point already a trained parameter's gradient?

Measured on these tiny models (seeded, CPU, float32): Pythia shared q at gpt_neox.layers.0 is
exactly mlp.dense_4h_to_h.bias's gradient (fraction 1, held-out R² 1.000) while its full q has
R² 0; LLaMA's shared q at model.layers.0 has held-out R² ≈ 0.19; ResNet-20 (k = 1/4, 16×16
images, eval mode) has R² ≈ 0.95 at layer2.2 from the default candidates and ≈ 0.98 from
layer3.0's two BatchNorm biases alone (mean explained ≈ 0.9997).
"""

from __future__ import annotations

import pytest
import torch

from dalign_core.capture.refusals import CaptureError
from dalign_repro.models.llama import build_llama
from dalign_repro.models.pythia import build_pythia, pythia_width_variant
from dalign_repro.models.resnet import resnet20
from dalign_core.capture.redundancy import (MICRO_BATCH, REDUNDANT, Redundancy, _collect, candidate_parameters, redundancy,
                                   redundancy_rows)

pytest.importorskip("transformers")

VOCAB = 97


def _token_batches(n: int, seed: int = 0, length: int = 12, batch: int = 16) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[::5, -3:] = 0  # some right padding, as make_batches gives
    return [{"input_ids": ids[i:i + batch], "attention_mask": mask[i:i + batch]} for i in range(0, n, batch)]


@pytest.fixture(scope="module")
def pythia():
    return build_pythia(pythia_width_variant("pythia-14m", 32, vocab_size=VOCAB, num_layers=2, context=64), 0).eval()


@pytest.fixture(scope="module")
def llama():
    return build_llama(16, depth=2, head_dim=8, vocab_size=VOCAB, context=64, seed=0).eval()


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return resnet20(0.25, num_classes=4).eval()


def _image_batches(n: int = 256, seed: int = 0, batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    images, labels = torch.randn(n, 3, 16, 16, generator=g), torch.arange(n) % 4
    return [(images[i:i + batch], labels[i:i + batch]) for i in range(0, n, batch)]


def test_candidates_are_the_one_dimensional_parameters_of_the_block_and_the_next(pythia, llama, resnet):
    first = candidate_parameters(pythia, "gpt_neox.layers.0")
    assert "gpt_neox.layers.0.mlp.dense_4h_to_h.bias" in first and "gpt_neox.layers.1.input_layernorm.bias" in first
    assert all(name.startswith(("gpt_neox.layers.0.", "gpt_neox.layers.1.")) for name in first)
    assert not any(name.endswith("dense_4h_to_h.weight") for name in first)  # 1-D only
    assert candidate_parameters(pythia, "gpt_neox.layers.1")[-2:] == [
        "gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias"]
    assert candidate_parameters(llama, "model.layers.1") == [
        "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"]
    names = candidate_parameters(resnet, "layer2.2")
    assert {n.rsplit(".", 2)[0] for n in names} == {"layer2.2", "layer3.0"} and len(names) == 8


def test_pythia_shared_q_is_exactly_the_mlp_output_bias_gradient(pythia):
    result = redundancy(pythia, "gpt_neox.layers.0", _token_batches(128))
    assert isinstance(result, Redundancy)
    assert result.exact == "gpt_neox.layers.0.mlp.dense_4h_to_h.bias"
    assert "gpt_neox.layers.0.attention.dense.bias" in result.exact_all  # the parallel residual adds it too
    assert result.fraction == pytest.approx(1.0) and result.redundant and result.fraction > REDUNDANT
    assert result.variance_explained > 0.999 and result.mean_explained > 0.999
    assert (result.n, result.n_fit, result.d) == (128, 64, 32)
    assert result.candidate_coordinates == 832 and result.coordinates == 32 and "fitted 32 of 832" in result.note
    # a parameter that does not own q is neither exact nor redundant
    other = redundancy(pythia, "gpt_neox.layers.0", _token_batches(128),
                       parameters=["gpt_neox.layers.1.input_layernorm.bias"])
    assert other.exact is None and other.fraction < REDUNDANT


def test_pythia_full_q_is_far_less_redundant_than_the_shared_one(pythia):
    rows = redundancy_rows(pythia, "gpt_neox.layers.0", iter(_token_batches(96)))  # one pass serves both
    by = {row["reduction"]: row for row in rows}
    assert set(by) == {"shared", "full"} and by["full"]["d"] == 12 * 32
    assert by["shared"]["fraction"] == pytest.approx(1.0) and by["full"]["exact"] is None
    assert by["full"]["fraction"] < 0.3 < by["shared"]["fraction"] - 0.6
    assert {"layer", "reduction", "variance_explained", "mean_explained", "exact", "n", "d"} <= set(by["full"])


def test_llama_shared_q_is_not_owned_by_any_parameter(llama):
    result = redundancy(llama, "model.layers.0", _token_batches(384))
    assert result.exact is None and result.note == ""  # all 64 norm-scale coordinates fitted
    assert result.fraction < 0.6 and not result.redundant  # measured 0.19
    assert set(result.shares) == set(candidate_parameters(llama, "model.layers.0"))


def test_resnet_block_output_is_explained_by_the_next_blocks_batchnorm_biases(resnet):
    batches = _image_batches()
    own = redundancy(resnet, "layer2.2", batches, parameters=["layer3.0.bn1.bias", "layer3.0.bn2.bias"])
    assert own.exact is None and own.variance_explained > 0.8 and own.mean_explained > 0.9  # 0.98, 0.9997
    default = redundancy(resnet, "layer2.2", batches)
    assert default.variance_explained > 0.8  # 0.95
    assert resnet.training is False and all(p.grad is None for p in resnet.parameters())
    assert not any(m._forward_hooks for m in resnet.modules())


def test_bad_input_gives_clear_errors(pythia, resnet):
    batches = _token_batches(16)
    with pytest.raises(CaptureError, match="no submodule named 'gpt_neox.layer.0'.*nearest names"):
        redundancy(pythia, "gpt_neox.layer.0", batches)
    with pytest.raises(CaptureError, match="no parameter named 'gpt_neox.layers.0.mlp.bias'.*nearest names"):
        redundancy(pythia, "gpt_neox.layers.0", batches, parameters=["gpt_neox.layers.0.mlp.bias"])
    with pytest.raises(CaptureError, match="list of parameter names"):
        redundancy(pythia, "gpt_neox.layers.0", batches, parameters="gpt_neox.layers.0.mlp.dense_4h_to_h.bias")
    with pytest.raises(CaptureError, match="at least 4"):
        redundancy(pythia, "gpt_neox.layers.0", batches, examples=3)
    with pytest.raises(CaptureError, match="fit_fraction"):
        redundancy(pythia, "gpt_neox.layers.0", batches, fit_fraction=1.0)
    with pytest.raises(CaptureError, match="reduction"):
        redundancy(pythia, "gpt_neox.layers.0", batches, reduction="mean")
    for bad in (0, 2.5, True):
        with pytest.raises(CaptureError, match="micro_batch must be a positive int or None"):
            redundancy(pythia, "gpt_neox.layers.0", batches, micro_batch=bad)
    resnet.train()
    try:
        with pytest.raises(CaptureError, match="model.eval"):
            redundancy(resnet, "layer2.2", _image_batches(8))
    finally:
        resnet.eval()


@pytest.mark.parametrize("model, layer, batches", [
    ("llama", "model.layers.0", _token_batches(40, batch=16)),
    ("resnet", "layer2.2", _image_batches(40, batch=32)),
], ids=["llama", "resnet"])
def test_micro_batches_give_the_whole_batchs_gradients(model, layer, batches, request):
    """Slicing a batch into forward passes of MICRO_BATCH rows (the cost of each per-example backward pass falls
    with the rows of its graph) changes no q and no parameter gradient beyond rounding, nor which examples count:
    ``examples`` stops inside a micro-batch and a batch's last, shorter one is taken."""
    model = request.getfixturevalue(model)
    names = candidate_parameters(model, layer)
    whole = _collect(model, [layer], names, batches, ("shared", "full"), "auto", None, 37, micro_batch=None)
    for micro_batch in (MICRO_BATCH, 3):
        sliced = _collect(model, [layer], names, batches, ("shared", "full"), "auto", None, 37, micro_batch=micro_batch)
        for reference, rows in zip(whole[:2], sliced[:2]):
            assert reference.keys() == rows.keys()
            for key in reference:
                assert rows[key].shape == reference[key].shape and rows[key].shape[0] == 37
                relative = float((rows[key] - reference[key]).norm() / reference[key].norm())
                assert relative <= 1e-6, (micro_batch, key, relative)  # float32 rounding
