"""Nothing lost, nothing silently wrong, in the files an experiment writes and reads back.

`--force` on a full disk keeps the old results (a simulated ENOSPC); a results CSV cut short is
recomputed, never reused; `python -m` records its overrides under the experiment's own name.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dalign_core import atomic
from dalign_repro.report import results
from dalign_repro.config import REPO_ROOT
from dalign_repro.experiments import _runner, theory


@pytest.fixture(autouse=True)
def _restore_environment(monkeypatch):
    """The command line sets $DALIGN_CHECKPOINTS (from --out) and $DALIGN_RANKS_PER_JOB in this process: undo."""
    for name in ("DALIGN_CHECKPOINTS", "DALIGN_RANKS_PER_JOB"):
        monkeypatch.delenv(name, raising=False)


def _probe_compute(config, out_dir):
    return {"first": pd.DataFrame({"trials": [config.trials]}),
            "second": pd.DataFrame({"trials": [config.trials] * 2})}, {}


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _full_disk_after(monkeypatch, writes: int) -> None:
    """Every file written after the first ``writes`` fails as on a full disk (ENOSPC), as a real one would at fsync."""
    real = os.fsync
    calls = {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] > writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)


@pytest.mark.parametrize("writes", [0, 1, 3])
def test_force_on_a_full_disk_keeps_every_old_file(tmp_path, monkeypatch, writes):
    config = theory.Config.for_profile("smoke")
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    before = _contents(tmp_path)
    assert sorted(before) == ["first.csv", "first.json", "second.csv", "second.json"]
    _full_disk_after(monkeypatch, writes)
    with pytest.raises(OSError) as error:
        _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path, force=True)
    assert error.value.errno == errno.ENOSPC
    assert _contents(tmp_path) == before  # no file replaced, no temporary left behind
    assert results.results_current(tmp_path, ("first", "second"), config)


def test_write_table_on_a_full_disk_keeps_the_old_provenance(tmp_path, monkeypatch):
    config = theory.Config.for_profile("smoke")
    results.write_table(pd.DataFrame({"a": [1]}), tmp_path, "t", config, 1.0)
    before = _contents(tmp_path)
    _full_disk_after(monkeypatch, 1)  # the CSV's temporary completes, the JSON's does not
    with pytest.raises(OSError):
        results.write_table(pd.DataFrame({"a": [2]}), tmp_path, "t", config, 1.0)
    assert _contents(tmp_path) == before


def test_the_command_line_says_a_full_disk_in_one_line_and_keeps_the_results(tmp_path, monkeypatch, capsys):
    config = theory.Config.for_profile("smoke")
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    before = _contents(tmp_path)
    _full_disk_after(monkeypatch, 2)

    def run(config, out_dir=None, force=False):
        return _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=out_dir,
                                      force=force)

    with pytest.raises(SystemExit) as exit_:
        _runner.main(theory.Config, run, argv=["--profile", "smoke", "--out", str(tmp_path), "--force"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and str(tmp_path) in err[0], err
    assert "Traceback" not in "\n".join(err)
    assert _contents(tmp_path) == before


def test_a_truncated_results_csv_is_not_reused(tmp_path):
    config = theory.Config.for_profile("smoke")
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    assert results.results_current(tmp_path, ("first", "second"), config)
    csv_path = tmp_path / "second.csv"
    csv_path.write_bytes(csv_path.read_bytes()[:-2])  # cut short
    assert not results.results_current(tmp_path, ("first", "second"), config)
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    table, _ = results.read_table(tmp_path, "second")  # recomputed: it reads again
    assert len(table) == 2
    (tmp_path / "first.json").write_text("{")  # an unreadable provenance: not current either
    assert not results.results_current(tmp_path, ("first",), config)


def test_python_m_records_its_overrides_under_the_experiments_name(tmp_path):
    """Under ``python -m`` the config's module is ``__main__``: the record must still name the experiment, so a
    second experiment writing into the same folder adds its own record instead of replacing the first's."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DALIGN_WORKERS": "1"}
    (tmp_path / "overrides.json").write_text(json.dumps({"profile": "smoke", "experiments": {"other": {"seed": 1}}}))
    proc = subprocess.run([sys.executable, "-m", "dalign_repro.experiments.theory", "--profile", "smoke",
                           "--set", "trials=500", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "overrides.json").read_text())
    assert record["experiments"] == {"other": {"seed": 1}, "theory": {"trials": 500}}


# ---------------------------------------------------------------------------
# Configs refused where they are built, in one line naming the field, its value and what is allowed

from dalign_repro.experiments import llama_width, pythia_width, resnet_width  # noqa: E402

