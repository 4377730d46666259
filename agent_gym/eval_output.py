"""Where `agent-gym eval` writes its records, and how a run is named in its table.

Runs with different settings (env kwargs, model, decoding) never share a file: the default file name carries a
readable summary of the settings plus a hash of all of them. The table's ``run`` column gets only the short
summary; the full settings are in the file name's hash and the records.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["eval_output_path", "file_safe", "short_settings"]

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
    """``key=value`` pairs, paths cut to their file name and long values cut, the whole at most ``limit`` long."""
    text = " ".join(f"{key}={_short_value(value)}" for key, value in settings.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def eval_output_path(env_id: str, label: str, identity: Mapping[str, Any], root: str | Path = "runs") -> Path:
    """``runs/eval-ENV-LABEL[-SETTINGS-HASH].jsonl``: no suffix for a scripted policy on the env's defaults.

    ``identity`` holds every setting that changes the results (env kwargs, model path, decoding); two evals
    share a file only if all of them are equal.
    """
    name = f"eval-{file_safe(env_id)}-{file_safe(label)}"
    if identity:
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]
        readable = file_safe(short_settings(identity.get("env_kwargs") or {}, limit=40).replace("…", ""))
        name += f"-{readable}-{digest}" if identity.get("env_kwargs") else f"-{digest}"
    return Path(root) / f"{name}.jsonl"
