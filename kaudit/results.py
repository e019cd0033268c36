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
Claims that cannot be used are never dropped in silence: an unreadable file, an unknown shape, a
value of the wrong type, a JSONL record whose `custom_code` is not a string and a run folder with
claims but no kernels each become a `ScanError` naming the file and what was expected. The
kernels are still scanned.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kaudit.adapters.model import Candidate, ProblemSpec
from kaudit.discover import WorkItem, display_path
from kaudit.entry import MODEL_NEW, EntryPoint
from kaudit.findings import ScanError

_KERNELBENCH_NAME = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
_TASK_ID = re.compile(r"level_(\d+)_problem_(\d+)")
_REFERENCE_OF = {"custom_code.py": "ref_code.py", "kernel.py": "problem.py"}
MAX_CLAIM_FILE_BYTES = 256 * 1024 * 1024
#: how many unusable records one error message quotes
_QUOTED = 3
#: the fields a record must hold at least one of to count as a claim
CLAIM_FIELDS = ("compiled", "correctness", "correctness_trials", "runtime", "speedup", "status")
#: a record's `status` (`per_problem/` records: "static_failed", "evaluation_error", ...) saying
#: that the run's own harness failed the kernel
_FAILED_STATUS = re.compile(r"fail|error", re.IGNORECASE)
EVAL_RESULTS_SHAPES = ('{"<problem id>": record or [records]} or [records with "task_id" '
                       '"level_<L>_problem_<P>" or "level" and "problem_id"]')

ClaimIndex = dict[tuple[int | None, int, int | None], "Claim"]


@dataclass(frozen=True)
class Claim:
    """What a benchmark run said about one kernel (None: not recorded)."""

    compiled: bool | None = None
    correctness: bool | None = None
    trials: str | None = None
    runtime_ms: float | None = None
    hardware: str | None = None
    speedup: float | None = None
    #: the harness's word for the record, when it has one ("evaluated", "static_failed", ...)
    status: str | None = None
    #: named speedups besides `speedup` (CUDA-L1's score_default, score_cuda_graph, ...)
    scores: dict[str, float] = field(default_factory=dict)
    #: per-size records (FastKernels' bench.json scenarios, Atrex-Bench's shapes)
    cases: tuple[dict[str, Any], ...] = ()
    #: the step of an iterative run the claim is about ("round_0_to_round_1"), and what the
    #: run claimed for the step before (KernelBenchX's `before`)
    round: str | None = None
    previous: Claim | None = None

    @property
    def failed_status(self) -> bool:
        return self.status is not None and bool(_FAILED_STATUS.search(self.status))

    @property
    def said(self) -> str:
        """What the run said, in a word or two: not compiled, incorrect, a failed status,
        correct, or "-" for nothing."""
        if self.compiled is False:
            return "not compiled"
        if self.correctness is False:
            return "incorrect"
        if self.failed_status:
            return str(self.status)
        return "correct" if self.correctness else "-"

    @property
    def incorrect(self) -> bool:
        """The run itself says the kernel did not compile, is not correct, or failed it."""
        return self.compiled is False or self.correctness is False or self.failed_status

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def extras(self) -> dict[str, Any]:
        """What a benchmark other than KernelBench claimed besides the common fields; only the
        fields it set, so KernelBench reports keep their shape."""
        data: dict[str, Any] = {}
        if self.scores:
            data["scores"] = dict(self.scores)
        if self.cases:
            data["cases"] = [dict(case) for case in self.cases]
        if self.round is not None:
            data["round"] = self.round
        if self.previous is not None:
            previous = self.previous
            data["previous"] = {"compiled": previous.compiled,
                                "correctness": previous.correctness,
                                "runtime_ms": previous.runtime_ms, "speedup": previous.speedup}
        return data


