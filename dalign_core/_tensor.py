"""Conversion of user inputs (numpy arrays, torch tensors, scalars) to float64 torch tensors.

The bottom of the library works in torch so that the same code runs on the CPU and
on a GPU; numpy inputs are wrapped without a copy where possible.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch


__all__ = ["ArrayLike", "as_count", "as_float64", "check_finite"]

ArrayLike = "np.ndarray | torch.Tensor"


def as_float64(x, name: str) -> torch.Tensor:
    """Return ``x`` as a float64 tensor on its own device, raising if it is not finite.

    Args:
        x: numpy array, torch tensor, or nested sequence of numbers.
        name: the argument's name, used in error messages.
    """
    if isinstance(x, torch.Tensor):
        t = x.detach().to(torch.float64)
    elif isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.number):
            raise TypeError(f"{name} must hold numbers, got numpy dtype {x.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
    else:
        try:
            t = torch.as_tensor(np.asarray(x, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}") from err
    check_finite(t, name)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ValueError naming ``name`` and the first bad position if ``t`` holds NaN or inf."""
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        count = int(bad.sum())
        where = tuple(int(i) for i in torch.nonzero(bad)[0]) if t.ndim else ()
        raise ValueError(
            f"{name} contains {count} non-finite value(s) (NaN or inf), first at index {where}; "
            "remove or repair these entries before estimating"
        )


def as_count(x, name: str) -> float:
    """Validate a sample budget (M or K): a finite real number >= 1, returned as float."""
    if isinstance(x, torch.Tensor):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a number of examples, got {type(x).__name__}")
    value = float(x)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if value < 1:
        raise ValueError(f"{name} is a number of examples and must be at least 1, got {value}")
    return value
