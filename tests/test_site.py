"""The book builds with zero warnings, and every built page works in a real browser.

The build runs once per test run into a temporary folder (`--all -W -n --keep-going`, as in
scripts/build_book.sh; tests/shared_build.py shares it between the test processes). Each page
is then opened once in Debian's Chromium, driven by Playwright, from a server on 127.0.0.1; the
page fails on a console error, an uncaught exception, a failed request or any request to
another host, a broken image, a link to a page or anchor that does not exist, math that did not
typeset or that a screen reader cannot read, a keyboard focus that cannot be seen (in both
colour modes), or any serious or critical accessibility violation found by axe-core in the
light and the dark mode at desktop and at phone width (the mode is switched with the theme's
own button and the window resized on the same load: one typesetting of the math per page).
"""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
import re
import threading
import urllib.parse

import pytest
import yaml
from book_toc import ROOT as BOOK_ROOT
from book_toc import toc_entries
from bs4 import BeautifulSoup
from shared_build import html_build, shared_folder

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# axe-core, from the npm registry (tests/browser/package-lock.json pins it; scripts/test.sh runs
# npm ci). It is injected into each page by the test: the pages themselves fetch nothing.
AXE = ROOT / "tests" / "browser" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
]


@pytest.fixture(scope="module")
def build(tmp_path_factory, worker_id):
    """The whole book, built once per test run; (html folder, build log, exit code)."""
    return html_build(shared_folder(tmp_path_factory, worker_id))


def test_book_builds_with_zero_warnings(build):
    html, log, returncode = build
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert returncode == 0 and not warnings, "\n".join(warnings) or log[-3000:]
    assert (html / "index.html").exists()


def built_pages(html: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(html)) for p in html.rglob("*.html")
                  if "_static" not in p.parts and "mathjax" not in p.parts)


def test_every_toc_page_was_built(build):
    html, _, _ = build
    missing = [name for name in toc_entries() if not (html / f"{name}.html").exists()]
    assert not missing, f"pages in _toc.yml with no HTML: {missing}"


@functools.cache
def anchors_of(path: pathlib.Path) -> frozenset[str]:
    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    return frozenset(tag["id"] for tag in soup.find_all(id=True)) | frozenset(
        tag["name"] for tag in soup.find_all("a", attrs={"name": True}))


