"""The inputs of the scale probe (KD301, KP301): floating tensors multiplied by a factor, the rest
as it is. The reference job, the candidate job and the parent process (to check a kernel that
changed them, KD402) each make them the same way, so they are never written to disk. An
elementwise product by a scalar is correctly rounded, so every maker gets the same bits.

`distance`: how far an output is from a truer one, without scale (relative L2 error, max error /
max |truth|), the measure of KD201/KD202/KD301; the judge and the reference job (which sends
numbers, not its native scaled outputs) compute it the same way."""

from __future__ import annotations

import math
from typing import Any

#: elements per slice when distances are summed in float64 (bounds the memory it takes)
SLICE = 1 << 24


def scale_input(value: Any, factor: float, torch: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value * factor
    return value


def distance(truth: Any, values: Any) -> tuple[float, float]:
    """(relative L2 error, max error / max |truth|) of `values` against `truth`, in float64, a
    slice at a time; inf for an error that is not finite (a NaN or Inf in either) or against a
    truth that is all zero where the values are not."""
    truth, values = truth.reshape(-1), values.reshape(-1)
    error = norm = error_peak = peak = 0.0
    for start in range(0, truth.numel(), SLICE):
        part = truth[start:start + SLICE].double()
        diff = values[start:start + SLICE].double() - part
        error += float(diff.square().sum())
        norm += float(part.square().sum())
        error_peak = max(error_peak, max_abs(diff))
        peak = max(peak, max_abs(part))
    if not math.isfinite(error) or not math.isfinite(error_peak):
        return math.inf, math.inf
    rel = math.sqrt(error / norm) if norm else (0.0 if error == 0 else math.inf)
    ratio = error_peak / peak if peak else (0.0 if error_peak == 0 else math.inf)
    return rel, ratio


def max_abs(values: Any) -> float:
    """max |values| (0 for none) in one pass, without an absolute copy."""
    if not values.numel():
        return 0.0
    low, high = values.aminmax()
    return max(abs(float(low)), abs(float(high)))


def twin(exact: Any, native: Any, torch: Any) -> Any:
    """The float64 output kept as the judge needs it: in float32 (complex64) for an output of
    lower precision, whose checks stop three orders of magnitude above float32's rounding."""
    if native.dtype in (torch.float64, torch.complex128) or not exact.is_floating_point() and \
            not exact.is_complex():
        return exact
    return exact.to(torch.complex64 if exact.is_complex() else torch.float32)
