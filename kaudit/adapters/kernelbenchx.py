"""KernelBenchX (BonnieW05/KernelBenchX): Triton kernels that export `def <task stem>` or
`def kernel_function`, judged by running the task's test below a separator line of 146 `#`.

Layouts recognised:
- the iteration corpus, `data/kbx_corpus/*.jsonl`: records with `task_id` ("Fusion/gelu.py"),
  `before_code`/`after_code` and `before`/`after` {call_ok, exe_ok, runtime_ms, speedup, ...}:
  the kernel audited is `after_code`, the claims are `after`'s, with `before`'s and the round
  transition kept beside them; findings point into `file.jsonl#L12/after_code`;
- predictions, JSONL records `{"predict": code, "file": "Fusion/gelu.py"}` (no claims);
- the harness's output `metrics.json`: {file: {call_ok, exe_ok, runtime_ms, speedup, code}};
- a `.py` file holding the separator line (a submission with its test appended), or any `.py`
  under `--benchmark kernelbenchx`; files under `data/kernelbenchx/<Category>/` are the
  benchmark's own problems, not submissions.
Only the part above the separator is the submission: the test below it is the benchmark's.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from pathlib import Path
from typing import Any

from kaudit.adapters.common import (
    Problems,
    find_upwards,
    first_record,
    flag,
    jsonl_records,
    number,
    record_item,
)
from kaudit.adapters.model import INPUTS_TEST, Candidate, Code, ProblemSpec, backend_of
from kaudit.discover import WorkItem, display_path
from kaudit.entry import EntryPoint
from kaudit.results import Claim, Submission

NAME = "kernelbenchx"
SEPARATOR = "#" * 146
#: the harness's alternative to `def <task stem>`
KERNEL_FUNCTION = "kernel_function"
_FENCE = re.compile(r"^\s*```")
_TASK_FOLDER = os.path.join("data", "kernelbenchx")


def adapt(items: list[WorkItem], documents: list[str], forced: bool
          ) -> tuple[list[WorkItem], list[WorkItem], list]:
    adapter = _Adapter()
    taken, left = [], []
    for item in items:
        found = adapter.item(item, forced)
        if found is None:
            left.append(item)
        else:
            taken.extend(found)
    for document in documents:
        if os.path.basename(document) == "metrics.json":
            taken.extend(adapter.metrics(WorkItem(document, display_path(document), False)))
    return taken, left, adapter.problems.errors


def problem_spec(task_file: str) -> tuple[ProblemSpec, EntryPoint] | None:
    """The problem of a task file of a checkout (`data/kernelbenchx/<Category>/<stem>.py`) and
    the entry points its test calls, for `kaudit problems`; None for another file."""
    adapter = _Adapter()
    if not adapter._is_task_file(task_file):
        return None
    parts = Path(os.path.abspath(task_file)).parts
    spec = adapter.spec(task_file, f"{parts[-2]}/{parts[-1]}", None)
    return spec, entry_for(parts[-1], test_part(_read(task_file)))


def submission_part(text: str) -> str:
    """The submission without the test the harness appends: the lines above the separator
    (kept in place, so line numbers stay those of the file)."""
    head, found, _ = text.partition(SEPARATOR)
    return head if found else text


def test_part(text: str) -> str | None:
    _, found, tail = text.partition(SEPARATOR)
    return tail if found else None


def entry_for(task: str, test: str | None = None) -> EntryPoint:
    """The harness's contract is a top-level callable named like the task or `kernel_function`
    (a function, or a class: `class Adam`); its test may call the kernel by another name
    (`Optimizer/Lion.py` calls `lion_step`), which is then the entry point."""
    names = [Path(task).stem, *_called_by(test), KERNEL_FUNCTION]
    return EntryPoint("callable", tuple(dict.fromkeys(names)))


def _called_by(test: str | None) -> list[str]:
    """The names a test calls but neither defines nor imports: the submission's functions."""
    if not test:
        return []
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return []
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id not in bound]


def without_fences(text: str) -> str:
    """Markdown fence lines blanked (the harness strips them), keeping line numbers."""
    return "\n".join("" if _FENCE.match(line) else line for line in text.split("\n"))


