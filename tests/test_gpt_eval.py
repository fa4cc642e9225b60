"""Chapter 14's measurements: per-window and sliding-window losses, the repeated-snippet probe,
hooks on the GPT, and the committed NumPy-vs-PyTorch training comparison."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from model_helpers import randomize

from attention_lib.hooks import capture, intervene, zero_ablate
from attention_lib.training import GPT, evaluate_loss
from attention_lib.training.gpt import (
    DATA_DIR,
    repeated_snippets,
    sliding_window_losses,
    token_losses,
    window_losses,
)

ROOT = Path(__file__).resolve().parent.parent


def small_gpt(seed=0, context_len=8):
    rng = np.random.default_rng(seed)
    model = GPT.init(65, context_len, 16, 4, 2, rng, dtype=np.float64)
    randomize(model.blocks, rng)
    randomize(model.norm, rng)
    return model


def direct_loss(model, context, target):
    """-log p(target | context) from one forward pass of the whole context."""
    logits = model.forward(np.asarray(context)[None, :])[0, -1]
    log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    return -log_probs[target]


def test_window_losses_average_to_evaluate_loss_per_position():
    model = small_gpt()
    data = np.random.default_rng(1).integers(0, 65, 83)  # 10 windows of 8, and 2 left over
    losses = window_losses(model, data, batch_size=3)
    assert losses.shape == (10, 8) and losses.dtype == np.float64
    np.testing.assert_allclose(losses.mean(axis=0), evaluate_loss(model, data, per_position=True),
                               rtol=1e-12)
    # Entry [i, t]: character 8 i + t + 1 from the t + 1 characters of window i before it.
    assert losses[3, 5] == pytest.approx(direct_loss(model, data[24:30], data[30]), rel=1e-12)


def test_token_losses_check_the_targets_shape():
    model = small_gpt()
    with pytest.raises(ValueError, match="targets must be"):
        token_losses(model, np.zeros((2, 5), int), np.zeros((2, 4), int))


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_sliding_window_losses_predict_each_character_from_its_window(stride):
    model = small_gpt()
    T = model.context_len
    data = np.random.default_rng(2).integers(0, 65, 40)
    losses = sliding_window_losses(model, data, stride, batch_size=2)
    assert losses.shape == ((40 - T) // stride * stride,)
    for j in range(losses.size):
        target = T + j
        # The window that scores character `target` ends at it: at least T - stride + 1 of
        # the characters before it, at most T.
        seen = T - stride + 1 + j % stride
        assert losses[j] == pytest.approx(direct_loss(model, data[target - seen:target],
                                                      data[target]), rel=1e-10), j


def test_sliding_window_with_stride_one_sees_the_full_context_and_the_reset_windows_do_not():
    model = small_gpt()
    data = np.random.default_rng(3).integers(0, 65, 8 * 6 + 1)
    sliding = sliding_window_losses(model, data, 1)  # targets 8..48
    reset = window_losses(model, data).reshape(-1)  # targets 1..48
    # The last position of each reset window sees 8 characters, as every sliding prediction.
    np.testing.assert_allclose(reset[15::8], sliding[8::8], rtol=1e-12)
    assert not np.allclose(reset[8:16], sliding[1:9])  # the others see fewer
    with pytest.raises(ValueError, match="stride"):
        sliding_window_losses(model, data, 9)


def test_repeated_snippets_second_halves_are_the_same_text():
    data = np.arange(1000)
    repeated, control = repeated_snippets(data, 20, 16, np.random.default_rng(0))
    assert repeated.shape == control.shape == (20, 32)
    np.testing.assert_array_equal(repeated[:, :16], repeated[:, 16:])
    np.testing.assert_array_equal(repeated[:, 16:], control[:, 16:])
    # The control is a stretch of the data: consecutive ids here.
    np.testing.assert_array_equal(np.diff(control, axis=1), 1)
    with pytest.raises(ValueError, match="half_len"):
        repeated_snippets(data[:20], 1, 16, np.random.default_rng(0))


def test_head_hooks_fire_in_gpt_forward():
    # GPT.forward runs its own loop over the blocks, but calls each block's attention layer,
    # where the attn.* hook points are: ablating a head equals zeroing its rows of W_o.
    model = small_gpt(seed=4)
    ids = np.random.default_rng(5).integers(0, 65, (2, 8))
    with intervene(model, {"blocks.1.attn.head_out": zero_ablate(2)}):
        ablated = model.forward(ids)
    attn = model.blocks[1].self_attn
    d_head = attn.W_o.shape[0] // attn.num_heads
    without = model.astype(np.float64)
    without.blocks[1].self_attn.W_o[2 * d_head:3 * d_head] = 0.0
    np.testing.assert_allclose(ablated, without.forward(ids), rtol=1e-12, atol=1e-12)
    assert not np.allclose(ablated, model.forward(ids))
    with capture(model, "blocks.*.attn.weights") as recording:
        _, weights = model.forward(ids, return_weights=True)
    np.testing.assert_array_equal(recording.stack("attn.weights"), np.stack(weights))


# ---------------------------------------------------------------------------------------------
# The committed NumPy-vs-PyTorch comparison (scripts/compare_gpt_training_torch.py)
# ---------------------------------------------------------------------------------------------

def load_script():
    path = ROOT / "scripts" / "compare_gpt_training_torch.py"
    spec = importlib.util.spec_from_file_location("compare_gpt_training_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed_comparison():
    return json.loads((DATA_DIR / "gpt_numpy_vs_torch.json").read_text())


def test_committed_comparison_is_of_the_committed_run_and_agrees():
    result = committed_comparison()
    config = load_script().run_config(DATA_DIR / "shakespeare_gpt_log.json", {})
    assert result["config"] == config, "re-run scripts/compare_gpt_training_torch.py"
    for name, tolerance in (("float32", 1e-3), ("float64", 1e-9)):
        ours, theirs = (np.array(result["runs"][name][side]) for side in ("numpy", "torch"))
        assert ours.shape == theirs.shape == (result["num_steps"],)
        assert ours[-1] < ours[0] - 0.5  # the loss fell: the steps did something
        assert np.abs(ours - theirs).max() < tolerance, name


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_first_steps_reproduce_the_committed_comparison(side):
    if side == "torch":
        pytest.importorskip("torch")
    script = load_script()
    result = committed_comparison()
    run = script.numpy_losses if side == "numpy" else script.torch_losses
    steps = 3
    again = run(result["config"], steps, np.float64)
    np.testing.assert_allclose(again, result["runs"]["float64"][side][:steps], rtol=1e-10)


# ---------------------------------------------------------------------------------------------
# The committed measurements of chapter 14 (scripts/measure_gpt_chapter14.py)
# ---------------------------------------------------------------------------------------------

def test_committed_measurements_are_of_the_committed_checkpoint_and_reproduce():
    from attention_lib.training import load_shakespeare_gpt, load_shakespeare_text
    from attention_lib.training.gpt import SHAKESPEARE_GPT_SHA256, train_val_split

    measured = json.loads((DATA_DIR / "gpt_chapter14_measurements.json").read_text())
    assert measured["checkpoint_sha256"] == SHAKESPEARE_GPT_SHA256, \
        "re-run scripts/measure_gpt_chapter14.py"
    model, codec = load_shakespeare_gpt()
    _, val_ids = train_val_split(codec.encode(load_shakespeare_text()))
    T = model.context_len
    context = measured["context"]
    assert context["num_windows"] == (val_ids.size - 1) // T
    again = window_losses(model, val_ids[:4 * T + 1]).mean(axis=1)
    np.testing.assert_allclose(again, context["window_mean"][:4], atol=1e-4)
    # The bins and the whole-split mean are averages of the same per-window numbers.
    assert np.mean(context["window_mean"]) == pytest.approx(context["mean"], abs=1e-6)
    sliding = context["sliding"]
    assert sliding["min_context"] == T - sliding["stride"] + 1
    again = sliding_window_losses(model, val_ids[:T + T], sliding["stride"])  # T targets
    assert again.mean() == pytest.approx(sliding["first_block_mean"], abs=1e-4)
    parts = measured["splits"]["parts"]
    assert parts["validation split"]["mean"] == pytest.approx(context["mean"], abs=1e-6)
