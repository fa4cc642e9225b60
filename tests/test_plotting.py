"""attention_heatmap, plot_vectors_2d, plot_heads: what the figures show, and bad input.

The Agg backend is set in conftest.py; a fixture there closes every figure after each test.
"""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure

from attention_lib import causal_mask, scaled_dot_product_attention
from attention_lib.plotting import attention_heatmap, plot_heads, plot_vectors_2d

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
