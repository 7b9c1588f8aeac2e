"""The context study: its corpus (the pinned packages' sources), its design, its readings and its verdict's power."""

import math

import numpy as np
import pandas as pd
import pytest

from dalign_repro.sweep import trend
from dalign_repro.config import REPO_ROOT
from dalign_repro.data import python_sources
from dalign_repro.data.corpora import load_corpus
from dalign_repro.experiments import llama_context
from dalign_repro.report.results import read_table

CPU = REPO_ROOT / "results" / "cpu"


# ---------------------------------------------------------------------------
# The corpus


def test_the_pinned_sources_match_the_manifest_and_split_by_whole_package():
    corpus = load_corpus("python-sources")
    packages = python_sources.source_packages()
    for split in ("train", "validation", "test"):
        names = getattr(corpus, f"{split}_names")
        expected = {p.name for p in packages if p.split == split}
        assert {name.split("/")[0] for name in names} == expected  # no package straddles two splits
        assert sum(map(len, getattr(corpus, f"{split}_texts"))) == sum(p.chars for p in packages if p.split == split)
    assert "numpy==" in corpus.source and "whole packages" in corpus.split_rule


def test_a_changed_install_or_version_is_refused_with_the_command_that_fixes_it(monkeypatch):
    manifest = python_sources._manifest()
    numpy = next(p for p in manifest["packages"] if p["name"] == "numpy")
    tampered = {**manifest, "packages": [{**numpy, "sha256": "0" * 64}]}
    monkeypatch.setattr(python_sources, "_manifest", lambda: tampered)
    with pytest.raises(ValueError, match=r"differ from the manifest.*pip install --force-reinstall --no-deps numpy=="):
        python_sources.load_python_sources()
    monkeypatch.setattr(python_sources, "_manifest", lambda: {**manifest, "packages": [{**numpy, "version": "0.0.1"}]})
    with pytest.raises(ValueError, match=r"needs numpy==0\.0\.1 but .* is installed"):
        python_sources.load_python_sources()


def test_the_digest_depends_on_every_path_and_byte():
    files = [("a/x.py", b"print(1)\n"), ("a/y.py", b"")]
    base = python_sources.sources_digest(files)
    assert python_sources.sources_digest(files[::-1]) == base  # order of listing does not matter
    assert python_sources.sources_digest([("a/x.py", b"print(2)\n"), files[1]]) != base
    assert python_sources.sources_digest([("a/z.py", b"print(1)\n"), files[1]]) != base


# ---------------------------------------------------------------------------
# The design


def test_every_context_sees_the_same_tokens_per_step_and_per_pool():
    """The same tokens a step where that is at least min_sequences_per_step sequences, that floor above it (cpu:
    16 x 128 and 4 x 512 = 2,048 tokens, 4 x 1,024 at T = 1,024), and the same tokens in every pool."""
    config = llama_context.Config.for_profile("cpu")
    sweeps = config.sweeps()
    assert [c.context for c in sweeps] == list(config.contexts)
    assert [c.batch_size for c in sweeps] == [16, 4, 4]
    for c in sweeps:
        assert c.batch_size * c.context == max(config.tokens_per_step, config.min_sequences_per_step * c.context)
        assert c.pool_size * c.context == c.eval_examples * c.context == config.pool_tokens
        assert c.steps == config.steps and c.widths == config.widths
    hashes = {c.config_hash() for c in sweeps}
    assert len(hashes) == len(sweeps)  # each context is a sweep (and a checkpoint folder) of its own


@pytest.mark.parametrize("field, value", [("tokens_per_step", 1000), ("pool_tokens", 4096), ("contexts", ()),
                                          ("min_sequences_per_step", 0)])
def test_a_design_that_does_not_divide_is_refused(field, value):
    with pytest.raises(ValueError, match=field if field != "contexts" else "contexts"):
        llama_context.Config.for_profile("cpu", **{field: value})


# ---------------------------------------------------------------------------
# The readings, on synthetic tables whose answer is known


def synthetic_geometry(width_slope: float, change: float = 0.0, seeds: int = 3, noise: float = 0.0, seed: int = 0):
    """Rows of a geometry table: d_par ∝ T, d_2 ∝ T², width slope ``width_slope + change·log(T/128)``."""
    rng = np.random.default_rng(seed)
    rows = []
    for context in (128, 512, 2048):
        for width in (32, 64, 128):
            slope = width_slope + change * math.log(context / 128)
            for s in range(seeds):
                for step in (0, 450, 500, 550, 600):
                    scale = (width / 32) ** slope * math.exp(rng.normal(0, noise))
                    d_par, d_2 = 1e-2 * context / 128 * scale, 1e-3 * (context / 128) ** 2 * scale
                    rows.append(dict(context=context, width=width, seed=s, step=step, layer="model.layers.0",
                                     pool="heldout", trained_ok=True, d_par=d_par, d_2=d_2, d_align=min(d_par, d_2)))
    return pd.DataFrame(rows)


def test_the_context_exponents_are_read_back():
    late = llama_context.late_means(synthetic_geometry(0.3), "model.layers.0", 600)
    slopes = llama_context.context_slopes(late).set_index(["width", "value"]).slope
    assert np.allclose(slopes.xs("d_par", level="value"), 1.0)
    assert np.allclose(slopes.xs("d_2", level="value"), 2.0)


