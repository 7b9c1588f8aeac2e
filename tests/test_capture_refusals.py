"""Capture gives the right q or a one-line refusal: left padding, tuple outputs, masked-LM and token labels,
bidirectional models, random forwards, and batches the model cannot take.

Each case once gave a silently wrong q (the relative error the trial measured is in the test's docstring); every
test compares with a per-example computation that does not use dalign_core, on the example alone and unpadded.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _autograd import z_gradient

from dalign_core.capture.hooks import accumulate_geometry, activation_gradients, iter_activation_gradients
from dalign_core.capture.refusals import CaptureError

transformers = pytest.importorskip("transformers")

VOCAB = 64


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def bert_config(**extra):
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=64, **extra)


def tiny_bert(cls, **extra):
    torch.manual_seed(0)
    return cls(bert_config(**extra)).eval()


def _z_grad(model, layer, inputs, loss_of) -> torch.Tensor:
    """∂loss/∂z of a single example by plain autograd on a copy of the model (no dalign_core), shape z[0]."""
    return z_gradient(model, layer, lambda m: m(**inputs) if isinstance(inputs, dict) else m(inputs), loss_of)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ---------------------------------------------------------------------------
# Left padding


def _left_padded(lengths, T=12, seed=1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), T), generator=generator)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, T - length:] = 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


@pytest.mark.parametrize("factory,layer", [(tiny_gpt2, "transformer.h.0"), (tiny_llama, "model.layers.0")])
@pytest.mark.parametrize("reduction", ["shared", "full"])
def test_a_left_padded_batch_gives_each_examples_own_q(factory, layer, reduction):
    """padding_side="left" gave q 40-59% off: the last pad position was scored against the first real token (and
    GPT-2's absolute positions were shifted). Now each row equals the example alone, unpadded; pads get 0."""
    model = factory()
    lengths, T = [12, 9, 5, 12], 12
    batch = _left_padded(lengths, T)
    q = activation_gradients(model, layer, batch, reduction=reduction)
    N = model.config.hidden_size
    for i, length in enumerate(lengths):
        ids = batch["input_ids"][i:i + 1, T - length:]
        alone = _z_grad(model, layer, {"input_ids": ids},
                        lambda out: F.cross_entropy(out.logits[0, :-1], ids[0, 1:]))
        if reduction == "full":
            assert torch.all(q[i, :(T - length) * N] == 0)  # padding positions
            torch.testing.assert_close(q[i, (T - length) * N:], alone.reshape(-1), rtol=1e-4, atol=1e-6)
        else:
            torch.testing.assert_close(q[i], alone.sum(dim=0), rtol=1e-4, atol=1e-6)
    # the wrong answer this replaces: the padded row as the model saw it, the pad -> first token pair scored
    i, length = 2, lengths[2]
    ids = batch["input_ids"][i:i + 1]
    labels = ids.masked_fill(batch["attention_mask"][i:i + 1] == 0, -100)
    wrong = _z_grad(model, layer, {"input_ids": ids, "attention_mask": batch["attention_mask"][i:i + 1]},
                    lambda out: F.cross_entropy(out.logits[0, :-1], labels[0, 1:], ignore_index=-100)).sum(dim=0)
    right = _z_grad(model, layer, {"input_ids": ids[:, T - length:]},
                    lambda out: F.cross_entropy(out.logits[0, :-1], ids[0, T - length + 1:])).sum(dim=0)
    assert _relative(wrong, right) > 0.1


def test_left_padding_is_refused_where_positions_are_unknown():
    """A left-padded batch for a model whose positions the capture cannot set right, or with gaps, is refused."""
    batch = _left_padded([8, 5, 8, 3], T=8)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    bert = tiny_bert(transformers.BertForMaskedLM)
    with pytest.raises(CaptureError, match=r"left-padded .*tokenizer\.padding_side = 'right'\), or pass position_ids"):
        activation_gradients(bert, "bert.encoder.layer.0", {**batch, "labels": labels})
    positions = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)  # stated by the user: taken as given
    assert activation_gradients(bert, "bert.encoder.layer.0",
                                {**batch, "labels": labels, "position_ids": positions}).shape == (4, 32)
    holes = {"input_ids": batch["input_ids"], "attention_mask": torch.tensor([[1, 1, 0, 1, 1, 1, 1, 1]] * 4)}
    with pytest.raises(CaptureError, match=r"attention_mask row\(s\) \[0, 1, 2, 3\] have padding between real tokens"):
        activation_gradients(tiny_llama(), "model.layers.0", holes)


