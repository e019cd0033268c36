"""Judging a kernel's dynamic run, in the kaudit process: from the tensors and facts the candidate
job handed back (`kaudit.dynamic.harness.kernel_job`), the plain run (`harness.plain_run`) and the
reference outputs, the KD findings.

`judge` reads the candidate's files (poisoned runs, plain run, the A call that differed most from
the first, second calls, scaled runs, guard-zone masks), each refused unloaded when it is larger
than the tensors it should hold, and reports, per output: write coverage (KD101/KD102, compared as
bit patterns against the scan's keyed palettes), writes into guard zones (KD103), correctness
against the preset and a scale-invariant check (KD201/KD202, also for a later call that differed),
scale fragility against a float64 reference (KD301), stale output (KD401), input mutation on any
call (KD402), side-stream races (KD403), work after return (KD404), tampering with the harness
(KD405) and a plain run that disagrees with the watched ones (KD406); a failed candidate is KD501,
an audit stopped by a full disk KD504.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import re
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from kaudit.dynamic import acceptance
from kaudit.dynamic.harness import sentinels
from kaudit.dynamic.harness.counting import count_true
from kaudit.dynamic.harness.scaling import distance
from kaudit.dynamic.runner import TIMEOUT, OutputError, OversizedOutput, RunResult
from kaudit.dynamic.tolerance import Tolerance
from kaudit.findings import Level, Location
from kaudit.rule import rule_by_code

if TYPE_CHECKING:
    from kaudit.dynamic.kernels import KernelRun

#: KD103 findings per kernel at most (one per allocation)
MAX_OOB = 5
#: what a saved file may hold beyond its tensors' bytes (the archive's own structure)
OUTPUT_SLACK = 1 << 20
#: an OSError with one of these stopped an audit through no fault of the kernel: KD504
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: scale-invariant thresholds by output dtype: (relative L2 error, max error / max |reference|)
SCALE_FREE = {"float64": (1e-6, 1e-5), "float32": (1e-3, 1e-2), "float16": (1e-2, 5e-2),
              "bfloat16": (5e-2, 1e-1)}
SCALE_FREE_DEFAULT = (1e-3, 1e-2)
#: KD201 is an error from this relative L2 error on: the output carries none of the reference's
#: signal (zeros where the reference is tiny have 1.0)
NO_SIGNAL_L2 = 0.5


class Watched(NamedTuple):
    """The candidate's first watched outputs: on inputs A (`plain.pt`), judged in full, and on
    inputs B in new buffers (`fresh.pt`), judged for staleness and a plain miss
    (`_right_on_b`)."""

    a: list
    b: list


class Adder:
    """Adds a KD finding at the kernel's `forward` to a KernelRun."""

    def __init__(self, run: KernelRun, where: Location) -> None:
        self.run, self.where = run, where

    def __call__(self, code: str, message: str, *, level: Level | None = None,
                 **metrics: Any) -> None:
        """`level`: this finding's level when it differs from the rule's (KD201 at an error that
        leaves none of the reference's signal)."""
        rule = rule_by_code(code)
        assert rule is not None, code
        finding = rule().finding(self.where, message, level,
                                 **{k: v for k, v in metrics.items() if v is not None})
        self.run.findings.append(dataclasses.replace(finding, pass_="dynamic"))


#: characters of a failed job's traceback kept in its finding (the innermost frames)
TRACEBACK_TAIL = 2000


def failure_metrics(result: RunResult) -> dict[str, Any]:
    """A failed job's facts for its finding; `traceback_tail`: where the exception came from (the
    job reports it, so it is evidence to read, never a basis for a decision)."""
    return {"status": result.status, "phase": result.phase, "error_type": result.error_type or None,
            "stderr_tail": result.stderr_tail[-1500:] or None,
            "traceback_tail": result.traceback[-TRACEBACK_TAIL:] or None,
            "retried_alone_on_gpu": result.retried_alone or None}


def load_any(result: RunResult, name: str, max_bytes: int | None = None) -> list:
    return list(result.load(name, max_bytes))


def size_limit(tensors: list) -> int:
    """The largest file that can hold `tensors` (and nothing else)."""
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)) \
        + OUTPUT_SLACK


def disk_full(result: RunResult) -> bool:
    return result.errno in DISK_ERRNOS


def not_audited(add: Adder, result: RunResult, what: str) -> None:
    """KD504: the job stopped on a full disk (or quota), not on anything the kernel did; the
    audit is incomplete (never stored in the result cache: a resumed scan runs it again), even
    when only a later job (the plain run) stopped."""
    add.run.status = "incomplete"
    add("KD504", f"not audited: {os.strerror(result.errno or errno.ENOSPC)} where kaudit's "
        f"temporary folders are: the {what} could not write its files ({result.describe()})",
        errno=result.errno, **failure_metrics(result))


