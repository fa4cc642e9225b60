"""attention_heatmap, plot_vectors_2d, plot_heads, attention_viewer: what they show, bad input.

The Agg backend is set in conftest.py; a fixture there closes every figure after each test.
"""

import json
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from bs4 import BeautifulSoup
from matplotlib.axes import Axes
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure

from attention_lib import causal_mask, plotting, scaled_dot_product_attention
from attention_lib.plotting import (
    AttentionViewer,
    attention_heatmap,
    attention_viewer,
    plot_heads,
    plot_vectors_2d,
)

TOKENS = ["the", "cat", "sat"]


def tick_texts(labels):
    return [label.get_text() for label in labels]


def heatmap_mesh(ax):
    meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
    assert len(meshes) == 1
    return meshes[0]


def colorbar_axes(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def causal_weights(T=3):
    x = np.random.default_rng(0).normal(size=(T, 4))
    return scaled_dot_product_attention(x, x, x, causal_mask(T))[1]


# --------------------------------------------------------------------------- attention_heatmap


def test_heatmap_returns_axes_with_title_axis_labels_and_token_ticks():
    ax = attention_heatmap(causal_weights(), TOKENS, title="causal self-attention")
    assert isinstance(ax, Axes)
    assert ax.get_title() == "causal self-attention"
    assert ax.get_xlabel() == "key token (attended to)"
    assert ax.get_ylabel() == "query token (attending)"
    assert tick_texts(ax.get_xticklabels()) == TOKENS
    assert tick_texts(ax.get_yticklabels()) == TOKENS


def test_heatmap_rows_are_queries_and_columns_are_keys():
    weights = np.array([[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, 0.0]])
    ax = attention_heatmap(weights, ["q0", "q1"], ["k0", "k1", "k2", "k3"], annotate=False)
    assert tick_texts(ax.get_xticklabels()) == ["k0", "k1", "k2", "k3"]
    assert tick_texts(ax.get_yticklabels()) == ["q0", "q1"]
    np.testing.assert_array_equal(np.asarray(heatmap_mesh(ax).get_array()).reshape(2, 4), weights)


def test_heatmap_labels_default_to_positions():
    ax = attention_heatmap(np.full((3, 3), 1 / 3))
    assert tick_texts(ax.get_xticklabels()) == ["0", "1", "2"]
    assert tick_texts(ax.get_yticklabels()) == ["0", "1", "2"]


def test_rectangular_heatmap_without_tokens_labels_queries_and_keys_by_position():
    # Cross-attention weights (Tq=2, Tk=3) with no token lists: "both default to positions".
    ax = attention_heatmap(np.full((2, 3), 1 / 3))
    assert tick_texts(ax.get_xticklabels()) == ["0", "1", "2"]
    assert tick_texts(ax.get_yticklabels()) == ["0", "1"]


def test_masked_minus_inf_cells_are_not_drawn_or_annotated():
    scores = np.where(causal_mask(3), np.arange(9.0).reshape(3, 3), -np.inf)
    ax = attention_heatmap(scores, TOKENS, vmin=None, vmax=None, colorbar_label="score")
    drawn = heatmap_mesh(ax).get_array()
    hidden = np.ma.getmaskarray(drawn).reshape(3, 3)
    np.testing.assert_array_equal(hidden, ~causal_mask(3))
    annotations = sorted(text.get_text() for text in ax.texts)
    assert annotations == ["0.00", "3.00", "4.00", "6.00", "7.00", "8.00"]


def test_heatmap_annotates_each_cell_with_its_value():
    weights = np.array([[0.25, 0.75], [0.5, 0.5]])
    ax = attention_heatmap(weights, ["a", "b"], fmt=".2f")
    assert sorted(text.get_text() for text in ax.texts) == ["0.25", "0.50", "0.50", "0.75"]


def test_heatmap_without_annotation_writes_no_numbers():
    ax = attention_heatmap(causal_weights(), TOKENS, annotate=False)
    assert len(ax.texts) == 0


def test_heatmap_colour_scale_is_zero_to_one_with_a_labelled_colorbar():
    ax = attention_heatmap(causal_weights(), TOKENS)
    assert heatmap_mesh(ax).get_clim() == (0.0, 1.0)
    colorbars = colorbar_axes(ax.figure)
    assert len(colorbars) == 1
    assert colorbars[0].get_ylabel() == "attention weight"


def test_heatmap_colorbar_can_be_turned_off():
    ax = attention_heatmap(causal_weights(), TOKENS, colorbar=False)
    assert colorbar_axes(ax.figure) == []


def test_heatmap_draws_on_the_given_axes():
    fig, (left, right) = plt.subplots(1, 2)
    ax = attention_heatmap(causal_weights(), TOKENS, ax=right, title="right")
    assert ax is right
    np.testing.assert_array_equal(np.asarray(heatmap_mesh(right).get_array()).shape, (3, 3))
    assert len(left.collections) == 0 and left.get_title() == ""


def test_heatmap_rejects_weights_that_are_not_two_dimensional():
    with pytest.raises(ValueError, match=r"^weights must be 2-d \(Tq, Tk\); got shape \(3,\)"):
        attention_heatmap(np.ones(3))
    with pytest.raises(ValueError, match=r"^weights must be 2-d \(Tq, Tk\); got shape \(2, 3, 3\)"):
        attention_heatmap(np.ones((2, 3, 3)))


def test_heatmap_rejects_the_wrong_number_of_query_tokens():
    with pytest.raises(ValueError, match=r"^query_tokens has 2 labels but the weights have 3"):
        attention_heatmap(np.ones((3, 3)), ["a", "b"])


def test_heatmap_rejects_the_wrong_number_of_key_tokens():
    with pytest.raises(ValueError, match=r"^key_tokens has 2 labels but the weights have 4"):
        attention_heatmap(np.ones((3, 4)), ["a", "b", "c"], ["x", "y"])


# --------------------------------------------------------------------------- plot_vectors_2d


def test_vectors_are_arrows_from_the_origin_labelled_at_their_tips():
    vectors = np.array([[1.0, 2.0], [3.0, -1.0]])
    ax = plot_vectors_2d(vectors, ["x", "y"], title="two vectors")
    assert isinstance(ax, Axes)
    arrows = [t for t in ax.texts if t.arrow_patch is not None]
    labels = [t for t in ax.texts if t.arrow_patch is None]
    assert len(arrows) == 2
    for arrow, vector in zip(arrows, vectors):
        np.testing.assert_array_equal(arrow.xy, vector)
        assert tuple(arrow.xyann) == (0, 0)
    assert [t.get_text() for t in labels] == ["x", "y"]
    np.testing.assert_array_equal([t.xy for t in labels], vectors)
    assert ax.get_title() == "two vectors"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("component 1", "component 2")


def test_vector_plot_keeps_every_tip_and_the_origin_in_view():
    vectors = np.array([[1.0, 2.0], [3.0, -1.0], [-0.5, 0.5]])
    ax = plot_vectors_2d(vectors)
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    for x, y in [*vectors, (0.0, 0.0)]:
        assert x0 < x < x1 and y0 < y < y1


def test_overlaying_a_second_set_never_shrinks_the_view():
    ax = plot_vectors_2d([[1.0, 2.0], [3.0, -1.0]], ["a", "b"])
    limits = ax.get_xlim(), ax.get_ylim()
    same = plot_vectors_2d([[0.1, 0.1]], ["c"], ax=ax, linestyle="--")
    assert same is ax
    assert (ax.get_xlim(), ax.get_ylim()) == limits
    plot_vectors_2d([[5.0, 5.0]], ["d"], ax=ax)
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 <= limits[0][0] and y0 <= limits[1][0]
    assert x1 > 5.0 and y1 > 5.0


def test_vector_labels_default_to_positions():
    ax = plot_vectors_2d([[1.0, 0.0], [0.0, 1.0]])
    assert [t.get_text() for t in ax.texts if t.arrow_patch is None] == ["0", "1"]


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 2, 2)])
def test_vectors_of_the_wrong_shape_are_rejected_naming_vectors(shape):
    with pytest.raises(ValueError, match=r"^vectors must have shape \(n, 2\)"):
        plot_vectors_2d(np.ones(shape))


