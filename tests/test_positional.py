"""sinusoidal_encoding, apply_rope, alibi_slopes and alibi_bias (chapter 07): hand-worked values,
a complex-number reference for RoPE, its relative-position property, ALiBi against the paper's
rule, bad input, and how positions break the permutation equivariance of attention."""

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import (
    MultiHeadAttention,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    causal_mask,
    init_linear_weight,
    scaled_dot_product_attention,
    sinusoidal_encoding,
)

# --------------------------------------------------------------------------- sinusoidal_encoding


@pytest.mark.parametrize("d", [1, 2, 7, 8, 64])
def test_position_zero_is_zero_one_zero_one(d):
    expected = np.tile([0.0, 1.0], d)[:d]
    np.testing.assert_array_equal(sinusoidal_encoding(3, d)[0], expected)


def test_hand_worked_entries_for_d_8():
    # With d = 8 the pair frequencies are 1/10000^(2i/8) = 1, 1/10, 1/100, 1/1000.
    encoding = sinusoidal_encoding(5, 8)
    assert encoding[1, 0] == pytest.approx(math.sin(1), abs=1e-15)
    assert encoding[1, 1] == pytest.approx(math.cos(1), abs=1e-15)
    assert encoding[3, 2] == pytest.approx(math.sin(0.3), abs=1e-15)
    assert encoding[3, 3] == pytest.approx(math.cos(0.3), abs=1e-15)
    assert encoding[4, 4] == pytest.approx(math.sin(0.04), abs=1e-15)
    assert encoding[2, 7] == pytest.approx(math.cos(0.002), abs=1e-15)


@pytest.mark.parametrize("d", [2, 6, 16, 7])
def test_every_entry_follows_the_papers_formula(d):
    encoding = sinusoidal_encoding(9, d)
    for t in range(9):
        for column in range(d):
            i = column // 2
            angle = t / 10000 ** (2 * i / d)
            expected = math.sin(angle) if column % 2 == 0 else math.cos(angle)
            assert encoding[t, column] == pytest.approx(expected, abs=1e-12)


def test_a_different_base_changes_the_frequencies():
    # d = 4, base = 100: the second pair turns at 1/100^(2/4) = 1/10 per position.
    encoding = sinusoidal_encoding(4, 4, base=100.0)
    np.testing.assert_allclose(encoding[:, 2], np.sin(np.arange(4) / 10), rtol=0, atol=1e-15)
    np.testing.assert_allclose(encoding[:, 3], np.cos(np.arange(4) / 10), rtol=0, atol=1e-15)


@pytest.mark.parametrize("d", [1, 3, 5, 9])
def test_an_odd_width_gives_t_by_d_and_ends_with_a_sine_column(d):
    encoding = sinusoidal_encoding(6, d)
    assert encoding.shape == (6, d)
    last_angle = np.arange(6) / 10000 ** ((d - 1) / d)
    np.testing.assert_allclose(encoding[:, -1], np.sin(last_angle), rtol=0, atol=1e-15)


@pytest.mark.parametrize("d", [2, 4, 10, 128])
def test_every_row_has_norm_sqrt_d_over_2_for_even_d(d):
    encoding = sinusoidal_encoding(50, d)
    np.testing.assert_allclose(np.linalg.norm(encoding, axis=1), math.sqrt(d / 2), rtol=1e-12)


def test_values_lie_in_minus_one_to_one_and_rows_are_distinct():
    encoding = sinusoidal_encoding(200, 16)
    assert encoding.dtype == np.float64
    assert np.abs(encoding).max() <= 1.0
    distances = np.linalg.norm(encoding[:, None] - encoding[None, :], axis=-1)
    assert distances[~np.eye(200, dtype=bool)].min() > 1e-3


