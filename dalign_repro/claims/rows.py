"""What every claim row is made of: the :class:`Row`, the results it may read (only those the profile's current
config wrote: :func:`read_current`), the families and their regimes, and how a row names its scope.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dalign_repro.studies.interventions.draws import FAMILY_NAMES
from dalign_repro.report.describe import SCALE
from dalign_repro.report.results import read_table

__all__ = ["NOT_RUN", "Row", "STALE", "is_current", "load_current", "read_current", "is_stale", "regimes_of",
           "regime_part", "FAMILIES", "CONTEXT_CHAPTER", "scope_of", "primary_layer"]


NOT_RUN = "not run at this profile"


@dataclass(frozen=True)
class Row:
    """One claim at one scope, judged."""

    claim: str
    scope: str
    paper: str
    """What the paper reports, and where (section of its experiments)."""
    ours: str
    verdict: str
    chapter: str
    """The book chapter whose figure shows our data."""
    slope: float = math.nan
    slope_lo: float = math.nan
    slope_hi: float = math.nan
    detectable: float = math.nan
    """For a width claim: the slope on log width, its 95% interval and the smallest slope the design detects."""
    widths: str = ""
    """The widths judged, "/"-joined (a width claim's regime; empty elsewhere)."""
    depth: float = math.nan
    """Layers (blocks of a transformer; 20 for ResNet-20)."""
    context: float = math.nan
    """Tokens per sequence (language models)."""
    image_size: str = ""
    """Height × width of an input image (ResNet-20)."""
    train_tokens: float = math.nan
    """Tokens each run trained on (language models): passes over the training split × its tokens."""
    epochs: float = math.nan
    """Passes over the training split."""
    d_align_median: float = math.nan
    """Ours at the judged point: the median over runs and checkpoints of d_align at the checkpoints the claim reads."""
    reference: str = ""
    """What the row is judged against (a number or a sign) and where it comes from."""
    paper_regime: str = ""
    """The paper's regime for the claim (a description of the paper)."""
    regime: str = ""
    """Ours, in words, from the columns above."""
    at_this_scale: bool = False
    """Whether our regime differs from the paper's (:func:`dalign_repro.report.describe.at_this_scale`)."""
    shown: str = ""
    """The label as a page shows it: the verdict, with " at this scale" where ``at_this_scale``."""
    reference_slope: float = math.nan
    """The reference as a number where one was derived for the design (the misalignment claim: the slope of logit p̂
    the paper's d_align slope implies at the design's own (M, K) and d_align)."""
    matched_slope: float = math.nan
    matched_slope_lo: float = math.nan
    matched_slope_hi: float = math.nan
    """The matched-loss claim: the slope of log d_align read at the common held-out loss, its 95% interval over runs."""
    clock_slope: float = math.nan
    """The part of ``matched_slope`` a step-only model fitted on the same runs predicts (the training clock); the
    width term (``slope``) is the rest: ``matched_slope = clock_slope + slope``."""
    robustness: str = ""
    """The verdict's variants (without each width, at each insertion point, d_∥ and d_2) and what survives them."""
    label_survives: float = math.nan
    """1 where every variant gives the row's label, 0 where one does not (NaN: no variant)."""
    sign_survives: float = math.nan
    """+1 / −1 where the trend's sign holds in every variant (the interval on that side of 0 in each), 0 where it
    does not or the interval holds 0 (NaN: no variant)."""
    seed_spread: float = math.nan
    """Between seeds of one width: the median |Δ log d_align| between two seeds at one checkpoint (as a fraction)."""
    machine_spread: float = math.nan
    """Across machines (the one rerun measured: :data:`dalign_repro.claims.width.CROSS_MACHINE`): the median
    relative change of d_align per checkpoint."""
    spread: str = ""
    """The sentence comparing the two."""
    same_as: str = ""
    """Claims whose test reduces to this row's here (the same estimate and interval), reported once, in this row."""
    section: str = "claims"
    """``claims`` or ``checks of the computation``: a check that can barely fail is reported apart and never counted
    as a reproduction (:mod:`dalign_repro.claims.checks`)."""
    fail_chance: float = math.nan
    """A check: its simulated chance of failing under the plausible alternative ``alternative`` states."""
    alternative: str = ""

    def __post_init__(self):
        if not self.shown:
            scale = SCALE if self.at_this_scale and self.verdict != NOT_RUN else ""
            object.__setattr__(self, "shown", ("not run" if self.verdict == NOT_RUN else self.verdict) + scale)


_EXPERIMENTS = {"llama": "llama_width", "llama_context": "llama_context", "pythia": "pythia_width",
                "resnet": "resnet_width", "interventions": "interventions", "growth": "growth"}
"""The experiment whose profile config wrote each table (by the longest prefix of the table's name)."""
STALE = "results of an earlier design of this experiment: rerun its chapter"
"""What a claim reads in place of a result when its table was written by another config than the profile's."""


def is_current(results: Path, name: str, provenance: dict) -> bool:
    """Whether ``name`` was written by the current config of the folder's profile (its config hash).

    A folder of overrides (``<profile>+<hash>``) or of no known profile is taken as it is.
    """
    prefixes = [key for key in _EXPERIMENTS if name == key or name.startswith(key + "_")]
    experiment = _EXPERIMENTS[max(prefixes, key=len)] if prefixes else None
    if experiment is None or "+" in results.name:
        return True
    from importlib import import_module

    config = import_module(f"dalign_repro.experiments.{experiment}").Config
    if results.name not in config.PROFILES:
        return True
    return provenance.get("config_hash") == config.for_profile(results.name).config_hash()


def load_current(results: Path, name: str) -> tuple[pd.DataFrame | None, dict]:
    """The table and its provenance; (None, {}) when it does not exist or another config than the profile's wrote
    it (:func:`is_stale`)."""
    try:
        table, provenance = read_table(results, name)
    except FileNotFoundError:
        return None, {}
    return (table, provenance) if is_current(results, name, provenance) else (None, {})


def read_current(results: Path, name: str) -> pd.DataFrame | None:
    """The table alone (:func:`load_current`)."""
    return load_current(results, name)[0]


def is_stale(results: Path, name: str) -> bool:
    """Whether ``name`` exists but was written by another config than the profile's (an earlier design).

    Asked where :func:`read_current` gave None, so only the provenance is read: the table's checksum was checked there."""
    path = results / f"{name}.json"
    if not (path.is_file() and (results / f"{name}.csv").is_file()):
        return False
    return not is_current(results, name, json.loads(path.read_text()))


def regimes_of(table: pd.DataFrame | None, column: str | None) -> list:
    if table is None or table.empty:
        return []
    return sorted(table[column].unique()) if column and column in table else [None]


def regime_part(table: pd.DataFrame, column: str | None, value) -> pd.DataFrame:
    return table if column is None or column not in table else table[table[column] == value]


FAMILIES = (  # family, the column that tells its regimes apart, chapter
    ("llama", None, "02_llama_width"),
    ("pythia", "depth", "03_pythia_width"),
    ("resnet", "dataset", "04_resnet_width"),
)
CONTEXT_CHAPTER = "09_llama_context"
"""The chapter whose figures show the context study."""


_REGIME_NAMES = {"depth": "{} layers", "dataset": "{}", "context": "context {}"}
_NOT_RUN_REGIME = {"context": "context study"}
"""The scope of a regime column's family that has not run, where the family alone names another sweep."""


def scope_of(family: str, column: str | None, value) -> str:
    """"Pythia, 6 layers" for a regime; the family's name alone where it has one regime or has not run ("LLaMA,
    context study" for the context study, whose family name alone is the width sweep's)."""
    name = FAMILY_NAMES[family.split("_")[0]]
    if column is None:
        return name
    if value is None:
        return f"{name}, {_NOT_RUN_REGIME[column]}" if column in _NOT_RUN_REGIME else name
    return f"{name}, {_REGIME_NAMES[column].format(value)}"


def primary_layer(misalignment: pd.DataFrame) -> str | None:
    """The primary insertion point of a sweep: the layer its misalignment study used."""
    layers = misalignment.layer.dropna().unique() if "layer" in misalignment else []
    return layers[0] if len(layers) else None
