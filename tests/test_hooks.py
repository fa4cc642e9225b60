"""Hook points: recording and changing a forward pass (attention_lib.hooks, chapter 18).

Every check compares the hooks against something computed without them: the weights the
model already returns, the attention output recomputed from the recorded heads, a forward
pass with hand-edited weights (W_o's rows of a head set to zero), the same run unpatched.
"""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
from model_helpers import (
    HAVE_SMOLLM2_WEIGHTS,
    HAVE_TOKENIZERS,
    SMOLLM2_WEIGHTS_INSTALL,
    randomize,
    rounding_tolerance,
)

from attention_lib import (
    DecoderOnlyLM,
    Encoder,
    EncoderBlock,
    EncoderDecoder,
    LayerNorm,
    MultiHeadAttention,
    causal_mask,
)
from attention_lib.hooks import (
    Recording,
    capture,
    hook_points,
    intervene,
    mean_ablate,
    patch,
    zero_ablate,
)

D_MODEL, HEADS, D_FF, LAYERS, VOCAB = 16, 4, 32, 3, 23
D_HEAD = D_MODEL // HEADS


def small_lm(seed=0, *, num_kv_heads=None, gate=None, dtype=np.float64) -> DecoderOnlyLM:
    """A random pre-LN decoder with every parameter (biases included) away from its init."""
    rng = np.random.default_rng(seed)
    model = DecoderOnlyLM.init(VOCAB, D_MODEL, HEADS, D_FF, LAYERS, rng, dtype=dtype,
                               num_kv_heads=num_kv_heads)
    if gate is not None:
        for block in model.blocks:
            block.self_attn = MultiHeadAttention.init(D_MODEL, HEADS, rng, dtype=dtype,
                                                      num_kv_heads=num_kv_heads, gate=gate)
    return randomize(model, rng)


def small_encoder(seed=0) -> Encoder:
    """A random post-LN encoder stack (MiniLM's kind of block) with a final norm."""
    rng = np.random.default_rng(seed)
    layers = [EncoderBlock.init(D_MODEL, HEADS, D_FF, rng) for _ in range(LAYERS)]
    return randomize(Encoder(layers, LayerNorm.init(D_MODEL)), rng)


def tokens(seed=1, batch=2, T=7):
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, T))


def head_rows(W_o, head, d_head):
    return slice(head * d_head, (head + 1) * d_head)


def no_hooks_left(model):
    return all("_hooks" not in block.__dict__ and "_hooks" not in block.self_attn.__dict__
               for block in model.blocks)


# ------------------------------------------------------------------------------ names


def test_points_are_named_in_forward_order():
    names = hook_points(small_lm())
    assert names[:7] == ["blocks.0.resid_pre", "blocks.0.attn.weights", "blocks.0.attn.head_out",
                         "blocks.0.attn_out", "blocks.0.resid_mid", "blocks.0.ff_out",
                         "blocks.0.resid_post"]
    assert len(names) == 7 * LAYERS and names[-1] == f"blocks.{LAYERS - 1}.resid_post"


def test_a_block_without_attention_has_only_its_feed_forward_points():
    block = EncoderBlock.init(D_MODEL, HEADS, D_FF, np.random.default_rng(0), attention=False)
    assert hook_points(block) == ["blocks.0.resid_pre", "blocks.0.ff_out", "blocks.0.resid_post"]
    x = np.random.default_rng(1).normal(size=(2, 5, D_MODEL))
    with capture(block) as recording:
        y = block(x)
    np.testing.assert_array_equal(recording["blocks.0.resid_post"], y)
    np.testing.assert_array_equal(recording["blocks.0.resid_pre"], x)


@pytest.mark.parametrize("name", ["blocks.3.resid_pre", "blocks.0.attn.q", "resid_pre",
                                  "blocks.*.nothing"])
def test_a_bad_name_raises_and_lists_the_valid_ones(name):
    model = small_lm()
    with pytest.raises(ValueError, match=r"no hook point .*valid names: blocks\.\{i\}\.resid_pre"
                                         r".*attn\.head_out.*for i in 0\.\.2"):
        with capture(model, [name]):
            pass
    with pytest.raises(ValueError, match="valid names"):
        with intervene(model, {name: zero_ablate(0)}):
            pass
    assert no_hooks_left(model)


