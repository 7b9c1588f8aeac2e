"""Profiles, the repository root (or working folder), and the base class of every experiment's config.

A profile names a scale at which every experiment runs:

* ``smoke``: seconds, for tests;
* ``lab``: a classroom's: each chapter in minutes on a 2-core laptop, with models that beat their baselines
  but too few of them to settle most width claims (each verdict states the slope it could have detected);
* ``cpu``: the default, a faithful small-scale reproduction on a 2-core laptop;
* ``gpu``: minutes on one GPU (each chapter within a short window);
* ``paper``: the paper's scales, hours on GPUs.

Each experiment's profiles are a TOML file beside its module, ``profiles/<experiment>.toml``, a table per
profile (:func:`read_profiles`, read by :meth:`ExperimentConfig.for_profile`). Any field of a profile's config
can be changed without editing them: ``--set field=value`` on an experiment's command line, ``make notebooks
SET='seeds=2 widths=[32, 64]'``, or a notebook's ``overrides`` parameter, each value a TOML value checked against
the field's type by :func:`parse_overrides`. A config that
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
import sys
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (the repro extra requires it there)
    import tomli as tomllib

__all__ = ["PROFILES", "REPO_ROOT", "SOURCE_ROOT", "STEP_SCHEDULES", "ExperimentConfig", "check_profile", "default_results_dir",
           "measurement_only", "added_field", "overrides_tag", "override_text", "parse_overrides", "profile_file", "read_profiles",
           "typed_value", "work_root", "require", "require_at_least", "require_items", "MAX_SEED"]

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
# Typed values: a profile file's values and ``field=value`` overrides, read as TOML and checked by the field's type

_NONE_WORDS = ("none", "null")
"""The words that give None to a field whose type allows it (TOML has no null)."""


def _type_name(kind: Any) -> str:
    """``tuple[int, ...] | None`` as written in the dataclass."""
    if isinstance(kind, type) and typing.get_origin(kind) is None:
        return kind.__name__
    return str(kind).replace("typing.", "")


def _options(kind: Any) -> tuple[Any, ...]:
    """The members of a union type (``kind`` alone when it is none)."""
    return typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)


def _takes_text(kind: Any) -> bool:
    """Whether a field of type ``kind`` holds a string (``str``, ``str | None``)."""
    return str in _options(kind)


def typed_value(kind: Any, value: Any) -> Any:
    """``value`` (as TOML, YAML or Python give it: lists, ints, floats, bools, strings) as a value of the annotated
    type ``kind``: a list becomes a tuple (item by item, pairs included), an int is a float where a float is asked
    for (kept as written, so its hash is the one it had), and ``"none"`` is None where ``kind`` allows it.
    Raises ValueError when the value is not of the type."""
    options = _options(kind)
    if type(None) in options and (value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS)):
        return None
    for option in (o for o in options if o is not type(None)):
        origin, args = typing.get_origin(option), typing.get_args(option)
        if origin is tuple and isinstance(value, (list, tuple)):
            items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
            if len(items) != len(value):
                continue
            try:
                return tuple(typed_value(item, element) for item, element in zip(items, value))
            except ValueError:
                continue
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if option is str and isinstance(value, str):
            return value
    raise ValueError(f"{value!r} is not of type {_type_name(kind)}")


def _toml_text(value: Any) -> str:
    """A value as a TOML value (what ``--set field=`` takes): JSON writes ints, floats, bools, strings and lists as
    TOML does."""
    return json.dumps(value)


def override_text(values: Mapping[str, Any]) -> str:
    """``{field: value}`` as the ``field=value ...`` text that ``--set`` and ``make notebooks SET=`` read back
    (``override_text({"steps": 150, "widths": (32, 64)})`` is ``"steps=150 widths=[32, 64]"``)."""
    return " ".join(f"{name}={_toml_text(list(v) if isinstance(v, tuple) else v)}" for name, v in values.items())


def _sample(kind: Any) -> Any:
    """A plain value of the annotated type ``kind`` (its first type other than None), for an example."""
    option = next(o for o in _options(kind) if o is not type(None))
    args = typing.get_args(option)
    if typing.get_origin(option) is tuple:
        return [_sample(args[0])] * 2 if len(args) == 2 and args[1] is Ellipsis else [_sample(a) for a in args]
    return {int: 3, float: 0.01, bool: True, str: "text"}.get(option, "text")


def _example(name: str, kind: Any, default: Any) -> str:
    """``name=<value>`` in TOML for the one-line error of a bad value: the field's default where it has one."""
    return f"{name}={_toml_text(_sample(kind) if default is None else default)}"


