import json

from kaudit.api import Report


def render(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"