def test_models_without_encoder_blocks_are_refused():
    model = EncoderDecoder.init(11, 13, D_MODEL, HEADS, D_FF, 1, np.random.default_rng(0))
    with pytest.raises(TypeError, match="stack of EncoderBlocks.*got EncoderDecoder"):
        hook_points(model)


@pytest.mark.parametrize("name", ["blocks.0.attn.weights", "blocks.*.attn.weights"])
def test_the_weights_are_read_only(name):
    with pytest.raises(ValueError, match="can be recorded, not replaced.*head_out"):
        with intervene(small_lm(), {name: lambda w: w}):
            pass


# ----------------------------------------------------------------------------- capture


def test_hooks_are_removed_after_the_block_even_on_an_error():
    model, ids = small_lm(), tokens()
    before = model(ids)
    with pytest.raises(RuntimeError, match="inside"):
        with capture(model), intervene(model, {"blocks.1.attn.head_out": zero_ablate(1)}):
            raise RuntimeError("inside")
    assert no_hooks_left(model)
    np.testing.assert_array_equal(model(ids), before)


def test_capture_records_every_point_but_the_weights_and_changes_nothing():
    model, ids = small_lm(), tokens()
    plain = model(ids)
    with capture(model) as recording:
        logits = model(ids)
    np.testing.assert_array_equal(logits, plain)  # no weights asked for: the same path
    assert list(recording) == [name for name in hook_points(model) if "weights" not in name]
    # The points chain as the pre-LN block says: mid = pre + attn_out, post = mid + ff_out,
    # one block's output is the next one's input, the last one's gives the logits.
    for i in range(LAYERS):
        at = {point: recording[f"blocks.{i}.{point}"]
              for point in ("resid_pre", "attn_out", "resid_mid", "ff_out", "resid_post")}
        np.testing.assert_array_equal(at["resid_mid"], at["resid_pre"] + at["attn_out"])
        np.testing.assert_array_equal(at["resid_post"], at["resid_mid"] + at["ff_out"])
        if i + 1 < LAYERS:
            assert recording[f"blocks.{i + 1}.resid_pre"] is not None
            np.testing.assert_array_equal(recording[f"blocks.{i + 1}.resid_pre"],
                                          at["resid_post"])
    last = recording[f"blocks.{LAYERS - 1}.resid_post"]
    np.testing.assert_array_equal(model.norm(last) @ model.W_out, logits)
    np.testing.assert_array_equal(recording["blocks.0.resid_pre"], model.embed(ids))


def test_recorded_arrays_are_read_only():
    model = small_lm()
    with capture(model) as recording:
        model(tokens())
    with pytest.raises(ValueError, match="read-only"):
        recording["blocks.0.resid_post"][...] = 0.0


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_captured_weights_equal_the_returned_attention(num_kv_heads):
    model, ids = small_lm(num_kv_heads=num_kv_heads), tokens()
    logits, attention = model.forward(ids, return_attention=True)
    with capture(model, "blocks.*.attn.weights") as recording:
        model(ids)  # the weights are not asked for by the caller: computed for the hook only
    assert list(recording) == [f"blocks.{i}.attn.weights" for i in range(LAYERS)]
    np.testing.assert_array_equal(recording.stack("attn.weights"), attention)
    assert attention.shape == (LAYERS, 2, HEADS, 7, 7)


def test_the_caller_gets_no_weights_it_did_not_ask_for():
    layer = small_lm().blocks[0].self_attn
    x = np.random.default_rng(2).normal(size=(2, 5, D_MODEL))
    with capture(_stack_of(layer), "*weights") as rec:
        output, weights = layer(x, mask=causal_mask(5), need_weights=False)
    assert weights is None and rec["blocks.0.attn.weights"].shape == (2, HEADS, 5, 5)


def _stack_of(layer):
    """An EncoderBlock around ``layer``, so that the layer's points get names."""
    block = EncoderBlock.init(D_MODEL, HEADS, D_FF, np.random.default_rng(0), norm_first=True)
    block.self_attn = layer
    return block


