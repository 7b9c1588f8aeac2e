"""Load the model of a ``dalign`` subcommand: a causal language model and its tokenizer, or the
``nn.Module`` that ``--arch`` builds with a state dict loaded into it.

Safety and offline behaviour:

* A model is a local checkpoint folder (``save_pretrained`` output) or a Hugging
  Face model id, optionally at a revision (a branch, tag or commit of the Hub
  repository, e.g. Pythia's training checkpoints ``step1000``; for a local folder,
  the subfolder ``<folder>/<revision>/`` holding that checkpoint). Weights load
  from safetensors when the checkpoint has them; a ``pytorch_model.bin`` is read
  by transformers with ``torch.load(weights_only=True)``, so no pickled code ever
  runs; a pickle that needs more than plain tensors is refused with the steps to
  convert a trusted one to safetensors. ``trust_remote_code`` is always off.
* A checkpoint must fill the model its config describes: missing, unexpected or
  wrongly shaped tensors are refused (listed), never replaced by random
  initialization. A damaged safetensors file is refused before transformers opens it.
* A Hugging Face id is first looked up in the local cache. If it is not cached and
  the Hub is unreachable (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``, or no
  connection within a few seconds), loading fails at once with a :class:`LoadError`
  that says what to download and where to put it — never a hang.
* ``--arch module:callable`` builds any ``nn.Module``; ``--model`` is then a state dict
  (``.pt``, read with ``weights_only=True``, or ``.safetensors``) that must fill it exactly.

The examples they run on: :mod:`dalign_core.cli.examples`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import torch

from dalign_core.environment import offline_variable
from dalign_core.cli.errors import LoadError
from dalign_core.cli.llama import native_llama
from dalign_core.cli.regular_files import check_regular_files, check_revision_name

__all__ = ["LoadError", "ModelSource", "resolve_model_source", "revision_folders", "load_model", "load_tokenizer",
           "check_tokenizer_fits", "max_positions", "check_seq_len", "load_arch", "hub_cache", "hub_reachable",
           "unreachable_message"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a local folder, or a Hub id (cached or to download)."""

    spec: str
    path: str
    local: bool
    cached: bool = False
    revision: str | None = None
    """The Hub revision (branch, tag or commit) or the local revision folder's name; None: the default."""

    @property
    def hub_revision(self) -> str | None:
        """What ``from_pretrained(revision=...)`` gets: the revision for a Hub id, None for a local folder."""
        return None if self.local else self.revision

    @property
    def local_files_only(self) -> bool:
        return self.local or self.cached


def hub_cache() -> str:
    """The folder of the Hugging Face hub cache (``$HF_HUB_CACHE``, from ``$HF_HOME``), for messages that name it."""
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # pragma: no cover - very old huggingface_hub
        return "~/.cache/huggingface/hub"


