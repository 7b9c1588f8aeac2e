"""The README's Python code runs as written."""

from __future__ import annotations

import re

import pytest

from dalign_repro.config import REPO_ROOT

pytest.importorskip("transformers")

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return PYTHON_BLOCK.findall((REPO_ROOT / "README.md").read_text(encoding="utf-8"))


def test_readme_has_python_examples():
    assert python_blocks(), "README.md has no ```python block"


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index, capsys):
    code = python_blocks()[index]
    exec(compile(code, f"README.md python block {index + 1}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip(), "the example prints its results"


def test_timing_table_is_generated_from_the_timings():
    """The rerun costs of the appendix "Running at scale" come from results/cpu/timings.csv, as the rerun boxes and
    the course table do."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "timings_table.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_book_documents_publishing():
    text = (REPO_ROOT / "book" / "running_at_scale.md").read_text(encoding="utf-8")
    assert "make publish" in text and ".nojekyll" in text and "REPO_URL" in text


def test_readme_fits_a_screen_and_starts_with_install():
    """What it is, install, the API on a model, one command, links: the rest lives in the book's appendices."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 90, len(text.splitlines())
    first_screen = "\n".join(text.splitlines()[:25])
    assert "pip install" in first_screen and "make test" in first_screen and "make book" in first_screen
