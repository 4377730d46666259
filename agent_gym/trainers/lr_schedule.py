"""The learning-rate schedule of every training loop (RL, pretraining, SFT): linear warm-up, then decay.

One factor of the peak learning rate per optimizer step, for ``torch.optim.lr_scheduler.LambdaLR``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

__all__ = ["lr_factor", "lr_lambda"]


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, decay: Literal["constant", "cosine"] = "cosine",
              floor: float = 0.0, warmup_overlaps: bool = False) -> float:
    """The share of the peak learning rate at optimizer step ``step`` (0-based).

    ``(step + 1) / warmup_steps`` during the warm-up, then 1 (``constant``) or a half cosine from 1 down to
    ``floor`` at ``total_steps`` (``cosine``), held there after. ``warmup_overlaps``: the cosine runs from step 0
    and the warm-up ramp multiplies it (SFT's schedule since its first release, kept so its runs resume and
    reproduce exactly).
    """
    if warmup_overlaps:
        ramp = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
        progress = min(step, total_steps) / max(1, total_steps)
        return ramp * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_lambda(*, warmup_steps: int, total_steps: int, decay: Literal["constant", "cosine"] = "cosine",
              floor: float = 0.0, warmup_overlaps: bool = False) -> Callable[[int], float]:
    """:func:`lr_factor` with its settings bound: the ``lr_lambda`` argument of ``LambdaLR``."""

    def factor(step: int) -> float:
        return lr_factor(step, warmup_steps=warmup_steps, total_steps=total_steps, decay=decay, floor=floor,
                         warmup_overlaps=warmup_overlaps)

    return factor
