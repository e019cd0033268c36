"""`kaudit problems`, in the kaudit process: one problem job's saved outputs loaded (with
`weights_only=True`) and probed, and its findings made (KP101-KP104, KP201, KP301, KP501, KP502;
`problems` lists what each means). No problem code runs here."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from kaudit.dynamic.limits import memory_note
from kaudit.dynamic.problem_sizing import non_negative_int
from kaudit.dynamic.problem_results import Options, ProblemResult
from kaudit.dynamic.runner import MAX_PHASES, OutputError, RunResult, phase_seconds
from kaudit.dynamic.tolerance import Tolerance
from kaudit.findings import Location
from kaudit.rule import rule_by_code

MANIFEST = "manifest.json"


class Finder:
    """Makes the findings of one problem."""

    def __init__(self, problem: ProblemResult) -> None:
        self.problem = problem

    def __call__(self, code: str, message: str, **metrics: Any) -> None:
        rule = rule_by_code(code)
        assert rule is not None, code
        where = Location(self.problem.path, self.problem.line, 1, self.problem.line,
                         self.problem.end_column)
        finding = rule().finding(where, message,
                                 **{k: v for k, v in metrics.items() if v is not None})
        self.problem.findings.append(dataclasses.replace(finding, pass_="problems"))


def analyse(result: RunResult, display: str, line: int, options: Options,
            end_column: int = 1, memory_limit: int | None = None) -> ProblemResult:
    """`memory_limit`: the job's cap, named when it ran out of memory."""
    problem = ProblemResult(display, line, max(1, end_column),
                            retried_alone_on_gpu=result.retried_alone,
                            gpu_wait_s=result.gpu_wait_s)
    report = Finder(problem)
    manifest: dict[str, Any] | None = result.value if result.ok else _manifest(result)
    if manifest:
        problem.device = manifest.get("device")
        problem.job_seconds = phase_seconds(manifest.get("timings"), "job")
        problem.gpu_total_bytes = non_negative_int(manifest.get("gpu_total_bytes"))
        peaks = manifest.get("gpu_step_peaks")  # bounded as the steps' seconds are
        problem.gpu_step_peaks = {
            step[:40]: held for step, value
            in list(peaks.items() if isinstance(peaks, dict) else ())[:MAX_PHASES]
            if isinstance(step, str) and (held := non_negative_int(value)) is not None}
        problem.gpu_peak_bytes = max(problem.gpu_step_peaks.values(), default=None)
    seeds = [s for s in (manifest or {}).get("seeds", []) if s.get("native")]
    if not result.ok and len(seeds) < options.seeds:
        phase = (manifest or {}).get("phase") if result.status in ("timeout", "crashed") \
            else result.phase
        if phase and not result.phase:
            result.phase = phase
        _not_run(problem, report, result, memory_limit)
        return problem
    try:
        return _probe(problem, report, result, manifest or {}, seeds, options)
    except (OutputError, ValueError, RuntimeError) as exc:
        problem.findings.clear()
        result.status, result.phase = "error", "output"
        result.error_type, result.error = type(exc).__name__, str(exc)
        _not_run(problem, report, result)
        return problem


def _manifest(result: RunResult) -> dict[str, Any] | None:
    try:
        data = result.read_json(MANIFEST)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _not_run(problem: ProblemResult, report: Finder, result: RunResult,
             memory_limit: int | None = None) -> None:
    problem.status = "failed"
    problem.error = result.describe() + memory_note(result, memory_limit)
    tail = "\n".join(result.stderr_tail.strip().splitlines()[-15:])[-1500:]
    report("KP501", f"the problem could not be run: {problem.error}",
           status=result.status, phase=result.phase, stderr_tail=tail or None,
           retried_alone_on_gpu=result.retried_alone or None)


@dataclass
class Component:
    """One output tensor of one run, as the child saved it (see `problem_job`)."""

    shape: list[int]
    dtype: str
    numel: int
    #: 1-D: every element, or the values at the sampled positions of a large output
    sample: Any
    #: 1-D: the minimum, maximum and largest magnitude of a sampled output; empty otherwise
    extremes: Any
    sampled: bool
    nan: int
    inf: int

    @property
    def values(self) -> Any:
        """Every value known: exact min, max and max|y| even for a sampled output."""
        import torch

        return torch.cat([self.sample, self.extremes]) if self.extremes.numel() else self.sample

    @functools.cached_property
    def moments(self) -> Any:
        """`probes.Moments` of every value known: computed once, for each seed and for all."""
        from kaudit.dynamic import probes

        return probes.Moments.of(self.values)

    @property
    def floating(self) -> bool:
        return self.sample.is_floating_point() or self.sample.is_complex()