#: the phases of a candidate job where an extension may compile (as `describe` names them)
COMPILING_PHASES = ("import or compile", "construction")
#: what Triton raises when a kernel needs a GPU driver its CPU interpreter lacks (`@autotune`
#: benchmarks its configs on the device)
NO_TRITON_DRIVER = "0 active drivers"


class Answers:
    """The candidate job's answer files. One the job named in `same_as` was bit-identical to
    the first answer it saved for the same inputs and was not written: it is that file, loaded
    once (the job can forge this no more than it can write any file it likes)."""

    def __init__(self, candidate: RunResult, info: dict) -> None:
        self.candidate, self.written = candidate, set(candidate.files())
        named = info.get("same_as") if isinstance(info.get("same_as"), dict) else {}
        self.same_as = {k: v for k, v in named.items() if isinstance(k, str) and
                        isinstance(v, str) and v in self.written and k not in self.written}
        self.loaded: dict[str, list] = {}

    def has(self, name: str) -> bool:
        return name in self.written or name in self.same_as

    def load(self, name: str, max_bytes: int) -> list:
        """`RunResult.load_tensors`; FileNotFoundError for an answer neither written nor named."""
        name = self.same_as.get(name, name)
        if name not in self.loaded:
            self.loaded[name] = self.candidate.load_tensors(name, max_bytes)
        return list(self.loaded[name])


def judge(run: KernelRun, add: Adder, candidate: RunResult, refs: dict, inputs: dict,
          scaled_refs: list[dict], options: Any,
          reference_left: dict[str, list] | None = None,
          interpreted: bool = False, reference_noise: list | None = None,
          compiles: bool = False) -> Watched | None:
    """The findings of the candidate job; returns its first calls' outputs on inputs A and B
    when it could judge them (`Watched`: for `second_opinion` and the timing run's checks).
    `reference_left`: None, or what the problem's own forward left in the input sets it
    modified (KD402 is then a warning, and none for an input left as the reference leaves it).
    `interpreted`: it ran under Triton's CPU interpreter, where a kernel that needs a GPU
    driver fails through no fault of its own.
    `reference_noise`: per output, the reference's distance from its own float64 run.
    `compiles`: the kernel's text builds an extension (`load_inline`, `cpp_extension`)."""
    if not candidate.ok:
        run.status = "failed"
        if candidate.phase is None:  # timed out or crashed: where it was, from its phase file
            try:
                candidate.phase = candidate.path("phase.txt").read_text(encoding="utf-8")[:40]
            except (OSError, FileNotFoundError):
                pass
        if disk_full(candidate):
            not_audited(add, candidate, "kernel's job")
            return
        if interpreted and NO_TRITON_DRIVER in candidate.error:
            run.status = "needs-cuda"
            add("KD500", f"not run: needs CUDA (Triton's CPU interpreter cannot run it: "
                f"{candidate.error[:200]}) and this run has no CUDA device")
            return
        if interpreted and candidate.status == TIMEOUT:  # the interpreter's pace, not a hang
            run.status = "incomplete"
            add("KD504", f"not audited: under Triton's CPU interpreter the kernel "
                f"{candidate.describe()}; audit it on a GPU", **failure_metrics(candidate))
            return
        if candidate.error_type == "DeferredOutputError":
            add("KD404", f"deferred work: {candidate.error}", returned=candidate.error)
            return
        what = {"import": "import or compile", "init": "construction"}.get(
            candidate.phase or "", candidate.phase)
        if what and candidate.phase != what:
            candidate.phase = what  # describe() names the phase
        if compiles and candidate.status == TIMEOUT and candidate.phase in COMPILING_PHASES:
            # a CUDA-L1 kernel names its extension after id(self): one compile per model
            run.status = "incomplete"
            add("KD504", f"not audited: the kernel {candidate.describe()}, where it compiles an "
                f"extension; the candidate job builds the model up to {sentinels.RUNS + 2} "
                f"times (its calls, each poisoned run, its own initialisation), and an "
                f"extension compiled anew at each construction takes as many compiles: audit "
                f"it with a longer --timeout", **failure_metrics(candidate))
            return
        add("KD501", f"the kernel {candidate.describe()}", **failure_metrics(candidate))
        return
    info = candidate.value if isinstance(candidate.value, dict) else {}
    ref_a, ref_b = refs["a"], refs["b"]
    mutated = info.get("mutated") if isinstance(info.get("mutated"), dict) else None
    answers = Answers(candidate, info)
    try:
        poisoned = [answers.load(f"poison{r}.pt", size_limit(ref_a))
                    for r in range(sentinels.RUNS)]
        plain_a = answers.load("plain.pt", size_limit(ref_a))
        fresh = answers.load("fresh.pt", size_limit(ref_b))
        same = answers.load("same.pt", size_limit(ref_b))
        worst = answers.load("a_worst.pt", size_limit(ref_a)) \
            if answers.has("a_worst.pt") else None
        after = load_any(candidate, "inputs_after.pt",
                         size_limit(inputs.get(mutated["inputs"], []))) \
            if mutated and mutated.get("inputs") in inputs else None
        scaled = [candidate.load_tensors(f"scaled_{s['key']}.pt", s["bytes"] + OUTPUT_SLACK)
                  for s in scaled_refs]
        oob = {index: load_any(candidate, f"oob{index}.pt", OUTPUT_SLACK)
               for index in range(len(plain_a)) if f"oob{index}.pt" in candidate.files()}
    except OversizedOutput as exc:
        run.status = "failed"
        add("KD405", f"tampering: an output file of the kernel's job is {exc}",
            reason="oversized-output")
        return
    except (OutputError, FileNotFoundError) as exc:
        run.status = "failed"
        add("KD501", f"the kernel's outputs could not be read: {exc}")
        return
    run.status = "ok"
    run.metrics.update({k: v for k, v in info.items() if not isinstance(v, (list, dict))})
    _tampering(add, info.get("tampered") or [])
    own = _own_initialisation(add, answers, info, refs, plain_a, options.tolerance)
    if own is not None:  # judged as KernelBench builds it; the copied-weights calls say nothing
        plain_a, fresh, same, worst, scaled = own["a"], own["b"], own["b"], None, []
    layout = _layout_problem(ref_a, plain_a)
    if layout:
        add("KD202", f"wrong output: {layout}", reason="layout")
        return
    incomplete, unwritten = _coverage(add, ref_a, poisoned, oob, options)
    acceptance.report_unwritten_slack(add, ref_a, plain_a, unwritten, options.tolerance)
    _out_of_bounds(add, info.get("guard_violations", []), ref_a, oob, unwritten, options)
    _deferred(add, info)
    _side_stream(add, info.get("side_stream", []), ref_a)
    correct = not incomplete and _correctness(add, ref_a, plain_a, options.tolerance,
                                              noise=reference_noise)
    stale = _stale(add, ref_a, ref_b, plain_a, fresh, same, options.tolerance)
    later_wrong = False
    if correct and worst is not None and not stale:  # a replayed answer explains a later miss
        correct = _correctness(add, ref_a, worst, options.tolerance,
                               call=info.get("worst_call"), calls=info.get("calls"),
                               noise=reference_noise)
        later_wrong = not correct
    # a later call on A that went wrong explains a miss on B too: said once, with its call
    if not incomplete and not stale and not later_wrong and not _right_on_b(
            add, ref_a, plain_a, ref_b, fresh, options.tolerance, reference_noise):
        correct = False
    run.metrics["benchmark_accepts"] = acceptance.accepts_all(ref_a, plain_a, options.tolerance)
    if correct and not stale and scaled:  # a replayed answer is wrong at every other scale too
        _scale_fragility(add, scaled_refs, scaled)
    if after is not None and mutated is not None:
        _mutation(add, inputs[mutated["inputs"]], after, mutated.get("call"), reference_left,
                  options.tolerance, mutated["inputs"])
    return Watched(plain_a, fresh)


