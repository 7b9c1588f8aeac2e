"""Every chapter's exercises agree with themselves: one dict of parameters, read through glue.

Each chapter keeps its exercises' parameters in ONE literal dict, ``EXERCISES``, in a code cell tagged
``remove-cell``::

    EXERCISES = {"2.1": dict(steps=150, widths=(32, 64)), "2.2": dict()}

Its keys are "<chapter number>.<exercise>". Under the chapter's ``## Exercises`` heading each exercise opens with
its key in bold (``**2.1.`` or ``**Exercise 2.1``) and runs to the next one; its *question* is the text outside
folded blocks and its *solution* a folded block (``{dropdown}``, or an admonition with ``:class: dropdown``) that
follows. The question, the command and the solution read the parameters through myst-nb glue names
``ex<key>_<name>`` (``{glue:text}`ex2.1_steps```); a command is glued whole as ``ex<key>_command``. The checks:

- every parameter of every exercise is glued under its name and appears in the exercise's question, and in its
  solution or its glued command; an exercise's every ``ex<key>_...`` reference names a key of the dict;
- every exercise has a solution, and one with parameters reads at least one glued value in it;
- no command is typed in the prose of an exercise with parameters (``make notebooks ... SET=`` must be glued);
- no code that writes sentences shows in the exercises (a cell calling ``display(Markdown(`` there is removed);
- executed (at the smoke profile, slow): each glued ``ex<key>_<name>`` holds the dict's value, a glued command
  holds every parameter's value, and every glue name the prose reads was glued.

A drift (a question about ``steps=250`` whose command uses 150) fails it.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from dalign_repro.config import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
IDS = [path.stem for path in NOTEBOOKS]
GLUE_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`([^`]+)`")
GLUE_DIRECTIVE = re.compile(r"^[`:]{3,}\{glue(?::[a-z]+)?\}\s+(\S+)", re.MULTILINE)
GLUE_PREFIX = "application/papermill.record/"


def exercises_dict(nb) -> tuple[dict, int]:
    """(the chapter's ``EXERCISES`` dict, the index of its cell); AssertionError when there is not exactly one."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "EXERCISES" not in cell.source:
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXERCISES"
                                                    for t in node.targets):
                found.append((index, node.value))
    assert len(found) == 1, f"expected one `EXERCISES = {{...}}` assignment, found {len(found)}"
    index, value = found[0]
    tags = nb.cells[index].metadata.get("tags", [])
    assert "remove-cell" in tags, f"the EXERCISES cell (cell {index}) must be tagged remove-cell, has {tags}"
    exercises = _literal(value)
    assert isinstance(exercises, dict) and exercises, "EXERCISES must be a non-empty dict"
    return exercises, index


def _literal(node):
    """A literal, also written with ``dict(name=...)`` calls (the brief's example)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    return ast.literal_eval(node)


def exercises_text(nb) -> list[tuple[int, str]]:
    """(cell index, source) of the markdown cells from ``## Exercises`` to the next ``## `` heading."""
    cells, inside = [], False
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("## "):
                inside = line[3:].strip().lower().startswith("exercises")
        if inside or cell.source.lstrip().startswith("## Exercises"):
            cells.append((index, cell.source))
    return cells


def split_folded(text: str) -> tuple[str, str]:
    """(text outside folded blocks, text inside them): ``{dropdown}`` blocks and ``:class: dropdown`` admonitions."""
    outside, inside = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(\s*)([`:]{3,})\{(dropdown|admonition|toggle|note|tip|hint)\}", line)
        if fence:
            marker = fence.group(2)
            j = i + 1
            body = []
            while j < len(lines) and not re.match(rf"^\s*{re.escape(marker)}\s*$", lines[j]):
                body.append(lines[j])
                j += 1
            folded = fence.group(3) in ("dropdown", "toggle") or any(
                re.match(r"^\s*:class:.*\bdropdown\b", b) for b in body[:4])
            (inside if folded else outside).append(line + "\n" + "\n".join(body))
            i = j + 1
            continue
        outside.append(line)
        i += 1
    return "\n".join(outside), "\n".join(inside)


def glue_names(text: str) -> list[str]:
    """The glue names a text pastes (``{glue:text}`name:.2f``` -> ``name``; another page's ``doc::name`` too)."""
    names = []
    for raw in GLUE_ROLE.findall(text) + GLUE_DIRECTIVE.findall(text):
        name = raw.split("::", 1)[-1]
        names.append(re.sub(r":[^:]*$", "", name) if re.search(r":[^:]*[a-z%]$", name) else name)
    return names


def regions(nb, keys) -> dict[str, str]:
    """Exercise key -> its markdown (from its bold key to the next exercise's or the section's end)."""
    text = "\n\n".join(source for _, source in exercises_text(nb))
    starts = []
    for key in keys:
        match = re.search(rf"\*\*(?:Exercise\s+)?{re.escape(key)}\b", text)
        assert match, f"exercise {key}: no question opening with **{key}. under ## Exercises"
        starts.append((match.start(), key))
    starts.sort()
    return {key: text[start:(starts[i + 1][0] if i + 1 < len(starts) else len(text))]
            for i, (start, key) in enumerate(starts)}


@pytest.fixture(params=NOTEBOOKS, ids=IDS)
def chapter(request):
    return request.param, nbformat.read(request.param, as_version=4)


def test_every_exercise_reads_its_parameters_through_glue(chapter):
    path, nb = chapter
    exercises, _ = exercises_dict(nb)
    number = int(path.stem[:2])
    problems = []
    for key, parameters in exercises.items():
        if not re.fullmatch(rf"{number}\.\d+", str(key)):
            problems.append(f"key {key!r} should read '{number}.<n>' (chapter {number})")
        if not isinstance(parameters, dict):
            problems.append(f"{key}: its parameters must be a dict, not {type(parameters).__name__}")
    assert not problems, f"{path.name}: " + "; ".join(problems)
    found = regions(nb, [str(key) for key in exercises])
    for key, parameters in exercises.items():
        question, solution = split_folded(found[str(key)])
        in_question, in_solution = set(glue_names(question)), set(glue_names(solution))
        commands = {name for name in in_question | in_solution if name == f"ex{key}_command"}
        if not solution.strip():
            problems.append(f"{key}: no solution (a folded block after the question)")
        elif parameters and not any(name.startswith(f"ex{key}_") for name in in_solution):
            problems.append(f"{key}: its solution reads no glued value (ex{key}_...)")
        for name in parameters:
            glued = f"ex{key}_{name}"
            if glued not in in_question and not commands:
                problems.append(f"{key}: the question does not read {name} through {{glue:text}}`{glued}`")
            if glued not in in_solution and not commands:
                problems.append(f"{key}: the solution (or a glued ex{key}_command) does not read {glued}")
        strays = {name for name in in_question | in_solution
                  if re.match(r"ex\d+\.\d+_", name) and not name.startswith(f"ex{key}_")}
        if strays:
            problems.append(f"{key}: reads another exercise's values {sorted(strays)}")
        if parameters and re.search(r"make notebooks[^`\n]*(SET=|ONLY=)", GLUE_ROLE.sub("", question + solution)):
            problems.append(f"{key}: types a command; glue it from EXERCISES as ex{key}_command")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_no_sentence_generator_shows_in_the_exercises(chapter):
    path, nb = chapter
    start = next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
                  and re.search(r"^## Exercises", cell.source, re.MULTILINE)), None)
    assert start is not None, f"{path.name} has no ## Exercises section"
    end = next((i for i, cell in enumerate(nb.cells) if i > start and cell.cell_type == "markdown"
                and cell.source.startswith("## ")), len(nb.cells))
    shown = [i for i, cell in enumerate(nb.cells[start:end], start) if cell.cell_type == "code"
             and "Markdown(" in cell.source
             and not {"remove-cell", "remove-input"} & set(cell.metadata.get("tags", []))]
    assert not shown, (f"{path.name}: cells {shown} write sentences with code a reader can unfold; tag them "
                       "remove-cell (glue their values) or remove-input")


