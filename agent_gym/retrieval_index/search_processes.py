"""Search a batch's queries in several processes: this one and worker processes that open the same index.

Threads do not scale a Python retriever past its GIL: with the impact engine, the compiled kernel releases it,
but looking up the query's words and reading each hit's text from the document store hold it, about a third of
a search (profiled on the Wikipedia-like 10^5 corpus, 2026-11-28). A worker is a fresh interpreter that opens the
index itself; a memory-mapped index is then shared through the page cache, not copied. It loads only the modules
search needs (``_BOOTSTRAP``): a worker of the impact engine went from 50 to 40 MB resident, 33 to 24 MB
proportional (a 3,000-page index). Requests and answers cross its stdin and stdout as pickles (only this process
writes to it, so nothing untrusted is unpickled).

A worker that dies (killed, out of memory) or hangs (no answer within ``answer_timeout`` seconds) costs speed,
not answers: it is stopped, and its share of a batch and of every later batch runs in this process, with one
warning. A worker exits when this process closes the retriever or dies
(its stdin reaches EOF).
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import Hit, RetrievalError

logger = logging.getLogger(__name__)

__all__ = ["SearchProcesses"]

_HEADER = struct.Struct("<Q")


def _write_frame(stream: BinaryIO, value: Any) -> None:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_frame(stream: BinaryIO, timeout: float | None = None) -> Any:
    """The next frame; ``TimeoutError`` if none starts within ``timeout`` seconds (a worker that hangs)."""
    # A worker writes one frame per request, so nothing is left buffered between frames and select on the pipe
    # tells whether the next one has begun.
    if timeout is not None and not select.select([stream], [], [], timeout)[0]:
        raise TimeoutError(f"no answer within {timeout:g} s")
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the stream ended")
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the stream ended inside a frame")
    return pickle.loads(payload)


# A worker's first lines. Importing ``agent_gym.retrieval_index.search_processes`` the usual way would run both
# packages' ``__init__`` (every environment, gymnasium, asyncio, tqdm: about 10 MB resident in every worker, counted in
# full since none of it is shared). Each package is put in ``sys.modules`` bare instead, with its real ``__path__``
# so that submodules import as usual; the first other name asked of it (an opener that reads ``agent_gym.X``,
# say) runs the real ``__init__`` into it, once.
_BOOTSTRAP = """
import importlib.util, sys, types

def bare(name, directory):
    spec = importlib.util.spec_from_file_location(
        name, directory + "/__init__.py", submodule_search_locations=[directory])
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attr):
        del module.__getattr__
        spec.loader.exec_module(module)
        return getattr(module, attr)

    module.__getattr__ = __getattr__
    sys.modules[name] = module

for name, directory in zip(sys.argv[1::2], sys.argv[2::2]):
    bare(name, directory)