def test_the_wrong_number_of_vector_labels_is_rejected_naming_labels():
    with pytest.raises(ValueError, match=r"^labels has 1 labels but the weights have 2"):
        plot_vectors_2d(np.eye(2), ["only one"])


def test_the_wrong_number_of_colors_is_rejected_naming_colors():
    # One colour per vector: two colours for three vectors must not silently drop a vector.
    with pytest.raises(ValueError, match=r"colors"):
        plot_vectors_2d(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), colors=["red", "blue"])


# --------------------------------------------------------------------------- plot_heads


def head_weights(H=5, T=3):
    rng = np.random.default_rng(H)
    x = rng.normal(size=(H, T, 4))
    return scaled_dot_product_attention(x, x, x, causal_mask(T))[1]


@pytest.mark.parametrize(("H", "ncols"), [(1, None), (4, None), (5, None), (6, 4), (3, 2)])
def test_plot_heads_makes_h_visible_panels_and_one_colorbar(H, ncols):
    fig = plot_heads(head_weights(H), TOKENS, ncols=ncols)
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert len(panels) == H
    assert all(len([c for c in ax.collections if isinstance(c, QuadMesh)]) == 1 for ax in panels)
    assert len(colorbar_axes(fig)) == 1
    assert colorbar_axes(fig)[0].get_ylabel() == "attention weight"


