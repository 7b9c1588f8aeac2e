"""The capture's output on fixed models and batches, saved once so that a change of the capture can be checked
bit for bit against what it gave before (``tests/test_capture_speed.py``).

``python tests/_capture_reference.py`` rewrites ``tests/capture_reference.pt``: run it only on purpose (it was
written before the capture stopped recording parameters' graphs, commit noted in the file), never to make a
failing comparison pass.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "capture_reference.pt"
VOCAB = 64


def _transformers():
    import transformers

    return transformers


def llama(seed: int = 0, width: int = 32, layers: int = 2, attn: str = "sdpa"):
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, attn_implementation=attn,
    )
    return transformers.LlamaForCausalLM(config).eval()


def neox(seed: int = 0):
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
        max_position_embeddings=64, rotary_pct=0.25,
    )
    return transformers.GPTNeoXForCausalLM(config).eval()


def resnet(seed: int = 0, channels_last: bool = False):
    from dalign_repro.models.resnet import resnet20

    torch.manual_seed(seed)
    model = resnet20(width=1, num_classes=10, channels_last=channels_last)
    for module in model.modules():  # running statistics as after training
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.1, 0.1)
    return model.eval()


def lm_batch(seed: int = 1, b: int = 5, T: int = 12) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, T), generator=generator)
    lengths = ([T, T - 3, 5, T, 2] * b)[:b]
    mask = torch.zeros(b, T, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def image_batch(seed: int = 2, b: int = 4, channels_last: bool = False):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 3, 16, 16, generator=generator)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, torch.randint(0, 10, (b,), generator=generator)


def _frozen_embedding_llama():
    model = llama(seed=3)
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


def cases() -> dict:
    """name -> (model factory, layers, batch factory): every capture the reference holds."""
    return {
        "llama": (llama, ["model.layers.0", "model.layers.1"], lm_batch),
        "llama_eager": (lambda: llama(attn="eager"), ["model.layers.1"], lm_batch),
        "llama_wide": (lambda: llama(seed=4, width=64, layers=3), ["model.layers.1"],
                       lambda: {"input_ids": lm_batch(b=8, T=32)["input_ids"]}),
        "llama_frozen_embedding": (_frozen_embedding_llama, ["model.layers.0"], lm_batch),
        "neox": (neox, ["gpt_neox.layers.0", "gpt_neox.layers.1"], lm_batch),
        "resnet": (resnet, ["layer1.2", "layer2.0"], image_batch),
        "resnet_channels_last": (lambda: resnet(channels_last=True), ["layer1.2", "layer2.0"],
                                 lambda: image_batch(channels_last=True)),
    }


def capture_all(activation_gradients) -> dict[str, torch.Tensor]:
    """``case/layer/reduction`` -> the (batch, d) q rows of every case, with the determinism self-check on."""
    out = {}
    for name, (factory, layers, batch) in cases().items():
        model = factory()
        for reduction in ("shared", "full"):
            data = batch()
            inputs, targets = data if isinstance(data, tuple) else (data, None)
            rows = activation_gradients(model, layers, inputs, targets, reduction)
            for layer, q in rows.items():
                out[f"{name}/{layer}/{reduction}"] = q
    return out


def redundancy_all() -> dict[str, torch.Tensor]:
    """``case/q|g/...`` -> the redundancy check's per-example rows (its ``_collect``) on the language models."""
    from dalign_core.capture.redundancy import _collect, candidate_parameters

    out = {}
    for name in ("llama", "neox"):
        factory, layers, batch = cases()[name]
        model = factory()
        names = list(dict.fromkeys(n for layer in layers for n in candidate_parameters(model, layer)))
        qs, gs, _ = _collect(model, layers, names, [batch(), batch(seed=5)], ("shared", "full"), "auto", None, None)
        out.update({f"{name}/q/{layer}/{reduction}": rows for (layer, reduction), rows in qs.items()})
        out.update({f"{name}/g/{param}": rows for param, rows in gs.items()})
    return out


def machine() -> dict:
    """What bit-identity of float results depends on beyond the code: torch's version and the CPU."""
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {"torch": str(torch.__version__), "cpu": cpu, "machine": platform.machine(),
            "threads": torch.get_num_threads()}


def main() -> int:
    from dalign_core.atomic import atomic_write_bytes
    from dalign_core.capture.hooks import activation_gradients

    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    import io

    buffer = io.BytesIO()
    torch.save({"capture": capture_all(activation_gradients), "redundancy": redundancy_all(), "machine": machine(),
                "commit": commit}, buffer)
    atomic_write_bytes(REFERENCE, buffer.getvalue())
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size} bytes) at commit {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
