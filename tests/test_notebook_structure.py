"""Every chapter notebook has the shape the course promises its readers.

The set-up cell installs the course package from the repository named in _config.yml; each
chapter states its learning goals, ends with exercises whose solutions exist, was run top to
bottom in one fresh kernel, gives every figure alt text, and uses no global random state.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from book_toc import ROOT, toc_entries

NOTEBOOKS = [name for name in toc_entries() if (ROOT / f"{name}.ipynb").exists()]


def load(name: str) -> list[dict]:
    return json.loads((ROOT / f"{name}.ipynb").read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def code_cells(cells: list[dict]) -> list[dict]:
    return [c for c in cells if c["cell_type"] == "code" and source(c).strip()]


def markdown(cells: list[dict]) -> str:
    return "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")


def test_the_chapters_are_numbered_01_to_n_in_toc_order_with_no_gap():
    # Also guards the parametrized tests below against running on nothing.
    chapters = [name for name in NOTEBOOKS if re.fullmatch(r"book/\d\d_\w+", name)]
    numbers = [int(name[len("book/"):][:2]) for name in chapters]
    assert numbers == list(range(1, len(numbers) + 1)), chapters
    assert len(numbers) > 1


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_setup_cell_installs_the_course_from_the_configured_repository(name):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repository = config["repository"]
    expected = f"git+{repository['url']}@{repository['branch']}"
    setup = source(code_cells(load(name))[0])
    assert 'find_spec("attention_lib") is None' in setup, "first code cell is not the set-up cell"
    assert expected in setup, f"set-up cell does not install from {expected}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_site_hides_the_install_cell_and_says_how_to_run_the_page(name):
    # The install lines matter on Colab only; on the site they would open every chapter
    # with a wide block of code. The notebook keeps them, the site drops them
    # (tag remove-cell), and the title cell says in one line how to run the page.
    cells = load(name)
    install = code_cells(cells)[0]
    assert "remove-cell" in install["metadata"].get("tags", []), "install cell is shown on the site"
    assert "import " in source(code_cells(cells)[1]), "the imports should follow, visible"
    assert "Run this page yourself" in source(cells[0])


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_setup_cell_prints_nothing_where_the_course_is_installed(name):
    assert code_cells(load(name))[0]["outputs"] == []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_chapter_states_learning_goals_and_what_comes_next(name):
    text = markdown(load(name))
    assert re.search(r"^## What you will learn", text, re.M)
    assert re.search(r"^## Summary", text, re.M)
    assert re.search(r"^## What's next", text, re.M)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_chapter_has_at_least_three_exercises_each_with_a_solution(name):
    text = markdown(load(name))
    labels = re.findall(r"\{exercise\}[^\n]*\n:label:\s*(\S+)", text)
    solutions = set(re.findall(r"\{solution-start\}\s+(\S+)", text))
    assert len(labels) >= 3, f"{len(labels)} exercises"
    assert set(labels) <= solutions, f"exercises without a solution: {set(labels) - solutions}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_was_run_top_to_bottom_in_one_kernel(name):
    counts = [c.get("execution_count") for c in code_cells(load(name))]
    assert counts == list(range(1, len(counts) + 1)), counts[:10]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_was_executed_by_the_project_script(name):
    # scripts/execute_notebooks.py runs a notebook the way CI re-runs it and records the run;
    # a notebook saved from an editor's kernel would carry that kernel's state instead.
    notebook = json.loads((ROOT / f"{name}.ipynb").read_text())
    last_run = notebook["metadata"].get("course", {}).get("last_run", {})
    assert {"seconds", "date", "python"} <= set(last_run), "run scripts/execute_notebooks.py"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_figure_has_alt_text_or_a_caption(name):
    missing = []
    for index, cell in enumerate(load(name)):
        outputs = cell.get("outputs", [])
        has_figure = any("image/png" in output.get("data", {}) for output in outputs)
        meta = cell.get("metadata", {}).get("mystnb", {})
        described = meta.get("image", {}).get("alt") or meta.get("figure", {}).get("caption")
        if has_figure and not described:
            missing.append(index)
    assert not missing, f"figures without alt text in cells {missing}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_global_random_state(name):
    offenders = [source(c) for c in code_cells(load(name))
                 if re.search(r"np\.random\.(seed|rand|randn|randint|normal|uniform|choice)\(",
                              source(c))]
    assert not offenders, "use rng = np.random.default_rng(SEED) instead of the global RNG"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_solution_checks_itself_in_code(name):
    cells, unchecked, current = load(name), [], None
    for cell in cells:
        text = source(cell)
        start = re.search(r"\{solution-start\}\s+(\S+)", text)
        if cell["cell_type"] == "markdown" and start:
            current, checked = start.group(1), False
        elif cell["cell_type"] == "markdown" and "{solution-end}" in text and current:
            if not checked:
                unchecked.append(current)
            current = None
        elif cell["cell_type"] == "code" and current:
            checked = checked or bool(re.search(r"\bassert\b|assert_allclose|assert_array_equal",
                                                text))
    assert not unchecked, f"solutions with no checking code cell: {unchecked}"


def test_every_test_named_on_the_common_bugs_page_exists():
    import html as html_lib

    text = html_lib.unescape(re.sub(r"<[^>]+>", "", markdown(load("book/common_bugs"))))
    # The overview lists each bug's tests as "in `test_file.py`:" then one `test_name` a line.
    named = {(module, name)
             for module, names in re.findall(r"in `(test_\w+)\.py`:((?:\\?\s*`test_\w+`,?)+)", text)
             for name in re.findall(r"`(test_\w+)`", names)}
    named.discard(("test_attention", "test_x"))  # the page's example of the notation
    assert named, "the overview's pattern matched nothing"
    missing = [f"{module}.py::{name}" for module, name in sorted(named)
               if not re.search(rf"^def {name}\(", (ROOT / "tests" / f"{module}.py").read_text(),
                                re.M)]
    # Tests the prose names without their file exist in some test module.
    every_test = "\n".join(path.read_text() for path in (ROOT / "tests").glob("test_*.py"))
    in_prose = set(re.findall(r"`(test_\w+)`", text)) - {name for _, name in named} - {"test_x"}
    missing += [name for name in sorted(in_prose)
                if not re.search(rf"^def {name}\(", every_test, re.M)]
    assert not missing, f"the page names tests that do not exist: {missing}"


# One numbering. The book numbers its chapters and sections itself (numbered: true in
# _toc.yml, and every section of the PDF), so a heading that carries its own number shows two:
# "17.2. 1. Byte-level BPE from scratch". Numbered lists in prose are fine; headings are not.
MD_PAGES = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "book").rglob("*.md")
                  if "_build" not in path.parts and ".ipynb_checkpoints" not in path.parts)

# A heading's own number: "1.", "2)", "3:", "1.2", "(4)", "IV.", "b)", or a numbering word
# with a number, "Part 1:", "Chapter 2", "Section IV", "Step 3", "§ 5". Leading emphasis or a
# link bracket is looked through ("## **1.** Foo", "## [2. Foo](x.md)").
_NUMBERED = re.compile(
    r"""^[*_\[\s]*(
        \(?\d+(\.\d+)*[.):]?[*_\]]*(\s|$)     # 1.  2)  3:  1.2  (4)  or a bare number
      | \(?[IVXLC]+[.):][*_\]]*(\s|$)         # IV.  ii.  (I. too, never "I prefer")
      | \(?[A-Za-z][.)][*_\]]*(\s|$)          # a)  B.
      | (part|chapters?|section|step|lesson|unit|appendix)\s+(\d+|[IVXLC]+)\b
      | §
    )""",
    re.IGNORECASE | re.VERBOSE,
)
# Fenced blocks whose body is code, not markdown (a {exercise} or {note} body is markdown).
_CODE_FENCE_INFO = re.compile(r"^$|^[\w+-]+$|^\{(code|code-block|code-cell|eval-rst|math|"
                              r"literalinclude|raw)\}")


def numbered_headings(text: str) -> list[str]:
    """The markdown headings of `text` (ATX "## ..." and setext underlined) that start with a
    hand-written number; code blocks are skipped."""
    found, fence, previous = [], None, ""
    for line in text.splitlines():
        opening = re.match(r"^ {0,3}(`{3,}|~{3,})\s*(.*)$", line)
        if fence:
            if re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", line):
                fence = None
            previous = ""
            continue
        if opening and _CODE_FENCE_INFO.match(opening.group(2).strip()):
            fence, previous = opening.group(1), ""
            continue
        atx = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        setext = (re.match(r"^ {0,3}(=+|-+)\s*$", line) and previous.strip()
                  and not re.match(r"^ {0,3}([-*+]|\d+[.)])\s", previous)  # not a list item
                  and not previous.lstrip().startswith((":::", "```", "|", ">")))
        heading = atx.group(1) if atx else previous.strip() if setext else None
        if heading is not None and _NUMBERED.match(heading):
            found.append(heading)
        previous = "" if atx or setext else line
    return found


@pytest.mark.parametrize(("heading", "numbered"), [
    ("1. Byte-level BPE from scratch", True), ("2) Chat", True), ("3: Long context", True),
    ("4.2 Sub-section", True), ("(5) Five", True), ("IV. Four", True), ("b) Second", True),
    ("Part 1: the attention operation", True), ("Chapter 2 softmax", True),
    ("Section IV", True), ("step 3", True), ("**6.** Heads", True), ("[7. Link](x.md)", True),
    ("Byte-level BPE from scratch", False), ("What you will learn", False),
    ("I prefer apple", False), ("$-\\infty$ or a large negative number?", False),
    ("16-bit floats", False), ("A common mistake: `np.dot`", False),
    ("RMSNorm", False), ("Why divide by $\\sqrt{d_k}$?", False),
])
def test_the_numbered_heading_detector_sees_numbers_and_only_numbers(heading, numbered):
    assert bool(numbered_headings(f"## {heading}\n")) is numbered
    if not re.match(r"\d+[.)]\s", heading):  # "1. Foo" over "---" is a list item and a rule
        assert bool(numbered_headings(f"{heading}\n---\n")) is numbered  # setext form


def test_the_numbered_heading_detector_skips_code_and_reads_directive_bodies():
    text = ("```python\n# 1. a comment in code\n```\n"
            ":::{exercise}\n## 2. a heading inside an exercise\n:::\n"
            "1. a numbered list item\n---\n")
    assert numbered_headings(text) == ["2. a heading inside an exercise"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_headings_carry_no_hand_written_numbers(name):
    offenders = [f"cell {index}: {heading!r}"
                 for index, cell in enumerate(load(name)) if cell["cell_type"] == "markdown"
                 for heading in numbered_headings(source(cell))]
    assert not offenders, (f"{name}.ipynb: headings numbered by hand, under the book's own "
                           f"numbering: {offenders}")


@pytest.mark.parametrize("page", MD_PAGES)
def test_page_headings_carry_no_hand_written_numbers(page):
    offenders = numbered_headings((ROOT / page).read_text())
    assert not offenders, (f"{page}: headings numbered by hand, under the book's own "
                           f"numbering: {offenders}")


def test_the_heading_tests_see_every_page():
    # Guards the two tests above against running on nothing.
    assert len(NOTEBOOKS) > 17 and "book/intro.md" in MD_PAGES and "book/api.md" in MD_PAGES


def test_toc_part_captions_carry_no_hand_written_numbers():
    # The PDF turns each caption of _toc.yml into a LaTeX \part, which prints its own
    # "Part I" above the caption: "Part I: the attention operation" would read twice.
    captions = re.findall(r"^\s*-?\s*caption:\s*[\"']?(.*?)[\"']?\s*$",
                          (ROOT / "_toc.yml").read_text(), re.M)
    assert captions, "no part captions found in _toc.yml"
    numbered = [caption for caption in captions if numbered_headings(f"# {caption}\n")]
    assert not numbered, f"_toc.yml: part captions numbered by hand: {numbered}"