def test_a_right_padded_and_an_unpadded_causal_batch_are_bit_identical_to_the_one_pass_formula():
    """Correct input keeps its q bit for bit: the loss of the committed tables (cross-entropy of the sliced
    logits[:, :-1] against the next tokens, padding ignored), computed here by hand in one batch."""
    model = tiny_llama()
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (5, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[3, 4:] = 0
    for batch in ({"input_ids": ids}, {"input_ids": ids, "attention_mask": mask}):
        for reduction in ("shared", "full"):
            q = activation_gradients(model, "model.layers.1", batch, reduction=reduction)
            store = {}
            handle = model.model.layers[1].register_forward_hook(lambda m, a, out: store.setdefault("z", out))
            logits = model(**batch, use_cache=False).logits
            handle.remove()
            labels = ids.masked_fill(batch.get("attention_mask", mask.new_ones(())) == 0, -100)[:, 1:]
            token_loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels.flatten(), ignore_index=-100,
                                         reduction="none").view(labels.shape)
            losses = token_loss.sum(dim=1) / (labels != -100).sum(dim=1)
            z = store["z"][0] if isinstance(store["z"], tuple) else store["z"]
            (grad,) = torch.autograd.grad(losses.sum(), z)
            assert torch.equal(q, grad.sum(dim=1) if reduction == "shared" else grad.reshape(5, -1))
            for i in range(5):
                length = int(batch.get("attention_mask", mask.new_ones(5, 12))[i].sum())
                one = ids[i:i + 1, :length]
                alone = _z_grad(model, "model.layers.1", {"input_ids": one},
                                lambda out: F.cross_entropy(out.logits[0, :-1], one[0, 1:]))
                expected = alone.sum(dim=0) if reduction == "shared" else alone.reshape(-1)
                got = q[i] if reduction == "shared" else q[i, :expected.numel()]
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------
# A model that returns (features, logits)


