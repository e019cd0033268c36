"""Benchmark result trees: which kernel is which (run, level, problem, sample), what the run
claimed for it, and the reference it was generated for.

Layouts recognised:
- KernelBench runs: `runs/<run>/level_<L>_problem_<P>_sample_<S>_kernel.py` + `eval_results.json`
  (a dict keyed by problem id holding a record or a list of records, or a list of records with
  `task_id` "level_1_problem_1");
- `generated_kernels/level_<L>/problem_<P>.py` + `per_problem/level_<L>/problem_<P>.json`;
- a kernel next to its reference: `custom_code.py`/`ref_code.py`, `kernel.py`/`problem.py`;
- JSONL files with `custom_code` (and `ref_code`) strings, one task per line; findings point
  into `file.jsonl#L12/custom_code`;
- anything else: plain kernel files, without claims.
Unreadable or malformed claim files are reported and the kernels are still scanned.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kaudit.discover import WorkItem, display_path
from kaudit.findings import ScanError

_KERNELBENCH_NAME = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
_TASK_ID = re.compile(r"level_(\d+)_problem_(\d+)")
_REFERENCE_OF = {"custom_code.py": "ref_code.py", "kernel.py": "problem.py"}
MAX_CLAIM_FILE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Claim:
    """What a benchmark run said about one kernel (None: not recorded)."""

    compiled: bool | None = None
    correctness: bool | None = None
    trials: str | None = None
    runtime_ms: float | None = None
    hardware: str | None = None
    speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Submission:
    """Where a kernel sits in a results tree."""

    layout: str  # "kernelbench-run", "generated-kernels", "paired-folder", "jsonl", "plain"
    run: str | None = None
    level: int | None = None
    problem: int | None = None
    sample: int | None = None
    reference: str | None = None  # display path of the paired reference problem, if any
    claim: Claim = field(default_factory=Claim)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["claim"] = self.claim.to_dict()
        return data


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 and number == number else None  # -1 means "not measured"


def claim_from_record(record: Any) -> Claim:
    """A KernelBench-style record -> Claim; tolerant of missing keys and odd types."""
    if not isinstance(record, dict):
        return Claim()
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    stats = record.get("runtime_stats") if isinstance(record.get("runtime_stats"), dict) else {}
    result = record.get("eval_result") if isinstance(record.get("eval_result"), dict) else {}
    merged = {**stats, **metadata, **result, **record}
    trials = merged.get("correctness_trials")
    runtime = _float(merged.get("runtime"))
    if runtime is None:
        runtime = _float(stats.get("mean"))
    return Claim(
        compiled=_bool(merged.get("compiled")),
        correctness=_bool(merged.get("correctness")),
        trials=trials if isinstance(trials, str) else None,
        runtime_ms=runtime,
        hardware=str(merged["hardware"]) if merged.get("hardware") is not None else None,
        speedup=_float(merged.get("speedup")),
    )


@dataclass
class BaselineTimings:
    """`results/timing/<hw>/baseline_time_torch.json`: {"level1": {"1_Name.py": {"mean": ms}}}."""

    means: dict[tuple[int, int], float] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> BaselineTimings:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        timings = cls()
        for level_key, problems in (data.items() if isinstance(data, dict) else ()):
            level = re.search(r"\d+", str(level_key))
            if level is None or not isinstance(problems, dict):
                continue
            for name, stats in problems.items():
                problem = re.match(r"(\d+)_", str(name))
                mean = _float(stats.get("mean")) if isinstance(stats, dict) else _float(stats)
                if problem and mean:
                    timings.means[(int(level.group()), int(problem.group(1)))] = mean
        return timings

    def speedup(self, submission: Submission) -> float | None:
        if submission.claim.speedup is not None:
            return submission.claim.speedup
        runtime = submission.claim.runtime_ms
        base = self.means.get((submission.level or -1, submission.problem or -1))
        return base / runtime if base and runtime else None


class ResultTrees:
    """Attaches `Submission` metadata to discovered work items and expands JSONL files."""

    def __init__(self) -> None:
        self.errors: list[ScanError] = []
        self._eval_results: dict[str, dict[tuple[int | None, int, int | None], Claim]] = {}

    def annotate(self, items: list[WorkItem]) -> list[WorkItem]:
        annotated: list[WorkItem] = []
        for item in items:
            if item.file.endswith(".jsonl"):
                annotated.extend(self._jsonl_items(item))
            else:
                annotated.append(replace(item, submission=self._submission(item)))
        return annotated

    # --- per layout -----------------------------------------------------------------------

    def _submission(self, item: WorkItem) -> Submission:
        path = Path(item.file)
        match = _KERNELBENCH_NAME.search(path.name)
        if match:
            level, problem, sample = (int(g) for g in match.groups())
            claims = self._run_claims(path.parent)
            claim = claims.get((level, problem, sample)) or claims.get((None, problem, sample)) \
                or Claim()
            return Submission("kernelbench-run", path.parent.name, level, problem, sample,
                              claim=claim)
        if path.parent.parent.name == "generated_kernels":
            level_match = re.fullmatch(r"level_(\d+)", path.parent.name)
            problem_match = re.fullmatch(r"problem_(\d+)\.py", path.name)
            if level_match and problem_match:
                record_file = path.parent.parent.parent / "per_problem" / path.parent.name / \
                    (path.stem + ".json")
                record = self._read_json(record_file) if record_file.is_file() else None
                return Submission("generated-kernels", path.parent.parent.parent.name,
                                  int(level_match.group(1)), int(problem_match.group(1)),
                                  claim=claim_from_record(record))
        reference_name = _REFERENCE_OF.get(path.name)
        if reference_name and (path.parent / reference_name).is_file():
            return Submission("paired-folder", path.parent.parent.name, *_numbers(path.parent.name),
                              reference=display_path(str(path.parent / reference_name)))
        return Submission("plain")

    def _run_claims(self, run_dir: Path) -> dict[tuple[int | None, int, int | None], Claim]:
        key = str(run_dir)
        if key not in self._eval_results:
            self._eval_results[key] = {}
            results = run_dir / "eval_results.json"
            if results.is_file():
                self._eval_results[key] = _index_eval_results(self._read_json(results))
        return self._eval_results[key]

    def _jsonl_items(self, item: WorkItem) -> list[WorkItem]:
        items: list[WorkItem] = []
        try:
            with open(item.file, encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    items.extend(self._jsonl_line(item, number, line))
        except (OSError, UnicodeDecodeError) as exc:
            self.errors.append(ScanError(item.display, f"cannot read JSONL file: {exc}"))
        return items

    def _jsonl_line(self, item: WorkItem, number: int, line: str) -> list[WorkItem]:
        if not line.strip():
            return []
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            self.errors.append(ScanError(f"{item.display}#L{number}",
                                         f"not JSON: {exc.msg} (column {exc.colno})"))
            return []
        if not isinstance(record, dict) or not isinstance(record.get("custom_code"), str):
            return []
        level, problem = _task_numbers(record)
        sample = record.get("sample_id") if isinstance(record.get("sample_id"), int) else None
        submission = Submission(
            "jsonl", Path(item.file).stem, level, problem, sample,
            reference=f"{item.display}#L{number}/ref_code" if "ref_code" in record else None,
            claim=claim_from_record(record))
        return [WorkItem(item.file, f"{item.display}#L{number}/custom_code", explicit=False,
                         text=record["custom_code"], submission=submission)]

    def _read_json(self, path: Path) -> Any:
        try:
            if path.stat().st_size > MAX_CLAIM_FILE_BYTES:
                raise ValueError("over 256 MB")
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.errors.append(ScanError(display_path(str(path)), f"claims not read: {exc}"))
            return None


def _index_eval_results(data: Any) -> dict[tuple[int | None, int, int | None], Claim]:
    """All three shapes of eval_results.json -> {(level or None, problem, sample): Claim}."""
    index: dict[tuple[int | None, int, int | None], Claim] = {}
    if isinstance(data, list):
        for record in data:
            if isinstance(record, dict):
                level, problem = _task_numbers(record)
                sample = _int(record.get("sample_id", record.get("solution_id")))
                if problem is not None:
                    index[(level, problem, sample)] = claim_from_record(record)
    elif isinstance(data, dict):
        for problem_key, value in data.items():
            problem = _int(problem_key)
            if problem is None:
                continue
            records = value if isinstance(value, list) else [value]
            for position, record in enumerate(records):
                sample = _int(record.get("sample_id")) if isinstance(record, dict) else None
                index[(None, problem, position if sample is None else sample)] = \
                    claim_from_record(record)
    return index


def _task_numbers(record: dict[str, Any]) -> tuple[int | None, int | None]:
    match = _TASK_ID.search(str(record.get("task_id", "")))
    if match:
        return int(match.group(1)), int(match.group(2))
    return _int(record.get("level")), _int(record.get("problem_id"))


def _numbers(folder: str) -> tuple[int | None, int | None]:
    match = _TASK_ID.search(folder)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None