def load_output(result: RunResult, name: str, manifest: dict) -> list[Component]:
    """A file of `[values, extremes]` pairs, checked against the layout the child recorded."""
    import torch

    tensors = result.load_tensors(name)
    layout = (manifest.get("files") or {}).get(name)
    if not isinstance(layout, list) or not layout or len(tensors) != 2 * len(layout):
        raise OutputError(f"{name}: {len(tensors)} tensors do not match the recorded layout")
    components = []
    for entry, values, extremes in zip(layout, tensors[0::2], tensors[1::2]):
        dtype = str(values.dtype).removeprefix("torch.")
        if not isinstance(entry, dict) or entry.get("dtype") != dtype or extremes.dtype != \
                values.dtype or extremes.dim() != 1:
            raise OutputError(f"{name}: tensors do not match the recorded layout")
        if entry.get("sampled"):
            if values.dim() != 1:
                raise OutputError(f"{name}: a sampled output must be one-dimensional")
            nan, inf = int(entry.get("nan", 0)), int(entry.get("inf", 0))
            numel, shape = int(entry["numel"]), [int(n) for n in entry["shape"]]
        else:
            shape, numel = list(values.shape), values.numel()
            if shape != entry.get("shape"):
                raise OutputError(f"{name}: shape {shape} differs from the recorded layout")
            floating = values.is_floating_point()
            nan = int(torch.isnan(values).sum()) if floating else 0
            inf = int(torch.isinf(values).sum()) if floating else 0
        components.append(Component(shape, dtype, numel, values.reshape(-1), extremes,
                                    bool(entry.get("sampled")), nan, inf))
    return components


