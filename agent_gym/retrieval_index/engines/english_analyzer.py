"""Lucene's English analysis in Python, shared by the embedded BM25 engines (impact, tantivy, bm25s): words,
lowercase, Lucene's 33 stopwords, Porter stems (PyStemmer "porter": 0.977 top-10 overlap with Pyserini against
0.942 with Porter2, shared/notes/retrieval.md)."""

from __future__ import annotations

import re
import threading

__all__ = ["LUCENE_STOPWORDS", "EnglishAnalyzer"]

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, which Pyserini's default analyzer uses.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)

_WORD = re.compile(r"\w+")
# Unicode word-boundary rules (UAX #29) as Lucene's StandardTokenizer applies them to Latin text:
# letters join across ' . : (can't, U.S), digits across , . ; ' (4,527,000, 3.5).
_STANDARD_WORD = re.compile(r"\w+(?:(?:(?<=[^\W\d_])[.:'\u2019](?=[^\W\d_])|(?<=\d)[.,;'\u2019](?=\d))\w+)*")


class EnglishAnalyzer:
    """Lucene-like English analysis: words, lowercase, Lucene stopwords, Porter stems.

    Words are ``\\w+`` runs; with ``standard_tokens=True`` they follow Lucene's StandardTokenizer
    and EnglishPossessiveFilter more closely (Pyserini's analysis): ``4,527,000``, ``3.5``, ``U.S``
    and ``don't`` stay one word, and a trailing ``'s`` is dropped. Document lengths, and so BM25
    scores and their ties, then match Lucene's on text full of numbers and possessives.

    Stems are cached per word (the vocabulary is small next to the token count); PyStemmer
    objects are not thread-safe, so stemming a new word takes a lock.
    """

    def __init__(self, stemmer: str = "porter", max_cache: int = 2_000_000, *, standard_tokens: bool = False):
        import Stemmer  # PyStemmer

        self.stemmer_name = stemmer
        self.standard_tokens = standard_tokens
        self._words = _STANDARD_WORD if standard_tokens else _WORD
        self._stemmer = Stemmer.Stemmer(stemmer)
        self._cache: dict[str, str] = {}
        self._max_cache = max_cache
        self._lock = threading.Lock()

    def _stem(self, word: str) -> str:
        key = word
        if self.standard_tokens and word.endswith(("'s", "\u2019s")):
            word = word[:-2]  # EnglishPossessiveFilter
        with self._lock:
            if len(self._cache) >= self._max_cache:
                self._cache.clear()
            stem = "" if word in LUCENE_STOPWORDS else self._stemmer.stemWord(word)
            self._cache[key] = stem
        return stem

    def __call__(self, text: str) -> list[str]:
        cache = self._cache
        tokens = []
        for word in self._words.findall(text.lower()):
            stem = cache.get(word)
            if stem is None:
                stem = self._stem(word)
            if stem:
                tokens.append(stem)
        return tokens
