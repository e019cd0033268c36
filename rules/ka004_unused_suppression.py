from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kaudit.findings import Finding, Level, Precision
from kaudit.fix.edits import Edit, Fix, NoFix
from kaudit.rule import Rule
from kaudit.suppressions import parse_suppressions

if TYPE_CHECKING:
    from kaudit.fix.editor import Editor

_MARKER_BEFORE = re.compile(r"(#|//)[ \t]*$")


class UnusedSuppression(Rule):
    """A `kaudit: ignore[...]` comment that suppresses nothing.

    ## What it does
    Reports an inline suppression (`# kaudit: ignore[KA101]` in Python, `// kaudit: ignore[KA2xx]`
    inside C++/CUDA sources) on a line where no enabled rule reported the codes it names, and the
    codes of a suppression's list that matched nothing while others did. The suppression pass
    (`kaudit/suppressions.py`) emits it after all other rules have run.

    ## Why is this bad?
    Stale suppressions hide future findings on that line and tell reviewers something was waived
    that no longer exists. Remove them, or fix the code list.

    ## Example
    ```python
    out = self.ext.matmul_cuda(a, b)  # kaudit: ignore[KA101]
    ```

    ## Fix
    `kaudit fix` removes the suppression: the whole comment when nothing else is in it (a comment
    that follows on the line is kept), only `kaudit: ignore[...]` when the comment goes on with an
    explanation, or only the unused codes of its list.
    """

    code = "KA004"
    name = "unused-suppression"
    level = Level.NOTE
    precision = Precision.VERY_HIGH
    tags = ("input", "suppression")

    def fix(self, editor: Editor, finding: Finding) -> Fix | None:
        start, end = editor.location_span(finding.location)
        line_start, line_end, next_line = editor.line_bounds(start)
        line = editor.text[line_start:line_end]
        suppression = next((s for s in parse_suppressions(finding.path, [line])
                            if s.location.column - 1 == start - line_start), None)
        if suppression is None:
            raise NoFix("the suppression is no longer where it was reported")
        unused = finding.metrics.get("unused_codes") or []
        kept = [code for code in suppression.codes if code not in unused]
        if unused and kept:
            return Fix(f"remove {', '.join(unused)} from the suppression",
                       (Edit(start, end, f"kaudit: ignore[{', '.join(kept)}]"),))
        before, after = editor.text[line_start:start], editor.text[end:line_end]
        rest = after.lstrip(" \t")
        marker = _MARKER_BEFORE.search(before)
        if marker is None or rest and not rest.startswith(("#", "//")):
            # `# kaudit: ignore[KA101] kept on purpose`: the explanation stays a comment
            edit = Edit(start, end + len(after) - len(rest))
        elif rest:  # another comment follows: `code  # kaudit: ignore[KA101]  # note`
            edit = Edit(line_start + marker.start(), end + len(after) - len(rest))
        elif not before[:marker.start()].strip():  # a line holding only the suppression
            edit = Edit(line_start, next_line)
        else:
            code_end = len(before[:marker.start()].rstrip())
            edit = Edit(line_start + code_end, line_end)
        return Fix("remove the unused suppression", (edit,))
