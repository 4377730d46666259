"""Where `agent-gym eval` writes its records, and how a run is named in its table.

Runs with different settings (episode count, env kwargs, model, decoding) never share a file: the default file
name carries the episode count, a readable summary of the settings and a hash of all of them. The table's ``run``
column gets the short summary and the same hash, so a row names its file even where the summary is cut.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["eval_output_path", "file_safe", "settings_digest", "short_settings"]

_VALUE_CHARS = 20  # a longer value is cut, with "…"


def file_safe(text: str) -> str:
    """A file-name part: ``module:Env-v0`` ids and model names keep only letters, digits, ``.``, ``_``, ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def _short_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    if "/" in text and not text.endswith("/"):  # a path: its file name is what tells runs apart
        text = text.rsplit("/", 1)[-1]
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def short_settings(settings: Mapping[str, Any], limit: int = 48) -> str:
    """``key=value`` pairs in their order, paths cut to their file name and long values cut, the whole at most
    ``limit`` long.

    Where the pairs do not fit, the longest are left out (``…`` marks the gap) rather than the text being cut
    at ``limit``: a cut lands in the middle of a long value (``kinds=[…``) and hides the short settings after
    it (``hops=1``), which are the ones that tell two runs apart.
    """
    pairs = [f"{key}={_short_value(value)}" for key, value in settings.items()]
    kept = list(range(len(pairs)))

    def text() -> str:
        shown = " ".join(pairs[index] for index in kept)
        return shown + (" …" if len(kept) < len(pairs) else "")

    while len(text()) > limit and kept:
        kept.remove(max(kept, key=lambda index: len(pairs[index])))
    return text() if len(text()) <= limit else "…"


def settings_digest(identity: Mapping[str, Any]) -> str:
    """8 hex digits of a hash of every setting in ``identity`` (key order aside)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]


def eval_output_path(env_id: str, label: str, identity: Mapping[str, Any], root: str | Path = "runs",
                     episodes: int | None = None) -> Path:
    """``runs/eval-ENV-LABEL[-Nep][-SETTINGS-HASH].jsonl``: no hash for a scripted policy on the env's defaults.

    ``episodes`` is the number of episodes the eval plays; ``identity`` holds every other setting that changes
    the results (env kwargs, model path, decoding); two evals share a file only if all of them are equal.
    """
    name = f"eval-{file_safe(env_id)}-{file_safe(label)}"
    if episodes is not None:
        name += f"-{episodes}ep"
    if identity.get("env_kwargs"):
        name += "-" + file_safe(short_settings(identity["env_kwargs"], limit=40).replace("…", ""))
    if identity:
        name += f"-{settings_digest(identity)}"
    return Path(root) / f"{name}.jsonl"
