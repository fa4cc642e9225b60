"""Chapter 17's sampling rules: min-p, the repetition penalty, and their order with chapter 14's.

Each rule is checked against its definition computed another way: top-p against a brute force
over every subset of a small vocabulary, min-p against the probabilities in float64, the
penalty against its two-case formula, and the order (penalty, temperature, top-k, top-p, min-p)
against hand-made cases where another order would give another answer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attention_lib import softmax
from attention_lib.training import GPT
from attention_lib.training.sampling import (
    apply_repetition_penalty,
    filter_min_p,
    filter_top_p,
    generate,
    next_token_probabilities,
    sample_next,
)


def kept(logits):
    return np.isfinite(logits)


# -- top-k and top-p ---------------------------------------------------------------------------

def test_top_k_of_one_is_greedy_with_every_other_rule_on():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((40, 30)) * 3
    previous = rng.integers(0, 30, (40, 5))
    penalised = apply_repetition_penalty(logits, previous, 1.5)
    for seed in range(3):
        drawn = sample_next(logits, np.random.default_rng(seed), temperature=1.7, top_k=1,
                            top_p=0.9, min_p=0.05, repetition_penalty=1.5,
                            previous_ids=previous)
        np.testing.assert_array_equal(drawn, penalised.argmax(axis=-1))


def brute_force_nucleus(probabilities, p):
    """The smallest set of tokens with mass >= p; among sets of that size, the heaviest."""
    tokens = range(len(probabilities))
    for size in range(1, len(probabilities) + 1):
        sets = [s for s in itertools.combinations(tokens, size)
                if probabilities[list(s)].sum() >= p]
        if sets:
            return set(max(sets, key=lambda s: probabilities[list(s)].sum()))
    raise AssertionError("unreachable: the whole vocabulary has mass 1")


@pytest.mark.parametrize("seed", range(8))
def test_top_p_keeps_the_smallest_set_with_mass_p_as_a_brute_force_finds_it(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 8))
    logits = rng.standard_normal(V) * 2
    probabilities = softmax(logits)
    for p in rng.uniform(0.05, 1.0, size=10):
        sums = [probabilities[list(s)].sum() for size in range(1, V + 1)
                for s in itertools.combinations(range(V), size)]
        if np.min(np.abs(np.array(sums) - p)) < 1e-9:
            continue  # a subset's mass equals p up to rounding: not a fair test
        expected = brute_force_nucleus(probabilities, p)
        got = set(np.flatnonzero(kept(filter_top_p(logits, p))).tolist())
        assert got == expected, f"p={p}"


# -- min-p -------------------------------------------------------------------------------------

def test_min_p_keeps_exactly_the_tokens_at_least_min_p_times_the_top_probability():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((200, 50)) * 2
    probabilities = softmax(logits.astype(np.float64))
    for min_p in (0.01, 0.1, 0.3, 0.7):
        ratios = probabilities / probabilities.max(axis=-1, keepdims=True)
        assert np.min(np.abs(ratios - min_p)) > 1e-9  # no token sits on the threshold
        expected = probabilities >= min_p * probabilities.max(axis=-1, keepdims=True)
        np.testing.assert_array_equal(kept(filter_min_p(logits, min_p)), expected)


def test_min_p_on_a_hand_made_distribution():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    # threshold 0.125 * 0.4 = 0.05: 0.06 stays, 0.04 goes
    np.testing.assert_array_equal(kept(filter_min_p(logits, 0.125)),
                                  [True, True, True, True, False])
    np.testing.assert_array_equal(kept(filter_min_p(logits, 0.6)),  # 0.24: 0.3 stays
                                  [True, True, False, False, False])
    assert kept(filter_min_p(logits, 0.0)).all()
    np.testing.assert_array_equal(kept(filter_min_p(logits, 1.0)),
                                  [True, False, False, False, False])
    ties = np.array([1.0, 3.0, 3.0, 2.0])
    np.testing.assert_array_equal(kept(filter_min_p(ties, 1.0)), [False, True, True, False])


def test_min_p_keeps_dtype_and_kept_logits_and_handles_minus_inf():
    logits = np.array([[0.5, -np.inf, 2.0, 1.9]], dtype=np.float32)
    out = filter_min_p(logits, 0.5)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([[-np.inf, -np.inf, 2.0, 1.9]], np.float32))
    assert not np.isnan(filter_min_p(np.full(3, -np.inf), 0.5)).any()


def test_min_p_acts_on_the_tempered_distribution():
    # After temperature T, min-p keeps the logits within T * log(1 / min_p) of the largest.
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    for temperature, expected_count in ((0.5, 1), (1.0, 2), (2.0, 4)):
        probabilities = next_token_probabilities(logits, temperature, min_p=0.2)
        margin = temperature * np.log(1 / 0.2)  # 0.80, 1.61, 3.22
        np.testing.assert_array_equal(probabilities > 0, logits >= logits.max() - margin)
        assert (probabilities > 0).sum() == expected_count


def test_min_p_sampling_frequencies_follow_the_renormalised_kept_probabilities():
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.tile(np.log(probabilities), (20_000, 1))
    draws = sample_next(logits, np.random.default_rng(2), min_p=0.2)  # cuts 0.05 < 0.1
    frequencies = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(frequencies, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0],
                               atol=0.01)


# -- the repetition penalty --------------------------------------------------------------------

def test_penalty_divides_positive_logits_and_multiplies_negative_ones():
    logits = np.array([3.0, -2.0, 0.0, 1.5, -0.5])
    out = apply_repetition_penalty(logits, [0, 1, 2, 0, 0], 2.0)  # token 0 three times
    np.testing.assert_allclose(out, [1.5, -4.0, 0.0, 1.5, -0.5])  # once each; 3, 4 untouched
    # Both directions make the token less likely than before, never more.
    before, after = softmax(logits), softmax(out)
    assert after[0] < before[0] and after[1] < before[1]
    # A penalty below 1 rewards repetition: the opposite moves.
    rewarded = apply_repetition_penalty(logits, [0, 1], 0.5)
    np.testing.assert_allclose(rewarded[:2], [6.0, -1.0])
    np.testing.assert_array_equal(apply_repetition_penalty(logits, [0, 1], 1.0), logits)
    np.testing.assert_array_equal(apply_repetition_penalty(logits, [], 2.0), logits)


def test_penalty_takes_one_list_for_all_rows_or_one_per_row():
    logits = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    shared = apply_repetition_penalty(logits, [2], 2.0)
    np.testing.assert_allclose(shared, [[1, 2, 1.5], [1, 2, 1.5]])
    per_row = apply_repetition_penalty(logits, [[0, 0], [1, 2]], 2.0)
    np.testing.assert_allclose(per_row, [[0.5, 2, 3], [1, 1, 1.5]])
    assert per_row.dtype == np.float32


def test_penalty_comes_before_the_filters():
    # Token 0 is the most probable; penalised, token 1 overtakes it, so top-k=1 picks 1.
    logits = np.array([2.0, 1.8, -1.0])
    probabilities = next_token_probabilities(logits, top_k=1, repetition_penalty=1.5,
                                             previous_ids=[0])
    np.testing.assert_array_equal(probabilities, [0.0, 1.0, 0.0])
    # ... and the penalty commutes with temperature (both scale a logit, the sign stays).
    for temperature in (0.3, 1.0, 2.5):
        np.testing.assert_allclose(
            next_token_probabilities(logits, temperature, repetition_penalty=1.5,
                                     previous_ids=[0, 2]),
            softmax(apply_repetition_penalty(logits / temperature, [0, 2], 1.5)))


def test_rules_off_or_at_their_identity_values_change_nothing():
    logits = np.random.default_rng(3).standard_normal((4, 20))
    reference = next_token_probabilities(logits, 0.8, 7, 0.9)
    same = next_token_probabilities(logits, 0.8, 7, 0.9, min_p=0.0, repetition_penalty=1.0,
                                    previous_ids=[1, 2, 3])
    np.testing.assert_allclose(same, reference, rtol=0, atol=0)


# -- seeds and generation ----------------------------------------------------------------------

def test_sampling_with_every_rule_is_reproducible_with_a_seed():
    logits = np.random.default_rng(4).standard_normal((100, 40)) * 2
    kwargs = dict(temperature=1.3, top_k=20, top_p=0.95, min_p=0.05, repetition_penalty=1.2,
                  previous_ids=[1, 5, 9])
    first = sample_next(logits, np.random.default_rng(7), **kwargs)
    second = sample_next(logits, np.random.default_rng(7), **kwargs)
    other = sample_next(logits, np.random.default_rng(8), **kwargs)
    np.testing.assert_array_equal(first, second)
    assert (first != other).any()


def test_generate_applies_the_penalty_to_the_prompt_and_the_generated_text():
    model = GPT.init(20, 16, 16, 2, 1, np.random.default_rng(5), dtype=np.float64)
    prompt = np.array([3, 7, 3, 1])
    for last_n in (None, 2):
        out = generate(model, prompt, 6, np.random.default_rng(0), top_k=1,
                       repetition_penalty=1.8, penalty_last_n=last_n)
        # The same loop written out: no cache, the whole context each time, argmax.
        ids = prompt.copy()
        for _ in range(6):
            logits = model.forward(ids[None])[0, -1]
            window = ids if last_n is None else ids[-last_n:]
            ids = np.append(ids, apply_repetition_penalty(logits, window, 1.8).argmax())
        np.testing.assert_array_equal(out, ids, err_msg=f"penalty_last_n={last_n}")
    plain = generate(model, prompt, 6, np.random.default_rng(0), top_k=1)
    penalised = generate(model, prompt, 6, np.random.default_rng(0), top_k=1,
                         repetition_penalty=1.8)
    assert (plain != penalised).any()  # the penalty changed the greedy continuation


def test_generate_is_seeded_with_min_p_and_a_penalty():
    model = GPT.init(20, 16, 16, 2, 1, np.random.default_rng(6))
    kwargs = dict(temperature=1.5, min_p=0.1, repetition_penalty=1.3, penalty_last_n=4)
    first = generate(model, np.array([1, 2]), 10, np.random.default_rng(9), **kwargs)
    again = generate(model, np.array([1, 2]), 10, np.random.default_rng(9), **kwargs)
    np.testing.assert_array_equal(first, again)


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"min_p": -0.1}, "min_p"), ({"min_p": 1.5}, "min_p"), ({"min_p": float("nan")}, "min_p"),
    ({"min_p": True}, "min_p"), ({"min_p": "0.1"}, "min_p"),
    ({"repetition_penalty": 0.0, "previous_ids": [1]}, "repetition_penalty"),
    ({"repetition_penalty": -1.2, "previous_ids": [1]}, "repetition_penalty"),
    ({"repetition_penalty": float("inf"), "previous_ids": [1]}, "repetition_penalty"),
    ({"repetition_penalty": float("nan"), "previous_ids": [1]}, "repetition_penalty"),
    ({"repetition_penalty": True, "previous_ids": [1]}, "repetition_penalty"),
    ({"repetition_penalty": 1.2}, "needs previous_ids"),
    ({"repetition_penalty": 1.2, "previous_ids": [4]}, r"\[0, 4\)"),
    ({"repetition_penalty": 1.2, "previous_ids": [-1]}, r"\[0, 4\)"),
    ({"repetition_penalty": 1.2, "previous_ids": [1.0]}, "integer"),
    ({"repetition_penalty": 1.2, "previous_ids": 1}, "scalar"),
    ({"repetition_penalty": 1.2, "previous_ids": [[1], [2]]}, "shape"),
])
def test_bad_rule_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_next(np.zeros(4), np.random.default_rng(0), **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"min_p": 2.0}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": 1.2, "penalty_last_n": 0}, "penalty_last_n"),
    ({"repetition_penalty": 1.2, "penalty_last_n": 2.5}, "penalty_last_n"),
    ({"penalty_last_n": -3}, "penalty_last_n"),
])
def test_generate_checks_the_new_arguments_before_any_work(kwargs, message):
    model = GPT.init(20, 8, 16, 2, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match=message):
        generate(model, np.array([1, 2]), 3, np.random.default_rng(0), **kwargs)
