"""Growth: what a model-growth method reads at an insertion point before it grows there.

* :mod:`~dalign_core.growth.blocks`: the zero-output residual block ``W₂ σ(W₁ z)`` (W₂ = 0) and the context
  that inserts it at a layer's output; the block's width read from one forward pass.
* :mod:`~dalign_core.growth.predicting`: per insertion point, d_align, d_∥, d_2, ‖μ‖², μ_Mᵀg_K, B_align and the
  norm of the inserted block's gradient, each with an interval (:func:`~dalign_core.growth.predicting.predictors`),
  and their order (``dalign rank`` prints it).

May import the top-level helpers, geometry and capture; never the command line or the reproduction.
"""
