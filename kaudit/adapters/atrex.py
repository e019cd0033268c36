"""Atrex-Bench (alibaba/atrex-bench): an operator is a folder `data/<op>/` with `reference.py`
(`class Model`), `input.py` (`_make_inputs(**input_kwargs) -> dict`), `shapes.json`
({id: {init_kwargs, input_kwargs}}), `metadata.json` (dtype) and `roofline.json` (per shape, the
speed-of-light time per GPU, `SOL_time_ms`). A candidate is a file defining `class Model`, the
reference's name, in any of the benchmark's DSLs.

Layouts recognised:
- a candidate in an operator folder: `generated_kernel.py` or `candidate.py` beside
  `reference.py`, `input.py` and `shapes.json` (the evaluator's output folder
  `<timestamp>/<op>/` is one, with `eval_result.json`: compile and correctness status and timing
  samples per shape, the claims);
- the generator's output: `generated_kernel.py` beside `generation.json` ({kernel: {name,
  backend, sha256}}), its operator found as `data/<name>/` in the checkout above it; a kernel
  whose sha256 differs from the bundle's is not what was generated, and is reported.
The roofline is read into the problem, so a measured time can be reported as a share of it.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from kaudit.adapters.common import Problems, find_upwards, number, sha256_matches
from kaudit.adapters.model import INPUTS_MAKE_INPUTS, Candidate, Code, ProblemSpec, Size, \
    backend_of
from kaudit.discover import WorkItem, display_path
from kaudit.entry import EntryPoint
from kaudit.results import Claim, Submission

NAME = "atrex"
CANDIDATE_NAMES = ("generated_kernel.py", "candidate.py")
PROBLEM_FILES = ("reference.py", "input.py")
#: what the reference and the candidate both define
ENTRY = EntryPoint("class", ("Model",))


def adapt(items: list[WorkItem], documents: list[str], forced: bool
          ) -> tuple[list[WorkItem], list[WorkItem], list]:
    problems = Problems()
    taken, left = [], []
    for item in items:
        made = _item(item, problems, forced) if item.text is None else None
        if made is None:
            left.append(item)
        else:
            taken.append(made)
    return taken, left, problems.errors


def is_operator(folder: Path) -> bool:
    return all((folder / name).is_file() for name in (*PROBLEM_FILES, "shapes.json"))


def problem_spec(operator: Path) -> ProblemSpec:
    """The problem of an operator folder (`is_operator`), for `kaudit problems`."""
    return _spec(operator, operator.name, Problems())


def _item(item: WorkItem, problems: Problems, forced: bool) -> WorkItem | None:
    path = Path(os.path.abspath(item.file))
    if path.suffix != ".py" or path.name in PROBLEM_FILES:
        return None
    folder = path.parent
    generation = folder / "generation.json"
    bundle = problems.read_json(generation) if generation.is_file() else None
    bundle = bundle if isinstance(bundle, dict) else None
    name = (bundle or {}).get("kernel", {}).get("name") if bundle else None
    operator = folder if is_operator(folder) else None
    if operator is None and isinstance(name, str):
        found = find_upwards(folder, f"data/{name}/reference.py")
        operator = found.parent if found else None
    known = path.name in CANDIDATE_NAMES and (operator is not None or bundle is not None)
    if not (known or forced):
        return None
    text = _read(path)
    if bundle is not None and path.name == bundle.get("kernel", {}).get("path", path.name):
        _check_generated(path, bundle, problems)
    op_name = name if isinstance(name, str) else (operator.name if operator else folder.name)
    spec = _spec(operator, op_name, problems)
    claim = _claim(folder / "eval_result.json", spec, problems)
    backend = (bundle or {}).get("kernel", {}).get("backend")
    submission = Submission(
        "atrex-eval" if claim != Claim() else "atrex-candidate", folder.parent.name,
        task=op_name, benchmark=NAME, claim=claim, spec=spec,
        reference=spec.reference.path if spec.reference else None,
        candidate=Candidate(Code(item.display, item.file), ENTRY,
                            backend if isinstance(backend, str) else backend_of(text)))
    return WorkItem(item.file, item.display, item.explicit, submission=submission,
                    identity=item.identity)


def _check_generated(path: Path, bundle: dict[str, Any], problems: Problems) -> None:
    digest = bundle.get("kernel", {}).get("sha256")
    if isinstance(digest, str) and digest and sha256_matches(path, digest) is False:
        problems.add(path, "differs from the sha256 recorded in generation.json: this is not "
                     "the kernel the generator wrote")


def _spec(operator: Path | None, name: str, problems: Problems) -> ProblemSpec:
    if operator is None:
        return ProblemSpec(NAME, name, inputs=INPUTS_MAKE_INPUTS, tolerance="atrex")
    shapes = problems.read_json(operator / "shapes.json") or {}
    sizes = []
    for shape_id, shape in (shapes.items() if isinstance(shapes, dict) else ()):
        if isinstance(shape, dict):
            sizes.append(Size(str(shape_id), dict(shape.get("init_kwargs") or {}),
                              dict(shape.get("input_kwargs") or {})))
    metadata_file = operator / "metadata.json"
    metadata = problems.read_json(metadata_file) if metadata_file.is_file() else None
    dtype = metadata.get("dtype") if isinstance(metadata, dict) else None
    roofline_file = operator / "roofline.json"
    if not roofline_file.is_file():  # the evaluator's bundle leaves it out: the checkout has it
        roofline_file = find_upwards(operator, f"data/{name}/roofline.json") or roofline_file
    roofline = _roofline(roofline_file, problems) if roofline_file.is_file() else {}
    reference, inputs = operator / "reference.py", operator / "input.py"
    return ProblemSpec(
        NAME, name, reference=Code(display_path(str(reference)), str(reference)),
        inputs=INPUTS_MAKE_INPUTS, inputs_code=Code(display_path(str(inputs)), str(inputs)),
        inputs_name="_make_inputs", sizes=tuple(sizes),
        dtype=dtype if isinstance(dtype, str) else None, tolerance="atrex", roofline=roofline)


def _roofline(path: Path, problems: Problems) -> dict[str, dict[str, float]]:
    """{shape id: {gpu: SOL ms}} from roofline.json; shapes not yet measured (null) left out."""
    data = problems.read_json(path)
    shapes = data.get("shapes") if isinstance(data, dict) else None
    if not isinstance(shapes, dict):
        if data is not None:
            problems.add(path, "expected {\"shapes\": {\"<id>\": {\"SOL_time_ms\": "
                         "{\"<gpu>\": <ms>}}}}")
        return {}
    table = {}
    for shape_id, shape in shapes.items():
        times = shape.get("SOL_time_ms") if isinstance(shape, dict) else None
        if isinstance(times, dict):
            measured = {gpu: float(ms) for gpu, ms in times.items() if number(ms) is not None}
            if measured:
                table[str(shape_id)] = measured
    return table


def _claim(path: Path, spec: ProblemSpec, problems: Problems) -> Claim:
    """eval_result.json: compiled and correct on every shape, the median sample per shape."""
    if not path.is_file():
        return Claim()
    data = problems.read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("passed"), dict):
        if data is not None:
            problems.add(path, "claims not read: expected {\"passed\": {\"compile\": {...}, "
                         "\"correctness\": {...}}, \"performance\": {\"shapes\": {...}}}")
        return Claim()
    passed = data["passed"]
    compiled = _all_passed(passed.get("compile"))
    correct = _all_passed(passed.get("correctness"))
    environment = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    gpu = environment.get("gpu_name") if isinstance(environment.get("gpu_name"), str) else None
    performance = (data.get("performance") or {}).get("shapes") or {}
    cases = []
    for shape_id, status in (passed.get("correctness") or {}).items():
        perf = performance.get(shape_id) if isinstance(performance, dict) else None
        samples = [number(s.get("end_to_end_time_ms")) for s in (perf or {}).get("samples") or ()
                   if isinstance(s, dict)]
        samples = [s for s in samples if s is not None]
        time_ms = statistics.median(samples) if samples else None
        sol = spec.sol_ms(str(shape_id), gpu) if gpu else None
        cases.append({"shape": str(shape_id),
                      "status": status.get("status") if isinstance(status, dict) else None,
                      "time_ms": time_ms, "sol_ms": sol,
                      "sol_fraction": sol / time_ms if sol and time_ms else None})
    return Claim(compiled=compiled, correctness=correct, hardware=gpu, cases=tuple(cases))


def _all_passed(per_shape: Any) -> bool | None:
    if not isinstance(per_shape, dict) or not per_shape:
        return None
    statuses = [s.get("status") if isinstance(s, dict) else None for s in per_shape.values()]
    if any(s == "failed" for s in statuses):
        return False
    return True if all(s == "passed" for s in statuses) else None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
