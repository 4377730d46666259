"""The torch thread count of ``train``, ``sft``, ``model pretrain`` and ``eval --model``, chosen by measurement.

Measured on the project's shared 2-core machine (load average 1.7 to 4.4 while measuring; a CPU experiment ran
beside it), the committed 1.2M-parameter warm start and a 29M-parameter ``small`` model, a training step of
8 x 384 tokens and greedy decoding after a 256-token prompt:

==========================  ======================  ======================  =====================
threads                     1                       2                       0 (torch's default: 2)
==========================  ======================  ======================  =====================
tiny: train step / decode   1.41 s / 5.0 ms a token  4.11 s / 277 ms         2.60 s / 46.5 ms
small: train step / decode  14.9 s / 33.9 ms         26.9 s / 295 ms         14.3 s / 74.4 ms
==========================  ======================  ======================  =====================

One thread was never slower than torch's default, and decoding, which dominates RL rollouts and model evals
of small models, ran 2-9x faster: a thread per core stalls whenever another process holds a core. So the
default is 1; ``--torch-threads N`` sets N, and 0 keeps torch's own choice (one thread per core), which may pay
on a large model on an idle many-core machine.
"""

from __future__ import annotations

from agent_gym.error import InvalidValue

__all__ = ["DEFAULT_TORCH_THREADS", "set_torch_threads"]

DEFAULT_TORCH_THREADS = 1


def set_torch_threads(threads: int | None = None) -> int:
    """Apply ``threads`` (None: :data:`DEFAULT_TORCH_THREADS`; 0: torch's default) and return the count in use."""
    import torch

    threads = DEFAULT_TORCH_THREADS if threads is None else threads
    if threads < 0:
        raise InvalidValue(f"torch threads must be >= 0 (0: torch's default), got {threads}")
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