def _probe(problem: ProblemResult, report: Finder, result: RunResult, manifest: dict,
           seeds: list[dict], options: Options) -> ProblemResult:
    import torch

    from kaudit.dynamic import probes
    from kaudit.dynamic.acceptance import best_constant

    outputs = [load_output(result, s["native"], manifest) for s in seeds]
    _check_consistent(outputs)
    first = outputs[0]
    sampled = any(c.sampled for c in first)
    problem.shapes = [c.shape for c in first]
    problem.dtypes = [c.dtype for c in first]
    problem.stats = _stats([c for output in outputs for c in output])
    problem.stats["numel"] = sum(c.numel for c in first)
    if sampled:
        problem.stats["sampled"] = sum(c.sample.numel() for c in first if c.sampled)
    problem.tolerance = options.tolerance.summary(problem.dtypes[0])
    atol, rtol = problem.tolerance["atol"], problem.tolerance["rtol"]
    described = _describe_tolerance(options.tolerance, problem.dtypes[0])
    count = len(outputs)
    components = range(len(first))
    # the benchmark's own check; a sampled output passes the pairwise check only with half the
    # tolerance to spare
    check = options.tolerance
    pair_check = check.scaled(probes.SAMPLED_PAIR_SHARE) if sampled else check

    def pair_passes(i: int, j: int) -> bool:
        return all(pair_check.accepts(outputs[i][c].sample, outputs[j][c].sample)
                   for c in components)

    def zeros_pass(output: list[Component]) -> bool:
        return all(not (c.nan or c.inf) and check.accepts(c.values, torch.zeros_like(c.values))
                   for c in output)

    def finite(output: list[Component]) -> bool:
        return not any(c.nan or c.inf for c in output)

    # per seed: zeros, its own best constant, and whether the next seed's output passes
    for i, (record, output) in enumerate(zip(seeds, outputs)):
        stats = _stats(output)
        constants = [best_constant([c.values], check) if finite(output) else (False, None)
                     for c in output]
        entry = {"seed": record["seed"], "max_abs": stats["max_abs"], "std": stats["std"],
                 "zeros_pass": zeros_pass(output),
                 "constant_pass": all(ok for ok, _ in constants),
                 "constant": constants[0][1] if constants[0][0] else None}
        if count > 1:
            entry["other_input_seed"] = seeds[(i + 1) % count]["seed"]
            entry["other_input_pass"] = pair_passes(i, (i + 1) % count)
        problem.seeds.append(entry)

    problem.zeros_pass = all(entry["zeros_pass"] for entry in problem.seeds)
    all_finite = all(finite(output) for output in outputs)
    per_component = [best_constant([o[c].values for o in outputs], check) if all_finite else (False, None) for c in components]
    problem.constant_pass = all(ok for ok, _ in per_component)
    problem.constant = per_component[0][1] if problem.constant_pass else None
    pairs = [(i, j) for i in range(count) for j in range(count) if i != j]
    passing = sum(pair_passes(i, j) for i, j in pairs)
    problem.other_input_pairs = {"passing": passing, "total": len(pairs)}
    problem.other_input_pass = (passing == len(pairs)) if pairs else None
    digests = {s.get("inputs") for s in seeds}
    same_inputs = count > 1 and len(digests) == 1
    max_abs = problem.stats["max_abs"]
    seeds_text = f"all {count} seeds" if count > 1 else "the seed"
    sample_text = (f" (pairs compared on {problem.stats['sampled']} sampled elements of "
                   f"{problem.stats['numel']}, with half the tolerance)") if sampled else ""

    @functools.cache
    def spread(i: int, j: int) -> float:
        if i > j:
            return spread(j, i)
        return max((float((outputs[i][c].sample.double() - outputs[j][c].sample.double())
                          .abs().max()) for c in components if outputs[i][c].sample.numel()),
                   default=0.0)

    if problem.zeros_pass:
        report("KP101", f"an all-zeros output passes the check ({described}) on {seeds_text}: "
               f"max|y| = {_g(max_abs)}", max_abs=max_abs, atol=atol, rtol=rtol)
    if problem.constant_pass:
        low, high = problem.stats["min"], problem.stats["max"]
        report("KP102", f"the constant {_g(problem.constant)} passes the check ({described}) on "
               f"{seeds_text}: the reference spans [{_g(low)}, {_g(high)}] "
               f"(std {_g(problem.stats['std'])})", constant=problem.constant, min=low, max=high,
               std=problem.stats["std"], atol=atol, rtol=rtol)
    if problem.other_input_pass:
        largest = max(spread(i, j) for i, j in pairs)
        why = ("get_inputs() returns the same inputs for every seed, so a stored output passes"
               if same_inputs else "the check cannot tell whether the output depends on the input")
        report("KP103", f"the reference output for other inputs passes the check ({described}): "
               f"{passing} of {len(pairs)} seed pairs pass, largest |y_i - y_j| = {_g(largest)}"
               f"{sample_text}; {why}", pairs_passing=passing, pairs=len(pairs),
               largest_difference=largest, same_inputs=same_inputs, sampled=sampled)

    # the float64 twin of the first seed: the reference's own rounding gap, basis of thresholds
    fp64_notes: list[str] = []
    gaps = []
    if seeds[0].get("fp64"):
        try:
            twin = load_output(result, seeds[0]["fp64"], manifest)
            _check_twin(first, twin)
            gaps.append(probes.combine([probes.gap(a.sample, b.sample)
                                        for a, b in zip(first, twin)]))
            problem.seeds[0]["fp64_gap"] = gaps[0].to_dict()
        except OutputError as exc:
            gaps = []
            fp64_notes.append(f"no usable float64 reference: {exc}")
    else:
        fp64_notes.append("no float64 reference: "
                          + (manifest.get("fp64_error") or _stopped(result, "the float64 run")))
    floating = all(c.floating for c in first)
    noise = False
    if gaps:
        problem.gap = probes.combine(gaps).to_dict()
        noise = floating and all_finite and probes.combine(gaps).rel_l2 > probes.NOISE_RELATIVE_L2
    problem.recommended = _recommend(first, gaps, floating, all_finite, noise)

    # degenerate references
    reasons = []
    if problem.stats["nonfinite"]:
        reasons.append(f"the reference output holds {problem.stats['nan']} NaN and "
                       f"{problem.stats['inf']} Inf values: allclose rejects every kernel there")
    elif max_abs == 0:
        reasons.append(f"the reference output is all zeros on {seeds_text}")
    elif problem.stats["numel"] > 1 and all(c.moments.low == c.moments.high
                                            for output in outputs for c in output):
        reasons.append("every element of the reference output has the same value")
    if same_inputs:
        reasons.append("get_inputs() returns the same inputs for every seed")
    elif count > 1 and all_finite and max_abs:
        largest = max(spread(i, j) for i, j in pairs)
        if largest <= probes.SAME_OUTPUT_RELATIVE * max_abs:
            reasons.append(f"the reference output does not change with the inputs (largest "
                           f"difference between seeds {_g(largest)}, max|y| {_g(max_abs)})")
    if noise:
        reasons.append(f"the reference output is rounding noise: the {problem.dtypes[0]} and "
                       f"float64 references differ by relative L2 {_g(problem.gap['rel_l2'])} "
                       f"(max|y| {_g(max_abs)})")
    problem.degenerate = reasons
    if reasons:
        report("KP104", "degenerate reference: " + "; ".join(reasons), reasons=len(reasons))

    # how much of the check is atol at this scale
    if floating and all_finite and max_abs and first[0].sample.numel():
        problem.absolute = probes.absolute_dominance(first[0].sample, atol, rtol)
        share, effective = problem.absolute["share"], problem.absolute["effective_rtol_at_median"]
        loose = effective is None or rtol == 0 or effective >= probes.LOOSENESS * rtol
        if share is not None and share >= 0.5 and loose:
            median = problem.absolute["median_abs"]
            allowed = "any relative error" if effective is None else \
                f"a relative error of {_g(effective)}" + \
                (f" ({effective:.0%})" if effective < 10 else "")
            report("KP201", f"atol {_g(atol)} outweighs rtol·|y| on {share:.0%} of the elements "
                   f"at this output scale (max|y| = {_g(max_abs)}, median |y| = {_g(median)}): "
                   f"the check allows {allowed} at the median element; "
                   f"{_recommendation_text(problem.recommended)}",
                   share=share, max_abs=max_abs, median_abs=median,
                   effective_rtol_at_median=effective, atol=atol, rtol=rtol,
                   recommended_rel_l2=(problem.recommended or {}).get("rel_l2"),
                   recommended_max_rel=(problem.recommended or {}).get("max_rel"))

    # input scales: conditioning
    thresholds = problem.recommended if problem.recommended and problem.recommended.get(
        "usable") and floating else None
    scale_one: dict[str, Any] = {"scale": 1.0, "ran": True}
    if problem.gap:
        scale_one.update(problem.gap)
    problem.scales.append(scale_one)
    for record in manifest.get("scales", []):
        problem.scales.append(_scale(record, first, result, manifest, thresholds, problem,
                                     report, fp64_notes))
    done = {record.get("scale") for record in manifest.get("scales", [])}
    for scale in options.scales:
        if scale != 1 and scale not in done:
            fp64_notes.append(f"input scale {scale:g} was not run: "
                              + _stopped(result, "the scaled runs"))
            problem.scales.append({"scale": scale, "ran": False})
    problem.scales.sort(key=lambda s: s["scale"])
    if fp64_notes:
        report("KP502", "conditioning not (fully) measured: " + "; ".join(fp64_notes),
               notes=len(fp64_notes))
    problem.status = "ok" if result.ok else "partial"
    if not result.ok:
        problem.error = result.describe()
    return problem