@pytest.fixture(scope="module")
def site(build):
    """Serve the built site on 127.0.0.1 and yield its base URL."""
    html, _, returncode = build
    if not (html / "index.html").exists():
        pytest.fail(f"the book did not build (exit {returncode}): "
                    "see test_book_builds_with_zero_warnings")
    handler = functools.partial(QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield html, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    if not pathlib.Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/test.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_page(browser, base: str, page_path: str, mode: str, problems: list[str],
              viewport: dict = DESKTOP):
    """A new browser context in `mode` whose console errors, failed requests and requests to
    another host are appended to `problems`; returns (context, page, url) after the load."""
    context = browser.new_context(viewport=viewport)
    # The theme reads its light/dark mode from localStorage; a fresh profile logs an error.
    context.add_init_script(f"localStorage.setItem('mode', '{mode}');"
                            f"localStorage.setItem('theme', '{mode}');")
    host = urllib.parse.urlparse(base).netloc

    def guard(route):
        if urllib.parse.urlparse(route.request.url).netloc == host:
            route.continue_()
        else:
            problems.append(f"request to another host: {route.request.url}")
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    page.on("console", lambda msg: msg.type == "error" and problems.append(
        f"console error: {msg.text}"))
    page.on("pageerror", lambda error: problems.append(f"uncaught exception: {error}"))
    page.on("requestfailed", lambda request: urllib.parse.urlparse(request.url).netloc == host
            and problems.append(f"failed request: {request.url} ({request.failure})"))
    page.on("response", lambda response: response.status >= 400 and problems.append(
        f"HTTP {response.status}: {response.url}"))
    url = urllib.parse.urljoin(base, page_path)
    page.goto(url, wait_until="load")
    return context, page, url


def content_problems(page, html: pathlib.Path, url: str) -> list[str]:
    """What does not depend on the colour mode or the width: images, math, links."""
    host = urllib.parse.urlparse(url).netloc
    problems = []
    images = page.eval_on_selector_all(
        "img", "imgs => imgs.map(i => [i.currentSrc || i.src, i.complete && i.naturalWidth > 0])")
    problems += [f"broken image: {src}" for src, ok in images if not ok]

    math_count = page.locator(".math").count()
    if math_count:
        try:
            page.wait_for_function(
                "n => document.querySelectorAll('mjx-container').length >= n",
                arg=math_count, timeout=15000)
        except Exception:
            typeset = page.locator("mjx-container").count()
            problems.append(f"math not typeset: {typeset} of {math_count} formulas rendered")
        errors = page.locator("mjx-merror").count()
        if errors:
            problems.append(f"{errors} formulas have TeX errors")
        # MathJax's assistive MathML is what a screen reader reads out.
        readable = page.locator("mjx-container mjx-assistive-mml").count()
        if readable < page.locator("mjx-container").count():
            problems.append(f"math without assistive MathML: {readable} of "
                            f"{page.locator('mjx-container').count()} formulas")

    hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    for href in hrefs:
        problems += check_link(html, url, href, host)
    return problems


def switch_mode(page, mode: str) -> list[str]:
    """Switch the colour mode the way a reader does, with the theme's own button (it cycles
    light, auto, dark), and wait for the new layout."""
    for _ in range(3):
        if page.evaluate("() => document.documentElement.dataset.theme") == mode:
            break
        # The button sits in the header; at phone width it may be folded away, so click it
        # from script (the same handler runs).
        if not page.evaluate("() => { const button = document.querySelector("
                             "'.theme-switch-button'); button?.click(); return !!button; }"):
            return ["no theme switch button on the page"]
    else:
        return [f"the theme switch did not reach the {mode} mode"]
    settle(page)
    return []


def settle(page):
    """Wait until the page has laid itself out again (two animation frames)."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def after_resize(page):
    """Wait for the theme's own response to a resize: 300 ms after it, it gives every code
    block and output that now scrolls a tab stop (and takes it from those that no longer do),
    which axe's scrollable-region-focusable rule checks. If that never happens, axe says so."""
    settle(page)
    page.wait_for_timeout(300)
    try:
        page.wait_for_function(
            "() => [...document.querySelectorAll('pre, .cell_output > .output, "
            ".pst-scrollable-table-container')].every(e => (e.scrollWidth > e.clientWidth || "
            "e.scrollHeight > e.clientHeight) === (e.tabIndex === 0))", polling=100,
            timeout=15000)
    except Exception:
        pass


# The theme fades its colours when the mode changes; axe must read the final colours, not a
# frame in between, so the checks switch CSS transitions and animations off first (the final
# state of every element is the same).
NO_TRANSITIONS = ("*, *::before, *::after { transition: none !important; "
                  "animation-duration: 0s !important; animation-delay: 0s !important; }")


def check_page(browser, html: pathlib.Path, base: str, page_path: str) -> list[str]:
    """Open one page once and return every problem on it, in both colour modes and at both
    widths: content (images, math, links) once, then axe-core in light and dark at desktop
    width, the keyboard focus in both modes, and axe-core again in both modes at phone width."""
    problems: list[str] = []
    context, page, url = open_page(browser, base, page_path, "light", problems)
    problems += content_problems(page, html, url)
    page.add_style_tag(content=NO_TRANSITIONS)
    for mode, viewport in (("light", DESKTOP), ("dark", DESKTOP), ("dark", PHONE),
                           ("light", PHONE)):
        if page.viewport_size != viewport:
            page.set_viewport_size(viewport)
            after_resize(page)
        problems += switch_mode(page, mode)
        where = f"[{mode}, {viewport['width']} px] "
        problems += [where + problem for problem in accessibility_problems(page)]
        if viewport is DESKTOP:
            problems += [where + problem for problem in invisible_focus(page)]
    context.close()
    return problems


def accessibility_problems(page) -> list[str]:
    """axe-core's serious and critical violations on the open page, one line each."""
    if not AXE.exists():
        pytest.fail(f"no axe-core at {AXE}: scripts/test.sh installs it (npm ci)")
    page.add_script_tag(path=str(AXE))
    violations = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
        ".map(v => [v.impact, v.id, v.help, v.nodes.length, v.nodes[0].target.join(' ')])")
    return [f"axe {impact}: {rule} ({help}) on {count} elements, e.g. {target}"
            for impact, rule, help, count, target in violations]


def invisible_focus(page, presses: int = 8) -> list[str]:
    """Tab through the first controls of the page: each must show a visible focus outline."""
    problems = []
    page.locator("body").focus()
    for _ in range(presses):
        page.keyboard.press("Tab")
        tag, name, style, width = page.evaluate(
            "() => { const e = document.activeElement; const s = getComputedStyle(e);"
            " return [e.tagName, (e.getAttribute('aria-label') || e.textContent || '').trim()"
            ".slice(0, 30), s.outlineStyle, parseFloat(s.outlineWidth)] }")
        if tag != "BODY" and (style == "none" or width < 2):
            problems.append(f"keyboard focus not visible on <{tag.lower()}> {name!r}")
    return problems


def check_link(html: pathlib.Path, page_url: str, href: str, host: str) -> list[str]:
    target = urllib.parse.urlparse(href)
    if target.scheme not in ("http", "https") or target.netloc != host:
        return []  # links to other sites are not followed: the site must work offline
    file = html / urllib.parse.unquote(target.path.lstrip("/"))
    if file.is_dir():
        file = file / "index.html"
    if not file.exists():
        return [f"broken link on {page_url}: {href}"]
    if target.fragment and file.suffix == ".html" and target.fragment not in anchors_of(file):
        return [f"broken anchor on {page_url}: {href}"]
    return []


def site_pages() -> list[str]:
    # The pages are known only after the build; collect them from the sources instead, then
    # test_every_built_page_was_checked makes sure no built page escaped.
    # Sphinx adds the general index, the search page and (for the API page) the module index.
    return ([f"{name}.html" for name in toc_entries()]
            + ["genindex.html", "search.html", "py-modindex.html"])