def _parse_text(kind: Any, text: str) -> Any:
    """``--set`` text as TOML (``[32, 64]``, ``[[4, 4], [16, 16]]``, ``1e-3``, ``true``, ``"llama"``); a bare word
    (``each_width``, ``dir:/a b``) is a string where the field holds one, and ``none`` is None where it allows it."""
    try:
        document = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        document = None
    if document is not None and list(document) == ["v"]:
        return typed_value(kind, document["v"])
    word = text.strip()
    if word.lower() in _NONE_WORDS and type(None) in _options(kind):
        return None
    if _takes_text(kind) and word:
        return word
    raise ValueError(f"{text!r} is not a TOML value")


def _split_assignments(text: str) -> list[str]:
    """``"a=1 b=[2, 3] c=\"x y=z\""`` -> ``["a=1", "b=[2, 3]", "c=\"x y=z\""]``: split at the spaces before a
    ``name=`` that lie outside quotes and brackets."""
    words, start = [], 0
    for space in re.finditer(r"\s+(?=[A-Za-z_]\w*\s*=)", text):
        before = text[start:space.start()]
        if before.count('"') % 2 == 0 and before.count("'") % 2 == 0 and before.count("[") == before.count("]"):
            words.append(before)
            start = space.end()
    words.append(text[start:])
    return [word.strip() for word in words if word.strip()]


def _assignments(text: "str | Iterable[str] | Mapping[str, Any] | None") -> list[tuple[str, Any]]:
    """``"a=1 b=[2, 3]"`` (assignments separated by the space before each ``name=``), a list of ``"a=1"`` (one each)
    or a mapping -> [(name, value)]."""
    if text is None:
        return []
    if isinstance(text, Mapping):
        return list(text.items())
    # One string (make's SET=, a notebook's overrides): a new assignment starts at each space before `name=` outside
    # a TOML string or array, so a value keeps its spaces and quotes ("widths=[32, 64] corpus=\"dir:/a b=c\""). A
    # list (the repeated --set): one assignment per item.
    words = _split_assignments(text) if isinstance(text, str) else [str(part) for part in text]
    pairs = []
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"override {word!r} is not field=value (e.g. steps=300, widths=[32, 64])")
        pairs.append((name.strip(), value))
    return pairs


