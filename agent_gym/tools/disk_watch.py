"""The total disk cap of a sandboxed run where its directory cannot be a size-limited ``tmpfs``.

Where user namespaces are off, the run directory is a plain folder: ``RLIMIT_FSIZE`` caps each file, but not how
many. The parent then polls the folder's usage while the program runs and stops it past the cap. Writes between
two polls can overshoot (about what the disk takes in ``POLL_S``), so this is the fallback, not the rule.
"""

from __future__ import annotations

import os
import time

__all__ = ["DiskWatch"]

POLL_S = 0.05
MAX_ENTRIES = 100_000  # more files than this counts as over the cap: each costs an inode, and a poll reads all


class DiskWatch:
    """``watch.over()``: whether the files under ``directory`` hold more than ``limit_bytes`` (polled at most
    every ``POLL_S`` seconds; ``force=True`` measures now)."""

    def __init__(self, directory: str, limit_bytes: int) -> None:
        self.directory = directory
        self.limit_bytes = limit_bytes
        self.next_poll = 0.0

    def over(self, *, force: bool = False) -> bool:
        now = time.perf_counter()
        if not force and now < self.next_poll:
            return False
        self.next_poll = now + POLL_S
        used, entries, pending = 0, 0, [self.directory]
        while pending:
            try:
                with os.scandir(pending.pop()) as listing:
                    for entry in listing:
                        entries += 1
                        if entries > MAX_ENTRIES:
                            return True
                        try:
                            used += entry.stat(follow_symlinks=False).st_blocks * 512
                            if entry.is_dir(follow_symlinks=False):
                                pending.append(entry.path)
                        except OSError:
                            continue  # removed while we looked
            except OSError:
                continue
            if used > self.limit_bytes:
                return True
        return False