def hub_reachable(timeout: float = _PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the model hub (``$HF_ENDPOINT``, else huggingface.co) opens within ``timeout``
    s."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def unreachable_message(kind: str, spec: str, flag: str, offline: str | None, revision: str | None = None) -> str:
    """What to do when ``spec`` is neither local nor cached; ``offline`` names the offline variable set, if any."""
    reason = f"{offline} is set" if offline else "the Hugging Face Hub cannot be reached from here"
    at = f" at revision {revision!r}" if revision else ""
    name = spec.split("/")[-1]
    folder = f"./{name}/{revision}" if revision else f"./{name}"
    rev_flag = f" --revision {revision}" if revision else ""
    return (
        f"{kind} {spec!r}{at} is not a local {'folder' if kind == 'model' else 'file'}, it is not in the Hugging Face "
        f"cache ({hub_cache()}), and {reason}. Either download it on a machine with network access, e.g. "
        f"`hf download {spec}{' --repo-type dataset' if kind == 'dataset' else ''}{rev_flag} --local-dir {folder}`, "
        f"copy that folder here and pass {flag} ./{name}{rev_flag}"
        + (" (a folder with config.json, model.safetensors and the tokenizer files)" if kind == "model" else "")
        + f"; or copy a Hugging Face cache that holds it to {hub_cache()} (or point HF_HOME at it)"
        + (f"; or unset {offline} if this machine has network access" if offline else "")
        + "."
    )


def revision_folders(folder: str | os.PathLike) -> list[str]:
    """Names of the subfolders of ``folder`` that hold a checkpoint (a ``config.json``), sorted; [] if none."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return []
    names = [p.name for p in folder.iterdir() if p.is_dir() and (p / "config.json").is_file()]

    def key(name: str):  # step0 < step1000 < step143000, then the rest by name
        digits = name[4:] if name.startswith("step") else ""
        return (0, int(digits), name) if digits.isdigit() else (1, 0, name)

    return sorted(names, key=key)


def _local_revision(path: Path, spec: str, revision: str) -> ModelSource:
    """The checkpoint ``<path>/<revision>/`` of a revision-folder layout, or a LoadError listing those present."""
    check_revision_name(path, revision, revision_folders(path))
    sub = path / revision
    if sub.is_dir() and (sub / "config.json").is_file():
        return ModelSource(spec, str(sub), local=True, revision=revision)
    present = revision_folders(path)
    if sub.is_dir():
        problem = f"{str(sub)!r} has no config.json (it must be the output of model.save_pretrained(folder))"
    else:
        problem = f"model folder {str(path)!r} has no revision folder {revision!r}"
    listing = (f"revisions present: {', '.join(present)}" if present else
               "it holds no revision folders (subfolders with a config.json)")
    layout = f" Expected layout: {path}/<revision>/config.json, e.g. `hf download <id> --revision {revision} " \
             f"--local-dir {path}/{revision}`."
    if (path / "config.json").is_file():
        layout += " The folder itself is a single checkpoint: drop --revision to use it."
    raise LoadError(f"{problem}; {listing}.{layout}")


def resolve_model_source(spec: str, revision: str | None = None) -> ModelSource:
    """Decide whether ``spec`` is a local checkpoint folder or a Hub id, failing fast when neither can work.

    ``revision``: for a Hub id, the branch, tag or commit to load (e.g. ``"step1000"``);
    for a local folder, the subfolder ``<spec>/<revision>/`` that holds the checkpoint.
    """
    revision = revision or None
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"--model {spec!r} is a file; pass the checkpoint folder (save_pretrained output) instead")
        check_regular_files(path, "model folder")
        if revision is not None:
            source = _local_revision(path, spec, revision)
            check_regular_files(Path(source.path), "model folder")
            return source
        if not (path / "config.json").is_file():
            present = revision_folders(path)
            if present:
                raise LoadError(f"model folder {str(path)!r} holds one checkpoint per revision ({', '.join(present)}); "
                                "choose one with --revision")
            raise LoadError(
                f"model folder {str(path)!r} has no config.json; it must be the output of model.save_pretrained(folder)"
            )
        return ModelSource(spec, str(path), local=True)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or os.sep in spec.replace("/", "")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        looks_like_path = True
    if looks_like_path:
        raise LoadError(f"model folder {spec!r} does not exist (and it is not a Hugging Face model id)")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(spec, "config.json", revision=revision)
    if isinstance(cached, str):
        return ModelSource(spec, spec, local=False, cached=True, revision=revision)
    offline = offline_variable()
    if offline or not hub_reachable():
        raise LoadError(unreachable_message("model", spec, "--model", offline, revision))
    return ModelSource(spec, spec, local=False, cached=False, revision=revision)


def _check_local_weights(folder: Path) -> bool:
    """True if the folder has safetensors weights; raise if it has no weights we may load."""
    if any(folder.glob("*.safetensors")):
        return True
    if any(folder.glob("pytorch_model*.bin")):
        return False  # transformers reads these with torch.load(weights_only=True)
    raise LoadError(
        f"model folder {str(folder)!r} has no weights (model.safetensors or pytorch_model.bin); "
        "save them with model.save_pretrained(folder)"
    )


def _check_safetensors_files(folder: Path) -> None:
    """Refuse a truncated or corrupt ``*.safetensors`` file by reading its header (no tensor data)."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as err:
            raise LoadError(
                f"{str(file)!r} is not a valid safetensors file ({err}); it is probably truncated or corrupt: "
                "download or save the checkpoint again (model.save_pretrained(folder))"
            ) from err


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """Silence transformers' loading report and progress bar: :func:`_check_loading_info` reports what matters."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _listing(keys, limit: int = 8) -> str:
    keys = sorted(str(k) for k in keys)
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _tied_to_loaded(model, missing: set[str]) -> set[str]:
    """Missing parameter names that share their storage with a loaded parameter (tied weights)."""
    loaded = {p.data_ptr() for name, p in model.named_parameters(remove_duplicate=False) if name not in missing}
    tied = set()
    for name in missing:
        try:
            if model.get_parameter(name).data_ptr() in loaded:
                tied.add(name)
        except AttributeError:
            continue
    return tied


def _check_loading_info(model, info: dict, where: str) -> None:
    """Refuse a checkpoint whose tensors do not fill the model: missing, unexpected or mismatched names."""
    missing = set(info.get("missing_keys") or ())
    missing -= _tied_to_loaded(model, missing)
    unexpected = set(info.get("unexpected_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) the model needs are missing ({_listing(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) in the checkpoint are not in the model ({_listing(unexpected)})")
    if mismatched:
        shapes = [f"{name} {tuple(stored)} in the checkpoint, {tuple(wanted)} in the config"
                  for name, stored, wanted in sorted(mismatched)[:4]]
        more = f" and {len(mismatched) - 4} more" if len(mismatched) > 4 else ""
        problems.append(f"{len(mismatched)} tensor shape(s) differ from the config ({'; '.join(shapes)}{more})")
    if problems:
        raise LoadError(
            f"the checkpoint in {where} does not match its config.json: {'; '.join(problems)}. These weights would be "
            "random, so nothing is computed; use the config.json saved with these weights (model.save_pretrained(folder) "
            "writes both)"
        )


def _unpickler_detail(err: Exception) -> str:
    """What torch's weights-only unpickler objected to (e.g. ``Unsupported global: GLOBAL print``), or ''."""
    _, _, after = str(err).partition("WeightsUnpickler error:")
    lines = [line.strip() for line in after.splitlines() if line.strip()]
    return lines[0].split(" was not an allowed global")[0][:120] if lines else ""


def _unpickling_message(spec: str, err: Exception) -> str:
    """A refused pickle (it names a function or class, so loading it could run code) or a damaged one."""
    detail = _unpickler_detail(err)
    if not detail.startswith("Unsupported global"):
        return (f"the pickle checkpoint (pytorch_model.bin) of {spec!r} cannot be read ({detail or err}); it is "
                "probably truncated or corrupt: download or save the checkpoint again")
    return (
        f"the pickle checkpoint (pytorch_model.bin) of {spec!r} was refused because loading it could run code "
        f"(torch.load with weights_only=True found more than tensors: {detail}). If you trust where it came from, "
        "convert it once to safetensors in a trusted session: model = AutoModelForCausalLM.from_pretrained(folder, "
        "weights_only=False); model.save_pretrained(new_folder, safe_serialization=True), copy the tokenizer files "
        "there too, and pass --model new_folder"
    )


def _load_error(source: ModelSource, err: Exception) -> LoadError:
    where = "folder" if source.local else ("cached model" if source.cached else "model id")
    hint = ""
    if source.cached:
        rev = f" --revision {source.revision}" if source.revision else ""
        hint = (f" Its config is cached but other files are missing; download the whole model "
                f"(`hf download {source.spec}{rev}`) while online.")
    at = f" at revision {source.revision!r}" if source.revision else ""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return LoadError(f"could not load the {where} {source.spec!r}{at} as a causal language model: {reason}.{hint}")


def load_model(source: ModelSource | str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               revision: str | None = None, native: bool = True):
    """Load a causal LM from a :class:`ModelSource` (or spec) in eval mode on ``device``.

    ``dtype`` defaults to float32, whatever the stored dtype, so that capture and
    estimation are not limited by half precision. A Hub source loads at its
    ``revision``; ``revision`` applies to a string ``source`` (see :func:`resolve_model_source`).

    A local folder of a plain LLaMA (``LlamaForCausalLM``, the default rotary embedding, safetensors weights that
    fit its config) is built by :mod:`dalign_core.cli.llama` without importing transformers: the same modules and
    numbers, seconds sooner. ``native=False``, and every other checkpoint, load through transformers.

    Raises:
        LoadError: no or damaged weights, a pickle that ``weights_only`` refuses, or
            a checkpoint whose tensors do not match the config (missing, unexpected
            or differently shaped; tied weights are fine).
    """
    if isinstance(source, str):
        source = resolve_model_source(source, revision)
    from safetensors import SafetensorError

    kwargs = dict(trust_remote_code=False, local_files_only=source.local_files_only, revision=source.hub_revision)
    if source.local:
        kwargs["use_safetensors"] = True if _check_local_weights(Path(source.path)) else None
        _check_safetensors_files(Path(source.path))
        if native:
            model, _ = native_llama(source.path, dtype or torch.float32)
            if model is not None:
                return model.to(device)
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source.path, **{k: v for k, v in kwargs.items() if k != "use_safetensors"})
        with _transformers_quiet():
            model, info = AutoModelForCausalLM.from_pretrained(
                source.path, config=config, dtype=dtype or torch.float32, output_loading_info=True,
                ignore_mismatched_sizes=True, **kwargs
            )
    except pickle.UnpicklingError as err:
        raise LoadError(_unpickling_message(source.spec, err)) from err
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
        raise _load_error(source, err) from err
    _check_loading_info(model, info, f"{'folder' if source.local else 'model'} {source.spec!r}")
    from dalign_core.capture.losses import causal_lm_problem  # transformers' own warning about it is silenced above

    problem = causal_lm_problem(model)
    if problem:
        raise LoadError(f"{'folder' if source.local else 'model'} {source.spec!r} is not a causal language model: "
                        f"{problem}; pass a causal LM (GPT-2, LLaMA, Pythia, ...)")
    return model.to(device).eval()