class TwoHeaded(nn.Module):
    """Returns ``(features, logits)``: the features come first, as in many vision and metric-learning models."""

    def __init__(self, width: int = 16, classes: int = 3):
        super().__init__()
        self.embed = nn.Linear(6, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return h, self.head(h)


def build_two_headed(classes: int = 3) -> TwoHeaded:
    torch.manual_seed(0)
    return TwoHeaded(classes=classes)


def _xy(b=6, classes=3):
    generator = torch.Generator().manual_seed(4)
    return torch.randn(b, 6, generator=generator), torch.arange(b) % classes


def test_a_tuple_of_features_and_logits_is_refused_unless_the_logits_are_named():
    """(features, logits): the features were taken as the logits (q 249% off). Now refused as ambiguous; with
    logits_index=1 q is the per-example gradient of the logits' loss."""
    model, (x, y) = build_two_headed().eval(), _xy()
    for call in (lambda: activation_gradients(model, "blocks.0", x, y),
                 lambda: accumulate_geometry(model, "blocks.0", [(x, y)]),
                 lambda: next(iter_activation_gradients(model, "blocks.0", [(x, y)]))):
        with pytest.raises(CaptureError, match=r"returns a tuple of 2 tensors \(\[0\] \(6, 16\), \[1\] \(6, 3\)\).*"
                                               r"ambiguous; pass logits_index="):
            call()
    q = activation_gradients(model, "blocks.0", x, y, logits_index=1)
    for i in range(6):
        alone = _z_grad(model, "blocks.0", x[i:i + 1], lambda out: F.cross_entropy(out[1], y[i:i + 1]))
        torch.testing.assert_close(q[i], alone, rtol=1e-5, atol=1e-7)
        wrong = _z_grad(model, "blocks.0", x[i:i + 1], lambda out: F.cross_entropy(out[0], y[i:i + 1]))
        assert _relative(wrong, alone) > 0.5  # what taking the first tensor gave
    torch.testing.assert_close(activation_gradients(model, "blocks.0", x, y, logits_index=-1), q, rtol=0, atol=0)
    with pytest.raises(CaptureError, match=r"logits_index=2 does not name a tensor in the model output"):
        activation_gradients(model, "blocks.0", x, y, logits_index=2)
    with pytest.raises(CaptureError, match=r"logits_index must be an int"):
        activation_gradients(model, "blocks.0", x, y, logits_index="logits")


def test_a_tuple_with_one_tensor_is_its_logits():
    class LogitsAndNothing(TwoHeaded):
        def forward(self, x):
            return super().forward(x)[1], None

    model, (x, y) = build_two_headed().eval(), _xy()
    single = LogitsAndNothing()
    single.load_state_dict(model.state_dict())
    assert torch.equal(activation_gradients(single.eval(), "blocks.1", x, y),
                       activation_gradients(model, "blocks.1", x, y, logits_index=1))


def test_rank_arch_refuses_a_tuple_output_in_one_line(tmp_path, monkeypatch, capsys):
    from dalign_core.cli.app import main

    (tmp_path / "two_headed_model.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_capture_refusals import build_two_headed\n" % str(
            __import__("pathlib").Path(__file__).parent))
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.save(build_two_headed().state_dict(), tmp_path / "weights.pt")
    x, y = _xy(16)
    torch.save({"inputs": x, "targets": y}, tmp_path / "data.pt")
    rc = main(["rank", "--arch", "two_headed_model:build_two_headed", "--model", str(tmp_path / "weights.pt"),
               "--data", str(tmp_path / "data.pt"), "--examples", "16", "--redundancy-examples", "0"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dalign: error: ") and "ambiguous" in lines[0] and "returns the logits alone" in lines[0]


# ---------------------------------------------------------------------------
# Masked-LM and token-classification labels are not shifted; a bidirectional model has no next-token loss


def _token_batch(classes: int, seed: int = 5):
    """Right-padded ids and per-token labels, -100 on unlabelled positions (a masked LM labels a few)."""
    generator = torch.Generator().manual_seed(seed)
    lengths, T = [10, 7, 10, 4], 10
    ids = torch.randint(1, VOCAB, (4, T), generator=generator)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    labels = torch.randint(0, classes, (4, T), generator=generator)
    labels[torch.rand(4, T, generator=generator) < 0.4] = -100
    labels[:, 1] = torch.randint(0, classes, (4,), generator=generator)  # every example has a labelled token
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}, labels, lengths


@pytest.mark.parametrize("cls,classes,measured", [
    ("BertForMaskedLM", VOCAB, "44%"), ("BertForTokenClassification", 5, "63%")])
def test_masked_lm_and_token_labels_score_each_position_unshifted(cls, classes, measured):
    """3-D logits of a masked LM or token classifier were scored as a causal LM's, labels shifted (q off by
    44% / 63%). Now the class says which loss, and q equals the example's own unshifted loss."""
    extra = {"num_labels": classes} if cls == "BertForTokenClassification" else {}
    model = tiny_bert(getattr(transformers, cls), **extra)
    batch, labels, lengths = _token_batch(classes)
    layer = "bert.encoder.layer.0"
    q = activation_gradients(model, layer, {**batch, "labels": labels})
    torch.testing.assert_close(q, activation_gradients(model, layer, batch, labels, task="token_classification"))
    torch.testing.assert_close(q, activation_gradients(model, layer, batch, labels, task="masked_lm"))
    for i, length in enumerate(lengths):
        ids, own = batch["input_ids"][i:i + 1, :length], labels[i, :length]
        alone = _z_grad(model, layer, {"input_ids": ids},
                        lambda out: F.cross_entropy(out.logits[0], own, ignore_index=-100)).sum(dim=0)
        torch.testing.assert_close(q[i], alone, rtol=1e-4, atol=1e-6)
        if i == 0:  # the shifted loss the capture used to take
            shifted = _z_grad(model, layer, {"input_ids": ids}, lambda out: F.cross_entropy(
                out.logits[0, :-1], own[1:], ignore_index=-100)).sum(dim=0)
            assert _relative(shifted, alone) > 0.1
    with pytest.raises(CaptureError, match=r"needs (masked-LM|token) labels"):
        activation_gradients(model, layer, batch, task="token_classification")  # no labels: nothing to score


def test_a_plain_module_with_per_token_logits_must_say_its_task():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(VOCAB, 16)
            self.body = nn.Linear(16, 16)
            self.head = nn.Linear(16, 5)

        def forward(self, input_ids):
            return self.head(torch.tanh(self.body(self.embed(input_ids))))

    model = Tagger().eval()
    batch, labels, lengths = _token_batch(5)
    with pytest.raises(CaptureError, match=r"Tagger returns per-token logits \(4, 10, 5\) .* pass task='causal_lm'"):
        activation_gradients(model, "body", {"input_ids": batch["input_ids"]}, labels)
    q = activation_gradients(model, "body", {"input_ids": batch["input_ids"]}, labels, task="token_classification")
    ids = batch["input_ids"][:1]
    alone = _z_grad(model, "body", {"input_ids": ids},
                    lambda out: F.cross_entropy(out[0], labels[0], ignore_index=-100)).sum(dim=0)
    torch.testing.assert_close(q[0], alone, rtol=1e-5, atol=1e-7)


def test_a_bidirectional_model_has_no_next_token_loss():
    """BertLMHeadModel without is_decoder=True attends to the future: its next-token q was reported as if causal."""
    batch = {"input_ids": torch.randint(1, VOCAB, (4, 10), generator=torch.Generator().manual_seed(6))}
    encoder = tiny_bert(transformers.BertLMHeadModel)
    for task in ("auto", "causal_lm"):
        with pytest.raises(CaptureError, match=r"BertLMHeadModel attends in both directions .*is_decoder=True.*"
                                               r"sees the tokens after it"):
            activation_gradients(encoder, "bert.encoder.layer.0", batch, task=task)
    decoder = tiny_bert(transformers.BertLMHeadModel, is_decoder=True)
    q = activation_gradients(decoder, "bert.encoder.layer.0", batch)
    ids = batch["input_ids"][2:3]
    alone = _z_grad(decoder, "bert.encoder.layer.0", {"input_ids": ids},
                    lambda out: F.cross_entropy(out.logits[0, :-1], ids[0, 1:])).sum(dim=0)
    torch.testing.assert_close(q[2], alone, rtol=1e-4, atol=1e-6)


def test_loading_a_bidirectional_folder_as_a_causal_lm_is_refused(tmp_path):
    from dalign_core.cli.loading import LoadError, load_model

    tiny_bert(transformers.BertLMHeadModel).save_pretrained(tmp_path / "bert")
    with pytest.raises(LoadError, match=r"BertLMHeadModel attends in both directions.*causal"):
        load_model(str(tmp_path / "bert"))
    tiny_bert(transformers.BertLMHeadModel, is_decoder=True).save_pretrained(tmp_path / "decoder")
    assert load_model(str(tmp_path / "decoder")).config.is_decoder


# ---------------------------------------------------------------------------
# Random forwards


def test_stochastic_depth_in_training_mode_is_refused_every_time():
    """torchvision's StochasticDepth in train mode: 9 of 10 captures returned, q varying by up to 40%."""
    torchvision = pytest.importorskip("torchvision")

    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
            self.drop = torchvision.ops.StochasticDepth(0.1, "row")
            self.head = nn.Linear(6, 3)

        def forward(self, x):
            for block in self.blocks:
                x = x + self.drop(torch.tanh(block(x)))
            return self.head(x)

    x, y = _xy(8)
    model = Deep().train()
    for _ in range(40):
        with pytest.raises(CaptureError, match=r"'drop' \(StochasticDepth\) drops at random in training mode \(p=0.1\)"):
            activation_gradients(model, "blocks.0", x, y)
    model.eval()
    first = activation_gradients(model, "blocks.0", x, y)
    assert torch.equal(first, activation_gradients(model, "blocks.0", x, y))


def test_a_forward_that_draws_random_numbers_is_refused_whatever_it_is_called():
    """No module flag names it: the random generator moving during the forward does, on every call."""

    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.block = nn.Linear(6, 6)
            self.head = nn.Linear(6, 3)
            self.keep = 0.95  # not an attribute the flag check knows

        def forward(self, x):
            h = self.block(x)
            if self.training:
                h = h * (torch.rand(h.shape[0], 1) < self.keep)
            return self.head(h)

    x, y = _xy(8)
    model = Noisy().train()
    for _ in range(40):
        with pytest.raises(CaptureError, match=r"not deterministic.*drew random numbers"):
            activation_gradients(model, "block", x, y)
    assert activation_gradients(model, "block", x, y, check_determinism=False).shape == (8, 6)
    state = torch.random.get_rng_state()
    activation_gradients(model.eval(), "block", x, y)
    assert torch.equal(state, torch.random.get_rng_state())  # an eval-mode capture draws nothing


def test_rrelu_and_drop_path_in_training_mode_are_refused():
    class DropPath(nn.Module):  # timm's name and attribute
        def __init__(self, drop_prob):
            super().__init__()
            self.drop_prob = drop_prob

        def forward(self, x):
            return x

    x, y = _xy(8)
    for module, match in ((nn.RReLU(), r"RReLU '1' draws random slopes"),
                          (DropPath(0.2), r"'1' \(DropPath\) drops at random in training mode \(drop_prob=0.2\)")):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 6), module, nn.Linear(6, 3)).train()
        with pytest.raises(CaptureError, match=match):
            activation_gradients(model, "0", x, y)
        assert activation_gradients(model.eval(), "0", x, y).shape == (8, 6)
    assert activation_gradients(nn.Sequential(nn.Linear(6, 6), DropPath(0.0), nn.Linear(6, 3)).train(),
                                "0", x, y).shape == (8, 6)  # p = 0 draws nothing


