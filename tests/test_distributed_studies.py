"""The intervention and growth studies under ``torchrun``: the ranks share the models, the tables equal one process's.

Each study is started as a user starts it, ``python -m dalign_repro.experiments.<study> --profile smoke``, under
``torchrun --standalone --nproc_per_node=2`` on the CPU (gloo), in a folder that holds a copy of a single process's
sweep tables (its checkpoints beside them), so the ranks share the study's models, not the sweep's training again
(tests/test_distributed.py shares a sweep's training over ranks). The single process is chapter 5's run of the
interventions where this session executed it (tests/test_notebooks.py, the same command's config), else a plain
run of the study on one family with one worker, which trains the family's smoke sweep first (the interventions
read ResNet-20, the one family whose smoke models beat their baseline). The tables must be equal but for the
seconds each model took, and the provenance must record both ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch.distributed as dist

from dalign_repro.experiments import interventions
from dalign_repro.sweep.trained import checkpoints_folder
from dalign_repro.training import distributed

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")


LIGHTER = {"interventions": ["resamples=1", "optimizer_steps=[2, 5]"], "growth": []}
"""Overrides that make a study's sign draws fewer and its optimizer runs shorter, not its models: what is shared over
the ranks (each of the study's jobs) and every kind of row stays (ResNet-20's study alone: 34 s, smoke's 44 s)."""


def _study(study: str, family: str | None, out: Path, ranks: int | None,
           checkpoints: Path | None = None) -> subprocess.CompletedProcess:
    """The study at smoke, as a plain process or on ``ranks`` ranks; on one ``family`` with :data:`LIGHTER`'s
    overrides, or (``family=None``) exactly as chapter 5 runs it."""
    env = {k: v for k, v in os.environ.items() if k not in (distributed.RANKS_PER_JOB_VARIABLE, "RANK", "WORLD_SIZE",
                                                            "DALIGN_THREADS")}
    env.update(OMP_NUM_THREADS="1", DALIGN_WORKERS="1", PYTHONUNBUFFERED="1")
    launcher = [] if ranks is None else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    overrides = [] if family is None else ["--set", f'families=["{family}"]', *(arg for field in LIGHTER[study]
                                                                                  for arg in ("--set", field))]
    command = [sys.executable, *launcher, "-m" if ranks is None else "--module", f"dalign_repro.experiments.{study}",
               "--profile", "smoke", *overrides, "--out", str(out),
               *(["--checkpoints", str(checkpoints)] if checkpoints is not None else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


def _chapter_run(chapter: str, smoke_chapters: Path, chapter_results: Path) -> Path | None:
    """The smoke results folder of ``chapter`` as tests/test_notebooks.py executed it in this session (waiting while
    another worker executes it), or None where it has not run cleanly here (this file run alone)."""
    from tests.test_notebooks import chapter_lock  # noqa: PLC0415

    with chapter_lock(smoke_chapters, chapter):
        return chapter_results / "smoke" if (smoke_chapters / f"{chapter}.ipynb").exists() else None


def _table(folder: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(folder / f"{name}.csv").drop(columns=["seconds"], errors="ignore")


@needs_gloo
@pytest.mark.slow  # torchrun starts two ranks, each training the smoke sweep's share
@pytest.mark.parametrize("study, family", [("growth", "llama"), ("interventions", "resnet")])
def test_two_ranks_share_the_models_and_write_the_tables_of_one_process(study, family, tmp_path, smoke_chapters,
                                                                       chapter_results):
    chapter = _chapter_run("05_interventions", smoke_chapters, chapter_results) if study == "interventions" else None
    if chapter is not None:  # the book's own single process: the same command's config, its sweeps and checkpoints
        one, checkpoints, family = chapter, checkpoints_folder(), None
    else:
        one, checkpoints = tmp_path / "one", None
        _study(study, family, one, ranks=None)
    # the sweep the plain process trained, without the study's own tables, overrides and finished jobs (nor a
    # table another chapter is writing there under a temporary name)
    shutil.copytree(one, tmp_path / "two", ignore=shutil.ignore_patterns(f"{study}.*", "overrides.json", "partial",
                                                                          ".*", "*.tmp"))
    done = _study(study, family, tmp_path / "two", ranks=2, checkpoints=checkpoints)
    printed = done.stdout + done.stderr  # the copied sweep is current: the ranks train no model
    assert "validation loss" not in printed and ": held-out loss" not in printed
    alone, shared = _table(one, study), _table(tmp_path / "two", study)
    assert len(alone) > 0
    if study == "interventions":  # every kind of row the ranks must agree on
        steps = (0, 2, 5) if family is not None else (0, *interventions.Config.for_profile("smoke").optimizer_steps)
        assert set(alone.study) == {"retention", "sign"} and set(alone.kind) == {"bias", "block"}
        assert set(alone.optimizer_steps) == set(steps) and alone.eval_observed.notna().any()
        assert alone.model.nunique() >= 2  # more models than one, so the ranks share them
    pd.testing.assert_frame_equal(shared, alone, check_exact=True)
    record = json.loads((tmp_path / "two" / f"{study}.json").read_text())
    assert record["world_size"] == 2 and [r["rank"] for r in record["ranks"]] == [0, 1]
    assert not (tmp_path / "two" / "partial").exists() or not any((tmp_path / "two" / "partial").iterdir())
