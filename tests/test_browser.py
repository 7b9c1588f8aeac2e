"""The built book in a real browser: math rendered, images loaded, no error output, nothing fetched from outside.

Headless Chromium (Debian's ``chromium`` with ``chromium-driver``, driven by Selenium)
opens ``index.html`` and every other page of the built HTML book, served from this
machine (``http://127.0.0.1:<port>``), and checks on each page that

* every formula was typeset by MathJax (each ``.math`` element holds an
  ``mjx-container``, no ``mjx-merror``) and no raw TeX (``\\(``, ``\\[``, ``$$``,
  ``$x_i$``, ``\\frac`` ...) is left in the text outside code;
* every ``<img>`` loaded (``naturalWidth > 0``);
* no cell shows error output (stderr or a traceback);
* every request the page made (recorded from Chrome's DevTools network events)
  stayed on this machine (``localhost``, ``127.0.0.1``, ``data:``, ``blob:``,
  ``file:``), and every local one succeeded. Host names other than localhost
  also fail to resolve inside the browser, so nothing leaves the machine even
  where there is a network.

It checks the course table of the landing page (a row per chapter with its reading time and rerun costs at
``lab`` and ``cpu``, and the two-week plan), that the claims page opens on its grid (it starts on the first
screen at 1280 × 900 and is at most one screen tall), and that no page asks its reader to "hover".

It also opens every page at a phone's width (390 px) and in the theme's dark mode, and fails
when the page itself scrolls sideways at 1280 or 390 px (an element wider than the window
that no scrolling box of its own holds: wide math and tables must scroll inside their
block or wrap; ``book/_static/dalign.css``), when an image is wider than the window or cut off by the box that
holds it at either width, and when a figure is shrunk on the phone so far that its smallest label
(``dalign_repro.report.figure_style.MIN_FONT_PT`` at its ``DPI``) falls under 9 px. The landing page must open
with what the reproduction found (the verdicts counted and the claims grid) before its course path. It saves a full-page screenshot of each page
in each view to ``book/_build/screenshots/``: ``<page>.png`` (1280 px), ``<page>@390.png``
and ``<page>@dark.png``.

The book under test: ``DALIGN_BOOK_HTML=<folder with index.html>`` names a built
one (``make book PROFILE=smoke`` then ``DALIGN_BOOK_HTML=book/_build/html pytest
tests/test_browser.py``). Without it, the test builds its own in a temporary copy
of ``book/``: the chapters are the notebooks executed at the smoke profile, taken
from ``tests/test_notebooks.py`` when it ran earlier in the same session
(``conftest.py`` runs this file last) and executed here otherwise; then
``jupyter-book build -W -n``, as ``make book`` does. Pages are found in the
built HTML, so new chapters are covered as they are added to ``_toc.yml``.

Skipped, with the reason, when Selenium, Chromium or chromedriver is missing
(``apt-get install chromium chromium-driver``; ``DALIGN_CHROMIUM`` and
``DALIGN_CHROMEDRIVER`` name other binaries).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from dalign_repro.config import REPO_ROOT
from dalign_repro.report import figure_style
from tests.test_notebooks import _toc_files, chapter_lock

BOOK = REPO_ROOT / "book"
SCREENSHOTS = BOOK / "_build" / "screenshots"
BUILD_TIMEOUT_S = 900
CELL_TIMEOUT_S = 900
PAGE_TIMEOUT_S = 60
WINDOW = (1280, 900)
PHONE_WIDTH = 390
MIN_LABEL_PX = 9
"""The smallest label a figure may show on a phone, in screen pixels."""
MAX_SCREENSHOT_HEIGHT = 12000
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
LOCAL_SCHEMES = {"data", "blob", "file", "about"}
# Console errors that are not the book's fault: pydata-sphinx-theme reports an empty saved colour mode
# on a browser's first visit (a fresh profile has none) and resets it to "auto".
CONSOLE_NOISE = ("favicon.ico", "Got invalid theme mode")
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
JUPYTER_BOOK = "import sys; from jupyter_book.cli.main import main; sys.argv[0] = 'jupyter-book'; sys.exit(main())"


def _find(variable: str, *names: str) -> str | None:
    explicit = os.environ.get(variable)
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((found for name in names if (found := shutil.which(name))), None)


CHROMIUM = _find("DALIGN_CHROMIUM", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMEDRIVER = _find("DALIGN_CHROMEDRIVER", "chromedriver")

try:
    import selenium  # noqa: F401
except ImportError:
    pytest.skip("selenium is not installed (it is pinned in requirements.txt: make setup)", allow_module_level=True)
if CHROMIUM is None or CHROMEDRIVER is None:
    missing = " and ".join(name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if path is None)
    pytest.skip(f"no {missing} on this machine: the browser test needs Debian's chromium and chromium-driver "
                "(apt-get install -y chromium chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


# ---------------------------------------------------------------------------
# The book under test


def _execute_chapters(chapters: Path, reuse: Path, results: Path) -> tuple[int, int]:
    """Executed smoke copies of every notebook into ``chapters``: from ``reuse`` where there (after waiting for a
    chapter that a worker of tests/test_notebooks.py is executing), else executed now.

    Returns (how many were reused, how many executed here).
    """
    import importlib.util

    from papermill.exceptions import PapermillExecutionError

    spec = importlib.util.spec_from_file_location("execute_notebooks", REPO_ROOT / "scripts" / "execute_notebooks.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    chapters.mkdir(parents=True, exist_ok=True)
    reused = executed = 0
    with pytest.MonkeyPatch.context() as env:  # restored however the loop ends
        env.setenv("DALIGN_RESULTS", str(results))
        env.setenv("MPLBACKEND", INLINE_BACKEND)
        for path in runner.find_notebooks():
            # Held by a worker of tests/test_notebooks.py while it executes the chapter: wait for it.
            with chapter_lock(reuse, path.stem):
                if (reuse / path.name).exists():
                    shutil.copy2(reuse / path.name, chapters / path.name)
                    reused += 1
                    continue
                try:
                    runner.execute(path, "smoke", chapters, runner.kernel_name(), force=False,
                                   cell_timeout_s=CELL_TIMEOUT_S)
                except PapermillExecutionError as error:
                    pytest.fail(f"cannot build the book: {path.name} fails at the smoke profile in cell "
                                f"{error.exec_count}: {error.ename}: {error.evalue}", pytrace=False)
                executed += 1
    return reused, executed


@pytest.fixture(scope="module")
def book_html(tmp_path_factory, smoke_chapters) -> Path:
    """The built book's HTML folder: DALIGN_BOOK_HTML, or a smoke build of a temporary copy of book/."""
    given = os.environ.get("DALIGN_BOOK_HTML")
    if given:
        html = Path(given).resolve()
        if not (html / "index.html").exists():
            pytest.fail(f"DALIGN_BOOK_HTML={given} has no index.html; build the book first (make book)", pytrace=False)
        return html
    root = tmp_path_factory.mktemp("browser")
    book = root / "book"
    shutil.copytree(BOOK, book, ignore=shutil.ignore_patterns("_build", "chapters", ".ipynb_checkpoints", "*.tmp"))
    start = time.perf_counter()
    reused, executed_here = _execute_chapters(book / "chapters", smoke_chapters, root / "results")
    executed = time.perf_counter() - start
    build = subprocess.run(
        [sys.executable, "-c", JUPYTER_BOOK, "build", str(book), "-W", "-n", "--keep-going"],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=root,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    if build.returncode != 0:
        pytest.fail(f"jupyter-book build -W failed (exit {build.returncode}):\n"
                    f"{(build.stdout + build.stderr)[-6000:]}", pytrace=False)
    print(f"\nbrowser test: {reused} chapter(s) from test_notebooks.py, {executed_here} executed here in "
          f"{executed:.0f} s; book built in "
          f"{time.perf_counter() - start - executed:.0f} s at {book / '_build' / 'html'}")
    return book / "_build" / "html"


def _pages(html: Path) -> list[str]:
    """Every HTML page of the built book, relative to ``html`` (``index.html`` first); not _static/ or _sources/."""
    pages = sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                   if not any(part.startswith("_") for part in p.relative_to(html).parts))
    return sorted(pages, key=lambda page: page != "index.html")


