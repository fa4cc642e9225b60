"""Byte-level BPE from scratch: train it, and run SmolLM2's own tokenizer without `tokenizers`.

Byte-pair encoding starts from the 256 byte values of UTF-8 text and learns *merges*: the most
frequent adjacent pair of tokens becomes a new token, again and again, until the vocabulary
has the size asked for. Encoding replays the merges; decoding joins the tokens' bytes. Any
string has UTF-8 bytes, so with a token for each of the 256 bytes nothing is ever unknown.

Merges never cross the borders of *pieces*. The pre-tokenizer cuts text into pieces in two
steps, as SmolLM2's tokenizer does (llama.cpp names it ``smollm``):

1. every number character (Unicode category N*) becomes a piece of its own, so ``"2024"`` is
   four pieces (the ``tokenizers`` library's ``Digits(individual_digits=True)``);
2. the rest is cut by GPT-2's pattern, read left to right, the first alternative that
   matches winning::

       's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

   contractions; a word with the one space before it; a number; a run of other characters
   (punctuation, symbols, emoji, combining marks); a run of whitespace that leaves its last
   character to the word after it; any other whitespace.

Step 2 is a hand-written scanner (:func:`gpt2_split`), not a regex: ``\\p{L}`` and ``\\p{N}``
are read with ``unicodedata.category`` and ``\\s`` with ``str.isspace``, except that
the four information separators U+001C..U+001F, which Python counts as whitespace, are not
whitespace for the reference (Oniguruma's ``\\s``, the Unicode White_Space property).

The 17 control tokens of SmolLM2 (``<|im_start|>``, ...) are cut out of the text first, wherever
their exact spelling appears, and each becomes one id; merges never produce them.

On SmolLM2's vocabulary the ids equal those of ``tokenizers`` configured as
:class:`~attention_lib.models.smollm2.SmolLM2Tokenizer` (tested on hard cases and random
Unicode text), down to its quirks: the 21 bytes that have no token in that vocabulary are
dropped. One known difference: a character that Python's Unicode database (version 14 for
Python 3.11) does not know yet counts as "other", where the reference, built with a newer
Unicode, may know it as a letter or a number.
"""

from __future__ import annotations

import math
import numbers
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from .gguf import GGUFFile

__all__ = [
    "ByteLevelBPE",
    "bytes_to_unicode",
    "gpt2_split",
    "merge_pair",
    "pretokenize",
    "split_digits",
    "train_bpe",
]

CONTROL_TOKEN_TYPE = 3
"""llama.cpp's ``tokenizer.ggml.token_type`` of a control (special) token."""

_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # after an apostrophe, in pattern order
_LETTER, _NUMBER, _SPACE, _OTHER = "L", "N", "S", "O"
_NOT_WHITESPACE = "\x1c\x1d\x1e\x1f"  # str.isspace() says yes, the reference's \s says no
_CACHE_LIMIT = 100_000  # pieces remembered per tokenizer (a word's tokens never change)


# ---------------------------------------------------------------------------------------------
# Pre-tokenization: text -> pieces
# ---------------------------------------------------------------------------------------------

class _KindTable(dict):
    """Code point -> "L" (letter), "N" (number), "S" (whitespace) or "O" (other).

    A table for ``str.translate``, filled on demand: ``text.translate(_KINDS)`` spells
    the kind of every character of ``text`` in one pass done in C.
    """

    def __missing__(self, code_point: int) -> str:
        char = chr(code_point)
        if char.isspace() and char not in _NOT_WHITESPACE:
            kind = _SPACE
        else:
            major = unicodedata.category(char)[0]
            kind = major if major in (_LETTER, _NUMBER) else _OTHER
        self[code_point] = kind
        return kind


_KINDS = _KindTable()
_SAME_KIND_RUN = re.compile("L+|N+|S+|O+")  # on a string of kinds, not on the text


