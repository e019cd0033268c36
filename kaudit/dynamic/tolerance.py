"""The correctness checks of the benchmark harnesses, as (atol, rtol) per output dtype.

KernelBench's harnesses judge with `torch.allclose(reference, candidate, atol=atol, rtol=rtol)`,
that is `|reference - candidate| <= atol + rtol * |candidate|` elementwise, NaN never equal.
Other benchmarks differ, and `Tolerance.accepts` is each one's own check:
- KernelBenchX: `assert_close(candidate, reference)`, rtol relative to |reference|, NaN equal
  to NaN, the dtypes equal; by output dtype rtol = atol = 5e-3 for float16/bfloat16, 1e-5 for
  float32/float64, exact for any other dtype. A task with `precision_thresholds` in
  `data/kernelbenchx_v1.json` (its quantized ones) is judged by those instead: cosine similarity,
  relative L1 error and RMSE of the float32 copies (`with_precision_thresholds`);
- FastKernels: in float32, rtol relative to |reference|; the output passes when 99 % of its
  elements are within tolerance; any NaN or Inf, or an all-zero output for a non-zero
  reference, fails;
- Atrex-Bench: `allclose` in float64; exact for integer outputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kaudit.dynamic.harness.counting import count_true

#: dtypes named as torch prints them without the `torch.` prefix
HALF_DTYPES = ("float16", "bfloat16")
#: KernelBenchX's defaults for a `precision_thresholds` key a task leaves out
PRECISION_DEFAULTS = {"cosine_sim": 0.99, "l1_relative": 0.01, "rmse": 0.01}


@dataclass(frozen=True)
class Tolerance:
    name: str
    atol: float
    rtol: float
    #: per-dtype overrides: dtype name -> (atol, rtol)
    by_dtype: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the share of elements that must be within tolerance (FastKernels: 0.99)
    min_matched: float = 1.0
    #: whose magnitude rtol scales: "candidate" (torch.allclose(reference, candidate)) or
    #: "reference" (assert_close(candidate, reference), FastKernels' bound)
    relative_to: str = "candidate"
    #: the dtype both are compared in; None: the reference's
    compare_in: str | None = None
    #: NaN in both at the same place counts as equal (assert_close's equal_nan=True)
    equal_nan: bool = False
    #: FastKernels' sanity rules: any NaN/Inf fails, an all-zero output for a non-zero reference
    #: fails
    strict_values: bool = False
    #: integer and bool outputs must be equal (KernelBenchX, Atrex-Bench)
    exact_integers: bool = False
    #: the candidate's dtype must be the reference's (KernelBenchX's assert_close)
    same_dtype: bool = False
    #: KernelBenchX's per-task check, replacing atol/rtol: {"cosine_sim": minimum,
    #: "l1_relative": maximum, "rmse": maximum}
    precision_thresholds: dict[str, float] = field(default_factory=dict)

    def for_dtype(self, dtype: str) -> tuple[float, float]:
        return self.by_dtype.get(dtype.removeprefix("torch."), (self.atol, self.rtol))

    def with_precision_thresholds(self, thresholds: dict[str, float]) -> Tolerance:
        """This check judged by KernelBenchX's `precision_thresholds` (missing keys take its
        defaults: cosine 0.99, L1 0.01, RMSE 0.01); itself when `thresholds` is empty."""
        if not thresholds:
            return self
        return dataclasses.replace(self, precision_thresholds={
            **PRECISION_DEFAULTS, **{k: float(v) for k, v in thresholds.items()
                                     if k in PRECISION_DEFAULTS}})

    def describe(self) -> str:
        if self.precision_thresholds:
            return f"{self.name}: {self._precision_text()}"
        text = f"{self.name}: atol {self.atol:g}, rtol {self.rtol:g}"
        overrides = sorted(set(self.by_dtype.values()) - {(self.atol, self.rtol)})
        for atol, rtol in overrides:
            names = "/".join(d for d, v in self.by_dtype.items() if v == (atol, rtol))
            text += f"; {names}: atol {atol:g}, rtol {rtol:g}"
        return text

    def scaled(self, share: float) -> Tolerance:
        """This check with every atol and rtol multiplied by `share` (a stricter copy)."""
        return dataclasses.replace(
            self, atol=self.atol * share, rtol=self.rtol * share,
            by_dtype={d: (a * share, r * share) for d, (a, r) in self.by_dtype.items()})

    def check_text(self, dtype: str) -> str:
        """The check applied to an output of `dtype`, for messages: `kernelbench allclose (atol
        0.0001, rtol 0.0001)`, `fastkernels check (atol 1e-05, rtol 0.001, 99 % of elements)`."""
        if self.precision_thresholds:
            return f"{self.name} check ({self._precision_text()})"
        atol, rtol = self.for_dtype(dtype)
        kind = "allclose" if self.min_matched >= 1.0 and self.relative_to == "candidate" \
            else "check"
        share = f", {self.min_matched * 100:g} % of elements" if self.min_matched < 1.0 else ""
        return f"{self.name} {kind} (atol {atol:g}, rtol {rtol:g}{share})"

    def summary(self, dtype: str) -> dict:
        """The check applied to an output of `dtype`: {"preset", "atol", "rtol"}, and the
        task's "precision_thresholds" when they replace atol and rtol."""
        atol, rtol = self.for_dtype(dtype)
        data = {"preset": self.name, "atol": atol, "rtol": rtol}
        if self.precision_thresholds:
            data["precision_thresholds"] = dict(self.precision_thresholds)
        return data

    def _precision_text(self) -> str:
        limits = self.precision_thresholds
        return (f"cosine >= {limits['cosine_sim']:g}, relative L1 <= {limits['l1_relative']:g}, "
                f"RMSE <= {limits['rmse']:g}")

    def to_dict(self) -> dict:
        data = {"preset": self.name, "atol": self.atol, "rtol": self.rtol,
                "by_dtype": {d: {"atol": a, "rtol": r} for d, (a, r) in self.by_dtype.items()}}
        if self.min_matched < 1.0:
            data["min_matched"] = self.min_matched
        if self.precision_thresholds:
            data["precision_thresholds"] = dict(self.precision_thresholds)
        return data

    def within(self, reference, candidate):
        """Flat bool tensor: the elements within this check's bound; NaN and Inf never are unless
        `equal_nan` pairs them."""
        import torch  # the dynamic pass's dependency; presets are plain data without it

        atol, rtol = self.for_dtype(str(reference.dtype))
        if not (reference.is_floating_point() or reference.is_complex()):
            if self.exact_integers:
                atol = rtol = 0.0
            reference, candidate = reference.double(), candidate.double()
        dtype = getattr(torch, self.compare_in) if self.compare_in else reference.dtype
        ref, out = reference.to(dtype).reshape(-1), candidate.to(dtype).reshape(-1)
        scale = ref if self.relative_to == "reference" else out
        bound = scale.abs().mul_(rtol).add_(atol)  # in place: outputs reach gigabytes
        error = out - ref
        within = (error.abs() if error.is_complex() else error.abs_()) <= bound
        if self.equal_nan:
            within = within | (torch.isnan(ref) & torch.isnan(out))
        return within

    def matched(self, reference, candidate) -> float:
        """The share of elements within this check's bound (1.0 for empty outputs)."""
        if reference.numel() == 0:
            return 1.0
        return count_true(self.within(reference, candidate)) / reference.numel()

    def accepts(self, reference, candidate) -> bool:
        """This benchmark's verdict on one output (same shapes assumed; a shape mismatch fails
        every check and is the caller's to report)."""
        import torch

        if reference.shape != candidate.shape:
            return False
        if self.same_dtype and reference.dtype != candidate.dtype:
            return False
        if self.strict_values and reference.numel():
            ref, out = reference.double(), candidate.double()
            if not (bool(torch.isfinite(ref).all()) and bool(torch.isfinite(out).all())):
                return False
            if bool(ref.ne(0).any()) and not bool(out.ne(0).any()):
                return False
        if self.precision_thresholds:
            return self._meets_precision(reference, candidate)
        if self.min_matched >= 1:
            return reference.numel() == 0 or bool(self.within(reference, candidate).all())
        return self.matched(reference, candidate) >= self.min_matched

    def _meets_precision(self, reference, candidate) -> bool:
        """KernelBenchX's `precision_metric` on float32 copies: cosine similarity (1 when both
        are all-zero, 0 when one is), L1 error relative to sum|reference|, and RMSE."""
        import torch

        ref, out = reference.float().reshape(-1), candidate.float().reshape(-1)
        if ref.numel() == 0:
            return True
        ref_norm, out_norm = float(ref.norm()), float(out.norm())
        if ref_norm < 1e-12 or out_norm < 1e-12:
            cosine = 1.0 if ref_norm < 1e-12 and out_norm < 1e-12 else 0.0
        else:
            cosine = float(torch.nn.functional.cosine_similarity(out[None], ref[None]))
        l1 = float((out - ref).abs().sum() / ref.abs().sum().clamp_min(1e-12))
        rmse = float(((out - ref) ** 2).mean().sqrt())
        limits = self.precision_thresholds
        # NaN metrics fail every comparison, as in the benchmark
        return cosine >= limits["cosine_sim"] and l1 <= limits["l1_relative"] \
            and rmse <= limits["rmse"]