def _own_initialisation(add: Adder, answers: Answers, info: dict, refs: dict,
                        copied: list, tolerance: Tolerance) -> dict[str, list] | None:
    """The kernel's outputs with its own initialisation (`own_a.pt`, `own_b.pt`: ModelNew under
    the init seed, no weights copied in, as KernelBench builds it) when they pass every check on
    inputs A and B while the first call with Model's weights copied in does not: an `__init__`
    that folds a constant into a parameter (CUDA-L1 level 2 task 46, `conv.bias.sub_(0.5)`) is
    right, and the copy made it wrong. A KD202 warning says so; None otherwise."""
    differs = [str(k) for k in info.get("own_init_differs") or []]
    if not differs or not (answers.has("own_a.pt") and answers.has("own_b.pt")):
        return None

    def right(refs: list, outputs: list) -> bool:
        return not _layout_problem(refs, outputs) and all(
            all(passed_checks(r, o, tolerance)) for r, o in zip(refs, outputs))

    if right(refs["a"], copied):
        return None
    try:
        own = {kind: answers.load(f"own_{kind}.pt", size_limit(refs[kind]))
               for kind in ("a", "b")}
    except OutputError:
        return None  # unreadable: judged with the copied weights, as without them
    if not (right(refs["a"], own["a"]) and right(refs["b"], own["b"])):
        return None
    entries = ", ".join(differs[:8]) + (" ..." if len(differs) > 8 else "")
    wrong = _layout_problem(refs["a"], copied) or next(
        problem for index, ref in enumerate(refs["a"]) if (problem := fails_again(
            ref, copied[index], (True, True), tolerance, output_name(index, refs["a"]))))
    add("KD202", f"right only with its own initialisation: with Model's weights copied into "
        f"ModelNew ({entries} differ from what its __init__ makes of them) {wrong}; built as "
        f"KernelBench builds it (the init seed, nothing copied) it is right on inputs A and B, "
        f"so it was judged that way, without the later-call, same-buffer and input-scale checks "
        f"(KD301, KD401)", level=Level.WARNING, reason="own-initialisation",
        own_init_entries=differs[:32])
    add.run.metrics["initialisation"] = "own"
    return own