@pytest.mark.parametrize("gate", [None, "elementwise", "headwise"])
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_head_outputs_times_their_rows_of_W_o_give_the_attention_output(gate, num_kv_heads):
    model, ids = small_lm(gate=gate, num_kv_heads=num_kv_heads), tokens()
    with capture(model) as recording:
        model(ids)
    for i, block in enumerate(model.blocks):
        attention = block.self_attn
        heads = recording[f"blocks.{i}.attn.head_out"]  # (B, H, T, d_head)
        assert heads.shape == (2, HEADS, 7, D_HEAD)
        per_head = np.einsum("bhtd,hdm->bhtm", heads,
                             attention.W_o.reshape(HEADS, D_HEAD, D_MODEL))
        # Each head's own contribution to the stream, summed, plus the bias:
        np.testing.assert_allclose(per_head.sum(axis=1) + attention.b_o,
                                   recording[f"blocks.{i}.attn_out"], rtol=0,
                                   atol=rounding_tolerance(per_head, terms=D_MODEL))


def test_a_capture_inside_an_intervention_sees_the_changed_values():
    model = small_lm()
    with intervene(model, {"blocks.1.attn.head_out": zero_ablate([0, 2])}):
        with capture(model, "blocks.1.attn.head_out") as recording:
            model(tokens())
    heads = recording["blocks.1.attn.head_out"]
    assert not heads[:, [0, 2]].any() and heads[:, [1, 3]].all()


# --------------------------------------------------------------------------- ablation


@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("layer,heads", [(0, 1), (2, [0, 3])])
def test_zero_ablation_equals_zeroing_the_heads_rows_of_W_o(num_kv_heads, layer, heads):
    model, ids = small_lm(num_kv_heads=num_kv_heads), tokens()
    edited = copy.deepcopy(model)
    for head in np.atleast_1d(heads):
        edited.blocks[layer].self_attn.W_o[head_rows(None, head, D_HEAD)] = 0.0
    with intervene(model, {f"blocks.{layer}.attn.head_out": zero_ablate(heads)}):
        ablated = model(ids)
    expected = edited(ids)
    np.testing.assert_allclose(ablated, expected, rtol=0,
                               atol=rounding_tolerance(expected, terms=D_MODEL, layers=LAYERS))
    assert np.abs(ablated - model(ids)).max() > 1e-3  # and the head mattered


def test_mean_ablation_equals_a_constant_head_folded_into_b_o():
    model, ids = small_lm(), tokens()
    layer, head = 1, 2
    with capture(model, f"blocks.{layer}.attn.head_out") as recording:
        model(tokens(seed=5, batch=16))
    # The head's mean over the batch and the positions: a constant vector per head.
    means = recording[f"blocks.{layer}.attn.head_out"].mean(axis=(0, 2))[:, None, :]
    edited = copy.deepcopy(model)
    attention = edited.blocks[layer].self_attn
    rows = head_rows(None, head, D_HEAD)
    attention.b_o = attention.b_o + means[head, 0] @ attention.W_o[rows]
    attention.W_o[rows] = 0.0
    with intervene(model, {f"blocks.{layer}.attn.head_out": mean_ablate(head, means)}):
        ablated = model(ids)
    expected = edited(ids)
    np.testing.assert_allclose(ablated, expected, rtol=0,
                               atol=rounding_tolerance(expected, terms=D_MODEL, layers=LAYERS))


def test_ablation_on_a_post_ln_encoder_equals_the_hand_edited_one():
    encoder = small_encoder()
    x = np.random.default_rng(3).normal(size=(2, 6, D_MODEL))
    edited = copy.deepcopy(encoder)
    edited.layers[1].self_attn.W_o[head_rows(None, 3, D_HEAD)] = 0.0
    with intervene(encoder, {"blocks.1.attn.head_out": zero_ablate(3)}):
        ablated = encoder(x)
    expected = edited(x)
    np.testing.assert_allclose(ablated, expected, rtol=0,
                               atol=rounding_tolerance(expected, terms=D_MODEL, layers=LAYERS))
    with capture(encoder) as recording:
        out = encoder(x)
    block = encoder.layers[2]  # post-LN: resid_post = norm2(resid_mid + ff_out)
    np.testing.assert_array_equal(
        recording["blocks.2.resid_post"],
        block.norm2(recording["blocks.2.resid_mid"] + recording["blocks.2.ff_out"]))
    np.testing.assert_array_equal(encoder.norm(recording["blocks.2.resid_post"]), out)


