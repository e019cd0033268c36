from collections.abc import Iterable

from kaudit.findings import Finding, Level, Precision
from kaudit.rule import Rule
from kaudit.source import SourceModel


class UnanalysedExtensionSource(Rule):
    """C++/CUDA source that kaudit could not read or parse, so did not analyse.

    ## What it does
    Reports an extension source handed to `load_inline`/`load` that is built at run time (read from
    a computed path, produced by a function call), a `sources=[...]` file that is missing, and
    embedded C++/CUDA code that tree-sitter's CUDA grammar cannot parse (at the first error).

    ## Why is this bad?
    The rules that look inside C++/CUDA code saw nothing of it, so a clean report says less than
    it seems. The note tells a reviewer where the static pass stopped and the dynamic pass must
    decide.

    ## Example
    ```python
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="k", cpp_sources=open(SRC).read(), functions=["run"])

    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.run(x)
    ```
    """

    code = "KA005"
    name = "unanalysed-extension-source"
    level = Level.NOTE
    precision = Precision.VERY_HIGH
    tags = ("input", "cuda")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        for unresolved in model.unresolved_sources:
            yield self.report(model, unresolved.node, unresolved.reason)
        for unit in model.cuda_units:
            if not unit.tree.root_node.has_error:
                continue
            bad = next(unit.walk_errors(), None)
            if bad is not None:
                yield self.report(model, unit.location(bad),
                                  f"{unit.kind} source does not parse here "
                                  f"(`{unit.text_of(bad)[:40].strip()}`); rules may miss code in it")
