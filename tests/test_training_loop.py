"""The training loop, the progress bar and the two generated tasks of attention_lib.training:
training really reduces the loss (and learns reversal), the printed progress is reproducible,
a diverging run stops with a clear error, and the data follow their stated rules."""

import numpy as np
import pytest

from attention_lib.training import (
    SENTIMENT_VOCAB,
    Adam,
    EncoderModel,
    decode_words,
    loss_and_grads,
    model_forward,
    negation_sentiment_data,
    progress_bar,
    reversal_data,
    train,
)


def reversal_run(num_steps, log_every=None, print_fn=print, seed=0):
    rng = np.random.default_rng(seed)
    held_out, _ = reversal_data(rng, 200, length=4, num_digits=5)
    model = EncoderModel.init(5, 4, 16, 2, 32, 1, 5, rng)
    optimizer = Adam(model.parameters(), lr=3e-3)
    data_rng = np.random.default_rng(seed + 1)
    losses = train(lambda batch: loss_and_grads(model, *batch), optimizer,
                   lambda step: reversal_data(data_rng, 32, 4, 5, exclude=held_out),
                   num_steps, clip_norm=1.0, log_every=log_every, print_fn=print_fn)
    return model, losses, held_out


def test_training_reduces_the_loss_and_learns_to_reverse_short_sequences():
    model, losses, held_out = reversal_run(150)
    assert losses.shape == (150,)
    assert losses[:10].mean() > 1.4  # about log(5) = 1.61 at the start
    assert losses[-10:].mean() < 0.2 * losses[:10].mean()
    predictions = model_forward(model, held_out)[0].argmax(axis=-1)
    assert (predictions == held_out[:, ::-1]).mean() > 0.9


def test_training_is_reproducible_with_the_same_seeds():
    _, first, _ = reversal_run(20)
    _, second, _ = reversal_run(20)
    np.testing.assert_array_equal(first, second)


def test_progress_lines_are_printed_every_log_every_steps_and_at_the_end():
    lines = []
    _, losses, _ = reversal_run(25, log_every=10, print_fn=lines.append)
    assert [line.split("]")[1].split("loss")[0].strip() for line in lines] == [
        "10/25", "20/25", "25/25"]
    assert lines[0] == progress_bar(10, 25, losses[:10].mean())
    assert lines[-1].startswith("[" + "#" * 20 + "]")


def test_progress_bar_has_no_clock_in_it():
    assert progress_bar(3, 10, 0.123456, width=10) == "[###-------]  3/10  loss 0.1235"


def test_a_loss_that_becomes_nan_stops_training_with_a_clear_error():
    params = {"w": np.ones(2)}
    losses = iter([1.0, float("nan")])
    with pytest.raises(FloatingPointError, match="nan at step 1"):
        train(lambda batch: (next(losses), {"w": np.ones(2)}), Adam(params), iter([0, 0, 0]), 3)


def test_lr_schedule_sets_the_learning_rate_of_every_step():
    seen = []

    class Recorder:
        lr = None

        def step(self, grads):
            seen.append(self.lr)

    train(lambda batch: (0.0, {}), Recorder(), iter(range(4)), 4,
          lr_schedule=lambda step: 0.1 * (step + 1))
    np.testing.assert_allclose(seen, [0.1, 0.2, 0.3, 0.4])


def test_adam_refuses_a_missing_gradient_and_bad_settings():
    params = {"w": np.ones(2), "b": np.zeros(1)}
    with pytest.raises(ValueError, match=r"no gradient for the parameters \['b'\]"):
        Adam(params).step({"w": np.ones(2)})
    with pytest.raises(ValueError, match="lr must be positive"):
        Adam(params, lr=0.0)
    with pytest.raises(ValueError, match="float numpy array"):
        Adam({"w": [1.0, 2.0]})


# --------------------------------------------------------------------------- the tasks


def test_reversal_targets_are_the_inputs_reversed_and_avoid_excluded_sequences():
    rng = np.random.default_rng(0)
    # Exclude 80 of the 3**4 = 81 sequences: only (2, 2, 2, 2) is left to draw.
    every = np.stack(np.meshgrid(*[np.arange(3)] * 4, indexing="ij"), -1).reshape(-1, 4)
    keep = np.array([2, 2, 2, 2])
    excluded = every[~(every == keep).all(axis=1)]
    inputs, targets = reversal_data(rng, 10, length=4, num_digits=3, exclude=excluded)
    np.testing.assert_array_equal(inputs, np.tile(keep, (10, 1)))
    inputs, targets = reversal_data(rng, 50, length=6)
    np.testing.assert_array_equal(targets, inputs[:, ::-1])
    with pytest.raises(ValueError, match="every possible sequence"):
        reversal_data(rng, 1, length=4, num_digits=3, exclude=every)


def test_negation_labels_follow_the_stated_rule():
    tokens, lengths, labels, kinds = negation_sentiment_data(np.random.default_rng(1), 600)
    not_id = SENTIMENT_VOCAB.index("not")
    positive = {SENTIMENT_VOCAB.index(w) for w in ("good", "great", "fun", "superb")}
    negative = {SENTIMENT_VOCAB.index(w) for w in ("bad", "dull", "boring", "awful")}
    for sentence, length, label, kind in zip(tokens, lengths, labels, kinds):
        assert (sentence[length:] == 0).all() and (sentence[:length] != 0).all()
        words = list(sentence[:length])
        sentiment = [i for i, t in enumerate(words) if t in positive | negative]
        assert len(sentiment) == 1
        position = sentiment[0]
        negated = position > 0 and words[position - 1] == not_id
        assert words.count(not_id) == (0 if kind == 0 else 1)
        assert negated == (kind == 1)
        polarity = int(words[position] in positive)
        assert label == (1 - polarity if negated else polarity)
    assert set(np.unique(kinds)) == {0, 1, 2}
    assert 0.4 < labels.mean() < 0.6


def test_decode_words_drops_padding():
    tokens, lengths, _, _ = negation_sentiment_data(np.random.default_rng(2), 3)
    words = decode_words(tokens[0])
    assert len(words.split()) == lengths[0]
    assert "<pad>" not in words