class _Adapter:
    def __init__(self) -> None:
        self.problems = Problems()
        self._roots: dict[str, Path | None] = {}
        self._thresholds: dict[Path, dict[str, dict[str, float]]] = {}

    def item(self, item: WorkItem, forced: bool) -> list[WorkItem] | None:
        if item.text is not None:
            return None
        if item.file.endswith(".jsonl"):
            record = first_record(item.file) or {}
            if "after_code" in record and "task_id" in record:
                return self.corpus(item)
            if "predict" in record:
                return self.predictions(item)
            return None
        if os.path.basename(item.file) == "metrics.json":
            return self.metrics(item)
        if not item.file.endswith(".py") or self._is_task_file(item.file):
            return None
        try:
            text = Path(item.file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        if not forced and SEPARATOR not in text:
            return None
        task = os.path.basename(item.file)
        spec = self.spec(item.file, task, None)
        submission = Submission("kernelbenchx-file", Path(item.file).parent.name, task=task,
                                benchmark=NAME, candidate=self.candidate(item.display, item.file,
                                                                          text, task, spec),
                                spec=spec, reference=spec.reference.path if spec.reference else None)
        text = submission_part(text)
        return [WorkItem(item.file, item.display, item.explicit, text=text,
                         submission=submission, identity=item.identity)]

    # --- layouts --------------------------------------------------------------------------

    def corpus(self, item: WorkItem) -> list[WorkItem]:
        items = []
        for line, record in jsonl_records(item.file, self.problems):
            where = f"{item.display}#L{line}"
            code, task = record.get("after_code"), record.get("task_id")
            if not isinstance(task, str) or not isinstance(code, str):
                self.problems.add(where, "expected a record with \"task_id\" (a string) and "
                                  f"\"after_code\" (the kernel's source), got task_id "
                                  f"{_kind(task)} and after_code {_kind(code)}")
                continue
            claim = self.claim(where, record.get("after"), "after")
            previous = self.claim(where, record.get("before"), "before")
            transition = record.get("transition")
            claim = Claim(**{**_fields(claim), "previous": previous,
                             "round": transition if isinstance(transition, str) else None})
            spec = self.spec(item.file, task, test_part(code))
            submission = Submission(
                "kernelbenchx-corpus", Path(item.file).stem, task=task, benchmark=NAME,
                claim=claim, candidate=self.candidate(f"{where}/after_code", item.file, code, task,
                                         spec),
                spec=spec, reference=spec.reference.path if spec.reference else None)
            items.append(record_item(item.file, item.identity, line, "after_code",
                                     submission_part(code), submission))
        return items

    def predictions(self, item: WorkItem) -> list[WorkItem]:
        items = []
        for line, record in jsonl_records(item.file, self.problems):
            where = f"{item.display}#L{line}"
            code, task = record.get("predict"), record.get("file")
            if not isinstance(code, str) or not isinstance(task, str):
                self.problems.add(where, "expected \"predict\" (the kernel's source) and \"file\" "
                                  f"(the task, e.g. \"Fusion/gelu.py\"), got predict {_kind(code)} "
                                  f"and file {_kind(task)}")
                continue
            code = without_fences(code)
            spec = self.spec(item.file, task, None)
            submission = Submission(
                "kernelbenchx-predictions", Path(item.file).stem, task=task, benchmark=NAME,
                candidate=self.candidate(f"{where}/predict", item.file, code, task, spec),
                spec=spec,
                reference=spec.reference.path if spec.reference else None)
            items.append(record_item(item.file, item.identity, line, "predict",
                                     submission_part(code), submission))
        return items

    def metrics(self, item: WorkItem) -> list[WorkItem]:
        located = self.problems.read_json(item.file, located=True)
        if located is None:
            return []
        data = located.value
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            self.problems.add(item.file, "expected {\"<task file>\": {\"call_ok\", \"exe_ok\", "
                              "\"speedup\", \"code\", ...}} (KernelBenchX's metrics.json)")
            return []
        items = []
        for key, record in data.items():
            code = record.get("code")
            if not isinstance(code, str) or not code.strip():
                continue  # a task the harness could not run: nothing to audit
            line = located.line(key, "code")
            task = record.get("file") if isinstance(record.get("file"), str) else key
            where = f"{item.display}#L{line}"
            spec = self.spec(item.file, task, None)
            submission = Submission(
                "kernelbenchx-metrics", Path(item.file).parent.name, task=task, benchmark=NAME,
                claim=self.claim(where, record, task),
                candidate=self.candidate(f"{where}/code", item.file, code, task, spec),
                spec=spec,
                reference=spec.reference.path if spec.reference else None)
            items.append(record_item(item.file, item.identity, line, "code",
                                     submission_part(code), submission))
        return items

    # --- pieces ---------------------------------------------------------------------------

    def claim(self, where: str, record: Any, name: str) -> Claim:
        if record is None:
            return Claim()
        if not isinstance(record, dict):
            self.problems.add(where, f"claims not read: {name}: expected an object")
            return Claim()
        wrong = [key for key in ("call_ok", "exe_ok", "perf_ok")
                 if record.get(key) is not None and flag(record[key]) is None]
        wrong += [key for key in ("runtime_ms", "speedup")
                  if record.get(key) not in (None, "N/A") and number(record[key]) is None]
        if wrong:
            self.problems.add(where, f"claims not read: {name}: "
                              + ", ".join(f"{k} is {record[k]!r}" for k in wrong))
        return Claim(compiled=flag(record.get("call_ok")), correctness=flag(record.get("exe_ok")),
                     runtime_ms=number(record.get("runtime_ms")),
                     speedup=number(record.get("speedup")))

    def candidate(self, path: str, file: str, text: str, task: str, spec: ProblemSpec
                  ) -> Candidate:
        test = spec.inputs_code.text if spec.inputs_code and spec.inputs_code.text is not None \
            else test_part(_read(spec.inputs_code.file)) if spec.inputs_code else None
        return Candidate(Code(path, file), entry_for(task, test or test_part(text)),
                         backend_of(submission_part(text)))

    def spec(self, near: str, task: str, record_test: str | None) -> ProblemSpec:
        """The task's problem in the KernelBenchX checkout above `near`, when there is one;
        else the test the record carries (the corpus's tasks are not all published)."""
        root = self._root(near)
        stem = Path(task).stem
        reference = timing = None
        thresholds: dict[str, float] = {}
        if root is not None:
            problem = root / _TASK_FOLDER / task
            if not problem.is_file() and "/" not in task:
                # a file per task is named by its stem; the harness finds its category
                problem = next(iter(sorted((root / _TASK_FOLDER).glob(f"*/{task}"))), problem)
            if problem.is_file():
                reference = Code(display_path(str(problem)), str(problem))
            perf = root / "metrics" / "golden_metrics" / f"{stem}_perf.py"
            if perf.is_file():
                timing = Code(display_path(str(perf)), str(perf))
            thresholds = self._task_thresholds(root).get(task, {})
        inputs = reference
        if inputs is None and record_test is not None:
            inputs = Code(f"{near}#test", near, record_test)
        return ProblemSpec(
            NAME, task, reference=reference, reference_kind="function", reference_name=stem,
            inputs=INPUTS_TEST, inputs_code=inputs, inputs_name=None, timing=timing,
            tolerance="kernelbenchx", thresholds=thresholds)

    def _root(self, near: str) -> Path | None:
        folder = os.path.dirname(os.path.abspath(near))
        if folder not in self._roots:
            found = find_upwards(folder, _TASK_FOLDER)
            self._roots[folder] = found.parent.parent if found else None
        return self._roots[folder]

    def _task_thresholds(self, root: Path) -> dict[str, dict[str, float]]:
        """`precision_thresholds` of `data/kernelbenchx_v1.json`, by task file."""
        if root not in self._thresholds:
            table: dict[str, dict[str, float]] = {}
            index = root / "data" / "kernelbenchx_v1.json"
            data = self.problems.read_json(index) if index.is_file() else None
            for entry in data if isinstance(data, list) else ():
                if isinstance(entry, dict) and isinstance(entry.get("precision_thresholds"), dict) \
                        and isinstance(entry.get("file"), str):
                    table[entry["file"]] = {k: v for k, v in entry["precision_thresholds"].items()
                                            if number(v) is not None}
            self._thresholds[root] = table
        return self._thresholds[root]

    def _is_task_file(self, path: str) -> bool:
        """A problem of the benchmark itself: `data/kernelbenchx/<Category>/<stem>.py`."""
        parts = Path(os.path.abspath(path)).parts
        return len(parts) >= 4 and parts[-3] == "kernelbenchx" and parts[-4] == "data"


def _fields(claim: Claim) -> dict[str, Any]:
    return {name: getattr(claim, name) for name in claim.__dataclass_fields__}


def _kind(value: Any) -> str:
    return "missing" if value is None else type(value).__name__


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