BAD_SWEEP_FIELDS = ["widths=[0]", "head_dim=0", "capture_batch=0", "validation_examples=0", "eval_examples=0",
                    "batch_size=0", "resamples=0", "pool_size=3", "seed=-1", "corpus=dir:/nonexistent"]
BAD_THEORY_FIELDS = ["trials=0", "dims=[]", "budgets=[[0, 0]]", "sketch_d=0", "seed=-1", "snrs=[-1]", "snrs=[0]"]


def _refused(config_cls, setting: str, capsys) -> str:
    def run(config, out_dir=None, force=False):
        raise AssertionError("a refused config must not run")

    with pytest.raises(SystemExit) as exit_:
        _runner.main(config_cls, run, argv=["--profile", "smoke", "--set", setting])
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("usage:", "  "))]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("setting", BAD_SWEEP_FIELDS)
def test_a_bad_sweep_field_is_one_line_naming_it(setting, capsys, tmp_path):
    setting = setting.replace("/nonexistent", str(tmp_path / "nonexistent"))  # surely missing, on any machine
    name = setting.split("=")[0]
    line = _refused(llama_width.Config, setting, capsys)
    assert f"{name}=" in line and "allowed" in line and "Traceback" not in line


@pytest.mark.parametrize("setting", BAD_THEORY_FIELDS)
def test_a_bad_theory_field_is_one_line_naming_it(setting, capsys):
    line = _refused(theory.Config, setting, capsys)
    assert f"{setting.split('=')[0]}=" in line and "allowed" in line


def test_every_profile_of_every_sweep_still_builds():
    for config_cls in (llama_width.Config, pythia_width.Config, resnet_width.Config, theory.Config):
        for profile in ("smoke", "lab", "cpu", "gpu", "paper"):
            config_cls.for_profile(profile)


def test_theory_seed_on_the_command_line_is_refused(capsys):
    with pytest.raises(SystemExit):
        _runner.main(theory.Config, lambda *a, **k: None, argv=["--profile", "smoke", "--seed", "-1"])
    assert "seed=-1 is not allowed" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# --out that cannot hold results; --config, --print-config; checkpoints under --out


def test_an_out_that_is_a_file_or_read_only_is_refused_before_any_work(tmp_path, capsys):
    ran = []
    a_file = tmp_path / "results.txt"
    a_file.write_text("keep me\n")
    read_only = tmp_path / "locked"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        cases = [a_file, a_file / "sub"] + ([] if os.access(read_only, os.W_OK) else [read_only / "o"])
        for out in cases:
            with pytest.raises(SystemExit) as exit_:
                _runner.main(theory.Config, lambda config, out_dir=None, force=False: ran.append(out_dir),
                             argv=["--profile", "smoke", "--out", str(out)])
            assert exit_.value.code == 2
            err = capsys.readouterr().err
            assert str(out.parent if out.parent != tmp_path else out) in err or str(out) in err
            assert "Traceback" not in err
    finally:
        read_only.chmod(0o700)
    assert not ran and a_file.read_text() == "keep me\n"


def test_print_config_writes_yaml_that_config_reads_back(tmp_path, capsys):
    _runner.main(theory.Config, lambda *a, **k: None,
                 argv=["--profile", "smoke", "--set", "trials=500", "--set", "budgets=[[4, 4], [8, 8]]",
                       "--print-config"])
    text = capsys.readouterr().out
    assert "trials: 500" in text and theory.Config.for_profile("smoke", trials=500, budgets=((4, 4), (8, 8))
                                                              ).config_hash() in text
    (tmp_path / "theory.yaml").write_text(text)
    seen = {}
    _runner.main(theory.Config, lambda config, out_dir=None, force=False: seen.update(config=config),
                 argv=["--config", str(tmp_path / "theory.yaml"), "--set", "sketch_replicates=3",
                       "--out", str(tmp_path / "o")])
    assert seen["config"] == theory.Config.for_profile("smoke", trials=500, budgets=((4, 4), (8, 8)),
                                                       sketch_replicates=3)
    (tmp_path / "bad.yaml").write_text("trials: [1, 2\n")
    with pytest.raises(SystemExit):
        _runner.main(theory.Config, lambda *a, **k: None, argv=["--config", str(tmp_path / "bad.yaml")])
    assert "is not valid YAML" in capsys.readouterr().err
    (tmp_path / "unknown.yaml").write_text("trails: 5\n")
    with pytest.raises(SystemExit):
        _runner.main(theory.Config, lambda *a, **k: None, argv=["--config", str(tmp_path / "unknown.yaml")])
    assert "did you mean trials" in capsys.readouterr().err