def rejected(run: KernelRun) -> bool:
    return any(f.level is Level.ERROR for f in run.findings)


def _coverage(add: Adder, reference: list, poisoned: list, oob: dict,
              options: Any) -> tuple[bool, dict[int, Any]]:
    """KD101/KD102 per output; (whether some output is not fully and cleanly written, each
    output's unwritten mask)."""
    incomplete = False
    masks = {}
    for index, ref in enumerate(reference):
        runs = [p[index] for p in poisoned]
        if any(r.shape != ref.shape or r.dtype != ref.dtype for r in runs):
            continue
        mask = masks[index] = unwritten_mask(runs, options.key)
        coverage = write_coverage(runs, options.key, mask)
        name = output_name(index, reference)
        if coverage["unwritten"]:
            incomplete = True
            picture = _picture(options, add, index, ref, mask, oob.get(index),
                               f"{name}: {coverage['unwritten']} of {coverage['numel']} elements "
                               f"never written")
            add("KD101", f"{name} ({_describe_tensor(ref)}): {coverage['unwritten']} of "
                f"{coverage['numel']} elements ({100 * coverage['fraction']:.3g} %) were never "
                f"written in {sentinels.RUNS - 1} runs with different keyed patterns; "
                f"{coverage['where']}", output=index, artifact=picture, **coverage)
        elif coverage["dependent"] and coverage["deterministic"]:
            incomplete = True
            add("KD102", f"{name} ({_describe_tensor(ref)}): {coverage['dependent']} of "
                f"{coverage['numel']} elements ({100 * coverage['dependent_fraction']:.3g} %) "
                f"change with the pattern that fills fresh allocations, while a repeat run with "
                f"the same pattern is bit-identical: the output depends on uninitialised memory",
                output=index, **coverage)
    return incomplete, masks


def _out_of_bounds(add: Adder, violations: list[dict], reference: list, oob: dict,
                   unwritten: dict[int, Any], options: Any) -> None:
    """KD103: one finding per allocation whose guard zones were written, in any poisoned run."""
    by_allocation: dict[tuple, list[dict]] = {}
    for violation in violations:
        # by shape and dtype: the unpoisoned runs allocate in another order and cannot tell
        # which allocation became an output
        key = (violation["phase"], tuple(violation["shape"]), violation["dtype"])
        by_allocation.setdefault(key, []).append(violation)
    for (phase, shape, dtype), seen in list(by_allocation.items())[:MAX_OOB]:
        output = next((v["output"] for v in seen if v["output"] is not None), None)
        order = min(v["order"] for v in seen)
        what = (output_name(output, reference) if output is not None else
                f"a {'temporary' if phase == 'forward' else 'construction-time'} allocation "
                f"(allocation #{order} of {phase})")
        after, before = max(v["after"] for v in seen), max(v["before"] for v in seen)
        parts = []
        if after:
            parts.append(f"{after} elements past its end (up to "
                         f"{max(v['farthest_after'] for v in seen)} elements beyond)")
        if before:
            parts.append(f"{before} elements before its start (up to "
                         f"{max(v['farthest_before'] for v in seen)} elements before)")
        picture = None
        if output is not None and output in oob:
            ref = reference[output]
            picture = _picture(options, add, output, ref, unwritten.get(output), oob[output],
                               f"{what}: written out of bounds")
        add("KD103", f"{what} (shape {list(shape)}, {dtype}) was written out of bounds: "
            f"{' and '.join(parts)}, in {len({v['run'] for v in seen})} of {sentinels.RUNS + 1} "
            f"runs (guard zones of {sentinels.GUARD_BYTES // 1024} KiB around each allocation)",
            output=output, allocation_phase=phase, allocation=order, shape=list(shape),
            dtype=dtype, written_after=after, written_before=before, artifact=picture)


def _tampering(add: Adder, tampered: list) -> None:
    """KD405: what the job found rebound after a call."""
    if tampered:
        names = [str(t) for t in tampered[:12]]
        add("KD405", f"tampering: after a call, the kernel had replaced what the harness relies "
            f"on: {', '.join(names)}{' ...' if len(tampered) > 12 else ''}",
            tampered=names, reason="rebound")


