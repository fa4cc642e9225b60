"""BERT's WordPiece tokenizer in plain Python, from a ``vocab.txt`` (chapter 15).

Two steps. The *basic* tokenizer cleans the text (drops control characters, turns every
whitespace into a space), lowercases it and strips accents, puts spaces around CJK characters,
and splits on whitespace and on every punctuation character. *WordPiece* then cuts each word
greedily into the longest pieces found in the vocabulary, pieces after the first carrying the
prefix ``##``; a word that cannot be cut becomes ``[UNK]``. The result equals the
``tokenizers`` library's BERT tokenizer for all-MiniLM-L6-v2 (tested).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["WordPiece"]


def _is_punctuation(char: str) -> bool:
    # BERT counts every non-alphanumeric ASCII character as punctuation ("$", "^", "`" are not
    # Unicode punctuation), plus everything Unicode calls punctuation.
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2A6DF
            or 0x2A700 <= code <= 0x2B73F or 0x2B740 <= code <= 0x2B81F
            or 0x2B820 <= code <= 0x2CEAF or 0xF900 <= code <= 0xFAFF
            or 0x2F800 <= code <= 0x2FA1F)


def _clean(text: str) -> str:
    # As the tokenizers library's BertNormalizer: drop NUL, U+FFFD and control characters
    # (Unicode category C*, except tab and newlines), turn whitespace into spaces, and put
    # spaces around CJK characters so that each becomes a word.
    out = []
    for char in text:
        if char in "\t\n\r" or char.isspace() and not unicodedata.category(char).startswith("C"):
            out.append(" ")
        elif char in ("\x00", "\ufffd") or unicodedata.category(char).startswith("C"):
            continue
        elif _is_cjk(ord(char)):
            out.append(f" {char} ")
        else:
            out.append(char)
    return "".join(out)


def _strip_accents(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn")


@dataclass
class WordPiece:
    """An uncased BERT WordPiece tokenizer.

    Attributes
    ----------
    vocab : dict
        Token (str) to id (int): the line number in ``vocab.txt``.
    unk_token : str
        Stands for a word the vocabulary cannot spell.
    cls_token : str
        Opens every sequence.
    sep_token : str
        Closes every sequence.
    pad_token : str
        Fills sequences up to a common length.
    max_chars_per_word : int
        Longer words become ``[UNK]`` without being cut.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*.

    Examples
    --------
    >>> vocab = {t: i for i, t in enumerate(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "!"])}
    >>> WordPiece(vocab).tokenize("Unaffable!")
    ['[CLS]', 'un', '##aff', '##able', '!', '[SEP]']
    """

    vocab: dict[str, int]
    unk_token: str = "[UNK]"
    cls_token: str = "[CLS]"
    sep_token: str = "[SEP]"
    pad_token: str = "[PAD]"
    max_chars_per_word: int = 100

    def __post_init__(self):
        for token in (self.unk_token, self.cls_token, self.sep_token, self.pad_token):
            if token not in self.vocab:
                raise ValueError(f"the special token {token!r} is not in the vocabulary")

    @classmethod
    def from_file(cls, path) -> WordPiece:
        """Read ``vocab.txt``: one token per line, its id is the line number (from 0)."""
        lines = Path(path).read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls({token: i for i, token in enumerate(lines)})

    def basic_split(self, text: str) -> list[str]:
        """Clean, lowercase, strip accents, split on whitespace and punctuation."""
        text = _strip_accents(_clean(text)).lower()
        words = []
        for chunk in text.split():
            word = ""
            for char in chunk:
                if _is_punctuation(char):
                    if word:
                        words.append(word)
                    words.append(char)
                    word = ""
                else:
                    word += char
            if word:
                words.append(word)
        return words

    def word_pieces(self, word: str) -> list[str]:
        """Cut one word greedily into the longest vocabulary pieces (``[UNK]`` if impossible)."""
        if len(word) > self.max_chars_per_word:
            return [self.unk_token]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:  # no piece fits: the whole word is unknown
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text``, between ``[CLS]`` and ``[SEP]``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        pieces = [p for word in self.basic_split(text) for p in self.word_pieces(word)]
        return [self.cls_token, *pieces, self.sep_token]

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``, between the ids of ``[CLS]`` and ``[SEP]``."""
        return [self.vocab[token] for token in self.tokenize(text)]

    def encode_batch(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of several texts, right-padded with ``[PAD]`` to the longest.

        Shapes
        ------
        texts : n strings -> token_ids (n, T) int64, lengths (n,) int64
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings; wrap one string in a list")
        ids = [self.encode(text) for text in texts]
        if not ids:
            raise ValueError("texts is empty")
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        token_ids = np.full((len(ids), lengths.max()), self.vocab[self.pad_token], np.int64)
        for row, sequence in enumerate(ids):  # ragged input: one row at a time
            token_ids[row, :len(sequence)] = sequence
        return token_ids, lengths
