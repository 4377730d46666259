"""Corpora: documents, the JSONL shapes we read, and an on-disk document store.

A corpus is a JSONL file (plain, ``.gz`` or ``.xz``), one document per line, in any of three shapes:

- ours: ``{"id", "title", "text"}``;
- BEIR: ``{"_id", "title", "text"}``;
- wiki-18 (DPR / Search-R1): ``{"id", "contents"}`` where ``contents`` is ``"title\\ntext"``.

Every index keeps its own copy of the documents in a :class:`DocStore` (a JSONL file plus a
memory-mapped offset array), so search backends only deal in integer row numbers.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import itertools
import json
import lzma
import mmap
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, overload

import numpy as np

from agent_gym.error import IndexOutOfRange, InvalidType, InvalidValue
from agent_gym.jsonl import iter_jsonl
from agent_gym.retrieval_index.base import Hit, IndexCorruptError

try:  # decodes a document line in ~1.6 us where json.loads takes ~3.6 us (measured, 100k-page store)
    import msgspec

    class _Fields(msgspec.Struct):
        """A store line's fields: decoded into this, a line skips building a dict (0.8 against 1.0 us a hit)."""

        id: str
        title: str
        text: str

    _decode_fields = msgspec.json.Decoder(_Fields).decode
except ImportError:  # msgspec comes with the retrieval extra
    _decode_fields = None


def _decode_line(line: bytes) -> tuple[str, str, str]:
    """A store line's id, title and text."""
    if _decode_fields is not None:
        try:
            fields = _decode_fields(line)
            return fields.id, fields.title, fields.text
        except ValueError:  # msgspec is stricter than json (lone surrogate escapes): let json decide
            pass
    record = json.loads(line)
    return record["id"], record["title"], record["text"]

__all__ = [
    "CorpusFile",
    "Document",
    "as_document",
    "DocStore",
    "corpus_checksum",
    "iter_corpus",
    "load_corpus",
    "make_hit_lists",
    "make_hits",
    "write_corpus",
]