def test_checkpoints_go_under_out_unless_told_otherwise(tmp_path, monkeypatch):
    seen = []

    def run(config, out_dir=None, force=False):
        seen.append(os.environ.get(_runner.CHECKPOINTS_VARIABLE))

    monkeypatch.delenv(_runner.CHECKPOINTS_VARIABLE, raising=False)
    _runner.main(theory.Config, run, argv=["--profile", "smoke", "--out", str(tmp_path / "o")])
    assert seen[-1] == str((tmp_path / "o" / "checkpoints").resolve())
    _runner.main(theory.Config, run, argv=["--profile", "smoke", "--out", str(tmp_path / "o"),
                                           "--checkpoints", str(tmp_path / "c")])
    assert seen[-1] == str((tmp_path / "c").resolve())
    monkeypatch.setenv(_runner.CHECKPOINTS_VARIABLE, str(tmp_path / "env"))
    _runner.main(theory.Config, run, argv=["--profile", "smoke", "--out", str(tmp_path / "o")])
    assert seen[-1] == str(tmp_path / "env")
    # --out naming the profile's own folder keeps the checkpoints where that folder's experiments keep them
    monkeypatch.delenv(_runner.CHECKPOINTS_VARIABLE)
    monkeypatch.setenv("DALIGN_RESULTS", str(tmp_path / "results"))
    _runner.main(theory.Config, run, argv=["--profile", "smoke", "--out", str(tmp_path / "results" / "smoke")])
    assert seen[-1] is None


def test_a_sweeps_checkpoint_root_lies_under_out(tmp_path, monkeypatch):
    """With --out (and no --checkpoints or $DALIGN_CHECKPOINTS) a sweep's checkpoint root lies under --out, and
    nothing is written to the working folder."""
    from dalign_repro.sweep import trained as sweep

    monkeypatch.delenv(_runner.CHECKPOINTS_VARIABLE, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _runner.main(llama_width.Config, lambda config, out_dir=None, force=False: None,
                 argv=["--profile", "smoke", "--out", str(tmp_path / "o")])
    root = sweep.checkpoint_root(llama_width.Config.for_profile("smoke"), llama_width.FAMILY)
    assert root.is_relative_to((tmp_path / "o" / "checkpoints").resolve())
    assert list(work.iterdir()) == []


# ---------------------------------------------------------------------------
# The data cache: the user's cache folder or $DALIGN_CACHE, never the working directory; downloads announced


def test_the_data_cache_is_the_users_or_the_variables(tmp_path, monkeypatch):
    import platformdirs

    from dalign_repro.data import manifest

    monkeypatch.delenv("DALIGN_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert manifest.default_cache_dir() == Path(platformdirs.user_cache_dir("dalign", appauthor=False))
    assert not manifest.default_cache_dir().is_relative_to(tmp_path)
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "c"))
    assert manifest.default_cache_dir() == tmp_path / "c"


