"""What the reproduction found, on the landing page: ``{claims-at-a-glance}``.

The claims chapter (``notebooks/06_claims.ipynb``) judges every claim of the paper at the book's profile and glues
two things for this page with myst-nb's ``glue``: ``claims_headline`` (one sentence per group of claims counting its
verdicts, :func:`dalign_repro.claims.page.headline_text`) and ``claims_glance`` (the grid of claim × family,
:func:`dalign_repro.claims.page.claims_grid_html` without the folded details, its labels linked into
``chapters/``). The directive reads both from the executed chapter, ``book/chapters/06_claims.ipynb``, and renders
them where it stands: the landing page shows exactly the verdicts chapter 6 shows, at whatever profile the book was
built, and judges nothing itself. (myst-nb's own cross-page ``{glue:}`` role pastes inline only; the grid is a
block.)

Nothing here is typed: every count and label comes from the claims table, and changes when the results do.
"""

from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList

BOOK = Path(__file__).resolve().parents[1]
CLAIMS_CHAPTER = "06_claims"
GLUE_PREFIX = "application/papermill.record/"


def glued(notebook: Path) -> dict[str, dict]:
    """``{name: {mime type: data}}`` of every value a notebook glued (``myst_nb.glue``) in its outputs."""
    found: dict[str, dict] = {}
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                found[name] = {key.removeprefix(GLUE_PREFIX): value for key, value in output.get("data", {}).items()}
    return found


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


class ClaimsAtAGlance(Directive):
    """The verdicts chapter 6 judged, counted per group, and its claims grid (see the module docstring)."""

    has_content = False

    def run(self):
        chapter = BOOK / "chapters" / f"{CLAIMS_CHAPTER}.ipynb"
        if not chapter.is_file():
            raise self.error(f"claims-at-a-glance: {chapter} does not exist; execute the claims chapter first "
                             f"(make notebooks ONLY={CLAIMS_CHAPTER})")
        values = glued(chapter)
        missing = [name for name in ("claims_headline", "claims_glance", "profile_name") if name not in values]
        if missing:
            raise self.error(f"claims-at-a-glance: {chapter.name} glued no {', '.join(missing)}; execute it again "
                             f"(make notebooks ONLY={CLAIMS_CHAPTER})")
        profile = _text(values["profile_name"]["text/plain"]).strip("'\"")
        lines = [f"The verdicts at the `{profile}` profile, counted apart:", ""]
        lines += _text(values["claims_headline"]["text/markdown"]).splitlines()
        container = nodes.container(classes=["dalign-glance"])
        self.state.nested_parse(StringList(lines, source=str(chapter)), self.content_offset, container)
        container += nodes.raw("", _text(values["claims_glance"]["text/html"]), format="html")
        return [container]


def _always_reread(app, env, added, changed, removed):
    """The landing page reads the executed claims chapter, which Sphinx does not track: read it on every build."""
    return [app.config.root_doc] if app.config.root_doc in env.found_docs else []


def setup(app):
    app.connect("env-get-outdated", _always_reread)
    app.add_directive("claims-at-a-glance", ClaimsAtAGlance)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