@dataclass(frozen=True)
class Submission:
    """Where a kernel sits in a results tree."""

    #: "kernelbench-run", "generated-kernels", "paired-folder", "jsonl", "plain", or another
    #: benchmark's ("kernelbenchx-corpus", "fastkernels-set", "atrex-eval", "cuda-l1-json", ...)
    layout: str
    run: str | None = None
    level: int | None = None
    problem: int | None = None
    sample: int | None = None
    reference: str | None = None  # display path of the paired reference problem, if any
    claim: Claim = field(default_factory=Claim)
    #: the benchmark whose layout this is (`kaudit.adapters.model.BENCHMARKS`)
    benchmark: str = "kernelbench"
    #: the benchmark's own name for the task, when it is not a level/problem pair
    task: str | None = None
    #: what the benchmark calls, and the problem it judges against (for the dynamic pass)
    candidate: Candidate | None = None
    spec: ProblemSpec | None = None

    @property
    def entry(self) -> EntryPoint:
        return self.candidate.entry if self.candidate else MODEL_NEW

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in
                ("layout", "run", "level", "problem", "sample", "reference", "benchmark", "task")}
        data["claim"] = self.claim.to_dict()
        data["candidate"] = self.candidate.to_dict() if self.candidate else None
        data["spec"] = self.spec.to_dict() if self.spec else None
        return data


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    number = _number(value)
    # -1 means "not measured"; NaN is no number
    return number if number is not None and number >= 0 and number == number else None


def _layers(record: dict[str, Any]) -> dict[str, Any]:
    """One flat view of a record: its `runtime_stats`, `metadata` and `eval_result` (with that
    one's own `runtime_stats` and `metadata`, as `per_problem/` records nest them), the record's
    own keys winning."""
    def sub(holder: dict[str, Any], key: str) -> dict[str, Any]:
        value = holder.get(key)
        return value if isinstance(value, dict) else {}

    result = sub(record, "eval_result")
    return {**sub(record, "runtime_stats"), **sub(result, "runtime_stats"),
            **sub(record, "metadata"), **sub(result, "metadata"), **result, **record}


def read_claim(record: Any) -> tuple[Claim, list[str]]:
    """A KernelBench-style record -> (Claim, what is wrong with it). A value of the wrong type is
    read as not recorded and named in the second part."""
    if not isinstance(record, dict):
        return Claim(), [f"expected a record (a JSON object), got {_kind(record)}"]
    merged = _layers(record)
    problems = []
    if not any(merged.get(name) is not None for name in CLAIM_FIELDS):
        problems.append(f"no claim in it (expected one of {', '.join(CLAIM_FIELDS)})")
    for name in ("compiled", "correctness"):
        if merged.get(name) is not None and _bool(merged[name]) is None:
            problems.append(f"{name}: expected true or false, got {_quote(merged[name])}")
    for name in ("runtime", "speedup"):
        if merged.get(name) is not None and _number(merged[name]) is None:
            problems.append(f"{name}: expected a number, got {_quote(merged[name])}")
    trials = merged.get("correctness_trials")
    if trials is not None and not isinstance(trials, str):
        problems.append('correctness_trials: expected a string like "(5 / 5)", '
                        f"got {_quote(trials)}")
    status = record.get("status")
    if status is not None and not isinstance(status, str):
        problems.append(f"status: expected a string, got {_quote(status)}")
    runtime = _float(merged.get("runtime"))
    if runtime is None:
        runtime = _float(merged.get("mean"))
    claim = Claim(
        compiled=_bool(merged.get("compiled")),
        correctness=_bool(merged.get("correctness")),
        trials=trials if isinstance(trials, str) else None,
        runtime_ms=runtime,
        hardware=str(merged["hardware"]) if merged.get("hardware") is not None else None,
        speedup=_float(merged.get("speedup")),
        status=status if isinstance(status, str) else None,
    )
    return claim, problems


def claim_from_record(record: Any) -> Claim:
    """A KernelBench-style record -> Claim; tolerant of missing keys and odd types."""
    return read_claim(record)[0]


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


