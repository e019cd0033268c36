"""What a benchmark calls in a submission: its entry point.

KernelBench instantiates `class ModelNew` and calls its `forward`; other benchmarks call a class
named like the reference's (FastKernels, Atrex-Bench) or a plain function (KernelBenchX:
`def <task stem>` or `def kernel_function`). The static rules follow the entry point's forward
path, whatever its name; the adapters (`kaudit.adapters`) say which one each submission has.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EntryPoint:
    #: "class": an `nn.Module` whose `forward` the benchmark calls; "function": a function
    kind: str = "class"
    #: the names the benchmark accepts, in its order of preference; the first one defined counts
    names: tuple[str, ...] = ("ModelNew",)

    @property
    def is_function(self) -> bool:
        return self.kind == "function"

    def describe(self) -> str:
        """`class ModelNew`, `def gelu or def kernel_function`: for messages."""
        keyword = "def" if self.is_function else "class"
        return " or ".join(f"`{keyword} {name}`" for name in self.names)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "names": list(self.names)}


#: KernelBench's: `class ModelNew` with its `forward`
MODEL_NEW = EntryPoint()
