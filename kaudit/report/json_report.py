import json

from kaudit.api import Report
from kaudit.fix.report import attach_fixes


def render(report: Report) -> str:
    attach_fixes(report)  # a finding with a safe fix carries it: "fix": {description, edits}
    return json.dumps(report.to_dict(), indent=2) + "\n"