def split_digits(text: str) -> list[str]:
    """Cut ``text`` so that every number character (category N*) is a piece of its own.

    The ``tokenizers`` library's ``Digits(individual_digits=True)``: ``"a12b"`` gives
    ``["a", "1", "2", "b"]``. Runs between numbers stay whole.

    Shapes
    ------
    text (str) -> pieces (list of str) whose concatenation is ``text``

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.
    """
    kinds = text.translate(_KINDS)
    segments, start = [], 0
    number = kinds.find(_NUMBER)
    while number != -1:
        if start < number:
            segments.append(text[start:number])
        segments.append(text[number])
        start = number + 1
        number = kinds.find(_NUMBER, start)
    if start < len(text):
        segments.append(text[start:])
    return segments


def _piece_end(text: str, kinds: str, start: int) -> int:
    """Where the GPT-2 pattern's match at ``start`` ends (one step of the scanner)."""
    char = text[start]
    if char == "'":  # 's|'t|'re|'ve|'m|'ll|'d (case-sensitive: "'VE" is not one)
        for suffix in _CONTRACTIONS:
            if text.startswith(suffix, start + 1):
                return start + 1 + len(suffix)
    # " ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+": one plain space may lead a run of one kind.
    body = start + 1 if char == " " and start + 1 < len(text) else start
    if kinds[body] != _SPACE:
        return _SAME_KIND_RUN.match(kinds, body).end()
    # \s+(?!\S) then \s+: a whitespace run gives its last character to a following
    # non-space (which then starts with " ?"), unless the run is that one character.
    end = _SAME_KIND_RUN.match(kinds, start).end()
    if end == len(text) or end - start == 1:
        return end
    return end - 1


def gpt2_split(text: str) -> list[str]:
    """Cut ``text`` into pieces with GPT-2's pre-tokenizer pattern, by a hand-written scanner.

    ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``:
    contractions, then a letter run, a number run or a run of other characters (each with
    one optional leading space ``" "``), then whitespace. Letters are Unicode categories L*,
    numbers N*, whitespace is ``str.isspace`` minus U+001C..U+001F.

    Shapes
    ------
    text (str) -> pieces (list of str) whose concatenation is ``text``

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. Equals the pieces of the
    ``tokenizers`` library's ``ByteLevel(use_regex=True)`` pre-tokenizer (tested).

    Examples
    --------
    >>> gpt2_split("I've  got 12 cats!\\n\\n")
    ['I', "'ve", ' ', ' got', ' 12', ' cats', '!', '\\n\\n']
    """
    kinds = text.translate(_KINDS)  # one letter per character: L, N, S or O
    pieces, start = [], 0
    while start < len(text):
        end = _piece_end(text, kinds, start)
        pieces.append(text[start:end])
        start = end
    return pieces


def pretokenize(text: str) -> list[str]:
    """SmolLM2's pre-tokenizer: :func:`split_digits`, then :func:`gpt2_split` on each part.

    The GPT-2 pattern runs on each part alone, so its look-ahead ``(?!\\S)`` sees the end of
    the part, not the digit after it: ``"a  1"`` gives ``["a", "  ", "1"]``.

    Shapes
    ------
    text (str) -> pieces (list of str) whose concatenation is ``text``

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> pretokenize("Hello world 2024!")
    ['Hello', ' world', ' ', '2', '0', '2', '4', '!']
    """
    return [piece for segment in split_digits(text) for piece in gpt2_split(segment)]


# ---------------------------------------------------------------------------------------------
# Bytes as printable characters (how GGUF and tokenizer.json spell byte-level tokens)
# ---------------------------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: each byte value 0..255 as one printable character.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) are
    shifted to U+0100 and up, in byte order: a space (0x20) is ``"Ġ"`` (U+0120), a newline
    ``"Ċ"``. Vocabularies stored as text (GGUF, ``tokenizer.json``) spell tokens this way.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. The function of the same name in
    GPT-2's ``encoder.py``.

    Examples
    --------
    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], table[ord("\\n")]
    ('a', 'Ġ', 'Ċ')
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in table)
    for offset, byte in enumerate(shifted):
        table[byte] = chr(256 + offset)
    return dict(sorted(table.items()))


# Alphabet character -> the code point of its byte (for str.translate); a Latin-1 character
# outside the alphabet (a raw space, say) -> U+FFFF, which no byte has.
_BYTE_OF_CHAR = {ord(char): byte for byte, char in bytes_to_unicode().items()}
_BYTE_OF_CHAR.update({code: 0xFFFF for code in range(256) if code not in _BYTE_OF_CHAR})