def test_plot_heads_titles_panels_and_the_figure():
    fig = plot_heads(
        head_weights(2), TOKENS, head_names=["previous token", "first token"], title="two heads"
    )
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in panels] == ["previous token", "first token"]
    assert fig.get_suptitle() == "two heads"


def test_plot_heads_default_panel_titles_name_the_heads():
    fig = plot_heads(head_weights(3), TOKENS)
    assert [ax.get_title() for ax in fig.axes[:3]] == ["head 0", "head 1", "head 2"]


def test_plot_heads_panels_share_one_colour_scale_and_show_each_head():
    weights = head_weights(4)
    fig = plot_heads(weights, TOKENS)
    for head, ax in enumerate(fig.axes[:4]):
        mesh = heatmap_mesh(ax)
        assert mesh.get_clim() == (0.0, 1.0)
        drawn = np.asarray(mesh.get_array()).reshape(3, 3)
        np.testing.assert_array_equal(drawn, weights[head])
        assert tick_texts(ax.get_xticklabels()) == TOKENS


def test_plot_heads_labels_only_the_outer_axes():
    fig = plot_heads(head_weights(5), TOKENS)  # 4 columns: heads 0-3, then head 4
    panels = fig.axes[:5]
    assert [ax.get_ylabel() for ax in panels] == ["query token", "", "", "", "query token"]
    # heads 1-3 have no panel below them, so they carry the key label too
    assert [ax.get_xlabel() for ax in panels] == ["", *["key token"] * 4]
    assert tick_texts(panels[0].get_yticklabels()) == TOKENS
    assert all(label == "" for label in tick_texts(panels[1].get_yticklabels()))


def test_plot_heads_of_rectangular_weights_without_tokens_labels_by_position():
    fig = plot_heads(np.full((2, 2, 3), 1 / 3))
    assert tick_texts(fig.axes[0].get_xticklabels()) == ["0", "1", "2"]
    assert tick_texts(fig.axes[0].get_yticklabels()) == ["0", "1"]


def test_plot_heads_rejects_weights_that_are_not_three_dimensional():
    with pytest.raises(ValueError, match=r"^weights must be 3-d \(H, Tq, Tk\); got shape \(3, 3\)"):
        plot_heads(np.ones((3, 3)))


def test_plot_heads_rejects_the_wrong_number_of_head_names():
    with pytest.raises(ValueError, match=r"^head_names has 1 labels but the weights have 2"):
        plot_heads(head_weights(2), head_names=["lonely"])


def test_plot_heads_rejects_the_wrong_number_of_query_tokens():
    with pytest.raises(ValueError, match=r"^query_tokens has 2 labels but the weights have 3"):
        plot_heads(head_weights(2), ["a", "b"])


@pytest.mark.parametrize("ncols", [0, -1, 1.5])
def test_plot_heads_rejects_a_bad_ncols_naming_ncols(ncols):
    with pytest.raises((TypeError, ValueError), match=r"ncols"):
        plot_heads(head_weights(2), ncols=ncols)


def test_plot_heads_rejects_zero_heads_naming_weights():
    with pytest.raises(ValueError, match=r"weights"):
        plot_heads(np.ones((0, 3, 3)))


# --------------------------------------------------------------------------- attention_viewer
# The browser half (the script shows these numbers, keyboard, themes, axe) is in
# tests/test_attention_viewer.py.

VIEWER_TOKENS = ["When", " Mary", " and", " John", " went", ","]


def layered_weights(L=2, H=3, T=6, seed=0):
    """Causal softmax weights of shape (L, H, T, T), with rows that differ from head to head."""
    scores = np.random.default_rng(seed).normal(scale=2.0, size=(L, H, T, T))
    return scaled_dot_product_attention(scores, np.eye(T), np.eye(T), causal_mask(T))[1]


