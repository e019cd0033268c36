"""Shape sweeps (KD302 shape-fragile): a kernel that passed at the benchmark's sizes is run again
with the problem's module-level integer sizes perturbed, and judged here.

The sizes are the problem file's module-level assignments of an integer literal of at least
`MIN_SIZE` (`batch_size = 16`, `dim = 16384`), read from its text. Each becomes one larger (an odd
number: no multiple of 32 or 128; with every size of at least 8, the inputs grow by less than 2x for
up to five sizes multiplied together). The reference job runs with the sizes rebound in the
problem module before `get_init_inputs()` and `get_inputs()` (`sizes`); when it fails, or its
inputs grew by more than `MAX_GROWTH`, the problem does not accept them and nothing is reported.
Otherwise a plain run of the kernel (no poisoning, the new inputs and init state) must give the
reference's answer: a crash, a different number, shape or dtype of outputs, or an output failing
the scale-invariant check (KD201's limits) is a KD302 warning. Benchmarks fix their sizes, so a
kernel tied to them is not wrong for the benchmark, but it is not the operator that was asked for.

The timed-size sweep (`timed_sweep`) is the same pair of runs at the sizes a benchmark times but
never checks (KernelBenchX: its timing template's inputs, 2^12 to 2^27 elements): the problem
wrapper (`kaudit.dynamic.adapted`) rebinds `TIMED_SIZE` and `TIMED_BUDGET` instead of the
problem's sizes, and a wrong answer there is KD302 with its own message: the speed the benchmark
reports was measured on a kernel that is wrong at those sizes.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from kaudit.dynamic import scratch
from kaudit.dynamic.judge import (
    Adder,
    _layout_problem,
    _num,
    output_name,
    scale_free,
    size_limit,
)
from kaudit.dynamic.runner import Job, OutputError, run_job, share_inputs

#: module-level integers below this are counts and kernel sizes, not tensor sizes
MIN_SIZE = 8
#: the perturbed inputs may take at most this many times the benchmark's bytes
MAX_GROWTH = 2.0
#: the line of a problem wrapper that can rebind TIMED_SIZE (the index of the timed input to
#: run, 0 the smallest) and TIMED_BUDGET (the most bytes that input may take)
TIMED_MARKER = "TIMED_SIZE = None  # the timed-size sweep's input (KD302)"
#: timed inputs run: the smallest, the middle and the largest of those within the budget
TIMED_POINTS = 3
#: the budget per device kind: KernelBenchX times up to 2^27 elements (512 MiB in float32)
TIMED_BUDGET = {"cpu": 16 << 20, "cuda": 1 << 30}


def perturbed_sizes(problem_text: str) -> dict[str, int]:
    """{name: size + 1} for the problem's module-level `NAME = <int >= MIN_SIZE>` assignments."""
    try:
        tree = ast.parse(problem_text)
    except (SyntaxError, ValueError):
        return {}
    sizes = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant) \
                and type(node.value.value) is int and node.value.value >= MIN_SIZE:
            sizes[node.targets[0].id] = node.value.value + 1
    return sizes


def shape_sweep(add: Adder, metrics: dict, problem: str, reference_job: Job, plain_job: Job,
                original_bytes: int) -> None:
    """Run `reference_job` and `plain_job` (their args completed here) at perturbed sizes;
    KD302 when the kernel fails where the reference does not."""
    sizes = perturbed_sizes(_read(problem))
    if not sizes:
        return
    shown = ", ".join(f"{name}={value}" for name, value in sizes.items())

    def refusal(reference: Any) -> str | None:
        grown = _bytes(reference, "inputs_a.pt") / max(1, original_bytes)
        return f"takes {grown:.2g}x the memory" if grown > MAX_GROWTH else None

    not_run, problem_found, _ = _sized_run(reference_job, plain_job, sizes, refusal)
    if not_run is not None:
        if not_run:
            metrics["shape_sweep"] = f"not run: the reference at {shown} {not_run}"
        return
    metrics["shape_sweep"] = shown
    if problem_found:
        add("KD302", f"shape-fragile: right at the benchmark's sizes, but with the problem's "
            f"sizes changed to {shown} (which the reference accepts) the kernel {problem_found}",
            sizes=sizes)


