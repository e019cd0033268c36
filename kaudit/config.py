"""Configuration: `[tool.kaudit]` in pyproject.toml merged with command-line options into one frozen
`Config`. Codes are matched by prefix: `KA1`, `KA1xx` and `KA101` all select KA101."""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from kaudit.adapters.model import BENCHMARKS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


#: what a submission may keep in PyTorch: `kernelbench` (some operators, when custom kernels do
#: real work; the rest is listed by KA108) or `strict` (nothing: every PyTorch op is an error)
POLICIES = ("kernelbench", "strict")


class ConfigError(ValueError):
    """A configuration value kaudit cannot use (reported as a usage error)."""


def normalise_pattern(pattern: str) -> str:
    """`ka2xx` -> `KA2`, `kd` -> `KD` (a whole family); validates the shape of a code or prefix."""
    text = pattern.strip().upper().rstrip("X")
    digits = text[2:]
    if len(text) < 2 or not text[:2].isalpha() or (digits and not digits.isdigit()) \
            or len(text) > 5:
        raise ConfigError(f"not a rule code or code prefix: {pattern!r}")
    return text


def code_matches(pattern: str, code: str) -> bool:
    return code.upper().startswith(normalise_pattern(pattern))


@dataclass(frozen=True)
class Config:
    """What to check and how. Input problems (KA0xx) are reported unless explicitly ignored."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    #: (glob relative to `root`, codes) pairs
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    jobs: int = 1
    root: str = field(default_factory=os.getcwd)
    #: a claimed speedup above this, not confirmed by a dynamic run, makes a kernel suspicious
    suspicious_speedup: float = 10.0
    #: `baseline_time_torch.json` of the benchmark, to turn claimed runtimes into speedups
    baseline_timings: str | None = None
    #: findings accepted earlier (`kaudit baseline write`); only new ones gate
    baseline: str | None = None
    #: where per-file results are cached by content; None disables the cache
    cache_dir: str | None = None
    #: the benchmark whose layout to read (`kaudit.adapters.model.BENCHMARKS`); None: recognise
    #: each layout from its files
    benchmark: str | None = None
    #: one of POLICIES
    policy: str = "kernelbench"

    def __post_init__(self) -> None:
        for pattern in (*self.select, *self.ignore,
                        *(code for _, codes in self.per_file_ignores for code in codes)):
            normalise_pattern(pattern)
        if self.jobs < 1:
            raise ConfigError("jobs must be at least 1")
        if self.benchmark is not None and self.benchmark not in BENCHMARKS:
            raise ConfigError(f"unknown benchmark {self.benchmark!r}; choose one of "
                              f"{', '.join(BENCHMARKS)}")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")

    def is_enabled(self, code: str) -> bool:
        if any(code_matches(p, code) for p in self.ignore):
            return False
        return not self.select or code.startswith("KA0") or \
            any(code_matches(p, code) for p in self.select)

    def is_ignored_for(self, path: str, code: str) -> bool:
        relative = _relative_posix(path, self.root)
        return any(
            fnmatch.fnmatch(relative, glob) and any(code_matches(c, code) for c in codes)
            for glob, codes in self.per_file_ignores)

    def with_options(self, *, select: list[str] | None = None, ignore: list[str] | None = None,
                     **options: object) -> Config:
        """Command-line options: `--select` replaces the file's list, `--ignore` extends it, and
        any other option given (not None) replaces the file's value."""
        return replace(
            self,
            select=tuple(select) if select else self.select,
            ignore=self.ignore + tuple(ignore or ()),
            **{name: value for name, value in options.items() if value is not None},
        )

    def cache_key(self) -> str:
        """The options that change what a scan of one file reports."""
        return repr((self.select, self.ignore, self.per_file_ignores, self.root, self.policy))


def _relative_posix(path: str, root: str) -> str:
    absolute = os.path.abspath(path)
    try:
        return Path(os.path.relpath(absolute, root)).as_posix()
    except ValueError:
        return Path(absolute).as_posix()


def find_pyproject(start: Path) -> Path | None:
    for directory in (start.resolve(), *start.resolve().parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(start: Path | None = None) -> Config:
    """The `[tool.kaudit]` table of the nearest pyproject.toml at or above `start` (default cwd)."""
    pyproject = find_pyproject(start or Path.cwd())
    if pyproject is None:
        return Config()
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: {exc}") from exc
    table = data.get("tool", {}).get("kaudit", {})
    known = {"select", "ignore", "per-file-ignores", "jobs", "suspicious-speedup", "benchmark",
             "policy"}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.kaudit] keys: {', '.join(sorted(unknown))}")
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{pyproject}: per-file-ignores must be a table of glob = [codes]")
    return Config(
        select=_codes(table.get("select", []), pyproject),
        ignore=_codes(table.get("ignore", []), pyproject),
        per_file_ignores=tuple((glob, _codes(codes, pyproject)) for glob, codes in per_file.items()),
        jobs=int(table.get("jobs", 1)),
        suspicious_speedup=float(table.get("suspicious-speedup", 10.0)),
        benchmark=_benchmark(table.get("benchmark"), pyproject),
        policy=str(table.get("policy", "kernelbench")),
        root=str(pyproject.parent),
    )


def _codes(value: object, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: expected a list of rule codes, got {value!r}")
    return tuple(value)


def _benchmark(value: object, source: Path) -> str | None:
    if value is not None and value not in BENCHMARKS:
        raise ConfigError(f"{source}: benchmark must be one of {', '.join(BENCHMARKS)}, "
                          f"got {value!r}")
    return value  # type: ignore[return-value]
