"""Seeds derived from names: independent random streams named by what they serve, not numbered.

``derived_seed("train", width, seed)`` gives the same 63-bit seed on every machine and every run, and a
different one for any other key; the reproduction seeds its data orders, initialisations and resamples this way.
"""

from __future__ import annotations

import hashlib

__all__ = ["derived_seed"]


def derived_seed(*key) -> int:
    """A 63-bit seed from ``key`` (sha256 of its ``:``-joined parts, read little-endian, top bit cleared).

    Args:
        key: any values with a stable ``str`` (names, widths, seeds), joined by ``:``.

    Returns:
        An int in [0, 2**63), valid for :func:`torch.manual_seed` and :class:`numpy.random.Generator`.
    """
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
