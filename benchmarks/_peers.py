"""Per-example q by the peers' libraries, for ``bench_capture.py``: BackPACK (``backpack-for-pytorch``) and Opacus.

Both compute per-example gradients of parameters, so q at an insertion point is read as the per-example gradient of
a zero bias δ (one entry per feature, shared over positions) added to the layer's output: ∂ℓ_i/∂δ = Σ_t ∂ℓ_i/∂z_it,
the shared q. Every parameter of the model is frozen while a peer runs (only δ requires gradients, as those
libraries are used for it), so nothing below z records a graph. Neither library is a dependency of the project:
``make bench-env`` installs them into ``.venv-bench`` (a venv that sees the project's packages through a ``.pth``
file; ``python -m venv --system-site-packages`` on top of a venv would see the base interpreter's instead), which
``make bench`` then runs; a missing one is reported as skipped.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

PEERS = ("backpack", "opacus")
INSTALL = {"backpack": "backpack-for-pytorch", "opacus": "opacus"}


class SharedBias(nn.Module):
    """``x + bias`` with a zero bias over the last dimension: its per-example gradient is the shared q."""

    def __init__(self, features: int, dtype=torch.float32, device=None):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(features, dtype=dtype, device=device))

    def forward(self, x):
        return x + self.bias


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here (its package is not installed), or None."""
    try:
        __import__(peer)
    except ImportError as err:
        return f"skipped: {INSTALL[peer]} is not installed ({err}); pip install {INSTALL[peer]} into the bench's venv"
    return None


def _summed_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Σ_i of example i's mean next-token cross-entropy (batches without padding)."""
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
    return per_token.view(ids.shape[0], -1).mean(dim=1).sum()


@contextlib.contextmanager
def _frozen(model: nn.Module, keep: torch.Tensor):
    """Every parameter of ``model`` but ``keep`` frozen in the block, restored after it."""
    trained = [p for p in model.parameters() if p.requires_grad and p is not keep]
    for p in trained:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trained:
            p.requires_grad_(True)


def peer_rows(peer: str, model: nn.Module, layer: str):
    """A function ``rows(batch) -> (batch, N)`` giving the shared q at ``layer`` of a causal LM by ``peer``, and a
    function that undoes the peer's changes to the model."""
    block = dict(model.named_modules())[layer]
    param = next(model.parameters())
    bias = SharedBias(model.config.hidden_size, param.dtype, param.device)
    name = f"dalign_shared_bias_{peer}"
    model.add_module(name, bias)  # a submodule, so that Opacus finds it
    active = [False]  # the bias joins the forward only while this peer runs: other methods see the model as it was

    def add_bias(module, args, output):
        if not active[0]:
            return None
        return (bias(output[0]), *output[1:]) if isinstance(output, tuple) else bias(output)

    handle = block.register_forward_hook(add_bias)
    if peer == "backpack":
        from backpack import backpack, extend
        from backpack.extensions import BatchGrad
        from backpack.extensions.firstorder.base import FirstOrderModuleExtension

        class SharedBiasBatchGrad(FirstOrderModuleExtension):
            def __init__(self):
                super().__init__(params=["bias"])

            def bias(self, ext, module, g_inp, g_out, bpQuantities):  # noqa: N803 (BackPACK's signature)
                return g_out[0].sum(dim=tuple(range(1, g_out[0].ndim - 1)))

        extension = BatchGrad()
        extension.set_module_extension(SharedBias, SharedBiasBatchGrad())
        extend(bias)

        def run(batch):
            with _frozen(model, bias.bias), backpack(extension):
                bias.bias.grad = None
                out = model(**batch, use_cache=False)
                _summed_loss(out.logits, batch["input_ids"]).backward()
            return bias.bias.grad_batch.detach()
        close = None
    elif peer == "opacus":
        from opacus import GradSampleModule
        from opacus.grad_sample import register_grad_sampler

        @register_grad_sampler(SharedBias)
        def _shared_bias_sample(layer_module, activations, backprops):
            return {layer_module.bias: backprops.sum(dim=tuple(range(1, backprops.ndim - 1)))}

        with _frozen(model, bias.bias):
            wrapped = GradSampleModule(model, batch_first=True, loss_reduction="sum")

        def run(batch):
            with _frozen(model, bias.bias):
                bias.bias.grad_sample = None
                bias.bias.grad = None
                out = wrapped(**batch, use_cache=False)
                _summed_loss(out.logits, batch["input_ids"]).backward()
            return bias.bias.grad_sample.detach()
        close = wrapped._close if hasattr(wrapped, "_close") else None
    else:
        raise ValueError(f"unknown peer {peer!r}; one of {PEERS}")

    def rows(batch):
        active[0] = True
        try:
            return run(batch)
        finally:
            active[0] = False

    def undo():
        handle.remove()
        if close is not None:
            close()
        del model._modules[name]

    return rows, undo