@pytest.mark.parametrize("change,message", [
    (zero_ablate(4), r"heads=4 is out of range for 4 heads"),
    (mean_ablate(0, np.zeros(3)), r"means of shape \(3,\) do not broadcast"),
    (lambda a: a[..., :1, :], r"returned shape .* has shape \(2, 4, 7, 4\)"),
])
def test_bad_changes_raise_with_the_shapes(change, message):
    model = small_lm()
    with pytest.raises(ValueError, match=message):
        with intervene(model, {"blocks.0.attn.head_out": change}):
            model(tokens())
    assert no_hooks_left(model)


def test_zero_ablate_needs_a_head_axis():
    model = small_lm()
    for change in (zero_ablate(0), mean_ablate(0, 0.0), patch(np.zeros((2, 7, 16)), heads=0)):
        with pytest.raises(ValueError, match=r"with a head axis.*'blocks.0.resid_mid' has none"):
            with intervene(model, {"blocks.0.resid_mid": change}):
                model(tokens())
    with pytest.raises(ValueError, match=r"head axis.*got an array of shape \(7, 16\)"):
        zero_ablate(0)(np.zeros((7, 16)))


def test_a_change_keeps_the_dtype():
    model = small_lm(dtype=np.float32)
    with intervene(model, {"blocks.0.resid_mid": lambda a: a.astype(np.float64) * 2}):
        with capture(model, "blocks.0.resid_mid") as recording:
            logits = model(tokens())
    assert logits.dtype == np.float32
    assert recording["blocks.0.resid_mid"].dtype == np.float32


# ---------------------------------------------------------------------------- patching


def test_patching_every_point_from_the_same_run_changes_no_bit():
    model, ids = small_lm(num_kv_heads=2, gate="headwise"), tokens()
    with capture(model) as recording:
        clean = model(ids)
    names = [name for name in hook_points(model) if "weights" not in name]
    with intervene(model, {name: patch(recording) for name in names}):
        patched = model(ids)
    np.testing.assert_array_equal(patched, clean)
    with intervene(model, {"*": patch(recording)}):  # a pattern leaves out the weights
        np.testing.assert_array_equal(model(ids), clean)
    with intervene(model, {"blocks.*.resid_*": patch(recording, positions=[0, 3]),
                           "blocks.*.attn.head_out": patch(recording, heads=1)}):
        np.testing.assert_array_equal(model(ids), clean)


def test_patching_the_whole_first_residual_stream_gives_the_other_run():
    model, ids_a, ids_b = small_lm(), tokens(seed=1), tokens(seed=2)
    with capture(model, "blocks.0.resid_pre") as recording_b:
        logits_b = model(ids_b)
    with intervene(model, {"blocks.0.resid_pre": patch(recording_b)}):
        patched = model(ids_a)
    np.testing.assert_array_equal(patched, logits_b)


def test_patching_one_position_leaves_the_earlier_positions_alone():
    model, ids_a, ids_b = small_lm(), tokens(seed=1), tokens(seed=2)
    logits_a = model(ids_a)
    with capture(model, "blocks.1.resid_pre") as recording_b:
        model(ids_b)
    with intervene(model, {"blocks.1.resid_pre": patch(recording_b, positions=4)}):
        patched = model(ids_a)
    tolerance = rounding_tolerance(logits_a, terms=D_MODEL, layers=LAYERS)
    np.testing.assert_allclose(patched[:, :4], logits_a[:, :4], rtol=0, atol=tolerance)
    assert np.abs(patched[:, 4:] - logits_a[:, 4:]).min(axis=-1).max() > 1e-3


def test_patching_every_head_equals_patching_the_attention_output():
    model, ids_a, ids_b = small_lm(), tokens(seed=1), tokens(seed=2)
    with capture(model) as recording_b:
        model(ids_b)
    with intervene(model, {"blocks.1.attn.head_out": patch(recording_b, positions=[2, 5])}):
        by_heads = model(ids_a)
    with intervene(model, {"blocks.1.attn_out": patch(recording_b, positions=[2, 5])}):
        by_output = model(ids_a)
    np.testing.assert_allclose(by_heads, by_output, rtol=0,
                               atol=rounding_tolerance(by_output, terms=D_MODEL, layers=LAYERS))


