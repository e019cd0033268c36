"""The persistent extension build cache: one folder per kernel text, used under a lock shared by
processes, its signed manifest on disk the record, bounded by removing the least recently used
folders; jobs compile with every core."""

from __future__ import annotations

import json
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


def test_a_relative_cache_folder_is_handed_to_jobs_as_an_absolute_one(tmp_path, monkeypatch):
    """Jobs run in folders of their own: `--build-cache .kwork/builds` reached them as a
    relative path, so on the H200 every job of a kernel compiled it again (40-90 s each) into a
    new folder, and the cache stayed empty."""
    monkeypatch.chdir(tmp_path)
    with BuildCache("relative/builds").use("kernel A") as folder:
        assert os.path.isabs(folder)
        assert Path(folder).parent == tmp_path / "relative" / "builds"


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


class BrokenBuilds:
    """Jobs that build one `load_inline` extension in one folder with a compiler that counts its
    compile steps and fails them (`attempt`), the job runner's sandbox off."""

    def __init__(self, tmp_path: Path) -> None:
        self.root, self.folder = tmp_path, tmp_path / "build"
        self.jobs, self.compiles = tmp_path / "jobs.py", tmp_path / "compiles"
        self.jobs.write_text(BROKEN_BUILD_JOB)
        self.compiler = tmp_path / "cxx"
        self.compiler.write_text(
            f'#!/bin/sh\ncase " $* " in *" -c "*) echo x >> {self.compiles}\n'
            '  [ -n "$COMPILER_KILLED" ] && echo "Killed signal terminated program cc1plus" >&2\n'
            '  exit 1;; esac\n'
            'exec c++ "$@"\n')  # what torch asks besides compiling
        self.compiler.chmod(0o755)
        self.folder.mkdir()

    def attempt(self, source: str, killed: bool = False) -> str:
        from kaudit.dynamic.runner import Job, run_job

        job = Job(f"{self.jobs}:build", timeout=120, writable=[str(self.root)],
                  args={"compiler": str(self.compiler), "folder": str(self.folder),
                        "build_dir": str(self.folder), "source": source, "killed": killed})
        with run_job(job) as result:
            assert result.ok, result.describe()
            self.phases = result.phases
            return result.value

    def compiled(self) -> int:
        return len(self.compiles.read_text().split()) if self.compiles.exists() else 0


@pytest.fixture
def broken_builds(tmp_path):
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import sandbox

    sandbox.set_mode("off")
    try:
        yield BrokenBuilds(tmp_path)
    finally:
        sandbox.set_mode("auto")


def test_a_failed_build_fails_again_in_the_next_job_without_compiling(broken_builds):
    """A kernel whose extension does not compile (and falls back) compiled again in each of its
    jobs: a minute of CPU each on the GPU host."""
    from kaudit.dynamic.harness.failed_builds import FAILED

    attempt, compiled, folder = broken_builds.attempt, broken_builds.compiled, broken_builds.folder
    # the machine stopped the compiler: not kept, the next job builds again
    assert "Killed" in attempt("int f();", killed=True) and compiled() == 1
    assert not (folder / FAILED).exists()
    first = attempt("int f();")
    assert first != "built" and compiled() == 2 and (folder / FAILED).is_file()
    assert broken_builds.phases["build"] > 0, "the job says how long its builds took"
    assert attempt("int f();") == first and compiled() == 2, "the same build ran again"
    assert "build" not in broken_builds.phases
    assert attempt("int f() { return 2; }") != "built" and compiled() == 3, \
        "another source is built"


def test_a_forged_failure_record_only_costs_a_build(broken_builds):
    """The kernel can write its build folder: a record it forges (not JSON, or for other inputs)
    is ignored and the build runs, and the record is replaced by the real failure."""
    from kaudit.dynamic.harness.failed_builds import FAILED

    record = broken_builds.folder / FAILED
    record.write_text("{not json")
    first = broken_builds.attempt("int f();")
    assert first != "built" and broken_builds.compiled() == 1
    assert json.loads(record.read_text())["message"] in first
    record.write_text(json.dumps({"digest": "0" * 64, "message": "FORGED RECORD"}))
    assert "FORGED RECORD" not in broken_builds.attempt("int f();") and broken_builds.compiled() == 2
