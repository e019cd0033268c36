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
"""

from __future__ import annotations

import ast
import os
from typing import Any

from kaudit.dynamic import scratch
from kaudit.dynamic.judge import (
    SCALE_FREE,
    SCALE_FREE_DEFAULT,
    Adder,
    _dtype,
    _layout_problem,
    _num,
    _output_name,
    scale_free_errors,
    size_limit,
)
from kaudit.dynamic.runner import Job, OutputError, run_job, share_inputs

#: module-level integers below this are counts and kernel sizes, not tensor sizes
MIN_SIZE = 8
#: the perturbed inputs may take at most this many times the benchmark's bytes
MAX_GROWTH = 2.0


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
    try:
        with open(problem, encoding="utf-8", errors="replace") as handle:
            sizes = perturbed_sizes(handle.read())
    except OSError:
        return
    if not sizes:
        return
    shown = ", ".join(f"{name}={value}" for name, value in sizes.items())
    with run_job(Job(reference_job.target, {**reference_job.args, "sizes": sizes, "scales": []},
                     **_fields(reference_job))) as reference:
        grown = _bytes(reference, "inputs_a.pt") / max(1, original_bytes)
        if not reference.ok or grown > MAX_GROWTH or "init.pt" not in reference.files():
            metrics["shape_sweep"] = f"not run: the reference at {shown} " + (
                reference.describe() if not reference.ok else f"takes {grown:.2g}x the memory"
                if grown > MAX_GROWTH else "has no init state to hand over")
            return
        try:
            expected = reference.load_tensors("ref_a.pt")
        except OutputError:
            return
        for name in reference.files():  # the plain run sees the inputs only
            if name not in ("inputs_a.pt", "init.pt"):
                reference.path(name).unlink()
        shared = share_inputs(reference, ["inputs_a.pt", "init.pt"])
        try:
            with run_job(Job(plain_job.target, {**plain_job.args, "calls": 1},
                             **{**_fields(plain_job), "inputs": shared})) as plain:
                problem_found = _fragile(plain, expected)
        finally:
            scratch.remove(shared.folder)
    metrics["shape_sweep"] = shown
    if problem_found:
        add("KD302", f"shape-fragile: right at the benchmark's sizes, but with the problem's "
            f"sizes changed to {shown} (which the reference accepts) the kernel {problem_found}",
            sizes=sizes)


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
        rel, ratio = scale_free_errors(ref, out)
        rel_limit, ratio_limit = SCALE_FREE.get(_dtype(ref), SCALE_FREE_DEFAULT)
        if rel > rel_limit or ratio > ratio_limit:
            return (f"is wrong: {_output_name(index, expected)} has relative L2 error "
                    f"{_num(rel)} (limit {rel_limit:g}) and max error / max|reference| "
                    f"{_num(ratio)} (limit {ratio_limit:g})")
    return None


def _fields(job: Job) -> dict[str, Any]:
    return {name: getattr(job, name) for name in ("timeout", "seed", "memory_limit", "cpu_limit",
                                                  "env", "inputs", "visible", "writable", "gpu")}


def _bytes(result: Any, name: str) -> int:
    try:
        return os.path.getsize(result.path(name))
    except (OSError, FileNotFoundError):
        return 0
