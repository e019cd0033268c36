"""What the tests that run jobs and whole scans share: kaudit in its own process, and the
processes a job may have left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kaudit_environment(tmp: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment with this checkout first on PYTHONPATH (the tests may run from another
    folder), TMPDIR `tmp` when given, and `extra` on top."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    env.update(extra)
    return env


def run_kaudit(*args: str, cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m kaudit ARGS` in its own process, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "kaudit", *args], cwd=cwd,
                          env=env or kaudit_environment(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def processes_named(name: str) -> list[int]:
    """The pids of the processes whose name (`/proc/PID/comm`) is `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def processes_under(folder: Path) -> list[int]:
    """Processes but this one whose working folder or command line lies under `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            where = os.readlink(entry / "cwd")
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if where.startswith(str(folder)) or str(folder) in command:
            found.append(int(entry.name))
    return found


def wait_until(condition, seconds: float = 10.0) -> bool:
    """Whether `condition()` became true within `seconds` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