@pytest.mark.parametrize("page_path", site_pages())
def test_page_works_in_a_browser_in_both_modes_and_at_both_widths(site, browser, page_path):
    html, base = site
    problems = check_page(browser, html, base, page_path)
    assert not problems, f"{page_path}:\n" + "\n".join(sorted(set(problems)))


def test_every_built_page_was_checked(site):
    html, _ = site
    unchecked = sorted(set(built_pages(html)) - set(site_pages()) - {"index.html"})
    assert not unchecked, f"built pages the browser test does not open: {unchecked}"


def test_index_redirects_to_the_first_page_which_works_in_dark_mode(site, browser):
    html, base = site
    # The one page loaded in the dark mode from the start (the others switch after loading).
    problems: list[str] = []
    context, page, _ = open_page(browser, base, "index.html", "dark", problems)
    url = urllib.parse.urljoin(base, "book/intro.html")
    page.wait_for_url(url, wait_until="load", timeout=10000)
    problems += content_problems(page, html, url)
    page.add_style_tag(content=NO_TRANSITIONS)
    settle(page)
    if page.evaluate("() => document.documentElement.dataset.theme") != "dark":
        problems.append("the page did not open in the dark mode")
    problems += accessibility_problems(page) + invisible_focus(page)
    context.close()
    assert not problems, "\n".join(problems)


def notebook_pages() -> list[str]:
    return [name for name in toc_entries() if (BOOK_ROOT / f"{name}.ipynb").exists()]


@pytest.mark.parametrize("name", notebook_pages())
def test_notebook_page_launches_the_configured_repository(build, name):
    html, _, _ = build
    repository = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    slug = repository["url"].removeprefix("https://github.com/")
    branch, prefix = repository["branch"], repository["path_to_book"]
    page = (html / f"{name}.html").read_text(encoding="utf-8")
    soup = BeautifulSoup(page, "html.parser")
    hrefs = {a["href"] for a in soup.find_all("a", href=True)}
    binder = f"https://mybinder.org/v2/gh/{slug}/{branch}?urlpath=tree/{prefix}{name}.ipynb"
    colab = f"https://colab.research.google.com/github/{slug}/blob/{branch}/{prefix}{name}.ipynb"
    assert binder in hrefs, f"no Binder button for {binder}"
    assert colab in hrefs, f"no Colab button for {colab}"
    assert soup.find(class_="btn-launch-thebe"), "no Live Code (Thebe) button"
    thebe_config = soup.find("script", type="text/x-thebe-config").string
    assert f'repo: "{slug}"' in thebe_config and f'ref: "{branch}"' in thebe_config


@pytest.mark.parametrize("name", notebook_pages())
def test_notebook_page_offers_its_notebook_for_download(build, name):
    html, _, _ = build
    page = (html / f"{name}.html").read_text(encoding="utf-8")
    download = f"_sources/{name}.ipynb"
    assert download in page, "no download link to the .ipynb"
    assert (html / download).exists()


def test_no_link_points_at_the_jupyter_book_project(build):
    html, _, _ = build
    pattern = re.compile(r'href="[^"]*(executablebooks|jupyter-book/jupyter-book)')
    offenders = [str(path.relative_to(html)) for path in html.rglob("*.html")
                 if pattern.search(path.read_text(encoding="utf-8"))]
    assert not offenders, f"pages linking to the jupyter-book project: {offenders}"


@pytest.mark.parametrize("name", [n for n in notebook_pages() if n.split("/")[-1][:2].isdigit()])
def test_chapter_links_the_api_entries_it_ships_and_its_glossary_terms(build, name):
    html, _, _ = build
    soup = BeautifulSoup((html / f"{name}.html").read_text(encoding="utf-8"), "html.parser")
    hrefs = [a["href"] for a in soup.find_all("a", href=True)]
    assert any(href.startswith("api.html#attention_lib.") for href in hrefs), \
        "no link to an API entry"
    assert any(href.startswith("glossary.html#term-") for href in hrefs), \
        "no link to a glossary term"


def test_status_page_lists_every_notebook_with_its_last_run_and_peak_memory(build):
    html, _, _ = build
    soup = BeautifulSoup((html / "book" / "status.html").read_text(encoding="utf-8"),
                         "html.parser")
    table = soup.find("table")
    assert table is not None, "the status page has no table"
    rows = table.find("tbody").find_all("tr")
    notebooks = sorted(notebook_pages())
    assert len(rows) == len(notebooks)
    for row, name in zip(rows, notebooks):
        cells = [cell.get_text(strip=True) for cell in row.find_all("td")]
        assert row.find("a", href=f"{name.split('/')[-1]}.html"), f"no link to {name}"
        assert float(cells[2]) > 0, f"no recorded run time for {name}: {cells}"
        peak = float(cells[3].replace(",", ""))  # MiB, recorded by scripts/execute_notebooks.py
        assert 0 < peak <= 1024, f"no recorded peak memory within Binder's 1 GiB for {name}"
