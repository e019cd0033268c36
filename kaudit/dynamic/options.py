"""What the dynamic pass of `kaudit scan` is asked to do: plain data, importable without torch
(`kaudit.DynamicOptions`), so a static-only installation can still name it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from kaudit.dynamic.tolerance import Tolerance, resolve

#: calls on the candidate's plain model, drawn per kernel in this range (plus 4 poisoned runs)
CALLS = (24, 40)
INIT_SEED = 42
INPUT_SEEDS = (0, 1)
DEFAULT_SCALES = (1e-3, 1.0, 1e3)
SANDBOX_MODES = ("auto", "on", "off")
TIMING_MODES = ("auto", "on", "off", "kernelbench")
DEFAULT_SPEEDUP_TOLERANCE = 1.5
#: where each kernel's audit runs (`kaudit.dynamic.executors`)
EXECUTORS = ("local", "ray")
RAY_MISSING = "--executor ray needs Ray, which is not installed: pip install 'kaudit[ray]'"


@dataclass(frozen=True)
class TimingSettings:
    """How kernels are timed. `mode`: one of TIMING_MODES."""

    mode: str = "auto"
    warmup: int = 5
    min_trials: int = 30
    max_trials: int = 300
    #: seconds of timed calls per model that choose the trial count between the two bounds
    budget_s: float = 3.0
    speedup_tolerance: float = DEFAULT_SPEEDUP_TOLERANCE

    def __post_init__(self) -> None:
        if self.mode not in TIMING_MODES:
            raise ValueError(f"--timing must be one of {', '.join(TIMING_MODES)}, not {self.mode!r}")
        if not self.speedup_tolerance >= 1:
            raise ValueError("--speedup-tolerance must be 1 or more")

    def enabled(self, device: str) -> bool:
        return self.mode in ("on", "kernelbench") or (self.mode == "auto" and device == "cuda")



@dataclass(frozen=True)
class DynamicOptions:
    #: the correctness check audited: a `Tolerance`, a preset's name ("kernelbench", ...) or None
    #: for the default preset
    tolerance: Tolerance | str | None = None
    #: "auto", "cpu" or "cuda"
    device: str = "auto"
    problem: str | None = None
    problems_root: str | None = None
    timeout: float = 300.0
    init_seed: int = INIT_SEED
    seeds: tuple[int, int] = INPUT_SEEDS
    #: the cache of extension builds, one folder per kernel text (content-addressed, checked,
    #: shared by scans and processes; `builds.default_root()` unless given); None: a temporary
    #: one for this scan
    extensions_dir: str | None = field(default_factory=lambda: _default_build_cache())
    #: input scales of the scale-fragility probe (KD301); 1 is the default scale
    scales: tuple[float, ...] = DEFAULT_SCALES
    #: kernels audited at once (spread over the visible GPUs on CUDA)
    jobs: int = 1
    #: where pictures of unwritten / out-of-bounds output regions go (KD101, KD103); None: none
    artifacts_dir: str | None = None
    #: RLIMIT_AS of each job on CPU runs, in bytes; None: the default (`limits`); 0: none
    memory_limit: int | None = None
    #: bytes of temporary disk the scan's jobs may hold at once (`scratch.start_budget`); None:
    #: the default (80% of the free space), 0: no limit
    temp_limit: int | None = None
    #: the scan's secret: the keyed poisoning patterns and call schedules (a new one per scan)
    key: str = field(default_factory=lambda: secrets.token_hex(16))
    #: calls on the candidate's plain model: drawn per kernel in this range
    calls: tuple[int, int] = CALLS
    #: the OS sandbox of every job: "auto" (where it works), "on" (refuse without it) or "off"
    sandbox: str = "auto"
    #: verified speedups (`--timing`, `kaudit.dynamic.timing`)
    timing: TimingSettings = field(default_factory=TimingSettings)
    #: another benchmark's submission is judged by its benchmark's check (`ProblemSpec.tolerance`)
    #: unless the scan chose one
    benchmark_checks: bool = True
    #: the scan's policy (`kaudit.config.POLICIES`): KD601's level under the profiler
    policy: str = "kernelbench"
    #: where each kernel's audit runs: "local" (this machine, `jobs` at a time) or "ray" (one
    #: Ray task per kernel, on the cluster at `ray_address`; None: a new local cluster)
    executor: str = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tolerance, Tolerance):
            # a preset's name: raises ValueError for an unknown one
            object.__setattr__(self, "tolerance", resolve(self.tolerance, None, None))
        if self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox: {self.sandbox!r} is not one of {', '.join(SANDBOX_MODES)}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor: {self.executor!r} is not one of {', '.join(EXECUTORS)}")
        if self.jobs < 1 or self.timeout <= 0:
            raise ValueError("jobs must be at least 1 and timeout positive")

    def cache_key(self) -> str:
        """What changes a kernel's findings, for the dynamic result cache (the scan's secret
        `key` does not: a result judged under another secret is as valid)."""
        tolerance = self.tolerance
        assert isinstance(tolerance, Tolerance)
        return repr((tolerance, self.init_seed, tuple(self.seeds), tuple(self.scales),
                     self.timeout, self.memory_limit, tuple(self.calls), self.artifacts_dir,
                     self.timing, self.benchmark_checks, self.policy))


def ray_missing() -> str | None:
    """Why `--executor ray` cannot run here (Ray not installed), or None."""
    import importlib.util

    return RAY_MISSING if importlib.util.find_spec("ray") is None else None


def _default_build_cache() -> str:
    from kaudit.dynamic.builds import default_root

    return default_root()
