"""One run per run directory: a new run never starts on top of an old one unless the user asks.

`train`, `sft` and `model pretrain` continue the run in their output directory when it has a checkpoint to
continue from. Anything else in a non-empty directory is someone's earlier work: the run is refused, and with
``--overwrite`` the old run's own files (and only those) are deleted first, so checkpoints, metrics and final
weights of two runs never mix.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from agent_gym.error import AgentGymError

__all__ = ["RunDirectoryError", "check_run_dir", "clear_run_dir"]


class RunDirectoryError(AgentGymError, FileExistsError):
    """The output directory already holds another run (or other files) and ``--overwrite`` was not given, or it
    is a file."""


def check_run_dir(
    run_dir: str | Path, *, continuing: bool, overwrite: bool, fresh_flag: str, hint: str = ""
) -> None:
    """Refuse to start a new run in a non-empty ``run_dir`` unless it continues the run there or ``overwrite``,
    and a ``run_dir`` that is a file (or lies under one), whatever the flags.

    ``fresh_flag`` names the flag that picks another directory (``--output-dir``, ``--out``); ``hint`` is
    another way out, added to the message.
    """
    path = Path(run_dir)
    for folder in (path, *path.parents):  # a file where the run directory (or a folder above it) would be
        if folder.exists():
            if not folder.is_dir():
                raise RunDirectoryError(f"{folder} is a file, not a directory; pass a directory as {fresh_flag}")
            break
    if continuing or overwrite or not path.is_dir():
        return
    entries = sorted(entry.name for entry in path.iterdir())
    if entries:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise RunDirectoryError(
            f"{path} already holds another run ({shown}); pass --overwrite to replace it{hint}, "
            f"or a fresh {fresh_flag}"
        )


def clear_run_dir(run_dir: str | Path, own: Iterable[str]) -> None:
    """Delete the entries of ``run_dir`` that match the glob patterns ``own`` (a run's own files); keep the rest."""
    path = Path(run_dir)
    if not path.is_dir():
        return
    for pattern in own:
        for entry in path.glob(pattern):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