def embedded_data(page: str) -> dict:
    soup = BeautifulSoup(page, "html.parser")
    (block,) = soup.find_all("script", type="application/json")
    return json.loads(block.string)


@pytest.fixture
def fresh_ids(monkeypatch):
    """Forget the viewers made so far, as a fresh kernel does."""
    monkeypatch.setattr(plotting, "_viewer_id_counts", {})


def test_viewer_embeds_every_weight_rounded_to_the_given_digits():
    weights = layered_weights()
    for digits in (2, 3, 5):
        data = embedded_data(attention_viewer(VIEWER_TOKENS, weights, digits=digits)
                             ._repr_html_())
        np.testing.assert_array_equal(np.array(data["weights"]), np.round(weights, digits))
        assert data["tokens"] == VIEWER_TOKENS
        assert data["layers"] == ["layer 0", "layer 1"]
        assert data["heads"] == ["head 0", "head 1", "head 2"]


def test_viewer_of_one_layer_embeds_it_as_layer_zero_and_has_no_layer_menu():
    weights = layered_weights(L=1)[0]  # (H, T, T)
    page = attention_viewer(VIEWER_TOKENS, weights)._repr_html_()
    np.testing.assert_array_equal(np.array(embedded_data(page)["weights"]),
                                  np.round(weights[None], 3))
    soup = BeautifulSoup(page, "html.parser")
    assert soup.find("select", class_="av-layer") is None
    assert len(soup.find("select", class_="av-head").find_all("option")) == 3


def test_viewer_of_float32_weights_embeds_their_values():
    weights = layered_weights().astype(np.float32)
    data = embedded_data(attention_viewer(VIEWER_TOKENS, weights)._repr_html_())
    np.testing.assert_array_equal(np.array(data["weights"]),
                                  np.round(weights.astype(np.float64), 3))


def test_viewer_without_script_shows_the_row_of_the_query_it_opens_on():
    weights = layered_weights()
    viewer = attention_viewer(VIEWER_TOKENS, weights, layer=1, head=2, query=4,
                              head_names=["a", "b", "c"])
    soup = BeautifulSoup(viewer._repr_html_(), "html.parser")
    buttons = soup.select(".av-tokens button")
    assert [b.select_one(".av-tok").get_text() for b in buttons] == [
        "When", " Mary", " and", " John", " went", ","]
    row = np.round(weights[1, 2, 4], 3)  # what the viewer keeps, and shows in full
    assert [b.select_one(".av-w").get_text() for b in buttons] == [f"{w:.3f}" for w in row]
    assert [b["aria-pressed"] for b in buttons] == ["false"] * 4 + ["true", "false"]
    assert [b["tabindex"] for b in buttons] == ["-1"] * 4 + ["0", "-1"]  # one stop for Tab
    top = int(np.argmax(weights[1, 2, 4]))
    status = soup.select_one(".av-status")
    assert status["role"] == "status"  # a live region: screen readers read its changes
    assert status.get_text() == (
        f"Token 4 \u201c went\u201d attends most to token {top} \u201c{VIEWER_TOKENS[top]}\u201d "
        f"(weight {row[top]:.3f}) in layer 1, c.")
    assert soup.select_one("select.av-layer option[selected]").get_text() == "layer 1"
    assert soup.select_one("select.av-head option[selected]").get_text() == "c"
    heads = [li.get_text() for li in soup.select(".av-heads li")]
    assert heads == [f"{name}: \u201c{VIEWER_TOKENS[np.argmax(weights[1, h, 4])]}\u201d "
                     f"{weights[1, h, 4].max():.3f}" for h, name in enumerate("abc")]


def test_viewer_colours_each_token_by_its_weight_in_tenths():
    weights = np.full((1, 5, 5), 0.2)
    weights[0, 4] = [0.04, 0.06, 0.449, 0.451, 1.0]  # the row of the last token, the query
    soup = BeautifulSoup(attention_viewer(list("abcde"), weights)._repr_html_(), "html.parser")
    classes = [set(b["class"]) - {"av-token", "av-query"} for b in soup.select(".av-token")]
    assert classes == [{"av-c0"}, {"av-c1"}, {"av-c4"}, {"av-c5"}, {"av-c10"}]