# ---------------------------------------------------------------------------
# Batches the model cannot take


@pytest.mark.parametrize("make,match", [
    (lambda ids, mask: {"input_ids": torch.randint(0, VOCAB, (2, 65))},
     r"sequences of 65 tokens, longer than the 64 positions the model was built for \(config\.\w+\); cut"),
    (lambda ids, mask: {"input_ids": ids, "attention_mask": mask[:, :-1]},
     r"attention_mask has shape \(3, 7\), input_ids \(3, 8\); it must have the ids' shape"),
    (lambda ids, mask: {"input_ids": ids, "attention_mask": mask[None]},
     r"attention_mask has shape \(1, 3, 8\)"),
    (lambda ids, mask: {"input_ids": ids[:0], "attention_mask": mask[:0]}, r"the batch holds no examples"),
    (lambda ids, mask: ids[:0], r"the batch holds no examples"),
    (lambda ids, mask: {"input_ids": ids[:, :0]}, r"input_ids of shape \(3, 0\) hold no tokens"),
])
def test_batches_the_model_cannot_take_are_one_line_errors(make, match):
    model = tiny_gpt2()
    ids = torch.randint(0, VOCAB, (3, 8), generator=torch.Generator().manual_seed(7))
    with pytest.raises(CaptureError, match=match) as caught:
        activation_gradients(model, "transformer.h.0", make(ids, torch.ones_like(ids)))
    assert "\n" not in str(caught.value)
    with pytest.raises(CaptureError, match=match):
        accumulate_geometry(model, "transformer.h.0", [make(ids, torch.ones_like(ids))])


