"""FastKernels (Snowflake-AI-Research/fastkernels): candidates are `nn.Module`s named exactly like
the baseline's classes, `tasks/candidate/L<level>/<stem>.py` replacing
`tasks/baseline/L<level>/<stem>.py`, in any backend; inputs are captured from model runs.

Layouts recognised:
- a results set: a folder with `manifest.json` {kernels: [{level, stem, classes,
  composed_speedup}], files: {"L1/x.py": sha256}} and the files `L<level>/<stem>.py` (plus the
  `.cu` sources they load). `composed_speedup` is the claimed speedup of a kernel the set kept
  as correct. Every file is checked against the manifest's sha256: a file that differs is not
  the code the claims were measured on, so its kernel's claims are not used and the difference
  is reported in `errors[]` (which fails the run at the default `--fail-on error`);
- a checkout's `fastkernels/tasks/candidate/L<level>/<stem>.py`, the entry classes read from the
  baseline beside it;
- `bench.json` from `fastkernels bench` ({mode, scenarios: [{op: "<module>:<Class>", level, shape,
  dtype, status, max_abs_error, matched_ratio, candidate_ms, baseline_ms, speedup}]}): the
  per-shape records become the claim's cases, the geometric mean of the passed shapes' speedups
  its speedup; a failed status is a claim of incorrectness. A kernel takes the records of the
  nearest bench.json in a folder above it (`fastkernels bench --output` in a checkout).

The problem's inputs come from the capture reports of a `captures/` folder in or above the
kernel's folder, else `~/.fastkernels/captures` (`fastkernels_captures`): up to the benchmark's
5 captured cases become the problem's sizes.
"""

from __future__ import annotations

import ast
import math
import os
import re
from pathlib import Path
from typing import Any

from kaudit.adapters import fastkernels_captures as captures
from kaudit.adapters.common import Problems, find_upwards, number, sha256_matches
from kaudit.adapters.model import INPUTS_CAPTURED, Candidate, Code, ProblemSpec, backend_of
from kaudit.discover import WorkItem, display_path
from kaudit.entry import EntryPoint
from kaudit.results import Claim, Submission

NAME = "fastkernels"
_LEVEL = re.compile(r"L([1-4])$")
_OP = re.compile(r"\.L([1-4])\.(\w+):(\w+)$")
PASSED, SKIPPED = "PASSED", "SKIPPED"


def adapt(items: list[WorkItem], documents: list[str], forced: bool
          ) -> tuple[list[WorkItem], list[WorkItem], list]:
    adapter = _Adapter(documents)
    taken, left = [], []
    for item in items:
        made = adapter.item(item, forced) if item.text is None else None
        if made is None:
            left.append(item)
        else:
            taken.append(made)
    adapter.finish()
    return taken, left, adapter.problems.errors


class _Set:
    """One results set: its manifest's kernels and file digests."""

    def __init__(self, folder: Path, data: dict[str, Any], problems: Problems) -> None:
        self.folder = folder
        self.manifest = folder / "manifest.json"
        self.kernels: dict[tuple[int, str], dict[str, Any]] = {}
        self.files: dict[str, str] = {}
        for position, kernel in enumerate(data.get("kernels") or []):
            level = kernel.get("level") if isinstance(kernel, dict) else None
            stem = kernel.get("stem") if isinstance(kernel, dict) else None
            if not isinstance(level, int) or not isinstance(stem, str):
                problems.add(self.manifest, f"kernels[{position}]: expected {{\"level\": <int>, "
                             "\"stem\": <str>, \"classes\": [...], \"composed_speedup\": <number>}")
                continue
            self.kernels[(level, stem)] = kernel
        files = data.get("files") or {}
        if isinstance(files, dict):
            self.files = {k: v for k, v in files.items() if isinstance(v, str)}
        else:
            problems.add(self.manifest, "files: expected {\"<path>\": \"<sha256>\"}")
        #: files whose digest differs (checked once), and those already charged to a kernel
        self.mismatched = {path for path, digest in self.files.items()
                           if sha256_matches(folder / path, digest) is False}
        self.missing = {path for path in self.files if not (folder / path).is_file()}
        self.charged: set[str] = set()


