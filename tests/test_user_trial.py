"""scripts/user_trial.py: its classifier sorts each outcome into the class it belongs to, and a quick subset of the
trial (a few cases of each family) meets issue #39's bar, so a regression in a refusal shows here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("torchvision")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "user_trial.py"


@pytest.fixture(scope="module")
def trial_module():
    spec = importlib.util.spec_from_file_location("user_trial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["user_trial"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("expect, code, stderr, changed, check, outcome", [
    ("ok", 0, "", [], None, "ok"),
    ("refuse", 0, "", [], None, "silent wrong"),
    ("ok", 0, "", [], lambda o: "d_align 1.0, the loop gives 2.0", "silent wrong"),
    ("refuse", 1, "dalign: error: --seq-len must be at least 2\n", [], None, "clear error"),
    ("refuse", 1, "Traceback (most recent call last):\n  File x\nRuntimeError: boom\n", [], None, "raw traceback"),
    ("refuse", None, "", [], None, "hang"),
    ("refuse", 1, "dalign: error: x\n", ["inputs/data.txt"], None, "data lost"),
    ("ok", 0, "", ["results/old.csv"], None, "data lost"),
])
def test_each_outcome_lands_in_its_class(trial_module, expect, code, stderr, changed, check, outcome):
    case = trial_module.Case("f", "n", "cli", expect, check=check)
    result = trial_module.Outcome(case, code=code, stderr=stderr)
    trial_module.classify(result, changed)
    assert result.outcome == outcome, result.detail


def test_the_bar_counts_raw_tracebacks_and_wrong_answers(trial_module):
    def outcomes(*classes):
        return [trial_module.Outcome(trial_module.Case("f", str(i), "cli", "ok"), outcome=c)
                for i, c in enumerate(classes)]

    assert trial_module.summarize(outcomes("ok", "clear error", *["raw traceback"] * 5))[1]
    assert not trial_module.summarize(outcomes("ok", *["raw traceback"] * 6))[1]
    for bad in ("silent wrong", "data lost", "hang"):
        assert not trial_module.summarize(outcomes("ok", bad))[1]


def test_a_quick_trial_meets_the_bar(trial_module, tmp_path):
    """The first two and the last case of every family: command cases in forked children, API cases grouped."""
    outcomes = trial_module.run_trial(tmp_path, quick=True, verbose=False)
    table, met = trial_module.summarize(outcomes)
    families = {o.case.family for o in outcomes}
    assert len(outcomes) >= 100 and {"cli-estimate-llama", "exp-set-theory", "api-plain", "api-gpt2"} <= families
    assert {"own-cli-streams", "own-cli-arch-errors", "api-own-keys", "api-own-losses", "api-own-models"} <= families
    refused_valid = [o.case.name for o in outcomes if o.case.expect == "ok" and o.outcome == "clear error"]
    assert not refused_valid, refused_valid
    assert {o.outcome for o in outcomes} >= {"ok", "clear error"}  # the reference checks ran and refusals were seen
    assert met, table


def test_the_brute_force_u_statistic_is_an_independent_reference_that_can_disagree(trial_module):
    """The third round's reference (distinct index tuples of the Gram matrix) agrees with the project's estimator
    on the same q and tells apart a q 1% off, so a wrong capture cannot pass its check."""
    import torch

    own = trial_module._own_module()
    generator = torch.Generator().manual_seed(0)
    Q = torch.randn(10, 5, generator=generator, dtype=torch.float64) + 0.6
    assert own.geometry_check(Q, Q) is None
    assert own.geometry_check(Q, Q * 1.01) is not None
    wide = own.brute_force_geometry(Q.numpy())
    from dalign_core.geometry.estimators import estimate_geometry

    got = estimate_geometry(Q)
    for name in ("mean_sq", "mean_sq_sq", "directional", "cov_energy", "d_align"):
        assert abs(getattr(got, name) - wide[name]) <= 1e-9 * max(1.0, abs(wide[name])), name