def second_opinion(add: Adder, plain: RunResult, reference: list, watched: list,
                   tolerance: Tolerance) -> None:
    """KD406: the plain run (no poisoning, no watching, a few calls) of a kernel the watched calls
    found right fails a check its first watched call passed: the benchmark's (`Tolerance.accepts`),
    or the scale-invariant check."""
    if not plain.ok:
        if disk_full(plain):
            not_audited(add, plain, "plain run")
            return
        add("KD406", f"only right when watched: the watched calls gave the reference's answer, "
            f"but in a plain run the kernel {plain.describe()}", **failure_metrics(plain))
        return
    answers = Answers(plain, plain.value if isinstance(plain.value, dict) else {})
    calls = sorted((n for n in [*answers.written, *answers.same_as]
                    if re.fullmatch(r"run\d+\.pt", n)), key=lambda n: int(n[3:-3]))
    for name in calls:
        try:
            outputs = answers.load(name, size_limit(reference))
        except OutputError as exc:
            add("KD406", f"only right when watched: the plain run's outputs are unusable: {exc}")
            return
        wrong = _layout_problem(reference, outputs) or next(
            (problem for index, ref in enumerate(reference)
             for problem in [_worse(index, ref, watched[index], outputs[index], reference,
                                    tolerance)] if problem), None)
        if wrong:
            call = int(name[3:-3]) + 1
            add("KD406", f"only right when watched: the watched calls gave the reference's "
                f"answer, but in a plain run (no poisoning, {len(calls)} calls) call {call} is "
                f"wrong: {wrong}", call=call, calls=len(calls))
            return


def _worse(index: int, reference: Any, watched: Any, plain: Any, outputs: list,
           tolerance: Tolerance) -> str | None:
    """What the plain output fails that the watched one passed, or None."""
    return fails_again(reference, plain, passed_checks(reference, watched, tolerance), tolerance,
                       output_name(index, outputs))


class ScaleFree(NamedTuple):
    """An output's distances from its reference in the scale-invariant check, with their limits
    for the reference's dtype (`SCALE_FREE`)."""

    rel: float
    ratio: float
    rel_limit: float
    ratio_limit: float

    @property
    def ok(self) -> bool:
        return self.rel <= self.rel_limit and self.ratio <= self.ratio_limit

    def text(self) -> str:
        return (f"relative L2 error {_num(self.rel)} (limit {self.rel_limit:g}), max error / "
                f"max|reference| {_num(self.ratio)} (limit {self.ratio_limit:g})")


def scale_free(reference: Any, output: Any) -> ScaleFree:
    return ScaleFree(*distance(reference, output),
                     *SCALE_FREE.get(_dtype(reference), SCALE_FREE_DEFAULT))


def passed_checks(reference: Any, output: Any, tolerance: Tolerance) -> tuple[bool, bool]:
    """Whether `output` passes (the preset's check, the scale-invariant check)."""
    return tolerance.accepts(reference, output), scale_free(reference, output).ok


def fails_again(reference: Any, output: Any, passed: tuple[bool, bool], tolerance: Tolerance,
                name: str) -> str | None:
    """What `output` fails of the checks a watched output passed (`passed_checks`), or None:
    a later run (KD406) is held to what the watched calls met, no more and no less."""
    preset, passed_scale_free = passed
    if preset and not tolerance.accepts(reference, output):
        return f"{name} fails {tolerance.check_text(_dtype(reference))}"
    check = scale_free(reference, output) if passed_scale_free else None
    if check is not None and not check.ok:
        return f"{name} has relative L2 error {_num(check.rel)} (limit {check.rel_limit:g})"
    return None


def _deferred(add: Adder, info: dict) -> None:
    """KD404: a tensor subclass returned, the output changing after return, kernel threads alive."""
    if info.get("returned"):
        add("KD404", f"deferred work: forward returned a {info['returned']}, a torch.Tensor "
            f"subclass, not a plain tensor (a subclass can compute or compare lazily)",
            returned=info["returned"])
    changed = info.get("changed_after_return") or 0
    threads = info.get("lingering_threads") or []
    if changed or threads:
        parts = []
        if changed:
            parts.append(f"{changed} output elements changed during the "
                         f"{info.get('deferred_wait', 0):g} s after forward returned (and the "
                         f"device was synchronised)")
        if threads:
            parts.append(f"threads started during forward were still running when it "
                         f"returned: {', '.join(threads[:8])}")
        add("KD404", f"deferred work: {'; '.join(parts)}", changed_after_return=changed or None,
            lingering_threads=threads or None)


def _side_stream(add: Adder, differing: list[int], reference: list) -> None:
    """KD403: outputs read after forward on the current stream differ from those read after a
    device synchronise (CUDA runs only; one count per poisoned run)."""
    racing = [count for count in differing if count]
    if racing:
        numel = sum(r.numel() for r in reference)
        add("KD403", f"side stream: read on the current stream right after forward returned, "
            f"up to {max(racing)} of {numel} output elements differed from the values after a "
            f"device synchronise (in {len(racing)} of {len(differing)} runs): work left on "
            f"another stream finishes after the harness's timer and checks",
            differing=max(racing), runs=len(racing), numel=numel)