def _token_bytes(token: str) -> bytes:
    """The bytes of a token spelled in :func:`bytes_to_unicode`'s alphabet."""
    try:  # every character back to its byte, then Latin-1 writes code points 0..255 as bytes
        return token.translate(_BYTE_OF_CHAR).encode("latin-1")
    except UnicodeEncodeError:  # not in the alphabet: its UTF-8, as the reference's decoder
        return token.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------

def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ids`` with every occurrence of ``pair`` replaced by ``new_id``, left to right.

    Occurrences do not overlap: ``[a, a, a]`` with the pair ``(a, a)`` gives ``[new, a]``.

    Shapes
    ------
    ids (n,) -> (n - number of occurrences,)

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> merge_pair([97, 97, 97, 98], (97, 97), 256)
    [256, 97, 98]
    """
    merged, index = [], 0
    while index < len(ids):
        if index + 1 < len(ids) and ids[index] == pair[0] and ids[index + 1] == pair[1]:
            merged.append(new_id)
            index += 2
        else:
            merged.append(ids[index])
            index += 1
    return merged


def _check_text(text) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str; got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"text has a lone surrogate {text[error.start]!r} at position "
                         f"{error.start}: it has no UTF-8 bytes, so it cannot be "
                         "tokenized") from None


@dataclass(repr=False)
class ByteLevelBPE:
    """A byte-level BPE tokenizer: a vocabulary of byte strings and the merges that build it.

    ``encode``: cut out the special tokens; cut the rest into pieces (:func:`pretokenize`);
    spell each piece's UTF-8 bytes with the 256 single-byte tokens; then apply the merges,
    always the one of lowest rank (earliest learned) among the piece's adjacent pairs, until
    none applies (GPT-2's algorithm). A piece's tokens are remembered, so a word is merged
    once. ``decode``: join the tokens' bytes and read them as UTF-8 at the very end, so a
    character split over several tokens comes back whole (bytes that are not valid UTF-8 on
    their own become U+FFFD).

    Attributes
    ----------
    vocab : list of bytes
        Token id -> the bytes it stands for. Should hold every single byte: a byte that has
        no token is dropped from the text when it is encoded (the reference does the same).
    merges : dict
        ``(left id, right id) -> merged id``, in rank order (the first entry is merged
        first); ``vocab[merged] == vocab[left] + vocab[right]``.
    special_tokens : dict, optional
        Text -> id of the special tokens, matched as exact substrings before anything else
        (the longest one wins where two start at the same place).
    bytes_without_token : bytes
        Set on creation: the byte values that have no token, in order. Empty for a trained
        tokenizer. SmolLM2's vocabulary lacks 21: the 13 that UTF-8 never uses (0xC0, 0xC1,
        0xF5..0xFF), 0xF1 and 0xF2 (which only start characters of the unassigned planes 4
        to 11), and the control characters 0x04, 0x06, 0x13, 0x14, 0x16 and 0x1D. Text
        holding them does not come back whole from ``decode(encode(text))``.

    Shapes
    ------
    encode: text (str) -> ids (T,) int64; decode: ids (T,) int -> str

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. Make one with :func:`train_bpe`, or
    read SmolLM2's with :meth:`from_gguf`; on that vocabulary it gives the ids of
    :class:`~attention_lib.models.smollm2.SmolLM2Tokenizer` (tested).

    Examples
    --------
    >>> bpe = ByteLevelBPE([bytes([b]) for b in range(256)] + [b"hi"], {(104, 105): 256})
    >>> bpe.encode("hi ho")
    array([256,  32, 104, 111])
    >>> bpe.decode([256, 33])
    'hi!'
    """

    vocab: list[bytes]
    merges: dict[tuple[int, int], int]
    special_tokens: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        self._check_vocab()
        self._check_merges()
        self._check_special_tokens()
        special_ids = set(self.special_tokens.values())
        first_id = {}
        for token_id, token in enumerate(self.vocab):
            if token_id not in special_ids:
                first_id.setdefault(token, token_id)
        self._byte_ids = [first_id.get(bytes([byte])) for byte in range(256)]
        self.bytes_without_token = bytes(b for b, i in enumerate(self._byte_ids) if i is None)
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        # Python's re tries alternatives in order: longest first gives leftmost-longest.
        specials = sorted(self.special_tokens, key=len, reverse=True)
        self._special_pattern = (re.compile("(" + "|".join(map(re.escape, specials)) + ")")
                                 if specials else None)
        self._cache: dict[str, list[int]] = {}

    def _check_vocab(self):
        if not isinstance(self.vocab, list):
            raise TypeError(f"vocab must be a list of bytes; got {type(self.vocab).__name__}")
        for token_id, token in enumerate(self.vocab):
            if not isinstance(token, bytes):
                raise TypeError(f"vocab must be a list of bytes; vocab[{token_id}] is a "
                                f"{type(token).__name__}")

    def _check_merges(self):
        if not isinstance(self.merges, dict):
            raise TypeError(f"merges must be a dict (left id, right id) -> merged id; got "
                            f"{type(self.merges).__name__}")
        if not self.merges:
            return
        size, vocab = len(self.vocab), self.vocab
        try:  # one row (left, right, merged) per merge
            rows = np.array([(*pair, merged) for pair, merged in self.merges.items()])
        except (TypeError, ValueError):  # a pair that is not a sequence, or rows of two lengths
            rows = np.zeros(0)
        if (rows.shape != (len(self.merges), 3) or not np.issubdtype(rows.dtype, np.integer)
                or rows.min() < 0 or rows.max() >= size):
            raise ValueError(f"merges must map (left id, right id) to a merged id, all ids "
                             f"integers in [0, {size})")
        for left, right, merged in rows.tolist():
            if vocab[merged] != vocab[left] + vocab[right]:
                raise ValueError(f"merges maps {(left, right)} to {merged}, but vocab[{merged}] "
                                 f"= {vocab[merged]!r} is not {vocab[left]!r} + "
                                 f"{vocab[right]!r}")

    def _check_special_tokens(self):
        for text, token_id in self.special_tokens.items():
            if not isinstance(text, str) or not text:
                raise ValueError(f"special_tokens keys must be non-empty strings; got {text!r}")
            if not isinstance(token_id, numbers.Integral) or not 0 <= token_id < len(self.vocab):
                raise ValueError(f"special_tokens[{text!r}] = {token_id!r} is not an id in "
                                 f"[0, {len(self.vocab)})")

    def __repr__(self) -> str:  # the dataclass repr would print the whole vocabulary
        return (f"ByteLevelBPE(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={len(self.special_tokens)})")

    # -- reading and writing the GGUF / tokenizer.json spelling --------------------------------

    @classmethod
    def from_gguf_vocab(cls, tokens, merges, token_types=None) -> ByteLevelBPE:
        """Build the tokenizer from a vocabulary and merges spelled as GGUF stores them.

        Parameters
        ----------
        tokens : list of str
            ``tokenizer.ggml.tokens``: token id -> token, in :func:`bytes_to_unicode`'s
            alphabet (``"Ġthe"`` is ``b" the"``).
        merges : list of str
            ``tokenizer.ggml.merges``: ``"left right"`` pairs of tokens, best first.
        token_types : array_like of int, optional
            ``tokenizer.ggml.token_type``; ``3`` marks a control token, which becomes a
            special token.

        Raises
        ------
        ValueError
            If a merge is not two tokens of the vocabulary separated by one space, or its
            result is not in the vocabulary.
        """
        tokens = list(tokens)
        token_ids = {token: token_id for token_id, token in enumerate(tokens)}
        pairs = {}
        for rank, merge in enumerate(merges):
            parts = merge.split(" ")
            if len(parts) != 2 or not all(part in token_ids for part in parts):
                raise ValueError(f"merges[{rank}] = {merge!r} is not two tokens of the "
                                 "vocabulary separated by one space")
            if parts[0] + parts[1] not in token_ids:
                raise ValueError(f"merges[{rank}] = {merge!r} makes {parts[0] + parts[1]!r}, "
                                 "which is not in the vocabulary")
            pairs[token_ids[parts[0]], token_ids[parts[1]]] = token_ids[parts[0] + parts[1]]
        types = np.zeros(len(tokens), int) if token_types is None else np.asarray(token_types)
        special = {token: token_id for token_id, (token, kind) in enumerate(zip(tokens, types))
                   if kind == CONTROL_TOKEN_TYPE}
        return cls([_token_bytes(token) for token in tokens], pairs, special)

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ByteLevelBPE:
        """The tokenizer stored in a parsed GGUF file (from
        :func:`~attention_lib.models.gguf.read_gguf`).

        Raises ``ValueError`` unless the file holds a byte-level BPE (``gpt2``) with SmolLM2's
        pre-tokenizer (``smollm``): another pre-tokenizer would cut text differently.
        """
        metadata = gguf.metadata
        model, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre")
        if model != "gpt2" or pre != "smollm":
            raise ValueError(f"tokenizer.ggml.model is {model!r} and tokenizer.ggml.pre is "
                             f"{pre!r}; this tokenizer reads byte-level BPE ('gpt2') with "
                             "SmolLM2's pre-tokenizer ('smollm')")
        return cls.from_gguf_vocab(metadata["tokenizer.ggml.tokens"],
                                   metadata["tokenizer.ggml.merges"],
                                   metadata.get("tokenizer.ggml.token_type"))

    def to_gguf_vocab(self) -> tuple[list[str], list[str], list[int]]:
        """``(tokens, merges, token_types)`` spelled as GGUF stores them (see
        :meth:`from_gguf_vocab`, which reads them back)."""
        to_char = bytes_to_unicode()
        tokens = ["".join(to_char[byte] for byte in token) for token in self.vocab]
        token_types = [1] * len(tokens)
        for text, token_id in self.special_tokens.items():
            tokens[token_id], token_types[token_id] = text, CONTROL_TOKEN_TYPE
        merges = [f"{tokens[left]} {tokens[right]}" for left, right in self.merges]
        return tokens, merges, token_types

    # -- encoding and decoding ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _merge(self, ids: list[int]) -> list[int]:
        """Apply the merges to one piece: lowest rank first, until none applies."""
        ranks = self._ranks
        while len(ids) > 1:
            pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, math.inf))
            if pair not in ranks:
                break
            ids = merge_pair(ids, pair, self.merges[pair])
        return ids

    def _encode_piece(self, piece: str) -> list[int]:
        ids = self._cache.get(piece)
        if ids is None:
            # A byte with no token is dropped, as the reference does (no unknown token).
            data = piece.encode("utf-8").translate(None, self.bytes_without_token)
            ids = self._merge([self._byte_ids[byte] for byte in data])
            if len(self._cache) < _CACHE_LIMIT:
                self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, shape ``(T,)`` int64 (no BOS token is added).

        Raises ``TypeError`` if ``text`` is not a str and ``ValueError`` if it holds a lone
        surrogate (a str that has no UTF-8 bytes).
        """
        _check_text(text)
        # re.split with a group alternates: text, special, text, special, ..., text.
        parts = self._special_pattern.split(text) if self._special_pattern else [text]
        ids = []
        for index, part in enumerate(parts):
            if index % 2:
                ids.append(self.special_tokens[part])
            else:
                for piece in pretokenize(part):
                    ids.extend(self._encode_piece(piece))
        return np.array(ids, dtype=np.int64)

    def decode(self, ids) -> str:
        """The text of token ids: their bytes joined, then read as UTF-8 (U+FFFD where the
        bytes are not valid UTF-8).

        Raises ``ValueError`` unless ``ids`` is 1-d with integer ids in ``[0, vocab_size)``.
        """
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"ids must be 1-d; got shape {ids.shape}")
        if ids.size == 0:
            return ""
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be integers; got dtype {ids.dtype}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"ids must lie in [0, {self.vocab_size}); got min {ids.min()}, "
                             f"max {ids.max()}")
        return b"".join(self.vocab[i] for i in ids.tolist()).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def _check_vocab_size(vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
        raise TypeError(f"vocab_size must be an integer; got {vocab_size!r}")
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be >= 256 (the 256 bytes come first); "
                         f"got {vocab_size}")
    return int(vocab_size)


