"""kaudit protecting itself from the code it runs (`scan --dynamic`, `kaudit problems`).

Before any job runs, `Installation.before_jobs()` imports every module of kaudit (renderers, rules,
the dynamic pass's own) so that nothing is read from disk after a kernel ran, makes the process
not dumpable (`sandbox.protect_parent`), and records the SHA-256 of every file of kaudit's
installation (the package, its rules, the `kaudit` command). `changed()` lists the files that
differ since: the CLI then refuses to report (exit 2), because a job that edited kaudit (possible
without the OS sandbox) could have made this report, and every later one, say anything.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import kaudit
from kaudit import rules
from kaudit.dynamic import sandbox


def installation_files() -> list[Path]:
    """kaudit's own files: the package (rules included) and its command."""
    roots = {Path(kaudit.__file__).resolve().parent, Path(rules.__file__).resolve().parent}
    files = {p for root in roots for p in root.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    command = shutil.which("kaudit", path=os.path.dirname(sys.executable))
    if command:
        files.add(Path(command))
    return sorted(files)


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def preload() -> None:
    """Import every module of kaudit now, so that none is first read after a job ran."""
    for package in (kaudit, rules):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + ".",
                                            onerror=lambda name: None):
            if module.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(module.name)
            except ImportError:
                continue  # an optional dependency (torch): that pass cannot run anyway


@dataclass
class Installation:
    digests: dict[Path, str] = field(default_factory=dict)

    @classmethod
    def before_jobs(cls) -> Installation:
        preload()
        sandbox.protect_parent()
        return cls({path: _digest(path) for path in installation_files()})

    def changed(self) -> list[str]:
        now = {path: _digest(path) for path in installation_files()}
        return sorted(str(p) for p in set(now) | set(self.digests)
                      if now.get(p) != self.digests.get(p))