def _fields(config_cls: type) -> dict[str, tuple[Any, Any]]:
    """``{field: (annotated type, default)}`` of a config dataclass."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: (hints.get(f.name, f.type),
                     f.default if f.default is not dataclasses.MISSING else
                     (f.default_factory() if f.default_factory is not dataclasses.MISSING else None))
            for f in dataclasses.fields(config_cls)}


def _unknown_field(config_cls: type, name: str, fields: Iterable[str]) -> str:
    near = difflib.get_close_matches(name, list(fields), n=3)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    return (f"{config_cls.__module__}.{config_cls.__qualname__} has no field {name!r}{hint} "
            f"Its fields: {', '.join(sorted(f for f in fields if f != 'profile'))}")


def parse_overrides(config_cls: type["ExperimentConfig"],
                    text: "str | Iterable[str] | Mapping[str, Any] | None", **defaults: Any) -> dict[str, Any]:
    """``{field: value}`` from ``field=value`` text, each value read as a TOML value and checked by the field's type.

    ``text`` is one string of assignments (``"seeds=2 steps=300 widths=[32, 64]"``, what ``make notebooks SET=...``
    and a notebook's ``overrides`` parameter hold; each new assignment starts at the space before its ``name=``), a
    list of them (the repeated ``--set`` of the command line), or a mapping (a ``--config`` file's; strings in it
    are read as text unless the field holds strings, other values checked as they are). Values are TOML's:
    ``300``, ``20_000``, ``1e-3``, ``true``, ``"cifar10"``, arrays ``[32, 64]`` and pairs ``[[4, 4], [16, 16]]``
    (tuples by the field's type); a bare word (``lr_fit=each_width``) is a string where the field holds one, and
    ``none`` is None where the field allows it. ``defaults`` are returned beneath the parsed values (a notebook's
    ``seed=seed``).

    The result goes to ``Config.for_profile(profile, **result)``. An unknown field, ``profile`` (chosen with
    ``--profile``) or a value of the wrong type raises ValueError in one line naming the field, its type and an
    example.
    """
    fields = _fields(config_cls)
    values = dict(defaults)
    for name, raw in _assignments(text):
        if name == "profile":
            raise ValueError("override profile=...: the profile is chosen on its own (--profile, PROFILE=, the "
                             "notebook's profile parameter), not as an override")
        if name not in fields:
            raise ValueError(_unknown_field(config_cls, name, fields))
        kind, default = fields[name]
        try:
            from_text = isinstance(raw, str) and not (isinstance(text, Mapping) and _takes_text(kind))
            values[name] = _parse_text(kind, raw) if from_text else typed_value(kind, raw)
        except ValueError as error:
            shown = raw if isinstance(raw, str) else _toml_text(raw)
            raise ValueError(f"override {name}={shown}: {name} is {_type_name(kind)} and {error}; give e.g. "
                             f"{_example(name, kind, default)}") from None
    return values


# ---------------------------------------------------------------------------
# Profiles as files: <experiment module's folder>/profiles/<module>.toml, a table per profile

PROFILE_FOLDER = "profiles"
"""The folder beside an experiment's module that holds its profile file (``profiles/<module>.toml``)."""


def profile_file(config_cls: type) -> Path | None:
    """The profile file of ``config_cls``: ``profiles/<module>.toml`` beside the module of the first class in its
    method resolution order that has one (a subclass in a test reads its experiment's file); None if none has.

    The file is named by the module's file, not its name: under ``python -m dalign_repro.experiments.<name>`` the
    module is ``__main__``."""
    for klass in config_cls.__mro__:
        source = getattr(sys.modules.get(klass.__module__), "__file__", None)
        if source:
            path = Path(source).parent / PROFILE_FOLDER / f"{Path(source).stem}.toml"
            if path.is_file():
                return path
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"profile file {path} is not valid TOML ({error})") from None


def _profile_tables(path: Path) -> dict[str, dict[str, Any]]:
    """The tables of a profile file, checked to be profiles, as TOML gives them."""
    tables = _read_toml(path)
    for profile, table in tables.items():
        if profile not in PROFILES or not isinstance(table, dict):
            raise ValueError(f"profile file {path}: [{profile}] is not a profile table; the tables are "
                             f"{', '.join(PROFILES)}")
    return tables


def _profile_table(path: Path, profile: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """One table of a profile file, its ``extends = "<file>.<profile>"`` replaced by that table (of
    ``profiles/<file>.toml`` in the same folder, itself resolved) beneath its own keys."""
    values = dict(_profile_tables(path)[profile])
    base = values.pop("extends", None)
    if base is None:
        return values
    stem, dot, other = str(base).rpartition(".")
    if not dot or other not in PROFILES or not path.with_name(f"{stem}.toml").is_file():
        raise ValueError(f"profile file {path} [{profile}]: extends = {base!r} must name a table of a profile file "
                         "beside it as '<file>.<profile>', e.g. 'llama_width.smoke'")
    here = f"{path.stem}.{profile}"
    if base in seen + (here,):
        raise ValueError(f"profile file {path} [{profile}]: extends comes back to itself "
                         f"({' -> '.join(seen + (here, base))})")
    base_table = _profile_tables(path.with_name(f"{stem}.toml"))
    if other not in base_table:
        raise ValueError(f"profile file {path} [{profile}]: extends = {base!r}, and {stem}.toml has no [{other}]")
    return {**_profile_table(path.with_name(f"{stem}.toml"), other, seen + (here,)), **values}


def read_profiles(config_cls: type) -> Mapping[str, Mapping[str, Any]]:
    """``{profile: {field: value}}`` of ``config_cls`` from its profile file (:func:`profile_file`), each value
    checked and typed by its field (TOML arrays become tuples); ``{}`` when it has no file. A field the config
    does not have, or a value not of the field's type, raises ValueError naming the file, the table and the field."""
    path = profile_file(config_cls)
    if path is None:
        return types.MappingProxyType({})
    fields = _fields(config_cls)
    profiles = {}
    for profile in _profile_tables(path):
        values = {}
        for name, value in _profile_table(path, profile).items():
            if name not in fields or name == "profile":
                raise ValueError(f"profile file {path} [{profile}]: {_unknown_field(config_cls, name, fields)}")
            kind, default = fields[name]
            try:
                values[name] = typed_value(kind, value)
            except ValueError as error:
                raise ValueError(f"profile file {path} [{profile}]: {name} is {_type_name(kind)} and {error}; "
                                 f"write e.g. {_example(name, kind, default).replace('=', ' = ', 1)}") from None
        profiles[profile] = types.MappingProxyType(values)
    return types.MappingProxyType(profiles)


class _ProfilesOfFile:
    """``Config.PROFILES``: the profiles of the config's file, read once per class (:func:`read_profiles`). A class
    may set ``PROFILES = {...}`` itself instead (a test's config)."""

    def __init__(self):
        self._read: dict[type, Mapping[str, Mapping[str, Any]]] = {}

    def __get__(self, instance: Any, owner: type) -> Mapping[str, Mapping[str, Any]]:
        if owner not in self._read:
            self._read[owner] = read_profiles(owner)
        return self._read[owner]


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
               + (" (e.g. [[4, 4], [16, 16]])" if pairs else ""))
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

    Subclasses are frozen dataclasses with a ``profile`` and a ``seed`` field. Their profiles live in a TOML
    file beside the experiment's module, ``profiles/<module>.toml``, a table per profile holding the field values
    that differ from the defaults (:func:`read_profiles`); ``PROFILES`` maps each profile name to them, and a class
    may set ``PROFILES = {...}`` in code instead. ``Config.for_profile("cpu", seed=3)`` builds one.
    """

    PROFILES: ClassVar[Mapping[str, Mapping[str, Any]]] = _ProfilesOfFile()

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
                        "each budget must be a whole number of at least 1 (pairs as [M, K], e.g. [[4, 4], [16, 16]])")

    @classmethod
    def for_profile(cls, profile: str = "cpu", **overrides):
        """The config for ``profile`` (smoke | lab | cpu | gpu | paper), with keyword ``overrides`` applied last.

        Overriding ``steps`` alone moves the profile's step schedules with it (``warmup_steps``,
        ``checkpoint_steps``, ``all_layer_steps``, ``train_pool_steps``, each scaled by the new over the
        old number of steps), so ``steps=300`` is a whole config; a schedule given too is taken as given.
        """
        check_profile(profile)
        if cls.PROFILES and profile not in cls.PROFILES:  # never run one profile's sizes under another's name
            where = profile_file(cls)
            raise ValueError(f"{cls.__qualname__} defines no settings for profile {profile!r} "
                             f"(it has {', '.join(cls.PROFILES)}); add a [{profile}] table to "
                             f"{where if where is not None else 'its PROFILES'}")
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
