"""Chapter 14's sampling: temperature, top-k, top-p, generation with a cropped context."""

from __future__ import annotations

import numpy as np
import pytest

from attention_lib import softmax
from attention_lib.training import (
    GPT,
    filter_top_k,
    filter_top_p,
    generate,
    next_token_probabilities,
    sample_next,
)


def test_top_k_of_one_is_greedy():
    logits = np.random.default_rng(0).standard_normal((50, 65))
    for seed in range(5):
        drawn = sample_next(logits, np.random.default_rng(seed), temperature=1.7, top_k=1)
        np.testing.assert_array_equal(drawn, logits.argmax(axis=-1))


def test_top_k_keeps_the_k_largest():
    logits = np.array([[0.1, 2.0, -1.0, 1.5, 0.3]])
    kept = np.isfinite(filter_top_k(logits, 2))
    np.testing.assert_array_equal(kept, [[False, True, False, True, False]])
    assert np.isfinite(filter_top_k(logits, 99)).all()  # more than V keeps everything


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    probabilities = np.array([0.1, 0.4, 0.05, 0.25, 0.2])
    logits = np.log(probabilities)
    cases = {0.4: [1], 0.41: [1, 3], 0.65: [1, 3], 0.66: [1, 3, 4], 0.85: [1, 3, 4],
             0.9: [1, 3, 4, 0], 1.0: [0, 1, 2, 3, 4]}
    for p, expected in cases.items():
        kept = np.flatnonzero(np.isfinite(filter_top_p(logits, p)))
        np.testing.assert_array_equal(kept, sorted(expected), err_msg=f"top_p={p}")


def test_top_p_nucleus_is_minimal_on_random_rows():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((200, 65)) * 2
    probabilities = softmax(logits)
    for p in (0.1, 0.5, 0.9, 0.99):
        kept = np.isfinite(filter_top_p(logits, p))
        mass = np.where(kept, probabilities, 0).sum(axis=-1)
        smallest_kept = np.where(kept, probabilities, np.inf).min(axis=-1)
        largest_cut = np.where(kept, -np.inf, probabilities).max(axis=-1)
        assert np.all(mass >= p - 1e-12)  # reaches p ...
        assert np.all(mass - smallest_kept < p)  # ... and would not without its last token
        assert np.all(smallest_kept >= largest_cut)  # and it is the most probable tokens


def test_probabilities_are_renormalised_after_filtering():
    logits = np.random.default_rng(2).standard_normal((3, 65))
    probabilities = next_token_probabilities(logits, temperature=0.7, top_k=10, top_p=0.8)
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0)
    assert np.all((probabilities > 0).sum(axis=-1) <= 10)
    np.testing.assert_allclose(next_token_probabilities(logits, temperature=2.0),
                               softmax(logits / 2.0))


def test_sampling_frequencies_follow_the_probabilities():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    draws = sample_next(np.tile(logits, (20_000, 1)), np.random.default_rng(3))
    frequencies = np.bincount(draws, minlength=3) / draws.size
    np.testing.assert_allclose(frequencies, [0.5, 0.3, 0.2], atol=0.01)


def test_sampling_never_draws_a_filtered_token():
    logits = np.random.default_rng(4).standard_normal((5000, 65))
    draws = sample_next(logits, np.random.default_rng(5), top_k=3)
    top3 = np.argsort(-logits, axis=-1)[:, :3]
    assert np.all((top3 == draws[:, None]).any(axis=-1))


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": 0.0}, "temperature"), ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"top_k": 0}, "top_k"),
    ({"top_k": 2.5}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_p": -0.2}, "top_p"),
])
def test_bad_sampling_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_next(np.zeros(4), np.random.default_rng(0), **kwargs)
    model = GPT.init(65, 8, 16, 2, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match=message):
        generate(model, np.array([1, 2]), 3, np.random.default_rng(0), **kwargs)


def test_generate_is_seeded_and_crops_long_prompts_from_the_left():
    model = GPT.init(65, 8, 16, 2, 1, np.random.default_rng(6))
    prompt = np.random.default_rng(7).integers(0, 65, 20)  # longer than context_len=8
    out = generate(model, prompt, 5, np.random.default_rng(8), temperature=0.8)
    assert out.shape == (25,)
    np.testing.assert_array_equal(out[:20], prompt)
    again = generate(model, prompt, 5, np.random.default_rng(8), temperature=0.8)
    np.testing.assert_array_equal(out, again)
    # Only the last context_len tokens matter: the cropped prompt continues the same way.
    cropped = generate(model, prompt[-8:], 5, np.random.default_rng(8), temperature=0.8)
    np.testing.assert_array_equal(out[20:], cropped[8:])
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, np.array([], dtype=int), 3, np.random.default_rng(0))


def test_cached_forward_equals_the_full_forward():
    model = GPT.init(65, 8, 16, 2, 2, np.random.default_rng(9), dtype=np.float64)
    ids = np.random.default_rng(10).integers(0, 65, (1, 8))
    cache = model.new_cache()
    first = model.forward(ids[:, :5], cache=cache)
    rest = [model.forward(ids[:, t:t + 1], cache=cache) for t in range(5, 8)]
    np.testing.assert_allclose(np.concatenate([first, *rest], axis=1), model.forward(ids),
                               atol=1e-12)
    with pytest.raises(ValueError, match="context_len=8"):
        model.forward(ids[:, :1], cache=cache)  # full