def test_shifting_the_position_rotates_each_pair_by_a_fixed_angle():
    # PE[t + k] = R(k) PE[t] pair by pair: the relative-offset property of section 3.5.
    d, k = 8, 5
    encoding = sinusoidal_encoding(30, d)
    for i in range(d // 2):
        angle = k / 10000 ** (2 * i / d)
        sin_t, cos_t = encoding[:-k, 2 * i], encoding[:-k, 2 * i + 1]
        np.testing.assert_allclose(encoding[k:, 2 * i],
                                   sin_t * math.cos(angle) + cos_t * math.sin(angle), atol=1e-12)
        np.testing.assert_allclose(encoding[k:, 2 * i + 1],
                                   cos_t * math.cos(angle) - sin_t * math.sin(angle), atol=1e-12)


@pytest.mark.parametrize(
    ("T", "d", "error", "name"),
    [
        (0, 4, ValueError, "T"),
        (-1, 4, ValueError, "T"),
        (2.0, 4, TypeError, "T"),
        (4, 0, ValueError, "d"),
        (4, "8", TypeError, "d"),
    ],
)
def test_bad_sizes_raise_naming_them(T, d, error, name):
    with pytest.raises(error, match=rf"^{name} must"):
        sinusoidal_encoding(T, d)


@pytest.mark.parametrize("base", [1.0, 0.5, 0.0, -10.0, math.inf, math.nan])
def test_a_base_that_is_not_a_finite_number_above_one_raises_naming_base(base):
    with pytest.raises(ValueError, match="base must be a finite number > 1"):
        sinusoidal_encoding(4, 4, base=base)


# --------------------------------------------------------------------------- apply_rope


def rope_with_complex_numbers(x, positions, base=10000.0):
    """RoPE as the RoFormer paper writes it: pair (x[2i], x[2i+1]) is the complex number
    x[2i] + 1j x[2i+1], multiplied by exp(1j p theta_i) with theta_i = base^(-2i/d)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    pairs = x[..., 0::2] + 1j * x[..., 1::2]  # (..., T, d/2)
    theta = base ** (-2.0 * np.arange(d // 2) / d)  # (d/2,)
    rotated = pairs * np.exp(1j * np.asarray(positions, dtype=np.float64)[..., None] * theta)
    out = np.empty(rotated.shape[:-1] + (d,))
    out[..., 0::2], out[..., 1::2] = rotated.real, rotated.imag
    return out


@st.composite
def rope_case(draw):
    """x of shape (*batch, H, T, d) (or no head axis), positions (T,) or offset per batch."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    heads = tuple(draw(st.sampled_from([(), (1,), (3,)])))
    T = draw(st.integers(1, 6))
    d = 2 * draw(st.integers(1, 8))
    base = draw(st.sampled_from([10000.0, 1e5]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    start = draw(st.integers(0, 2000))
    positions = start + np.arange(T)
    if draw(st.booleans()):
        positions = rng.permutation(positions)  # positions need not be sorted
    return rng.normal(size=(*batch, *heads, T, d)), positions, base


@given(case=rope_case())
def test_rope_equals_multiplying_each_pair_by_a_unit_complex_number_float64(case):
    x, positions, base = case
    rotated = apply_rope(x, positions, base=base)
    assert rotated.shape == x.shape and rotated.dtype == np.float64
    np.testing.assert_allclose(rotated, rope_with_complex_numbers(x, positions, base),
                               rtol=0, atol=1e-12)


@given(case=rope_case())
def test_rope_equals_multiplying_each_pair_by_a_unit_complex_number_float32(case):
    x, positions, base = case
    x = x.astype(np.float32)
    rotated = apply_rope(x, positions, base=base)
    assert rotated.shape == x.shape and rotated.dtype == np.float32
    np.testing.assert_allclose(rotated, rope_with_complex_numbers(x, positions, base),
                               rtol=0, atol=1e-5)


def test_rope_of_one_pair_at_position_one_is_a_rotation_by_one_radian():
    np.testing.assert_allclose(apply_rope(np.array([[1.0, 0.0]]), [1]),
                               [[math.cos(1), math.sin(1)]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(apply_rope(np.array([[0.0, 1.0]]), [1]),
                               [[-math.sin(1), math.cos(1)]], rtol=0, atol=1e-15)


def test_rope_pairs_adjacent_features_not_the_two_halves():
    # Interleaved layout: only feature 1 moves into feature 0's pair, feature 2 stays apart.
    x = np.zeros((1, 4))
    x[0, 0] = 1.0
    rotated = apply_rope(x, [1])
    assert rotated[0, 1] == pytest.approx(math.sin(1), abs=1e-15)
    assert rotated[0, 2] == 0.0 and rotated[0, 3] == 0.0


def test_rope_accepts_one_position_set_per_batch_element():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4, 8))  # (B, H, T, d)
    positions = np.array([[0, 1, 2, 3], [7, 8, 9, 10]])[:, None, :]  # (B, 1, T)
    rotated = apply_rope(x, positions)
    assert rotated.shape == x.shape
    for b in range(2):
        np.testing.assert_allclose(rotated[b], apply_rope(x[b], positions[b, 0]), atol=1e-15)


@given(
    d=st.integers(1, 16).map(lambda n: 2 * n),
    m=st.integers(0, 1000),
    n=st.integers(0, 1000),
    shift=st.integers(-1000, 1000),
    seed=st.integers(0, 2**32 - 1),
)
def test_rotated_query_key_dot_products_depend_only_on_m_minus_n(d, m, n, shift, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(1, d)), rng.normal(size=(1, d))
    score = (apply_rope(q, [m]) @ apply_rope(k, [n]).T).item()
    shifted = (apply_rope(q, [m + shift]) @ apply_rope(k, [n + shift]).T).item()
    assert shifted == pytest.approx(score, abs=1e-9)


def test_the_rotated_dot_product_does_change_with_the_offset():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(1, 8)), rng.normal(size=(1, 8))
    scores = [(apply_rope(q, [m]) @ apply_rope(k, [0]).T).item() for m in range(4)]
    assert min(abs(a - b) for a in scores for b in scores if a is not b) > 1e-3


@given(case=rope_case())
def test_rope_preserves_the_norm_of_every_pair_and_every_vector(case):
    x, positions, base = case
    rotated = apply_rope(x, positions, base=base)
    np.testing.assert_allclose(np.hypot(rotated[..., 0::2], rotated[..., 1::2]),
                               np.hypot(x[..., 0::2], x[..., 1::2]), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-12)


def test_rope_at_position_zero_is_the_identity():
    x = np.random.default_rng(2).normal(size=(2, 3, 5, 8))
    np.testing.assert_array_equal(apply_rope(x, np.zeros(5, dtype=int)), x)


@given(a=st.integers(-500, 500), b=st.integers(-500, 500), seed=st.integers(0, 2**32 - 1))
def test_rotating_by_a_then_by_b_is_rotating_by_a_plus_b(a, b, seed):
    x = np.random.default_rng(seed).normal(size=(3, 4, 10))
    positions_a, positions_b = a + np.arange(4), b + np.arange(4)
    np.testing.assert_allclose(apply_rope(apply_rope(x, positions_a), positions_b),
                               apply_rope(x, positions_a + positions_b), rtol=0, atol=1e-10)


def test_rope_keeps_float32_and_turns_integers_into_float64():
    assert apply_rope(np.ones((3, 4), dtype=np.float32), np.arange(3)).dtype == np.float32
    assert apply_rope(np.ones((3, 4), dtype=int), np.arange(3)).dtype == np.float64


@pytest.mark.parametrize("d", [1, 3, 7])
def test_rope_of_an_odd_width_raises_naming_d(d):
    with pytest.raises(ValueError, match=rf"even number of features; x has d={d}"):
        apply_rope(np.zeros((3, d)), np.arange(3))


def test_rope_of_a_one_dimensional_input_raises_naming_x():
    with pytest.raises(ValueError, match="x must have at least 2 dimensions"):
        apply_rope(np.zeros(4), [0])


@pytest.mark.parametrize(
    ("x_shape", "positions_shape"),
    [((4, 6), (5,)), ((2, 4, 6), (3,)), ((2, 4, 6), (3, 4))],
)
def test_positions_that_do_not_broadcast_raise_naming_positions(x_shape, positions_shape):
    with pytest.raises(ValueError, match=re.escape(f"positions of shape {positions_shape}")):
        apply_rope(np.zeros(x_shape), np.zeros(positions_shape, dtype=int))


@pytest.mark.parametrize(
    ("x_shape", "positions_shape"),
    [((4, 6), (4, 1)), ((4, 6), (2, 4)), ((3, 4, 6), (2, 1, 4))],
    ids=["column-of-positions", "extra-leading-axis", "extra-batch-axis"],
)
def test_positions_that_would_change_the_output_shape_raise(x_shape, positions_shape):
    # The documented contract: the result has x's shape, and positions that do not broadcast
    # TO x.shape[:-1] raise. Broadcasting the other way would silently grow the output, e.g.
    # a column np.arange(T)[:, None] would give a (T, T, d) result.
    with pytest.raises(ValueError, match="positions"):
        apply_rope(np.ones(x_shape), np.zeros(positions_shape, dtype=int))


# --------------------------------------------------------------------------- ALiBi


def paper_alibi_slopes(n):
    """The slopes as the ALiBi paper's reference code (Press et al., 2022) computes them."""

    def power_of_2_slopes(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2_slopes(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2_slopes(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_for_eight_heads_are_the_powers_two_to_minus_1_to_minus_8():
    np.testing.assert_array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))


def test_alibi_slopes_for_six_heads_take_four_heads_then_every_other_of_eight():
    np.testing.assert_array_equal(
        alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    )


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 7, 12, 16, 20, 32, 48])
def test_alibi_slopes_equal_the_papers_reference_code(num_heads):
    slopes = alibi_slopes(num_heads)
    assert slopes.shape == (num_heads,)
    np.testing.assert_allclose(slopes, paper_alibi_slopes(num_heads), rtol=1e-14)


@pytest.mark.parametrize(("num_heads", "error"), [(0, ValueError), (2.0, TypeError)])
def test_alibi_slopes_reject_a_bad_number_of_heads_naming_it(num_heads, error):
    with pytest.raises(error, match="num_heads"):
        alibi_slopes(num_heads)


@pytest.mark.parametrize(("num_heads", "Tq", "Tk"), [(4, 5, None), (3, 2, 6), (1, 1, 1)])
def test_alibi_bias_is_minus_slope_times_distance_with_queries_last(num_heads, Tq, Tk):
    bias = alibi_bias(num_heads, Tq, Tk)
    Tk = Tq if Tk is None else Tk
    assert bias.shape == (num_heads, Tq, Tk)
    slopes = alibi_slopes(num_heads)
    for h in range(num_heads):
        for i in range(Tq):
            query_position = Tk - Tq + i
            for j in range(Tk):
                assert bias[h, i, j] == -slopes[h] * abs(query_position - j)


def test_alibi_bias_on_the_diagonal_is_plus_zero():
    bias = alibi_bias(2, 4)
    diagonal = bias[:, np.arange(4), np.arange(4)]
    np.testing.assert_array_equal(diagonal, 0.0)
    assert not np.signbit(diagonal).any()


def test_alibi_bias_with_more_queries_than_keys_raises_naming_tq_and_tk():
    with pytest.raises(ValueError, match=r"Tq=5 > Tk=3"):
        alibi_bias(2, 5, 3)


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [((2, 0), ValueError, "Tq"), ((2, 3, 0), ValueError, "Tk"), ((0, 3), ValueError, "num_heads"),
     ((2, 3.0), TypeError, "Tq")],
)
def test_alibi_bias_rejects_bad_sizes_naming_them(args, error, name):
    with pytest.raises(error, match=name):
        alibi_bias(*args)


