"""One runner serves every experiment: each module declares one :class:`Experiment`, registered under its name, and
``python -m dalign_repro <name>`` and ``python -m dalign_repro.experiments.<name>`` are its one command line."""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import subprocess
import sys

import pandas as pd
import pytest

import dalign_repro.experiments as experiments
from dalign_repro.config import REPO_ROOT, ExperimentConfig
from dalign_repro.experiments import NAMES, _runner
from dalign_repro.families import FAMILIES, family


@pytest.fixture(autouse=True)
def _restore_environment(monkeypatch):
    """The command line sets $DALIGN_CHECKPOINTS (from --out) in this process: undo."""
    monkeypatch.delenv("DALIGN_CHECKPOINTS", raising=False)


def test_every_experiment_module_declares_the_experiment_of_its_name():
    public = [m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_")]
    declaring = []
    for name in public:
        module = importlib.import_module(f"dalign_repro.experiments.{name}")
        if hasattr(module, "EXPERIMENT"):
            declaring.append(name)
            declared = module.EXPERIMENT
            assert declared.name == name and declared.config is module.Config and declared.tables == module.TABLES
            assert _runner.experiment(name) is declared and _runner.EXPERIMENTS[name] is declared
            assert module.run.__func__ is _runner.Experiment.run if declared.runner is None else module.run is \
                declared.runner  # the notebooks' run(config, out_dir=None, force=False)
    assert sorted(declaring) == sorted(NAMES) and len(set(NAMES)) == len(NAMES)
    assert set(public) - set(declaring) == {"demo"}  # the demo is a helper of the notebooks, not an experiment


def test_an_unknown_experiment_is_refused_naming_the_others():
    with pytest.raises(ValueError, match=r"no experiment named 'lama_width'; choose one of: theory, llama_width"):
        _runner.experiment("lama_width")


def test_a_sweep_experiment_trains_the_registered_family():
    from dalign_repro.experiments import llama_depth, llama_width, pythia_width, resnet_width

    assert llama_width.FAMILY is FAMILIES["llama"] and pythia_width.FAMILY is FAMILIES["pythia"]
    assert llama_depth.FAMILY is family("llama_depth") and resnet_width.FAMILY is family("resnet")
    smoke = resnet_width.Config.for_profile("smoke")
    assert family("resnet", smoke) is FAMILIES["resnet"] and not FAMILIES["resnet"].augment
    augmented = family("resnet", dataclasses.replace(smoke, augment=True))
    assert augmented.augment and augmented.name == "resnet"
    with pytest.raises(ValueError, match="no model family named 'lama'; choose one of: llama"):
        family("lama")


@dataclasses.dataclass(frozen=True)
class ProbeConfig(ExperimentConfig):
    profile: str = "smoke"
    seed: int = 0
    trials: int = 3

    PROFILES = {"smoke": {}, "cpu": {"trials": 5}}


def test_a_declared_experiment_writes_its_tables_once_and_skips_them_when_current(tmp_path):
    calls = []

    def compute(config, out_dir):
        calls.append(config.trials)
        return {"probe_rows": pd.DataFrame({"trial": range(config.trials)})}, {"note": "probe"}

    probe = _runner.Experiment("probe", ProbeConfig, ("probe_rows",), compute)
    config = ProbeConfig.for_profile("cpu")
    assert probe.run(config, out_dir=tmp_path) == tmp_path
    written = (tmp_path / "probe_rows.csv").read_bytes()
    assert probe.run(config, out_dir=tmp_path) == tmp_path and calls == [5]  # current: skipped
    probe.run(config, out_dir=tmp_path, force=True)
    assert calls == [5, 5] and (tmp_path / "probe_rows.csv").read_bytes() == written
    with pytest.raises(TypeError, match="give compute"):
        _runner.Experiment("probe", ProbeConfig, ("probe_rows",))


@pytest.mark.parametrize("profile", ["smoke", "cpu"])
@pytest.mark.parametrize("name", NAMES)
def test_print_config_is_a_fixed_point_of_config(name, profile, tmp_path, capsys):
    """Through each declared experiment's own command line: the file --print-config writes, read by --config,
    prints the same file again (every field, the hash and the header), and runs that config."""
    declared = _runner.experiment(name)
    declared.main(["--profile", profile, "--seed", "7", "--print-config"])
    text = capsys.readouterr().out
    (tmp_path / "config.yaml").write_text(text)
    declared.main(["--config", str(tmp_path / "config.yaml"), "--print-config"])
    assert capsys.readouterr().out == text
    seen = {}
    probe = dataclasses.replace(declared, compute=None, runner=lambda config, out_dir=None, force=False:
                                seen.update(config=config, out_dir=out_dir))
    probe.main(["--config", str(tmp_path / "config.yaml"), "--out", str(tmp_path / "out")])
    wanted = declared.config.for_profile(profile, seed=7)
    assert seen["config"] == wanted and seen["config"].config_hash() == wanted.config_hash()
    assert f"(config hash {wanted.config_hash()})" in text and seen["out_dir"] == tmp_path / "out"


def _python_m(*args: str, cwd, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python <options> -m <args>`` in ``cwd``."""
    return subprocess.run([sys.executable, *options, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_both_entries_print_a_config_the_other_reads_back(tmp_path):
    first = _python_m("dalign_repro", "theory", "--profile", "smoke", "--set", "trials=500", "--print-config",
                      cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "theory.yaml").write_text(first.stdout)
    again = _python_m("dalign_repro.experiments.theory", "--config", str(tmp_path / "theory.yaml"), "--print-config",
                      cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and "trials: 500" in first.stdout


PRINT_CONFIG_MODULES = """
import atexit, runpy, sys
# every module that imports scipy.stats where it uses it; each is loaded by some experiment's --print-config
import dalign_repro.claims.certificates, dalign_repro.claims.checks, dalign_repro.experiments.llama_context
import dalign_repro.studies.growth.scoring, dalign_repro.sweep.clock, dalign_repro.sweep.operating_point
atexit.register(lambda: print("modules:", *(name in sys.modules for name in ("dalign_repro.sweep.trend", "scipy.stats")),
                              file=sys.stderr))
sys.argv = ["dalign_repro", "llama_width", "--profile", "smoke", "--print-config"]
runpy.run_module("dalign_repro", run_name="__main__")
"""


def test_a_sweeps_config_prints_without_importing_scipy_stats(tmp_path):
    """The sweep, claims, growth and context modules import scipy.stats where they use it: a process that loads them
    and computes no interval (--print-config, a dry run, a torchrun rank) does not pay its 1.3 s of CPU."""
    printed = subprocess.run([sys.executable, "-c", PRINT_CONFIG_MODULES], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert printed.returncode == 0 and "widths:" in printed.stdout, printed.stderr[-2000:]
    assert printed.stderr.splitlines()[-1] == "modules: True False"  # the sweep's trend module loaded, not scipy.stats


def test_python_m_dalign_repro_lists_the_experiments_and_refuses_an_unknown_one(tmp_path):
    listed = _python_m("dalign_repro", cwd=tmp_path, options=("-X", "importtime"))
    assert listed.returncode == 2 and "experiments: " + ", ".join(sorted(NAMES)) in listed.stdout
    imported = {line.rpartition("|")[2].strip() for line in listed.stderr.splitlines()
                if line.startswith("import time:")}
    assert "dalign_repro.experiments" in imported and not imported & {"torch", "pandas"}  # the listing starts at once
    unknown = _python_m("dalign_repro", "lama_width", cwd=tmp_path)
    assert unknown.returncode == 2 and "no experiment named 'lama_width'" in unknown.stderr
    bad = _python_m("dalign_repro", "theory", "--profile", "smoke", "--set", "dims=eight", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "usage: python -m dalign_repro theory" in bad.stderr and "error: override dims=eight" in bad.stderr