#: an explicitly named JSONL file no adapter took and without a KernelBench record
NO_KERNEL_RECORD = ("no kernel in this JSONL file: no line holds a `custom_code` string "
                    "(KernelBench), and it is no other benchmark's results file that kaudit "
                    "reads (KernelBenchX, CUDA-L1, Atrex, FastKernels; `--benchmark` forces one)")


class ResultTrees:
    """Attaches `Submission` metadata to discovered work items and expands JSONL files."""

    def __init__(self) -> None:
        self.errors: list[ScanError] = []
        self._eval_results: dict[str, ClaimIndex] = {}

    def annotate(self, items: list[WorkItem], claims: list[str] = ()) -> list[WorkItem]:
        """`claims`: the claim files and folders the walk met (`Discovery.claims`); those of a
        run without kernels are reported."""
        annotated: list[WorkItem] = []
        for item in items:
            if item.file.endswith(".jsonl"):
                annotated.extend(self._jsonl_items(item))
            else:
                annotated.append(replace(item, submission=self._submission(item)))
        self._check_runs_have_kernels(claims, annotated)
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
                claim = Claim()
                if record_file.is_file():
                    claim, problems = read_claim(self._read_json(record_file))
                    self._report(record_file, problems)
                return Submission("generated-kernels", path.parent.parent.parent.name,
                                  int(level_match.group(1)), int(problem_match.group(1)),
                                  claim=claim)
        reference_name = _REFERENCE_OF.get(path.name)
        if reference_name and (path.parent / reference_name).is_file():
            return Submission("paired-folder", path.parent.parent.name, *_numbers(path.parent.name),
                              reference=display_path(str(path.parent / reference_name)))
        return Submission("plain")

    def _run_claims(self, run_dir: Path) -> ClaimIndex:
        key = str(run_dir)
        if key not in self._eval_results:
            self._eval_results[key] = {}
            results = run_dir / "eval_results.json"
            if results.is_file():
                data = self._read_json(results)
                if data is not None:
                    index, problems = index_eval_results(data)
                    self._report(results, problems)
                    self._eval_results[key] = index
        return self._eval_results[key]

    def _check_runs_have_kernels(self, claims: list[str], items: list[WorkItem]) -> None:
        runs_with_kernels = set()
        for item in items:
            layout = item.submission.layout if item.submission else None
            if layout == "kernelbench-run":
                runs_with_kernels.add(os.path.abspath(os.path.dirname(item.file)))
            elif layout == "generated-kernels":
                runs_with_kernels.add(os.path.abspath(str(Path(item.file).parents[2])))
        for claim in claims:
            run = os.path.abspath(os.path.dirname(claim))
            if run in runs_with_kernels:
                continue
            if os.path.basename(claim) == "per_problem":
                records = sum(1 for _ in Path(claim).glob("level_*/problem_*.json"))
                if records:
                    self.errors.append(ScanError(display_path(claim), (
                        f"{records} per-problem claims but no kernels: expected "
                        "generated_kernels/level_<L>/problem_<P>.py next to per_problem/")))
            elif self._run_claims(Path(run)):
                self.errors.append(ScanError(display_path(claim), (
                    f"{len(self._run_claims(Path(run)))} claims but no kernels next to it: "
                    "expected level_<L>_problem_<P>_sample_<S>_kernel.py files")))

    def _jsonl_items(self, item: WorkItem) -> list[WorkItem]:
        items: list[WorkItem] = []
        errors = len(self.errors)
        try:
            with open(item.file, encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    items.extend(self._jsonl_line(item, number, line))
        except (OSError, UnicodeDecodeError) as exc:
            self.errors.append(ScanError(item.display, f"cannot read JSONL file: {exc}"))
        if item.explicit and not items and len(self.errors) == errors:
            # named on the command line, it must not pass as audited with nothing found
            self.errors.append(ScanError(item.display, NO_KERNEL_RECORD))
        return items

    def _jsonl_line(self, item: WorkItem, number: int, line: str) -> list[WorkItem]:
        if not line.strip():
            return []
        where = f"{item.display}#L{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            self.errors.append(ScanError(where, f"not JSON: {exc.msg} (column {exc.colno})"))
            return []
        if not isinstance(record, dict) or "custom_code" not in record:
            return []  # not a kernel record (a results log, say)
        if not isinstance(record["custom_code"], str):
            self.errors.append(ScanError(where, "custom_code: expected a string holding the "
                                         f"kernel's source, got {_kind(record['custom_code'])}"))
            return []
        claim, problems = read_claim(record)
        problems = [p for p in problems if not p.startswith("no claim")]  # a kernel alone is fine
        if problems:
            self.errors.append(ScanError(where, "claims not read: " + "; ".join(problems)))
        level, problem = _task_numbers(record)
        sample = record.get("sample_id") if isinstance(record.get("sample_id"), int) else None
        submission = Submission(
            "jsonl", Path(item.file).stem, level, problem, sample,
            reference=f"{where}/ref_code" if "ref_code" in record else None, claim=claim)
        return [WorkItem(item.file, f"{where}/custom_code", explicit=False,
                         text=record["custom_code"], submission=submission,
                         identity=f"{item.key}#L{number}")]

    def _read_json(self, path: Path) -> Any:
        try:
            if path.stat().st_size > MAX_CLAIM_FILE_BYTES:
                raise ValueError("over 256 MB")
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.errors.append(ScanError(display_path(str(path)), f"claims not read: {exc}"))
            return None

    def _report(self, path: Path, problems: list[str]) -> None:
        if problems:
            self.errors.append(ScanError(display_path(str(path)), _summarise(problems)))


def index_eval_results(data: Any) -> tuple[ClaimIndex, list[str]]:
    """All three shapes of eval_results.json -> ({(level or None, problem, sample): Claim},
    what could not be used, each naming the record)."""
    index: ClaimIndex = {}
    problems: list[str] = []
    if isinstance(data, list):
        for position, record in enumerate(data):
            level, problem = _task_numbers(record) if isinstance(record, dict) else (None, None)
            if problem is None:
                problems.append(f"record {position}: expected a record with \"task_id\" "
                                f"\"level_<L>_problem_<P>\" or \"problem_id\", got {_kind(record)}")
                continue
            sample = _int(record.get("sample_id", record.get("solution_id")))
            claim, wrong = read_claim(record)
            problems += [f"problem {problem} sample {sample}: {p}" for p in wrong]
            index[(level, problem, sample)] = claim
    elif isinstance(data, dict):
        unknown = [key for key in data if _int(key) is None]
        if unknown:
            problems.append(f"unknown shape: keys {', '.join(map(_quote, unknown[:_QUOTED]))}"
                            f"{' ...' if len(unknown) > _QUOTED else ''} are not problem ids; "
                            f"expected {EVAL_RESULTS_SHAPES}")
        for problem_key, value in data.items():
            problem = _int(problem_key)
            if problem is None:
                continue
            records = value if isinstance(value, list) else [value]
            for position, record in enumerate(records):
                sample = _int(record.get("sample_id")) if isinstance(record, dict) else None
                sample = position if sample is None else sample
                claim, wrong = read_claim(record)
                problems += [f"problem {problem} sample {sample}: {p}" for p in wrong]
                index[(None, problem, sample)] = claim
    else:
        problems.append(f"unknown shape: got {_kind(data)}; expected {EVAL_RESULTS_SHAPES}")
    return index, problems


def _summarise(problems: list[str]) -> str:
    quoted = "; ".join(problems[:_QUOTED])
    more = len(problems) - _QUOTED
    return f"claims not read: {quoted}" + (f"; and {more} more" if more > 0 else "")


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _quote(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