@pytest.mark.parametrize("change", [0.0, 0.2, -0.3])
def test_the_change_of_the_width_slope_with_context_is_read_back(change):
    late = llama_context.late_means(synthetic_geometry(0.3, change, noise=0.05), "model.layers.0", 600)
    fitted = llama_context.slope_change(late)
    assert fitted["lo"] <= change <= fitted["hi"]
    assert abs(fitted["change"] - change) < 0.05


def test_a_non_positive_estimate_is_left_out_of_its_run_never_floored():
    geometry = synthetic_geometry(0.0)
    geometry.loc[(geometry.step == 600) & (geometry.width == 32), "d_align"] = 0.0
    late = llama_context.late_means(geometry, "model.layers.0", 600)
    first = late[late.width == 32].iloc[0]
    assert first.dropped == 1 and first.checkpoints == 4
    assert np.isclose(first.d_align, 1e-3)  # the mean of the three positive checkpoints, not pulled toward 0


def test_the_band_sentence_names_the_first_context_that_meets_the_paper():
    geometry = synthetic_geometry(0.0)
    geometry["d_align"] *= 50  # min(d_par, d_2) x 50: 0.05 at T = 128, 0.8 at 512, 8 at 2048
    meeting = llama_context.band_meeting(geometry, "model.layers.0", 600)
    assert list(meeting.late_in_band) == [False, False, True]
    assert "from $T = 2048$" in llama_context.describe_band(meeting)
    geometry["d_align"] /= 100
    assert "at no context" in llama_context.describe_band(llama_context.band_meeting(geometry, "model.layers.0", 600))


# ---------------------------------------------------------------------------
# The verdict at the committed design: calibrated, and honest about its power


def committed_trend() -> pd.DataFrame:
    if not (CPU / "llama_context_trend.csv").exists():
        pytest.skip("the cpu context study has not been committed")
    return read_table(CPU, "llama_context_trend")[0]


def test_each_contexts_slope_test_is_calibrated_at_its_committed_noise():
    judged = llama_context.judged_slopes(committed_trend())
    config = llama_context.Config.for_profile("cpu")
    assert set(judged.context) <= set(config.contexts) and judged.sigma.notna().any()
    for row in judged.itertuples():
        if not np.isfinite(row.sigma):
            continue
        design = dict(widths=config.widths, seeds=config.seeds, run_sd=float(row.sigma), trials=4000)
        null = trend.simulate_labels(slope=0.0, seed=11, **design)
        assert null["reproduced"] <= 0.05  # no width effect: almost never "reproduced"
        detectable = trend.detectable_slope(*trend.design_se(float(row.sigma), config.widths, config.seeds))
        assert np.isclose(detectable, row.detectable, rtol=0.02)
        effect = trend.simulate_labels(slope=detectable, seed=12, **design)
        assert effect["reproduced"] >= 0.75  # the slope the row says it detects is found most of the time


def test_each_context_keeps_the_budgets_its_pool_holds():
    config = llama_context.Config.for_profile("cpu")
    for sweep in config.sweeps():
        assert sweep.budgets and all(4 * sum(b) <= sweep.pool_size for b in sweep.budgets)
        assert sweep.budget_judged == (8, 8)  # the misalignment claim is read at one budget at every context
    assert config.budgets_at(2048) == ((4, 4), (8, 8)) and config.budgets_at(128) == config.budgets
    with pytest.raises(ValueError, match="leaves no budget"):
        llama_context.Config.for_profile("cpu", pool_tokens=4 * 2048)


def test_contexts_without_two_trained_widths_are_named():
    runs = pd.DataFrame(dict(context=[128] * 4 + [2048] * 4, width=[32, 32, 64, 64] * 2,
                             trained_ok=[True, True, True, False, False, False, True, False]))
    text = llama_context.describe_trained_contexts(runs, 2048)
    assert "$T = 2048$ (1 of 4 runs trained, 1 sequence(s) a step)" in text and "T = 128" not in text
    assert "every context" in llama_context.describe_trained_contexts(runs.assign(trained_ok=True), 2048)


def test_the_band_sentence_reads_every_checkpoint_and_step_0_apart():
    """The magnitude sentence reads every checkpoint after step 0 and states the untrained models' values apart."""
    geometry = synthetic_geometry(0.0)
    geometry.loc[geometry.step == 0, "d_align"] = 12.0  # untrained: every example pushes the same way
    meeting = llama_context.band_meeting(geometry, "model.layers.0", 600)
    assert list(meeting.checkpoints) == [4, 4, 4] and meeting.init_reaches_band.all()
    text = llama_context.describe_band(meeting)
    assert "at any of the 4 checkpoints of training" in text and "At step 0, before any training" in text
    assert "12–12 at $T = 128$" in text and "a stage of training" in text


def test_the_context_exponents_are_fitted_over_the_contexts_each_width_trained_at():
    geometry = synthetic_geometry(0.3)
    geometry.loc[(geometry.width == 32) & (geometry.context == 2048), "trained_ok"] = False
    geometry.loc[(geometry.width == 32) & (geometry.context == 2048), "d_par"] *= 100  # an untrained run's reading
    slopes = llama_context.context_slopes(llama_context.late_means(geometry, "model.layers.0", 600))
    narrow = slopes[(slopes.width == 32) & (slopes.value == "d_par")].iloc[0]
    assert narrow.contexts == "128/512" and np.isclose(narrow.slope, 1.0)
    assert "$N = 32$: $T = 128, 512$" in llama_context.describe_context_slopes(slopes)
