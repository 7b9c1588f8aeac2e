"""Changing a profile's config without editing the library: --set, parse_overrides, SET=, and the lab profile.

Fast: the entry points run with stand-ins for the experiments' work (nothing is trained here).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys

import pandas as pd
import pytest

from dalign_repro.config import (PROFILES, REPO_ROOT, ExperimentConfig, added_field, default_results_dir,
                                measurement_only, overrides_tag, parse_overrides)
from dalign_repro.experiments import _runner, llama_width, resnet_width, theory

EXPERIMENTS = ("llama_width", "pythia_width", "resnet_width", "theory", "claims", "pythia_checkpoints")
"""The experiments whose profiles this repository's infrastructure keeps (interventions' owner keeps its own)."""

# Config hashes of the committed profiles: results/<profile>/ are matched against these, so adding a profile or
# the override machinery must never move them. A config change that moves one comes with that profile's results
# regenerated (resnet_width cpu: the channels_last field, with the NHWC tables; llama_width cpu and smoke: the
# checkpoint_pool_size field, with the cpu tables; llama_width gpu: the design of 2026-12-04, widths 512-1,024 at
# context 256, which has no committed table yet).
COMMITTED_HASHES = {
    ("llama_width", "smoke"): "f622291612b8b5b4", ("llama_width", "cpu"): "23f87350d6da1cc1",
    ("llama_width", "gpu"): "99afcbf99e2dd940", ("llama_width", "paper"): "806842b160eeb845",
    ("pythia_width", "cpu"): "1bf10f8513a72337", ("resnet_width", "cpu"): "66360a02ed78cb23",
    ("theory", "cpu"): "9afd21668f24167d", ("claims", "cpu"): "cdb629be5f2bed61",
    ("pythia_checkpoints", "cpu"): "14c3fd0133313c9f",
}


# ---------------------------------------------------------------------------
# parse_overrides


def test_values_are_parsed_by_the_fields_type():
    """Each value is a TOML value (arrays as tuples by the field's type); a bare word is a string where the field
    holds one, and none is None where the field allows it."""
    parsed = parse_overrides(llama_width.Config, "seeds=2 steps=300 widths=[32, 64] run_sd=none lr_candidates=[1e-3, "
                                                 "3e-3] budgets=[[4, 4], [16, 16]] resamples=20_000 "
                                                 'corpus="dir:/a b" lr_fit=each_width', seed=1)
    assert parsed == dict(seed=1, seeds=2, steps=300, widths=(32, 64), run_sd=None, lr_candidates=(1e-3, 3e-3),
                          budgets=((4, 4), (16, 16)), resamples=20000, corpus="dir:/a b", lr_fit="each_width")
    assert parse_overrides(llama_width.Config, ["budgets=[[4, 4], [16, 16]]", "all_layer_steps=none",
                                                "checkpoint_steps=[0, 10, 20]", "widths=[8,16]"]) == dict(
        budgets=((4, 4), (16, 16)), all_layer_steps=None, checkpoint_steps=(0, 10, 20), widths=(8, 16))
    assert parse_overrides(resnet_width.Config, 'augment=true more_datasets=["cifar100"]') == dict(
        augment=True, more_datasets=("cifar100",))
    # a TOML string and a bare word are the same string; a bare word keeps its spaces up to the next name=
    assert parse_overrides(resnet_width.Config, ['dataset="cifar10"']) == parse_overrides(
        resnet_width.Config, ["dataset=cifar10"]) == dict(dataset="cifar10")
    assert parse_overrides(llama_width.Config, "corpus=dir:/a b seeds=3") == dict(corpus="dir:/a b", seeds=3)
    assert parse_overrides(llama_width.Config, 'corpus="dir:/a b=c" seeds=3') == dict(corpus="dir:/a b=c", seeds=3)
    # a float field takes an int as written (the hash of a profile's value stays the one it had)
    assert parse_overrides(resnet_width.Config, "max_epochs=250 lr_width_exponent=0.5") == dict(
        max_epochs=250, lr_width_exponent=0.5)
    assert parse_overrides(theory.Config, "") == {} and parse_overrides(theory.Config, None, seed=3) == {"seed": 3}


@pytest.mark.parametrize("text, message", [
    ("seeds=two", "seeds is int and 'two' is not a TOML value; give e.g. seeds=6"),
    ("seeds=2.5", "seeds is int and 2.5 is not of type int"),
    ("steps=1e3", "steps is int and 1000.0 is not of type int; give e.g. steps=600"),  # TOML's float, not an int
    ("widths=a,b", r"widths is tuple\[int, \.\.\.\]"),
    ("widths=32", r"widths is tuple\[int, \.\.\.\] and 32 is not of type tuple\[int, \.\.\.\]; give e.g. "
                  r"widths=\[32, 64, 128, 256\]"),
    ("budgets=4x4,16x16", r"budgets is tuple\[tuple\[int, int\], \.\.\.\] and '4x4,16x16' is not a TOML value"),
    ("budgets=[[4, 4, 4]]", r"give e.g. budgets=\[\[4, 4\], \[16, 16\], \[32, 32\], \[64, 64\]\]"),
    ("run_sd=abc", r"run_sd is float \| None"),
    ("augment=maybe", "augment is bool"),
    ("augment=yes", "augment is bool and 'yes' is not a TOML value; give e.g. augment=false"),
    ("lr_fit=1", "lr_fit is str and 1 is not of type str"),
    ("sedes=2", "has no field 'sedes'; did you mean seeds"),
    ("profile=cpu", "profile is chosen on its own"),
    ("steps", "is not field=value"),
])
def test_a_bad_override_names_the_field_and_its_type(text, message):
    config_cls = resnet_width.Config if text.startswith(("augment", "budgets=[[")) else llama_width.Config
    with pytest.raises(ValueError, match=message) as error:
        parse_overrides(config_cls, text)
    assert "\n" not in str(error.value)  # one line


def test_overriding_steps_moves_the_step_schedules_with_it():
    config = llama_width.Config.for_profile("cpu", **parse_overrides(llama_width.Config, "seeds=2 steps=300"))
    cpu = llama_width.Config.for_profile("cpu")
    assert config.steps == 300 and config.checkpoint_steps[0] == 0 and config.checkpoint_steps[-1] == 300
    assert len(config.checkpoint_steps) == len(cpu.checkpoint_steps)
    assert config.warmup_steps == cpu.warmup_steps // 2 and config.train_pool_steps == (0, 300)
    assert set(config.all_layer_steps) <= set(config.checkpoint_steps)
    given = llama_width.Config.for_profile("smoke", steps=40, checkpoint_steps=(0, 40), all_layer_steps=None)
    assert given.checkpoint_steps == (0, 40)  # a schedule given too is taken as given


# ---------------------------------------------------------------------------
# Where the results of a changed config go


def test_a_changed_config_has_a_results_folder_of_its_own(results_root):
    plain = llama_width.Config.for_profile("cpu")
    assert plain.overrides() == {} and default_results_dir(plain) == results_root / "cpu"
    assert llama_width.Config.for_profile("cpu", seeds=plain.seeds).overrides() == {}  # the profile's own value
    changed = llama_width.Config.for_profile("cpu", **parse_overrides(llama_width.Config, "seeds=2 batch_size=8"))
    assert changed.overrides() == {"seeds": 2, "batch_size": 8}
    assert default_results_dir(changed) == results_root / f"cpu+{overrides_tag({'batch_size': 8, 'seeds': 2})}"
    assert changed.config_hash() != plain.config_hash()


@pytest.mark.parametrize("module, profile", sorted(COMMITTED_HASHES))
def test_config_hashes_of_the_committed_profiles_are_unchanged(module, profile):
    config = importlib.import_module(f"dalign_repro.experiments.{module}").Config.for_profile(profile)
    assert config.config_hash() == COMMITTED_HASHES[module, profile]


@pytest.mark.parametrize("study", ["interventions", "growth"])
def test_the_committed_studies_ran_on_the_committed_sweeps_models(study):
    """results/cpu/<study>.json records, per family, the models hash of the sweep it loaded: it must be the committed
    cpu sweep's, or the study's committed rows came from other models (rerun the study)."""
    from dalign_repro.experiments._models import recorded_sweep_hash

    sources = importlib.import_module(f"dalign_repro.experiments.{study}").SOURCES  # growth's LLaMA: llama_depth
    families = json.loads((REPO_ROOT / "results" / "cpu" / f"{study}.json").read_text())["families"]
    assert families
    for name, facts in families.items():
        assert recorded_sweep_hash(facts) == sources[name].config("cpu").models_hash(), name


def test_a_measurement_only_field_keys_the_results_but_not_the_models():
    @dataclasses.dataclass(frozen=True)
    class Probe(ExperimentConfig):
        steps: int = 10
        subsample: int | None = measurement_only(None, neutral=None)

    @dataclasses.dataclass(frozen=True)
    class Denser(Probe):  # a subclass whose default measures differently
        subsample: int | None = measurement_only(4, neutral=None)

    # the config as it was before the field existed
    before = dataclasses.make_dataclass("Probe", [("steps", int, 10)], bases=(ExperimentConfig,), frozen=True)
    assert Probe().config_hash() == Probe().models_hash() == before().config_hash()
    assert Probe(subsample=4).config_hash() == Denser().config_hash() != Probe().config_hash()
    assert Denser().models_hash() == Probe(subsample=4).models_hash() == Probe().models_hash()
    assert Probe(steps=11).models_hash() != Probe().models_hash()
    assert Probe(subsample=4).to_dict()["subsample"] == 4  # the provenance still records it


def test_an_added_field_keys_results_and_models_only_away_from_its_neutral_value():
    @dataclasses.dataclass(frozen=True)
    class Probe(ExperimentConfig):
        steps: int = 10
        fit: str = added_field("each", neutral="each")

    before = dataclasses.make_dataclass("Probe", [("steps", int, 10)], bases=(ExperimentConfig,), frozen=True)
    assert Probe().config_hash() == Probe().models_hash() == before().config_hash() == before().models_hash()
    moved = Probe(fit="transfer")
    assert moved.config_hash() != Probe().config_hash() and moved.models_hash() != Probe().models_hash()
    assert moved.to_dict()["fit"] == "transfer" and Probe().to_dict()["fit"] == "each"


def _probe_compute(config, out_dir):
    return {"probe": pd.DataFrame({"trials": [config.trials]})}, {}


def test_run_experiment_never_writes_a_changed_config_over_the_profile(results_root):
    config = theory.Config.for_profile("smoke", trials=123)
    asked = default_results_dir("smoke")  # what an experiment's run() passes when given no folder
    out = _runner.run_experiment("theory", ("probe",), config, _probe_compute, out_dir=asked)
    assert out == results_root / f"smoke+{overrides_tag({'trials': 123})}" and out != asked
    assert (out / "probe.csv").is_file() and not asked.exists()
    record = json.loads((out / "overrides.json").read_text())
    assert record == {"profile": "smoke", "experiments": {"theory": {"trials": 123}}}
    # An explicit other folder is used as given; the unchanged profile writes where it always did.
    elsewhere = results_root / "elsewhere"
    assert _runner.run_experiment("theory", ("probe",), config, _probe_compute, out_dir=elsewhere) == elsewhere
    plain = theory.Config.for_profile("smoke")
    assert _runner.run_experiment("theory", ("probe",), plain, _probe_compute) == asked
    assert not (asked / "overrides.json").exists()


# ---------------------------------------------------------------------------
# The command line: --set


def _main(argv, config_cls=theory.Config, dry_run=None):
    seen = {}

    def run(config, out_dir=None, force=False):
        seen.update(config=config, out_dir=out_dir)

    _runner.main(config_cls, run, argv=argv, dry_run=dry_run)
    return seen


def test_set_on_the_command_line(results_root):
    seen = _main(["--profile", "smoke", "--set", "trials=100", "--set", "dims=[8, 16]", "--seed", "2"])
    config = seen["config"]
    assert (config.trials, config.dims, config.seed) == (100, (8, 16), 2)
    assert seen["out_dir"] == results_root / f"smoke+{overrides_tag({'seed': 2, 'dims': [8, 16], 'trials': 100})}"
    assert _main(["--profile", "smoke"])["out_dir"] == results_root / "smoke"
    assert _main(["--profile", "smoke", "--set", "trials=5", "--out", str(results_root / "x")])["out_dir"] == (
        results_root / "x")


@pytest.mark.parametrize("setting, message", [
    ("trials=many", "trials is int and 'many' is not a TOML value; give e.g. trials=20000"),
    ("trails=5", "has no field 'trails'; did you mean trials"),
])
def test_a_bad_set_exits_with_a_clear_message(setting, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _main(["--profile", "smoke", "--set", setting])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_set_through_python_m(results_root):
    done = subprocess.run(
        [sys.executable, "-m", "dalign_repro.experiments.theory", "--profile", "smoke", "--set", "dims=eight"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2
    assert "dims is tuple[int, ...] and 'eight' is not a TOML value; give e.g. dims=[" in done.stderr


# ---------------------------------------------------------------------------
# The lab profile


def test_lab_is_a_profile_of_every_experiment():
    assert "lab" in PROFILES
    for name in EXPERIMENTS:
        config = importlib.import_module(f"dalign_repro.experiments.{name}").Config.for_profile("lab")
        assert config.profile == "lab"


def test_lab_profile_reaches_the_command_line():
    seen = {}
    _runner.main(llama_width.Config, lambda *a, **k: None, argv=["--profile", "lab", "--dry-run"],
                 dry_run=lambda config, also_seeds: seen.setdefault("config", config) and "dry")
    config = seen["config"]
    assert config.profile == "lab" and config.seeds == 2 and config.widths == (32, 64, 96)


def test_also_seeds_reaches_the_dry_run_and_is_refused_without_one(capsys):
    seen = {}

    def dry_run(config, also_seeds=()):
        seen["also_seeds"] = also_seeds
        return "dry"

    _runner.main(llama_width.Config, lambda *a, **k: None, argv=["--profile", "lab", "--dry-run", "--also-seeds", "3",
                                                                 "5"], dry_run=dry_run)
    assert seen["also_seeds"] == [3, 5]
    for argv, message in ((["--also-seeds", "3"], "add --dry-run"), (["--dry-run", "--also-seeds", "0"], "at least 1")):
        with pytest.raises(SystemExit) as stop:
            _runner.main(llama_width.Config, lambda *a, **k: None, argv=["--profile", "lab", *argv], dry_run=dry_run)
        assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["llama_width", "pythia_width", "resnet_width"])
def test_lab_sweeps_are_small(name):
    """A classroom's five minutes: at most 3 widths x 2 seeds, one learning rate, one regime, no trials."""
    config = importlib.import_module(f"dalign_repro.experiments.{name}").Config.for_profile("lab")
    cpu = type(config).for_profile("cpu")
    assert len(config.widths) <= 3 and config.seeds == 2 and len(config.lr_candidates) == 1
    assert config.lr_extend == 0 and config.lr_trial_fraction == 1.0  # the first seed's run is the rate "trial"
    assert config.steps <= cpu.steps and config.resamples <= cpu.resamples and config.pool_size <= cpu.pool_size
    assert getattr(config, "deep_depth", None) is None


def test_make_passes_set_to_the_notebooks():
    done = subprocess.run(["make", "-n", "notebooks", "PROFILE=lab", "ONLY=02_llama_width",
                           "SET=seeds=3 steps=400", "STRICT=1"],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    command = done.stdout.replace("\\\n", " ")
    assert "scripts/execute_notebooks.py --profile lab --only 02_llama_width" in command
    assert "--set 'seeds=3 steps=400'" in command and "--refuse-mixed" in command
    plain = subprocess.run(["make", "-n", "notebooks", "PROFILE=lab"],
                           capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert "--set" not in plain.stdout and "--refuse-mixed" not in plain.stdout
