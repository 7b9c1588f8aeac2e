"""Per-example activation gradients of a model, captured in one backward pass, and what is made of them.

* :mod:`~dalign_core.capture.hooks`: the capture itself (``activation_gradients``, ``iter_activation_gradients``)
  and the streamed reduction into a :class:`~dalign_core.geometry.accumulator.GeometryAccumulator` per layer and
  reduction (``accumulate_geometry``); its docstring tells the whole method.
* :mod:`~dalign_core.capture.layers`: which layers: a model's residual blocks, names resolved to submodules.
* :mod:`~dalign_core.capture.losses`: which loss: causal LM, masked LM, token classification, classification;
  padding left out, left padding positioned.
* :mod:`~dalign_core.capture.batches`: what a batch is and how it reaches the model (token ids, position limit,
  attention mask, device and dtype).
* :mod:`~dalign_core.capture.refusals`: ``CaptureError`` and the model states refused (BatchNorm in training mode,
  active dropout, a compiled model).
* :mod:`~dalign_core.capture.gradients`: the one forward and one backward pass down to the layer outputs, and
  what the graph refuses.
* :mod:`~dalign_core.capture.determinism`: the self-check that the forward neither draws random numbers nor
  couples the examples.
* :mod:`~dalign_core.capture.redundancy`: which captured layers repeat each other's gradients.

May import: :mod:`dalign_core.geometry` and the top-level helpers (``_tensor``, ``environment``, ``seeding``). No training, no files.
"""