def manual_attention_with_bias(q, k, v, bias, mask):
    """softmax(q k^T / sqrt(d) + bias) v with blocked scores removed, written out."""
    scores = np.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1]) + bias
    scores = np.where(mask, scores, -np.inf)
    exps = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = exps / exps.sum(axis=-1, keepdims=True)
    return weights @ v, weights


@pytest.mark.parametrize(("Tq", "Tk"), [(6, 6), (2, 6), (1, 5)])
def test_attention_with_an_alibi_bias_equals_softmax_of_scores_plus_bias(Tq, Tk):
    rng = np.random.default_rng(3)
    B, H, d = 2, 4, 8
    q, k, v = (rng.normal(size=(B, H, T, d)) for T in (Tq, Tk, Tk))
    bias, mask = alibi_bias(H, Tq, Tk), causal_mask(Tq, Tk)
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    expected_output, expected_weights = manual_attention_with_bias(q, k, v, bias, mask)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(output, expected_output, rtol=1e-12, atol=1e-14)


def test_with_equal_scores_alibi_prefers_the_nearest_key_more_in_steeper_heads():
    H, T = 4, 5
    zeros = np.zeros((H, T, 2))
    _, weights = scaled_dot_product_attention(zeros, zeros, zeros, mask=causal_mask(T),
                                              bias=alibi_bias(H, T))
    last_row = weights[:, -1]  # (H, Tk): the last query sees every key
    assert np.all(np.diff(last_row, axis=-1) > 0)  # nearer keys weigh more
    assert np.all(np.diff(last_row[:, -1]) < 0)  # steeper slope (earlier head), more on itself