def test_viewer_shows_tokens_as_text_never_as_markup():
    hostile = ["<script>alert(1)</script>", "</script><script>alert(2)//", '"><img src=x>',
               "&amp;", "ok"]
    weights = np.full((1, 5, 5), 0.2)
    page = attention_viewer(hostile, weights, head_names=["<b>h</b>"], title="<i>t</i>",
                            layer_names=["</select>"])._repr_html_()
    soup = BeautifulSoup(page, "html.parser")
    assert len(soup.find_all("script")) == 2  # the data and the viewer's own code
    assert soup.find("img") is None and soup.find("b") is None and soup.find("i") is None
    assert [tag.get_text() for tag in soup.select(".av-tok")] == hostile
    assert soup.select_one(".av-title").get_text() == "<i>t</i>"
    assert soup.select_one("select.av-head option").get_text() == "<b>h</b>"
    assert soup.select_one("select.av-layer option").get_text() == "</select>"
    assert page.count("</script>") == 2  # no token closes a script element early
    assert embedded_data(page)["tokens"] == hostile


def test_viewer_makes_white_space_tokens_visible():
    soup = BeautifulSoup(attention_viewer(["", " ", "\n", "a b"], np.full((1, 4, 4), 0.25))
                         ._repr_html_(), "html.parser")
    assert [tag.get_text() for tag in soup.select(".av-tok")] == ["\u2205", "\u2423", "\u23ce",
                                                                   "a b"]


def test_viewer_html_is_the_same_for_the_same_inputs(fresh_ids):
    first = attention_viewer(VIEWER_TOKENS, layered_weights())._repr_html_()
    plotting._viewer_id_counts.clear()  # a fresh kernel, as under nbval
    again = attention_viewer(VIEWER_TOKENS, layered_weights())._repr_html_()
    assert first == again


def test_two_viewers_on_one_page_have_different_ids(fresh_ids):
    same_a = attention_viewer(VIEWER_TOKENS, layered_weights())
    same_b = attention_viewer(VIEWER_TOKENS, layered_weights())
    other = attention_viewer(VIEWER_TOKENS, layered_weights(seed=1))
    ids = [same_a.element_id, same_b.element_id, other.element_id]
    assert len(set(ids)) == 3
    assert re.fullmatch(r"av-[0-9a-f]{12}", same_a.element_id)
    assert same_b.element_id == same_a.element_id + "-1"
    assert same_a._repr_html_() == same_a._repr_html_()  # shown twice: the same output
    page = BeautifulSoup(same_b._repr_html_(), "html.parser")
    element_ids = [tag["id"] for tag in page.find_all(id=True)]
    assert element_ids and all(i.startswith(same_b.element_id) for i in element_ids)
    assert all(page.find(id=label["for"]) for label in page.find_all("label"))


def test_viewer_accepts_rows_that_do_not_sum_to_one():
    weights = 2 * layered_weights()
    data = embedded_data(attention_viewer(VIEWER_TOKENS, weights)._repr_html_())
    np.testing.assert_array_equal(np.array(data["weights"]), np.round(weights, 3))


def contrast(foreground: str, background: str) -> float:
    def luminance(hex_colour):
        rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        rgb = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
        return 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]

    dark, light = sorted([luminance(foreground), luminance(background)])
    return (light + 0.05) / (dark + 0.05)


def test_every_weight_colour_has_text_of_enough_contrast_in_light_and_dark_pages():
    page = attention_viewer(VIEWER_TOKENS, layered_weights())._repr_html_()
    css = BeautifulSoup(page, "html.parser").find("style").string
    rules = re.findall(r"([^{}\n]*\.av-c(\d+))\{background:(#[0-9a-f]{6});color:(#[0-9a-f]{6})\}",
                       css)
    light = {int(level): (bg, fg) for sel, level, bg, fg in rules if "dark" not in sel}
    dark = {int(level): (bg, fg) for sel, level, bg, fg in rules
            if 'html[data-theme="dark"]' in sel and "jp-theme-light" in sel}
    assert sorted(light) == sorted(dark) == list(range(1, 11))
    for palette in (light, dark):
        for background, text in palette.values():
            assert contrast(text, background) >= 4.5, (text, background)
    # A larger weight stands further out from the page: darker on light pages, lighter on dark.
    def lum(hex_colour):
        return contrast(hex_colour, "#000000")
    assert all(lum(light[k][0]) > lum(light[k + 1][0]) for k in range(1, 10))
    assert all(lum(dark[k][0]) < lum(dark[k + 1][0]) for k in range(1, 10))


