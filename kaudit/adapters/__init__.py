"""Benchmark adapters: each maps one benchmark's layout onto candidates (code, entry point,
backend), problems (`kaudit.adapters.model.ProblemSpec`) and claims, so that the static pass,
verdicts, summaries and every report work on it unchanged.

Layouts are recognised from their files; each adapter takes the files of its layout and leaves
the rest, KernelBench's adapter last. `benchmark` (`kaudit scan --benchmark`, config key
`benchmark`) forces one: its adapter then also takes files it would not have recognised (any
`.py` as a candidate), and the others are not asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kaudit.adapters import atrex, cuda_l1, fastkernels, kernelbench, kernelbenchx
from kaudit.adapters.model import BENCHMARKS
from kaudit.discover import NO_KERNEL_FILES, Discovery, WorkItem, display_path, natural_key
from kaudit.findings import ScanError

#: the adapters asked in turn, the most specific layouts first; KernelBench's takes the rest
ADAPTERS = {kernelbenchx.NAME: kernelbenchx.adapt, fastkernels.NAME: fastkernels.adapt,
            atrex.NAME: atrex.adapt, cuda_l1.NAME: cuda_l1.adapt}
assert {*ADAPTERS, kernelbench.NAME} == set(BENCHMARKS)


@dataclass
class Adapted:
    items: list[WorkItem] = field(default_factory=list)
    errors: list[ScanError] = field(default_factory=list)


def adapt(found: Discovery, benchmark: str | None = None) -> Adapted:
    """Raises ValueError for an unknown benchmark name."""
    if benchmark is not None and benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
    result = Adapted()
    left = list(found.items)
    taken: list[WorkItem] = []
    for name, adapter in ADAPTERS.items():
        if benchmark in (None, name):
            mine, left, errors = adapter(left, found.documents, forced=benchmark == name)
            taken.extend(mine)
            result.errors.extend(errors)
    taken.sort(key=lambda item: natural_key(item.display))
    rest, errors = kernelbench.adapt(left, found.claims)
    result.items = taken + rest
    result.errors.extend(errors)
    # a folder of `.json` files only is an error unless an adapter took one of them
    used = {item.file for item in result.items} | {error.path for error in result.errors}
    for folder, documents in found.bare_folders:
        if not any(document in used or display_path(document) in used
                   for document in documents):
            result.errors.append(ScanError(folder, f"{NO_KERNEL_FILES}, nor kernels of another "
                                           f"benchmark in its {len(documents)} .json files"))
    return result
