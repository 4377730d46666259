"""JSON Lines: one JSON value per line, blank lines skipped, a broken line named by its number.

One reader for every JSONL file the package reads (corpora, dataset files, training metrics), so they all
skip the same lines and report a broken one the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["iter_jsonl"]


def iter_jsonl(
    lines: Iterable[str], source: str | os.PathLike[str], error: type[Exception] = ValueError
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of ``lines`` (numbered from 1).

    Args:
        lines: the file's lines (an open text file, or ``text.splitlines()``).
        source: what to call the file in an error message (its path).
        error: the exception raised for a line that is not JSON, as ``error("SOURCE:N: not valid JSON (line
            N: reason)")``.
    """
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as problem:
            raise error(f"{source}:{number}: not valid JSON (line {number}: {problem.msg})") from None
        yield number, value
