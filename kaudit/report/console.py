"""The one way kaudit makes a rich Console: user-supplied text (paths, messages, source lines,
run names) is printed as it is. rich would otherwise turn `path:100:` into an emoji and colour
numbers; markup comes only from kaudit's own strings, with user text passed through `escape`."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def make_console(**options: Any) -> Console:
    return Console(emoji=False, highlight=False, **options)
