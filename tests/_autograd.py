"""A reference the capture is checked against: one example's ∂loss/∂z by plain autograd, independent of dalign_core."""

import copy

import torch


def z_gradient(model, layer: str, run, loss_of) -> torch.Tensor:
    """∂loss/∂z at ``layer`` for the first example, on a copy of the model; ``run(model)`` makes the forward pass."""
    model = copy.deepcopy(model)
    store = {}

    def hook(module, args, output):
        z = output[0] if isinstance(output, tuple) else output
        z.retain_grad()
        store["z"] = z

    handle = dict(model.named_modules())[layer].register_forward_hook(hook)
    output = run(model)
    handle.remove()
    loss_of(output).backward()
    return store["z"].grad[0]
