"""The ``course-status`` directive: a table of every notebook of the book and its last run.

``scripts/execute_notebooks.py`` stores, in each notebook's metadata under ``course``,
how long its last top-to-bottom run took, its kernel's peak memory and when. This directive
reads the notebooks the book builds and lists them, like the status page of the QuantEcon
lectures.
"""

from __future__ import annotations

import json
import pathlib

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _title(cells: list[dict]) -> str:
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "(untitled)"


class CourseStatus(SphinxDirective):
    has_content = False

    def run(self):
        rows = []
        for path in sorted(pathlib.Path(self.env.srcdir, "book").glob("*.ipynb")):
            docname = f"book/{path.stem}"
            if docname not in self.env.found_docs:
                continue
            self.env.note_dependency(str(path))
            notebook = json.loads(path.read_text())
            run = notebook.get("metadata", {}).get("course", {}).get("last_run", {})
            seconds, peak = run.get("seconds"), run.get("peak_memory_mib")
            number = str(int(path.name[:2])) if path.name[:2].isdigit() else "reference"
            rows.append((number, docname, _title(notebook["cells"]),
                         "not recorded" if seconds is None else f"{seconds:.1f}",
                         "not recorded" if peak is None else f"{peak:,}",
                         run.get("date", "not recorded"), run.get("python", "")))
        # The page is MyST markdown, so the table is written in MyST's list-table syntax.
        lines = ["```{list-table}", ":header-rows: 1", ":widths: 6 38 11 13 17 15", "",
                 "* - chapter", "  - notebook", "  - seconds", "  - peak memory (MiB)",
                 "  - last run (UTC)", "  - Python"]
        for number, docname, title, seconds, peak, date, python in rows:
            lines += [f"* - {number}", f"  - {{doc}}`{title} </{docname}>`",
                      f"  - {seconds}", f"  - {peak}", f"  - {date}", f"  - {python}"]
        lines.append("```")
        container = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("course-status", CourseStatus)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
