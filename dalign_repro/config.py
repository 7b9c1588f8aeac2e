"""Profiles, the repository root (or working folder), and the base class of every experiment's config.

A profile names a scale at which every experiment runs:

* ``smoke``: seconds, for tests;
* ``lab``: a classroom's: each chapter in minutes on a 2-core laptop, with models that beat their baselines
  but too few of them to settle most width claims (each verdict states the slope it could have detected);
* ``cpu``: the default, a faithful small-scale reproduction on a 2-core laptop;
* ``gpu``: minutes on one GPU (each chapter within a short window);
* ``paper``: the paper's scales, hours on GPUs.

Any field of a profile's config can be changed without editing the library: ``--set field=value``
on an experiment's command line, ``make notebooks SET='seeds=2 steps=300'``, or a notebook's
``overrides`` parameter, all parsed by :func:`parse_overrides` by the field's type. A config that
differs from its profile's writes its results to a folder of its own,
``results/<profile>+<hash of the differences>/`` (:func:`default_results_dir`), never over the
profile's.

This module sits at the bottom of the library (it imports nothing of dalign_core), so
the data layer, the experiments and the command line share one list of profiles.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
import shlex
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

__all__ = ["PROFILES", "REPO_ROOT", "SOURCE_ROOT", "STEP_SCHEDULES", "ExperimentConfig", "check_profile", "default_results_dir",
           "measurement_only", "added_field", "overrides_tag", "parse_overrides", "work_root", "require", "require_at_least",
           "require_items", "MAX_SEED"]

PROFILES = ("smoke", "lab", "cpu", "gpu", "paper")
"""smoke: seconds, for tests; lab: a classroom's five minutes a chapter; cpu: the default reproduction on a laptop;
gpu: minutes on one GPU; paper: the paper's scales."""


def _source_root() -> Path | None:
    """The source checkout this package runs from (the folder holding dalign's pyproject.toml beside the package)."""
    parent = Path(__file__).resolve().parent.parent
    pyproject = parent / "pyproject.toml"
    try:
        if pyproject.is_file() and 'name = "dalign"' in pyproject.read_text(encoding="utf-8"):
            return parent
    except OSError:  # pragma: no cover  (an unreadable file is no checkout of ours)
        pass
    return None


SOURCE_ROOT: Path | None = _source_root()
"""The repository root when dalign_core runs from a source checkout (``pip install -e .`` or the tree
itself); None when it is installed (e.g. into site-packages) without one."""


def work_root() -> Path:
    """Where ``results/``, ``checkpoints/`` and ``.cache/`` live by default.

    The repository root in a source checkout; installed without one, the current working
    directory (never the installed package's own folder).
    """
    return SOURCE_ROOT if SOURCE_ROOT is not None else Path.cwd()


REPO_ROOT = work_root()
"""The repository root (where ``results/``, ``checkpoints/`` and ``.cache/`` live by default).

Installed without a source checkout (:data:`SOURCE_ROOT` is None), the working directory at import;
:func:`work_root` gives the working directory at the time of the call."""


