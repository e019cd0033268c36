"""Dynamic results cached by content, so that a re-run of an unchanged tree, or of a scan that
was killed, audits only the kernels it has no result for.

A result is keyed by the SHA-256 of: the kernel's text and display path, its reference problem's
text, the options that change findings (`DynamicOptions.cache_key`), kaudit's own code
(`kaudit.cache.code_fingerprint`), the torch and Triton versions and the device's model. Each is
stored the moment its kernel ends (one committed row), signed like the static cache's entries
(`kaudit.cache.sign`, the installation key, which jobs cannot read): a row written or changed by
anything else does not verify and the kernel runs again. An audit that did not complete (KD504),
and a job that timed out or ran out of memory (which a busy machine, or a neighbour on the GPU,
can cause), are not stored: they are worth retrying."""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.metadata
import json
import os
import platform
import sqlite3
import threading
from pathlib import Path

from kaudit.cache import code_fingerprint, sign
from kaudit.dynamic.kernels import KernelRun
from kaudit.dynamic.options import DynamicOptions
from kaudit.findings import Finding

_SCHEMA = ("CREATE TABLE IF NOT EXISTS signed_dynamic_results (key TEXT PRIMARY KEY, "
           "value TEXT NOT NULL, mac TEXT NOT NULL)")
DATABASE = "dynamic.sqlite"
#: statuses not stored: the audit did not complete
NOT_STORED = ("incomplete",)
#: job outcomes (a finding's `status` metric) not stored: they may say more about the machine
#: than about the kernel
TRANSIENT = ("timeout", "oom")


class DynamicCache:
    """Thread-safe (the kernels of a `-j N` scan end in worker threads). A database error ends
    its use for this scan and is said once in `warning`; the scan goes on without it."""

    def __init__(self, directory: str, options: DynamicOptions, device: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.db: sqlite3.Connection | None = sqlite3.connect(
            os.path.join(directory, DATABASE), check_same_thread=False, timeout=60)
        self.db.execute(_SCHEMA)
        self.db.commit()
        self.lock = threading.Lock()
        self.salt = "\0".join((code_fingerprint(), options.cache_key(), *environment(device)))
        self.warning: str | None = None
        #: rows found for a kernel but not signed with this installation's key
        self.unsigned = 0

    def key(self, display: str, kernel: str, problem: str | None) -> str:
        digest = hashlib.sha256(self.salt.encode("utf-8", "surrogatepass"))
        for part in (display, kernel, problem if problem is not None else "\0none"):
            digest.update(b"\0" + part.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def get(self, key: str) -> KernelRun | None:
        row = self._execute("SELECT value, mac FROM signed_dynamic_results WHERE key = ?", (key,))
        if not row:
            return None
        if not hmac.compare_digest(row[1], sign("dynamic", key, row[0])):
            # not written by this installation's kaudit: run again, and replaced. Most often
            # the key itself is new (a home folder that did not survive, as in a container)
            with self.lock:
                self.unsigned += 1
                self.warning = self.warning or unsigned_warning
            return None
        data = json.loads(row[0])
        return KernelRun(data["path"], data["problem"], data["status"],
                         [Finding.from_dict(f) for f in data["findings"]], data["metrics"],
                         cached=True)

    def put(self, key: str, run: KernelRun) -> None:
        if run.status in NOT_STORED or any(f.metrics.get("status") in TRANSIENT
                                           for f in run.findings):
            return
        value = json.dumps({"path": run.path, "problem": run.problem, "status": run.status,
                            "findings": [f.to_dict() for f in run.findings],
                            "metrics": run.metrics}, default=str)
        self._execute("INSERT OR REPLACE INTO signed_dynamic_results VALUES (?, ?, ?)",
                      (key, value, sign("dynamic", key, value)), commit=True)

    def close(self) -> None:
        with self.lock:
            if self.db is not None:
                try:
                    self.db.close()
                except sqlite3.Error:
                    pass
                self.db = None

    def _execute(self, sql: str, parameters: tuple, commit: bool = False) -> tuple | None:
        with self.lock:
            if self.db is None:
                return None
            try:
                row = self.db.execute(sql, parameters).fetchone()
                if commit:
                    self.db.commit()
                return row
            except sqlite3.Error as exc:
                self.warning = f"dynamic result cache failed ({type(exc).__name__}: {exc}); " \
                    "going on without it"
                try:
                    self.db.close()
                except sqlite3.Error:
                    pass
                self.db = None
                return None


#: said once when a kernel's stored result does not verify
unsigned_warning = (
    "dynamic result cache: results stored for kernels of this scan were not signed with this "
    "installation's key, so they were audited again; that key lives in "
    "$XDG_CONFIG_HOME/kaudit (~/.config/kaudit): keep that folder (in a container, a mounted "
    "one) for a later scan to resume")


@functools.cache
def environment(device: str) -> tuple[str, ...]:
    """What besides the kernel changes its dynamic result: torch's and Triton's versions and
    the device's model, read without starting CUDA in this process (the driver's /proc files)."""
    return (_version("torch"), _version("triton"), device, *device_models(device))


def _version(package: str) -> str:
    try:
        return f"{package} {importlib.metadata.version(package)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{package} none"


def device_models(device: str) -> list[str]:
    if device == "cuda":
        models = []
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            try:
                for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
                    if line.startswith("Model:"):
                        models.append(line.partition(":")[2].strip())
            except OSError:
                continue
        return [os.environ.get("CUDA_VISIBLE_DEVICES", "all"), *models] or ["cuda unknown"]
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return [platform.machine(), line.partition(":")[2].strip()]
    except OSError:
        pass
    return [platform.machine()]
