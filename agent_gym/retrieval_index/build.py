"""Build an index from a corpus file, reopen it safely, or make a retriever straight from documents.

Backends: ``bm25`` (the embedded default engine, :data:`DEFAULT_BM25_BACKEND`), ``impact``,
``tantivy``, ``bm25s``, ``pyserini``, ``dense`` (FAISS + sentence-transformers) and ``hybrid`` (RRF of a BM25
engine and a dense index). An index directory holds ``manifest.json``, the document store
(``docs.jsonl`` + offsets) and one subdirectory per engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import Retriever
from agent_gym.retrieval_index.corpus import CorpusFile, DocStore, Document, as_document, iter_corpus
from agent_gym.retrieval_index.engines import DEFAULT_BM25_BACKEND
from agent_gym.retrieval_index.engines.tantivy_bm25s import BM25sRetriever, TantivyBM25
from agent_gym.retrieval_index.manifest import MANIFEST_NAME, Manifest

__all__ = [
    "BACKENDS",
    "IndexBuildConfig",
    "build_index",
    "make_retriever",
    "open_index",
    "resolve_backend",
]

BACKENDS = ("bm25", "impact", "tantivy", "bm25s", "pyserini", "dense", "hybrid")
SPARSE_BACKENDS = ("impact", "tantivy", "bm25s", "pyserini")


@dataclass(kw_only=True)
class IndexBuildConfig:
    """What ``agent-gym index build`` builds (its flags come from these fields):
    ``build_index(config.corpus, config.out, config.backend, config.encoder, **config.engine_params())``."""

    corpus: str = field(metadata={"required": True,
                                  "help": "JSONL corpus ({id,title,text}, BEIR or wiki-18; .gz/.xz ok)"})
    backend: str = field(default="bm25", metadata={
        "choices": BACKENDS,
        "help": f"retrieval engine (bm25 = {DEFAULT_BM25_BACKEND}, chosen by benchmarks/retrieval.py)"})
    out: str = field(metadata={"required": True, "help": "index directory to write"})
    encoder: str | None = field(default=None, metadata={
        "help": "sentence-transformers model for dense/hybrid (default: all-MiniLM-L6-v2, offline)"})
    faiss_index: Literal["flat", "hnsw", "ivfpq"] | None = field(default=None, metadata={
        "help": "FAISS index for dense/hybrid"})
    param: list[Any] = field(default_factory=list, metadata={
        "append": True, "metavar": "KEY=VALUE",
        "help": "engine parameter, repeatable (e.g. k1=0.9 with --backend bm25s or pyserini, nlist=1024 with dense, "
                "sparse=bm25s with hybrid); tantivy, the bm25 default, takes none (it fixes k1=1.2, b=0.75)"})

    def engine_params(self) -> dict[str, Any]:
        """``param`` (``(key, value)`` pairs, or ``"key=value"`` strings) and ``faiss_index`` as keyword arguments
        of the engine; a value reads as an int, else a float, else stays text."""
        params: dict[str, Any] = {}
        for item in self.param:
            key, value = parse_engine_param(item) if isinstance(item, str) else item
            params[key] = value
        if self.faiss_index:
            params["faiss_index"] = self.faiss_index
        return params


def parse_engine_param(text: str) -> tuple[str, Any]:
    """``"k1=0.9"`` -> ``("k1", 0.9)``: an int, else a float, else the text; raises ``InvalidValue`` without ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidValue(f"expected KEY=VALUE, got {text!r}")
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            continue
    return key, value
# Engines whose build streams the corpus instead of holding it in memory (bm25s keeps every
# document's token ids; dense encodes in one pass; impact reads the corpus once, keeping its postings).
STREAMING_ENGINES = ("impact", "tantivy", "pyserini")

# Parameters each backend accepts; build-time ones shape the index, search-time ones are stored in
# the manifest and used as defaults when the index is opened.
_BUILD_PARAMS: dict[str, set[str]] = {
    "impact": {"k1", "b", "stemmer"},
    "tantivy": set(),
    "bm25s": {"k1", "b", "method", "stemmer"},
    "pyserini": {"threads", "heap"},
    "dense": {"faiss_index", "m", "ef_construction", "nlist", "pq_m", "nbits"},
}
_SEARCH_PARAMS: dict[str, set[str]] = {
    "impact": {"processes"},
    "tantivy": set(),
    "bm25s": set(),
    "pyserini": {"k1", "b"},
    "dense": {"ef_search", "nprobe"},
}
# tantivy (0.27, Python and Rust) hard-codes its BM25 constants: upstream issue quickwit-oss/tantivy#2195.
_TANTIVY_BM25_HINT = ("tantivy fixes k1=1.2, b=0.75 (Lucene's defaults); for other BM25 parameters (Pyserini's "
                      "k1=0.9, b=0.4, say) use --backend impact, bm25s or pyserini")


