"""A small Sphinx extension that keeps the built pages clean in a browser.

sphinx-thebe adds its inline ``THEBE_JS_URL`` script twice to every page, which makes the
browser log "Identifier 'THEBE_JS_URL' has already been declared". Dropping duplicate
script entries (same file or same inline body) before the page is rendered removes the
console error.
"""

from __future__ import annotations


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen = set()
    unique = []
    for script in scripts:
        # Inline scripts are stored with filename None or "": the same script either way.
        filename = getattr(script, "filename", script) or ""
        key = (str(filename), tuple(sorted(getattr(script, "attributes", {}).items())))
        if key in seen:
            continue
        seen.add(key)
        unique.append(script)
    scripts[:] = unique


def setup(app):
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
