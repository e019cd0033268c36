"""What a fix is: text edits in one file, by character offset. Plain data, no parsing here, so rule
modules can import it without slowing the scan (libcst is imported by `kaudit.fix.editor` only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kaudit.source import LineIndex


class NoFix(Exception):
    """A rule's fix cannot be made here; the message says why (shown by `kaudit fix`)."""


@dataclass(frozen=True, order=True)
class Edit:
    """Replace `text[start:end]` (character offsets) by `replacement`; `start == end` inserts."""

    start: int
    end: int
    replacement: str = ""

    def overlaps(self, other: Edit) -> bool:
        """Two edits touch the same text, or insert at the same place: applying both is
        ambiguous."""
        if self.start == self.end == other.start == other.end:
            return True
        return self.start < other.end and other.start < self.end or \
            self.start == self.end and other.start < self.start < other.end or \
            other.start == other.end and self.start < other.start < self.end


@dataclass(frozen=True)
class Fix:
    """The edits that make one finding go away; `description` says what they do, for people."""

    description: str
    edits: tuple[Edit, ...]

    def overlaps(self, other: Fix) -> bool:
        return any(a.overlaps(b) for a in self.edits for b in other.edits)

    def to_dict(self, path: str, index: LineIndex) -> dict[str, Any]:
        """JSON form: 1-based lines and columns, end column exclusive, as in findings."""
        edits = []
        for edit in sorted(self.edits):
            line, column = index.position(edit.start)
            end_line, end_column = index.position(edit.end)
            edits.append({"path": path, "line": line, "column": column, "end_line": end_line,
                          "end_column": end_column, "text": edit.replacement})
        return {"description": self.description, "edits": edits}


def apply_edits(text: str, edits: list[Edit] | tuple[Edit, ...]) -> str:
    """`text` with every edit applied; raises ValueError when two of them overlap."""
    ordered = sorted(edits)
    for before, after in zip(ordered, ordered[1:]):
        if before.overlaps(after):
            raise ValueError(f"overlapping edits at offsets {before.start} and {after.start}")
    pieces = []
    position = 0
    for edit in ordered:
        pieces.append(text[position:edit.start])
        pieces.append(edit.replacement)
        position = edit.end
    pieces.append(text[position:])
    return "".join(pieces)
