"""Sphinx extension with two small fix-ups of the pages Jupyter Book generates.

1. Repeated inline <script> bodies are dropped. sphinx-thebe registers its configuration script
   (``const THEBE_JS_URL = ...``) on every ``env-before-read-docs`` event, which Jupyter Book's
   build emits more than once, so each page declared the same ``const`` twice: a SyntaxError in
   the browser console on every page. Sphinx already de-duplicates scripts loaded from files.
2. The Colab launch button is removed from pages written as MyST markdown notebooks (the errata,
   how to run): the theme links Colab to the ``.md`` file, which Colab cannot open. The chapters
   in ``notebooks/`` are ``.ipynb`` and keep their button.
"""
from pathlib import Path


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


def setup(app):
    app.connect("html-page-context", _unique_inline_scripts, priority=900)
    # after sphinx-book-theme adds its launch buttons (priority 501)
    app.connect("html-page-context", _no_colab_for_text_notebooks, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
