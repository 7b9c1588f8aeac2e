"""The sweep's measurement: one capture pass per checkpoint and pool serves every reduction, with the tables of a
pass per reduction bit for bit, and the determinism self-check runs once per model (its first capture)."""

from __future__ import annotations

import pandas as pd
import pytest

from test_sweep import ToyConfig, ToyFamily

from dalign_core.capture.hooks import accumulate_geometry
from dalign_repro.sweep import measure
from dalign_repro.sweep import run as sweep


class TwoReductionFamily(ToyFamily):
    reductions = ("full", "shared")  # as the Pythia and ResNet-20 families


@pytest.fixture
def checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DALIGN_WORKERS", "1")  # the measurement in this process, where the capture is recorded
    return tmp_path / "checkpoints"


def _recorded(calls, capture):
    def recording(model, layer, batches, *, reduction="shared", check_determinism=True, **kwargs):
        calls.append({"model": model, "reduction": reduction, "check": check_determinism})
        return capture(model, layer, batches, reduction=reduction, check_determinism=check_determinism, **kwargs)
    return recording


def _pass_per_reduction(model, layer, batches, *, reduction="shared", **kwargs):
    """The measurement before one pass served every reduction: a capture of its own for each reduction."""
    if isinstance(reduction, str):
        return accumulate_geometry(model, layer, batches, reduction=reduction, **kwargs)
    batches = list(batches)
    return {each: accumulate_geometry(model, layer, batches, reduction=each, **kwargs) for each in reduction}


def test_one_capture_serves_every_reduction_and_checks_determinism_once_per_model(checkpoints, monkeypatch):
    config, family = ToyConfig(widths=(8, 16), seeds=1, lr_candidates=(3e-2,)), TwoReductionFamily()
    calls = []
    monkeypatch.setattr(measure, "accumulate_geometry", _recorded(calls, accumulate_geometry))
    together, _ = sweep.run_sweep(config, family)
    models = list(dict.fromkeys(id(call["model"]) for call in calls))  # the calls hold the models: ids are unique
    assert len(models) == len(config.widths) * config.seeds
    pools = sum(2 if step in config.train_pool_checkpoints else 1 for step in config.checkpoint_steps)
    for model in models:
        mine = [call for call in calls if id(call["model"]) == model]
        captures = [call for call in mine if not isinstance(call["reduction"], str)]
        assert len(captures) == pools  # one capture per (checkpoint, pool), not one per reduction
        assert all(tuple(call["reduction"]) == family.reductions for call in captures)
        assert [call["check"] for call in mine] == [True] + [False] * (len(mine) - 1)  # the model's first capture

    calls.clear()
    monkeypatch.setattr(measure, "accumulate_geometry", _recorded(calls, _pass_per_reduction))
    separate, _ = sweep.run_sweep(config, family)
    for name in ("toy_geometry", "toy_misalignment"):  # from the same checkpoints (the second sweep loads them)
        pd.testing.assert_frame_equal(together[name], separate[name], check_exact=True)
    assert set(together["toy_geometry"].reduction) == set(family.reductions)
    assert together["toy_geometry"].groupby("reduction").size().tolist() == [len(models) * pools * 2] * 2  # 2 layers