def _scale_fragility(add: Adder, scaled_refs: list[dict], scaled: list[list]) -> None:
    """KD301: wrong at a scale where the float64 reference shows the problem is well conditioned
    (the native reference's distance from it, measured by the reference job, is within the
    scale-free limits)."""
    for record, outputs in zip(scaled_refs, scaled):
        if record["fp64"] is None or len(outputs) != len(record["fp64"]):
            continue
        for index, (wide, out) in enumerate(zip(record["fp64"], outputs)):
            known = index < len(record["errors"]) and index < len(record["dtypes"])
            if not known or record["errors"][index] is None or None in record["errors"][index] \
                    or out.shape != wide.shape:
                continue
            dtype = record["dtypes"][index]
            rel_limit, ratio_limit = SCALE_FREE.get(dtype, SCALE_FREE_DEFAULT)
            ref_rel, ref_ratio = record["errors"][index]
            if ref_rel > rel_limit or ref_ratio > ratio_limit:
                continue  # the problem itself loses accuracy at this scale
            rel, ratio = distance(wide, out)
            if rel > max(rel_limit, 10 * ref_rel) or ratio > max(ratio_limit, 10 * ref_ratio):
                name = output_name(index, outputs)
                add("KD301", f"scale fragility: with the inputs scaled by {record['scale']:g}, "
                    f"{name} has relative L2 error {_num(rel)} and max error / max|reference| "
                    f"{_num(ratio)} against a float64 reference (limits {rel_limit:g}, "
                    f"{ratio_limit:g}), while the {dtype} reference stays within "
                    f"{_num(ref_rel)} / {_num(ref_ratio)}: correct at scale 1, wrong at "
                    f"{record['scale']:g}", scale=record["scale"], output=index,
                    relative_l2=_finite(rel), max_error_ratio=_finite(ratio),
                    reference_relative_l2=ref_rel, reference_max_error_ratio=ref_ratio)
                return


def _picture(options: Any, add: Adder, index: int, reference: Any, unwritten: Any,
             guards: list | None, title: str) -> str | None:
    """An SVG of the output's unwritten / out-of-bounds elements under --artifacts, else None."""
    if not options.artifacts_dir:
        return None
    from kaudit.dynamic.artifacts import write_picture

    stem = f"{add.run.path}-output{index}"
    before, after = guards if guards else (None, None)
    return write_picture(options.artifacts_dir, stem, list(reference.shape), unwritten=unwritten,
                         written_before=before, written_after=after, title=title)


def _layout_problem(reference: list, candidate: list) -> str | None:
    if len(reference) != len(candidate):
        return f"forward returned {len(candidate)} tensors, the reference {len(reference)}"
    for index, (ref, out) in enumerate(zip(reference, candidate)):
        if tuple(ref.shape) != tuple(out.shape):
            return (f"{output_name(index, reference)} has shape {list(out.shape)}, "
                    f"the reference {list(ref.shape)}")
        if ref.dtype != out.dtype:
            return (f"{output_name(index, reference)} has dtype {_dtype(out)}, "
                    f"the reference {_dtype(ref)}")
    return None


def unwritten_mask(runs: list, key: str) -> Any:
    """Flat bool mask of the elements holding a value of their run's palette in every poisoned
    run (palettes keyed by `key`, disjoint between runs 0-2, run 3 repeating run 0); all False for
    dtypes that are not poisoned."""
    dtype = runs[0].dtype
    bits = [sentinels.as_bits(r).reshape(-1) for r in runs]
    if not sentinels.poisoned(dtype):
        return torch.zeros(bits[0].numel(), dtype=torch.bool)
    unwritten = sentinels.in_palette(bits[0], dtype, 0, key)
    for run, value in enumerate(bits[1:], start=1):
        # only where the runs so far all held their palette (nowhere, for a kernel that writes
        # its whole output): a palette lookup costs half a second per 16M elements
        where = unwritten.nonzero().squeeze(1)
        if not where.numel():
            break
        unwritten[where] = sentinels.in_palette(value[where], dtype, run, key)
    return unwritten


def write_coverage(runs: list, key: str, unwritten: Any = None) -> dict[str, Any]:
    """Bit-level coverage of one output over the poisoned runs (see `unwritten_mask`)."""
    if unwritten is None:
        unwritten = unwritten_mask(runs, key)
    bits = [sentinels.as_bits(r).reshape(-1) for r in runs]
    numel = bits[0].numel()
    distinct = [r for r in range(len(bits)) if sentinels.sentinel_run(r) == r]
    differs = torch.zeros(numel, dtype=torch.bool)
    for r in distinct[1:]:
        differs |= bits[r] != bits[distinct[0]]
    repeat_same = all(torch.equal(bits[r], bits[sentinels.sentinel_run(r)])
                      for r in range(len(bits)) if sentinels.sentinel_run(r) != r)
    count, dependent = count_true(unwritten), count_true(differs & ~unwritten)
    shape = list(runs[0].shape)
    return {"numel": numel, "unwritten": count,
            "fraction": round(count / numel, 6) if numel else 0.0,
            "dependent": dependent,
            "dependent_fraction": round(dependent / numel, 6) if numel else 0.0,
            "deterministic": repeat_same,
            "poisoned_dtype": sentinels.poisoned(runs[0].dtype),
            **_where(unwritten, count, shape)}