# ---------------------------------------------------------------------------
# The browser


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test reports failed requests itself
        pass


@pytest.fixture(scope="module")
def server(book_html):
    """An HTTP server for the built book on 127.0.0.1 (a free port); yields its base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(book_html)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars", "--force-device-scale-factor=1",
        "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
        "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
        "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--metrics-recording-only",
        # Every host but this machine fails to resolve: a page that asks for one is recorded, and nothing leaves.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    options.add_experimental_option("perfLoggingPrefs", {"enableNetwork": True, "enablePage": False})
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(PAGE_TIMEOUT_S)
    browser.set_script_timeout(PAGE_TIMEOUT_S)
    try:
        yield browser
    finally:
        browser.quit()


# Runs in the page once it has loaded: waits for MathJax and the images, then reports.
INSPECT = r"""
const done = arguments[arguments.length - 1];
(async () => {
  const timeout = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const startup = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
  let mathjax = "absent";
  if (startup) {
    mathjax = await Promise.race([startup.then(() => "ready", (e) => "failed: " + e), timeout(30000).then(() => "timeout")]);
  }
  const images = Array.from(document.images);
  images.forEach((img) => { img.loading = "eager"; });
  await Promise.all(images.map((img) => img.complete ? null : Promise.race([
    new Promise((resolve) => { img.addEventListener("load", resolve); img.addEventListener("error", resolve); }),
    timeout(15000)])));
  const brokenImages = images.filter((img) => !(img.naturalWidth > 0)).map((img) => img.currentSrc || img.src || img.outerHTML.slice(0, 120));

  const math = Array.from(document.querySelectorAll(".math"));
  const unrendered = math.filter((el) => !el.querySelector("mjx-container")).map((el) => el.textContent.trim().slice(0, 80));
  const merrors = Array.from(document.querySelectorAll("mjx-merror")).map((el) => (el.getAttribute("data-mjx-error") || el.textContent).slice(0, 120));

  // Text outside code, scripts and typeset math: raw TeX left there was never typeset.
  const skip = "pre, code, script, style, textarea, mjx-container, .highlight, .MathJax";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement && node.parentElement.closest(skip)) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
  });
  const pattern = /\\\(|\\\[|\$\$|\\begin\{|\\(?:frac|mathrm|mathbb|text|operatorname|bar|top|le|ge|Sigma|mu)(?![A-Za-z])|\$[^$\s][^$\n]*[\\_^][^$\n]*\$/;
  const rawTex = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const match = node.textContent.match(pattern);
    if (match) {
      const at = match.index;
      rawTex.push(node.textContent.slice(Math.max(0, at - 30), at + 50).replace(/\s+/g, " "));
    }
  }
  // A `$` left beside a typeset formula: `$$...$$` inside a paragraph or list item becomes `$` + math + `$`.
  for (const el of math) {
    const before = el.previousSibling, after = el.nextSibling;
    const left = before && before.nodeType === Node.TEXT_NODE ? before.textContent : "";
    const right = after && after.nodeType === Node.TEXT_NODE ? after.textContent : "";
    if (/\$\s*$/.test(left) || /^[.,;:!?)]?\s*\$/.test(right)) {
      rawTex.push("stray $ beside the formula " + el.textContent.trim().slice(0, 60));
    }
  }
  const errorOutputs = Array.from(document.querySelectorAll(
    ".cell_output .stderr, .cell_output .traceback, .output.stderr, .output.traceback, .output.error"))
    .map((el) => el.textContent.trim().slice(0, 200));
  const hover = /\bhover\b/i.test(document.body.innerText);  // a page may not hide what it says in a tooltip
  done({url: location.href, title: document.title, mathjax, mathCount: math.length, hover,
        mathjaxContainers: document.querySelectorAll("mjx-container").length,
        unrendered, merrors, rawTex, brokenImages, imageCount: images.length, errorOutputs});
})().catch((e) => done({error: String(e)}));
"""


@dataclass
class PageReport:
    page: str
    url: str = ""
    inspect: dict = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    overflow: dict[int, dict] = field(default_factory=dict)
    """Window width -> what OVERFLOW found there."""
    images: dict[int, dict] = field(default_factory=dict)
    """Window width -> what IMAGES found there."""
    phone_screenshot: Path | None = None
    dark_screenshot: Path | None = None
    dark_background: str = ""


def _is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES or parts.scheme in ("chrome", "chrome-extension", "devtools"):
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") in LOCAL_HOSTS


def _network(entries: list[dict]) -> tuple[list[str], list[str]]:
    """(every URL requested, 'URL: why' for each local request that failed) from DevTools performance entries."""
    urls: dict[str, str] = {}
    requested: list[str] = []
    failed: list[str] = []
    for entry in entries:
        message = json.loads(entry["message"])["message"]
        method, params = message.get("method"), message.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            urls[params["requestId"]] = url
            requested.append(url)
        elif method == "Network.responseReceived":
            response = params["response"]
            if response.get("status", 0) >= 400 and not response["url"].endswith("/favicon.ico"):
                failed.append(f"{response['url']}: HTTP {response['status']}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            url = urls.get(params.get("requestId"), "?")
            if _is_local(url) and not url.endswith("/favicon.ico"):
                failed.append(f"{url}: {params.get('errorText')}")
    return requested, failed


def _screenshot(driver, page: str, width: int = WINDOW[0], suffix: str = "") -> Path:
    """A full-page PNG (up to MAX_SCREENSHOT_HEIGHT px tall) of the current page under book/_build/screenshots/.

    The viewport is made as tall as the page (at ``width``) for the capture, then restored to the window.
    """
    _set_width(driver, width)
    height = driver.execute_script("return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)")
    height = int(min(max(height, WINDOW[1]), MAX_SCREENSHOT_HEIGHT))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[arguments.length - 1]))")
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "fromSurface": True,
                                                                   "optimizeForSpeed": True})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    target = SCREENSHOTS / (re.sub(r"[^A-Za-z0-9_.-]+", "__", page.removesuffix(".html")) + suffix + ".png")
    target.write_bytes(base64.b64decode(shot["data"]))
    return target


def _set_width(driver, width: int) -> None:
    """Lay the page out in a window ``width`` px wide (the window's height), and wait for the layout."""
    if width == WINDOW[0]:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    else:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
    driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[arguments.length - 1]))")


