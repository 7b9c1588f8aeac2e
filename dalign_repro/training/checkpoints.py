"""Training checkpoints on disk: written atomically, listed, loaded, pruned.

A checkpoint is the folder ``checkpoint_dir/step_XXXXXXX/``: ``model.safetensors``
(weights) and, for resume points, ``state.pt`` (optimizer state, the step, global RNG
states, the loss history, the config), saved with plain tensors and Python scalars so it
loads with ``torch.load(weights_only=True)``, and ``meta.json``. A checkpoint folder is
written under a temporary name and renamed, so a crash never leaves a half-written
checkpoint; a file that cannot be read is refused with one sentence naming it and what
to do. :func:`dalign_repro.training.loop.train` decides when to write and prune them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

__all__ = ["list_checkpoints", "load_weights", "load_state", "CHECKPOINT_FORMAT", "history_rows", "history_tensors",
           "prune_checkpoints", "rng_state", "set_rng_state", "model_weights", "write_checkpoint"]

_STEP_DIR = "step_{:07d}"
CHECKPOINT_FORMAT = 1


def list_checkpoints(checkpoint_dir: "str | os.PathLike", *, resumable: bool = False) -> dict[int, Path]:
    """Complete checkpoint folders in ``checkpoint_dir``: step -> folder, sorted by step.

    ``resumable=True`` lists only those with optimizer state (resume points).
    """
    root = Path(checkpoint_dir)
    out = {}
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if not p.is_dir() or not p.name.startswith("step_"):
            continue
        try:
            step = int(p.name[5:])
        except ValueError:
            continue
        if (p / "model.safetensors").is_file() and (not resumable or (p / "state.pt").is_file()):
            out[step] = p
    return dict(sorted(out.items()))


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with each tied tensor kept once (safetensors refuses shared storage)."""
    seen: dict[tuple, str] = {}
    out = {}
    for k, v in model.state_dict().items():
        key = (v.device, v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if key in seen:  # a tied tensor: stored once, restored by load_state_dict(strict=False)
            continue
        seen[key] = k
        out[k] = v.detach().to("cpu", copy=True).contiguous()
    return out


def load_weights(model: torch.nn.Module, checkpoint: "str | os.PathLike | dict") -> torch.nn.Module:
    """Load weights into ``model`` from a checkpoint folder, a ``.safetensors`` file or a state dict."""
    if isinstance(checkpoint, dict):
        sd = checkpoint
    else:
        path = Path(checkpoint)
        if path.is_dir():
            path = path / "model.safetensors"
        try:
            sd = safetensors.torch.load_file(str(path))
        except Exception as err:  # noqa: BLE001  (safetensors' own error type, OSError: a file cut short or damaged)
            raise _damaged(path, err) from err
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # Only tied copies may be missing (they share storage with a loaded tensor).
    tied_ok = {k for k in missing if _is_tied(model, k, sd)}
    if unexpected or set(missing) - tied_ok:
        raise ValueError(f"checkpoint does not match the model: missing {sorted(set(missing) - tied_ok)}, "
                         f"unexpected {sorted(unexpected)}")
    return model


def _is_tied(model, key, sd) -> bool:
    state = model.state_dict()
    t = state[key]
    return any(k in sd and state[k].untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
               for k in state if k != key)


def load_state(checkpoint: "str | os.PathLike", map_location="cpu") -> dict[str, Any]:
    """The resume state of a checkpoint folder (``torch.load(..., weights_only=True)``)."""
    path = Path(checkpoint) / "state.pt"
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError) as err:  # a zip cut short, or damaged
        raise _damaged(path, err) from err


def _damaged(path: Path, err: BaseException) -> ValueError:
    """A checkpoint file that cannot be read: one sentence naming it and what to do."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ValueError(f"checkpoint file {path} cannot be read ({detail}): it was cut short or damaged; delete its "
                      f"folder {path.parent} and rerun the same command (the run resumes from an earlier checkpoint "
                      "or trains again)")


def write_checkpoint(root: Path, step: int, model, state: dict | None, meta: dict) -> Path:
    """Write checkpoint ``step`` (weights, optional resume ``state``, ``meta``) under ``root`` by temporary folder
    and rename; returns its folder."""
    final = root / _STEP_DIR.format(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint should be as readable as any other folder
    try:
        safetensors.torch.save_file(model_weights(model), str(tmp / "model.safetensors"), metadata={"step": str(step)})
        if state is not None:
            torch.save(state, tmp / "state.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        if final.exists():  # e.g. the same step written again after a resume: replace it
            trash = Path(tempfile.mkdtemp(prefix=f".old-{final.name}.", dir=root))
            os.replace(final, trash / final.name)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def prune_checkpoints(root: Path, keep_steps: set[int], current: int, keep_resume: int) -> None:
    """Delete resume state older than the newest ``keep_resume`` at or before ``current``, keeping the steps asked
    for."""
    resumable = [s for s in list_checkpoints(root, resumable=True) if s <= current]
    for s in resumable[:-keep_resume] if keep_resume > 0 else resumable:
        folder = root / _STEP_DIR.format(s)
        meta = _read_meta(folder)
        if s in keep_steps or meta.get("requested"):
            (folder / "state.pt").unlink(missing_ok=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _read_meta(folder: Path) -> dict:
    try:
        return json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def rng_state() -> dict[str, Any]:
    """The torch CPU generator's state and every CUDA device's, for a bitwise resume."""
    state = {"torch": torch.get_rng_state()}
    state["cuda"] = list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else []
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generator states saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def history_tensors(history: list[dict]) -> dict[str, torch.Tensor]:
    """The loss history (dicts of step, loss, lr) as three tensors, for a checkpoint."""
    return {
        "step": torch.tensor([h["step"] for h in history], dtype=torch.int64),
        "loss": torch.tensor([h["loss"] for h in history], dtype=torch.float64),
        "lr": torch.tensor([h["lr"] for h in history], dtype=torch.float64),
    }


def history_rows(t: dict[str, torch.Tensor]) -> list[dict]:
    """The loss history back from :func:`history_tensors`' three tensors."""
    return [{"step": int(s), "loss": float(l), "lr": float(r)}
            for s, l, r in zip(t["step"].tolist(), t["loss"].tolist(), t["lr"].tolist())]
