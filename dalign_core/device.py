"""Where this process computes: its place among torchrun's ranks, its device and its CPU threads, resolved here once.

Every path from a config's ``device`` (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``)
to a :class:`torch.device` goes through this module:

* :func:`resolve_device` turns the name into a device (``"auto"``: CUDA when there is
  one, else the CPU) and refuses a CUDA device the machine does not have.
* :func:`local_device` does the same for a rank that torchrun started
  (:func:`context` reads its place from torchrun's variables) and pins a bare CUDA
  device to the rank's own GPU, ``cuda:<LOCAL_RANK>``.
* :func:`configure` remembers the device this process computes on (:func:`configured`)
  and, on the CPU, pins torch to :func:`threads` intra-op threads (``DALIGN_THREADS``,
  default 1: small models do not split well over threads, see
  :mod:`dalign_repro.training.workers`). The experiment runner calls it before any model is
  built, and :func:`dalign_repro.training.distributed.init` calls it for every rank.

The worker processes (:mod:`dalign_repro.training.workers`) read :func:`configured` to decide
whether a job grid may fork (never on a GPU), and torchrun's process group
(:mod:`dalign_repro.training.distributed`) joins NCCL or gloo by :func:`local_device`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["THREADS_VARIABLE", "Context", "context", "resolve_device", "local_device", "threads", "configure",
           "configured", "positive_env_int"]

THREADS_VARIABLE = "DALIGN_THREADS"

_state: dict[str, Any] = {"device": None}


# ----------------------------------------------------------------------------- the device


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` gives CUDA when available, else the CPU; a CUDA device that is not there is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine; use 'cpu'")
    return device


# ----------------------------------------------------------------------------- where this process stands


@dataclass(frozen=True)
class Context:
    """This process's place in the world torchrun started (a world of one without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node: int = 0
    """``GROUP_RANK``: the index of this node's torchrun agent."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the rank that merges and writes the tables."""
        return self.rank == 0


def context() -> Context:
    """Read :class:`Context` from torchrun's environment variables (starts nothing)."""
    def number(name: str, default: int) -> int:
        value = os.environ.get(name, "")
        try:
            return int(value) if value else default
        except ValueError:
            raise ValueError(f"environment variable {name}={value!r} is not an integer") from None

    world = number("WORLD_SIZE", 1)
    rank = number("RANK", 0)
    if not 0 <= rank < max(world, 1):
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    local_world = number("LOCAL_WORLD_SIZE", 1 if world == 1 else world)
    return Context(rank=rank, world_size=max(world, 1), local_rank=number("LOCAL_RANK", 0),
                   local_world_size=local_world, node=number("GROUP_RANK", 0))


def local_device(device: str = "auto") -> torch.device:
    """The device this rank computes on: ``device`` resolved, a bare CUDA device pinned to ``cuda:<LOCAL_RANK>``."""
    resolved = resolve_device(device)
    ctx = context()
    if resolved.type != "cuda" or resolved.index is not None or not ctx.distributed:
        return resolved
    count = torch.cuda.device_count()
    if ctx.local_rank >= count:
        raise RuntimeError(f"rank {ctx.rank} is local rank {ctx.local_rank} of its node, which shows only {count} "
                           f"CUDA device(s): start at most {count} processes per node (--nproc_per_node), or make "
                           "every GPU visible to each of them (CUDA_VISIBLE_DEVICES)")
    return torch.device("cuda", ctx.local_rank)


# ----------------------------------------------------------------------------- threads per process


def positive_env_int(name: str) -> int | None:
    """Environment variable ``name`` as a whole number of at least 1, None when unset; anything else raises
    ValueError."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"environment variable {name}={value!r} must be a whole number of at least 1")
    return number


def threads() -> int:
    """Intra-op threads per process on the CPU: ``$DALIGN_THREADS``, else 1."""
    return positive_env_int(THREADS_VARIABLE) or 1


def _pin(number: int) -> None:
    torch.set_num_threads(number)
    try:  # only possible before any inter-op work in this process (and only once)
        torch.set_num_interop_threads(number)
    except RuntimeError:
        pass


def configure(device: str | torch.device = "auto") -> torch.device | None:
    """Remember the device this process computes on; on the CPU, pin torch to :func:`threads` threads.

    Returns the resolved device (None where ``device`` cannot be resolved here: the
    experiment reports that itself). Called by the experiment runner and by
    :func:`dalign_repro.training.distributed.init`, before any model is built.
    """
    try:
        resolved = resolve_device(str(device))
    except (ValueError, RuntimeError):
        return None
    _state["device"] = resolved
    if resolved.type == "cpu":
        _pin(threads())
    return resolved


def configured() -> torch.device | None:
    """The device :func:`configure` last resolved in this process (None before its first call)."""
    return _state["device"]