def check_tokenizer_fits(tokenizer, model) -> None:
    """Refuse a tokenizer that can produce token ids beyond the model's input embedding."""
    embedding = model.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise LoadError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding only {rows}, so some token ids "
            "have no embedding: use the tokenizer the model was trained with (--tokenizer)"
        )


def _position_field(model) -> tuple[str, int] | None:
    """(name, value) of the config field that bounds the sequence length; None if the config states none."""
    from dalign_core.capture.batches import position_limit as _position_limit  # noqa: PLC0415  (one reading of the config's position fields)

    return _position_limit(model)


def max_positions(model) -> int | None:
    """The longest sequence the model's config allows (``max_position_embeddings``, ``n_positions``); None if unstated."""
    field = _position_field(model)
    return field[1] if field else None


def check_seq_len(model, seq_len: int) -> None:
    """Refuse sequences longer than the model's maximum position count."""
    field = _position_field(model)
    if field is not None and seq_len > field[1]:
        name, limit = field
        raise LoadError(
            f"--seq-len {seq_len} is longer than the {limit} positions the model was built for "
            f"(config.{name}); use --seq-len {limit} or less"
        )


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in _TOKENIZER_FILES)


def _tokenizer_file(source: ModelSource):
    """The source's ``tokenizer.json`` read without transformers, where transformers would read it unchanged
    (:mod:`~dalign_core.cli.tokenizer_file`); None otherwise, or when it is neither local nor cached."""
    from dalign_core.cli.tokenizer_file import read_tokenizer_file

    if source.local:
        folder = Path(source.path)
        files = [folder / "tokenizer.json", folder / "tokenizer_config.json"]
    else:
        from huggingface_hub import try_to_load_from_cache

        found = [try_to_load_from_cache(source.path, name, revision=source.hub_revision)
                 for name in ("tokenizer.json", "tokenizer_config.json")]
        files = [Path(each) if isinstance(each, str) else None for each in found]
    if files[0] is None or not files[0].is_file():
        return None
    return read_tokenizer_file(files[0], files[1])


