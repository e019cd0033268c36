"""CUDA-L1 (deepreinforce-ai/CUDA-L1 and its forks): KernelBench `ModelNew` kernels released as
one file per GPU, `optimized_cuda_code/<gpu>.json`, in one of two shapes:

- an object of levels, `{"1": [{"task_id", "ref_code", "custom_code"}, ...], ...}`;
- JSONL, one record a line: `{"level_id", "task_id", "ref_code", "custom_code",
  "score_default", "score_torch_compile_default", ..., "cuda_graph_code", "cudnn_code"}`.

Each record is a candidate (`custom_code`) with its reference (`ref_code`, KernelBench's
`Model`/`get_inputs`); `score_default` (reference time / candidate time) is the claimed speedup,
every `score_*` is kept. The GPU is the file's name. Findings point at the record's line:
`a100.json#L1234/custom_code`. The release is GPL-3.0: kaudit reads it from where it lies.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from kaudit.adapters.common import Problems, first_record, jsonl_records, number, record_item
from kaudit.adapters.model import INPUTS_GET_INPUTS, Candidate, Code, ProblemSpec, backend_of
from kaudit.discover import WorkItem, display_path
from kaudit.entry import MODEL_NEW
from kaudit.results import Claim, Submission

NAME = "cuda-l1"
SCORE_PREFIX = "score_"
#: the score that compares with KernelBench's eager PyTorch reference
HEADLINE_SCORE = "score_default"
_LEVELS_OBJECT = re.compile(rb'^\s*\{\s*"\d+"\s*:\s*\[')


def adapt(items: list[WorkItem], documents: list[str], forced: bool
          ) -> tuple[list[WorkItem], list[WorkItem], list]:
    problems = Problems()
    taken, left = [], []
    for item in items:
        found = _item(item, problems, forced) if item.text is None else None
        if found is None:
            left.append(item)
        else:
            taken.extend(found)
    for document in documents:
        if _is_levels_object(document):
            taken.extend(_levels(WorkItem(document, display_path(document), False), problems))
    return taken, left, problems.errors


def _item(item: WorkItem, problems: Problems, forced: bool) -> list[WorkItem] | None:
    if item.file.endswith(".jsonl"):
        record = first_record(item.file) or {}
        if "custom_code" in record and ("level_id" in record or any(
                str(k).startswith(SCORE_PREFIX) for k in record)):
            return _jsonl(item, problems)
        return None
    if item.file.endswith(".json") and (forced or _is_levels_object(item.file)):
        return _levels(item, problems)
    return None


def _is_levels_object(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return bool(_LEVELS_OBJECT.match(handle.read(256)))
    except OSError:
        return False


def _levels(item: WorkItem, problems: Problems) -> list[WorkItem]:
    located = problems.read_json(item.file, located=True)
    if located is None:
        return []
    data = located.value
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        problems.add(item.file, "expected {\"<level>\": [{\"task_id\", \"ref_code\", "
                     "\"custom_code\"}, ...]} (a CUDA-L1 release file)")
        return []
    lines = {(level_key, position): located.line(level_key, position, "custom_code")
             for level_key, records in data.items() for position in range(len(records))}
    shared = {line for line, count in Counter(lines.values()).items() if count > 1}
    items = []
    for level_key, records in data.items():
        for position, record in enumerate(records):
            line = lines[level_key, position]
            # records written on one line (a compact file) are told apart by where they sit
            field = f"{level_key}/{position}/custom_code" if line in shared else "custom_code"
            made = _record(item, line, record, _int(level_key), problems, field)
            if made is not None:
                items.append(made)
    return items


def _jsonl(item: WorkItem, problems: Problems) -> list[WorkItem]:
    items = []
    for line, record in jsonl_records(item.file, problems):
        made = _record(item, line, record, _int(record.get("level_id")), problems)
        if made is not None:
            items.append(made)
    return items


def _record(item: WorkItem, line: int, record: Any, level: int | None, problems: Problems,
            field: str = "custom_code") -> WorkItem | None:
    where = f"{item.display}#L{line}" + (f"/{field.rsplit('/', 1)[0]}" if "/" in field else "")
    if not isinstance(record, dict) or not isinstance(record.get("custom_code"), str):
        problems.add(where, "expected a record with \"custom_code\" (the kernel's source), got "
                     + (f"custom_code {type(record.get('custom_code')).__name__}"
                        if isinstance(record, dict) else type(record).__name__))
        return None
    scores, wrong = {}, []
    for key, value in record.items():
        if str(key).startswith(SCORE_PREFIX) and value is not None:
            if number(value) is None:
                wrong.append(f"{key} is {value!r}")
            else:
                scores[key] = float(value)
    if wrong:
        problems.add(where, "claims not read: " + "; ".join(wrong))
    gpu = Path(item.file).stem
    task = _int(record.get("task_id"))
    reference = record.get("ref_code") if isinstance(record.get("ref_code"), str) else None
    ref_code = Code(f"{where}/ref_code", item.file, reference) if reference else None
    spec = ProblemSpec(NAME, f"{level}/{task}", reference=ref_code, inputs=INPUTS_GET_INPUTS,
                       inputs_code=ref_code, inputs_name="get_inputs",
                       tolerance="kernelbench-v0")
    code = record["custom_code"]
    submission = Submission(
        "cuda-l1", gpu, level, task, reference=ref_code.path if ref_code else None,
        # a score exists only for a kernel the release's harness found correct
        claim=Claim(correctness=True if HEADLINE_SCORE in scores else None,
                    speedup=scores.get(HEADLINE_SCORE), hardware=gpu, scores=scores),
        benchmark=NAME, task=f"level {level} task {task}",
        candidate=Candidate(Code(f"{where}/custom_code", item.file), MODEL_NEW, backend_of(code)),
        spec=spec)
    return record_item(item.file, item.identity or os.path.realpath(item.file), line,
                       field, code, submission)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None
