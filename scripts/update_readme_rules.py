#!/usr/bin/env python3
"""Rewrite the rules table in README.md from the rule registry (`kaudit rules --format markdown`).

    python scripts/update_readme_rules.py

tests/test_docs_and_framework.py fails while the README's table differs from the registry.
"""

import re
import sys
from pathlib import Path

from kaudit.report.markdown import rules_table
from kaudit.rule import all_rules

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"(<!-- rules-table:[^\n]*-->\n)(.*?)(<!-- end rules-table -->)", re.S)


def main() -> int:
    text = README.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        print(f"{README}: no `<!-- rules-table: ... -->` block", file=sys.stderr)
        return 1
    updated = BLOCK.sub(lambda m: m.group(1) + rules_table(all_rules()) + m.group(3), text)
    if updated != text:
        README.write_text(updated, encoding="utf-8")
        print(f"{README}: rules table updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
