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
    while walking a folder that never mention `ModelNew` are skipped and counted instead.

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
        if model.model_new is not None or model.module is None:
            return
        binding = next((node for node in model.nodes if _binds_model_new(node)), None)
        if binding is None:
            yield self.report(model, Location(model.path),
                              "no `class ModelNew` in this file; there is nothing to audit")
        else:
            yield self.report(model, binding,
                              "`ModelNew` is bound here but not defined as a class in this file; "
                              "kaudit cannot audit code it cannot see")


def _binds_model_new(node: ast.AST) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[-1]) == "ModelNew" for alias in node.names)
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets)
    return False