def check_profile(profile: str) -> str:
    """Return ``profile`` if it is one of :data:`PROFILES`, else raise ValueError listing them."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    return profile


def default_results_dir(profile: "str | ExperimentConfig", overrides: Mapping[str, Any] | None = None) -> Path:
    """``results/<profile>`` at the repository root, or in the working directory when installed without a
    source checkout (see :func:`work_root`; override with ``DALIGN_RESULTS``).

    With ``overrides`` (fields that differ from the profile's), or given a config instead of a profile name
    (its :meth:`~ExperimentConfig.overrides`), a config changed from its profile gets a folder of its own,
    ``results/<profile>+<overrides_tag(overrides)>``, so its results never land over the profile's.
    """
    if isinstance(profile, ExperimentConfig):
        if overrides is not None:
            raise TypeError("default_results_dir: pass a config or a profile with overrides, not both")
        profile, overrides = profile.profile, profile.overrides()
    root = Path(os.environ.get("DALIGN_RESULTS") or work_root() / "results")
    name = check_profile(profile)
    if overrides:
        name = f"{name}+{overrides_tag(overrides)}"
    return root / name


def overrides_tag(overrides: Mapping[str, Any]) -> str:
    """A short stable hash of ``{field: value}`` overrides (8 hex digits): the suffix of their results folder."""
    plain = json.loads(json.dumps(dict(overrides), default=str))
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:8]


# ---------------------------------------------------------------------------
# Overrides: ``field=value`` text parsed by the field's type

_NONE_WORDS = ("none", "null")
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


def _type_name(kind: Any) -> str:
    """``tuple[int, ...] | None`` as written in the dataclass."""
    if isinstance(kind, type) and typing.get_origin(kind) is None:
        return kind.__name__
    return str(kind).replace("typing.", "")


def _parse_scalar(kind: type, text: str) -> Any:
    word = text.strip()
    if kind is bool:
        if word.lower() in _TRUE_WORDS:
            return True
        if word.lower() in _FALSE_WORDS:
            return False
        raise ValueError(f"{word!r} is not a bool (true/false, yes/no, 1/0)")
    if kind is int:
        try:
            return int(word)
        except ValueError:
            try:
                number = float(word)
            except ValueError:
                number = None
            if number is not None and number.is_integer():  # 1e3
                return int(number)
            raise ValueError(f"{word!r} is not an int") from None
    if kind is float:
        try:
            return float(word)
        except ValueError:
            raise ValueError(f"{word!r} is not a float") from None
    if kind is str:
        quoted = len(word) >= 2 and word[0] == word[-1] and word[0] in "'\""
        return word[1:-1] if quoted else text  # "llama" as Python writes a string: the quotes are not the name
    raise ValueError(f"values of type {_type_name(kind)} cannot be given as text")


def _closing(text: str) -> int:
    """The index of the bracket that closes ``text[0]`` (-1 if none)."""
    depth = 0
    for index, char in enumerate(text):
        depth += char in "(["
        depth -= char in ")]"
        if depth == 0:
            return index
    return -1


def _split_items(text: str) -> list[str]:
    """``32,64`` or ``(32, 64)`` or ``[32 64]`` -> ['32', '64']; ``4x4,16x16`` / ``(4,4),(16,16)`` keep their pairs."""
    body = text.strip()
    if body[:1] in "([" and _closing(body) == len(body) - 1:  # one bracket around it all
        body = body[1:-1]
    items, depth, current = [], 0, ""
    for char in body:
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    items = [item.strip() for item in items]
    if len(items) > 1 and items[-1] == "":  # a trailing comma, as Python writes a one-item tuple: ("llama",)
        items = items[:-1]
    return [] if items == [""] else items


def _parse_value(kind: Any, text: str) -> Any:
    """``text`` as a value of the annotated type ``kind``; ValueError saying what was expected."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if type(None) in args and text.strip().lower() in _NONE_WORDS + ("",):
            return None
        errors = []
        for option in options:
            try:
                return _parse_value(option, text)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if origin is tuple:
        items = _split_items(text)
        if len(args) == 2 and args[1] is Ellipsis:
            element = args[0]
            if typing.get_origin(element) is tuple:  # pairs: 4x4,16x16 or 4:4,16:16 or (4,4),(16,16)
                items = [re.sub(r"^\s*(\S+?)\s*[x:]\s*(\S+)\s*$", r"\1,\2", item) if "," not in item else item
                         for item in items]
            return tuple(_parse_value(element, item) for item in items)
        if len(items) != len(args):
            raise ValueError(f"{text!r} has {len(items)} item(s), not {len(args)}")
        return tuple(_parse_value(element, item) for element, item in zip(args, items))
    if isinstance(kind, type):
        return _parse_scalar(kind, text)
    raise ValueError(f"values of type {_type_name(kind)} cannot be given as text")


def _assignments(text: "str | Iterable[str] | Mapping[str, Any] | None") -> list[tuple[str, Any]]:
    """``"a=1 b=2,3"`` (shell words; quotes keep spaces), a list of ``"a=1"`` (one each) or a mapping -> [(name, value)]."""
    if text is None:
        return []
    if isinstance(text, Mapping):
        return list(text.items())
    # One string: shell words (quotes keep spaces). A list (the repeated --set): one assignment per item.
    words = shlex.split(text) if isinstance(text, str) else [str(part) for part in text]
    pairs = []
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"override {word!r} is not field=value (e.g. steps=300, widths=32,64)")
        pairs.append((name.strip(), value))
    return pairs


