"""Shared fixtures: a tiny fact-lookup tool environment whose every answer can be computed by hand, a search
server that hangs, the suite's one tiny from-scratch model, and the HotpotQA sample (helpers in ``support/``)."""

from __future__ import annotations

import copy
import http.server
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.hotpot import HOTPOT_SAMPLE, load_hotpot_sample

from agent_gym.env import ToolEnv
from agent_gym.tasks import Hop, Task
from agent_gym.tools import Tool, ToolResult

#: settings that make AgentR1-SynthHop-v0 small enough for unit tests (about a second to build)
SMALL_SYNTHHOP = {"num_pages": 2000, "num_questions": 50}
#: a smaller SynthHop for tests that drive a tiny model through it
TINY_SYNTHHOP = {"num_pages": 200, "kinds": ["bridge"], "top_k": 2, "hops": 2, "num_questions": 20}


@pytest.fixture(scope="session")
def tiny_model_dir_for_synthhop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's one from-scratch tiny model: a HF directory whose tokenizer was trained on TINY_SYNTHHOP's texts.

    Shared by every test of the session: read it, copy it, or load it; never write into it.
    """
    from agent_gym.models.model_init import init_model, texts_from_env

    texts = texts_from_env("AgentR1-SynthHop-v0", num_prompts=8, env_kwargs=TINY_SYNTHHOP)
    return init_model(texts, tmp_path_factory.mktemp("tiny") / "model", preset="tiny", vocab_size=600, seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir_for_synthhop: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of :func:`tiny_model_dir_for_synthhop`, loaded once, in eval mode. Shared by the
    session, so a test must not change its weights: one that trains takes :func:`tiny_model_copy`."""
    from agent_gym.models.model_init import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir_for_synthhop)
    return model.eval(), tokenizer


@pytest.fixture
def tiny_model_copy(tiny_model: tuple[Any, Any]) -> tuple[Any, Any]:
    """A private copy of :func:`tiny_model` that a test may train."""
    model, tokenizer = tiny_model
    return copy.deepcopy(model), tokenizer


@pytest.fixture(scope="session")
def hotpot_records() -> list[dict[str, Any]]:
    """The HotpotQA dev sample's records (read-only); skips the test when the shared data folder is absent."""
    if not HOTPOT_SAMPLE.is_file():
        pytest.skip(f"HotpotQA sample not found at {HOTPOT_SAMPLE} (the shared data folder is absent)")
    return load_hotpot_sample()


FACTS = {
    "France": "France is a country whose capital is Paris.",
    "Japan": "Japan is a country whose capital is Tokyo.",
    "Moby Dick": "Moby Dick is a novel written by Herman Melville.",
    "Herman Melville": "Herman Melville was born in New York City.",
}

FACT_TASKS = (
    Task("capital-france", "What is the capital of France?", ("Paris",), supporting_titles=("France",)),
    Task("capital-japan", "What is the capital of Japan?", ("Tokyo", "Tokio"), supporting_titles=("Japan",)),
    Task(
        "melville-birthplace",
        "Where was the author of Moby Dick born?",
        ("New York City", "NYC"),
        supporting_titles=("Moby Dick", "Herman Melville"),
        decomposition=(
            Hop("Who wrote Moby Dick?", "Herman Melville", "Moby Dick", "Moby Dick"),
            Hop("Where was Herman Melville born?", "New York City", "Herman Melville", "Herman Melville"),
        ),
    ),
)


class FactLookup(Tool):
    """Looks a title up in :data:`FACTS`; reports the title it found as retrieved evidence, like search."""

    name = "lookup"
    description = "Look up the encyclopedia entry with this exact title."
    parameters = {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "the entry's title"}},
        "required": ["title"],
    }

    def __init__(self) -> None:
        self.batches: list[int] = []  # size of every run_batch call, so tests can see batching

    def run(self, title: str) -> ToolResult:
        if title not in FACTS:
            return ToolResult(text=f"No entry titled {title!r}.", metadata={"titles": []})
        return ToolResult(text=FACTS[title], metadata={"titles": [title]})

    def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
        self.batches.append(len(calls))
        return [self.run(**arguments) for arguments in calls]

    def evidence(self, result: ToolResult) -> list[str]:
        return list(result.metadata.get("titles", ()))


@pytest.fixture
def make_fact_env() -> Callable[..., ToolEnv]:
    """Build a ToolEnv over :data:`FACT_TASKS` with one :class:`FactLookup`; kwargs are ToolEnv settings."""

    def make(tasks: Sequence[Task] = FACT_TASKS, **settings: Any) -> ToolEnv:
        return ToolEnv(list(tasks), [FactLookup()], **settings)

    return make


@pytest.fixture
def hanging_search_server() -> Iterator[str]:
    """A search server that answers ``GET /health`` but never answers a search: it reads the request and keeps
    the connection open (what a stopped or deadlocked server does). Yields its URL."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's hook name
            body = json.dumps({"status": "ok", "backend": "hung", "documents": 1, "max_queries": 512,
                               "max_query_chars": 2048, "default_k": 5, "max_k": 100}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length") or 0))
            release.wait(timeout=120)  # never answers while the test runs

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()
