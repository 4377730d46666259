"""The default precision and thread count for this machine, chosen by measurement (benchmarks/precision.py).

bf16 is the default where it runs fast: CUDA GPUs that support it, and CPUs with native bf16 dot products
(``avx512_bf16`` or AMX). There, SmolLM2-135M's forward pass ran 2.8x and forward plus backward 2.4x faster
than fp32 (``../shared/notes/smollm2.md``, ``benchmarks/README.md``). Elsewhere bf16 is emulated and slower,
so fp32 stays the default.
"""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = ("auto", "float32", "bfloat16")
FAST_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of the first CPU in ``cpuinfo`` (empty where there is no such file)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes bf16 dot products natively (``avx512_bf16`` or AMX)."""
    return any(flag in (cpu_flags() if flags is None else flags) for flag in FAST_BF16_CPU_FLAGS)


def resolve_dtype(name: str, device: str | torch.device = "cpu", flags: frozenset[str] | None = None) -> torch.dtype:
    """``auto``, ``float32`` or ``bfloat16`` as a torch dtype; ``auto`` is bf16 where it is fast on ``device``."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {DTYPES}")
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_fast_bf16(flags) else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