from agent_gym.retrieval_index.search_processes import main
sys.exit(main())
"""


def _worker_command() -> list[str]:
    """The interpreter, the bootstrap and each package's name and directory (this process's own)."""
    packages = []
    for name in ("agent_gym", "agent_gym.retrieval_index"):
        packages += [name, os.path.dirname(sys.modules[name].__file__)]
    return [sys.executable, "-c", _BOOTSTRAP, *packages]


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self.process = subprocess.Popen(
            _worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.ready = False
        _write_frame(self.process.stdin, opener)

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        status, value = _read_frame(self.process.stdout, timeout)
        if status != "ready":
            raise value
        self.ready = True

    def stop(self, kill: bool = False) -> None:
        if kill:  # a hung worker reads no EOF
            self.process.kill()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop()
    workers.clear()


class SearchProcesses:
    """``processes - 1`` worker processes, each with its own retriever from ``opener``.

    Args:
        opener: a picklable callable (a module-level function or a :func:`functools.partial` of one) that
            returns a retriever; each worker calls it once.
        processes: how many processes share a batch, this one included (>= 2).
        answer_timeout: seconds a worker may take to answer its share (or to open the index, at its first
            batch) before it counts as hung.
    """

    def __init__(self, opener: Callable[[], Any], processes: int, answer_timeout: float = 120.0) -> None:
        if not isinstance(processes, int) or processes < 2:
            raise InvalidValue(f"SearchProcesses needs processes >= 2, got {processes!r}")
        try:
            pickle.dumps(opener)
        except Exception as error:  # noqa: BLE001 - pickling fails in many ways
            raise InvalidValue(f"the worker's opener must be picklable ({error})") from None
        self.answer_timeout = answer_timeout
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)
        for _ in range(processes - 1):
            self._workers.append(_Worker(opener))

    @property
    def alive(self) -> int:
        """How many workers still take a share of each batch."""
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids (to read their memory, say)."""
        return [worker.process.pid for worker in self._workers]

    def map(self, queries: Sequence[str], k: int, local: Callable[[Sequence[str]], list[list[Hit]]]
            ) -> list[list[Hit]]:
        """The hits of ``queries``, in order: one contiguous share per process, ``local`` searching this one's.

        Another thread's batch in flight (the workers are busy) makes this one run in this process alone.
        """
        if not self._lock.acquire(blocking=False):
            return local(queries)
        try:
            return self._map(queries, k, local)
        finally:
            self._lock.release()

    def _map(self, queries: Sequence[str], k: int, local: Callable[[Sequence[str]], list[list[Hit]]]
             ) -> list[list[Hit]]:
        workers = list(self._workers)
        size = -(-len(queries) // (len(workers) + 1))
        chunks = [queries[start : start + size] for start in range(0, len(queries), size)]
        shares: list[tuple[_Worker | None, Sequence[str]]] = []
        for worker, chunk in zip(workers, chunks[1:], strict=False):  # fewer chunks than workers: some idle
            try:
                worker.wait_ready(self.answer_timeout)
                _write_frame(worker.process.stdin, ("search", list(chunk), k))
            except (OSError, EOFError, TimeoutError, RetrievalError) as error:
                self._drop(worker, error)
                worker = None
            shares.append((worker, chunk))
        pending = [worker for worker, _ in shares if worker is not None]
        try:
            results = local(chunks[0])
        except Exception:
            self._collect(pending)  # the answers must be read, or the next batch would get them
            raise
        except BaseException:  # Ctrl-C: no time to drain; those workers are out of step for good
            for worker in pending:
                self._drop(worker, RuntimeError("interrupted while it searched"))
            raise
        answers = self._collect(pending)
        failure: BaseException | None = None
        for worker, chunk in shares:
            answer = answers.get(id(worker)) if worker is not None else None
            if answer is None:
                results.extend(local(chunk))
            elif answer[0] == "ok":
                results.extend(answer[1])
            else:
                failure = failure or answer[1]
        if failure is not None:
            raise failure
        return results

    def _collect(self, pending: list[_Worker]) -> dict[int, tuple[str, Any]]:
        """Each pending worker's answer, by ``id``; a worker that died instead is dropped (no answer)."""
        answers = {}
        for worker in pending:
            try:
                answers[id(worker)] = _read_frame(worker.process.stdout, self.answer_timeout)
            except (OSError, EOFError, TimeoutError, pickle.UnpicklingError, AttributeError, ImportError) as error:
                self._drop(worker, error)
        return answers

    def _drop(self, worker: _Worker, error: BaseException) -> None:
        code = worker.process.poll()
        state = "stopped answering" if code is None else f"exited with status {code}"
        logger.warning("search worker %d %s (%s); its share of each batch now runs in this process",
                       worker.process.pid, state, error)
        if worker in self._workers:
            self._workers.remove(worker)
        worker.stop(kill=isinstance(error, TimeoutError))

    def close(self) -> None:
        """Stop the workers; idempotent."""
        self._finalizer()


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    try:
        opener = _read_frame(stdin)
    except EOFError:
        return 0
    try:
        retriever = opener()
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        _write_frame(stdout, ("error", RetrievalError(f"a search worker could not open the index: {error!r}")))
        return 1
    _write_frame(stdout, ("ready", None))
    while True:
        try:
            request = _read_frame(stdin)
        except EOFError:  # the parent closed the retriever, or died
            return 0
        _, queries, k = request
        try:
            answer = ("ok", retriever.search(queries, k))
        except Exception as error:  # noqa: BLE001 - the parent raises it
            answer = ("error", error)
        try:
            _write_frame(stdout, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            _write_frame(stdout, ("error", RetrievalError(f"a search worker's answer does not pickle: {error!r}")))


def main() -> int:
    """A worker's loop: the parent's pipes are its stdin and stdout; prints go to stderr."""
    stdin = os.fdopen(os.dup(0), "rb")
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the answers
    sys.stdout = sys.stderr
    return _serve(stdin, stdout)


if __name__ == "__main__":
    sys.exit(main())