def _stats(components: list[Component]) -> dict[str, Any]:
    from kaudit.dynamic import probes

    stats = probes.Moments.merge([c.moments for c in components]).stats()
    stats["nan"] = sum(c.nan for c in components)
    stats["inf"] = sum(c.inf for c in components)
    stats["nonfinite"] = stats["nan"] + stats["inf"]
    return stats


def _scale(record: dict, first: list[Component], result: RunResult, manifest: dict,
           thresholds: dict | None, problem: ProblemResult, report: Finder,
           notes: list[str]) -> dict[str, Any]:
    from kaudit.dynamic import probes

    scale = record["scale"]
    entry: dict[str, Any] = {"scale": scale, "ran": bool(record.get("native"))}
    if record.get("error"):
        notes.append(f"input scale {scale:g} failed: {record['error']}")
        return entry
    if not record.get("native"):
        notes.append(f"input scale {scale:g} was not run: "
                     + _stopped(result, "the scaled runs"))
        return entry
    if not record.get("fp64"):
        if record.get("fp64_error") and not any("float64" in note for note in notes):
            notes.append(f"input scale {scale:g} has no float64 reference: {record['fp64_error']}")
        return entry
    native = load_output(result, record["native"], manifest)
    if [c.shape for c in native] != [c.shape for c in first]:
        notes.append(f"the output's shape changes at input scale {scale:g}: {_signature(native)}")
        return entry
    twin = load_output(result, record["fp64"], manifest)
    try:
        _check_twin(native, twin)
    except OutputError as exc:
        if not any("float64" in note for note in notes):
            notes.append(f"input scale {scale:g} has no usable float64 reference: {exc}")
        return entry
    measured = probes.combine([probes.gap(a.sample, b.sample) for a, b in zip(native, twin)])
    # NaN/Inf outside the sample of a large output: counted by the child
    native_nonfinite = max(measured.native_nonfinite,
                           sum(c.nan + c.inf for c in native) - sum(c.nan + c.inf for c in twin))
    reference_nonfinite = max(measured.reference_nonfinite, sum(c.nan + c.inf for c in twin))
    measured = probes.Gap(measured.rel_l2, measured.max_rel, native_nonfinite, reference_nonfinite)
    entry.update(measured.to_dict())
    if thresholds is None:
        return entry
    dtype = problem.dtypes[0]
    why = None
    if measured.reference_nonfinite:
        why = (f"the float64 reference itself is not finite ({measured.reference_nonfinite} "
               "NaN/Inf values): the problem is undefined there")
    elif measured.native_nonfinite:
        why = (f"the {dtype} reference has {measured.native_nonfinite} NaN/Inf values where "
               "float64 is finite (overflow)")
    elif measured.rel_l2 > thresholds["rel_l2"] or measured.max_rel > thresholds["max_rel"]:
        why = (f"the {dtype} and float64 references differ by relative L2 {_g(measured.rel_l2)} "
               f"and max error/max|y| {_g(measured.max_rel)}, beyond the recommended "
               f"{_g(thresholds['rel_l2'])} / {_g(thresholds['max_rel'])}")
    entry["ill_conditioned"] = why is not None
    if why:
        report("KP301", f"ill-conditioned at input scale {scale:g}: {why}; a kernel must not be "
               "blamed for disagreeing with the reference there", scale=scale,
               rel_l2=_finite(measured.rel_l2), max_rel=_finite(measured.max_rel),
               native_nonfinite=measured.native_nonfinite,
               reference_nonfinite=measured.reference_nonfinite)
    return entry


