"""The book builds with warnings as errors, and a real headless Chromium renders it.

The build runs once per session (every notebook executed, as ``make book`` does) into the
repository's ``_build``; ``tests/book_build.py`` starts it in the background when collection
ends, and the tests that read it run last. The browser half opens the index page and a chapter
page over a local ``http.server`` on 127.0.0.1, waits for MathJax, and checks: typeset math is present and has no
TeX errors, the console has no JavaScript errors or exceptions, nothing (MathJax above all) is
fetched from a non-local host, and a screenshot is saved under ``_build/screenshots`` (its path
is printed). Every page of the table of contents is opened at 1280 and at 400 CSS pixels: each
figure keeps its own aspect ratio (within 5%), no page is wider than the window, and on a desktop
no code box, output or table reaches past the text column (a code box may scroll inside itself,
a table may not). Over the built HTML: figures are numbered one way, "Figure 9.2:", and no page
shows an internal path or "with uncommitted changes".

The build drops the notebooks' execution cache first (``_config.yml`` caches executions for
``make book``), so every notebook runs against the library as it is now.

Environment knobs, for working on the book:
* ``FLASHTUT_BOOK_TOC=path``: build with another table of contents (``jupyter-book --toc``);
* ``FLASHTUT_BOOK_REUSE=1``: skip the build and test the HTML already in ``_build/html``;
* ``FLASHTUT_CHROMIUM=path``: the browser binary (default: ``/usr/bin/chromium``, then PATH).
"""
from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


# --- building (tests/book_build.py starts it when collection ends; the tests that read it run
# last, the fixture `book` waits for it) ---