class _Adapter:
    def __init__(self, documents: list[str]) -> None:
        self.problems = Problems()
        self.reports = captures.Reports(self.problems)
        self.sets: dict[Path, _Set | None] = {}
        self.benches: list[tuple[Path, dict[tuple[int, str], list[dict[str, Any]]]]] = []
        #: sets whose manifest the walk met: the whole set was scanned
        self.walked: list[Path] = []
        for document in documents:
            name = os.path.basename(document)
            if name == "manifest.json":
                folder = Path(os.path.abspath(document)).parent
                self._set(folder)
                self.walked.append(folder)
            elif name == "bench.json":
                self._bench(Path(os.path.abspath(document)))

    def item(self, item: WorkItem, forced: bool) -> WorkItem | None:
        path = Path(os.path.abspath(item.file))
        level = _LEVEL.match(path.parent.name)
        if path.suffix != ".py" or level is None:
            return None
        key = (int(level.group(1)), path.stem)
        results = self._set(path.parent.parent)
        in_checkout = path.parent.parent.name == "candidate" and \
            path.parent.parent.parent.name == "tasks"
        if results is not None:
            if key not in results.kernels:
                return None  # a helper module of the set, not one of its kernels
            return self._candidate(item, key, results)
        if in_checkout or forced:
            return self._candidate(item, key, None)
        return None

    def finish(self) -> None:
        """For each set scanned whole (its manifest met on the walk): kernels listed with claims
        whose file is missing, and differing files that no scanned kernel names."""
        for folder in self.walked:
            results = self.sets.get(folder)
            if results is None:
                continue
            reported = set()
            for level, stem in sorted(results.kernels):
                if not (folder / f"L{level}/{stem}.py").is_file():
                    reported.add(f"L{level}/{stem}.py")
                    self.problems.add(results.manifest, f"kernel L{level}/{stem}.py is listed "
                                      "with claims but the file is missing")
            for path in sorted((results.mismatched | results.missing) - results.charged - reported):
                what = "is missing" if path in results.missing else \
                    "differs from the manifest's sha256"
                self.problems.add(folder / path,
                                  f"{what} (listed in {display_path(str(results.manifest))})")

    # --- layouts --------------------------------------------------------------------------

    def _candidate(self, item: WorkItem, key: tuple[int, str], results: _Set | None) -> WorkItem:
        level, stem = key
        path = Path(os.path.abspath(item.file))
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        baseline = find_upwards(path.parent, f"fastkernels/tasks/baseline/L{level}/{stem}.py") \
            or find_upwards(path.parent, f"tasks/baseline/L{level}/{stem}.py")
        if results is not None:
            classes = tuple(c for c in results.kernels[key].get("classes") or ()
                            if isinstance(c, str))
        else:
            classes = _classes(baseline) if baseline else ()
        classes = classes or _classes(path)
        claim, layout, run = Claim(), "fastkernels-candidate", path.parent.parent.name
        if results is not None:
            layout, run = "fastkernels-set", results.folder.name
            claim = self._set_claim(item, key, results, text)
        cases = self._cases(path, key)
        if cases:
            claim = _with_cases(claim, cases)
        report, sizes, note = None, (), ""
        for folder in captures.folders(path):
            report, sizes, note = captures.sizes(self.reports.of(folder), level, stem,
                                                 classes or (stem,))
            if report is not None:
                break
        spec = ProblemSpec(
            NAME, f"L{level}/{stem}",
            reference=Code(display_path(str(baseline)), str(baseline)) if baseline else None,
            reference_name=sizes[0].init_kwargs["class"] if sizes else
            (classes[0] if classes else stem), inputs=INPUTS_CAPTURED,
            inputs_code=Code(display_path(str(report)), str(report)) if report else None,
            sizes=sizes, sizes_note=note, tolerance="fastkernels",
            dtype=sizes[0].input_kwargs["dtype"] if sizes else None)
        submission = Submission(
            layout, run, level, task=f"L{level}/{stem}", benchmark=NAME, claim=claim,
            reference=spec.reference.path if spec.reference else None, spec=spec,
            candidate=Candidate(Code(item.display, item.file),
                                EntryPoint("class", classes or (stem,)), backend_of(text)))
        return WorkItem(item.file, item.display, item.explicit, submission=submission,
                        identity=item.identity)

    def _set_claim(self, item: WorkItem, key: tuple[int, str], results: _Set, text: str
                   ) -> Claim:
        """The manifest's claim, unless the kernel's file or a file it names differs from the
        digest the manifest recorded."""
        own = os.path.relpath(os.path.abspath(item.file), results.folder).replace(os.sep, "/")
        named = {p for p in results.files if p != own and os.path.basename(p) in text}
        if own not in results.files:
            self.problems.add(item.file, f"not listed in {display_path(str(results.manifest))} "
                              "files: its claims cannot be tied to this code; not used")
            return Claim()
        differing = sorted((results.mismatched | results.missing) & ({own} | named))
        if differing:
            results.charged.update(differing)
            speedup = number(results.kernels[key].get("composed_speedup"))
            self.problems.add(item.file, (
                f"{', '.join(differing)} differ{'s' if len(differing) == 1 else ''} from the "
                f"sha256 in {display_path(str(results.manifest))}: its claims"
                f"{f' (composed_speedup {speedup:.3g}x)' if speedup is not None else ''} were "
                "measured on other code; not used"))
            return Claim()
        speedup = results.kernels[key].get("composed_speedup")
        if speedup is not None and number(speedup) is None:
            self.problems.add(results.manifest, f"claims not read: L{key[0]}/{key[1]}: "
                              f"composed_speedup is {speedup!r}")
        # the set keeps only kernels its composed bench found correct
        return Claim(correctness=True, speedup=number(speedup))

    def _cases(self, path: Path, key: tuple[int, str]) -> list[dict[str, Any]]:
        """The per-shape records of the nearest bench.json above the kernel that has it."""
        best, depth = None, -1
        for folder, records in self.benches:
            if key in records and folder in path.parents and len(folder.parts) > depth:
                best, depth = records[key], len(folder.parts)
        return best or []

    # --- files ----------------------------------------------------------------------------

    def _set(self, folder: Path) -> _Set | None:
        if folder not in self.sets:
            manifest = folder / "manifest.json"
            data = self.problems.read_json(manifest) if manifest.is_file() else None
            if data is not None and not (isinstance(data, dict) and "kernels" in data):
                data = None  # some other manifest: not a FastKernels set
            self.sets[folder] = _Set(folder, data, self.problems) if data is not None else None
        return self.sets[folder]

    def _bench(self, path: Path) -> None:
        data = self.problems.read_json(path)
        if data is None:
            return
        scenarios = data.get("scenarios") if isinstance(data, dict) else None
        if not isinstance(scenarios, list):
            return  # another tool's bench.json
        records: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for position, scenario in enumerate(scenarios):
            op = _OP.search(str(scenario.get("op", ""))) if isinstance(scenario, dict) else None
            if op is None:
                self.problems.add(path, f"scenarios[{position}]: expected \"op\": "
                                  "\"<package>.L<level>.<stem>:<Class>\"; not used")
                continue
            case = {k: scenario.get(k) for k in ("shape", "dtype", "status", "max_abs_error",
                                                  "matched_ratio", "candidate_ms", "baseline_ms",
                                                  "speedup")}
            case["class"] = op.group(3)
            records.setdefault((int(op.group(1)), op.group(2)), []).append(case)
        self.benches.append((path.parent, records))


def _with_cases(claim: Claim, cases: list[dict[str, Any]]) -> Claim:
    statuses = [str(c.get("status")) for c in cases]
    failed = [s for s in statuses if s not in (PASSED, SKIPPED)]
    speedups = [number(c.get("speedup")) for c in cases if c.get("status") == PASSED]
    speedups = [s for s in speedups if s is not None and s > 0]
    geomean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
    return Claim(
        correctness=False if failed else (True if PASSED in statuses else claim.correctness),
        speedup=claim.speedup if claim.speedup is not None else geomean,
        status=failed[0] if failed else claim.status, cases=tuple(cases))


def _classes(path: Path) -> tuple[str, ...]:
    """The top-level classes of a module, in order (the baseline's names the candidate keeps)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef))
