"""JSON values with the line each one starts on, so that a finding in a kernel held as a string
inside a JSON document (`optimized_cuda_code/a100.json`, `metrics.json`) points at its line.

The structure is walked here; every scalar is decoded by the standard library's own scanner
(`json.JSONDecoder.raw_decode`), so strings and numbers mean exactly what `json.loads` says.
"""

from __future__ import annotations

import bisect
import json
from typing import Any

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"
#: deeper documents are refused rather than risking the interpreter's recursion limit
MAX_DEPTH = 200


class Located:
    """A parsed document and `line(*keys)`: the 1-based line where the value at that key path
    (object keys and list indices) starts."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self._lines: dict[tuple, int] = {}
        self._text = text
        position, self.value = self._value(self._skip(0), (), 0)
        if self._skip(position) != len(text):
            raise ValueError(f"extra data at line {self._line_at(self._skip(position))}")

    def line(self, *path: Any) -> int:
        return self._lines.get(tuple(path), 1)

    def _line_at(self, position: int) -> int:
        return bisect.bisect_right(self._starts, position)

    def _skip(self, position: int) -> int:
        text = self._text
        while position < len(text) and text[position] in _WHITESPACE:
            position += 1
        return position

    def _value(self, position: int, path: tuple, depth: int) -> tuple[int, Any]:
        if depth > MAX_DEPTH:
            raise ValueError("nested too deeply")
        self._lines[path] = self._line_at(position)
        opener = self._text[position:position + 1]
        if opener == "{":
            return self._object(position + 1, path, depth)
        if opener == "[":
            return self._array(position + 1, path, depth)
        try:
            value, end = _DECODER.raw_decode(self._text, position)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
        return end, value

    def _object(self, position: int, path: tuple, depth: int) -> tuple[int, dict]:
        result: dict[str, Any] = {}
        position = self._skip(position)
        if self._text[position:position + 1] == "}":
            return position + 1, result
        while True:
            position = self._skip(position)
            end, key = self._value(position, (*path, "\0key"), depth + 1)
            if not isinstance(key, str):
                raise ValueError(f"expected a string key at line {self._line_at(position)}")
            position = self._expect(self._skip(end), ":")
            position, result[key] = self._value(self._skip(position), (*path, key), depth + 1)
            position = self._skip(position)
            if self._text[position:position + 1] == "}":
                self._lines.pop((*path, "\0key"), None)
                return position + 1, result
            position = self._expect(position, ",")

    def _array(self, position: int, path: tuple, depth: int) -> tuple[int, list]:
        result: list[Any] = []
        position = self._skip(position)
        if self._text[position:position + 1] == "]":
            return position + 1, result
        while True:
            position, item = self._value(self._skip(position), (*path, len(result)), depth + 1)
            result.append(item)
            position = self._skip(position)
            if self._text[position:position + 1] == "]":
                return position + 1, result
            position = self._expect(position, ",")

    def _expect(self, position: int, char: str) -> int:
        if self._text[position:position + 1] != char:
            raise ValueError(f"expected {char!r} at line {self._line_at(position)}")
        return position + 1
