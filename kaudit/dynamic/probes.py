"""The probes of `kaudit problems`, computed in the kaudit process from the reference outputs a
child returned. Pure functions over CPU tensors; torch is imported by the caller's module only.

Whether an output passes is the benchmark's own check (`Tolerance.accepts`, applied by
`kaudit.dynamic.acceptance`); `constant_for` solves KernelBench's allclose,
`|reference - candidate| <= atol + rtol * |candidate|`, for a constant candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kaudit.dynamic.harness.counting import count_true, count_where
from kaudit.dynamic.harness.scaling import max_abs

#: outputs whose seeds differ by less than this share of max|y| are "input-independent"
SAME_OUTPUT_RELATIVE = 1e-6
#: float and float64 references farther apart than this (relative L2): the output is noise
NOISE_RELATIVE_L2 = 0.1
#: recommended thresholds: this many times the measured native-vs-float64 gap ...
MARGIN = 10.0
#: ... and never below this many machine epsilons of the output dtype
FLOOR_EPS = 10.0
#: KP201: the median element's allowed relative error is at least this many times rtol
LOOSENESS = 10.0
#: KP103 on a sampled output: the sampled pairs must pass with this share of the tolerance
SAMPLED_PAIR_SHARE = 0.5


def is_float(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def constant_for(low: float, high: float, atol: float, rtol: float) -> float | None:
    """A constant c with |y - c| <= atol + rtol*|c| for every y in [low, high], or None.

    For c >= 0 the condition is (high - atol)/(1 + rtol) <= c <= (low + atol)/(1 - rtol); for c < 0
    it is (high - atol)/(1 - rtol) <= c <= (low + atol)/(1 + rtol). The midpoint of a non-empty
    interval nearest to the middle of [low, high] is returned (callers verify it with the real
    check, which also rounds to the dtype).
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    middle = (low + high) / 2
    for start, stop in (((high - atol) / (1 - rtol), min(0.0, (low + atol) / (1 + rtol))),
                        (max(0.0, (high - atol) / (1 + rtol)), (low + atol) / (1 - rtol))):
        if start <= stop:
            return min(max(middle, start), stop)
    return None


@dataclass(frozen=True)
class Gap:
    """How far a native-dtype output is from its float64 twin."""

    rel_l2: float
    max_rel: float
    #: NaN/Inf in the native output where the float64 one is finite
    native_nonfinite: int
    #: NaN/Inf in the float64 output
    reference_nonfinite: int

    def to_dict(self) -> dict:
        return {"rel_l2": _json_float(self.rel_l2), "max_rel": _json_float(self.max_rel),
                "native_nonfinite": self.native_nonfinite,
                "reference_nonfinite": self.reference_nonfinite}


def gap(native: torch.Tensor, reference: torch.Tensor) -> Gap:
    a, b = native.double().flatten(), reference.double().flatten()
    if a.shape != b.shape:
        raise ValueError(f"float64 output has {b.numel()} elements, native {a.numel()}")
    finite_a, finite_b = _finite(native, a), _finite(reference, b)
    both = finite_a & finite_b
    if bool(both.all()):  # the usual case: no masked copies
        reference_nonfinite = native_nonfinite = 0
        error, base = a - b, b
    else:
        reference_nonfinite = count_true(~finite_b)
        native_nonfinite = count_true(~finite_a & finite_b)
        error, base = (a - b)[both], b[both]
    return Gap(_ratio(float(error.norm()) if error.numel() else 0.0,
                      float(base.norm()) if base.numel() else 0.0),
               _ratio(max_abs(error), max_abs(base)), native_nonfinite, reference_nonfinite)


def _finite(tensor: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
    """Flat finiteness mask of `tensor`, read from the narrower of it and its float64 copy
    `wide` (torch has no `isfinite` for the one-byte float8 dtypes on the CPU)."""
    return torch.isfinite(wide if tensor.element_size() == 1 else tensor.reshape(-1))


def combine(gaps: list[Gap]) -> Gap:
    return Gap(max(g.rel_l2 for g in gaps), max(g.max_rel for g in gaps),
               sum(g.native_nonfinite for g in gaps), sum(g.reference_nonfinite for g in gaps))


def floor_for(dtype: torch.dtype) -> float:
    return FLOOR_EPS * torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def absolute_dominance(reference: torch.Tensor, atol: float, rtol: float) -> dict:
    """How much of the check is its absolute part at this output's scale."""
    magnitude = reference.double().abs().flatten()
    magnitude = magnitude[torch.isfinite(magnitude)]
    if magnitude.numel() == 0:
        return {"share": None, "median_abs": None, "effective_rtol_at_median": None}
    share = float((atol > rtol * magnitude).double().mean())
    median = float(magnitude.median())
    effective = (atol + rtol * median) / median if median > 0 else math.inf
    return {"share": share, "median_abs": median,
            "effective_rtol_at_median": _json_float(effective)}


@dataclass(frozen=True)
class Moments:
    """What `summary_stats` reports, of one output or merged over several (Chan's pairwise
    update), so that statistics per seed and over all seeds take one pass over each output."""
    count: int  # finite elements
    mean: float
    m2: float  # sum of squared deviations from the mean
    low: float
    high: float
    nan: int
    inf: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Moments:
        values = tensor.double().flatten()
        finite = _finite(tensor, values)
        nan = inf = 0
        if not bool(finite.all()):
            nan = count_where(torch.isnan, values)
            inf = values.numel() - count_true(finite) - nan
            values = values[finite]
        if not values.numel():
            return cls(0, 0.0, 0.0, math.inf, -math.inf, nan, inf)
        std, mean = torch.std_mean(values, correction=0)
        low, high = torch.aminmax(values)
        count = values.numel()
        return cls(count, float(mean), float(std) ** 2 * count, float(low), float(high), nan, inf)

    @classmethod
    def merge(cls, parts: list[Moments]) -> Moments:
        total = cls(0, 0.0, 0.0, math.inf, -math.inf, 0, 0)
        for part in parts:
            count = total.count + part.count
            if not part.count:
                total = cls(total.count, total.mean, total.m2, total.low, total.high,
                            total.nan + part.nan, total.inf + part.inf)
                continue
            delta = part.mean - total.mean
            total = cls(count, total.mean + delta * part.count / count,
                        total.m2 + part.m2 + delta * delta * total.count * part.count / count,
                        min(total.low, part.low), max(total.high, part.high),
                        total.nan + part.nan, total.inf + part.inf)
        return total

    def stats(self) -> dict:
        """max|y|, std, mean, min, max over the finite elements; NaN and Inf counted."""
        counts = {"nan": self.nan, "inf": self.inf, "nonfinite": self.nan + self.inf}
        if not self.count:
            return {"max_abs": None, "std": None, "mean": None, "min": None, "max": None,
                    **counts}
        return {"max_abs": max(abs(self.low), abs(self.high)),
                "std": math.sqrt(self.m2 / self.count), "mean": self.mean, "min": self.low, "max": self.high, **counts}


def summary_stats(tensors: list[torch.Tensor]) -> dict:
    """max|y|, std, min, max, mean over the finite elements of several outputs."""
    return Moments.merge([Moments.of(t) for t in tensors]).stats()


def _ratio(numerator: float, denominator: float) -> float:
    if denominator > 0:
        return numerator / denominator
    return 0.0 if numerator == 0 else math.inf


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None
