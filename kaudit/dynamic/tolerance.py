"""The correctness checks of the benchmark harnesses, as (atol, rtol) per output dtype.

Every harness judges with `torch.allclose(reference, candidate, atol=atol, rtol=rtol)`, that is
`|reference - candidate| <= atol + rtol * |candidate|` elementwise, NaN never equal.
"""

from __future__ import annotations

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

    def for_dtype(self, dtype: str) -> tuple[float, float]:
        return self.by_dtype.get(dtype.removeprefix("torch."), (self.atol, self.rtol))

    def describe(self) -> str:
        text = f"{self.name}: atol {self.atol:g}, rtol {self.rtol:g}"
        overrides = sorted(set(self.by_dtype.values()) - {(self.atol, self.rtol)})
        for atol, rtol in overrides:
            names = "/".join(d for d, v in self.by_dtype.items() if v == (atol, rtol))
            text += f"; {names}: atol {atol:g}, rtol {rtol:g}"
        return text

    def to_dict(self) -> dict:
        return {"preset": self.name, "atol": self.atol, "rtol": self.rtol,
                "by_dtype": {d: {"atol": a, "rtol": r} for d, (a, r) in self.by_dtype.items()}}


PRESETS: dict[str, Tolerance] = {
    # KernelBench v0 / v0.1: one tolerance for every dtype
    "kernelbench-v0": Tolerance("kernelbench-v0", 1e-2, 1e-2),
    # KernelBench from late 2025: tight for fp32 outputs, loose for half precision
    "kernelbench": Tolerance("kernelbench", 1e-4, 1e-4,
                             {d: (1e-2, 1e-2) for d in HALF_DTYPES}),
    "robust-kbench": Tolerance("robust-kbench", 1e-5, 1e-5),
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