def timed_sweep(add: Adder, metrics: dict, problem: str, reference_job: Job, plain_job: Job,
                device: str) -> None:
    """For a problem whose wrapper carries TIMED_MARKER (a KernelBenchX task with its timing
    template): run the reference and the kernel on up to TIMED_POINTS of the inputs the
    benchmark times (the smallest, the middle and the largest of those within the device's
    budget); KD302 when the kernel is wrong at any of them."""
    if TIMED_MARKER not in _read(problem).splitlines():
        return
    budget = TIMED_BUDGET.get(device.split(":")[0], TIMED_BUDGET["cuda"])
    ran, wrong, skipped = [], [], []
    for point in range(TIMED_POINTS):
        sizes = {"TIMED_SIZE": point, "TIMED_BUDGET": budget}
        not_run, problem_found, shown = _sized_run(reference_job, plain_job, sizes, None)
        if not_run is not None:
            skipped.append(not_run)
            continue
        ran.append(shown)
        if problem_found:
            wrong.append(f"{shown}: the kernel {problem_found}")
    metrics["timed_sweep"] = {"ran": ran, "not_run": skipped[:1], "budget_bytes": budget}
    if wrong:
        add("KD302", "wrong at the sizes the benchmark times it at: right at its test's sizes, "
            f"but on {len(wrong)} of the {len(ran)} timed inputs run (of up to "
            f"{budget / (1 << 20):g} MiB each) it is not: " + "; ".join(wrong),
            timed_inputs=ran, wrong_at=len(wrong))


def summary(runs: list) -> dict[str, Any]:
    """For the scan's summary, when any kernel had a timed-size sweep: how many, the timed
    inputs run, and the kernels wrong at one of them."""
    swept = [r for r in runs if "timed_sweep" in r.metrics]
    if not swept:
        return {}
    wrong = sum(any(f.rule == "KD302" and "timed_inputs" in f.metrics for f in r.findings)
                for r in swept)
    return {"timed_sweep": {"kernels": len(swept), "wrong": wrong, "inputs_run": sum(
        len(r.metrics["timed_sweep"]["ran"]) for r in swept)}}


def _sized_run(reference_job: Job, plain_job: Job, sizes: dict[str, Any],
               refusal: Any) -> tuple[str | None, str | None, str]:
    """The reference and a plain run of the kernel with `sizes` rebound in the problem module:
    (why they did not run, "" when there is nothing to say; what is wrong with the kernel's
    answer; the timed input as the problem describes it, "" for another problem)."""
    with run_job(Job(reference_job.target, {**reference_job.args, "sizes": sizes, "scales": []},
                     **_fields(reference_job))) as reference:
        if not reference.ok:
            return reference.describe(), None, ""
        why = refusal(reference) if refusal else None
        if why is None and "init.pt" not in reference.files():
            why = "has no init state to hand over"
        if why is not None:
            return why, None, ""
        try:
            expected = reference.load_tensors("ref_a.pt")
        except OutputError:
            return "", None, ""
        timed = _timed_input(reference)
        for name in reference.files():  # the plain run sees the inputs only
            if name not in ("inputs_a.pt", "init.pt"):
                reference.path(name).unlink()
        shared = share_inputs(reference, ["inputs_a.pt", "init.pt"])
        try:
            with run_job(Job(plain_job.target, {**plain_job.args, "calls": 1},
                             **{**_fields(plain_job), "inputs": shared})) as plain:
                return None, _fragile(plain, expected), timed
        finally:
            scratch.remove(shared.folder)


def _timed_input(reference: Any) -> str:
    """The description a timed problem puts in its init inputs ({"input": ...})."""
    try:
        init = reference.load("init.pt", max_bytes=1 << 20)
        described = init["init_inputs"][-1]
        return str(described["input"]) if isinstance(described, dict) else ""
    except (OutputError, FileNotFoundError, KeyError, IndexError, TypeError):
        return ""


def _fragile(plain: Any, expected: list) -> str | None:
    if not plain.ok:
        return plain.describe()
    try:
        outputs = plain.load_tensors("run0.pt", size_limit(expected))
    except (OutputError, FileNotFoundError) as exc:
        return f"gave unusable outputs: {exc}"
    layout = _layout_problem(expected, outputs)
    if layout:
        return f"is wrong: {layout}"
    for index, (ref, out) in enumerate(zip(expected, outputs)):
        check = scale_free(ref, out)
        if not check.ok:
            return (f"is wrong: {output_name(index, expected)} has relative L2 error "
                    f"{_num(check.rel)} (limit {check.rel_limit:g}) and max error / "
                    f"max|reference| {_num(check.ratio)} (limit {check.ratio_limit:g})")
    return None


def _fields(job: Job) -> dict[str, Any]:
    return {name: getattr(job, name) for name in ("timeout", "seed", "memory_limit", "cpu_limit",
                                                  "env", "inputs", "visible", "writable", "gpu")}


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _bytes(result: Any, name: str) -> int:
    try:
        return os.path.getsize(result.path(name))
    except (OSError, FileNotFoundError):
        return 0