def test_an_alibi_bias_keeps_float32_attention_float32():
    rng = np.random.default_rng(4)
    q = k = v = rng.normal(size=(2, 4, 3)).astype(np.float32)
    output, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(4),
                                                   bias=alibi_bias(2, 4))
    assert output.dtype == weights.dtype == np.float32


@pytest.mark.parametrize("bias_shape", [(3, 4, 4), (4, 5), (2, 4, 3)])
def test_a_bias_that_does_not_broadcast_raises_naming_bias(bias_shape):
    q = k = v = np.zeros((2, 4, 3))  # (H, T, d): scores (2, 4, 4)
    with pytest.raises(ValueError, match=re.escape(f"bias of shape {bias_shape}")):
        scaled_dot_product_attention(q, k, v, bias=np.zeros(bias_shape))


# --------------------------------------------------------------------------- positions break
# --------------------------------------------------------------------------- permutation symmetry


def sinusoidal_case(d_model, num_heads, T, seed):
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention.init(d_model, num_heads, rng)
    return mha, rng.normal(size=(T, d_model)), sinusoidal_encoding(T, d_model)


def test_with_sinusoidal_positions_identical_tokens_get_different_outputs():
    # Identical tokens make x[permutation] == x, so without positions the outputs are equal
    # rows and every permutation of them is the same; with x + PE they must differ by position.
    mha = MultiHeadAttention.init(16, 4, np.random.default_rng(5))
    x = np.tile(np.random.default_rng(6).normal(size=16), (5, 1))  # 5 copies of one token
    without_positions, _ = mha(x)
    np.testing.assert_allclose(without_positions, without_positions[[4, 3, 2, 1, 0]],
                               rtol=1e-12, atol=1e-14)
    with_positions, _ = mha(x + sinusoidal_encoding(5, 16))
    reversed_rows = with_positions[[4, 3, 2, 1, 0]]
    assert np.abs(with_positions - reversed_rows).max() > 1e-2


