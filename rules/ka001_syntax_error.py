from kaudit.findings import Level, Precision
from kaudit.rule import InputProblemRule


class SyntaxError_(InputProblemRule):
    """The file does not parse as Python.

    ## What it does
    Reports a kernel file that is not valid Python, at the place where parsing stopped.

    ## Why is this bad?
    A file that does not parse cannot be audited, and a benchmark harness would fail to import
    it too. kaudit reports it instead of skipping it, so a broken submission is never mistaken for
    a clean one.

    ## Example
    ```python
    class ModelNew(nn.Module):
        def forward(self, x)
            return x
    ```
    """

    code = "KA001"
    name = "syntax-error"
    level = Level.ERROR
    precision = Precision.VERY_HIGH
    tags = ("input",)