def parse_overrides(config_cls: type["ExperimentConfig"],
                    text: "str | Iterable[str] | Mapping[str, Any] | None", **defaults: Any) -> dict[str, Any]:
    """``{field: value}`` from ``field=value`` text, each value parsed by the field's type in ``config_cls``.

    ``text`` is one string of whitespace-separated assignments (``"seeds=2 steps=300 widths=32,64"``,
    what ``make notebooks SET=...`` and a notebook's ``overrides`` parameter hold), a list of them (the
    repeated ``--set`` of the command line), or a mapping (values taken as they are when not strings).
    Types: ``int`` (``300``, ``20_000``, ``1e3``), ``float``, ``bool`` (true/false), ``str``, tuples
    (``widths=32,64``; pairs as ``budgets=4x4,16x16``), and ``None`` (``none``) where the field allows it.
    ``defaults`` are returned beneath the parsed values (a notebook's ``seed=seed``).

    The result goes to ``Config.for_profile(profile, **result)``. An unknown field, ``profile`` (chosen with
    ``--profile``) or a value of the wrong type raises ValueError naming the field and its type.
    """
    hints = typing.get_type_hints(config_cls)
    fields = {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(config_cls)}
    values = dict(defaults)
    for name, raw in _assignments(text):
        if name == "profile":
            raise ValueError("override profile=...: the profile is chosen on its own (--profile, PROFILE=, the "
                             "notebook's profile parameter), not as an override")
        if name not in fields:
            near = difflib.get_close_matches(name, fields, n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise ValueError(f"{config_cls.__module__}.{config_cls.__qualname__} has no field {name!r}{hint} "
                             f"Its fields: {', '.join(sorted(f for f in fields if f != 'profile'))}")
        kind = fields[name]
        if not isinstance(raw, str):
            values[name] = raw
            continue
        try:
            values[name] = _parse_value(kind, raw)
        except ValueError as error:
            raise ValueError(f"override {name}={raw!r}: {name} is {_type_name(kind)}, and {error}") from None
    return values


STEP_SCHEDULES = ("warmup_steps", "checkpoint_steps", "all_layer_steps", "train_pool_steps")
"""Fields measured in training steps that follow an override of ``steps`` (:meth:`ExperimentConfig.for_profile`)."""


def _rescaled_schedules(cls: type, values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The step schedules of ``cls`` at its profile's ``values``, scaled to ``overrides["steps"]`` (see for_profile)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if "steps" not in overrides or "steps" not in fields or "checkpoint_steps" not in fields:
        return {}

    def current(name):
        if name in values:
            return values[name]
        field = fields[name]
        return field.default if field.default is not dataclasses.MISSING else None

    old, new = current("steps"), overrides["steps"]
    if not isinstance(old, int) or not isinstance(new, int) or old <= 0 or new <= 0 or old == new:
        return {}
    scaled: dict[str, Any] = {}
    for name in STEP_SCHEDULES:
        if name not in fields or name in overrides or current(name) is None:
            continue
        value = current(name)
        if isinstance(value, int):
            scaled[name] = min(round(value * new / old), new)
        elif isinstance(value, (tuple, list)):
            scaled[name] = tuple(sorted({min(round(step * new / old), new) for step in value}))
    return scaled


MEASUREMENT_ONLY = "dalign_measurement_only"
"""The metadata key of a :func:`measurement_only` field."""
NEUTRAL = "dalign_neutral"
"""The metadata key of a field's neutral value (:func:`measurement_only`, :func:`added_field`)."""


def measurement_only(default: Any, *, neutral: Any) -> Any:
    """A config field that changes only what an experiment measures on its models, never the models, their
    training or the example pools drawn for them (e.g. how many pool examples a checkpoint before the last
    captures).

    ``neutral`` is the value that measures as the experiment did before the field existed. The field keys the
    experiment's own results where it differs from ``neutral`` (:meth:`ExperimentConfig.config_hash`), and never the
    studies that load the models (:meth:`ExperimentConfig.models_hash`). A subclass that changes the default
    declares the field again with the same ``neutral``.
    """
    return dataclasses.field(default=default, metadata={MEASUREMENT_ONLY: True, NEUTRAL: neutral})


def added_field(default: Any, *, neutral: Any) -> Any:
    """A config field added after results were committed, which may change the models (e.g. how a sweep fits its
    learning rates).

    ``neutral`` is the value that behaves as the experiment did before the field existed. The field enters both
    hashes only where it differs from ``neutral``, so adding it leaves every existing config's hashes, its committed
    results and the studies that load its models current. A subclass that changes the default declares the field
    again with the same ``neutral``.
    """
    return dataclasses.field(default=default, metadata={NEUTRAL: neutral})


def _is_measurement_only(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get(MEASUREMENT_ONLY))


def _at_neutral(config: Any, field: dataclasses.Field) -> bool:
    return NEUTRAL in field.metadata and getattr(config, field.name) == field.metadata[NEUTRAL]


def _hash_of(config: Any, omit) -> str:
    """The first 16 hex digits of the SHA-256 of ``config``'s JSON, without the fields ``omit`` (a predicate)."""
    values = config.to_dict()
    for field in dataclasses.fields(config):
        if omit(field):
            values.pop(field.name)
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


MAX_SEED = 2**63 - 1
"""The largest seed torch and numpy both accept."""


def require(config: Any, name: str, ok: bool, allowed: str) -> None:
    """Raise ValueError naming ``config``'s field ``name``, its value and what is ``allowed``, unless ``ok``.

    The message reads ``llama_width.Config: capture_batch=0 is not allowed; it must be a whole number of at least 1``:
    a config is checked where it is built (``__post_init__``), so a bad ``--set`` fails in one line before any
    work, not deep inside a run."""
    if not ok:
        owner = f"{type(config).__module__.rsplit('.', 1)[-1]}.{type(config).__qualname__}"
        raise ValueError(f"{owner}: {name}={getattr(config, name)!r} is not allowed; {allowed}")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def require_at_least(config: Any, minimums: Mapping[str, int]) -> None:
    """Check every field of ``minimums`` that ``config`` has (and is not None) is a whole number >= its minimum."""
    for name, least in minimums.items():
        value = getattr(config, name, None)
        if value is not None:
            require(config, name, _whole(value) and value >= least, f"it must be a whole number of at least {least}")


def require_items(config: Any, name: str, least: float, *, whole: bool = True, pairs: bool = False,
                  most: float | None = None) -> None:
    """Check the tuple field ``name`` is non-empty and each item (each number of each pair, with ``pairs``) is a
    finite number from ``least`` (to ``most``), whole where ``whole``."""
    items = getattr(config, name)
    kind = "whole numbers" if whole else "numbers"
    span = f"at least {least:g}" if most is None else f"from {least:g} to {most:g}"
    allowed = (f"it must be a non-empty list of {'(M, K) pairs of ' if pairs else ''}{kind} {span}"
               + (" (e.g. 4x4,16x16)" if pairs else ""))
    values = list(items) if isinstance(items, (tuple, list)) else None
    if pairs and values is not None:
        if not all(isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in values):
            values = None
        else:
            values = [number for pair in values for number in pair]

    def fine(v):
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return number and (not whole or _whole(v)) and v >= least and (most is None or v <= most)

    require(config, name, bool(values) and all(fine(v) for v in values), allowed)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Base class of every experiment's config dataclass.

    Subclasses are frozen dataclasses with a ``profile`` and a ``seed`` field and a
    class attribute ``PROFILES`` mapping each profile name to the field values that
    differ from the defaults.  ``Config.for_profile("cpu", seed=3)`` builds one.
    """

    PROFILES: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def __post_init__(self):
        """Check the fields every config may share (a subclass checks its own and calls this): ``seed``; no NaN in
        any float field (or tuple of floats); ``device`` a device name; ``dtype``, ``autocast_dtype`` a float type;
        ``hidden`` at least 1; each of ``budgets`` and ``retention_budget`` (numbers or (M, K) pairs) a whole
        number of at least 1. ``tests/test_bad_input.py`` checks that every experiment's config calls it."""
        seed = getattr(self, "seed", None)
        if seed is not None:
            require(self, "seed", _whole(seed) and 0 <= seed <= MAX_SEED,
                    f"it must be a whole number from 0 to {MAX_SEED}")

        def numbers(value):
            if isinstance(value, (tuple, list)):
                return [number for item in value for number in numbers(item)]
            return [value]

        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if any(isinstance(v, float) and math.isnan(v) for v in numbers(value)):
                require(self, field.name, False, "NaN is not a value of this field; give a number")
        device = getattr(self, "device", None)
        if isinstance(device, str):
            require(self, "device", re.fullmatch(r"auto|cpu|mps|(cuda|xpu)(:\d+)?", device) is not None,
                    "it must be auto, cpu, cuda, cuda:N or mps")
        for name, allowed in (("dtype", ("float32", "float64", "float16", "bfloat16")),
                              ("autocast_dtype", ("float16", "bfloat16"))):
            value = getattr(self, name, None)
            if isinstance(value, str):
                require(self, name, value in allowed, f"it must be one of {', '.join(allowed)}")
        require_at_least(self, {"hidden": 1})
        for name in ("budgets", "retention_budget"):
            value = getattr(self, name, None)
            if isinstance(value, (tuple, list)):
                require(self, name, bool(value) and all(_whole(v) and v >= 1 for v in numbers(value)),
                        "each budget must be a whole number of at least 1 (pairs as MxK, e.g. 4x4,16x16)")

    @classmethod
    def for_profile(cls, profile: str = "cpu", **overrides):
        """The config for ``profile`` (smoke | lab | cpu | gpu | paper), with keyword ``overrides`` applied last.

        Overriding ``steps`` alone moves the profile's step schedules with it (``warmup_steps``,
        ``checkpoint_steps``, ``all_layer_steps``, ``train_pool_steps``, each scaled by the new over the
        old number of steps), so ``steps=300`` is a whole config; a schedule given too is taken as given.
        """
        check_profile(profile)
        if cls.PROFILES and profile not in cls.PROFILES:  # never run one profile's sizes under another's name
            raise ValueError(f"{cls.__qualname__} defines no settings for profile {profile!r} "
                             f"(it has {', '.join(cls.PROFILES)}); add them to its PROFILES")
        values = dict(cls.PROFILES.get(profile, {}))
        values.update(_rescaled_schedules(cls, values, overrides))
        values.update(overrides)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"{cls.__qualname__} has no field(s) {unknown}; fields are {sorted(names)}")
        return cls(profile=profile, **values)

    def overrides(self) -> dict[str, Any]:
        """The fields whose values differ from this profile's config, ``{field: value}`` (JSON-ready values).

        Empty for a config built from its profile alone: its results belong in ``results/<profile>``.
        """
        mine = self.to_dict()
        try:
            base = type(self).for_profile(self.profile).to_dict()
        except (TypeError, ValueError):  # a subclass whose profiles cannot be built alone: compare nothing
            return {}
        return {name: value for name, value in mine.items() if base.get(name) != value}

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-ready values."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    def config_hash(self) -> str:
        """A short stable hash of the config: equal configs give equal hashes.

        A field with a neutral value (:func:`measurement_only`, :func:`added_field`) enters it only where it differs
        from that value (the one that behaves as before the field existed), so adding such a field leaves every
        existing config's hash, and so its committed results, current.
        """
        return _hash_of(self, omit=lambda f: _at_neutral(self, f))

    def models_hash(self) -> str:
        """A short stable hash of what determines the config's trained models and example pools: every field but
        the measurement-only ones (:func:`measurement_only`). Equal to :meth:`config_hash` where each of those is
        at its neutral value; an :func:`added_field` enters it where it differs from its neutral value. The studies
        that load a sweep's models (interventions, growth) key their reuse on it."""
        return _hash_of(self, omit=lambda f: _is_measurement_only(f) or _at_neutral(self, f))
