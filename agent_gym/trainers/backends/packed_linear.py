"""Linear layers for generation on a CPU, their weights prepacked once into oneDNN's blocked layout.

``F.linear`` on a CPU hands oneDNN a plain row-major weight, which it lays out again on every call. A decode
step multiplies a few rows (one per live episode) by every weight of the model, so that layout work is a large
part of the step. Measured (2026-11-28, AMD EPYC, one thread, two RL runs on the machine; SmolLM2-135M's 210
decoder linears, each its own weight, ms a pass): bf16 at 16 rows 25.3 -> 19.7, 8 rows 29.3 -> 11.6, 4 rows
19.9 -> 9.9, 64 rows 49.6 -> 44.2; fp32 at 16 rows 75.2 -> 33.7. Packing all of them took 0.06 s.

The packed copies are made and used with the mkldnn ops that torch's own CPU inductor uses for frozen linears
(``torch.ops.mkldnn._reorder_linear_weight`` and ``_linear_pointwise``). They are private, so each dtype is
checked once against ``F.linear``; where the ops are missing or disagree, ``F.linear`` is used.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

__all__ = ["PackedLinears", "packing_works"]

# The batch the layout is tuned for: a GRPO rollout's decode batch. Other batch sizes give the same results.
_ROWS_HINT = 16


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def packing_works(dtype: torch.dtype) -> bool:
    """Whether prepacked CPU linears of ``dtype`` run here and agree with ``F.linear``."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 48, generator=generator).to(dtype)
    weight = torch.randn(40, 48, generator=generator).to(dtype)
    bias = torch.randn(40, generator=generator).to(dtype)
    try:
        with torch.inference_mode():
            got, expected = _packed_linear(x, _pack(weight), bias), F.linear(x, weight, bias)
    except (AttributeError, RuntimeError, NotImplementedError) as error:  # an op missing from this torch build
        logger.info("prepacked %s linears unavailable here (%s): F.linear is used", dtype, error)
        return False
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-4
    agree = got.shape == expected.shape and torch.allclose(got.float(), expected.float(), rtol=tolerance,
                                                            atol=tolerance)
    if not agree:
        logger.warning("prepacked %s linears disagree with F.linear on this machine: F.linear is used", dtype)
    return agree


class PackedLinears:
    """Packed copies of a model's linear weights, by weight tensor, remade when a weight changes.

    A weight's in-place version counter and storage tell whether it changed (an optimizer step, a weight sync),
    so :meth:`refresh` before each generation call is all a caller does. A weight that was never packed runs
    through ``F.linear``.
    """

    def __init__(self) -> None:
        self._packed: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        """Memory the packed copies hold."""
        return sum(packed.numel() * packed.element_size() for _, packed in self._packed.values())

    @torch.no_grad()
    def refresh(self, weights: Iterable[torch.Tensor]) -> None:
        """Pack ``weights`` (those of a CPU model in a dtype that :func:`packing_works`); drop any other."""
        fresh = {}
        for weight in weights:
            if weight.device.type != "cpu" or not packing_works(weight.dtype):
                continue
            stamp = (weight._version, weight.data_ptr())
            known = self._packed.get(id(weight))
            fresh[id(weight)] = known if known is not None and known[0] == stamp else (stamp, _pack(weight))
        self._packed = fresh

    def clear(self) -> None:
        """Drop every packed copy."""
        self._packed = {}

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, through the packed copy where there is one."""
        entry = self._packed.get(id(weight))
        if entry is None or x.dtype != weight.dtype:
            return F.linear(x, weight, bias)
        return _packed_linear(x, entry[1], bias)
