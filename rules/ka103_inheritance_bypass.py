import ast
from collections.abc import Iterable

from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.rule import Rule
from kaudit.source import SourceModel


class InheritanceBypass(Rule):
    """`ModelNew` reuses the reference `Model` instead of replacing it.

    ## What it does
    Reports a `ModelNew` that subclasses the reference `Model`, is the reference (`ModelNew =
    Model`), defines no `forward` of its own, calls `super().forward(...)` or
    `Model.forward(self, ...)`, or builds a `Model` and calls it on a forward path. Building a
    `Model` only to copy its initialised weights is not reported. A class named `Model` defined in
    the file whose forward runs custom kernels is the submission's own rewritten model, not the
    reference: wrapping or aliasing it is not reported.

    ## Why is this bad?
    The reference computation then produces the output: correctness checks pass by construction
    and any speedup measured is noise or comes from elsewhere.

    ## Example
    ```python
    class ModelNew(Model):
        def forward(self, x):
            return super().forward(x)
    ```
    """

    code = "KA103"
    name = "inheritance-bypass"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("bypass", "correctness")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        cls = model.model_new
        if cls is None:
            return
        analysis = ForwardAnalysis.of(model)
        header = model.header_location(cls)
        name = f"`{cls.name}`"
        if cls.name not in model.entry.names:  # `ModelNew = SomeClass`
            if analysis.is_reference(ast.Name(id=cls.name, ctx=ast.Load())):
                yield self.report(model, header, f"`{model.entry.names[0]}` is bound to the "
                                  f"reference `{cls.name}`: the reference computes the output")
            return
        inherits = [base for base in cls.bases if analysis.is_reference(base)]
        own_forward = bool(analysis.methods(cls).keys() & {"forward", "__call__"})
        if inherits and not own_forward:
            yield self.report(model, header,
                              f"{name} subclasses the reference `Model` and defines no forward: "
                              "the reference forward runs")
        elif inherits:
            yield self.report(model, header,
                              f"{name} subclasses the reference `Model`; its layers and "
                              "methods stay one call away from the forward path")
        elif not own_forward and model.entry.kind == "class":  # a callable may use another method
            yield self.report(model, header,
                              f"{name} defines no forward; calling it runs a base class's forward")
        for function in analysis.reachable:
            for op in analysis.function_ops(function):
                if op.kind is OpKind.REFERENCE_MODEL:
                    yield self.report(model, op.node,
                                      f"the forward path calls {op.description}: the reference "
                                      "computes the output")
