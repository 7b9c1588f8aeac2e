"""Per-example activation gradients of a model, captured in one backward pass, and what is made of them.

* :mod:`~dalign_core.capture.hooks`: which layers, which loss, the capture itself, its refusals and self-check,
  and the streamed reduction into a :class:`~dalign_core.geometry.estimators.GeometryAccumulator`.
* :mod:`~dalign_core.capture.redundancy`: which captured layers repeat each other's gradients.

May import: :mod:`dalign_core.geometry` and the top-level helpers (``_tensor``, ``_env``). No training, no files.
"""