def test_a_download_is_announced(tmp_path, caplog):
    import logging

    from dalign_repro.data import manifest

    probe = manifest.Manifest.from_dict(dict(name="probe", filename="probe.bin", sha256="0" * 64, size=10,
                                             sources=[{"url": "http://127.0.0.1:9/probe.bin"}]))
    with caplog.at_level(logging.INFO, logger="dalign"), pytest.raises(manifest.DataMissingError):
        manifest.fetch(probe, tmp_path, offline=False, timeout=5)
    assert any("downloading probe.bin" in r.getMessage() and str(tmp_path) in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dalign"), pytest.raises(manifest.DataMissingError):
        manifest.fetch(probe, tmp_path, offline=True)
    assert not any("downloading" in r.getMessage() for r in caplog.records)  # offline: nothing is tried


# ---------------------------------------------------------------------------
# scripts/slurm_paper.sbatch: parses, and its commands and variables resolve (with stand-ins for Slurm)

SBATCH = REPO_ROOT / "scripts" / "slurm_paper.sbatch"


def test_the_slurm_script_parses_and_asks_slurm_for_what_it_needs():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    directives = [line.split()[1] for line in SBATCH.read_text().splitlines() if line.startswith("#SBATCH")]
    assert {"--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=64"} <= set(directives)


def _fake_slurm(tmp_path: Path) -> dict[str, str]:
    """``scontrol`` and ``srun`` stand-ins on PATH: srun records its arguments and the environment it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'node-a\\nnode-b\\n'\n")
    (bin_dir / "srun").write_text(
        "#!/bin/bash\nprintf '%s\\n' \"$@\" > \"$RECORD/args\"\n"
        "env | grep -E '^(CUBLAS_WORKSPACE_CONFIG|DALIGN_CHECKPOINTS|DALIGN_CACHE)=' | sort > \"$RECORD/env\"\n")
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("DALIGN_", "CUBLAS_"))},
            "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(tmp_path), "SLURM_JOB_ID": "123456",
            "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "64",
            "SLURM_SUBMIT_DIR": str(REPO_ROOT)}


def test_the_slurm_script_starts_one_torchrun_per_node_with_a_resolvable_command(tmp_path, capsys):
    import importlib.util

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    env = {**_fake_slurm(tmp_path), "CORPUS": f"dir:{corpus}"}
    done = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "args").read_text().splitlines()
    assert args[:2] == ["--cpus-per-task=64", "--kill-on-bad-exit=1"]
    python = Path(args[2])
    assert python == REPO_ROOT / ".venv" / "bin" / "python" and args[3:5] == ["-m", "torch.distributed.run"]
    assert importlib.util.find_spec("torch.distributed.run") is not None
    assert "--nnodes=2" in args and "--nproc_per_node=8" in args and "--rdzv-id=123456" in args
    assert f"--rdzv-endpoint=node-a:{20000 + 123456 % 10000}" in args  # the port comes from the job ID
    experiment_args = args[args.index("-m", 4) + 1:]
    module = experiment_args[0]
    assert module == "dalign_repro.experiments.llama_width" and importlib.util.find_spec(module) is not None
    environment = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines())
    assert environment["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert environment["DALIGN_CHECKPOINTS"] == str(REPO_ROOT / "checkpoints")
    # The experiment's own arguments (the corpus override, --ranks-per-job) are ones its command line accepts.
    from dalign_repro.experiments import llama_width

    _runner.main(llama_width.Config, lambda *a, **k: None, argv=experiment_args[1:] + ["--print-config"])
    printed = capsys.readouterr().out
    assert f"corpus: dir:{corpus}" in printed and "profile: paper" in printed


def test_the_slurm_script_reads_the_head_node_of_a_long_node_list(tmp_path):
    """A node list longer than a pipe's buffer: a ``scontrol ... | head -n 1`` under pipefail ends the job with
    SIGPIPE (exit 141) here every time, where a two-node list did so only when ``head`` won a race."""
    env = _fake_slurm(tmp_path)
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/bash\nprintf 'node-a\\n'\nseq -f 'node-%g' 1 50000\n")
    done = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, (done.returncode, done.stderr)
    args = (tmp_path / "args").read_text().splitlines()
    assert f"--rdzv-endpoint=node-a:{20000 + 123456 % 10000}" in args


# ---------------------------------------------------------------------------
# torchrun with a --ranks-per-job that does not fit: one line from rank 0, nothing from the others


@pytest.mark.parametrize("spec", ["3", "16:3"])
def test_ranks_per_job_that_does_not_divide_the_world_is_one_line_from_rank_0(monkeypatch, capsys, spec):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ran = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        with pytest.raises(SystemExit) as exit_:
            _runner.main(llama_width.Config, lambda *a, **k: ran.append(rank),
                         argv=["--profile", "smoke", "--ranks-per-job", spec])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if not line.startswith(("usage:", "  "))]
        if rank == 0:
            assert len(lines) == 1 and "do not divide the world size 2" in lines[0], err
        else:
            assert err == ""
    assert not ran


def test_ranks_per_job_that_does_not_divide_the_batch_is_refused(monkeypatch, capsys):
    for name, value in (("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "4"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit):
        _runner.main(llama_width.Config, lambda *a, **k: None,
                     argv=["--profile", "smoke", "--set", "batch_size=6", "--ranks-per-job", "4"])
    assert "do not divide batch_size 6" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_the_paper_profile_on_a_machine_without_a_gpu_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DALIGN_WORKERS": "1"}
    done = subprocess.run([sys.executable, "-m", "dalign_repro.experiments.llama_width", "--profile", "paper",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama_width: error: ") and "sized for a GPU" in lines[0], lines


# ---------------------------------------------------------------------------
# Corpora that cannot be read: one line through the experiment's command line


@pytest.mark.parametrize("kind", ["hf-offline", "latin1", "missing-dir"])
def test_an_unreadable_corpus_is_one_line(tmp_path, kind):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    corpus = {"hf-offline": "hf:nobody/no-such-dataset", "latin1": f"dir:{folder}",
              "missing-dir": f"dir:{tmp_path / 'nonexistent'}"}[kind]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DALIGN_WORKERS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "DALIGN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "dalign_repro.experiments.llama_width", "--profile", "smoke", "--set",
                           f"corpus={corpus}", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    needle = {"hf-offline": "nobody/no-such-dataset", "latin1": "a.txt is not valid UTF-8",
              "missing-dir": "does not exist"}[kind]
    assert needle in errors[0]


# ---------------------------------------------------------------------------
# A checkpoint cut short is named, in one sentence that says what to do


@pytest.mark.parametrize("name", ["state.pt", "model.safetensors"])
def test_a_truncated_checkpoint_file_is_named(tmp_path, name):
    import safetensors.torch
    import torch

    from dalign_repro.training import checkpoints as training

    folder = tmp_path / "step_5"
    folder.mkdir()
    model = torch.nn.Linear(4, 4)
    torch.save({"step": 5}, folder / "state.pt")
    safetensors.torch.save_file(dict(model.state_dict()), folder / "model.safetensors")
    path = folder / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError) as error:
        training.load_state(folder) if name == "state.pt" else training.load_weights(model, folder)
    message = str(error.value)
    assert str(path) in message and "cut short or damaged" in message and "rerun the same command" in message


def test_a_read_only_out_is_refused(tmp_path, monkeypatch, capsys):
    """Root can write anywhere, so the folder's refusal is simulated where the probe file is created."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(SystemExit) as exit_:
        _runner.main(theory.Config, lambda *a, **k: None, argv=["--profile", "smoke", "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2
    assert "cannot be written" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sweep_with_out_writes_nothing_in_the_working_folder(tmp_path, monkeypatch):
    """A real (tiny) sweep with --out: its tables and checkpoints land under --out, its data in the cache, and
    neither the working folder nor the repository's checkpoints/ gain anything (a weight decay of its own keys its
    checkpoints apart from any other run's)."""
    from dalign_repro.sweep import trained as sweep

    work, out = tmp_path / "work", tmp_path / "o"
    work.mkdir()
    cache = os.environ.get("DALIGN_CACHE") or str(tmp_path / "cache")  # make's cache when there is one: no download
    env = {**{k: v for k, v in os.environ.items() if k != "DALIGN_CHECKPOINTS"}, "PYTHONPATH": str(REPO_ROOT),
           "DALIGN_WORKERS": "1", "DALIGN_CACHE": cache}
    settings = dict(widths=(16, 32), seeds=2, weight_decay=0.0937)
    done = subprocess.run([sys.executable, "-m", "dalign_repro.experiments.llama_width", "--profile", "smoke",
                           *[f"--set={k}={list(v) if isinstance(v, tuple) else v}"
                             for k, v in settings.items()], "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(work.iterdir()) == []
    assert (out / "llama_runs.csv").is_file() and any((out / "checkpoints").rglob("model.safetensors"))
    monkeypatch.delenv("DALIGN_CHECKPOINTS", raising=False)
    in_repo = sweep.checkpoint_root(llama_width.Config.for_profile("smoke", **settings), llama_width.FAMILY)
    assert in_repo.is_relative_to(REPO_ROOT) and not in_repo.exists()
    assert "job 1 of" in done.stderr  # the job grid's progress


def test_failed_jobs_end_the_command_in_one_line_naming_them(capsys):
    from dalign_repro.training import workers

    def run(config, out_dir=None, force=False):
        raise workers.WorkerError("2 job(s) failed: N16_seed0, N32_seed1 (the finished jobs are kept)\n\njob N16_seed0 "
                                  "(ValueError, worker 0):\nTraceback (most recent call last):\n  ...", [])

    with pytest.raises(SystemExit) as exit_:
        _runner.main(theory.Config, run, argv=["--profile", "smoke"])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip() == ("theory: error: 2 job(s) failed: N16_seed0, N32_seed1 (the finished "
                                               "jobs are kept)")


@pytest.mark.slow
def test_a_real_torchrun_with_a_bad_ranks_per_job_says_it_once(tmp_path):
    """Two real ranks: one error line (rank 0's), and no traceback from any rank (torchrun's own summary of the
    failed ranks follows, which is the launcher's, not ours)."""
    import shutil

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DALIGN_WORKERS": "1"}
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "dalign_repro.experiments.llama_width",
                           "--profile", "smoke", "--ranks-per-job", "3", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error: --ranks-per-job" in line]
    assert len(errors) == 1 and "do not divide the world size 2" in errors[0], done.stderr[-3000:]
    assert "dalign_core" not in "".join(line for line in done.stderr.splitlines() if line.lstrip().startswith("File "))
    assert not (tmp_path / "o").exists()