def _where(mask: Any, count: int, shape: list[int]) -> dict[str, Any]:
    """Where the `count` unwritten elements of `mask` lie: tail, whole rows, whole columns,
    strided or scattered."""
    if not count:
        return {"pattern": "none", "where": "none"}
    numel = mask.numel()
    columns = shape[-1] if len(shape) >= 1 and shape[-1] else 1
    rows = numel // columns
    grid = mask.reshape(rows, columns)
    full_rows = grid.all(dim=1)
    full_columns = grid.all(dim=0)
    rows_unwritten, columns_unwritten = count_true(full_rows), count_true(full_columns)
    positions = torch.nonzero(mask).reshape(-1)
    first = int(positions[0])
    info: dict[str, Any] = {"first_unwritten": first, "rows": rows, "columns": columns,
                            "rows_unwritten": rows_unwritten,
                            "columns_unwritten": columns_unwritten}
    if count == numel:
        info.update(pattern="all", where="no element of the output was written")
    elif count == numel - first:
        info.update(pattern="tail", where=f"the tail from flat index {first} on "
                    f"({count} elements) was never written")
    elif rows > 1 and rows_unwritten * columns == count:
        written = [int(i) for i in torch.nonzero(~full_rows).reshape(-1)[:5]]
        info.update(pattern="rows", where=f"{rows_unwritten} of {rows} rows (of "
                    f"{columns} elements) were never written; written rows include {written}")
    elif columns > 1 and columns_unwritten * rows == count:
        info.update(pattern="columns", where=f"{columns_unwritten} of {columns} columns "
                    f"were never written")
    else:
        steps = torch.unique(positions[1:] - positions[:-1]) if count > 1 else None
        if steps is not None and steps.numel() == 1 and int(steps[0]) > 1:
            info.update(pattern="strided", stride=int(steps[0]),
                        where=f"every {int(steps[0])}th element from flat index {first} on")
        else:
            info.update(pattern="scattered", where=f"scattered, first at flat index {first}, "
                        f"{rows_unwritten} whole rows of {rows}")
    return info


def _correctness(add: Adder, reference: list, candidate: list, tolerance: Tolerance,
                 call: int | None = None, calls: int | None = None,
                 noise: list | None = None) -> bool:
    """KD201/KD202 per output; True when every output passes both checks. `call`: a later call
    of `calls` (the one that differed most from the first), named in the message. `noise`: per
    output, the reference's relative L2 distance from its own float64 run; from NO_SIGNAL_L2 on,
    the reference is rounding noise and a miss is a warning that says so."""
    if len(reference) != len(candidate) or any(
            r.shape != c.shape or r.dtype != c.dtype for r, c in zip(reference, candidate)):
        add("KD202", f"wrong output: on call {call} of {calls}, "
            f"{_layout_problem(reference, candidate)}", reason="layout", call=call)
        return False
    when = f" on call {call} of {calls} (the first call was right)" if call else ""
    correct = True
    for index, (ref, out) in enumerate(zip(reference, candidate)):
        dtype = _dtype(ref)
        atol, rtol = tolerance.for_dtype(dtype)
        preset = tolerance.accepts(ref, out)
        check = tolerance.check_text(dtype)
        distances = scale_free(ref, out)
        rel, ratio, scale_ok = distances.rel, distances.ratio, distances.ok
        name = output_name(index, reference)
        peak = float(ref.double().abs().max()) if ref.numel() else 0.0
        numbers = f"{distances.text()}, max|reference| {peak:.3g}"
        metrics = {"output": index, "relative_l2": _finite(rel), "max_error_ratio": _finite(ratio),
                   "max_abs_reference": peak, "atol": atol, "rtol": rtol,
                   "tolerance": tolerance.name, "call": call}
        correct = correct and scale_ok
        own = noise[index] if noise is not None and index < len(noise) else None
        if own is not None and own >= NO_SIGNAL_L2 and not scale_ok:
            # a CUDA-L1 GroupNorm mean, zero in exact arithmetic, was rejected against its noise
            add("KD201" if preset else "KD202", f"{name}{when} cannot be judged: the reference's "
                f"own output is rounding noise (relative L2 {_num(own)} from the problem's float64 "
                f"run; the exact answer is near zero), and the kernel's differs from it: {numbers}",
                level=Level.WARNING, reference_noise=_finite(own), **metrics)
            continue
        if acceptance.report_slack(add, name, when, ref, out, tolerance, scale_ok, numbers,
                                   metrics):
            continue
        if preset and not scale_ok:
            no_signal = rel >= NO_SIGNAL_L2
            add("KD201", f"{name}{when} passes {check} only through its absolute part: {numbers}"
                + (f"; a relative L2 error of {NO_SIGNAL_L2:g} or more leaves none of the "
                   f"reference's signal" if no_signal else ""),
                level=Level.ERROR if no_signal else None, **metrics)
        elif not preset and not scale_ok:
            add("KD202", f"wrong output{when}: {name} fails {check} and the scale-invariant "
                f"check: {numbers}", **metrics)
    return correct