def _recommend(first: list, gaps: list, floating: bool, finite: bool, noise: bool
               ) -> dict[str, Any] | None:
    from kaudit.dynamic import probes

    if not floating:
        return {"rel_l2": 0.0, "max_rel": 0.0, "usable": True,
                "basis": "integer or boolean output: compare exactly"}
    if not gaps or not finite:
        return None
    measured = probes.combine(gaps)
    if not (math.isfinite(measured.rel_l2) and math.isfinite(measured.max_rel)):
        return None
    floor = max(probes.floor_for(c.sample.dtype) for c in first)
    return {
        "rel_l2": max(probes.MARGIN * measured.rel_l2, floor),
        "max_rel": max(probes.MARGIN * measured.max_rel, floor),
        "measured_rel_l2": measured.rel_l2, "measured_max_rel": measured.max_rel,
        "margin": probes.MARGIN, "floor": floor, "usable": not noise,
        "basis": (f"{probes.MARGIN:g} x the gap between the native-dtype and float64 references "
                  f"on the first seed's inputs, at least {probes.FLOOR_EPS:g} machine epsilons"),
    }


def _recommendation_text(recommended: dict | None) -> str:
    if not recommended:
        return "no scale-invariant threshold recommended (no float64 reference)"
    if not recommended.get("usable"):
        return "no threshold can judge this output: it is rounding noise"
    return (f"recommended instead: relative L2 error <= {_g(recommended['rel_l2'])} and "
            f"max|error|/max|y| <= {_g(recommended['max_rel'])}")


def _check_consistent(outputs: list[list[Component]]) -> None:
    first = outputs[0]
    for output in outputs[1:]:
        if _signature(output) != _signature(first):
            raise OutputError("the output's shape or dtype changes with the seed: "
                              f"{_signature(first)} vs {_signature(output)}")


def _check_twin(native: list[Component], twin: list[Component]) -> None:
    if [c.shape for c in native] != [c.shape for c in twin]:
        raise OutputError(f"the float64 run's output {_signature(twin)} does not match "
                          f"{_signature(native)}")
    for a, b in zip(native, twin):
        if a.floating and b.dtype != "float64":
            raise OutputError(f"the float64 run returned {b.dtype} outputs, not float64 "
                              "(does the model cast inside forward?)")


def _signature(output: list[Component]) -> str:
    return ", ".join(f"{c.dtype}{c.shape}" for c in output)


def _stopped(result: RunResult, what: str) -> str:
    if result.ok:
        return f"{what} was skipped"
    return f"{what} did not finish ({result.describe()})"


def _describe_tolerance(tolerance: Tolerance, dtype: str) -> str:
    return f"{tolerance.check_text(dtype)} for {dtype}"


def _g(value: float | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.3g}"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