# Runs in the page: does the page itself scroll sideways, and which elements stick out of the window?
OVERFLOW = r"""
const root = document.documentElement;
const width = root.clientWidth;
const scrolls = Math.max(root.scrollWidth, document.body.scrollWidth) - width;
const held = (el) => {  // inside a box that scrolls or clips its own overflow
  for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
    const style = getComputedStyle(up);
    if (["auto", "scroll", "hidden", "clip"].includes(style.overflowX)) return true;
  }
  return false;
};
const offenders = [];
if (scrolls > 1) {
  for (const el of document.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (box.width > 0 && box.right > width + 1 && !held(el) && getComputedStyle(el).position !== "fixed") {
      const name = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
        (el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\s+/).slice(0, 2).join(".") : "");
      offenders.push(name + " (right edge " + Math.round(box.right) + " px)");
      if (offenders.length >= 5) break;
    }
  }
}
return {width, scrolls, offenders};
"""


# Runs in the page: where every image sits at this width, and whether a box that clips or scrolls cuts it off.
IMAGES = r"""
const width = document.documentElement.clientWidth;
const column = document.querySelector(".bd-article");
const clipper = (el) => {
  for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
    if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(up).overflowX)) return up;
  }
  return null;
};
const images = Array.from(document.images).filter((img) => img.getBoundingClientRect().width > 0).map((img) => {
  const box = img.getBoundingClientRect();
  const holder = clipper(img);
  const hold = holder ? holder.getBoundingClientRect() : null;
  return {src: (img.currentSrc || img.src || "").split("/").pop().slice(0, 60), left: box.left, right: box.right,
          shown: box.width, natural: img.naturalWidth, figure: !!img.closest(".cell_output, figure"),
          cut: hold ? Math.max(0, box.right - hold.right, hold.left - box.left) : 0};
});
return {width, column: column ? column.clientWidth : null, images};
"""


