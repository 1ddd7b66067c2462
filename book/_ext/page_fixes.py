"""Sphinx extension with five small fix-ups of the pages Jupyter Book generates and how it runs them.

1. Repeated inline <script> bodies are dropped. sphinx-thebe registers its configuration script
   (``const THEBE_JS_URL = ...``) on every ``env-before-read-docs`` event, which Jupyter Book's
   build emits more than once, so each page declared the same ``const`` twice: a SyntaxError in
   the browser console on every page. Sphinx already de-duplicates scripts loaded from files.
2. The Colab launch button is removed from pages written as MyST markdown notebooks (the errata,
   how to run): the theme links Colab to the ``.md`` file, which Colab cannot open. The chapters
   in ``notebooks/`` are ``.ipynb`` and keep their button.
3. The site root gets a ``favicon.ico``, drawn from the book's own ``favicon.svg``. The root
   ``index.html`` that Jupyter Book writes is a bare redirect without an icon link, so a browser
   that opens it asks the server for ``/favicon.ico``, and depending on how fast the redirect
   happens logs a 404 in the console (the browser test saw it once in four runs).
4. The kernels that execute the notebooks talk to the build over encrypted sockets. jupyter_client
   starts them over TCP without encryption unless its ``KernelManager.transport_encryption`` is
   set, and ipykernel then logs ``Kernel is running over TCP without encryption`` once per
   notebook: a dozen warnings in every clean build. The installed kernel spec declares CurveZMQ
   support, so "auto" gives each kernel its own keys; nothing in the build passes traitlets
   configuration down to the kernel manager, so the extension sets the default.
5. Figures are numbered by chapter, "Figure 9.2:", the scheme of the captions written by hand in
   chapters 1 to 3. Sphinx numbers the captioned figures of a book without numbered sections
   through the whole book ("Fig. 22"); after it has, each chapter page (``notebooks/NN_*``)
   numbers its own figures from 1 in their order on the page, with the chapter in front
   (``numfig_format`` in ``_config.yml`` writes "Figure %s:").
"""
import re
from pathlib import Path

_CHAPTER_PAGE = re.compile(r"(?:^|/)(\d{2})_[^/]+$")
_SVG_TOKEN = re.compile(r'<g fill="(#[0-9a-fA-F]{6})"|<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" '
                        r'height="([\d.]+)"')


def _unique_inline_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        inline = not getattr(script, "filename", None)
        body = getattr(script, "attributes", {}).get("body") if inline else None
        if body is not None:
            if body in seen:
                continue
            seen.add(body)
        kept.append(script)
    context["script_files"] = kept


def _no_colab_for_text_notebooks(app, pagename, templatename, context, doctree):
    if pagename not in app.env.all_docs or Path(app.env.doc2path(pagename)).suffix == ".ipynb":
        return
    groups = context.get("header_buttons") or []
    for group in groups:
        if group.get("label") == "launch-buttons":
            group["buttons"] = [b for b in group.get("buttons", []) if b.get("text") != "Colab"]
    context["header_buttons"] = [g for g in groups
                                 if not (g.get("label") == "launch-buttons" and not g.get("buttons"))]


def favicon_ico(svg_text: str, path: Path, size: int = 32) -> None:
    """Rasterise the tiles of ``favicon.svg`` (rectangles in coloured groups, a 32 x 32 view box)
    into an ICO file; the SVG stays the one drawing of the icon."""
    from PIL import Image, ImageDraw

    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    fill, k = None, size / 32
    for m in _SVG_TOKEN.finditer(svg_text):
        if m.group(1):
            fill = m.group(1)
        elif fill:
            x, y, w, h = (float(g) * k for g in m.groups()[1:])
            draw.rounded_rectangle((x, y, x + w - 1, y + h - 1), radius=k, fill=fill)
    image.save(path, format="ICO", sizes=[(size, size)])


def _root_favicon(app, exception):
    favicon = getattr(app.config, "html_favicon", None)
    if exception or app.builder.format != "html" or not favicon or "://" in str(favicon):
        return
    svg = Path(app.srcdir, favicon)
    if svg.suffix == ".svg" and svg.is_file():
        favicon_ico(svg.read_text(), Path(app.outdir, "favicon.ico"))


def number_figures_by_chapter(fignumbers: dict) -> dict:
    """Sphinx's figure numbers (``env.toc_fignumbers``: docname -> {"figure": {id: (n,)}}) with
    every chapter page's figures renumbered ``(chapter, 1)``, ``(chapter, 2)``, ... in their order;
    pages that are not chapters keep theirs. Returns the same dict, changed in place."""
    for docname, numbers in fignumbers.items():
        m = _CHAPTER_PAGE.search(docname)
        figures = numbers.get("figure")
        if m and figures:
            chapter = int(m.group(1))
            order = sorted(figures, key=lambda fid: figures[fid])
            numbers["figure"] = {fid: (chapter, i) for i, fid in enumerate(order, 1)}
    return fignumbers


def _chapter_figure_numbers(app, env):
    # after the toctree collector (priority 500) has assigned the book-wide numbers
    before = {d: dict(n.get("figure", {})) for d, n in env.toc_fignumbers.items()}
    number_figures_by_chapter(env.toc_fignumbers)
    return [d for d, n in env.toc_fignumbers.items() if n.get("figure", {}) != before.get(d)]


def _encrypted_kernel_transport():
    try:
        import zmq
        from jupyter_client.manager import KernelManager
    except ImportError:        # no execution toolchain: nothing to configure
        return
    trait = KernelManager.class_traits().get("transport_encryption")
    if trait is not None and zmq.has("curve"):
        trait.default_value = "auto"


def setup(app):
    _encrypted_kernel_transport()
    app.connect("html-page-context", _unique_inline_scripts, priority=900)
    # after sphinx-book-theme adds its launch buttons (priority 501)
    app.connect("html-page-context", _no_colab_for_text_notebooks, priority=600)
    app.connect("build-finished", _root_favicon)
    app.connect("env-get-updated", _chapter_figure_numbers, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
