"""Host memory of a training process: give a step's freed memory back to the OS, and read what is resident.

glibc's malloc raises its mmap threshold to the size of the largest block freed (up to 32 MB), so after the first
step a model's activations come from the heap, and a heap fragmented by rows of many lengths never shrinks: an
SFT of SmolLM2-135M (LoRA r16, 4 rows of up to about 1,200 tokens, bf16 base, 1 thread) grew to 16.7 GB resident
by its 57th step and was killed by the kernel's OOM killer on a 24 GB machine, while its live peak is about 6 GB.
``malloc_trim(0)`` after each step returns every free page, wherever it sits in the heap. Measured on that
workload (4 steps, Intel Xeon, 2026-11-27): peak RSS 10.0 -> 8.8 GB, step time +8 % (pages fault in again).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable

__all__ = ["release_freed_memory", "resident_mb"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        library = ctypes.CDLL(name) if name else ctypes.CDLL(None)
    except OSError:
        return None
    trim = getattr(library, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the heap's free pages to the OS (glibc); False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_mb() -> float | None:
    """This process's resident memory in MB now (Linux ``/proc/self/statm``); None elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