def test_with_sinusoidal_positions_permuting_tokens_does_not_permute_the_outputs():
    mha, x, encoding = sinusoidal_case(16, 4, 6, seed=7)
    permutation = np.array([1, 0, 2, 3, 4, 5])  # swap the first two tokens
    output, _ = mha(x + encoding)
    permuted_output, _ = mha(x[permutation] + encoding)
    assert np.abs(permuted_output - output[permutation]).max() > 1e-2
    # the same swap without positions does just permute the outputs
    np.testing.assert_allclose(mha(x[permutation])[0], mha(x)[0][permutation], atol=1e-12)


@given(
    sizes=st.sampled_from([(8, 2), (12, 3), (16, 4)]),
    T=st.integers(2, 7),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_with_sinusoidal_positions_no_reordering_just_permutes_the_outputs(sizes, T, seed, data):
    permutation = data.draw(
        st.permutations(range(T)).filter(lambda p: list(p) != list(range(T))), label="permutation"
    )
    mha, x, encoding = sinusoidal_case(*sizes, T, seed)
    output, _ = mha(x + encoding)
    permuted_output, _ = mha(x[permutation] + encoding)
    assert not np.allclose(permuted_output, output[permutation], rtol=0, atol=1e-6)


def rope_attention(x, W_q, W_k, W_v):
    """Single-head self-attention with RoPE applied to the queries and keys."""
    positions = np.arange(x.shape[-2])
    q, k = apply_rope(x @ W_q, positions), apply_rope(x @ W_k, positions)
    return scaled_dot_product_attention(q, k, x @ W_v)


def rope_projections(d_model, seed):
    rng = np.random.default_rng(seed)
    return tuple(init_linear_weight(d_model, d_model, rng) for _ in range(3))


def test_with_rope_permuting_tokens_does_not_permute_the_outputs_or_weights():
    W_q, W_k, W_v = rope_projections(8, seed=8)
    x = np.random.default_rng(9).normal(size=(5, 8))
    permutation = np.array([4, 1, 2, 3, 0])  # swap the first and the last token
    output, weights = rope_attention(x, W_q, W_k, W_v)
    permuted_output, permuted_weights = rope_attention(x[permutation], W_q, W_k, W_v)
    assert np.abs(permuted_output - output[permutation]).max() > 1e-2
    assert np.abs(permuted_weights - weights[permutation][:, permutation]).max() > 1e-2
    # without RoPE the same projections are permutation equivariant
    plain_output, _ = scaled_dot_product_attention(x @ W_q, x @ W_k, x @ W_v)
    plain_permuted, _ = scaled_dot_product_attention(*(x[permutation] @ W for W in (W_q, W_k, W_v)))
    np.testing.assert_allclose(plain_permuted, plain_output[permutation], atol=1e-12)


@given(
    d_model=st.sampled_from([4, 8, 16]),
    T=st.integers(2, 7),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_with_rope_no_reordering_just_permutes_the_outputs_or_weights(d_model, T, seed, data):
    permutation = data.draw(
        st.permutations(range(T)).filter(lambda p: list(p) != list(range(T))), label="permutation"
    )
    W_q, W_k, W_v = rope_projections(d_model, seed)
    x = np.random.default_rng(seed + 1).normal(size=(T, d_model))
    output, weights = rope_attention(x, W_q, W_k, W_v)
    permuted_output, permuted_weights = rope_attention(x[permutation], W_q, W_k, W_v)
    assert not np.allclose(permuted_output, output[permutation], rtol=0, atol=1e-6)
    assert not np.allclose(permuted_weights, weights[permutation][:, permutation],
                           rtol=0, atol=1e-6)