def _set_dark(driver, dark: bool) -> None:
    """The theme's dark (or light) mode, as its switch sets it."""
    mode = "dark" if dark else "light"
    driver.execute_script(
        "document.documentElement.dataset.theme = arguments[0]; document.documentElement.dataset.mode = arguments[0];",
        mode)
    driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[arguments.length - 1]))")


@pytest.fixture(scope="module")
def reports(book_html, server, driver) -> dict[str, PageReport]:
    """Open every page once; what each one showed and requested."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    driver.get_log("performance")  # drop the start-up entries
    found: dict[str, PageReport] = {}
    for page in _pages(book_html):
        report = found[page] = PageReport(page)
        driver.get(server + page)
        if page == "index.html":  # a redirect to the root page: follow it
            WebDriverWait(driver, 15).until(lambda d: not d.current_url.endswith("/index.html"))
            WebDriverWait(driver, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")
        report.url = driver.current_url
        report.inspect = driver.execute_async_script(INSPECT)
        report.overflow[WINDOW[0]] = driver.execute_script(OVERFLOW)
        report.images[WINDOW[0]] = driver.execute_script(IMAGES)
        report.screenshot = _screenshot(driver, page)
        _set_width(driver, PHONE_WIDTH)
        report.overflow[PHONE_WIDTH] = driver.execute_script(OVERFLOW)
        report.images[PHONE_WIDTH] = driver.execute_script(IMAGES)
        report.phone_screenshot = _screenshot(driver, page, PHONE_WIDTH, "@390")
        _set_dark(driver, True)
        report.dark_background = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
        report.dark_screenshot = _screenshot(driver, page, WINDOW[0], "@dark")
        _set_dark(driver, False)
        report.requests, report.failed = _network(driver.get_log("performance"))
        report.external = [url for url in report.requests if not _is_local(url)]
        report.console_errors = [entry["message"][:300] for entry in driver.get_log("browser")
                                 if entry.get("level") == "SEVERE" and not any(noise in entry["message"] for noise in CONSOLE_NOISE)]
    return found


def _problems(reports: dict[str, PageReport], describe) -> str:
    lines = [f"{page}: {problem}" for page, report in reports.items() if (problem := describe(report))]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The checks


def test_every_page_of_the_toc_was_built_and_opened(book_html, reports):
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    expected = {f"{Path(entry).with_suffix('').as_posix()}.html" for entry in _toc_files(toc)}
    missing = expected - set(reports)
    assert not missing, f"pages of book/_toc.yml with no built HTML: {sorted(missing)}"
    assert reports["index.html"].url.rstrip("/").endswith(f"{Path(toc['root']).with_suffix('').as_posix()}.html"), (
        f"index.html should lead to the root page {toc['root']}, got {reports['index.html'].url}")
    errors = _problems(reports, lambda r: r.inspect.get("error"))
    assert not errors, f"the page inspection failed:\n{errors}"


def test_math_is_rendered_by_mathjax(reports):
    with_math = [r for r in reports.values() if r.inspect.get("mathCount")]
    assert with_math, "no page has any math: expected the intro, the notation page and the chapters to have some"
    problems = _problems(reports, lambda r: (
        f"MathJax not ready ({r.inspect.get('mathjax')})" if r.inspect.get("mathCount") and r.inspect.get("mathjax") != "ready"
        else f"{len(r.inspect['unrendered'])} of {r.inspect['mathCount']} formulas not typeset, e.g. {r.inspect['unrendered'][:3]}"
        if r.inspect.get("unrendered")
        else f"TeX errors: {r.inspect['merrors'][:3]}" if r.inspect.get("merrors")
        else f"raw TeX in the text: {r.inspect['rawTex'][:3]}" if r.inspect.get("rawTex")
        else None))
    assert not problems, f"math that is not rendered:\n{problems}"


def test_every_image_loads(reports):
    problems = _problems(reports, lambda r: r.inspect.get("brokenImages") and f"images that did not load: {r.inspect['brokenImages']}")
    assert not problems, problems


def test_no_cell_shows_error_output(reports):
    problems = _problems(reports, lambda r: r.inspect.get("errorOutputs") and f"stderr/traceback output: {r.inspect['errorOutputs'][:3]}")
    assert not problems, f"cells with error output:\n{problems}"


def test_no_request_leaves_the_machine(reports):
    assert any(r.requests for r in reports.values()), "no request was recorded at all: the DevTools network log is not working"
    problems = _problems(reports, lambda r: r.external and f"requested {sorted(set(r.external))}")
    assert not problems, f"requests to outside this machine (everything must ship with the book):\n{problems}"


def test_every_local_request_succeeds(reports):
    problems = _problems(reports, lambda r: (r.failed and f"failed: {r.failed[:5]}")
                         or (r.console_errors and f"console errors: {r.console_errors[:3]}"))
    assert not problems, problems


def test_a_screenshot_per_page(reports):
    for page, report in reports.items():
        for view, shot in (("1280 px", report.screenshot), ("390 px", report.phone_screenshot),
                           ("dark mode", report.dark_screenshot)):
            assert shot is not None and shot.stat().st_size > 1000, f"{page}: no screenshot at {view}"


@pytest.mark.parametrize("width", [WINDOW[0], PHONE_WIDTH])
def test_no_page_scrolls_sideways(reports, width):
    """Wide math, tables and code scroll inside their own block (or wrap); the page never does."""
    problems = _problems(reports, lambda r: r.overflow.get(width, {}).get("scrolls", 0) > 1 and (
        f"{r.overflow[width]['scrolls']} px wider than the {width}-px window; "
        f"sticking out: {r.overflow[width]['offenders'] or 'nothing found'}"))
    assert not problems, f"pages that scroll sideways at {width} px:\n{problems}"


@pytest.mark.parametrize("width", [WINDOW[0], PHONE_WIDTH])
def test_no_image_is_wider_than_the_window(reports, width):
    """Every image lies within the window and is not cut off by the box that holds it: no panel or legend lost."""
    def describe(report):
        found = report.images.get(width, {})
        bad = [f"{img['src']} ({img['shown']:.0f} px, {img['left']:.0f} to {img['right']:.0f}"
               + (f", {img['cut']:.0f} px cut off" if img["cut"] > 1 else "") + ")"
               for img in found.get("images", [])
               if img["left"] < -1 or img["right"] > found["width"] + 1 or img["cut"] > 1]
        return bad and f"images past the {found['width']}-px window or cut off: {bad[:4]}"

    assert any(r.images.get(width, {}).get("images") for r in reports.values()), "no image was measured at all"
    problems = _problems(reports, describe)
    assert not problems, f"at {width} px:\n{problems}"


def test_figure_labels_stay_readable_on_a_phone(reports):
    """A figure shrunk to the phone's column keeps labels of MIN_LABEL_PX and more (figure_style's smallest font at
    the scale the page shows it); and the column figure_style assumes is the one the phone has."""
    natural_label_px = figure_style.MIN_FONT_PT / 72 * figure_style.DPI

    def describe(report):
        found = report.images.get(PHONE_WIDTH, {})
        small = [f"{img['src']} ({img['natural']} px drawn, shown {img['shown']:.0f}: labels "
                 f"{natural_label_px * img['shown'] / img['natural']:.1f} px)"
                 for img in found.get("images", []) if img["figure"] and img["natural"] > 0
                 and natural_label_px * min(1.0, img["shown"] / img["natural"]) < MIN_LABEL_PX]
        return small and f"figures with labels under {MIN_LABEL_PX} px: {small[:4]}"

    problems = _problems(reports, describe)
    assert not problems, f"at {PHONE_WIDTH} px (draw them at figure_style.COLUMN_WIDTH or narrower):\n{problems}"
    columns = [r.images[PHONE_WIDTH]["column"] for r in reports.values()
               if r.images.get(PHONE_WIDTH, {}).get("column")]
    assert columns and min(columns) >= figure_style.PHONE_COLUMN_PX, (
        f"the phone's column is {min(columns)} px, narrower than figure_style.PHONE_COLUMN_PX "
        f"({figure_style.PHONE_COLUMN_PX}): set it to the measured width")


def test_dark_mode_is_dark(reports):
    def brightness(css: str) -> float:
        numbers = [float(x) for x in re.findall(r"[\d.]+", css)[:3]]
        return sum(numbers) / 3 if len(numbers) == 3 else 255.0

    problems = _problems(reports, lambda r: brightness(r.dark_background) > 100 and
                         f"background {r.dark_background} in dark mode")
    assert not problems, f"pages that stay light in dark mode:\n{problems}"


def test_no_page_asks_the_reader_to_hover(reports):
    """Nothing is said only in a tooltip: a phone has no hover, and a printed page neither."""
    problems = _problems(reports, lambda r: r.inspect.get("hover") and "says 'hover'")
    assert not problems, problems


def _fit_window(driver, width: int, height: int) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[arguments.length - 1]))")


def _open(driver, url: str, selector: str, what: str) -> None:
    """Load ``url`` and wait until ``selector`` matches, or fail saying ``what`` the page lacks and where the browser
    is. A load that came back without it (once, under a fully loaded 2-core machine, the landing page showed no
    course table that its HTML held) is tried once more."""
    present = lambda d: d.execute_script("return document.querySelector(arguments[0]) !== null", selector)  # noqa: E731
    for _ in range(2):
        driver.get(url)
        try:
            WebDriverWait(driver, 15).until(present)
            return
        except TimeoutException:
            continue
    pytest.fail(f"{url} has no {what} ({selector}) after two loads; the browser shows {driver.current_url!r}, "
                f"titled {driver.title!r}", pytrace=False)


def test_the_landing_page_has_a_course_path(book_html, server, driver, reports):
    """A row per chapter of _toc.yml with its reading time and its rerun cost at lab and at cpu, and the plan."""
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    chapters = [Path(entry).stem for entry in _toc_files(toc) if str(entry).startswith("chapters/")]
    root = Path(toc["root"]).with_suffix(".html").as_posix()
    _open(driver, server + root, "table.dalign-course", "course table")
    rows = driver.execute_script("""
        const table = document.querySelector("table.dalign-course");
        if (!table) return null;
        return Array.from(table.querySelectorAll("tbody tr")).map((tr) => ({
            cells: Array.from(tr.querySelectorAll("td")).map((td) => td.innerText.trim()),
            href: (tr.querySelector("a") || {}).href || ""}));""")
    assert rows is not None, f"{root} has no course table (table.dalign-course)"
    assert [Path(row["href"]).stem for row in rows] == chapters, "the course table lists the chapters of _toc.yml"
    for row in rows:
        title, reading, lab, cpu = row["cells"]
        assert re.fullmatch(r"\d+ min", reading), f"{title}: reading time {reading!r}"
        for cost in (lab, cpu):
            assert re.search(r"\d+(\.\d)? (s|min|h)|not measured", cost), f"{title}: rerun cost {cost!r}"
    plan = driver.execute_script("""
        const table = document.querySelector("table.dalign-plan");
        return table ? Array.from(table.querySelectorAll("tbody tr")).map((tr) => tr.innerText) : null;""")
    assert plan, f"{root} has no two-week plan (table.dalign-plan)"
    assert any("make notebooks PROFILE=lab" in row for row in plan), "the plan says what runs at lab in class"
    assert not any("ONLY=…" in row or "ONLY=..." in row for row in plan), "the plan's commands name their chapters"


def test_the_landing_page_opens_with_what_was_found(book_html, server, driver, reports):
    """Before the course path, the landing page counts the verdicts and shows the claims grid, its labels linked
    to the chapters."""
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    _open(driver, server + Path(toc["root"]).with_suffix(".html").as_posix(), "#dalign-claims-glance",
          "claims grid")
    found = driver.execute_script("""
        const grid = document.getElementById("dalign-claims-glance");
        const course = document.getElementById("course") || document.querySelector("table.dalign-course");
        if (!grid || !course) return {grid: !!grid, course: !!course};
        const position = grid.compareDocumentPosition(course);
        return {grid: true, course: true, before: !!(position & Node.DOCUMENT_POSITION_FOLLOWING),
                top: grid.getBoundingClientRect().top + window.scrollY,
                links: Array.from(grid.querySelectorAll("a.verdict")).map((a) => a.getAttribute("href")),
                counted: document.querySelector(".dalign-glance") ?
                    document.querySelector(".dalign-glance").innerText : ""};""")
    assert found["grid"], "the landing page has no claims grid (#dalign-claims-glance)"
    assert found["course"] and found["before"], "the claims grid comes after the course path; it should come first"
    assert re.search(r"width claims \(\d+ claim × scope checks?\)", found["counted"]), (
        f"the landing page does not count the width verdicts: {found['counted'][:200]!r}")
    assert found["links"] and all(re.fullmatch(r"chapters/\d\d_\w+\.html", href) for href in found["links"]), (
        f"the grid's labels should link to chapters/NN_name.html: {found['links'][:4]}")


def test_the_claims_page_opens_on_its_grid(book_html, server, driver, reports):
    """At 1280 x 900 the grid of claims starts on the first screen and is at most one screen tall."""
    page = next((p for p in reports if p.endswith("06_claims.html")), None)
    assert page, "no claims page (chapters/06_claims.html) in the book"
    _open(driver, server + page, "#dalign-claims-grid", "claims grid")
    _fit_window(driver, *WINDOW)
    try:
        box = driver.execute_script("""
            const grid = document.getElementById("dalign-claims-grid");
            if (!grid) return null;
            const r = grid.getBoundingClientRect();
            return {top: r.top + window.scrollY, height: r.height};""")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert box is not None, f"{page} has no claims grid (#dalign-claims-grid)"
    assert box["top"] < WINDOW[1] / 2, f"the grid starts {box['top']:.0f} px down: it should come first"
    assert box["height"] <= WINDOW[1], f"the grid is {box['height']:.0f} px tall: more than one {WINDOW[1]}-px screen"
