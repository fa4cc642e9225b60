"""The whole book builds as one PDF (scripts/build_pdf.sh), and the PDF is complete.

The build runs once per test run into a temporary folder, the way scripts/build_pdf.sh runs it
(Jupyter Book's LaTeX builder with xelatex), after the site tests' HTML build in the same
folder, whose parsed sources it reuses (tests/shared_build.py). The checks read the PDF's text
with pdftotext and the LaTeX log: every chapter is there with its title, no cross-reference
is left unresolved ("??"), no character is missing from the fonts, no line runs off the page,
and the exercises' solutions are printed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from book_toc import ROOT, toc_entries
from shared_build import pdf_build, shared_folder

PDF_NAME = "attention-step-by-step"


@pytest.fixture(scope="module")
def pdf(tmp_path_factory, worker_id):
    """Build the PDF once per test run; return (text of the PDF, LaTeX log, number of pages)."""
    for tool in ("xelatex", "latexmk", "pdftotext", "pdfinfo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: scripts/test.sh installs TeX Live and poppler")
    latex, build_log, returncode = pdf_build(shared_folder(tmp_path_factory, worker_id))
    path = latex / f"{PDF_NAME}.pdf"
    assert returncode == 0 and path.exists(), build_log[-5000:]
    text = subprocess.run(["pdftotext", "-layout", str(path), "-"], capture_output=True,
                          text=True, check=True).stdout
    info = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True,
                          check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    log = (latex / f"{PDF_NAME}.log").read_text(encoding="utf-8", errors="replace")
    return text, log, pages


def chapter_titles() -> list[str]:
    """The first heading of every chapter notebook, in book order."""
    titles = []
    for name in toc_entries():
        path = ROOT / f"{name}.ipynb"
        if path.exists() and path.name[:2].isdigit():
            first = "".join(json.loads(path.read_text())["cells"][0]["source"])
            titles.append(re.match(r"#\s+(.+)", first).group(1).strip())
    return titles


def squeeze(text: str) -> str:
    """Whitespace runs as one space, and LaTeX's typographic quotes as straight ones (a
    title's "today's" is set as "today’s")."""
    text = text.translate(str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"',
                                         "\u201d": '"'}))
    return re.sub(r"\s+", " ", text)


def test_pdf_has_a_plausible_number_of_pages(pdf):
    _, _, pages = pdf
    assert 300 <= pages <= 900, pages


def test_every_chapter_title_is_in_the_pdf(pdf):
    text, _, _ = pdf
    flat = squeeze(text).lower()
    missing = [title for title in chapter_titles() if squeeze(title).lower() not in flat]
    assert not missing, f"chapters missing from the PDF: {missing}"


def test_no_unresolved_reference_in_the_pdf(pdf):
    text, _, _ = pdf
    lines = [line.strip() for line in text.splitlines() if "??" in line]
    assert not lines, f"unresolved references: {lines[:5]}"


def test_no_character_is_missing_from_the_fonts(pdf):
    _, log, _ = pdf
    missing = sorted(set(re.findall(r"Missing character: There is no (.+?) in font", log)))
    assert not missing, f"characters the PDF's fonts lack: {missing}"


def test_no_line_runs_off_the_page(pdf):
    # An overfull box of a few points is invisible; one of more than 10pt is cut text.
    _, log, _ = pdf
    overfull = [float(width) for width in
                re.findall(r"Overfull \\hbox \((\d+(?:\.\d+)?)pt too wide\)", log)]
    assert not [width for width in overfull if width > 10], sorted(overfull)[-5:]


def test_exercise_solutions_are_printed(pdf):
    text, _, _ = pdf
    exercises = sum(len(re.findall(r"\{exercise\}", "".join(
        "".join(cell["source"]) for cell in json.loads(
            (ROOT / f"{name}.ipynb").read_text())["cells"])))
        for name in toc_entries() if (ROOT / f"{name}.ipynb").exists())
    solutions = len(re.findall(r"Solution to Exercise", text))
    assert exercises >= 3 and solutions >= exercises, (exercises, solutions)


def test_intro_links_the_pdf_that_the_deploy_workflow_publishes():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    org, repo = config["repository"]["url"].rstrip("/").split("/")[-2:]
    url = f"https://{org}.github.io/{repo}/{PDF_NAME}.pdf"
    assert url in (ROOT / "book" / "intro.md").read_text(), f"intro does not link {url}"
    workflow = (ROOT / ".github" / "workflows" / "deploy.yml").read_text()
    assert "scripts/build_pdf.sh" in workflow
    assert f"_build/latex/{PDF_NAME}.pdf _build/html/" in workflow
