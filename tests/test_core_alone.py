"""dalign_core runs with only its requirements: torch, numpy and tqdm (and what they themselves require).

A subprocess blocks every other package from import (an allow-list of installed distributions: torch, numpy and
tqdm with the distributions they require; the standard library, dalign_core and the user's own modules pass), then measures d_align on a small residual model through the
API and through the ``dalign estimate`` (with ``--out``) and ``dalign rank`` commands. The extras (transformers, pandas, scipy, torchvision, the
reproduction dalign_repro, …) must not be needed for either.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = textwrap.dedent('''
    import importlib.abc, importlib.metadata as md, re, sys

    def _closure(names):
        seen, todo = set(), list(names)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            try:
                requires = md.requires(name) or []
            except md.PackageNotFoundError:
                continue
            todo += [re.split(r"[ ;<>=!~\\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
        return {n.lower().replace("_", "-") for n in seen}

    ALLOWED_DISTS = _closure(["torch", "numpy", "tqdm"])
    OWNERS = md.packages_distributions()
    BLOCKED = []

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in sys.stdlib_module_names or top in ("dalign_core", "_distutils_hack"):
                return None
            dists = {d.lower().replace("_", "-") for d in OWNERS.get(top, [])}
            if top == "dalign_repro" or (dists and not dists <= ALLOWED_DISTS):  # a user's own module has no owner
                BLOCKED.append(top)
                raise ModuleNotFoundError(f"No module named {top!r} (blocked: not a requirement of dalign_core)")
            return None

    sys.meta_path.insert(0, Blocker())
''')

MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm, self.linear = nn.LayerNorm(width), nn.Linear(width, width)

        def forward(self, x):
            return x + self.linear(self.norm(x))

    def build(width=16, classes=3):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, width), Residual(width), Residual(width), nn.Linear(width, classes))
''')

API = textwrap.dedent('''
    import json, torch
    import dalign_core
    from alone_model import build

    model = build()
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(64, 8, generator=generator), torch.randint(0, 3, (64,), generator=generator)
    q = dalign_core.activation_gradients(model, "1", inputs, targets)  # cross-entropy per example
    geometry = dalign_core.estimate_geometry(q)
    print(json.dumps(dict(shape=list(q.shape), d_align=geometry.d_align, b_exact=geometry.b_exact(32, 32),
                          b_align=geometry.b_align(32, 32), blocked=sorted(set(BLOCKED)))))
''')


def _run(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{cwd}:{ROOT}", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", BLOCKER + code, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_core_measures_d_align_with_only_its_requirements(tmp_path):
    (tmp_path / "alone_model.py").write_text(MODEL)
    done = _run(API, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shape"] == [64, 16]
    assert result["d_align"] >= 0 and 0 < result["b_exact"] <= result["b_align"] <= 1


def test_the_command_runs_with_only_the_core_requirements(tmp_path):
    (tmp_path / "alone_model.py").write_text(MODEL)
    make = textwrap.dedent('''
        import torch
        from alone_model import build
        torch.save(build().state_dict(), "state.pt")
        g = torch.Generator().manual_seed(1)
        torch.save({"inputs": torch.randn(64, 8, generator=g), "targets": torch.randint(0, 3, (64,), generator=g)},
                   "data.pt")
    ''')
    assert _run(make, tmp_path).returncode == 0
    command = ("import sys\nfrom dalign_core.cli import main\n"
               "sys.argv = ['dalign'] + sys.argv[1:]\ncode = main()\n"
               "print('blocked:', sorted(set(BLOCKED)), file=sys.stderr)\nsys.exit(code)\n")
    done = _run(command, tmp_path, "estimate", "--arch", "alone_model:build", "--model", "state.pt", "--data",
                "data.pt", "--layer", "1", "--examples", "64", "--quiet", "--out", "out/estimate.csv")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "d_align" in done.stdout
    # --out writes its CSV without pandas (not a requirement of the core): the header, then the layer's row
    with open(tmp_path / "out" / "estimate.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["layer"] for row in rows] == ["1"] and rows[0]["rank"] == "1" and rows[0]["n"] == "64"
    assert float(rows[0]["d_align"]) >= 0 and rows[0]["revision"] == ""
    # dalign rank too: its intervals take the normal quantile from the standard library where SciPy is blocked
    done = _run(command, tmp_path, "rank", "--arch", "alone_model:build", "--model", "state.pt", "--data", "data.pt",
                "--examples", "64", "--quiet", "--csv", "out/rank.csv")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    with open(tmp_path / "out" / "rank.csv", newline="") as handle:
        ranked = list(csv.DictReader(handle))
    assert {row["layer"] for row in ranked} == {"0", "1", "2", "3"}, ranked  # every child of the Sequential
    assert all(float(row["grad_norm_lo"]) <= float(row["grad_norm"]) <= float(row["grad_norm_hi"]) for row in ranked)


def test_the_normal_quantile_is_scipys_where_installed_and_the_standard_librarys_otherwise(monkeypatch):
    """The growth predictors' intervals: bit for bit SciPy's quantile (the committed tables), else within a few
    units in the last place of it."""
    from scipy import stats

    from dalign_core.growth.predicting import two_sided_z

    levels = (0.5, 0.68, 0.8, 0.9, 0.95, 0.99, 0.999)
    two_sided_z.cache_clear()
    with_scipy = [two_sided_z(c) for c in levels]
    assert with_scipy == [float(stats.norm.ppf(1 - (1 - c) / 2)) for c in levels]
    monkeypatch.setitem(sys.modules, "scipy.special", None)  # import scipy.special now raises ImportError
    two_sided_z.cache_clear()
    without = [two_sided_z(c) for c in levels]
    two_sided_z.cache_clear()  # the next caller gets SciPy's again
    assert without != with_scipy  # the fallback ran: at 0.95 they differ in the last place
    assert without == pytest.approx(with_scipy, rel=1e-14, abs=1e-15)