def _toc_files(toc: Path) -> list[str]:
    """Every document listed in a jb-book table of contents (root, parts, chapters, sections)."""
    import yaml

    data = yaml.safe_load(toc.read_text())
    files = [data["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                files.append(e["file"])
            walk(e.get("sections"))

    for part in data.get("parts", []):
        walk(part.get("chapters"))
    walk(data.get("chapters"))
    return [re.sub(r"\.(md|ipynb)$", "", f) for f in files]


def test_book_builds_with_warnings_as_errors(book):
    assert book.returncode == 0, f"jupyter-book build failed (log {book.log}):\n{book.tail()}"
    assert (HTML / "index.html").is_file()
    missing = [f for f in _toc_files(book.toc) if not (HTML / f"{f}.html").is_file()]
    assert not missing, f"pages listed in {book.toc.name} but not built: {missing}"


def test_site_root_has_a_favicon_drawn_from_the_svg(book):
    # the root index.html is a bare redirect: without /favicon.ico a browser logs a 404 there
    from PIL import Image

    icon = Image.open(HTML / "favicon.ico").convert("RGBA")
    assert icon.size == (32, 32)
    colours = {c for _, c in icon.getcolors(32 * 32)}
    assert (0x7A, 0x7A, 0x7A, 255) in colours and (0xE8, 0xA3, 0x3D, 255) in colours  # the SVG's two fills
    assert icon.getpixel((31, 0))[3] == 0                                              # transparent corner


def test_mathjax_is_bundled_not_fetched_from_a_cdn(book):
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book to inspect (log {book.log})")
    assert (HTML / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not bundled in _static"
    pages = sorted(HTML.rglob("*.html"))
    offenders = {}
    for page in pages:
        srcs = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", page.read_text(errors="replace"))
        remote = [s for s in srcs if "mathjax" in s.lower() and urlparse(s).scheme in ("http", "https", "")
                  and urlparse(s).netloc]
        if remote:
            offenders[str(page.relative_to(HTML))] = remote
    assert not offenders, f"pages load MathJax from the network: {offenders}"


def test_launch_buttons_use_the_configured_repository(book):
    from flashtut.colab import read_repository

    url, branch = read_repository(ROOT / "_config.yml")
    path = urlparse(url).path.strip("/")
    notebook_pages = [f for f in _toc_files(book.toc) if f.startswith("notebooks/")]
    if not notebook_pages:
        pytest.skip("the table of contents lists no notebooks/ chapter")
    html = (HTML / f"{notebook_pages[0]}.html").read_text(errors="replace")
    colab = f"https://colab.research.google.com/github/{path}/blob/{branch}/{notebook_pages[0]}.ipynb"
    assert colab in html, f"no Colab launch link {colab} on {notebook_pages[0]}.html"


# --- the browser ------------------------------------------------------------------------------

def _chromium() -> str | None:
    for candidate in (os.environ.get("FLASHTUT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def server(book):
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book to serve (log {book.log})")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(HTML)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@dataclass
class PageReport:
    url: str
    final_url: str = ""
    math: int = 0
    math_errors: int = 0
    errors: list = field(default_factory=list)
    remote_requests: list = field(default_factory=list)
    screenshot: Path | None = None
    layout: dict = field(default_factory=dict)
    fit: dict = field(default_factory=dict)
    fit_at: dict = field(default_factory=dict)


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page target's websocket."""

    def __init__(self, ws_url: str):
        import websocket  # websocket-client

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, timeout: float = 60, **params) -> dict:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"DevTools {method} failed: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"DevTools {method}: no answer in {timeout} s")

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        for ev in self.events[seen:]:
            if ev["method"] == method:
                return ev
        self.ws.settimeout(1.0)
        try:
            while time.monotonic() < deadline:
                try:
                    msg = json.loads(self.ws.recv())
                except Exception as exc:  # websocket timeout: keep polling until the deadline
                    if type(exc).__name__ == "WebSocketTimeoutException":
                        continue
                    raise
                if "method" in msg:
                    self.events.append(msg)
                    if msg["method"] == method:
                        return msg
        finally:
            self.ws.settimeout(60)
        raise TimeoutError(f"DevTools: no {method} event in {timeout} s")

    def evaluate(self, expression: str, timeout: float = 60):
        result = self.call("Runtime.evaluate", timeout=timeout, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        self.ws.close()


WAIT_FOR_MATHJAX = """
new Promise((resolve) => {
  const t0 = Date.now();
  (function poll() {
    const ready = document.readyState === "complete" && !/\\/index\\.html$|\\/$/.test(location.pathname);
    const mj = window.MathJax;
    // a page with no formula loads no MathJax: nothing to wait for
    const loads = document.querySelector('script[src*="mathjax" i]') !== null;
    if (ready && !loads) {
      resolve({url: location.href, math: 0, errors: 0});
    } else if (ready && mj && mj.startup && mj.startup.promise) {
      mj.startup.promise.then(() => resolve({
        url: location.href,
        math: document.querySelectorAll("mjx-container").length,
        errors: document.querySelectorAll("mjx-merror").length,
      }));
    } else if (Date.now() - t0 > 30000) {
      resolve({url: location.href, math: -1, errors: 0});
    } else {
      setTimeout(poll, 100);
    }
  })();
})
"""


@pytest.fixture(scope="session")
def browser(server, tmp_path_factory):
    pytest.importorskip("websocket", reason="websocket-client is not installed (it is in requirements-dev.txt)")
    exe = _chromium()
    if exe is None:
        pytest.skip("no headless browser found: install Debian's chromium (apt-get install chromium; "
                    ".ci/run does) or set FLASHTUT_CHROMIUM")
    profile = tmp_path_factory.mktemp("chromium-profile")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--no-default-browser-check", "--hide-scrollbars",
           f"--user-data-dir={profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
           "--window-size=1280,1600", "about:blank"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.poll() is not None else ""
            proc.kill()
            pytest.fail(f"chromium did not start its DevTools endpoint: {err}")
        time.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _evaluate_across_navigation(tools: DevTools, expression: str, timeout: float):
    """Evaluate in the page, retrying while a redirect (index.html -> the root page) replaces the
    document under the running script."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return tools.evaluate(expression, timeout=max(1.0, deadline - time.monotonic()))
        except RuntimeError as exc:
            if time.monotonic() > deadline or not re.search(r"context|navigat|destroyed", str(exc), re.I):
                raise
            time.sleep(0.2)


LAYOUT = r"""
(() => {
  const main = document.querySelector(".bd-content") || document.body;
  const scrollable = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if ((o === "auto" || o === "scroll") && p.clientWidth < el.scrollWidth + 1) return true;
    }
    return false;
  };
  const wide = [...main.querySelectorAll("table, pre")].filter(
    (el) => el.getBoundingClientRect().width > 0 && el.scrollWidth > (el.parentElement || el).clientWidth + 1);
  const imgs = [...main.querySelectorAll("div.cell_output img, figure img")];
  return {
    scrolling: wide.length,
    // the reader's own code cells: each line fits the column (chapters keep them within 80)
    inputs: wide.filter((el) => el.closest(".cell_input")).map((el) => (el.textContent || "").slice(0, 80)),
    clipped: wide.filter((el) => el.tagName === "TABLE" && !scrollable(el)).map((el) => el.outerHTML.slice(0, 120)),
    dimmed: imgs.filter((el) => getComputedStyle(el).filter !== "none").length,
    images: imgs.length,
    theme: document.documentElement.dataset.theme || "",
    height: Math.ceil(document.documentElement.scrollHeight),
    // a source listing (show_source / show_file: a highlighted block in a cell's output) whose own
    // box or any box around it up to the output has a light background or border: in the dark
    // theme that is a bright frame around dark code
    listing_frames: document.documentElement.dataset.theme !== "dark" ? [] :
      [...main.querySelectorAll("div.cell_output div.highlight")].filter((el) => {
        const light = (c) => {
          const m = c.match(/rgba?\(([\d.]+), ([\d.]+), ([\d.]+)(?:, ([\d.]+))?\)/);
          if (!m || (m[4] !== undefined && +m[4] < 0.1)) return false;
          return (0.2126 * m[1] + 0.7152 * m[2] + 0.0722 * m[3]) / 255 > 0.45;
        };
        for (let p = el; p; p = p.parentElement) {
          const cs = getComputedStyle(p);
          const border = ["Top", "Right", "Bottom", "Left"].some(
            (s) => parseFloat(cs[`border${s}Width`]) > 0 && light(cs[`border${s}Color`]));
          if (light(cs.backgroundColor) || border) return true;
          if (p.classList.contains("cell_output")) break;
        }
        return false;
      }).map((el) => (el.textContent || "").trim().slice(0, 60)),
  };
})()
"""


# What a reader sees of a page's geometry, once its images are decoded: each figure's rendered
# aspect ratio against its own, the page's width against the window's, and every box that reaches
# past the text column (a table that scrolls inside its container counts too: at 1280 px tables fit)
FIT = """
(async () => {
  const main = document.querySelector(".bd-content") || document.body;
  const column = (document.querySelector("article.bd-article") || main).getBoundingClientRect();
  const imgs = [...main.querySelectorAll("img")];
  await Promise.all(imgs.map((i) => i.complete ? null
    : new Promise((r) => { i.addEventListener("load", r); i.addEventListener("error", r); })));
  const figures = [];
  for (const img of imgs) {
    const r = img.getBoundingClientRect(), cs = getComputedStyle(img);
    const px = (...names) => names.reduce((a, n) => a + parseFloat(cs[n] || 0), 0);
    // the drawing itself: the box less its padding and border (the dark theme pads figures)
    const w = r.width - px("paddingLeft", "paddingRight", "borderLeftWidth", "borderRightWidth");
    const h = r.height - px("paddingTop", "paddingBottom", "borderTopWidth", "borderBottomWidth");
    if (!img.naturalWidth || !img.naturalHeight || w < 2 || h < 2) continue;  // folded away
    figures.push({src: img.getAttribute("src").split("/").pop(),
                  ratio: (w / h) / (img.naturalWidth / img.naturalHeight)});
  }
  const shown = (el) => el.getBoundingClientRect().width > 0;
  const name = (el) => `${el.tagName.toLowerCase()}: ${(el.textContent || "").trim().slice(0, 60)}`;
  const past = [...main.querySelectorAll("pre, table, div.highlight, div.cell_output, figure, img")]
    .filter((el) => shown(el) && el.getBoundingClientRect().right > column.right + 1).map(name);
  const tables = [...main.querySelectorAll("table")]
    .filter((el) => shown(el) && el.scrollWidth > el.parentElement.clientWidth + 1).map(name);
  return {figures, past, tables, page: document.documentElement.scrollWidth, window: window.innerWidth};
})()
"""


def _fit_problems(fit: dict, width: int):
    """What a reader would see wrong in a page's geometry (``FIT``): a figure whose rendered aspect
    ratio is off its own by more than 5%, a page wider than the window, and on a desktop a box
    that reaches past the text column or a table that scrolls sideways."""
    for f in fit["figures"]:
        if abs(f["ratio"] - 1) > 0.05:
            yield f"figure {f['src']} drawn at {f['ratio']:.2f} of its own aspect ratio"
    # against the width the page was opened at: on an emulated phone the layout viewport
    # (window.innerWidth) widens to a page that is too wide, so it cannot be the measure
    if fit["page"] > width + 1:
        yield f"the page is {fit['page']} px wide in a {width} px window"
    if width >= 1280:
        for box in fit["past"]:
            yield f"wider than the text column: {box}"
        for table in fit["tables"]:
            yield f"a table scrolls sideways: {table}"


def _open_page(port: int, url: str, shot_name: str, dark: bool = False, width: int = 1280,
               full_page: bool = False, more_widths: tuple = ()) -> PageReport:
    """Open ``url`` in a fresh tab, in the light or dark colour scheme (the book follows the
    reader's preference) and at ``width`` CSS pixels, and report on it. ``more_widths``: the same
    tab is then resized to each (a phone below 600 px) and its geometry measured again, with a
    screenshot each (``report.fit_at[width]``, ``shot_name`` with the width in place of
    ``{width}``): one load and one typesetting for every width."""
    with _new_target(port) as target:
        tools = DevTools(target["webSocketDebuggerUrl"])
        try:
            report = PageReport(url)
            for domain in ("Runtime", "Log", "Network", "Page"):
                tools.call(f"{domain}.enable")
            tools.call("Emulation.setEmulatedMedia",
                       features=[{"name": "prefers-color-scheme", "value": "dark" if dark else "light"}])
            tools.call("Emulation.setDeviceMetricsOverride", width=width, height=1600,
                       deviceScaleFactor=1, mobile=width < 600)
            tools.call("Page.navigate", url=url)
            state = _evaluate_across_navigation(tools, WAIT_FOR_MATHJAX, timeout=90)
            time.sleep(0.5)  # let late console messages arrive
            tools.call("Runtime.evaluate", expression="1")
            report.final_url, report.math, report.math_errors = state["url"], state["math"], state["errors"]
            for ev in tools.events:
                m, p = ev["method"], ev.get("params", {})
                if m == "Runtime.exceptionThrown":
                    d = p["exceptionDetails"]
                    report.errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
                elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                    report.errors.append(f"console.{p['type']}: {text}")
                elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                    e = p["entry"]
                    report.errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
                elif m == "Network.requestWillBeSent":
                    req_url = p["request"]["url"]
                    parsed = urlparse(req_url)
                    if parsed.scheme in ("http", "https", "ws", "wss") and parsed.hostname not in LOCAL_HOSTS:
                        report.remote_requests.append(req_url)
            report.layout = tools.evaluate(LAYOUT)
            report.fit = tools.evaluate(FIT, timeout=90)
            report.fit_at[width] = report.fit
            if full_page:                    # the whole page, for a reader's eye on every figure
                height = min(report.layout["height"], 30000)
                tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                           deviceScaleFactor=1, mobile=width < 600)
                time.sleep(0.5)
            report.screenshot = _screenshot(tools, shot_name.format(width=width))
            for other in more_widths:
                tools.call("Emulation.setDeviceMetricsOverride", width=other, height=1600,
                           deviceScaleFactor=1, mobile=other < 600)
                _reflowed(tools, other)
                report.fit_at[other] = tools.evaluate(FIT, timeout=90)
                _screenshot(tools, shot_name.format(width=other))
            return report
        finally:
            tools.close()


def _screenshot(tools: DevTools, name: str) -> Path:
    shot = tools.call("Page.captureScreenshot", format="png", timeout=120)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def _reflowed(tools: DevTools, width: int, timeout: float = 10.0) -> None:
    """Wait until the resized page lays out at ``width`` (its window reports it, two frames have
    been drawn since)."""
    deadline = time.monotonic() + timeout
    while tools.evaluate("window.innerWidth") != width:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page did not take the width {width}")
        time.sleep(0.05)
    tools.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


class _new_target:
    """A new browser tab as a context manager (closed on exit)."""

    def __init__(self, port: int):
        self.port = port

    def __enter__(self) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            self.target = json.loads(r.read())
        return self.target

    def __exit__(self, *exc):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/close/{self.target['id']}", timeout=10).close()
        except OSError:
            pass
        return False


def _chapter_page(book) -> str:
    """The first chapter under notebooks/ that has math, else the errata page (MyST notebook)."""
    for f in _toc_files(book.toc):
        page = HTML / f"{f}.html"
        if f.startswith("notebooks/") and page.is_file() and 'class="math' in page.read_text(errors="replace"):
            return f
    return "book/errata"


def _check(report: PageReport, emit):
    emit(f"\n[browser] {report.url} -> {report.final_url}: {report.math} typeset formulas; "
         f"screenshot: {report.screenshot}")
    assert report.math > 0, f"no typeset MathJax (mjx-container) on {report.final_url}: math={report.math}"
    assert report.math_errors == 0, f"{report.math_errors} formulas failed to typeset on {report.final_url}"
    assert not report.errors, f"JavaScript errors on {report.final_url}:\n" + "\n".join(report.errors)
    mathjax_remote = [u for u in report.remote_requests if "mathjax" in u.lower()]
    assert not mathjax_remote, f"MathJax fetched from the network: {mathjax_remote}"
    assert not report.remote_requests, f"the page fetched from non-local hosts: {report.remote_requests}"


def test_index_page_renders_in_chromium(browser, server, capsys_session_disabled):
    report = _open_page(browser, f"{server}/index.html", "index.png")
    _check(report, capsys_session_disabled)


def test_chapter_page_renders_in_chromium(browser, server, book, capsys_session_disabled):
    chapter = _chapter_page(book)
    report = _open_page(browser, f"{server}/{chapter}.html", chapter.replace("/", "_") + ".png")
    _check(report, capsys_session_disabled)


# chapters with the widest tables and the most figures, in both colour schemes, on a desktop
# and on a 400-pixel phone screen
SHOT_CHAPTERS = ["notebooks/01_memory_hierarchy", "notebooks/05_tiled_attention", "notebooks/07_triton",
                 "notebooks/09_results"]


@pytest.mark.parametrize("width", [1280, 400], ids=["desktop", "400px"])
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
@pytest.mark.parametrize("chapter", SHOT_CHAPTERS, ids=[c.split("/")[1][:2] for c in SHOT_CHAPTERS])
def test_chapters_read_in_both_themes_and_on_a_phone(browser, server, book, capsys_session_disabled,
                                                     chapter, dark, width):
    if not (HTML / f"{chapter}.html").is_file():
        pytest.fail(f"{chapter}.html was not built (log {book.log})")
    name = f"{chapter.split('/')[1][:2]}_{'dark' if dark else 'light'}_{width}.png"
    report = _open_page(browser, f"{server}/{chapter}.html", name, dark=dark, width=width, full_page=True)
    _check(report, capsys_session_disabled)
    lay = report.layout
    capsys_session_disabled(f"[layout] {name}: theme {lay['theme']}, {lay['images']} figures, "
                            f"{lay['scrolling']} boxes scroll sideways")
    assert lay["theme"] == ("dark" if dark else "light")
    assert not lay["clipped"], f"tables cut off with no way to scroll on {name}: {lay['clipped']}"
    if width >= 1280:
        assert not lay["inputs"], f"code cells that scroll sideways on {name}: {lay['inputs']}"
    assert lay["dimmed"] == 0, f"{lay['dimmed']} figures are dimmed by the theme's filter on {name}"
    for problem in _fit_problems(report.fit, width):
        pytest.fail(f"{name}: {problem}")
    if dark:
        frames = report.layout.get("listing_frames", [])
        assert not frames, f"source listings drawn with a light frame in the dark theme on {name}: {frames}"


# --- every page: what a reader sees of its geometry ------------------------------------------------

def test_every_page_keeps_its_figures_and_fits_the_window(browser, server, book, capsys_session_disabled):
    """Each page of the table of contents, light theme, on a desktop (1280 px) and a phone (400 px):
    every figure within 5% of its own aspect ratio, no page wider than the window, and on a desktop
    nothing past the text column. Each page loads once and is resized to the phone's width."""
    widths = (1280, 400)
    problems, figures, squashed = [], dict.fromkeys(widths, 0), dict.fromkeys(widths, 0)
    for page in _toc_files(book.toc):
        if not (HTML / f"{page}.html").is_file():
            continue                      # test_book_builds_with_warnings_as_errors names it
        name = f"all_{page.replace('/', '_')}_{{width}}.png"
        report = _open_page(browser, f"{server}/{page}.html", name, width=widths[0], more_widths=widths[1:])
        for width in widths:
            fit = report.fit_at[width]
            figures[width] += len(fit["figures"])
            squashed[width] += sum(abs(f["ratio"] - 1) > 0.05 for f in fit["figures"])
            problems += [f"{page} at {width} px: {p}" for p in _fit_problems(fit, width)]
    for width in widths:
        capsys_session_disabled(f"[fit] {width} px: {figures[width]} figures, {squashed[width]} off their aspect "
                                f"ratio by more than 5%")
    capsys_session_disabled(f"[fit] {len(problems)} problems")
    assert all(figures.values()), f"no figure measured on any page at some width: {figures}"
    assert not problems, "\n".join(problems)


def test_fit_problems_flags_what_a_reader_would_see():
    fine = {"figures": [{"src": "a.png", "ratio": 1.03}], "past": [], "tables": [], "page": 400, "window": 400}
    assert list(_fit_problems(fine, 400)) == [] and list(_fit_problems(fine, 1280)) == []
    squashed = dict(fine, figures=[{"src": "a.png", "ratio": 0.54}])
    assert "a.png drawn at 0.54" in next(_fit_problems(squashed, 1280))
    assert "2072 px wide in a 400 px window" in next(_fit_problems(dict(fine, page=2072, window=2072), 400))
    wide = dict(fine, past=["pre: python -m flashtut.bench run"], tables=["table: x"])
    assert len(list(_fit_problems(wide, 1280))) == 2
    assert list(_fit_problems(wide, 400)) == []       # on a phone a box may scroll inside itself


# --- the built HTML: one caption scheme, no internal paths --------------------------------------

_CHAPTER_HTML = re.compile(r"notebooks/(\d{2})_[^/]+\.html$")


def _pages(book) -> list[tuple[Path, str]]:
    """(path, text) of every built page but the theme's and the sources'."""
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book to inspect (log {book.log})")
    return [(p, p.read_text(errors="replace")) for p in sorted(HTML.rglob("*.html"))
            if "_static" not in p.parts and "_sources" not in p.parts]


def test_figures_are_numbered_one_way(book):
    wrong = []
    for page, text in _pages(book):
        numbers = [html_unescape(n).strip() for n in re.findall(r'<span class="caption-number">(.*?)</span>', text)]
        m = _CHAPTER_HTML.search(page.as_posix())
        if m:
            want = [f"Figure {int(m.group(1))}.{i}:" for i in range(1, len(numbers) + 1)]
            if numbers != want:
                wrong.append(f"{page.relative_to(HTML)}: {numbers} (want {want})")
        elif any(not re.fullmatch(r"Figure \d+(\.\d+)?:", n) for n in numbers):
            wrong.append(f"{page.relative_to(HTML)}: {numbers}")
        if re.search(r"<strong>Figure\.</strong>|\bFig\. \d", text):
            wrong.append(f"{page.relative_to(HTML)}: an unnumbered 'Figure.' or a 'Fig. N' caption")
    assert not wrong, "\n".join(wrong)


def test_no_page_shows_an_internal_path_or_a_dirty_tree(book):
    found = []
    for page, text in _pages(book):
        for m in re.finditer(r"/root/out\b|/tmp/tmp\w*|with uncommitted changes", text):
            found.append(f"{page.relative_to(HTML)}: ...{text[max(0, m.start() - 60):m.end() + 20]}...")
    assert not found, "\n".join(found[:40]) + (f"\n... {len(found)} in all" if len(found) > 40 else "")


def html_unescape(text: str) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", text))


def test_figure_numbers_restart_in_each_chapter():
    import importlib.util

    spec = importlib.util.spec_from_file_location("page_fixes", ROOT / "book" / "_ext" / "page_fixes.py")
    page_fixes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page_fixes)
    numbers = {"notebooks/09_results": {"figure": {"fig-b": (23,), "fig-a": (22,)}},
               "notebooks/11_hopper": {"figure": {"x": (40,)}},
               "book/api": {"figure": {"y": (5,)}},
               "book/preface": {}}
    page_fixes.number_figures_by_chapter(numbers)
    assert numbers["notebooks/09_results"]["figure"] == {"fig-a": (9, 1), "fig-b": (9, 2)}
    assert numbers["notebooks/11_hopper"]["figure"] == {"x": (11, 1)}
    assert numbers["book/api"]["figure"] == {"y": (5,)} and numbers["book/preface"] == {}


# --- how the book is built ----------------------------------------------------------------------

def test_executions_are_cached_and_the_theme_is_pinned():
    import yaml
    from importlib import metadata

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "cache"
    assert config["execute"]["allow_errors"] is False                 # an erroring notebook fails the build
    assert config["sphinx"]["config"]["nb_execution_raise_on_error"] is True
    assert config["sphinx"]["config"]["numfig_format"]["figure"] == "Figure %s:"
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "requirements-dev.txt").read_text(), re.M))
    for package in ("jupyter-book", "sphinx-book-theme", "pydata-sphinx-theme"):
        assert package in pins, f"requirements-dev.txt does not pin {package}"
        try:
            installed = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
        assert installed == pins[package], f"{package}: {installed} installed, {pins[package]} pinned"
    # make book drops the cache when the library changed; the book test above never uses one
    assert "find src -newer $(NB_CACHE)/global.db" in (ROOT / "Makefile").read_text()
