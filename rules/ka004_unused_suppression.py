from kaudit.findings import Level, Precision
from kaudit.rule import Rule


class UnusedSuppression(Rule):
    """A `kaudit: ignore[...]` comment that suppresses nothing.

    ## What it does
    Reports an inline suppression (`# kaudit: ignore[KA101]` in Python, `// kaudit: ignore[KA2xx]`
    inside C++/CUDA sources) on a line where no enabled rule reported the codes it names. The
    suppression pass (`kaudit/suppressions.py`) emits it after all other rules have run.

    ## Why is this bad?
    Stale suppressions hide future findings on that line and tell reviewers something was waived
    that no longer exists. Remove them, or fix the code list.

    ## Example
    ```python
    out = self.ext.matmul_cuda(a, b)  # kaudit: ignore[KA101]
    ```
    """

    code = "KA004"
    name = "unused-suppression"
    level = Level.NOTE
    precision = Precision.VERY_HIGH
    tags = ("input", "suppression")
