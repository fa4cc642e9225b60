"""attention_viewer in a real browser: it shows the weights it was given, and anyone can use it.

A page with four viewers (two layers of three heads, one layer of two heads, the first one
again with the same inputs, and a row that takes every colour) is written to a temporary
folder and served from 127.0.0.1, then driven in Debian's Chromium with Playwright, as
tests/test_site.py does for the built book. Focusing, hovering or moving to a token with the
arrow keys must show that token's row of the array the viewer was given (the numbers on the
page are read back and compared); choosing another head or layer must show that head's row.
The page is checked in four surroundings: a plain page (as in Jupyter's classic notebook),
JupyterLab's dark theme, and the book's theme (pydata-sphinx-theme and sphinx-book-theme's
style sheets) in light and dark mode; at desktop and phone (390 px) widths; with axe-core (no
serious or critical violation, colour contrast included), with no console error, no request
to another host, and no horizontal scrolling at 390 px. Screenshots of each surrounding are
saved in the test's temporary folder.
"""

from __future__ import annotations

import functools
import http.server
import pathlib
import shutil
import threading
import urllib.parse

import numpy as np
import pytest
from test_site import AXE, CHROMIUM, CHROMIUM_ARGS, DESKTOP, PHONE, accessibility_problems

from attention_lib import causal_mask, scaled_dot_product_attention
from attention_lib.plotting import attention_viewer

pytestmark = pytest.mark.browser

TOKENS = ["When", " Mary", " and", " John", " went", " to", " the", " store", ",", " John",
          " gave", " a", " drink", " to"]
# Tokens that would run code if the viewer wrote them into the page as markup.
HOSTILE = ['<img src=x onerror="window.pwned=1">', "<script>window.pwned=2</script>",
           "</script><script>window.pwned=3</script>", "&amp;"]


def causal_weights(L: int, H: int, T: int, seed: int) -> np.ndarray:
    """Softmax weights (L, H, T, T) of random scores under a causal mask: every head differs."""
    scores = np.random.default_rng(seed).normal(scale=2.0, size=(L, H, T, T))
    return scaled_dot_product_attention(scores, np.eye(T), np.eye(T), causal_mask(T))[1]


WEIGHTS = causal_weights(2, 3, len(TOKENS), seed=0)
SMALL = causal_weights(1, 2, len(HOSTILE), seed=1)[0]  # (H, T, T): one layer
# The last token's row takes every weight from 0 to 1 in tenths: every colour class, once.
PALETTE = np.full((1, 11, 11), 0.5)
PALETTE[0, 10] = np.linspace(0.0, 1.0, 11)

# name: (html attribute of <html>, of <body>, style sheets of the book's theme?)
SURROUNDINGS = {
    "plain": ('lang="en"', "", False),
    "jupyterlab-dark": ('lang="en"', 'data-jp-theme-light="false" '
                        'style="background:#111111;color:#d9d9d9"', False),
    "book-light": ('lang="en" data-theme="light"', "", True),
    "book-dark": ('lang="en" data-theme="dark"', "", True),
}


def theme_style_sheets() -> list[pathlib.Path]:
    """The book theme's style sheets, as the built site loads them (from the installed packages)."""
    import myst_nb
    import pydata_sphinx_theme
    import sphinx_book_theme

    pydata = pathlib.Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme"
    book = pathlib.Path(sphinx_book_theme.__file__).parent / "theme" / "sphinx_book_theme"
    return [pydata / "static" / "styles" / "pydata-sphinx-theme.css",
            book / "static" / "styles" / "sphinx-book-theme.css",
            pathlib.Path(myst_nb.__file__).parent / "static" / "mystnb.css"]


