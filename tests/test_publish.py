"""The book's repository address: only an address its theme can link to, never a local folder or credentials."""

import sys

import pytest

from dalign_repro.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "book" / "_ext"))
import dalign_publish  # noqa: E402


@pytest.mark.parametrize("given, expected", [
    ("git@github.com:owner/name.git", "https://github.com/owner/name"),
    ("https://user:token@gitlab.com/owner/name.git", "https://gitlab.com/owner/name"),
    ("/work/main/.", ""),  # a fresh clone's origin: a local folder, no page to link to (it stopped the build)
    ("file:///srv/dalign.git", ""),
    ("https://example.org/owner/name", ""),  # a host the theme does not know would stop the build
    ("", ""),
])
def test_the_repository_address_is_one_the_theme_can_link_to(given, expected, monkeypatch):
    monkeypatch.delenv("DALIGN_REPOSITORY_URL", raising=False)
    assert dalign_publish.repository_url(given) == expected


BUTTONS = {"notebook_interface": "jupyterlab", "binderhub_url": "https://mybinder.org",
           "colab_url": "https://colab.research.google.com", "deepnote_url": "", "thebe": False}


def test_a_launch_button_appears_only_where_it_can_open_the_chapter():
    github = "https://github.com/owner/name"
    # No address: no button at all.
    assert dalign_publish.launch_buttons("", BUTTONS, "") == {}
    # Binder builds its image from binder/ for any address; Colab has only the notebook, whose first cell must
    # install dalign from this very address, on GitHub.
    assert dalign_publish.launch_buttons(github, BUTTONS, github)["colab_url"] == BUTTONS["colab_url"]
    for url, install_from in ((github, ""), (github, "https://github.com/other/fork"),
                              ("https://gitlab.com/owner/name", "https://gitlab.com/owner/name")):
        shown = dalign_publish.launch_buttons(url, BUTTONS, install_from)
        assert "colab_url" not in shown and shown["binderhub_url"] == BUTTONS["binderhub_url"], (url, install_from)


def test_the_notebooks_name_the_address_they_install_from():
    assert dalign_publish.notebooks_install_from(REPO_ROOT / "book") == "" or \
        dalign_publish.notebooks_install_from(REPO_ROOT / "book").startswith("https://")


def test_binder_carries_the_repositorys_pins_and_marks_a_launch():
    def pins(path):
        return sorted(line.strip() for line in path.read_text().splitlines()
                      if line.strip() and not line.lstrip().startswith("#"))

    binder = REPO_ROOT / "binder"
    assert pins(binder / "requirements.txt") == pins(REPO_ROOT / "requirements.txt"), (
        "binder/requirements.txt must hold exactly the pins of requirements.txt")
    assert (binder / "runtime.txt").read_text().strip() == "python-3.11"
    for script in ("postBuild", "start"):
        assert (binder / script).stat().st_mode & 0o111, f"binder/{script} must be executable"
    assert "pip install --no-deps -e ." in (binder / "postBuild").read_text()
    start = (binder / "start").read_text()
    assert "DALIGN_LAUNCH_PROFILE=lab" in start and 'exec "$@"' in start


def test_the_landing_page_reads_what_the_claims_chapter_glued(tmp_path):
    """The landing page's verdicts are chapter 6's, read from its glued outputs: nothing typed, nothing judged twice."""
    import nbformat

    import dalign_findings

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("glue(...)", outputs=[
        nbformat.v4.new_output("display_data", data={
            "application/papermill.record/text/html": "<div id='dalign-claims-glance'></div>",
            "application/papermill.record/text/plain": "<IPython.core.display.HTML object>"},
            metadata={"scrapbook": {"name": "claims_glance", "mime_prefix": "application/papermill.record/"}}),
        nbformat.v4.new_output("display_data", data={"text/plain": "'cpu'"}, metadata={}),
    ])])
    nbformat.write(nb, tmp_path / "06_claims.ipynb")
    found = dalign_findings.glued(tmp_path / "06_claims.ipynb")
    assert list(found) == ["claims_glance"]  # an ordinary output is no glued value
    assert found["claims_glance"]["text/html"] == "<div id='dalign-claims-glance'></div>"
