"""The inputs of the scale probe (KD301, KP301): floating tensors multiplied by a factor, the rest
as it is. The reference job, the candidate job and the parent process (to check a kernel that
changed them, KD402) each make them the same way, so they are never written to disk. An
elementwise product by a scalar is correctly rounded, so every maker gets the same bits."""

from __future__ import annotations

from typing import Any


def scale_input(value: Any, factor: float, torch: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value * factor
    return value
