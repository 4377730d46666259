"""BM25 search speed against Pyserini in the steady state: warmed up, timed for seconds, repeated.

Each backend is opened and searched in a fresh child process per repeat (so import, JIT and memory
costs are its own), after Pyserini in the same repeat; the order of the backends rotates between
repeats. In each process: open the index (imports included), time the first query, warm up with
batches for ``--warmup-seconds`` (Lucene's JIT keeps speeding up for seconds), then run batches of
every query (top-10) for at least ``--seconds`` and count queries per second; then single-query
latency (p50/p99) over the queries. Every corpus is measured once per CPU count of ``--cpus`` (default
1 and 2): with ``c`` CPUs each backend searches with ``c`` threads, its own way (Pyserini's
``batch_search(threads=c)``; the impact engine two ways: ``impact`` splits a batch's queries across ``c``
processes, itself and ``c - 1`` workers that open the same memory-mapped index, and ``impact-threads`` across ``c``
threads of one process, its default, which holds one interpreter's memory where the processes hold ``c``; with one
CPU the two are the same and only ``impact`` runs), and each search process is pinned to ``c`` CPUs
(``--no-pin`` lifts it: the JVM then runs its JIT and garbage collector on the other cores). The ratio of a
backend is its batch q/s over Pyserini's in the same repeat and CPU count; the table gives the median over
``--repeats`` and the range. Engines with a compiled kernel (impact, bm25s-numba) are also opened once in a
process with empty kernel caches: the first process on a machine.

Memory: peak RSS of the search process (with the impact engine's workers: the sum of theirs, shared pages
counted in each; ``pss_mb`` splits them), and its split at the end into anonymous memory (the
process: interpreter, JVM heap, buffers) and file-backed pages (the memory-mapped index pages it
touched, and shared libraries); plus the index's size on disk (the document store, the same for
every backend, not counted). ``memory_ratio`` is peak RSS over Pyserini's.

Corpora (indexes are built once and cached under ``--cache-dir``; a killed run resumes):

- ``hotpotqa``: the distractor paragraphs of the shared HotpotQA dev sample (2,920), its 297 questions;
- ``synthetic-100k`` / ``synthetic-1m``: the synthetic world's pages and 2,000 of its multi-hop
  questions (templated text: few words, long posting lists);
- ``wiki-100k``: real Wikipedia word statistics: the paragraphs of the shared HotpotQA, 2Wiki and
  MuSiQue samples, plus pages made of sentences drawn from them, to 100,000 documents; the
  samples' 1,154 questions.

    python benchmarks/retrieval.py                                  # every corpus, 1 and 2 CPUs, 3 repeats
    python benchmarks/retrieval.py --corpus synthetic-100k --backends pyserini,impact,tantivy,bm25s-numba --cpus 1

Writes ``benchmarks/results/retrieval.json``: one record per corpus, backend and CPU count (``corpus``,
``docs``, ``backend``, ``cpus``, ``repeats``, ``ratio_median``, ``ratio_min``, ``ratio_max``, ``overlap``,
``memory_ratio`` (peak RSS; several processes' summed), ``memory_ratio_pss`` (proportional set size: shared index
pages counted once), ``p50_ms``/``p99_ms`` of single queries, ``build_s``, ``index_mb`` and the raw figures).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
HOTPOT_SAMPLE = SHARED / "hotpotqa" / "hotpot_dev_distractor_v1.sample297.json.xz"
TWOWIKI_SAMPLE = SHARED / "2wikimultihopqa" / "dev.sample657.json.xz"
MUSIQUE_SAMPLE = SHARED / "musique" / "musique_ans_v1.0_dev.sample200.jsonl.xz"
CORPORA = ("hotpotqa", "synthetic-100k", "synthetic-1m", "wiki-100k")
BACKENDS = ("pyserini", "impact", "impact-threads", "tantivy", "bm25s", "bm25s-numba")
DEFAULT_BACKENDS = ("pyserini", "impact", "impact-threads", "tantivy")
# Variants that search another backend's index their own way: impact-threads is the impact engine in one process
# with c threads (its default), where "impact" splits a batch across c processes. With one CPU they are the same.
SAME_INDEX = {"impact-threads": "impact"}
PEER = "pyserini"
K = 10
RESULTS = ROOT / "benchmarks" / "results" / "retrieval.json"


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ corpora


def _hotpot_records() -> list[dict]:
    with lzma.open(HOTPOT_SAMPLE, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def hotpotqa_corpus() -> tuple[list[dict], list[dict]]:
    """The distractor paragraphs (deduplicated by title) and questions of the HotpotQA dev sample."""
    records = _hotpot_records()
    docs: dict[str, dict] = {}
    for record in records:
        for title, sentences in record["context"]:
            docs.setdefault(title, {"id": f"hp{len(docs)}", "title": title, "text": "".join(sentences)})
    queries = [
        {"query": record["question"],
         "gold": sorted({docs[title]["id"] for title, _ in record["supporting_facts"] if title in docs})}
        for record in records
    ]
    return list(docs.values()), queries


def synthetic_corpus(pages: int, num_queries: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Pages and multi-hop questions of the synthetic world (agent_gym.envs.synthetic_world)."""
    from agent_gym.envs.synthetic_world import generate_world

    world = generate_world(num_pages=pages, seed=seed)
    docs = world.documents()
    id_of = {doc["title"]: doc["id"] for doc in docs}
    queries = [
        {"query": task.question, "gold": sorted(id_of[title] for title in task.supporting_titles if title in id_of)}
        for task in world.questions(n=num_queries, seed=seed)
    ]
    return docs, queries


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def wiki_like_corpus(num_docs: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Real Wikipedia paragraphs of the shared samples, topped up to ``num_docs`` with pages of their sentences.

    The filler pages take a real title and 2-6 sentences drawn from all the paragraphs, so word
    frequencies, document lengths and vocabulary growth follow Wikipedia text, unlike the templated world.
    """
    paragraphs: dict[tuple[str, str], dict] = {}
    questions: list[tuple[str, list[str]]] = []

    def add(title: str, text: str) -> str:
        key = (title, text)
        if key not in paragraphs:
            paragraphs[key] = {"id": f"wiki{len(paragraphs)}", "title": title, "text": text}
        return paragraphs[key]["id"]

    for record in _hotpot_records():
        ids = {title: add(title, "".join(sentences)) for title, sentences in record["context"]}
        questions.append((record["question"], sorted({ids[t] for t, _ in record["supporting_facts"] if t in ids})))
    with lzma.open(TWOWIKI_SAMPLE, "rt", encoding="utf-8") as handle:
        for record in json.load(handle):
            ids = {title: add(title, " ".join(sentences)) for title, sentences in record["context"]}
            questions.append((record["question"], sorted({ids[t] for t, _ in record["supporting_facts"] if t in ids})))
    with lzma.open(MUSIQUE_SAMPLE, "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            gold = [add(p["title"], p["paragraph_text"]) for p in record["paragraphs"] if p.get("is_supporting")]
            for p in record["paragraphs"]:
                add(p["title"], p["paragraph_text"])
            questions.append((record["question"], sorted(gold)))
    docs = list(paragraphs.values())
    titles = [doc["title"] for doc in docs]
    sentences = [s for doc in docs for s in _SENTENCE_END.split(doc["text"]) if len(s.split()) >= 3]
    rng = random.Random(seed)
    for number in range(max(0, num_docs - len(docs))):
        text = " ".join(rng.choice(sentences) for _ in range(rng.randint(2, 6)))
        docs.append({"id": f"wiki-filler{number}", "title": rng.choice(titles), "text": text})
    return docs, [{"query": question, "gold": gold} for question, gold in questions]


def prepare_corpus(name: str, cache: Path, num_queries: int) -> Path:
    """The corpus's directory in the cache: ``corpus.jsonl``, ``queries.json`` and a shared document store."""
    from agent_gym.retrieval_index.corpus import DocStore, Document, write_corpus

    workdir = cache / name
    if (workdir / "ready").is_file():
        return workdir
    workdir.mkdir(parents=True, exist_ok=True)
    _log(f"{name}: generating the corpus ...")
    if name == "hotpotqa":
        docs, queries = hotpotqa_corpus()
    elif name.startswith("synthetic-"):
        docs, queries = synthetic_corpus(_size(name), num_queries)
    elif name.startswith("wiki-"):
        docs, queries = wiki_like_corpus(_size(name))
    else:
        raise SystemExit(f"unknown corpus {name!r}; choose from {CORPORA}")
    documents = [Document(d["id"], d["title"], d["text"]) for d in docs]
    del docs
    write_corpus(documents, workdir / "corpus.jsonl")
    DocStore.write(documents, workdir / "store")
    (workdir / "queries.json").write_text(json.dumps(queries))
    (workdir / "ready").write_text(str(len(documents)))
    return workdir


def _size(name: str) -> int:
    size = name.split("-", 1)[1]
    return int(float(size[:-1]) * {"k": 1_000, "m": 1_000_000}[size[-1]])


# ------------------------------------------------------------------------------------------- workers


def _memory(workers: list[int] = ()) -> dict[str, float]:
    """Peak and current RSS of this process and the current split (MB), from /proc/PID/status, summed over
    it and its search ``workers`` (pids): a page the processes share (the index's memory map) counts once in
    each, so the sum overstates what they hold together. ``pss_mb``: their proportional set size now, where a
    shared page is split between the processes that map it."""
    fields = {"VmHWM": "peak_rss_mb", "VmRSS": "rss_mb", "RssAnon": "anon_mb", "RssFile": "file_mb"}
    found: dict[str, float] = {}
    for pid in ["self", *workers]:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    key = line.split(":", 1)[0]
                    if key in fields:
                        found[fields[key]] = found.get(fields[key], 0.0) + int(line.split()[1]) / 1024
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        found["pss_mb"] = found.get("pss_mb", 0.0) + int(line.split()[1]) / 1024
        except OSError:  # not Linux, or a worker that died
            pass
    if workers:
        found["processes"] = 1 + len(workers)
    return found


def _index_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


class _BM25sNumba:
    """bm25s's own ``retrieve`` on its numba backend, over the index BM25sRetriever saved (for reference);
    hits are made from the document store as every other backend's are."""

    def __init__(self, directory: Path, docs: object, threads: int) -> None:
        import bm25s

        from agent_gym.retrieval_index.engines.english_analyzer import EnglishAnalyzer

        self.model = bm25s.BM25.load(str(directory / "bm25s"), mmap=True, show_progress=False)
        self.model.backend = "numba"
        self.analyzer = EnglishAnalyzer()
        self.vocab = self.model.vocab_dict
        self.threads = threads
        self.docs = docs

    def search(self, queries: list[str], k: int) -> list[list]:
        from agent_gym.retrieval_index.corpus import make_hits

        ids = [[self.vocab[t] for t in self.analyzer(q) if t in self.vocab] or [0] for q in queries]
        rows, scores = self.model.retrieve(ids, k=k, show_progress=False, backend_selection="numba",
                                           n_threads=self.threads)
        return [make_hits(self.docs, row[score > 0], score[score > 0]) for row, score in zip(rows, scores, strict=True)]


def _index_dir(backend: str, workdir: Path) -> Path:
    return workdir / f"index-{SAME_INDEX.get(backend, backend)}"


def worker_build(backend: str, workdir: Path, args: argparse.Namespace) -> dict:
    from agent_gym.retrieval_index.corpus import CorpusFile

    index_dir = _index_dir(backend, workdir)
    docs = CorpusFile(workdir / "corpus.jsonl")
    start = time.perf_counter()
    backend = SAME_INDEX.get(backend, backend)
    if backend == "tantivy":
        from agent_gym.retrieval_index.engines.tantivy_bm25s import TantivyBM25

        TantivyBM25.build(docs, index_dir, store_docs=False, show_progress=False)
    elif backend in ("bm25s", "bm25s-numba"):
        from agent_gym.retrieval_index.engines.tantivy_bm25s import BM25sRetriever

        BM25sRetriever.build(docs, index_dir, store_docs=False, show_progress=False)
    elif backend == "impact":
        from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25

        ImpactBM25.build(docs, index_dir, store_docs=False, show_progress=False)
    elif backend == "pyserini":
        from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniBM25

        PyseriniBM25.build(docs, index_dir, store_docs=False, show_progress=False, threads=args.threads,
                           heap=args.heap)
    return {"build_s": time.perf_counter() - start, "index_mb": _index_mb(index_dir), **_memory()}


def _open(backend: str, workdir: Path, args: argparse.Namespace) -> object:
    from agent_gym.retrieval_index.corpus import DocStore

    index_dir = _index_dir(backend, workdir)
    docs = DocStore(workdir / "store")
    if backend == "bm25s-numba":
        return _BM25sNumba(index_dir, docs, args.threads)
    if backend == "tantivy":
        from agent_gym.retrieval_index.engines.tantivy_bm25s import TantivyBM25

        retriever = TantivyBM25.open(index_dir, docs)
    elif backend == "bm25s":
        from agent_gym.retrieval_index.engines.tantivy_bm25s import BM25sRetriever

        retriever = BM25sRetriever.open(index_dir, docs)
    elif backend == "impact":
        from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25

        # c CPUs: c processes of one thread each, no lock shared by the Python around the kernel
        return ImpactBM25.open(index_dir, docs, threads=1, processes=args.threads)
    elif backend == "impact-threads":
        from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25

        # c CPUs: one process, a batch split across c threads (the kernel releases the GIL): the engine's default
        return ImpactBM25.open(index_dir, docs, threads=args.threads)
    else:
        from agent_gym.retrieval_index.engines.pyserini_bm25 import configure_jvm

        configure_jvm(args.heap)
        from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniBM25

        retriever = PyseriniBM25.open(index_dir, docs)
    retriever._threads = args.threads
    return retriever


def worker_search(backend: str, workdir: Path, args: argparse.Namespace) -> dict:
    queries = [entry["query"] for entry in json.loads((workdir / "queries.json").read_text())]
    start = time.perf_counter()
    retriever = _open(backend, workdir, args)
    open_s = time.perf_counter() - start

    def search(batch: list[str]) -> list[list[tuple[str, float]]]:
        return [[hit if isinstance(hit, tuple) else (hit.id, float(hit.score)) for hit in hits]
                for hits in retriever.search(batch, K)]

    start = time.perf_counter()
    search(queries[:1])
    first_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    while time.perf_counter() - start < args.warmup_seconds:
        search(queries)
    # Steady state: whole batches until at least --seconds have passed.
    batch_qps = []
    done = 0
    start = time.perf_counter()
    while True:
        batch_start = time.perf_counter()
        results = search(queries)
        batch_qps.append(len(queries) / (time.perf_counter() - batch_start))
        done += len(queries)
        elapsed = time.perf_counter() - start
        if elapsed >= args.seconds:
            break
    qps = done / elapsed
    latencies = []
    for query in queries[: args.latency_queries]:
        query_start = time.perf_counter()
        search([query])
        latencies.append((time.perf_counter() - query_start) * 1000)
    return {
        "open_s": open_s,
        "first_ms": first_ms,
        "qps": qps,
        "batches": len(batch_qps),
        "batch_qps_min": min(batch_qps),
        "batch_qps_max": max(batch_qps),
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "results": results,
        **_memory(getattr(getattr(retriever, "_workers", None), "pids", [])),
    }


def worker_coldstart(backend: str, workdir: Path, args: argparse.Namespace) -> dict:
    """Open and first query in a process whose JIT cache is empty (the first process on a new machine)."""
    queries = [entry["query"] for entry in json.loads((workdir / "queries.json").read_text())]
    start = time.perf_counter()
    retriever = _open(backend, workdir, args)
    open_s = time.perf_counter() - start
    start = time.perf_counter()
    retriever.search(queries[:1], K)
    return {"open_s": open_s, "first_ms": (time.perf_counter() - start) * 1000}


def _run_worker(phase: str, backend: str, workdir: Path, args: argparse.Namespace,
                extra_env: dict[str, str] | None = None) -> dict:
    out = workdir / f"{backend}.{phase}.{os.getpid()}.json"
    command = [sys.executable, __file__, "--worker", phase, "--backend-name", backend, "--workdir", str(workdir),
               "--out", str(out), "--threads", str(args.threads), "--seconds", str(args.seconds),
               "--warmup-seconds", str(args.warmup_seconds), "--latency-queries", str(args.latency_queries),
               "--heap", args.heap] + ([] if args.pin else ["--no-pin"])
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        environment[name] = str(args.threads)
    environment.update(extra_env or {})
    completed = subprocess.run(command, capture_output=True, text=True, env=environment)
    if completed.returncode != 0 or not out.is_file():
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit {completed.returncode}"}
    result = json.loads(out.read_text())
    out.unlink()
    return result


# ------------------------------------------------------------------------------------------- driver


def _overlap(results: list[list], reference: list[list], above_ties: bool = False) -> float:
    """Mean share of the reference's top-10 ids that a backend also returned (optionally only those scored
    above the reference's 10th: hits tied with it are interchangeable)."""
    shares = []
    for ours, theirs in zip(results, reference, strict=False):
        if above_ties and len(theirs) == K:
            cutoff = theirs[-1][1]
            theirs = [(doc_id, score) for doc_id, score in theirs if score > cutoff + 1e-4 * abs(cutoff)]
        if theirs:
            shares.append(len({d for d, _ in ours} & {d for d, _ in theirs}) / len(theirs))
    return float(np.mean(shares)) if shares else float("nan")


def _recall(results: list[list], queries: list[dict]) -> float:
    found = total = 0
    for hits, entry in zip(results, queries, strict=False):
        found += len(set(entry["gold"]) & {doc_id for doc_id, _ in hits})
        total += len(entry["gold"])
    return found / max(1, total)


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _stale_index(backend: str, workdir: Path) -> bool:
    """Whether a cached index was written in a format the engine no longer reads (impact before compression)."""
    if SAME_INDEX.get(backend, backend) != "impact":
        return False
    from agent_gym.retrieval_index.engines import impact_bm25 as impact

    params = _index_dir(backend, workdir) / "impact" / "params.json"
    return not params.is_file() or json.loads(params.read_text()).get("format") != impact._FORMAT


def benchmark_corpus(name: str, backends: list[str], args: argparse.Namespace) -> tuple[list[dict], str]:
    from agent_gym.models.precision import cpu_model

    cache = Path(args.cache_dir)
    workdir = prepare_corpus(name, cache, args.queries)
    docs = int((workdir / "ready").read_text())
    queries = json.loads((workdir / "queries.json").read_text())
    builds: dict[str, dict] = {}
    if args.threads == 1:  # a variant that differs from its index's backend only in how it uses several CPUs
        backends = [b for b in backends if b not in SAME_INDEX or SAME_INDEX[b] not in backends]
    # each index built once, before the variants that search it
    backends = sorted(backends, key=lambda b: b in SAME_INDEX)
    for backend in backends:
        marker = workdir / f"index-{SAME_INDEX.get(backend, backend)}.build.json"
        if marker.is_file() and _stale_index(backend, workdir):
            _log(f"{name}: the cached {backend} index is in an earlier format; rebuilding it")
            marker.unlink()
        if not marker.is_file():
            _log(f"{name}: building {backend} over {docs:,} documents ...")
            built = _run_worker("build", backend, workdir, args)
            if "error" in built:
                _log(f"{name}: {backend} build failed: {built['error']}")
                builds[backend] = built
                continue
            marker.write_text(json.dumps(built))
        builds[backend] = json.loads(marker.read_text())
    live = [b for b in backends if "error" not in builds[b]]
    cold: dict[str, dict] = {}
    for backend in (b for b in live if b in ("impact", "bm25s-numba")):
        # A process with empty kernel caches: what the first process on a machine pays (the compile).
        with tempfile.TemporaryDirectory(prefix="retrieval-bench-kernel-cache-") as empty_cache:
            cold[backend] = _run_worker("coldstart", backend, workdir, args,
                                        {"NUMBA_CACHE_DIR": empty_cache, "AGENT_GYM_CACHE": empty_cache})
        _log(f"{name}: {backend} with an empty kernel cache: open {cold[backend].get('open_s', float('nan')):.1f} s, "
             f"first query {cold[backend].get('first_ms', float('nan')):,.0f} ms")
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {backend: [] for backend in live}
    steps = args.repeats * len(live)
    step = 0
    for repeat in range(args.repeats):
        # The peer first in every repeat (our ratios are against it); the others rotate.
        others = [b for b in live if b != PEER]
        others = others[repeat % max(1, len(others)):] + others[: repeat % max(1, len(others))]
        for backend in ([PEER] if PEER in live else []) + others:
            step += 1
            searched = _run_worker("search", backend, workdir, args)
            runs[backend].append(searched)
            shown = f"{searched['qps']:,.0f} q/s" if "error" not in searched else f"failed: {searched['error']}"
            _log(f"{name}: [{step}/{steps}] repeat {repeat + 1}/{args.repeats} {backend}: {shown}")
    load_end = os.getloadavg()
    records = []
    peer_runs = runs.get(PEER, [])
    reference = next((r["results"] for r in peer_runs if "results" in r), None)
    peer_rss = statistics.median([r["peak_rss_mb"] for r in peer_runs if "peak_rss_mb" in r] or [float("nan")])
    peer_pss = statistics.median([r["pss_mb"] for r in peer_runs if "pss_mb" in r] or [float("nan")])
    for backend in live:
        good = [r for r in runs[backend] if "error" not in r]
        if not good:
            continue
        ratios = [ours["qps"] / theirs["qps"] for ours, theirs in zip(runs[backend], peer_runs, strict=False)
                  if "error" not in ours and "error" not in theirs]
        results = good[0]["results"]
        peak_rss = statistics.median(r["peak_rss_mb"] for r in good)
        pss = statistics.median(r.get("pss_mb", float("nan")) for r in good)
        records.append({
            "corpus": name,
            "docs": docs,
            "queries": len(queries),
            "backend": backend,
            "cpus": args.threads,
            "repeats": len(ratios),
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "overlap": _overlap(results, reference) if reference else None,
            "overlap_above_ties": _overlap(results, reference, above_ties=True) if reference else None,
            "memory_ratio": peak_rss / peer_rss if peer_rss == peer_rss else None,
            # the RAM the processes hold together, shared index pages once: the fair measure for several processes
            "memory_ratio_pss": pss / peer_pss if pss == pss and peer_pss == peer_pss else None,
            "qps_median": statistics.median(r["qps"] for r in good),
            "qps_runs": [round(r["qps"], 1) for r in good],
            "p50_ms": statistics.median(r["p50_ms"] for r in good),
            "p99_ms": statistics.median(r["p99_ms"] for r in good),
            "first_query_ms": statistics.median(r["first_ms"] for r in good),
            "open_s": statistics.median(r["open_s"] for r in good),
            "cold_open_s": cold.get(backend, {}).get("open_s"),
            "cold_first_query_ms": cold.get(backend, {}).get("first_ms"),
            "build_s": builds[backend]["build_s"],
            "index_mb": builds[backend]["index_mb"],
            "peak_rss_mb": peak_rss,
            "anon_mb": statistics.median(r.get("anon_mb", float("nan")) for r in good),
            "file_mb": statistics.median(r.get("file_mb", float("nan")) for r in good),
            "pss_mb": pss,
            "processes": good[0].get("processes", 1),
            "recall_at_10": _recall(results, queries),
            "threads": args.threads,
            "pinned_cpus": args.threads if args.pin else None,
            "seconds": args.seconds,
            "warmup_seconds": args.warmup_seconds,
            "load_start": [round(x, 2) for x in load_start],
            "load_end": [round(x, 2) for x in load_end],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu_model": cpu_model(),  # records of several machines share the file (none before 2026-11-28 11:00)
        })
    return records, _table(name, docs, len(queries), records, load_start, load_end, args)


def _table(name: str, docs: int, queries: int, records: list[dict], load_start: tuple, load_end: tuple,
           args: argparse.Namespace) -> str:
    lines = [
        f"### {name}: {docs:,} documents, {queries:,} queries, top-{K}, {args.threads} search thread(s) each, "
        f"{f'pinned to {args.threads} CPU(s), ' if args.pin else 'unpinned, '}"
        f"{args.repeats} repeats of >= {args.seconds:g} s after {args.warmup_seconds:g} s warm-up; "
        f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end",
        "",
        "| backend | batch q/s (median) | vs Pyserini: median [min, max] | p50 ms | p99 ms | 1st query ms "
        "| open s | build s | index MB | peak RSS MB (anon + file) | PSS MB | RSS (PSS) vs Pyserini "
        "| top-10 overlap (above ties) | recall@10 |",
        "|---|" + "---:|" * 13,
    ]
    for r in records:
        ratio = (f"{r['ratio_median']:.2f}x [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]"
                 if r["ratio_median"] is not None else "-")
        lines.append(
            f"| {r['backend']} | {_fmt(r['qps_median'], 0)} | {ratio} | {_fmt(r['p50_ms'], 2)} "
            f"| {_fmt(r['p99_ms'], 2)} | {_fmt(r['first_query_ms'])} | {_fmt(r['open_s'], 2)} "
            f"| {_fmt(r['build_s'])} | {_fmt(r['index_mb'])} "
            f"| {_fmt(r['peak_rss_mb'], 0)} ({_fmt(r['anon_mb'], 0)} + {_fmt(r['file_mb'], 0)}) "
            f"| {_fmt(r.get('pss_mb'), 0)} | {_fmt(r['memory_ratio'], 2)}x ({_fmt(r.get('memory_ratio_pss'), 2)}x) "
            f"| {_fmt(r['overlap'], 3)} ({_fmt(r['overlap_above_ties'], 3)}) "
            f"| {_fmt(r['recall_at_10'], 3)} |"
        )
    for r in records:
        if r.get("cold_open_s") is not None:
            lines.append(f"\n{r['backend']} in a process with an empty kernel cache (the first on a machine): open "
                         f"{r['cold_open_s']:.1f} s, first query {r['cold_first_query_ms']:,.0f} ms.")
    return "\n".join(lines)


def _write_results(records: list[dict], path: Path) -> None:
    """Merge ``records`` into the results file (a record per corpus and backend; newer ones replace older)."""
    existing = []
    if path.is_file():
        try:
            existing = json.loads(path.read_text())
        except ValueError:
            existing = []
    for record in existing:  # records from before the two-core rows: one thread, pinned to one CPU
        record.setdefault("cpus", record.get("pinned_cpus") or record.get("threads") or 1)
    fresh = {(r["corpus"], r["backend"], r["cpus"]) for r in records}
    merged = [r for r in existing if (r.get("corpus"), r.get("backend"), r.get("cpus")) not in fresh] + records
    merged.sort(key=lambda r: (CORPORA.index(r["corpus"]) if r["corpus"] in CORPORA else 99, r["corpus"], r["cpus"],
                               BACKENDS.index(r["backend"]) if r["backend"] in BACKENDS else 99))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1) + "\n")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="all", help=f"comma-separated subset of {CORPORA}, or all")
    parser.add_argument("--backends", default=",".join(DEFAULT_BACKENDS), help=f"comma-separated subset of {BACKENDS}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="steady-state seconds timed per process")
    parser.add_argument("--warmup-seconds", type=float, default=5.0, help="batches run before timing")
    parser.add_argument("--cpus", default="1,2",
                        help="comma-separated CPU counts, a table each: with c CPUs every backend searches with c "
                             "threads, pinned to c CPUs (default: 1,2)")
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)  # a worker's: set from --cpus
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="let each search process use every CPU (by default it is pinned to --threads CPUs)")
    parser.add_argument("--latency-queries", type=int, default=1000, help="queries timed one at a time")
    parser.add_argument("--queries", type=int, default=2000, help="questions of the synthetic corpora")
    parser.add_argument("--heap", default="1g", help="Pyserini's JVM heap (-Xmx)")
    parser.add_argument("--cache-dir", default=str(ROOT / "runs" / "retrieval-bench"),
                        help="where corpora and indexes are built, once (git-ignored runs/ by default)")
    parser.add_argument("--results", default=str(RESULTS), help="JSON file the records are merged into")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--worker", choices=("build", "search", "coldstart"), help=argparse.SUPPRESS)
    parser.add_argument("--backend-name", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.cpu_counts = [int(count) for count in args.cpus.split(",") if count.strip()]
    except ValueError:
        parser.error(f"--cpus takes comma-separated CPU counts, got {args.cpus!r}")
    available = len(os.sched_getaffinity(0))
    if args.repeats < 1 or args.seconds <= 0 or args.threads < 1 or not args.cpu_counts or min(args.cpu_counts) < 1:
        parser.error("--repeats and --cpus must be >= 1 and --seconds > 0")
    if not args.worker and max(args.cpu_counts) > available:
        parser.error(f"--cpus {args.cpus}: this process may run on {available} CPU(s) only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker and args.pin:
        # The same CPUs for every engine, as many as its search threads: the JVM's JIT and garbage collector
        # threads would otherwise run on a core the other engines leave idle.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.threads])
    if args.worker:
        worker = {"build": worker_build, "search": worker_search, "coldstart": worker_coldstart}[args.worker]
        result = worker(args.backend_name, Path(args.workdir), args)
        Path(args.out).write_text(json.dumps(result))
        return 0
    corpora = list(CORPORA) if args.corpus == "all" else [c.strip() for c in args.corpus.split(",") if c.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = (set(corpora) - set(CORPORA)) | (set(backends) - set(BACKENDS))
    if unknown:
        print(f"unknown corpus or backend {sorted(unknown)}; corpora {CORPORA}, backends {BACKENDS}", file=sys.stderr)
        return 2
    tables = []
    for name in corpora:
        for cpus in args.cpu_counts:
            args.threads = cpus
            records, table = benchmark_corpus(name, backends, args)
            print(table + "\n", flush=True)
            tables.append(table)
            if not args.no_write and records:
                _write_results(records, Path(args.results))
    print(f"cpus: {len(os.sched_getaffinity(0))}, python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