def load_tokenizer(source: ModelSource | str, revision: str | None = None):
    """Load the tokenizer stored with the model, or at a folder or Hub id; ``trust_remote_code`` stays off.

    A generic fast tokenizer (a ``tokenizer.json`` that transformers takes as it is) is read by ``tokenizers`` alone
    (a :class:`~dalign_core.cli.tokenizer_file.FileTokenizer`: the same ids and length, without transformers'
    start-up); any other through ``AutoTokenizer``.

    ``revision`` applies to a string ``source`` as in :func:`resolve_model_source`. A
    local revision folder without tokenizer files uses its parent folder's, so a
    layout ``<folder>/{tokenizer.json, step0/, step1000/, ...}`` stores it once.
    """
    if isinstance(source, str):
        folder = Path(source).expanduser()
        if folder.is_dir() and revision is None:
            source = ModelSource(source, str(folder), local=True)
        else:
            source = resolve_model_source(source, revision)
    if source.local:
        folder = Path(source.path)
        if source.revision and not _has_tokenizer(folder) and _has_tokenizer(folder.parent):
            folder = folder.parent
            source = ModelSource(source.spec, str(folder), local=True, revision=source.revision)
        check_regular_files(folder, "tokenizer folder")
        if not _has_tokenizer(folder):
            raise LoadError(
                f"folder {str(folder)!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}). Save the tokenizer "
                f"the model was trained with there (tokenizer.save_pretrained({str(folder)!r})), or pass --tokenizer "
                "PATH_OR_ID"
            )
    fast = _tokenizer_file(source)
    if fast is not None:
        return fast
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.path, trust_remote_code=False,
                                             local_files_only=source.local_files_only, revision=source.hub_revision)
    except (OSError, ValueError, KeyError) as err:
        raise LoadError(f"could not load a tokenizer from {source.spec!r}: {err}") from err


