"""`--stream FILE`: one JSON object per line, written and flushed the moment a kernel (or a
problem) ends, so that a scan that is killed still leaves every result it reached. A write that
fails (a full disk) stops the stream, said once as a warning; the scan goes on."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class JsonLines:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.lock = threading.Lock()
        self.warnings: list[str] = []

    def write(self, record: dict[str, Any]) -> None:
        with self.lock:
            if self.handle is None:
                return
            try:
                self.handle.write(json.dumps(record, default=str) + "\n")
                self.handle.flush()
            except OSError as exc:
                self.warnings.append(f"--stream {self.path}: {exc.strerror or exc}; "
                                     "no further lines written")
                self._close()

    def close(self) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.handle is not None:
            try:
                self.handle.close()
            except OSError:
                pass
            self.handle = None
