"""`kaudit fix --add-suppressions` (as ruff's `--add-noqa`): a `kaudit: ignore[CODE]` comment on
each finding's line, merged into a suppression already there, so that a tree can adopt kaudit
with its current findings waived in place and only new ones reported."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from kaudit.config import Config
from kaudit.engine import check_model
from kaudit.findings import Finding
from kaudit.fix.edits import Edit, apply_edits
from kaudit.fix.engine import Refusal, cpp_errors
from kaudit.source import SourceModel
from kaudit.suppressions import parse_suppressions


@dataclass
class SuppressResult:
    text: str
    #: the findings now suppressed
    suppressed: list[Finding] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


def add_suppressions(path: str, text: str, config: Config, wanted: Callable[[Finding], bool]
                     ) -> SuppressResult:
    """`text` (the file `path`) with a suppression for each `wanted` finding on its line: `#` in
    Python, `//` where the line ends inside the C++/CUDA source of an extension."""
    result = SuppressResult(text)
    model = SourceModel(path, text, policy=config.policy)
    if model.problem is not None:
        return result
    findings = [f for f in check_model(model, config).findings
                if f.path == path and not f.rule.startswith("KA0") and wanted(f)]
    by_line: dict[int, list[Finding]] = {}
    for finding in findings:
        by_line.setdefault(finding.line, []).append(finding)
    existing = {}
    for suppression in parse_suppressions(path, model.lines):
        if suppression.codes:
            existing.setdefault(suppression.location.line, suppression)
    cuda_offsets = {offset for unit in model.cuda_units if unit.offsets for offset in unit.offsets}
    strings = _multiline_strings(model)
    edits = []
    for line, on_line in sorted(by_line.items()):
        codes = list(dict.fromkeys(f.rule for f in on_line))
        start = model.index.starts[line - 1]
        suppression = existing.get(line)
        if suppression is not None:
            merged = [*suppression.codes, *(c for c in codes if c not in suppression.codes)]
            where = suppression.location
            edits.append(Edit(start + where.column - 1,
                              start + where.end_column - 1,  # type: ignore[operator]
                              f"kaudit: ignore[{', '.join(merged)}]"))
            result.suppressed.extend(on_line)
            continue
        content = model.lines[line - 1].rstrip()
        if content.endswith("\\"):
            result.refused.extend(Refusal(f, "the line ends with a line continuation")
                                  for f in on_line)
            continue
        line_end = start + len(model.lines[line - 1])
        marker = "#"
        if any(a <= line_end < b for a, b in strings):
            if line_end not in cuda_offsets:
                result.refused.extend(Refusal(f, "the line ends inside a string that is not "
                                                 "C++/CUDA code") for f in on_line)
                continue
            marker = "//"
        edits.append(Edit(start + len(content), start + len(content),
                          f"  {marker} kaudit: ignore[{', '.join(codes)}]"))
        result.suppressed.extend(on_line)
    if not edits:
        return result
    changed = apply_edits(text, edits)
    after = SourceModel(path, changed, policy=config.policy)
    if after.problem is not None or cpp_errors(after) > cpp_errors(model):
        reason = "the file would no longer parse with the comments added"
        return SuppressResult(text, [], [Refusal(f, reason) for f in findings])
    result.text = changed
    return result


def _multiline_strings(model: SourceModel) -> list[tuple[int, int]]:
    spans = []
    for node in model.nodes:
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.lineno != node.end_lineno \
                and not (isinstance(node, ast.Constant) and not isinstance(node.value, str)):
            end = model.index.offset(node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
            spans.append((model.index.offset(node.lineno, node.col_offset), end))
    return spans