def test_patching_one_head_from_an_array_equals_the_edited_sum():
    """Patching head h's output from run B is run A with h's contribution swapped for B's."""
    model, ids_a, ids_b = small_lm(), tokens(seed=1), tokens(seed=2)
    name = "blocks.0.attn.head_out"
    with capture(model, name) as recording_a:
        model(ids_a)
    with capture(model, name) as recording_b:
        model(ids_b)
    expected = recording_a[name].copy()
    expected[:, 2] = recording_b[name][:, 2]
    with intervene(model, {name: patch(recording_b[name], heads=2)}):
        with capture(model, name) as recording:
            model(ids_a)
    np.testing.assert_array_equal(recording[name], expected)


def test_bad_patches_raise():
    model = small_lm()
    with capture(model) as recording:
        model(tokens(T=5))
    with pytest.raises(ValueError, match=r"source has shape \(2, 5, 16\).*\(2, 7, 16\)"):
        with intervene(model, {"blocks.0.resid_pre": patch(recording)}):
            model(tokens(T=7))
    with pytest.raises(ValueError, match="positions=9 is out of range for T=5"):
        with intervene(model, {"blocks.0.resid_pre": patch(recording, positions=9)}):
            model(tokens(T=5))
    with pytest.raises(ValueError, match="needs a point name"):
        patch(recording)(np.zeros((2, 5, 16)))
    with pytest.raises(ValueError, match=r"recorded 2 times.*steps"):
        with capture(model, "blocks.0.resid_pre") as twice:
            model(tokens())
            model(tokens())
        twice["blocks.0.resid_pre"]
    assert len(twice.steps("blocks.0.resid_pre")) == 2
    with pytest.raises(KeyError, match="was not recorded"):
        Recording()["blocks.0.resid_pre"]


# ---------------------------------------------------------------------------- KV cache


def test_decode_steps_record_the_new_positions_and_equal_the_full_pass():
    model, ids = small_lm(num_kv_heads=2), tokens(batch=1, T=6)
    with capture(model, ["blocks.*.attn.weights", "blocks.*.attn.head_out",
                         "blocks.*.resid_post"]) as full:
        model(ids)
    cache = model.new_cache(batch_shape=(1,), capacity=8)
    with capture(model, ["blocks.*.attn.weights", "blocks.*.attn.head_out",
                         "blocks.*.resid_post"]) as stepped:
        model(ids[:, :3], cache)  # the prompt, then one token at a time
        for t in range(3, 6):
            model(ids[:, t:t + 1], cache)
    for name in full:
        steps = stepped.steps(name)
        assert len(steps) == 4
        if name.endswith("weights"):  # (1, H, T_new, T_total): pad and join the rows
            rows = [np.pad(w, [(0, 0)] * 3 + [(0, 6 - w.shape[-1])]) for w in steps]
            joined = np.concatenate(rows, axis=-2)
        else:
            joined = np.concatenate(steps, axis=-2)
        np.testing.assert_allclose(joined, full[name], rtol=0,
                                   atol=rounding_tolerance(full[name], terms=D_MODEL,
                                                           layers=LAYERS))


def test_ablation_with_a_cache_equals_ablation_of_the_full_pass():
    model, ids = small_lm(), tokens(batch=1, T=6)
    change = {"blocks.1.attn.head_out": zero_ablate(0)}
    with intervene(model, change):
        full = model(ids)
        cache = model.new_cache(batch_shape=(1,), capacity=8)
        steps = [model(ids[:, :2], cache)] + [model(ids[:, t:t + 1], cache) for t in range(2, 6)]
    np.testing.assert_allclose(np.concatenate(steps, axis=-2), full, rtol=0,
                               atol=rounding_tolerance(full, terms=D_MODEL, layers=LAYERS))


# ------------------------------------------------------------------------- real models


@pytest.fixture(scope="module")
def smollm2():
    if not (HAVE_SMOLLM2_WEIGHTS and HAVE_TOKENIZERS):
        pytest.skip(f"weights not installed ({SMOLLM2_WEIGHTS_INSTALL})")
    from attention_lib.models.smollm2 import load_smollm2

    return load_smollm2()[0]


