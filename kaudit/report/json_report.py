import json
from typing import Any

from kaudit.report.model import Report
from kaudit.fix.report import attach_fixes


def render(report: Report) -> str:
    """The report as JSON, one finding (error, verdict) per line: readable, and written by the
    C encoder, which `indent=` would bypass (a slow pure-Python encoder for large scans)."""
    attach_fixes(report)  # a finding with a safe fix carries it: "fix": {description, edits}
    return render_listing(report.to_dict())


def render_listing(data: dict[str, Any]) -> str:
    """A JSON object with its lists laid out one element per line and the rest indented."""
    fields = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            elements = ",\n".join(f"    {json.dumps(element)}" for element in value)
            fields.append(f"  {json.dumps(key)}: [\n{elements}\n  ]")
        else:
            shown = json.dumps(value, indent=2).replace("\n", "\n  ")
            fields.append(f"  {json.dumps(key)}: {shown}")
    return "{\n" + ",\n".join(fields) + "\n}\n"
