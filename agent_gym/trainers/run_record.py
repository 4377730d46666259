"""What a run was started with, and the one "is this the same run?" check of `train`, `sft` and `model pretrain`.

A run directory holds ``run_config.json`` beside ``metrics.jsonl``: which trainer ran (``kind``) and every setting
it ran with, readable without Python. Every checkpoint carries the same record, so the check reads the settings of
the very checkpoint it continues. A checkpoint is continued only with the settings it was made with, except those
in `MAY_CHANGE_ON_RESUME` (how long, how often it measures and saves, how it runs on this machine, what it shows
and where it writes); any other difference raises `RunMismatchError`, which names every setting that differs. Two
experiments never end up in one ``metrics.jsonl``.

Checkpoints written before the record existed hold none: they are checked on the settings their own trainer
compared (``legacy``), and the run that continues them writes the record.

>>> record = RunRecord("train", {"lr": 1e-4, "total_steps": 10})
>>> differing_settings(record, RunRecord("train", {"lr": 1e-4, "total_steps": 20}))
[]
>>> differing_settings(record, RunRecord("train", {"lr": 1e-3, "total_steps": 20}))
['lr=0.0001 (now 0.001)']
>>> differing_settings(RunRecord("train", {"env_kwargs": {"hops": 1}}), RunRecord("train", {"env_kwargs": {"hops": 2}}))
["env_kwargs['hops']=1 (now 2)"]
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_gym.trainers.checkpoint import CheckpointError

__all__ = [
    "MAY_CHANGE_ON_RESUME",
    "RECORD_FILE",
    "RECORD_KEY",
    "RunMismatchError",
    "RunRecord",
    "check_resume",
    "differing_settings",
    "read_run_record",
    "write_run_record",
]

RECORD_FILE = "run_config.json"  # not config.json: `sft` saves the model's own config.json in its run directory
RECORD_KEY = "run_record"  # the record's key in a checkpoint's state

#: Settings that may differ between a run and the run that continues it, and why; every other setting changes the
#: experiment, so a resume with another value is refused.
MAY_CHANGE_ON_RESUME: dict[str, str] = {
    # how long the run goes on (the lr schedule stretches with it)
    "total_steps": "train: a run may be extended",
    "epochs": "sft: a run may be extended",
    "drill_steps": "model pretrain: its second stage may be extended",
    # how often it measures and saves
    "eval_every": "when to measure, not what",
    "save_every": "when to save",
    "keep_checkpoints": "how many saves stay on disk",
    # how it runs on this machine: the same updates, to float rounding
    "torch_threads": "CPU threads",
    "device": "where the tensors live",
    "backend": "which engine samples the same policy (transformers or vLLM; other random streams)",
    "micro_batch_size": "gradient accumulation: memory only",
    "gradient_checkpointing": "memory only",
    "lean_activations": "memory only",
    "share_prompt": "speed only",
    "padding_free": "speed only",
    "env_workers": "where the envs run",
    "ray_address": "which Ray cluster",
    "env_step_timeout": "how long a worker may take",
    "backend_url": "where the OpenAI-compatible server is",
    # what it shows and where it writes
    "show_progress": "progress bars",
    "tensorboard": "an extra copy of the metrics",
    "metrics_by": "which extra metrics are logged",
    "log_rollouts": "how many sample episodes are written",
    "output_dir": "the run directory may move",
    "resume": "how the checkpoint is found",
    "overwrite": "a resumed run overwrites nothing",
}


class RunMismatchError(CheckpointError):
    """A checkpoint is continued with settings that change the experiment, or past its last step; the message names
    every setting that differs."""


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists; an object JSON cannot hold, its repr)."""
    return json.loads(json.dumps(value, default=repr))


@dataclass(frozen=True)
class RunRecord:
    """Which trainer ran (``train``, ``sft``, ``pretrain``) and every setting it ran with, as JSON values."""

    kind: str
    settings: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", _plain(dict(self.settings)))

    @classmethod
    def of(cls, kind: str, config: Any, **extra: Any) -> RunRecord:
        """The record of a config dataclass (every field), with ``extra`` settings beside its fields."""
        return cls(kind, {**dataclasses.asdict(config), **extra})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "settings": self.settings}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        return cls(str(data["kind"]), dict(data["settings"]))


class _Unset:
    """A key one side of a mapping setting lacks."""

    def __repr__(self) -> str:
        return "unset"


_UNSET = _Unset()


def differing_settings(recorded: RunRecord, current: RunRecord) -> list[str]:
    """``name=recorded (now current)`` for each setting that differs, except those that `MAY_CHANGE_ON_RESUME`; a
    mapping (``env_kwargs``) is named key by key, ``env_kwargs['hops']=1 (now 2)``.

    A setting only one side has (added or removed between releases) is not compared: the run it is missing from
    knew no other value.
    """
    differences = [] if recorded.kind == current.kind else [f"kind={recorded.kind!r} (now {current.kind!r})"]
    for name, value in recorded.settings.items():
        if name in MAY_CHANGE_ON_RESUME or name not in current.settings:
            continue
        now = current.settings[name]
        if now == value:
            continue
        if isinstance(value, dict) and isinstance(now, dict):
            for key in [*value, *(key for key in now if key not in value)]:
                was, new = value.get(key, _UNSET), now.get(key, _UNSET)
                if was != new:
                    differences.append(f"{name}[{key!r}]={was!r} (now {new!r})")
        else:
            differences.append(f"{name}={value!r} (now {now!r})")
    return differences


def check_resume(
    checkpoint: str | Path,
    state: Mapping[str, Any],
    current: RunRecord,
    *,
    legacy: Mapping[str, Any] | None = None,
    total_steps: int | None = None,
    steps_setting: str = "--total-steps",
) -> None:
    """Raise `RunMismatchError` unless ``state`` (loaded from ``checkpoint``) may be continued as ``current``.

    Args:
        legacy: for a checkpoint without a record (written before records existed), the settings that its own
            trainer compared, as it saved them; ``current`` is compared on those alone.
        total_steps: the steps ``current`` runs to; a checkpoint past them is refused (its later weights would be
            saved as this run's), with ``steps_setting`` named as what to raise.
    """
    step = int(state.get("step", 0))
    if total_steps is not None and step > total_steps:
        raise RunMismatchError(
            f"{checkpoint} is at step {step}, past the {total_steps} steps of this run; raise {steps_setting} to "
            "continue it, or start a new run (--overwrite, or a fresh --output-dir)"
        )
    if RECORD_KEY in state:
        recorded = RunRecord.from_dict(state[RECORD_KEY])
    else:
        recorded = RunRecord(current.kind, dict(legacy or {}))
    differences = differing_settings(recorded, current)
    if differences:
        raise RunMismatchError(
            f"{checkpoint} was saved by a run with other settings: {', '.join(differences)}; "
            "continuing it with these would mix two experiments in one run: pass --overwrite to replace it, or a "
            "fresh --output-dir"
        )


def write_run_record(run_dir: str | Path, record: RunRecord) -> Path:
    """Write ``record`` as ``run_dir/run_config.json`` (whole or not at all: a temporary file renamed over it)."""
    path = Path(run_dir) / RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def read_run_record(run_dir: str | Path) -> RunRecord | None:
    """The record in ``run_dir``, or None for a run directory written before records existed."""
    path = Path(run_dir) / RECORD_FILE
    if not path.is_file():
        return None
    return RunRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
