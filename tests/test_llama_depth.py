"""LLaMA at depth 4: models with enough insertion points to rank, trained as the width sweep trains its models."""

import pandas as pd
import pytest

from dalign_repro.config import REPO_ROOT
from dalign_repro.experiments import llama_depth, llama_width
from dalign_repro.report.results import read_table
from dalign_repro.studies.growth import MIN_POINTS
from dalign_repro.sweep.trained import checkpoint_root

CPU = REPO_ROOT / "results" / "cpu"


def test_only_the_depth_and_the_measurement_differ_from_the_width_sweep():
    """Every field that sets the weights but depth, widths, seeds and the rate fit is the width sweep's, so the
    depth-4 models are the width sweep's family grown deeper, and they are kept apart from its checkpoints."""
    deep, wide = llama_depth.Config.for_profile("cpu"), llama_width.Config.for_profile("cpu")
    fit = {"depth", "widths", "seeds", "lr_candidates", "lr_fit", "lr_extend", "lr_trial_fraction",
           "checkpoint_steps"}  # where checkpoints are kept (the measurement), not what the weights are
    for name in deep.SHARED_TRAINING_FIELDS + llama_depth.FAMILY.training_fields:
        if name not in fit:
            assert getattr(deep, name) == getattr(wide, name), name
    assert deep.depth >= MIN_POINTS and max(deep.widths) <= max(wide.widths)
    assert checkpoint_root(deep, llama_depth.FAMILY) != checkpoint_root(wide, llama_width.FAMILY)


def test_each_width_trains_at_the_rate_the_width_sweep_chose():
    """The committed width sweep's rate at each width it trained is the rate the depth-4 models train at there, and
    a width between (96) takes the sweep's N = 32 rate carried as 1/N, as the sweep's fit kept it up to 128."""
    deep = llama_depth.Config.for_profile("cpu")
    chosen = pd.read_csv(CPU / "llama_runs.csv").groupby("width").lr.first()
    runs, _ = read_table(CPU, "llama_depth_runs")
    for width, lr in runs.groupby("width").lr.first().items():
        expected = chosen[width] if width in chosen else chosen[32] * 32 / width
        assert lr == pytest.approx(expected, rel=5e-3), width  # a scaled rate is kept to 3 significant digits
    assert sorted(runs.width.unique()) == list(deep.widths) and (runs.depth == deep.depth).all()


def test_the_smoke_models_have_a_point_per_decoder_layer(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    config = llama_depth.Config.for_profile("smoke")
    out = llama_depth.run(config, out_dir=tmp_path)
    runs, provenance = read_table(out, "llama_depth_runs")
    assert len(runs) == len(config.widths) * config.seeds and set(runs.depth) == {4}
    assert set(runs.model) == {f"llama-N{w}-L4" for w in config.widths}
    geometry, _ = read_table(out, "llama_depth_geometry")
    assert {f"model.layers.{i}" for i in range(4)} <= set(geometry.layer)


def test_a_bad_config_is_refused():
    with pytest.raises(ValueError, match="insertion_layer"):
        llama_depth.Config(depth=1)
