"""KernelBench (ScalingIntelligence/KernelBench and its forks): `class ModelNew` kernels in run
folders, `generated_kernels/` trees, paired folders and JSONL files; their claims in
`eval_results.json` and `per_problem/`. The layout logic lives in `kaudit.results`; this adapter
is the last one asked: it takes every file the other benchmarks' adapters left."""

from __future__ import annotations

from kaudit.discover import WorkItem
from kaudit.findings import ScanError
from kaudit.results import ResultTrees

NAME = "kernelbench"


def adapt(items: list[WorkItem], claims: list[str]) -> tuple[list[WorkItem], list[ScanError]]:
    trees = ResultTrees()
    annotated = trees.annotate(items, claims)
    return annotated, trees.errors
