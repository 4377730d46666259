"""The default precision for this machine, chosen by measurement.

bf16 can only be fast where the hardware computes it natively: CUDA GPUs that support it, and CPUs with
``avx512_bf16`` or AMX. Even there it is not always faster on a CPU: on the shared 2-core Xeon a 512x576 @ 576x1536
matmul ran at 0.59x fp32's speed on one torch thread and 1.55-1.65x on two (benchmarks/README.md), while an AMD EPYC
measured 5.6x (../shared/notes/smollm2.md). So ``auto`` on a CPU times that matmul both ways at the current thread
count (about 0.2 s, once per process) and picks bf16 only where it is clearly faster.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from agent_gym.error import InvalidValue

DTYPES = ("auto", "float32", "bfloat16")
FAST_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpuinfo_field(name: str, cpuinfo: str | Path) -> str | None:
    """The value of the first ``name`` line of ``cpuinfo`` (None where there is no such file or line)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of the first CPU in ``cpuinfo`` (empty where there is no such file)."""
    return frozenset((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The first CPU's model name, e.g. ``AMD EPYC``: every timing we record names the CPU it came from."""
    return _cpuinfo_field("model name", cpuinfo) or platform.processor() or "unknown"


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes bf16 dot products natively (``avx512_bf16`` or AMX)."""
    return any(flag in (cpu_flags() if flags is None else flags) for flag in FAST_BF16_CPU_FLAGS)


# bf16 must beat fp32 by this factor to be chosen: below it, fp32's exactness is worth more than the time.
MIN_BF16_SPEEDUP = 1.2


@functools.cache
def measured_bf16_speedup(threads: int) -> float:
    """fp32 time / bf16 time of a SmolLM2-sized matmul (512x576 @ 576x1536) at ``threads`` torch threads, the
    best of 5 interleaved repeats each (so a busy machine slows both sides alike)."""
    del threads  # the cache key: torch's current setting is what runs
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 576, generator=generator), torch.randn(576, 1536, generator=generator)
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = dict.fromkeys(pairs, float("inf"))
    for _ in range(5):
        for dtype, (x, y) in pairs.items():
            x @ y  # warm the kernel
            started = time.perf_counter()
            for _ in range(3):
                x @ y
            best[dtype] = min(best[dtype], time.perf_counter() - started)
    return best[torch.float32] / best[torch.bfloat16]


def resolve_dtype(name: str, device: str | torch.device = "cpu", flags: frozenset[str] | None = None,
                  speedup: float | None = None) -> torch.dtype:
    """``auto``, ``float32`` or ``bfloat16`` as a torch dtype. ``auto`` is bf16 on a GPU that supports it, and on a
    CPU with native bf16 where it measured at least :data:`MIN_BF16_SPEEDUP` x fp32 (``speedup``: that ratio,
    measured at the current thread count when not given)."""
    if name not in DTYPES:
        raise InvalidValue(f"unknown dtype {name!r}; choose one of {DTYPES}")
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if not cpu_has_fast_bf16(flags):
        return torch.float32
    if speedup is None:
        speedup = measured_bf16_speedup(torch.get_num_threads())
    return torch.bfloat16 if speedup >= MIN_BF16_SPEEDUP else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]


@contextlib.contextmanager
def bf16_autocast(model: torch.nn.Module, device_type: str) -> Iterator[None]:
    """bf16 autocast for ``model``, inside which peft's adapters take their inputs in the dtype they come in.

    peft casts an adapted layer's input to the adapter's dtype (fp32), and autocast casts it straight back to bf16
    for the adapter's matmul: the same values (bf16 -> fp32 -> bf16 is exact), but an fp32 copy of every adapted
    layer's input, kept for the backward pass, plus two casts. Without them the results are bit-identical, and an
    update of SmolLM2 with LoRA on every layer keeps a good part less activation memory (tests/test_precision.py).
    """
    try:
        from peft.helpers import disable_input_dtype_casting
    except ImportError:  # peft < 0.15 casts anyway: the same results, only slower
        disable_input_dtype_casting = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type=device_type, dtype=torch.bfloat16))
        if disable_input_dtype_casting is not None:
            stack.enter_context(disable_input_dtype_casting(model))
        yield