def test_smollm2_capture_ablation_and_patching(smollm2):
    model = smollm2
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(1, 12))
    L, H, d_head = model.config.num_layers, model.config.num_heads, model.config.d_head
    plain, attention = model.forward(ids, return_attention=True)
    with capture(model, ["blocks.*.attn.weights", "blocks.*.attn.head_out",
                         "blocks.*.attn_out", "blocks.*.resid_*"]) as recording:
        logits = model(ids)
    assert len(hook_points(model)) == 7 * L
    np.testing.assert_array_equal(recording.stack("attn.weights"), attention)
    np.testing.assert_allclose(logits, plain, rtol=0, atol=1e-3)  # another attention path
    layer = 4
    heads = recording[f"blocks.{layer}.attn.head_out"]
    W_o = model.blocks[layer].self_attn.W_o
    recomputed = np.einsum("bhtd,hdm->btm", heads.astype(np.float64),
                           W_o.reshape(H, d_head, -1).astype(np.float64))
    np.testing.assert_allclose(recomputed, recording[f"blocks.{layer}.attn_out"], rtol=0,
                               atol=rounding_tolerance(recording[f"blocks.{layer}.attn_out"],
                                                       terms=W_o.shape[0]))
    # Zero-ablating head 3 of layer 4 equals setting its rows of W_o to zero (in place,
    # restored after: the model is 135M parameters, too big to copy in a test).
    with capture(model, "blocks.*.resid_pre") as clean:
        base = model(ids)
    with intervene(model, {f"blocks.{layer}.attn.head_out": zero_ablate(3)}):
        ablated = model(ids)
    rows = slice(3 * d_head, 4 * d_head)
    saved = W_o[rows].copy()
    try:
        W_o[rows] = 0.0
        edited = model(ids)
    finally:
        W_o[rows] = saved
    np.testing.assert_array_equal(model(ids), base)
    np.testing.assert_allclose(ablated, edited, rtol=0, atol=1e-3)
    assert np.abs(ablated - base).max() > 1e-2  # the ablation changed the logits
    names = [name for name in hook_points(model) if "weights" not in name]
    with intervene(model, {name: patch(clean) if name.endswith("resid_pre") else (lambda a: a)
                           for name in names}):
        np.testing.assert_array_equal(model(ids), base)


def test_smollm2_decode_steps_with_capture(smollm2):
    model = smollm2
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, size=(1, 6))
    with capture(model, "blocks.29.attn.weights") as full:
        model(ids)
    cache = model.new_cache(batch_shape=(1,), capacity=8)
    with capture(model, "blocks.29.attn.weights") as stepped:
        model(ids[:, :5], cache)
        model(ids[:, 5:], cache)
    last_row = stepped.steps("blocks.29.attn.weights")[1]  # (1, H, 1, 6)
    np.testing.assert_allclose(last_row[..., 0, :], full["blocks.29.attn.weights"][..., 5, :],
                               rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def minilm():
    from attention_lib.models.minilm import MINILM_PACKAGE, load_minilm

    if importlib.util.find_spec(MINILM_PACKAGE) is None or not HAVE_TOKENIZERS:
        pytest.skip("MiniLM weights or tokenizers not installed")
    return load_minilm()


def test_minilm_capture_and_ablation(minilm):
    model = minilm
    ids, lengths = model.tokenize(["The cat sat on the mat.", "Attention is all you need"])
    hidden, weights = model.forward(ids, lengths)
    with capture(model, ["blocks.*.attn.weights", "blocks.*.resid_post"]) as recording:
        hidden_again = model(ids, lengths)
    np.testing.assert_array_equal(hidden_again, hidden)  # MiniLM always stores its weights
    np.testing.assert_array_equal(recording.stack("attn.weights"), weights)
    np.testing.assert_array_equal(recording[f"blocks.{model.num_layers - 1}.resid_post"], hidden)
    W_o = model.blocks[2].self_attn.W_o
    d_head = model.d_model // model.num_heads
    with intervene(model, {"blocks.2.attn.head_out": zero_ablate(5)}):
        ablated = model(ids, lengths)
    rows = slice(5 * d_head, 6 * d_head)
    saved = W_o[rows].copy()
    try:
        W_o[rows] = 0.0
        edited = model(ids, lengths)
    finally:
        W_o[rows] = saved
    np.testing.assert_allclose(ablated, edited, rtol=0, atol=1e-4)
    assert np.abs(ablated - hidden).max() > 1e-3
