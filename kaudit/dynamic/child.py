"""The child side of `kaudit.dynamic.runner`: `python -m kaudit.dynamic.child SPEC.json`, or `main`
called in a child forked by `kaudit.dynamic.forkserver` (torch already imported).

The spec names a job (`package.module:function`, or `/path/to/file.py:function`), its JSON
arguments, a seed, an output folder and where to write the result. The child applies its resource
limits first, seeds the random generators, calls `function(args, out_dir)` and writes
`{"ok": true, "value": ...}`, or `{"ok": false, "phase", "type", "message", "traceback", "oom"}`
when the job raised. It leaves with `os._exit`, so a job's atexit hooks or stray non-daemon threads
cannot keep it alive.

Jobs mark what they are doing with `with phase("init"):`; an error reports the innermost phase.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import importlib.util
import json
import os
import random
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

_phases: list[str] = ["job"]

OOM_TYPES = ("OutOfMemoryError", "MemoryError")
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory",
                "unable to allocate")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Name the step a job is in; an exception escaping it is reported with this name."""
    _phases.append(name)
    try:
        yield
    except BaseException as exc:
        if not hasattr(exc, "kaudit_phase"):
            with contextlib.suppress(Exception):
                exc.kaudit_phase = name  # type: ignore[attr-defined]
        raise
    finally:
        _phases.pop()


def current_phase() -> str:
    return _phases[-1]


def is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return type(exc).__name__ in OOM_TYPES or any(m in text for m in OOM_MESSAGES)


def write_json(path: str, data: Any) -> None:
    """Write atomically: readers see the old file or the whole new one."""
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(data, handle, allow_nan=True)
    os.replace(temporary, path)


def _apply_limits(spec: dict) -> None:
    """RLIMIT_AS / RLIMIT_CPU before any job code runs, on this process only (a `preexec_fn`
    would do the same between fork and exec, but is unsafe in a parent that has threads, as a
    parent holding torch's thread pool does; a forked child sets them after the fork)."""
    import resource

    if spec.get("memory_limit"):
        limit = int(spec["memory_limit"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if spec.get("cpu_limit"):
        seconds = max(1, int(spec["cpu_limit"]))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))


def _seed(seed: int) -> None:
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(seed % 2**32)
    with contextlib.suppress(ImportError):
        import torch

        torch.manual_seed(seed)


def import_file(name: str, path: str, error: type[Exception] = ImportError) -> Any:
    """Import the Python file at `path` as module `name` (problems, kernels, job files); `error`
    is raised when it is not loadable as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise error(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(target: str) -> Callable[[dict, str], Any]:
    where, _, function = target.rpartition(":")
    if not where or not function:
        raise ValueError(f"job target must be 'module:function' or 'file.py:function': {target!r}")
    module = import_file("kaudit_job", where) if where.endswith(".py") \
        else importlib.import_module(where)
    return getattr(module, function)


def main(argv: list[str]) -> None:
    with open(argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    result_path = spec["result"]
    code = 0
    try:
        _apply_limits(spec)
        faulthandler.enable()  # a segfault prints the Python stack to the captured stderr
        with phase("job-import"):
            function = _resolve(spec["target"])
        with phase("seed"):
            _seed(int(spec.get("seed", 0)))
        value = function(spec.get("args", {}), spec["out_dir"])
        result: dict[str, Any] = {"ok": True, "value": value}
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a result
        code = 1
        result = {"ok": False, "phase": getattr(exc, "kaudit_phase", current_phase()),
                  "type": type(exc).__name__, "message": str(exc)[:4000],
                  "traceback": "".join(traceback.format_exception(exc))[-8000:],
                  "oom": is_oom(exc)}
    try:
        write_json(result_path, result)
    except Exception as exc:  # noqa: BLE001 - the value was not JSON: say so, in JSON
        write_json(result_path, {"ok": False, "phase": "result", "type": type(exc).__name__,
                                 "message": f"job result is not JSON: {exc}", "traceback": "",
                                 "oom": False})
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    # run the copy importable as kaudit.dynamic.child, the one jobs import `phase` from
    from kaudit.dynamic import child as _child

    _child.main(sys.argv)