def _unknown_params_message(backend: str, unknown: set[str], allowed: set[str], engine: str) -> str:
    message = f"backend {backend!r} does not take {sorted(unknown)}; it accepts {sorted(allowed) or 'no parameters'}"
    if engine == "tantivy" and unknown & {"k1", "b"}:
        message += f". {_TANTIVY_BM25_HINT}"
    return message


def resolve_backend(name: str) -> str:
    """The concrete engine for a backend name (``"bm25"`` is :data:`DEFAULT_BM25_BACKEND`)."""
    if name not in BACKENDS:
        raise InvalidValue(f"unknown retrieval backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return DEFAULT_BM25_BACKEND if name == "bm25" else name


def _split_params(backend: str, params: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """For ``hybrid``: (sparse engine, its params, dense params); else (backend, params, {})."""
    if backend != "hybrid":
        allowed = _BUILD_PARAMS[backend] | _SEARCH_PARAMS[backend]
        unknown = set(params) - allowed
        if unknown:
            raise InvalidValue(_unknown_params_message(backend, unknown, allowed, backend))
        return backend, dict(params), {}
    params = dict(params)
    sparse = resolve_backend(params.pop("sparse", "bm25"))
    if sparse not in SPARSE_BACKENDS:
        raise InvalidValue(f"hybrid's sparse part must be one of {SPARSE_BACKENDS} or 'bm25', got {sparse!r}")
    k_rrf = params.pop("k_rrf", None)
    sparse_allowed = _BUILD_PARAMS[sparse] | _SEARCH_PARAMS[sparse]
    dense_allowed = _BUILD_PARAMS["dense"] | _SEARCH_PARAMS["dense"]
    unknown = set(params) - sparse_allowed - dense_allowed
    if unknown:
        raise InvalidValue(_unknown_params_message("hybrid", unknown, sparse_allowed | dense_allowed, sparse))
    sparse_params = {key: value for key, value in params.items() if key in sparse_allowed}
    dense_params = {key: value for key, value in params.items() if key in dense_allowed}
    if k_rrf is not None:
        dense_params["k_rrf"] = k_rrf
    return sparse, sparse_params, dense_params


def _sparse_class(engine: str) -> type:
    if engine == "impact":
        from agent_gym.retrieval_index.engines.impact_bm25 import (
            ImpactBM25,  # loads its compiled kernel: import only when used
        )

        return ImpactBM25
    if engine == "tantivy":
        return TantivyBM25
    if engine == "bm25s":
        return BM25sRetriever
    from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniBM25  # optional extra: import lazily

    return PyseriniBM25


def _read_documents(corpus_path: str | os.PathLike[str], show_progress: bool) -> list[Document]:
    return list(
        tqdm(
            iter_corpus(corpus_path),
            desc=f"reading {Path(corpus_path).name}",
            unit="doc",
            disable=not show_progress,
        )
    )


def _only(params: dict[str, Any], names: set[str]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key in names}


class _IdRecorder:
    """Records a 64-bit hash of each document id that streams through, to find repeated ids afterwards in
    8 bytes a document (wiki-18's 21M passages: 168 MB, where a set of the id strings would take gigabytes)."""

    def __init__(self) -> None:
        self.hashes = array("Q")

    def through(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            digest = hashlib.blake2b(doc.id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            self.hashes.append(int.from_bytes(digest, "little"))
            yield doc

    def refuse_repeats(self, store: Sequence[Document], corpus_path: str | os.PathLike[str]) -> None:
        """Raise ``ValueError`` naming one repeated id, where it occurs, and how many ids repeat."""
        hashes = np.frombuffer(self.hashes, dtype=np.uint64) if len(self.hashes) else np.zeros(0, np.uint64)
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        repeated_hashes = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
        rows_by_id: dict[str, list[int]] = {}
        for value in repeated_hashes:  # compare the ids themselves: two ids may share a hash
            for row in np.flatnonzero(hashes == value).tolist():
                rows_by_id.setdefault(store[row].id, []).append(row)
        repeats = {doc_id: rows for doc_id, rows in rows_by_id.items() if len(rows) > 1}
        if not repeats:
            return
        doc_id, rows = min(repeats.items(), key=lambda item: item[1][0])
        raise InvalidValue(
            f"corpus {corpus_path}: document id {doc_id!r} is used by documents {rows[0] + 1} and {rows[1] + 1} "
            f"(counted from 1 in file order); {len(repeats)} ids are repeated in all. Ids name the search hits, "
            "so they must be unique: give each passage its own id and build again"
        )


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir} is a file, not a directory: give --out a directory for the index "
                                 "(it is created, or replaced if it holds an index)")
    if out_dir.is_dir() and not (out_dir / MANIFEST_NAME).is_file() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and holds no index (no {MANIFEST_NAME}), so it is not replaced: "
                              "choose another --out, or remove that directory first")


def _index_entries() -> set[str]:
    """The names an index directory may hold for itself: manifest, document store, each engine's folder."""
    from agent_gym.retrieval_index.engines.dense_faiss import DenseRetriever
    from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25
    from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniBM25

    engines = (ImpactBM25, TantivyBM25, BM25sRetriever, DenseRetriever, PyseriniBM25)
    return {MANIFEST_NAME, DocStore.DATA, DocStore.OFFSETS, *(engine.SUBDIR for engine in engines)}


_SWAP_RECORD = ".swap.json"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _move_into_place(staging: Path, out_dir: Path) -> None:
    """Rename a finished build to ``out_dir``, replacing an earlier index (or an empty directory) there.

    Other files in ``out_dir`` (the corpus, say) stay: then the old index's entries are swapped one by one,
    manifest out first and in last, so the directory never holds a manifest over a half-replaced index.
    If a rename fails midway, the swap is undone and the earlier index is whole again; if the process is
    killed midway, the next build puts it back (:func:`_remove_stale_staging`).
    """
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    retired = out_dir.with_name(f".{out_dir.name}.replaced-{os.getpid()}")
    # Whatever the new build wrote is the index's own, so it can never collide with a user's file.
    own = _index_entries() | {entry.name for entry in staging.iterdir()}
    others = [entry for entry in out_dir.iterdir() if entry.name not in own]
    if not others:
        out_dir.rename(retired)
        try:
            staging.rename(out_dir)
        except BaseException:
            retired.rename(out_dir)
            raise
    else:
        retired.mkdir()
        old = sorted((entry for entry in out_dir.iterdir() if entry.name in own), key=lambda e: e.name != MANIFEST_NAME)
        new = sorted(staging.iterdir(), key=lambda e: e.name == MANIFEST_NAME)
        # What moves where, for the next build to undo the swap if this process is killed during it.
        (retired / _SWAP_RECORD).write_text(json.dumps({"old": [entry.name for entry in old],
                                                        "new": [entry.name for entry in new]}))
        moved_out: list[str] = []
        moved_in: list[str] = []
        try:
            for entry in old:
                entry.rename(retired / entry.name)
                moved_out.append(entry.name)
            for entry in new:
                entry.rename(out_dir / entry.name)
                moved_in.append(entry.name)
        except BaseException:
            for name in reversed(moved_in):  # the new build goes back to staging (removed by the caller)
                (out_dir / name).rename(staging / name)
            for name in reversed(moved_out):  # and the old index back into place, manifest last
                (retired / name).rename(out_dir / name)
            shutil.rmtree(retired)
            raise
        staging.rmdir()
    shutil.rmtree(retired, ignore_errors=True)  # a server still reading it keeps its open files


def _restore_retired(retired: Path, out_dir: Path) -> None:
    """Undo a swap that a killed build left half done: put the earlier index in ``retired`` back into
    ``out_dir`` unless the new one was complete there (its manifest moves in last)."""
    if (out_dir / MANIFEST_NAME).is_file() or not (retired / MANIFEST_NAME).is_file():
        shutil.rmtree(retired, ignore_errors=True)  # the swap finished (or nothing to restore)
        return
    if not out_dir.exists():
        retired.rename(out_dir)
        return
    record = retired / _SWAP_RECORD
    swap = json.loads(record.read_text()) if record.is_file() else {"old": [], "new": []}
    record.unlink(missing_ok=True)
    # The new entries move in only after every old one moved out: a name only the new index has is the
    # unfinished new index's; an old name that is not in ``retired`` was never moved out.
    for entry in out_dir.iterdir():
        if entry.name in set(swap["new"]) - set(swap["old"]):
            _remove(entry)
    for entry in sorted(retired.iterdir(), key=lambda e: e.name == MANIFEST_NAME):
        target = out_dir / entry.name
        if target.exists() or target.is_symlink():
            _remove(target)  # the unfinished new index's entry of the same name
        entry.rename(target)
    retired.rmdir()


def _remove_stale_staging(out_dir: Path) -> None:
    """Clean up after a build whose process is gone (a kill -9): delete its hidden build directory, and
    finish or undo its swap, so the earlier index is never lost."""
    if not out_dir.parent.is_dir():
        return
    for entry in out_dir.parent.glob(f".{out_dir.name}.replaced-*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            _restore_retired(entry, out_dir)
    for entry in out_dir.parent.glob(f".{out_dir.name}.building-*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def build_index(
    corpus_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    backend: str = "bm25",
    encoder: str | None = None,
    *,
    show_progress: bool = True,
    **params: Any,
) -> Manifest:
    """Index a JSONL corpus into ``out_dir`` and write its ``manifest.json``; return the manifest.

    The index is built in a directory beside ``out_dir`` and renamed into place when complete, so a failed
    build leaves nothing behind and an earlier index at ``out_dir`` untouched. Document ids must be unique
    (they name the hits); a corpus that repeats one is refused before any engine indexes it.

    ``params`` go to the engine: impact ``k1, b, stemmer``, ``processes`` (search workers, see
    :class:`~agent_gym.retrieval_index.engines.impact_bm25.ImpactBM25`); bm25s ``k1, b, method, stemmer``;
    pyserini ``threads, heap, k1, b``; dense ``faiss_index`` (flat | hnsw | ivfpq),
    ``m, ef_construction, nlist, pq_m, nbits``, ``ef_search, nprobe``;
    hybrid ``sparse`` (a BM25 engine), ``k_rrf`` and any of those. tantivy takes none (its BM25 constants
    are fixed).

    Raises:
        ValueError: unknown backend or parameter, an empty corpus, a malformed line, repeated ids.
        FileNotFoundError: no corpus file.
        NotADirectoryError / FileExistsError: ``out_dir`` is a file, or a directory that holds no index.
    """
    engine = resolve_backend(backend)
    sparse, sparse_params, dense_params = _split_params(engine, params)
    if engine == "dense":
        sparse_params, dense_params = {}, sparse_params
    if encoder is not None and engine not in ("dense", "hybrid"):
        raise InvalidValue(f"backend {backend!r} uses no encoder; pass --encoder only with dense or hybrid")
    out_dir = Path(out_dir)
    _remove_stale_staging(out_dir)  # first: it may put back an index that a killed rebuild was replacing
    _check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        if engine in STREAMING_ENGINES:
            # Stream the file (twice: document store, then engine) so corpora larger than memory build.
            docs: Iterable[Document] = CorpusFile(corpus_path)
        else:
            docs = _read_documents(corpus_path, show_progress)
        # The document store first: its pass is cheap, and it finds repeated ids before any costly indexing.
        ids = _IdRecorder()
        doc_count = DocStore.write(
            tqdm(ids.through(docs), desc="writing document store", unit="doc", disable=not show_progress), staging
        )
        if doc_count == 0:
            raise InvalidValue(f"corpus {corpus_path} has no documents")
        store = DocStore(staging)
        try:
            ids.refuse_repeats(store, corpus_path)
        finally:
            store.close()
        encoder_name = None
        if engine in ("dense", "hybrid"):
            from agent_gym.retrieval_index.engines.dense_faiss import DenseRetriever, encoder_spec

            encoder_name = encoder_spec(encoder).name
            dense_build = _only(dense_params, _BUILD_PARAMS["dense"])
            DenseRetriever.build(
                docs, staging, encoder=encoder_name, store_docs=False, show_progress=show_progress, **dense_build
            )
        if engine != "dense":
            _sparse_class(sparse).build(
                docs,
                staging,
                store_docs=False,
                show_progress=show_progress,
                **_only(sparse_params, _BUILD_PARAMS[sparse]),
            )
        recorded = dict(params)
        if engine == "hybrid":
            recorded["sparse"] = sparse
        manifest = Manifest.for_corpus(corpus_path, engine, doc_count, encoder=encoder_name, params=recorded,
                                       docs_bytes=(staging / DocStore.DATA).stat().st_size)
        manifest.write(staging)
        _move_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _open_engine(directory: Path, engine: str, params: dict[str, Any], docs: Sequence[Document]) -> Retriever:
    from agent_gym.retrieval_index.engines.dense_faiss import DenseRetriever

    if engine == "dense":
        return DenseRetriever.open(directory, docs, **_only(params, _SEARCH_PARAMS["dense"]))
    return _sparse_class(engine).open(directory, docs, **_only(params, _SEARCH_PARAMS[engine]))


def open_index(
    directory: str | os.PathLike[str],
    corpus_path: str | os.PathLike[str] | None = None,
    encoder: str | None = None,
    **search_params: Any,
) -> Retriever:
    """Open an index built by :func:`build_index`, after checking it against the requested corpus/encoder.

    Raises:
        IndexNotFoundError: ``directory`` holds no complete index.
        IndexMismatchError: it was built from another corpus, or with another encoder; the message
            gives the ``agent-gym index build`` command that fixes it.
    """
    directory = Path(directory)
    manifest = Manifest.read(directory)
    if encoder is not None:
        from agent_gym.retrieval_index.engines.dense_faiss import encoder_spec

        encoder = encoder_spec(encoder).name
    manifest.check(directory, corpus_path, encoder)
    manifest.check_files(directory)
    params = {**manifest.params, **search_params}
    docs = DocStore(directory)
    if manifest.backend != "hybrid":
        return _open_engine(directory, manifest.backend, params, docs)
    from agent_gym.retrieval_index.engines.hybrid_rrf import HybridRetriever

    sparse, sparse_params, dense_params = _split_params("hybrid", params)
    k_rrf = dense_params.pop("k_rrf", 60.0)
    return HybridRetriever(
        _open_engine(directory, sparse, sparse_params, docs),
        _open_engine(directory, "dense", dense_params, docs),
        k_rrf=float(k_rrf),
    )


def make_retriever(
    kind: str,
    docs: Iterable[Document | Mapping[str, Any]] | None = None,
    corpus_path: str | os.PathLike[str] | None = None,
    *,
    encoder: str | None = None,
    embedding_cache: bool | str | os.PathLike[str] = True,
    show_progress: bool = False,
    **params: Any,
) -> Retriever:
    """A retriever of any backend over ``docs`` (or the corpus file), built in memory.

    ``docs`` may be :class:`Document` objects or ``{"id", "title", "text"}`` records (BEIR and
    wiki-18 shapes too). Pyserini builds into a temporary directory that :meth:`Retriever.close`
    deletes. Used by the environments (``retriever=`` kwarg) for corpora small enough to index
    on the fly. Dense passage vectors are cached on disk (``embedding_cache``: ``True`` for
    :func:`~agent_gym.retrieval_index.engines.dense_faiss.default_embedding_cache`, a directory, or ``False``),
    so only the first process to index a corpus pays for encoding it.
    """
    if (docs is None) == (corpus_path is None):
        raise InvalidValue("make_retriever needs exactly one of docs= or corpus_path=")
    documents = (
        [as_document(doc) for doc in docs]
        if docs is not None
        else _read_documents(corpus_path, show_progress)
    )
    engine = resolve_backend(kind)
    if encoder is not None and engine not in ("dense", "hybrid"):
        raise InvalidValue(f"retriever {kind!r} uses no encoder; pass encoder= only with dense or hybrid")
    sparse, sparse_params, dense_params = _split_params(engine, params)
    cache = None
    if engine in ("dense", "hybrid") and embedding_cache is not False:
        from agent_gym.retrieval_index.engines.dense_faiss import default_embedding_cache

        cache = default_embedding_cache() if embedding_cache is True else Path(embedding_cache)
    if engine == "dense":
        from agent_gym.retrieval_index.engines.dense_faiss import DenseRetriever

        return DenseRetriever.from_documents(
            documents, encoder=encoder, cache_dir=cache, show_progress=show_progress, **sparse_params
        )
    if engine != "hybrid":
        return _sparse_class(engine).from_documents(documents, show_progress=show_progress, **sparse_params)
    from agent_gym.retrieval_index.engines.dense_faiss import DenseRetriever
    from agent_gym.retrieval_index.engines.hybrid_rrf import HybridRetriever

    k_rrf = dense_params.pop("k_rrf", 60.0)
    sparse_retriever = _sparse_class(sparse).from_documents(
        documents, show_progress=show_progress, **sparse_params
    )
    dense_retriever = DenseRetriever.from_documents(
        documents, encoder=encoder, cache_dir=cache, show_progress=show_progress, **dense_params
    )
    return HybridRetriever(sparse_retriever, dense_retriever, k_rrf=float(k_rrf))
