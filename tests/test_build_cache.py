"""The persistent extension build cache: one folder per kernel text, used under a lock shared by
processes, its signed manifest on disk the record, bounded by removing the least recently used
folders; jobs compile with every core."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from kaudit.dynamic.builds import BuildCache, default_root


def _hold(root: str, marker: str, overlaps) -> None:
    """One process's job on kernel A: notes whether another held the folder at the same time."""
    with BuildCache(root).use("kernel A") as folder:
        busy = Path(folder, "busy")
        if busy.exists():
            overlaps.put(marker)
        busy.write_text(marker)
        time.sleep(0.4)
        busy.unlink()
        Path(folder, f"built-by-{marker}").write_text("x")


def test_processes_take_a_folder_one_at_a_time(tmp_path):
    context = multiprocessing.get_context("fork")
    overlaps = context.Queue()
    workers = [context.Process(target=_hold, args=(str(tmp_path), name, overlaps))
               for name in ("one", "two", "three")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert all(worker.exitcode == 0 for worker in workers)
    assert overlaps.empty(), "two processes used one build folder at once"
    folder = tmp_path / BuildCache.key("kernel A")
    assert sorted(p.name for p in folder.iterdir()) == [
        "built-by-one", "built-by-three", "built-by-two"], "each found the others' builds intact"


def test_a_build_another_process_recorded_is_kept(tmp_path):
    mine, theirs = BuildCache(str(tmp_path)), BuildCache(str(tmp_path))
    with mine.use("kernel A") as folder:
        Path(folder, "ext.so").write_bytes(b"built")
    with theirs.use("kernel A") as folder:
        Path(folder, "ext.so").write_bytes(b"built again, with a newer compiler")
    with mine.use("kernel A") as folder:
        assert Path(folder, "ext.so").read_bytes() == b"built again, with a newer compiler"
    assert mine.discarded == [] and theirs.discarded == []


def test_the_least_recently_used_folders_go_first(tmp_path):
    cache = BuildCache(str(tmp_path), max_bytes=2500)
    for age, text in enumerate(("kernel C", "kernel B", "kernel A")):
        with cache.use(text) as folder:
            Path(folder, "ext.so").write_bytes(b"x" * 1000)
        stamp = time.time() - 100 * (3 - age)  # C used longest ago, A most recently
        os.utime(tmp_path / f"{BuildCache.key(text)}.manifest", (stamp, stamp))
    with cache._file_lock(BuildCache.key("kernel C")):  # in use elsewhere: it stays
        assert cache.evict() == [BuildCache.key("kernel B")]
    assert cache.evict() == [], "within its bound"
    cache.max_bytes = 1500
    assert cache.evict() == [BuildCache.key("kernel C")]
    cache.close()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [BuildCache.key("kernel A")]


def test_the_default_is_the_user_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_root() == str(tmp_path / "kernel-builds")
    assert "audit" not in default_root().lower(), "jobs see this path: it names no auditor"
    pytest.importorskip("torch", reason="DynamicOptions' tolerance check")
    import kaudit

    assert kaudit.DynamicOptions().extensions_dir == str(tmp_path / "kernel-builds")


def test_jobs_compile_with_every_core(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    import kaudit.dynamic.kernels as kernels
    from kaudit.dynamic.options import DynamicOptions
    from tests.conftest import DYNAMIC_FIXTURES

    envs = []
    real = kernels.run_job

    def recording(job):
        envs.append((job.target, dict(job.env)))
        return real(job)

    monkeypatch.setattr(kernels, "run_job", recording)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    kernel = DYNAMIC_FIXTURES / "good_pytorch_linear" / "kernel.py"
    run = kernels.audit_kernel(str(kernel), "kernel.py", kernel.read_text(),
                               DynamicOptions(device="cpu", timeout=240,
                                              extensions_dir=str(tmp_path)), "cpu")
    assert run.status == "ok"
    candidate = [env for target, env in envs if target == kernels.CANDIDATE_TARGET]
    assert candidate and candidate[0]["MAX_JOBS"] == str(os.cpu_count())


BROKEN_BUILD_JOB = '''
import os

def build(args, out_dir):
    os.environ["CXX"] = args["compiler"]  # counts its compile steps, and fails them
    os.environ["COMPILER_KILLED"] = "1" if args.get("killed") else ""
    from torch.utils.cpp_extension import load_inline
    try:
        load_inline(name="broken", cpp_sources=args["source"], functions=["f"],
                    build_directory=args["folder"])
    except RuntimeError as exc:
        return str(exc)
    return "built"
'''


def test_a_failed_build_fails_again_in_the_next_job_without_compiling(tmp_path):
    """A kernel whose extension does not compile (and falls back) compiled again in each of its
    jobs: a minute of CPU each on the GPU host."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import sandbox
    from kaudit.dynamic.harness.failed_builds import FAILED
    from kaudit.dynamic.runner import Job, run_job

    jobs, compiles = tmp_path / "jobs.py", tmp_path / "compiles"
    jobs.write_text(BROKEN_BUILD_JOB)
    compiler = tmp_path / "cxx"
    compiler.write_text(
        f'#!/bin/sh\ncase " $* " in *" -c "*) echo x >> {compiles}\n'
        '  [ -n "$COMPILER_KILLED" ] && echo "Killed signal terminated program cc1plus" >&2\n'
        '  exit 1;; esac\n'
        'exec c++ "$@"\n')  # what torch asks besides compiling
    compiler.chmod(0o755)
    folder = tmp_path / "build"
    folder.mkdir()

    def attempt(source: str, killed: bool = False) -> str:
        job = Job(f"{jobs}:build", timeout=120, writable=[str(tmp_path)],
                  args={"compiler": str(compiler), "folder": str(folder), "source": source,
                        "killed": killed})
        with run_job(job) as result:
            assert result.ok, result.describe()
            return result.value

    def compiled() -> int:
        return len(compiles.read_text().split()) if compiles.exists() else 0

    sandbox.set_mode("off")
    try:
        # the machine stopped the compiler: not kept, the next job builds again
        assert "Killed" in attempt("int f();", killed=True) and compiled() == 1
        assert not (folder / FAILED).exists()
        first = attempt("int f();")
        assert first != "built" and compiled() == 2 and (folder / FAILED).is_file()
        assert attempt("int f();") == first and compiled() == 2, "the same build ran again"
        assert attempt("int f() { return 2; }") != "built" and compiled() == 3, \
            "another source is built"
    finally:
        sandbox.set_mode("auto")
