from kaudit.findings import Level, Precision
from kaudit.rule import InputProblemRule


class UnreadableFile(InputProblemRule):
    """The file cannot be read as text: binary, not UTF-8, over 5 MB, or not readable.

    ## What it does
    Reports a file that was given to kaudit (or found while walking a folder) but cannot be read
    as UTF-8 Python source: it holds NUL bytes, an invalid UTF-8 sequence, is larger than 5 MB, or
    the operating system refuses to read it (permissions, a broken symlink).

    ## Why is this bad?
    Nothing in such a file was audited. Reporting it keeps a scan honest: a folder of results in
    which some kernels were silently skipped would look cleaner than it is.

    ## Example
    ```python
    # a kernel file saved as UTF-16, or a compiled .so renamed to kernel.py
    ```
    """

    code = "KA003"
    name = "unreadable-file"
    level = Level.ERROR
    precision = Precision.VERY_HIGH
    tags = ("input",)
