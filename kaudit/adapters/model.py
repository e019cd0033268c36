"""What an adapter makes of a benchmark's layout, as plain data: the candidate (its code, the
entry point the benchmark calls, its backend) and the problem it was written for (how to build
the reference, how to make inputs, at which sizes, in which dtype, judged by which tolerance).

The static pass needs only the candidate's entry point. The rest is for the dynamic pass: a
`ProblemSpec` says everything needed to run the reference and the candidate the way the
benchmark would, without knowing the benchmark's layout. Code is carried as `Code`: a path
(a file, or a virtual path `file.jsonl#L12/after_code` for a string inside a record) and, for
code inside a record, the text itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kaudit.entry import EntryPoint

BENCHMARKS = ("kernelbench", "kernelbenchx", "fastkernels", "atrex", "cuda-l1")

#: how a problem makes its inputs
INPUTS_GET_INPUTS = "get-inputs"  # KernelBench: get_inputs() and get_init_inputs() in the file
INPUTS_MAKE_INPUTS = "make-inputs"  # Atrex-Bench: Model(**init_kwargs)(**_make_inputs(**input_kwargs))
INPUTS_TEST = "test-function"  # KernelBenchX: the test below the separator fills `test_results`
INPUTS_CAPTURED = "captured"  # FastKernels: init and forward arguments captured from model runs

#: the code a candidate is written in, as far as its text tells
BACKENDS = ("triton", "cuda", "cutedsl", "tilelang", "pytorch", "unknown")


@dataclass(frozen=True)
class Code:
    """A piece of code: `path` is a file's display path, or `file#L<n>/<field>` for a string
    held in a record of `file` (then `text` holds it)."""

    path: str
    file: str
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "file": self.file}


@dataclass(frozen=True)
class Candidate:
    code: Code
    entry: EntryPoint
    backend: str = "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.to_dict(), "entry": self.entry.to_dict(),
                "backend": self.backend}


@dataclass(frozen=True)
class Size:
    """One problem size: the benchmark's id for it and the arguments that make it."""

    id: str
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    input_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProblemSpec:
    """What the candidate is judged against, the benchmark's way."""

    benchmark: str
    #: the benchmark's name for the task ("Fusion/gelu.py", "L1/rms_norm", "rms_norm", "1/19")
    task: str
    #: the reference: a class (`Model`, `GELU`) or function (`gelu`) in `reference`
    reference: Code | None = None
    reference_kind: str = "class"
    reference_name: str = "Model"
    #: how inputs are made (INPUTS_*), from which code, by which function
    inputs: str = INPUTS_GET_INPUTS
    inputs_code: Code | None = None
    inputs_name: str | None = None
    #: the sizes the benchmark checks (Atrex-Bench's shapes.json, FastKernels' captured cases)
    sizes: tuple[Size, ...] = ()
    #: why no size could be made, when the benchmark's inputs were found but cannot be built
    sizes_note: str = ""
    #: the code that times the candidate at its own sizes, when the benchmark has one
    #: (KernelBenchX's metrics/golden_metrics/<stem>_perf.py)
    timing: Code | None = None
    #: the dominant dtype, as the benchmark names it ("bf16", "float32")
    dtype: str | None = None
    #: `kaudit.dynamic.tolerance.PRESETS` name of the benchmark's own check
    tolerance: str = "kernelbench"
    #: per-task thresholds that replace the tolerance (KernelBenchX: cosine_sim, l1_relative, rmse)
    thresholds: dict[str, float] = field(default_factory=dict)
    #: speed-of-light time per size and GPU, in ms (Atrex-Bench's roofline.json)
    roofline: dict[str, dict[str, float]] = field(default_factory=dict)

    def sol_ms(self, size: str, gpu: str) -> float | None:
        """The speed-of-light time of one size on a GPU, matched by name ("NVIDIA H20" -> H20)."""
        times = self.roofline.get(size, {})
        for name, value in times.items():
            if name.lower() == gpu.lower() or name.lower() in gpu.lower().split():
                return value
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark, "task": self.task,
            "reference": self.reference.to_dict() if self.reference else None,
            "reference_kind": self.reference_kind, "reference_name": self.reference_name,
            "inputs": self.inputs,
            "inputs_code": self.inputs_code.to_dict() if self.inputs_code else None,
            "inputs_name": self.inputs_name,
            "sizes": [{"id": s.id, "init_kwargs": s.init_kwargs, "input_kwargs": s.input_kwargs}
                      for s in self.sizes],
            "sizes_note": self.sizes_note,
            "timing": self.timing.to_dict() if self.timing else None,
            "dtype": self.dtype, "tolerance": self.tolerance, "thresholds": self.thresholds,
            "roofline": self.roofline,
        }


def backend_of(text: str) -> str:
    """The backend a candidate's text uses, by its imports and calls."""
    if "cutlass.cute" in text or "cute.kernel" in text:
        return "cutedsl"
    if "import tilelang" in text:
        return "tilelang"
    if "triton.jit" in text or "@triton" in text or "import triton" in text:
        return "triton"
    if "load_inline" in text or "__global__" in text or "cpp_extension" in text \
            or "load_op(" in text or ".cu\"" in text:
        return "cuda"
    if "import torch" in text:
        return "pytorch"
    return "unknown"
