"""What the published book needs beyond Jupyter Book's defaults: a trimmed MathJax, and launch buttons that open
the notebook the chapter was executed from.

MathJax. ``sphinx-mathjax-offline`` copies its whole MathJax 3 distribution (24 MB: every component, the speech
rule engine, the SVG output) into ``_static/mathjax``, while a page loads ``tex-chtml.js`` and, from there, only the
CHTML fonts, the TeX extensions its autoloader may pull in (``\\boldsymbol`` ...) and the menu's accessibility and UI
components. :func:`copy_mathjax` copies those (:data:`MATHJAX_KEEP`, about 3 MB) from the same pinned package, so
the book still needs no network; ``tests/test_browser.py`` checks that every request a page makes succeeds.

Repository and launch buttons. ``_config.yml`` configures the repository link and the Binder and Colab buttons;
the repository's address comes from ``repository.url`` there or, when that is empty, from the environment variable
``DALIGN_REPOSITORY_URL`` (``make book REPO_URL=...``; by default the ``origin`` remote's https address), so a
clone published under another address links to itself. Without an address no button is shown (nothing to link
to). Building needs no network either way: the buttons are plain links. Jupyter Book points a launch button at
the page's source, ``book/chapters/<chapter>.ipynb``, which is an executed copy that is not committed;
:func:`launch_from_notebooks` points it at ``notebooks/<chapter>.ipynb``, which is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

MATHJAX_KEEP = ("tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "a11y", "ui")
"""What a page of the book loads of MathJax (relative to the distribution's root); the rest is not copied."""

EXECUTED = "chapters/"
"""Where the book's pages come from (the executed notebooks), relative to the book's folder."""
NOTEBOOKS = "notebooks/"
"""Where those notebooks are kept in the repository."""


def mathjax_source() -> Path:
    """The MathJax 3 distribution shipped by the pinned ``sphinx-mathjax-offline`` package."""
    import importlib.util

    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or not spec.origin:
        raise RuntimeError("sphinx-mathjax-offline is not installed; run `make setup` (it is pinned in "
                           "requirements.txt)")
    return Path(spec.origin).parent / "static" / "mathjax"


def copy_mathjax(app, exception) -> None:
    """On a successful HTML build, copy :data:`MATHJAX_KEEP` of MathJax into ``_static/mathjax``."""
    if exception is not None or app.builder.format != "html":
        return
    source = mathjax_source()
    target = Path(app.outdir) / "_static" / "mathjax"
    if target.exists():
        shutil.rmtree(target)
    for part in MATHJAX_KEEP:
        origin = source / part
        if origin.is_dir():
            shutil.copytree(origin, target / part)
        else:
            (target / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target / part)


def repository_url(config_url: str) -> str:
    """The repository's https address: ``config_url``, else ``$DALIGN_REPOSITORY_URL``, else "" (no buttons)."""
    url = (config_url or os.environ.get("DALIGN_REPOSITORY_URL", "")).strip()
    if url.startswith("git@"):  # git@github.com:owner/name.git
        host, _, path = url[4:].partition(":")
        url = f"https://{host}/{path}"
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:  # https://user:token@host/...: never publish credentials
        url = f"{scheme}://{rest.split('@', 1)[1]}"
    url = url.removesuffix(".git").rstrip("/")
    # A clone's origin is often a local folder (a fresh clone of a checkout, CI): no page to link to. And the theme
    # knows the hosts of these providers only; any other address would stop the build.
    host = url.partition("://")[2].split("/", 1)[0].lower() if url.startswith(("https://", "http://")) else ""
    return url if any(host == p or host.endswith("." + p) for p in PROVIDERS) else ""


PROVIDERS = ("github.com", "gitlab.com", "bitbucket.org")
"""The repository hosts the book's theme builds links and launch buttons for."""


WIDE_PAGES = ("chapters/06_claims",)
"""Pages without the right-hand contents column: their grid takes its room (dalign_repro.claims.page)."""


def widen_pages(app, config) -> None:
    """No right-hand contents column on :data:`WIDE_PAGES` (the theme's ``secondary_sidebar_items`` by page)."""
    options = config.html_theme_options
    items = options.get("secondary_sidebar_items", ["page-toc"])
    default = items.get("**", ["page-toc"]) if isinstance(items, dict) else items
    by_page = dict(items) if isinstance(items, dict) else {"**": list(default)}
    by_page.update({page: [] for page in WIDE_PAGES})
    options["secondary_sidebar_items"] = by_page


def notebooks_install_from(book: Path) -> str:
    """The address the chapters' launch cell installs dalign from when it is missing (``REPOSITORY`` in
    ``notebooks/*.ipynb``, written by ``scripts/launch_cell.py`` from ``_config.yml``); "" when none names one."""
    import json
    import re

    folder = book.parent / "notebooks"
    found = set()
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = next(("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"), "")
        match = re.search(r"^REPOSITORY = ['\"]([^'\"]*)['\"]", code, re.MULTILINE)
        found.add(match.group(1).removesuffix(".git").rstrip("/") if match else "")
    return found.pop() if len(found) == 1 else ""


def launch_buttons(url: str, buttons: dict, install_from: str) -> dict:
    """The launch buttons that can open a chapter at ``url``: Binder for any repository address (it builds the image
    from ``binder/``); Colab only for a GitHub address that the chapters' first cell installs dalign from (a Colab
    session has nothing but the notebook). None without an address."""
    if not url:
        return {}
    buttons = dict(buttons)
    host = url.partition("://")[2].split("/", 1)[0].lower()
    if host != "github.com" or install_from != url:
        buttons.pop("colab_url", None)
    buttons.pop("deepnote_url", None)  # it would open the notebook without the package
    return buttons


def set_repository(app, config) -> None:
    """Fill in the theme's repository address (see the module docstring); without one, show no buttons; show only
    the launch buttons that can open a chapter there (:func:`launch_buttons`)."""
    options = config.html_theme_options
    url = repository_url(options.get("repository_url", ""))
    options["repository_url"] = url
    options["use_repository_button"] = options["use_issues_button"] = bool(url)
    install_from = notebooks_install_from(Path(app.srcdir)) if url else ""
    options["launch_buttons"] = launch_buttons(url, options.get("launch_buttons") or {}, install_from)


def _relink(buttons, book_path: str) -> None:
    for group in buttons:
        if group.get("label") == "launch-buttons":  # the theme's group of launch buttons
            for button in group.get("buttons", []):
                if isinstance(button.get("url"), str):
                    button["url"] = button["url"].replace(f"{book_path}{EXECUTED}", NOTEBOOKS)


def launch_from_notebooks(app, pagename, templatename, context, doctree) -> None:
    """Point each launch button of a chapter at ``notebooks/<chapter>.ipynb`` (after the theme made them)."""
    book_path = app.config.html_theme_options.get("path_to_docs", "").strip("/")
    _relink(context.get("header_buttons", []), f"{book_path}/" if book_path else "")


def setup(app):
    app.connect("config-inited", set_repository)
    app.connect("config-inited", widen_pages)
    app.connect("html-page-context", launch_from_notebooks, priority=900)
    app.connect("build-finished", copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
