"""kaudit protecting itself from the code it runs (`scan --dynamic`, `kaudit problems`).

Before any job runs, `Installation.before_jobs()` imports every module of kaudit (renderers, rules,
the dynamic pass's own) so that nothing is read from disk after a kernel ran, makes the process
not dumpable (`sandbox.protect_parent`), and records the SHA-256 of every file of kaudit's
installation (the package, its rules, the `kaudit` command). `changed()` lists the files that
differ since: the CLI then refuses to report (exit 2), because a job that edited kaudit (possible
without the OS sandbox) could have made this report, and every later one, say anything.
`jobs_guarded` wraps a pass's jobs in both, raising `InstallationChanged` (the API's form of that
refusal) after the last job.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import pkgutil
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kaudit
from kaudit import rules
from kaudit.dynamic import runner, sandbox, scratch


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


class InstallationChanged(RuntimeError):
    """kaudit's own installed files changed while jobs ran: a job may have edited them, so
    nothing this process says any more can be trusted."""

    def __init__(self, changed: list[str]) -> None:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        super().__init__(f"refusing to report: kaudit's own installed code changed during the "
                         f"dynamic pass ({shown}); a job may have edited it. Reinstall kaudit "
                         "and scan again with --sandbox on")
        self.changed = changed


def ready_jobs(mode: str) -> None:
    """Before kaudit starts a job: the sandbox mode (`on` where it cannot be built raises
    SandboxError), stale temporary folders of killed runs removed, the fork server started
    (in the background: it runs nothing until a job comes). A job started now must not run
    benchmark code before `Installation.before_jobs()` returned (`runner.Job.gated`)."""
    sandbox.set_mode(mode)
    sandbox.active()
    scratch.remove_stale()
    runner.start_fork_server()


def prepare_jobs(mode: str) -> Installation:
    """Before kaudit runs benchmark code: `ready_jobs`, then kaudit's code imported and
    fingerprinted (for `InstallationChanged`)."""
    ready_jobs(mode)
    return Installation.before_jobs()


@contextlib.contextmanager
def jobs_guarded(mode: str) -> Iterator[None]:
    installation = prepare_jobs(mode)
    yield
    changed = installation.changed()
    if changed:
        raise InstallationChanged(changed)
