"""The capture's output on fixed models and batches, saved once so that a change of the capture can be checked
bit for bit against what it gave before (``tests/test_capture_frozen.py``).

The file holds one reference per machine (its fingerprint, :func:`machine`: another CPU's kernels may round
otherwise), each written with the capture of the commit it records, before the capture stopped recording
parameters' graphs. A machine without one is compared to float precision. To add one: in a worktree at the recorded
commit, run this script as it was then (``git show 9ae9b99:tests/_capture_reference.py``, with that worktree on
``PYTHONPATH``), then ``python tests/_capture_reference.py --merge <the file it wrote>`` here. Without ``--merge`` it
writes this machine's entry from the capture of the working tree: run it only on purpose, never to make a failing
comparison pass.
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


def _cpuinfo(field: str) -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.split(":", 1)[0].strip() == field)
    except (OSError, StopIteration):
        return ""


def machine() -> dict:
    """What bit-identity of float results depends on beyond the code: torch's version, the CPU and the vector
    instructions torch's kernels dispatch to (two CPUs both named "AMD EPYC" differ in them and round differently)."""
    return {"torch": str(torch.__version__), "cpu": _cpuinfo("model name") or platform.processor(),
            "machine": platform.machine(), "threads": torch.get_num_threads(),
            "cpu_family_model": f"{_cpuinfo('cpu family')}/{_cpuinfo('model')}",
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def references() -> list[dict]:
    """The saved references, one per machine: each ``{"capture", "redundancy", "machine", "commit"}``."""
    saved = torch.load(REFERENCE, weights_only=True)
    return saved["references"] if "references" in saved else [saved]


def reference_for_this_machine() -> tuple[dict, bool]:
    """The reference written on a machine like this one (every field of :func:`machine` equal) and True, or the first
    one and False: another machine's kernels may round differently, so only float precision can be asked of it."""
    here = machine()
    saved = references()
    return next(((entry, True) for entry in saved if entry["machine"] == here), (saved[0], False))


def _save(entries: list[dict]) -> None:
    import io

    from dalign_core.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    torch.save({"references": entries}, buffer)
    atomic_write_bytes(REFERENCE, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--merge", type=Path, metavar="FILE",
                        help="add FILE, a reference this script wrote on this machine at the commit the references "
                             "record (see the module's docstring), as this machine's entry")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.merge is None:
        from dalign_core.capture.hooks import activation_gradients

        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
        entry = {"capture": capture_all(activation_gradients), "redundancy": redundancy_all(), "commit": commit}
    else:
        written = torch.load(args.merge, weights_only=True)
        entry = {key: written[key] for key in ("capture", "redundancy", "commit")}
        here = machine()
        if any(here.get(key) != value for key, value in written["machine"].items()):
            print(f"error: {args.merge} was written on another machine ({written['machine']}); merge it there",
                  file=sys.stderr)
            return 2
    entry["machine"] = machine()
    entries = [saved for saved in (references() if REFERENCE.exists() else []) if saved["machine"] != entry["machine"]]
    _save(entries + [entry])
    print(f"wrote {REFERENCE}: {len(entries) + 1} machines; this one's from commit {entry['commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
