"""The README's Python code runs as written."""

from __future__ import annotations

import re

import pytest

from dalign_core.config import REPO_ROOT

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
