"""The command's own LLaMA (dalign_core.cli.llama): transformers' numbers without importing transformers, and
transformers for every checkpoint it does not read exactly."""

from __future__ import annotations

import json

import pytest
import torch

import dalign_core
from dalign_core.capture.layers import insertion_points
from dalign_core.cli.llama import LlamaForCausalLM, native_llama, unsupported
from dalign_core.cli.loading import LoadError, load_model

transformers = pytest.importorskip("transformers")

OPTIONS = {
    "plain": {},
    "grouped key/value heads": dict(num_key_value_heads=2),
    "tied embeddings": dict(tie_word_embeddings=True),
    "biases": dict(attention_bias=True, mlp_bias=True),
    "head_dim apart from width / heads": dict(head_dim=24),
    "rotary base": dict(rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
}


def _save(folder, seed=0, **options):
    """A random LLaMA checkpoint (every gain and bias drawn away from its default) saved by transformers."""
    torch.manual_seed(seed)
    sizes = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 vocab_size=101, max_position_embeddings=64)
    config = transformers.LlamaConfig(**{**sizes, **options})
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.normal_(1.0, 0.2)
    model.save_pretrained(folder)
    return folder


def _batch():
    ids = torch.randint(0, 101, (3, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0  # right padding
    mask[2, :5] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_logits_and_q_equal_transformers_on_every_option_it_reads(options, tmp_path):
    folder = _save(tmp_path, **options)
    ours, why = native_llama(folder)
    assert why == "" and isinstance(ours, LlamaForCausalLM)
    theirs = load_model(str(folder), native=False)
    assert type(theirs).__module__.startswith("transformers.")
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        for mask in (None, batch["attention_mask"]):
            kept = real if mask is not None else torch.ones_like(real)
            a = ours(batch["input_ids"], attention_mask=mask).logits[kept]
            b = theirs(input_ids=batch["input_ids"], attention_mask=mask).logits[kept]
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert insertion_points(ours) == insertion_points(theirs) == ["model.layers.0",
                                                                                          "model.layers.1"]
    for layer in ("model.layers.0", "model.layers.1"):
        q_ours = dalign_core.activation_gradients(ours, layer, batch)
        q_theirs = dalign_core.activation_gradients(theirs, layer, batch)
        torch.testing.assert_close(q_ours, q_theirs, rtol=1e-5, atol=1e-7)


def test_load_model_builds_a_plain_llama_folder_itself_and_in_the_dtype_asked(tmp_path):
    folder = _save(tmp_path)
    model = load_model(str(folder))
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert model.get_input_embeddings().num_embeddings == 101 and model.config.max_position_embeddings == 64
    half = load_model(str(folder), dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("change, reason", [
    (dict(architectures=["MistralForCausalLM"], model_type="mistral"), "architecture"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(pretraining_tp=2), "pretraining_tp"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}), "rotary"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}), "rotary"),
    (dict(rope_parameters=None, rope_theta=1e4, rope_scaling={"type": "linear", "factor": 2.0}), "rotary"),
    (dict(rope_parameters={"rope_type": "default"}), "rotary"),
    (dict(rope_parameters="default"), "rotary"),
    (dict(num_key_value_heads=3), "multiple"),
    (dict(hidden_size=0), "positive"),
])
def test_a_config_it_does_not_read_exactly_is_left_to_transformers(change, reason, tmp_path):
    folder = _save(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert unsupported(config) == ""
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    model, why = native_llama(folder)
    assert model is None and reason in why


def test_an_older_config_with_a_top_level_rotary_base_is_read(tmp_path):
    folder = _save(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters")
    config.update(rope_theta=5e5, rope_scaling=None)
    assert unsupported(config) == ""


def test_weights_that_do_not_fit_the_config_go_to_transformers_which_refuses_them(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _save(tmp_path)
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(95, 64)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert native_llama(folder) == (None, "the weights do not fit the config")
    with pytest.raises(LoadError):
        load_model(str(folder))
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert native_llama(folder)[0] is None
    with pytest.raises(LoadError, match="up_proj"):
        load_model(str(folder))


def test_saved_rotary_frequencies_and_a_tied_head_saved_anyway_are_read_as_transformers_reads_them(tmp_path):
    """transformers recomputes the frequencies, and loads a head the checkpoint holds although the config ties it."""
    from safetensors.torch import load_file, save_file

    folder = _save(tmp_path, tie_word_embeddings=True)
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)  # as older transformers saved them
    weights["lm_head.weight"] = torch.zeros_like(weights["model.embed_tokens.weight"])
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    ours, why = native_llama(folder)
    assert why == ""
    ids = _batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, load_model(str(folder), native=False)(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-6)


def test_sharded_weights_are_read_through_their_index(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _save(tmp_path)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, folder / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    model, why = native_llama(folder)
    assert why == "" and torch.equal(model.lm_head.weight, weights["lm_head.weight"])