@pytest.fixture(scope="module")
def viewers():
    return {
        "main": attention_viewer(TOKENS, WEIGHTS, head_names=["head 0", "head 1", "head 2"],
                                 title="Random causal weights, two layers", query=9),
        "small": attention_viewer(HOSTILE, SMALL, title="Hostile tokens, one layer"),
        "again": attention_viewer(TOKENS, WEIGHTS, head_names=["head 0", "head 1", "head 2"],
                                  title="Random causal weights, two layers", query=9),
        "palette": attention_viewer([f"w{k}" for k in range(11)], PALETTE,
                                    title="Every colour"),
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory, viewers):
    """One page per surrounding, served on 127.0.0.1; yields (folder, base URL)."""
    folder = tmp_path_factory.mktemp("viewer")
    links = ""
    for sheet in theme_style_sheets():
        shutil.copy(sheet, folder / sheet.name)
        links += f'<link rel="stylesheet" href="{sheet.name}">\n'
    # The markup myst-nb gives a cell's HTML output on the site.
    body = "\n".join(
        f'<div class="cell_output docutils container"><div class="output text_html">'
        f"{viewer._repr_html_()}</div></div>" for viewer in viewers.values())
    for name, (html_attributes, body_attributes, themed) in SURROUNDINGS.items():
        page = (f"<!DOCTYPE html>\n<html {html_attributes}><head><meta charset=\"utf-8\">"
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>Attention viewer ({name})</title>\n{links if themed else ''}</head>"
                f'<body {body_attributes}><main class="bd-content"><article class="bd-article">'
                f"<h1>Attention viewers</h1>\n{body}\n</article></main></body></html>")
        (folder / f"{name}.html").write_text(page, encoding="utf-8")
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    if not pathlib.Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/test.sh installs Debian's chromium")
    if not AXE.exists():
        pytest.fail(f"no axe-core at {AXE}: scripts/test.sh installs it (npm ci)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Page:
    """One open page, and every problem it reported (console errors, failed requests...)."""

    def __init__(self, browser, base: str, surrounding: str, viewport: dict,
                 scripts: bool = True):
        self.problems: list[str] = []
        self.context = browser.new_context(viewport=viewport, java_script_enabled=scripts)
        host = urllib.parse.urlparse(base).netloc

        def guard(route):
            if urllib.parse.urlparse(route.request.url).netloc == host:
                route.continue_()
            else:
                self.problems.append(f"request to another host: {route.request.url}")
                route.abort()

        self.context.route("**/*", guard)
        self.page = self.context.new_page()
        self.page.on("console", lambda msg: msg.type == "error" and self.problems.append(
            f"console error: {msg.text}"))
        self.page.on("pageerror", lambda error: self.problems.append(f"exception: {error}"))
        self.page.on("response", lambda response: response.status >= 400 and
                     self.problems.append(f"HTTP {response.status}: {response.url}"))
        self.page.goto(urllib.parse.urljoin(base, f"{surrounding}.html"), wait_until="load")

    def tokens(self, viewer) -> list[dict]:
        """What each token of a viewer shows: its text, weight, and whether it is the query."""
        return self.page.eval_on_selector_all(
            f"#{viewer.element_id} .av-token",
            "buttons => buttons.map(b => ({text: b.querySelector('.av-tok').textContent,"
            " shown: parseFloat(b.querySelector('.av-w').textContent),"
            " data: parseFloat(b.dataset.weight), query: b.getAttribute('aria-pressed'),"
            " level: Array.from(b.classList).find(c => /^av-c[0-9]+$/.test(c))}))")

    def status(self, viewer) -> str:
        return self.page.text_content(f"#{viewer.element_id} .av-status")

    def token(self, viewer, index: int):
        return self.page.locator(f"#{viewer.element_id} .av-token").nth(index)

    def active_token(self):
        """(id of the viewer, index of the token) that has the keyboard focus, or None."""
        return self.page.evaluate(
            "() => { const e = document.activeElement;"
            " if (!e.classList.contains('av-token')) return null;"
            " const root = e.closest('.av-root');"
            " return [root.id, Array.from(root.querySelectorAll('.av-token')).indexOf(e)]; }")

    def close(self) -> list[str]:
        self.context.close()
        return self.problems


@pytest.fixture
def page(site, browser):
    _, base = site
    opened = Page(browser, base, "book-light", DESKTOP)
    yield opened
    problems = opened.close()
    assert not problems, "\n".join(problems)


def assert_shows_row(page: Page, viewer, layer: int, head: int, query: int):
    """The viewer shows, on every token, the weight the query gives it in (layer, head)."""
    row = viewer.weights[layer, head, query]  # the given weights, rounded to 3 decimals
    shown = page.tokens(viewer)
    np.testing.assert_array_equal([t["shown"] for t in shown], row)  # printed: 3 decimals
    np.testing.assert_array_equal([t["data"] for t in shown], row)
    assert [t["query"] for t in shown] == ["true" if j == query else "false"
                                           for j in range(len(row))]
    assert [t["level"] for t in shown] == [f"av-c{int(np.floor(w * 10 + 0.5))}" for w in row]
    top = int(np.argmax(row))
    assert page.status(viewer).startswith(
        f"Token {query} \u201c{viewer._labels[query]}\u201d attends most to token {top} "
        f"\u201c{viewer._labels[top]}\u201d (weight {row[top]:.3f})")


def test_the_weights_kept_are_the_given_ones_rounded(viewers):
    # The comparisons below use viewer.weights: check once that it is the array given.
    np.testing.assert_allclose(viewers["main"].weights, WEIGHTS, rtol=0, atol=5e-4 + 1e-12)


def test_the_page_opens_on_the_query_it_was_given(page, viewers):
    assert_shows_row(page, viewers["main"], layer=0, head=0, query=9)
    assert_shows_row(page, viewers["small"], layer=0, head=0, query=len(HOSTILE) - 1)


def test_focusing_a_token_shows_the_weights_of_its_row(page, viewers):
    viewer = viewers["main"]
    for query in range(len(TOKENS)):
        page.token(viewer, query).focus()
        assert_shows_row(page, viewer, layer=0, head=0, query=query)


def test_hovering_a_token_shows_the_weights_of_its_row(page, viewers):
    viewer = viewers["main"]
    for query in (3, 12, 0):
        page.token(viewer, query).hover()
        assert_shows_row(page, viewer, layer=0, head=0, query=query)


def test_switching_head_and_layer_shows_that_heads_row(page, viewers):
    viewer = viewers["main"]
    page.token(viewer, 13).focus()
    before = [t["shown"] for t in page.tokens(viewer)]
    page.page.select_option(f"#{viewer.element_id}-head", "2")
    assert_shows_row(page, viewer, layer=0, head=2, query=13)
    after = [t["shown"] for t in page.tokens(viewer)]
    assert np.max(np.abs(np.subtract(after, before))) > 0.05, "switching heads changed nothing"
    page.page.select_option(f"#{viewer.element_id}-layer", "1")
    assert_shows_row(page, viewer, layer=1, head=2, query=13)
    assert "in layer 1, head 2." in page.status(viewer)
    page.token(viewer, 5).focus()  # a new query keeps the chosen layer and head
    assert_shows_row(page, viewer, layer=1, head=2, query=5)


def test_every_head_of_the_layer_is_listed_with_where_it_attends_most(page, viewers):
    viewer = viewers["main"]
    page.page.select_option(f"#{viewer.element_id}-layer", "1")
    page.token(viewer, 7).focus()
    items = page.page.eval_on_selector_all(f"#{viewer.element_id} .av-heads li",
                                           "items => items.map(i => i.textContent)")
    expected = []
    for head in range(3):
        row = viewer.weights[1, head, 7]
        expected.append(f"head {head}: \u201c{TOKENS[int(np.argmax(row))]}\u201d {row.max():.3f}")
    assert items == expected


def test_arrow_keys_home_and_end_move_the_query_and_the_focus(page, viewers):
    viewer = viewers["main"]
    page.token(viewer, 0).focus()
    last = len(TOKENS) - 1
    for key, expected in [("ArrowRight", 1), ("ArrowDown", 2), ("ArrowLeft", 1), ("ArrowUp", 0),
                          ("ArrowLeft", 0), ("End", last), ("ArrowRight", last), ("Home", 0)]:
        page.page.keyboard.press(key)
        assert page.active_token() == [viewer.element_id, expected], key
        assert_shows_row(page, viewer, layer=0, head=0, query=expected)
    page.token(viewer, 7).hover()  # the mouse shows another row...
    page.page.keyboard.press("ArrowRight")  # ...but the keys move on from the focused token
    assert page.active_token() == [viewer.element_id, 1]
    assert_shows_row(page, viewer, layer=0, head=0, query=1)


def test_tab_reaches_the_menus_then_the_tokens_as_one_stop(page, viewers):
    vid = viewers["main"].element_id
    page.page.focus(f"#{vid}-layer")
    page.page.keyboard.press("Tab")
    assert page.page.evaluate("() => document.activeElement.id") == f"{vid}-head"
    page.page.keyboard.press("Tab")
    assert page.active_token() == [vid, 9]  # the query token, not the first one
    page.page.keyboard.press("ArrowRight")
    page.page.keyboard.press("Tab")  # leaves the tokens: on to the next viewer's menu
    assert page.page.evaluate("() => document.activeElement.id") == \
        f"{viewers['small'].element_id}-head"
    page.page.keyboard.press("Shift+Tab")
    assert page.active_token() == [vid, 10]  # back to the query it was left on
    outline = page.page.evaluate(
        "() => { const s = getComputedStyle(document.activeElement);"
        " return [s.outlineStyle, parseFloat(s.outlineWidth)]; }")
    assert outline[0] != "none" and outline[1] >= 2, f"focus ring not visible: {outline}"


def test_viewers_on_one_page_act_alone_even_with_the_same_inputs(page, viewers):
    main, small, again = viewers["main"], viewers["small"], viewers["again"]
    assert again.element_id.startswith(main.element_id) and again.element_id != main.element_id
    page.token(small, 1).focus()
    page.page.select_option(f"#{small.element_id}-head", "1")
    page.token(again, 4).hover()
    assert_shows_row(page, small, layer=0, head=1, query=1)
    assert_shows_row(page, again, layer=0, head=0, query=4)
    assert_shows_row(page, main, layer=0, head=0, query=9)  # untouched


def test_tokens_are_shown_as_text_and_run_nothing(page, viewers):
    viewer = viewers["small"]
    assert [t["text"] for t in page.tokens(viewer)] == HOSTILE
    page.token(viewer, 2).focus()
    assert page.page.evaluate("() => window.pwned") is None
    assert page.page.locator(f"#{viewer.element_id} img").count() == 0


def test_the_note_for_pages_without_scripts_is_hidden(page, viewers):
    for viewer in viewers.values():
        assert not page.page.is_visible(f"#{viewer.element_id} .av-nojs")


def test_without_scripts_the_page_shows_the_same_row_and_says_it_is_still(site, browser,
                                                                          viewers):
    # A notebook that is not trusted, or a viewer of the .ipynb that runs no scripts.
    _, base = site
    opened = Page(browser, base, "book-light", DESKTOP, scripts=False)
    assert_shows_row(opened, viewers["main"], layer=0, head=0, query=9)
    assert_shows_row(opened, viewers["small"], layer=0, head=0, query=len(HOSTILE) - 1)
    assert opened.page.is_visible(f"#{viewers['main'].element_id} .av-nojs")
    problems = opened.close()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
@pytest.mark.parametrize("surrounding", list(SURROUNDINGS))
def test_viewer_is_accessible_and_fits(site, browser, surrounding, viewport, viewers):
    folder, base = site
    size = DESKTOP if viewport == "desktop" else PHONE
    opened = Page(browser, base, surrounding, size)
    page = opened.page
    page.screenshot(path=str(folder / f"{surrounding}-{viewport}.png"), full_page=True)
    # Every colour class is on the page (the palette viewer's last row) while axe looks.
    levels = {t["level"] for t in opened.tokens(viewers["palette"])}
    assert levels == {f"av-c{k}" for k in range(11)}
    problems = accessibility_problems(page)
    overflow = page.evaluate(
        "() => Array.from(document.querySelectorAll('.av-root'))"
        ".filter(r => r.scrollWidth > r.clientWidth + 1).map(r => r.id)")
    problems += [f"{vid} scrolls sideways at {size['width']} px" for vid in overflow]
    if page.evaluate("() => document.documentElement.scrollWidth") > size["width"]:
        problems.append(f"the page scrolls sideways at {size['width']} px")
    problems += opened.close()
    assert not problems, f"{surrounding}, {viewport}:\n" + "\n".join(problems)
