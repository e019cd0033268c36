import ast
from collections.abc import Iterable

from kaudit.findings import Finding, Level, Location, Precision
from kaudit.rule import Rule
from kaudit.source import SourceModel


class MissingModelNew(Rule):
    """The file defines no `ModelNew` class to audit.

    ## What it does
    Reports a file named for auditing that does not define `class ModelNew`: it imports it from
    elsewhere, binds the name to something built at run time, or lacks it altogether. Files found
    while walking a folder that never mention `ModelNew` are skipped and counted instead. For
    other benchmarks the entry point is theirs (`--benchmark`): the class named like the
    reference's (FastKernels, Atrex-Bench) or `def <task>` / `def kernel_function` (KernelBenchX).

    ## Why is this bad?
    KernelBench-style harnesses instantiate `ModelNew`. When its code is not in the submission,
    kaudit cannot see what runs, and a harness may end up running code nobody reviewed.

    ## Example
    ```python
    from my_kernels import ModelNew  # the audited file holds none of the kernel
    ```
    """

    code = "KA002"
    name = "missing-model-new"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ("input",)

    def check(self, model: SourceModel) -> Iterable[Finding]:
        if model.module is None or model.model_new is not None or model.entry_function is not None:
            return
        names = set(model.entry.names)
        binding = next((node for node in model.nodes if _binds(node, names)), None)
        if binding is None:
            yield self.report(model, Location(model.path),
                              f"no {model.entry.describe()} in this file; there is nothing to audit")
        else:
            yield self.report(model, binding,
                              f"{' or '.join(sorted(f'`{n}`' for n in names))} is bound here but "
                              "not defined in this file; kaudit cannot audit code it cannot see")


def _binds(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[-1]) in names for alias in node.names)
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
    return False