def test_viewer_offers_html_and_a_png_fallback_of_the_head_it_opens_on():
    from IPython.core.formatters import DisplayFormatter

    weights = layered_weights()
    viewer = attention_viewer(VIEWER_TOKENS, weights, layer=1, head=2, title="Mary and John")
    bundle, _ = DisplayFormatter().format(viewer)
    assert {"text/plain", "text/html", "image/png"} <= set(bundle)
    assert bundle["image/png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert bundle["text/plain"] == ("AttentionViewer(title='Mary and John', layers=2, heads=3, "
                                    "tokens=6)")
    figure = viewer.to_figure()
    (ax,) = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    assert ax.get_title() == "Mary and John: layer 1, head 2"
    np.testing.assert_array_equal(np.asarray(heatmap_mesh(ax).get_array()).reshape(6, 6),
                                  np.round(weights[1, 2], 3))
    assert tick_texts(ax.get_yticklabels()) == VIEWER_TOKENS


def test_viewer_png_is_the_same_for_the_same_inputs():
    weights = layered_weights()
    assert (attention_viewer(VIEWER_TOKENS, weights)._repr_png_()
            == attention_viewer(VIEWER_TOKENS, weights)._repr_png_())


@pytest.mark.parametrize(("shape", "message"), [
    ((6, 6), r"weights must have shape \(L, H, T, T\) or \(H, T, T\); got \(6, 6\)"),
    ((1, 1, 1, 6, 6), r"got \(1, 1, 1, 6, 6\)"),
    ((2, 6, 5), r"weights must have shape \(L, H, T, T\) or \(H, T, T\); got \(2, 6, 5\)"),
    ((0, 6, 6), r"weights has no entries \(shape \(0, 6, 6\)\)"),
])
def test_viewer_rejects_weights_of_the_wrong_shape_naming_the_shape(shape, message):
    with pytest.raises(ValueError, match=message):
        attention_viewer(VIEWER_TOKENS, np.full(shape, 0.1))


def test_viewer_rejects_a_token_count_that_is_not_t():
    with pytest.raises(ValueError, match=r"^tokens has 5 entries but weights of shape "
                                         r"\(2, 3, 6, 6\) have T=6"):
        attention_viewer(VIEWER_TOKENS[:5], layered_weights())


def test_viewer_rejects_one_string_as_tokens():
    with pytest.raises(TypeError, match=r"tokens must be a sequence of strings"):
        attention_viewer("abc", np.full((1, 3, 3), 1 / 3))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_viewer_rejects_weights_that_are_not_finite_naming_the_entry(bad):
    weights = layered_weights()
    weights[1, 0, 3, 2] = bad
    with pytest.raises(ValueError, match=r"^weights must be finite; weights\(1, 0, 3, 2\) of "
                                         r"shape \(2, 3, 6, 6\) is (nan|inf)"):
        attention_viewer(VIEWER_TOKENS, weights)


def test_viewer_rejects_the_wrong_number_of_layer_or_head_names():
    with pytest.raises(ValueError, match=r"^head_names has 2 labels but the weights have 3"):
        attention_viewer(VIEWER_TOKENS, layered_weights(), head_names=["a", "b"])
    with pytest.raises(ValueError, match=r"^layer_names has 1 labels but the weights have 2"):
        attention_viewer(VIEWER_TOKENS, layered_weights(), layer_names=["a"])


@pytest.mark.parametrize(("argument", "value"), [
    ("layer", 2), ("head", -1), ("query", 6), ("query", 1.0), ("head", True)])
def test_viewer_rejects_a_start_outside_the_weights_naming_it(argument, value):
    with pytest.raises(ValueError, match=rf"^{argument} must be an integer in 0\.\.\d+ for "
                                         r"weights of shape \(2, 3, 6, 6\)"):
        attention_viewer(VIEWER_TOKENS, layered_weights(), **{argument: value})


@pytest.mark.parametrize("digits", [0, 9, 2.5])
def test_viewer_rejects_a_bad_digits(digits):
    with pytest.raises(ValueError, match=r"^digits must be an integer from 1 to 8"):
        attention_viewer(VIEWER_TOKENS, layered_weights(), digits=digits)


def test_viewer_is_an_attention_viewer():
    assert isinstance(attention_viewer(["a"], np.ones((1, 1, 1))), AttentionViewer)
