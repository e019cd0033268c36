"""The correctness checks of the benchmark harnesses, as (atol, rtol) per output dtype.

KernelBench's harnesses judge with `torch.allclose(reference, candidate, atol=atol, rtol=rtol)`,
that is `|reference - candidate| <= atol + rtol * |candidate|` elementwise, NaN never equal.
Other benchmarks differ, and `Tolerance.accepts` is each one's own check:
- KernelBenchX: `assert_close(candidate, reference)`, rtol relative to |reference|, NaN equal
  to NaN, the dtypes equal; exact for every dtype other than float16/bfloat16/float32/float64;
- FastKernels: in float32, rtol relative to |reference|; the output passes when 99 % of its
  elements are within tolerance; any NaN or Inf, or an all-zero output for a non-zero
  reference, fails;
- Atrex-Bench: `allclose` in float64; exact for integer outputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

#: dtypes named as torch prints them without the `torch.` prefix
HALF_DTYPES = ("float16", "bfloat16")


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

    def for_dtype(self, dtype: str) -> tuple[float, float]:
        return self.by_dtype.get(dtype.removeprefix("torch."), (self.atol, self.rtol))

    def describe(self) -> str:
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
        atol, rtol = self.for_dtype(dtype)
        kind = "allclose" if self.min_matched >= 1.0 and self.relative_to == "candidate" \
            else "check"
        share = f", {self.min_matched * 100:g} % of elements" if self.min_matched < 1.0 else ""
        return f"{self.name} {kind} (atol {atol:g}, rtol {rtol:g}{share})"

    def to_dict(self) -> dict:
        data = {"preset": self.name, "atol": self.atol, "rtol": self.rtol,
                "by_dtype": {d: {"atol": a, "rtol": r} for d, (a, r) in self.by_dtype.items()}}
        if self.min_matched < 1.0:
            data["min_matched"] = self.min_matched
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
        within = (out - ref).abs() <= atol + rtol * scale.abs()
        if self.equal_nan:
            within = within | (torch.isnan(ref) & torch.isnan(out))
        return within

    def matched(self, reference, candidate) -> float:
        """The share of elements within this check's bound (1.0 for empty outputs)."""
        if reference.numel() == 0:
            return 1.0
        return float(self.within(reference, candidate).double().mean())

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
        return self.matched(reference, candidate) >= self.min_matched


PRESETS: dict[str, Tolerance] = {
    # KernelBench v0 / v0.1: one tolerance for every dtype
    "kernelbench-v0": Tolerance("kernelbench-v0", 1e-2, 1e-2),
    # KernelBench from late 2025: tight for fp32 outputs, loose for half precision
    "kernelbench": Tolerance("kernelbench", 1e-4, 1e-4,
                             {d: (1e-2, 1e-2) for d in HALF_DTYPES}),
    "robust-kbench": Tolerance("robust-kbench", 1e-5, 1e-5),
    # KernelBenchX EVAL/1_exe_acc.py: assert_close(candidate, reference, equal_nan=True) after
    # an equal-dtype check; 1e-5 for fp32/fp64, 5e-3 for fp16/bf16, exact for any other dtype.
    # (Tasks with precision_thresholds use cosine/L1/RMSE instead.)
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