def _best_pair(pair_counts: dict[tuple[int, int], int]) -> tuple[int, int]:
    """The most frequent pair; among equally frequent ones, the smallest ``(left, right)``."""
    top = max(pair_counts.values())
    return min(pair for pair, count in pair_counts.items() if count == top)


def train_bpe(text: str, vocab_size: int) -> ByteLevelBPE:
    """Learn ``vocab_size - 256`` byte-level BPE merges from ``text``.

    The text is cut into pieces (:func:`pretokenize`) and each distinct piece is counted
    once, with its frequency. Pair counts are kept up to date incrementally: merging a pair
    only changes the pieces that contain it, so only their pairs are recounted. Each step
    merges the most frequent adjacent pair; ties go to the pair with the smallest ids, left
    id first (so ``(97, 98)`` before ``(98, 97)``), which makes training deterministic.

    Parameters
    ----------
    text : str
        The training text.
    vocab_size : int
        256 byte tokens plus one token per merge.

    Returns
    -------
    ByteLevelBPE
        ``vocab[:256]`` are the single bytes, token ``256 + k`` is the ``k``-th merge.

    Shapes
    ------
    text (str) -> a tokenizer of ``vocab_size`` tokens, ``vocab_size - 256`` merges

    Raises
    ------
    TypeError
        If ``text`` is not a str or ``vocab_size`` is not an integer.
    ValueError
        If ``vocab_size < 256``, or the text runs out of pairs (every piece is already one
        token) before ``vocab_size`` is reached.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. Sennrich et al. (2016) on words;
    GPT-2 (Radford et al. 2019) on bytes.

    Examples
    --------
    Wikipedia's example: ``aa`` becomes Z, then ``ab`` becomes Y, then ``ZY`` becomes X.

    >>> bpe = train_bpe("aaabdaaabac", vocab_size=259)
    >>> bpe.merges
    {(97, 97): 256, (97, 98): 257, (256, 257): 258}
    >>> bpe.encode("aaabdaaabac")
    array([258, 100, 258,  97,  99])
    """
    _check_text(text)
    vocab_size = _check_vocab_size(vocab_size)
    piece_counts = Counter(pretokenize(text))
    pieces = [list(piece.encode("utf-8")) for piece in piece_counts]  # each distinct one once
    counts = list(piece_counts.values())
    pair_counts: Counter = Counter()
    pieces_with = defaultdict(set)  # pair -> indices of the pieces it may occur in
    for index, (ids, count) in enumerate(zip(pieces, counts)):
        for pair in zip(ids, ids[1:]):
            pair_counts[pair] += count
            pieces_with[pair].add(index)
    vocab = [bytes([byte]) for byte in range(256)]
    merges = {}
    for new_id in range(256, vocab_size):
        if not pair_counts:
            raise ValueError(f"vocab_size={vocab_size} needs {vocab_size - 256} merges, but "
                             f"the text allows only {len(merges)}")
        pair = _best_pair(pair_counts)
        merges[pair] = new_id
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        for index in pieces_with.pop(pair):
            _merge_in_piece(pieces, index, counts[index], pair, new_id, pair_counts,
                            pieces_with)
    return ByteLevelBPE(vocab, merges)


def _merge_in_piece(pieces, index, count, pair, new_id, pair_counts, pieces_with) -> None:
    """Merge ``pair`` inside ``pieces[index]`` (seen ``count`` times) and move its pair counts
    from the old ids to the new ones."""
    old = pieces[index]
    new = merge_pair(old, pair, new_id)
    if len(new) == len(old):  # an earlier merge already took the pair apart here
        return
    pieces[index] = new
    for old_pair in zip(old, old[1:]):
        pair_counts[old_pair] -= count
        if pair_counts[old_pair] == 0:
            del pair_counts[old_pair]
    for new_pair in zip(new, new[1:]):
        pair_counts[new_pair] += count
        pieces_with[new_pair].add(index)
