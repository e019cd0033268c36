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
    #: "class": an `nn.Module` whose `forward` the benchmark calls; "function": a function;
    #: "callable": either, whichever the file defines (KernelBenchX accepts both)
    kind: str = "class"
    #: the names the benchmark accepts, in its order of preference; the first one defined counts
    names: tuple[str, ...] = ("ModelNew",)

    @property
    def may_be_class(self) -> bool:
        return self.kind in ("class", "callable")

    @property
    def may_be_function(self) -> bool:
        return self.kind in ("function", "callable")

    def describe(self) -> str:
        """`class ModelNew`, `def gelu` or `def kernel_function`: for messages."""
        keyword = {"class": "class ", "function": "def ", "callable": ""}[self.kind]
        return " or ".join(f"`{keyword}{name}`" for name in self.names)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "names": list(self.names)}


#: KernelBench's: `class ModelNew` with its `forward`
MODEL_NEW = EntryPoint()
