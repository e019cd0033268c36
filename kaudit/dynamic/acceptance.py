"""Would the benchmark accept this? Each benchmark's own check (`Tolerance.accepts`: KernelBench's
allclose, KernelBenchX's assert_close, FastKernels' 99 % rule, Atrex-Bench's float64 allclose)
applied wherever the dynamic pass asks it, and what its blind spots let through.

kaudit's own verdict on an output stays the scale-invariant check in `judge`; this module answers
the other question, the benchmark's: `accepts_all` for a kernel's outputs, `best_constant` for
`kaudit problems`' trivial-output probes, and KD203 for a pass that relies on a check's slack
(FastKernels lets 1 % of the elements be anything: outside the bound, or never written).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kaudit.dynamic.probes import constant_for, is_float
from kaudit.dynamic.tolerance import Tolerance
from kaudit.findings import Level

if TYPE_CHECKING:
    from kaudit.dynamic.judge import Adder


def accepts_all(reference: list, candidate: list, tolerance: Tolerance) -> bool:
    """The benchmark's verdict on a call: every output accepted (same count and shapes)."""
    return len(reference) == len(candidate) and all(
        tolerance.accepts(r, c) for r, c in zip(reference, candidate))


def best_constant(references: list[torch.Tensor], tolerance: Tolerance
                  ) -> tuple[bool, float | None]:
    """Whether one constant output is accepted against every reference, and that constant.

    For allclose (rtol scaled by the candidate) the constant is `probes.constant_for`'s; for a
    check whose rtol scales the reference, each element y accepts the constants within
    atol + rtol·|y| of it, and the constant is where most of those intervals overlap (all of them
    for an every-element check, `min_matched` of them for FastKernels'). Either is then verified
    with the check itself, which also rounds to the dtype.
    """
    if not references or any(r.numel() == 0 for r in references):
        return False, None
    wide = [r.double().reshape(-1) for r in references]
    if any(not bool(torch.isfinite(w).all()) for w in wide):
        return False, None
    atol, rtol = tolerance.for_dtype(str(references[0].dtype))
    if not is_float(references[0]) and tolerance.exact_integers:
        atol = rtol = 0.0
    if tolerance.relative_to == "candidate":
        value = constant_for(min(float(w.min()) for w in wide),
                             max(float(w.max()) for w in wide), atol, rtol)
    else:
        value = _deepest_overlap(torch.cat(wide), atol, rtol)
    if value is None:
        return False, None
    ok = all(tolerance.accepts(r, torch.full_like(r, value if is_float(r) else round(value)))
             for r in references)
    return ok, value if ok else None


def _deepest_overlap(values: torch.Tensor, atol: float, rtol: float) -> float:
    """A point inside the largest number of intervals [y - b, y + b], b = atol + rtol·|y|: the
    middle of the stretch where that number is reached (a sweep over the sorted ends)."""
    bound = atol + rtol * values.abs()
    points = torch.cat([values - bound, values + bound])
    steps = torch.cat([torch.ones_like(values), -torch.ones_like(values)])
    # at equal points an interval opens before another closes (closed intervals)
    order = torch.argsort(-steps, stable=True)
    order = order[torch.argsort(points[order], stable=True)]
    depth = torch.cumsum(steps[order], 0)
    best = int(torch.argmax(depth))
    start = float(points[order][best])
    stop = float(points[order][best + 1]) if best + 1 < len(order) else start
    return (start + stop) / 2


def report_slack(add: Adder, name: str, when: str, reference: Any, candidate: Any,
                 tolerance: Tolerance, scale_ok: bool, numbers: str,
                 metrics: dict[str, Any]) -> bool:
    """KD203 when the benchmark accepts this output only through its slack (some elements
    outside the bound); an error when kaudit's scale-invariant check also fails. True when
    reported (KD201 then has nothing to add)."""
    if tolerance.min_matched >= 1.0 or not tolerance.accepts(reference, candidate):
        return False
    numel = reference.numel()
    outside = numel - int(tolerance.within(reference, candidate).sum()) if numel else 0
    if not outside:
        return False
    verdict = ("and the scale-invariant check fails: " if not scale_ok else
               "the scale-invariant check passes: ") + numbers
    add("KD203", f"{name}{when} passes {tolerance.check_text(_dtype(reference))} only through "
        f"its slack: {outside} of {numel} elements ({100 * outside / numel:.3g} %) are outside "
        f"the bound; {verdict}", level=None if scale_ok else Level.ERROR, outside=outside,
        numel=numel, min_matched=tolerance.min_matched, **metrics)
    return True


def report_unwritten_slack(add: Adder, reference: list, plain: list,
                           unwritten: dict[int, Any], tolerance: Tolerance) -> None:
    """KD203 (beside KD101) for an output with elements never written that the benchmark's check
    accepts whatever finite values those hold: the written elements alone reach its share."""
    if tolerance.min_matched >= 1.0 or len(plain) != len(reference):
        return
    for index, mask in unwritten.items():
        ref, out = reference[index], plain[index]
        count, numel = int(mask.sum()), ref.numel()
        if not count or out.shape != ref.shape:
            continue
        share = float((tolerance.within(ref, out) & ~mask).sum()) / numel
        if share >= tolerance.min_matched:
            name = "the output" if len(reference) == 1 else f"output {index}"
            add("KD203", f"{name}: {count} of {numel} elements ({100 * count / numel:.3g} %) "
                f"were never written, and {tolerance.check_text(_dtype(ref))} passes whatever "
                f"finite values they hold: the written elements alone are {share:.4%} within "
                f"the bound", output=index, unwritten=count, numel=numel,
                matched_written=round(share, 6), min_matched=tolerance.min_matched,
                tolerance=tolerance.name)


def summary(runs: list) -> dict[str, Any]:
    """For the scan's summary: the kernels that ran, how many of them their benchmark's check
    accepts (`KernelRun.metrics["benchmark_accepts"]`, on the first call) and how many of those
    kaudit rejects all the same."""
    from kaudit.dynamic.judge import rejected

    judged = [r for r in runs if "benchmark_accepts" in r.metrics]
    accepted = [r for r in judged if r.metrics["benchmark_accepts"]]
    return {"benchmark_check": {"judged": len(judged), "accepted": len(accepted),
                                "accepted_but_rejected": sum(map(rejected, accepted))}}


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")
