"""An extension build that failed in one job of a kernel fails again at once in the next.

Every job of a kernel (candidate, plain run, timing, profile) imports it, and a `load_inline`
whose compile fails (a kernel that then falls back to PyTorch, or raises) compiled again in each:
on the H200, 55-70 s of CPU a job, four times over, for 12 of the first 40 CUDA-L1 kernels. The
first failure is written into the build folder (`FAILED`: a digest of what was built and the
compiler's message), and a later build of the same inputs in that folder raises the same error
without compiling, so every job of the kernel takes the same path. A failure that names the
machine (the compiler killed, the disk or memory full) is not kept. The kernel may delete or forge
that file: it can only make its own builds slower or fail, which it can do anyway.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any, ContextManager

FAILED = ".failed-build.json"
#: a failure that says the machine, not the code, stopped the compiler is not kept: the next
#: job (or scan, with a persistent build cache) builds again
_TRANSIENT = re.compile(r"killed|signal|no space left|out of memory|cannot allocate memory|"
                        r"internal compiler error|resource temporarily unavailable",
                        re.IGNORECASE)
#: the sources of ninja's compile steps (`build main.o: compile /folder/main.cpp`)
_COMPILED = re.compile(r"^build [^:\n]+: \w*compile (\S+)", re.MULTILINE)
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".h", ".hpp", ".cuh")


def _digest(folder: str) -> str:
    """What a build in `folder` is made of: its build.ninja (flags, paths), the sources it
    compiles and the sources beside it."""
    with open(os.path.join(folder, "build.ninja"), "rb") as handle:
        ninja = handle.read()
    digest = hashlib.sha256(ninja)
    beside = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                    if name.endswith(_SOURCE_SUFFIXES))
    for path in [*_COMPILED.findall(ninja.decode(errors="replace")), *beside]:
        digest.update(path.encode())
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()


def _known_failure(folder: str, digest: str) -> str | None:
    try:
        with open(os.path.join(folder, FAILED), encoding="utf-8") as handle:
            known = json.load(handle)
        return str(known["message"]) if known.get("digest") == digest else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def remember_failed_builds(timed: Callable[[str], ContextManager[Any]]) -> None:
    """Make torch's JIT extension builds remember their failures (see the module's docstring),
    each build timed as `timed("build")`.
    Called after the fork, in the jobs that have a build folder (`build_dir`: a kernel's), since
    importing the module costs every job a tenth of a second: the fork server must not import it
    (on the H200 with torch 2.11, importing it there left every forked job unable to use CUDA). A
    job started in a fresh interpreter, where torch is not imported yet, compiles as before."""
    if "torch" not in sys.modules:
        return
    import torch.utils.cpp_extension as cpp_extension

    build = cpp_extension._run_ninja_build

    @functools.wraps(build)
    def run_ninja_build(build_directory: str, *args: Any, **kwargs: Any) -> Any:
        try:
            digest = _digest(build_directory)
        except OSError:
            with timed("build"):
                return build(build_directory, *args, **kwargs)
        message = _known_failure(build_directory, digest)
        if message is not None:
            raise RuntimeError(message)
        try:
            with timed("build"):
                return build(build_directory, *args, **kwargs)
        except RuntimeError as exc:
            if not _TRANSIENT.search(str(exc)):
                with contextlib.suppress(OSError), \
                        open(os.path.join(build_directory, FAILED), "w",
                             encoding="utf-8") as handle:
                    json.dump({"digest": digest, "message": str(exc)[-20000:]}, handle)
            raise

    cpp_extension._run_ninja_build = run_ninja_build