# ---------------------------------------------------------------------------
# The determinism check: example 0 alone, and the full-size check only when it disagrees


def test_the_determinism_check_recomputes_one_example_and_the_full_batch_only_when_it_disagrees():
    sizes = []

    class Counting(nn.Module):
        def __init__(self, coupled: bool):
            super().__init__()
            torch.manual_seed(0)
            self.block, self.head, self.coupled = nn.Linear(6, 8), nn.Linear(8, 3), coupled

        def forward(self, x):
            sizes.append(x.shape[0])
            h = self.block(x)
            return self.head(F.batch_norm(h, None, None, training=True) if self.coupled else torch.tanh(h))

    x, y = _xy(8)
    q = activation_gradients(Counting(False).eval(), "block", x, y)
    assert sizes == [8, 1]  # the batch, then example 0 alone: 1/8 of a batch more
    assert torch.equal(q, activation_gradients(Counting(False).eval(), "block", x, y, check_determinism=False))
    sizes.clear()
    with pytest.raises(CaptureError, match=r"not deterministic in eval mode.*differs by .* \(relative\) between "
                                           r"the batch and a recomputation"):
        activation_gradients(Counting(True).eval(), "block", x, y)
    assert sizes == [8, 1, 8]  # alone it disagrees: the check at the batch's size decides (and refuses)
    sizes.clear()
    activation_gradients(Counting(False).eval(), "block", x[:1], y[:1])
    assert sizes == [1, 1]  # a batch of one is its own full-size check