def _right_on_b(add: Adder, ref_a: list, plain_a: list, ref_b: list, fresh: list,
                tolerance: Tolerance, noise: list | None) -> bool:
    """KD202 for an output whose first call on inputs B (new buffers) fails both checks while
    its first call on inputs A passed one of them; False when reported. A's outputs are judged
    in full (KD201-KD203), B's only for a miss as plain as that, the one a kernel right on the
    first inputs it meets and wrong after makes (the timing run's trial on B was the only other
    look at B's answer). An output whose reference on A is rounding noise is left: B's noise is
    not measured."""
    layout = _layout_problem(ref_b, fresh)
    if layout:
        add("KD202", f"wrong output on inputs B (inputs A's had the reference's layout): "
            f"{layout}", reason="inputs-b")
        return False
    right = True
    for index, (ref, out) in enumerate(zip(ref_b, fresh)):
        own = noise[index] if noise is not None and index < len(noise) else None
        if (own is not None and own >= NO_SIGNAL_L2) or tolerance.accepts(ref, out):
            continue
        distances = scale_free(ref, out)
        if distances.ok or not any(passed_checks(ref_a[index], plain_a[index], tolerance)):
            continue  # right enough, or wrong on A too (reported there)
        right = False
        add("KD202", f"wrong output on inputs B (inputs A's passed): {output_name(index, ref_b)} "
            f"fails {tolerance.check_text(_dtype(ref))} and the scale-invariant check: "
            f"{distances.text()}", reason="inputs-b", output=index,
            relative_l2=_finite(distances.rel), max_error_ratio=_finite(distances.ratio),
            tolerance=tolerance.name)
    return right


def _stale(add: Adder, ref_a: list, ref_b: list, plain: list, fresh: list, same: list,
           tolerance: Tolerance) -> bool:
    """KD401; True when reported."""
    def matches(refs: list, outs: list) -> bool:
        return len(refs) == len(outs) and all(
            tolerance.accepts(r, o) for r, o in zip(refs, outs))

    if matches(ref_a, ref_b) or not matches(ref_a, plain):
        return False  # inputs A and B give the same answer, or the first call was already wrong
    # what can give the first answer again: kept answers (a cache, a CUDA graph replayed on the
    # first call's buffers); in the same buffers also a read before the caller's copy is done
    for outs, how, why in (
            (fresh, "new buffers", "it keeps an answer between calls (a cache, or work "
             "captured on the first call's buffers and replayed)"),
            (same, "the first call's buffers", "it keeps an answer between calls (a cache keyed "
             "on the buffers), or reads its inputs before the caller's copy into them is done "
             "(work on a stream of its own that does not wait for the caller's)")):
        if not matches(ref_b, outs) and matches(ref_a, outs):
            add("KD401", f"stale output: called again with fresh inputs in {how}, forward "
                f"returned the first call's answer, not the answer for the new inputs: {why}",
                buffers="new" if outs is fresh else "same")
            return True
    return False


def _mutation(add: Adder, before: list, after: list, call: int | None,
              reference_left: dict[str, list] | None, tolerance: Tolerance, kind: str) -> None:
    """KD402, from the inputs of the first call that changed them (compared here, again): an
    error, a warning when the reference problem modifies its inputs too. An input the kernel
    leaves as the reference leaves it (an `out=` buffer, within the tolerance) is an output."""
    when = f" (call {call})" if call else ""
    level = Level.WARNING if reference_left is not None else None
    also = "; the reference problem modifies its inputs too" if reference_left is not None else ""
    expected = (reference_left or {}).get(kind)
    for index, (old, new) in enumerate(zip(before, after)):
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
            continue
        if expected is not None and index < len(expected) and \
                _left_as_the_reference_leaves_it(expected[index], new, tolerance):
            continue
        if old.shape != new.shape or old.dtype != new.dtype:
            add("KD402", f"input {index} changed shape or dtype during forward{when}{also}",
                level=level, input=index, call=call)
            continue
        changed = sentinels.as_bits(old) != sentinels.as_bits(new)
        count = count_true(changed)
        if count:
            add("KD402", f"input {index} ({_describe_tensor(old)}) was modified by forward"
                f"{when}: {count} of {old.numel()} elements ({100 * count / old.numel():.3g} %) "
                f"differ afterwards{also}", level=level, input=index, changed=count,
                numel=old.numel(), call=call)


def _left_as_the_reference_leaves_it(expected: Any, new: Any, tolerance: Tolerance) -> bool:
    if not isinstance(expected, torch.Tensor) or expected.shape != new.shape or \
            expected.dtype != new.dtype:
        return False
    if not expected.is_floating_point():
        return bool(torch.equal(expected, new))
    return all(passed_checks(expected, new, tolerance))


def output_name(index: int, outputs: list) -> str:
    return "the output" if len(outputs) == 1 else f"output {index}"


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _describe_tensor(tensor: Any) -> str:
    return f"shape {list(tensor.shape)}, {_dtype(tensor)}"


def _num(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else value
