"""Seeds derived from names, and torch's deterministic kernels: the same numbers from the same seed.

``derived_seed("train", width, seed)`` gives the same 63-bit seed on every machine and every run, and a
different one for any other key; the reproduction seeds its data orders, initialisations and resamples this way.
:func:`deterministic_algorithms` makes torch choose its deterministic kernels.
"""

from __future__ import annotations

import hashlib
import sys

__all__ = ["derived_seed", "deterministic_algorithms"]


def derived_seed(*key) -> int:
    """A 63-bit seed from ``key`` (sha256 of its ``:``-joined parts, read little-endian, top bit cleared).

    Args:
        key: any values with a stable ``str`` (names, widths, seeds), joined by ``:``.

    Returns:
        An int in [0, 2**63), valid for :func:`torch.manual_seed` and :class:`numpy.random.Generator`.
    """
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def deterministic_algorithms() -> None:
    """Make torch use deterministic kernels, warning (not failing) where an operation has none.

    The same as ``torch.use_deterministic_algorithms(True, warn_only=True)`` for every eager operation. That call
    also sets ``torch.compile``'s own flag, importing the compiler's config (about a second of every process that
    trains); nothing here compiles, so the flag is set through torch's C setter unless the compiler is already
    loaded (then the public call sets both).
    """
    import torch

    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=True)