# ---------------------------------------------------------------------------
# The executed chapters: the glued values are the dict's


def glued(nb) -> dict[str, object]:
    """Every value a notebook glued: name -> its text (text/plain, literal-evaluated where it is a literal)."""
    values = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if not name:
                continue
            data = {key.removeprefix(GLUE_PREFIX): value for key, value in output.get("data", {}).items()}
            text = data.get("text/markdown", data.get("text/plain", ""))  # a Markdown object's plain text is its repr
            text = "".join(text) if isinstance(text, list) else str(text)
            try:
                values[name] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                values[name] = text
    return values


def _items(value) -> list[str]:
    """A value as the list of its items' texts: ``(32, 64)``, ``"32, 64"`` and ``"32 64"`` all read ['32', '64']."""
    if isinstance(value, (tuple, list)):
        return [item for v in value for item in _items(v)]
    return [item for item in re.split(r"[\s,()\[\]'`]+", str(value)) if item]


@pytest.fixture(scope="module")
def executed(smoke_chapters, tmp_path_factory):
    """stem -> a function returning the chapter executed at smoke: tests/test_notebooks.py's copy where it ran
    (waiting for a chapter a worker is executing), else executed here, into a results folder of its own."""
    import os

    from tests.test_notebooks import INLINE_BACKEND, chapter_lock, runner  # noqa: PLC0415

    folder = tmp_path_factory.mktemp("exercises")

    def load(path: Path):
        with chapter_lock(smoke_chapters, path.stem):
            if not (smoke_chapters / path.name).exists():
                saved = {name: os.environ.get(name) for name in ("DALIGN_RESULTS", "MPLBACKEND")}
                os.environ.update(DALIGN_RESULTS=str(folder / "results"), MPLBACKEND=INLINE_BACKEND)
                try:
                    out = runner.execute(path, "smoke", folder, runner.kernel_name(), force=False,
                                         cell_timeout_s=900)
                finally:
                    for name, value in saved.items():
                        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
                shutil.copy2(out, smoke_chapters / path.name)
        return nbformat.read(smoke_chapters / path.name, as_version=4)

    return load


@pytest.mark.slow  # executes every chapter unless tests/test_notebooks.py already did
def test_the_glued_values_are_the_dicts(chapter, executed):
    path, nb = chapter
    exercises, _ = exercises_dict(nb)
    values = glued(executed(path))
    problems = []
    for key, parameters in exercises.items():
        for name, value in parameters.items():
            glued_name = f"ex{key}_{name}"
            if glued_name not in values:
                problems.append(f"{glued_name} was never glued")
            elif _items(values[glued_name]) != _items(value):
                problems.append(f"{glued_name} holds {values[glued_name]!r}, EXERCISES says {value!r}")
        command = values.get(f"ex{key}_command")
        if command is not None:
            missing = [name for name, value in parameters.items()
                       if not all(item in _items(command) or item in str(command) for item in _items(value))]
            if missing:
                problems.append(f"ex{key}_command {command!r} lacks the values of {missing}")
    prose = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    unknown = sorted({name for name in glue_names(prose) if "::" not in name} - set(values))
    if unknown:
        problems.append(f"the prose reads glue names that were never glued: {unknown}")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)