PRESETS: dict[str, Tolerance] = {
    # KernelBench v0 / v0.1: one tolerance for every dtype
    "kernelbench-v0": Tolerance("kernelbench-v0", 1e-2, 1e-2),
    # KernelBench from late 2025: tight for fp32 outputs, loose for half precision
    "kernelbench": Tolerance("kernelbench", 1e-4, 1e-4,
                             {d: (1e-2, 1e-2) for d in HALF_DTYPES}),
    "robust-kbench": Tolerance("robust-kbench", 1e-5, 1e-5),
    # KernelBenchX EVAL/1_exe_acc.py: assert_close(candidate, reference, equal_nan=True) after
    # an equal-dtype check; 1e-5 for fp32/fp64, 5e-3 for fp16/bf16, exact for any other dtype.
    # (Tasks with precision_thresholds use cosine/L1/RMSE instead: with_precision_thresholds.)
    "kernelbenchx": Tolerance("kernelbenchx", 0.0, 0.0,
                              {"float32": (1e-5, 1e-5), "float64": (1e-5, 1e-5),
                               **{d: (5e-3, 5e-3) for d in HALF_DTYPES}},
                              relative_to="reference", equal_nan=True, exact_integers=True,
                              same_dtype=True),
    # FastKernels bench.py: per-dtype bound on float32 copies, 99 % of elements must match
    "fastkernels": Tolerance("fastkernels", 1e-2, 1e-2,
                             {"float32": (1e-5, 1e-3), "float64": (1e-5, 1e-3),
                              **{d: (1e-2, 1e-2) for d in HALF_DTYPES},
                              **{d: (0.125, 0.125) for d in ("float8_e4m3fn", "float8_e5m2")}},
                             min_matched=0.99, relative_to="reference", compare_in="float32",
                             strict_values=True),
    # Atrex-Bench eval/correctness.py: allclose in float64, integers exact
    "atrex": Tolerance("atrex", 1e-2, 5e-2, compare_in="float64", exact_integers=True),
}
DEFAULT_PRESET = "kernelbench"


def resolve(preset: str | None, atol: float | None, rtol: float | None) -> Tolerance:
    """A preset by name, or a custom tolerance when both `atol` and `rtol` are given.

    Raises ValueError for an unknown preset, a preset combined with atol/rtol, only one of the two,
    or values outside 0 <= atol, 0 <= rtol < 1.
    """
    if atol is None and rtol is None:
        name = preset or DEFAULT_PRESET
        if name not in PRESETS:
            raise ValueError(f"unknown tolerance preset {name!r}; choose one of "
                             f"{', '.join(PRESETS)}, or give --atol and --rtol")
        return PRESETS[name]
    if preset is not None:
        raise ValueError("give either --tolerance or --atol/--rtol, not both")
    if atol is None or rtol is None:
        raise ValueError("--atol and --rtol go together")
    if not (atol >= 0 and 0 <= rtol < 1):
        raise ValueError("need atol >= 0 and 0 <= rtol < 1")
    return Tolerance("custom", atol, rtol)