# ---------------------------------------------------------------------------
# --arch: any nn.Module a callable builds


def load_arch(args: argparse.Namespace, device):
    """The model ``--arch`` builds, with the state dict ``--model`` loaded into it (strictly), in eval mode."""
    model = _built_arch(args)
    state = _read_state_dict(args.model)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise LoadError(f"--model {args.model!r} does not match the model {args.arch} builds "
                        f"({str(err).splitlines()[0]}); check --arch-kwargs") from err
    return model.to(device).eval()


def _built_arch(args: argparse.Namespace):
    """The ``nn.Module`` that ``--arch module:callable`` returns when called with ``--arch-kwargs`` (a JSON
    object); every way this fails is a one-line ValueError naming the flag."""
    import importlib
    import json

    module_name, _, attr = args.arch.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--arch must read module:callable (e.g. torchvision.models:resnet18), got {args.arch!r}")
    try:
        kwargs = json.loads(args.arch_kwargs)
    except json.JSONDecodeError as err:
        raise ValueError(f"--arch-kwargs is not JSON ({err}): write e.g. '{{\"num_classes\": 10}}'") from err
    if not isinstance(kwargs, dict):
        raise ValueError(f"--arch-kwargs must be a JSON object, got {args.arch_kwargs!r}")
    try:
        builder = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--arch {args.arch!r} cannot be imported: {err}") from err
    if not callable(builder):
        raise ValueError(f"--arch {args.arch!r} is a {type(builder).__name__}, not something to call")
    try:
        model = builder(**kwargs)
    except Exception as err:  # noqa: BLE001  (the user's code: any error is theirs to fix, in one line)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"--arch {args.arch!r} raised {type(err).__name__} when called with --arch-kwargs "
                         f"{json.dumps(kwargs)}{': ' + first if first else ''}; check --arch-kwargs") from err
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise ValueError(f"--arch {args.arch!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _read_state_dict(model_arg: str) -> dict:
    """The state dict in file ``--model`` (``.safetensors``, else a ``torch.save`` of tensors, read with
    ``weights_only``); a missing, special, damaged or non-dict file is a one-line LoadError."""
    path = Path(model_arg).expanduser()
    if path.exists() and not path.is_file() and not path.is_dir():
        raise LoadError(f"--model {model_arg!r} is not a regular file (a pipe, socket or device), which could block "
                        "reading it forever; with --arch it is the state dict file (.pt or .safetensors)")
    if not path.is_file():
        raise LoadError(f"--model {model_arg!r} does not exist or is not a file; with --arch it is the state dict "
                        "(torch.save(model.state_dict(), 'weights.pt') or a .safetensors file)")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise LoadError(f"--model {str(path)!r} is not a readable safetensors file ({str(err).strip() or 'damaged'}); "
                            "it may be cut short: save it again (safetensors.torch.save_file)") from err
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001  (a pickle that is more than tensors, or a damaged file)
            raise LoadError(f"--model {model_arg!r} could not be read as a state dict of tensors: "
                            f"{str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from err
    if not isinstance(state, dict):
        raise LoadError(f"--model {model_arg!r} holds a {type(state).__name__}, not a state dict; save "
                        "model.state_dict()")
    return state