@dataclass(frozen=True)
class Document:
    """One passage of a corpus."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Title and text as one string: what the sparse and dense indexes see."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def _open_text(path: Path, mode: str) -> IO[str]:
    """Open a plain, gzip, xz or bz2 file in text mode, chosen by suffix."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    if suffix in (".xz", ".lzma"):
        return lzma.open(path, mode + "t", encoding="utf-8")
    if suffix == ".bz2":
        return bz2.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _document_from_record(record: object, path: Path, line_number: int) -> Document:
    if not isinstance(record, dict):
        raise InvalidValue(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
    doc_id = record.get("id", record.get("_id", record.get("docid")))
    if doc_id is None:
        raise InvalidValue(
            f"{path}:{line_number}: document has no 'id' (or BEIR '_id') field; keys are {sorted(record)}"
        )
    if "text" in record:
        title, text = record.get("title") or "", record["text"]
    elif "contents" in record:
        # wiki-18 packs the title into the first line of contents (DPR's psgs_w100 -> Search-R1 format).
        title, _, text = str(record["contents"]).partition("\n")
        title = title.strip().strip('"')
    else:
        raise InvalidValue(
            f"{path}:{line_number}: document {doc_id!r} has neither 'text' nor 'contents'; "
            f"expected {{'id','title','text'}}, BEIR {{'_id','title','text'}} or wiki-18 {{'id','contents'}}"
        )
    return Document(id=str(doc_id), title=str(title), text=str(text))


def as_document(item: Document | Mapping[str, object]) -> Document:
    """A :class:`Document` from a document or a record in any accepted shape (ours, BEIR, wiki-18)."""
    if isinstance(item, Document):
        return item
    if isinstance(item, Mapping):
        return _document_from_record(dict(item), Path("<records>"), 0)
    raise InvalidType(f"expected a Document or a {{'id','title','text'}} mapping, got {type(item).__name__}")


def iter_corpus(path: str | os.PathLike[str]) -> Iterator[Document]:
    """Stream the documents of a JSONL corpus (plain, ``.gz``, ``.xz``), skipping blank lines.

    Raises:
        FileNotFoundError: the file does not exist (the message says how to get one).
        ValueError: a line is not valid JSON or not a document (the message names the line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus file {path} does not exist. Pass the path of a JSONL corpus with one "
            '{"id", "title", "text"} object per line (BEIR "_id" and wiki-18 "contents" also work), '
            'or use corpus="distractor" to build one from the dataset\'s own context paragraphs.'
        )
    with _open_text(path, "r") as handle:
        for line_number, record in iter_jsonl(handle, path):
            yield _document_from_record(record, path, line_number)


class CorpusFile(Iterable[Document]):
    """A corpus file that can be iterated more than once, streaming (for corpora too big for memory)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.is_file():
            list(iter_corpus(self.path))  # raises the FileNotFoundError that says what to do

    def __iter__(self) -> Iterator[Document]:
        return iter_corpus(self.path)


def load_corpus(path: str | os.PathLike[str]) -> list[Document]:
    """Read a whole JSONL corpus into memory (see :func:`iter_corpus`)."""
    return list(iter_corpus(path))


def write_corpus(docs: Iterable[Document | Mapping[str, Any]], path: str | os.PathLike[str]) -> int:
    """Write documents (or ``{"id","title","text"}`` mappings) as JSONL, compressed by suffix; return the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with _open_text(path, "w") as handle:
        for item in docs:
            doc = as_document(item)
            handle.write(json.dumps({"id": doc.id, "title": doc.title, "text": doc.text}, ensure_ascii=False))
            handle.write("\n")
            count += 1
    return count


def corpus_checksum(path: str | os.PathLike[str], chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of the corpus file's bytes, as ``"sha256:<hex>"``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


_REBUILD = "rebuild the index with `agent-gym index build --corpus CORPUS --out DIR` (or copy it again whole)"


class DocStore(Sequence[Document]):
    """Documents on disk, fetched by row number through a memory map.

    Layout: ``docs.jsonl`` (our shape) and ``docs.offsets.npy`` (``n + 1`` byte offsets: uint32 where the
    data is under 4 GiB, else uint64).
    Reading is thread-safe: nothing but the read-only maps is shared.
    """

    DATA = "docs.jsonl"
    OFFSETS = "docs.offsets.npy"

    def __init__(self, directory: str | os.PathLike[str]):
        directory = Path(directory)
        self.directory = directory
        data_path, offsets_path = directory / self.DATA, directory / self.OFFSETS
        if not data_path.is_file() or not offsets_path.is_file():
            raise FileNotFoundError(
                f"no document store in {directory} (expected {self.DATA} and {self.OFFSETS})"
            )
        try:
            # A plain ndarray view: indexing an np.memmap builds a memmap scalar each time (measured 2x slower).
            self._offsets = np.load(offsets_path, mmap_mode="r").view(np.ndarray)
        except ValueError as error:  # a cut .npy does not parse
            raise IndexCorruptError(f"{offsets_path} is truncated or corrupt ({error}); {_REBUILD}") from None
        self._file = open(data_path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        # The last offset is the byte count the build wrote: a shorter file fails every search on a cut line.
        expected = int(self._offsets[-1]) if len(self._offsets) else 0
        if size != expected:
            self._file.close()
            state = "truncated" if size < expected else "longer than built"
            raise IndexCorruptError(
                f"{data_path} is {state}: {size} bytes where the build wrote {expected}; {_REBUILD}"
            )
        # Records are read with pread where the OS has it: mapped pages would count in this process's RSS, and
        # the kernel maps 64 KB around each touched page (measured: 20,000 hits of a 10^6-page store grew RSS by
        # 290 MB through a memory map, by 0 with pread, at 2.5 us a hit against 6-12 us).
        self._fd = self._file.fileno() if hasattr(os, "pread") else None
        self._map = (mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
                     if size and self._fd is None else b"")

    @staticmethod
    def write(docs: Iterable[Document], directory: str | os.PathLike[str]) -> int:
        """Write a store for ``docs`` into ``directory``; return the number of documents."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        offsets = [0]
        with open(directory / DocStore.DATA, "wb") as handle:
            for doc in docs:
                line = json.dumps({"id": doc.id, "title": doc.title, "text": doc.text}, ensure_ascii=False)
                handle.write(line.encode("utf-8") + b"\n")
                offsets.append(handle.tell())
        # 4 bytes an offset where the data fits in 4 GiB (a search touches the offsets of every hit, so they
        # count in its RSS); 8 beyond. Readers take either (stores written before this have 8 everywhere).
        width = np.uint32 if offsets[-1] < 2**32 else np.uint64
        np.save(directory / DocStore.OFFSETS, np.asarray(offsets, dtype=width))
        return len(offsets) - 1

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> Document: ...

    @overload
    def __getitem__(self, index: slice) -> list[Document]: ...

    def __getitem__(self, index: int | slice) -> Document | list[Document]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"document row {index} out of range (store has {len(self)})")
        doc_id, title, text = self._fields(index)
        return Document(id=doc_id, title=title, text=text)

    def _fields(self, row: int) -> tuple[str, str, str]:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        if self._file.closed:  # its descriptor number may already belong to another file
            raise InvalidValue("read from a closed document store")
        return _decode_line(os.pread(self._fd, end - start, start) if self._fd is not None else self._map[start:end])

    def hits(self, rows: Iterable[int], scores: Iterable[float]) -> list[Hit]:
        """:func:`make_hits` for this store, without building a :class:`Document` per hit."""
        rows, scores = list(rows), list(scores)
        if len(rows) != len(scores):
            raise InvalidValue(f"{len(rows)} rows but {len(scores)} scores")
        return self._read_hits(np.asarray(rows, dtype=np.int64), [float(score) for score in scores])

    def hit_lists(self, rows: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> list[list[Hit]]:
        """:func:`make_hit_lists` for this store: one gather of the offsets for a whole batch."""
        keep = np.arange(rows.shape[1]) < np.asarray(counts)[:, None]
        flat = self._read_hits(np.asarray(rows)[keep].astype(np.int64), np.asarray(scores)[keep].tolist())
        bounds = [0, *np.cumsum(counts).tolist()]
        return [flat[start:stop] for start, stop in itertools.pairwise(bounds)]

    def _read_hits(self, rows: np.ndarray, scores: list[float]) -> list[Hit]:
        """The hits of ``rows`` with ``scores``: their offsets in one gather, then a read and a decode each (2.3
        against 2.6 us a hit with the offsets read per hit, wiki-100k; AMD EPYC)."""
        if len(rows) == 0:
            return []
        count = len(self)
        if int(rows.min()) < 0 or int(rows.max()) >= count:
            bad = int(rows.min()) if int(rows.min()) < 0 else int(rows.max())
            raise IndexOutOfRange(f"document row {bad} out of range (store has {count})")
        if self._file.closed:  # its descriptor number may already belong to another file
            raise InvalidValue("read from a closed document store")
        starts, ends = self._offsets[rows].tolist(), self._offsets[rows + 1].tolist()
        if self._fd is not None:
            fd, pread = self._fd, os.pread
            return [Hit(*_decode_line(pread(fd, end - start, start)), score)  # positional: 0.15 us a hit less
                    for start, end, score in zip(starts, ends, scores, strict=True)]
        data = self._map
        return [Hit(*_decode_line(data[start:end]), score)
                for start, end, score in zip(starts, ends, scores, strict=True)]

    def close(self) -> None:
        """Release the memory map and file handle; idempotent."""
        if isinstance(self._map, mmap.mmap) and not self._map.closed:
            self._map.close()
        if not self._file.closed:
            self._file.close()


def make_hits(docs: Sequence[Document], rows: Iterable[int], scores: Iterable[float]) -> list[Hit]:
    """Turn index row numbers and scores into :class:`Hit` records, in the order given."""
    if isinstance(docs, DocStore):
        return docs.hits(rows, scores)
    hits = []
    for row, score in zip(rows, scores, strict=True):
        doc = docs[int(row)]
        hits.append(Hit(id=doc.id, title=doc.title, text=doc.text, score=float(score)))
    return hits


def make_hit_lists(
    docs: Sequence[Document], rows: np.ndarray, scores: np.ndarray, counts: np.ndarray
) -> list[list[Hit]]:
    """:func:`make_hits` for a batch: query ``i``'s hits are ``rows[i, :counts[i]]`` with ``scores[i, :counts[i]]``."""
    if isinstance(docs, DocStore):
        return docs.hit_lists(rows, scores, counts)
    return [make_hits(docs, rows[i, :count].tolist(), scores[i, :count].tolist())
            for i, count in enumerate(np.asarray(counts).tolist())]
