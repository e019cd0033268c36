"""The body of `kaudit problems` (kaudit/cli.py holds only its option declarations): option
checks, the progress bar, output and the exit code."""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Callable
from pathlib import Path

from kaudit.gate import exit_code
from kaudit.progress import DelayedProgress
from kaudit.report.console import make_console

FORMATS = ("text", "json", "sarif", "markdown")


class ProblemsUsageError(ValueError):
    """A bad option or path: the CLI prints it and exits 2."""


def parse_scales(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise ProblemsUsageError(f"--scales: not a comma-separated list of numbers: {text!r}") \
            from exc
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise ProblemsUsageError("--scales: give positive, finite factors, e.g. 1e-3,1,1e3")
    return tuple(dict.fromkeys(values))


def stream_line(problem) -> dict:
    """A problem's line of `--stream`: its worst finding's level stands for the verdict."""
    levels = {f.level.value for f in problem.findings}
    worst = next((level for level in ("error", "warning", "note") if level in levels), "clean")
    return {"path": problem.path, "verdict": worst, "status": problem.status,
            "findings": [f.to_dict() for f in problem.findings],
            "seconds": round(problem.wall_s, 3),
            **({"gpu_wait_s": problem.gpu_wait_s} if problem.gpu_wait_s else {}),
            **({"job_seconds": problem.job_seconds} if problem.job_seconds else {}),
            **({"gpu_step_peaks": problem.gpu_step_peaks} if problem.gpu_step_peaks else {}),
            **({"started_s": problem.started_s} if problem.started_s is not None else {}),
            **({"retried_alone_on_gpu": True} if problem.retried_alone_on_gpu else {}),
            **{key: value for key in ("gpu_need", "gpu_peak_bytes", "gpu_total_bytes", "gpu_runs")
               if (value := getattr(problem, key)) is not None}}


def run_command(paths: list[Path], *, tolerance: str | None, atol: float | None,
                rtol: float | None, device: str, seeds: int, scales: str, timeout: float,
                jobs: int, output_format: str, output: Path | None, fail_on: str | None,
                memory_limit: str | None = None, temp_limit: str | None = None,
                before_jobs: Callable[[], None] = lambda: None,
                before_output: Callable[[], None] = lambda: None,
                stream: Path | None = None) -> int:
    """`before_jobs`: called before any problem's code runs (`audit_problems`; the CLI's
    preload and fingerprint of kaudit's own code). `before_output`: called once every problem
    ran, before anything is written (the CLI's check that kaudit's own code did not change).
    `stream`: a file that gets one JSON line per problem as it ends."""
    from kaudit.dynamic.limits import parse_memory_limit, parse_temp_limit
    from kaudit.dynamic.tolerance import resolve

    try:
        chosen = resolve(tolerance, atol, rtol)
        memory = parse_memory_limit(memory_limit) if memory_limit is not None else None
        temp = parse_temp_limit(temp_limit) if temp_limit is not None else None
    except ValueError as exc:
        raise ProblemsUsageError(str(exc)) from exc
    if seeds < 1 or timeout <= 0 or jobs < 1:
        raise ProblemsUsageError("--seeds and --jobs must be at least 1, --timeout positive")
    if output_format not in FORMATS:
        raise ProblemsUsageError(f"--format must be one of {', '.join(FORMATS)}")
    try:
        import torch  # noqa: F401 - the parent needs torch to load and compare outputs
    except ImportError as exc:
        raise ProblemsUsageError("`kaudit problems` needs PyTorch: pip install 'kaudit[dynamic]'"
                                 ) from exc
    from kaudit.dynamic import problems_report
    from kaudit.dynamic.problems import Options, audit_problems

    options = Options(chosen, device=device, seeds=seeds, scales=parse_scales(scales),
                      timeout=timeout, jobs=jobs, memory_limit=memory, temp_limit=temp,
                      benchmark_checks=tolerance is None and atol is None and rtol is None)
    progress = DelayedProgress("running problems")
    lines = None
    if stream is not None:
        from kaudit.report.stream import JsonLines

        try:
            lines = JsonLines(stream)
        except OSError as exc:
            raise ProblemsUsageError(f"--stream: cannot write {stream}: {exc.strerror or exc}"
                                     ) from exc

    def finished(done: int, total: int, problem) -> None:
        progress.finished(done, total, problem.path, ",".join(problem.codes()) or "no findings",
                          problem.wall_s)
        if lines is not None:
            lines.write(stream_line(problem))

    try:
        report = audit_problems([str(p) for p in paths], options, on_problem=finished,
                                before_jobs=before_jobs)
    except (FileNotFoundError, ValueError) as exc:
        raise ProblemsUsageError(str(exc)) from exc
    finally:
        progress.stop()
        if lines is not None:
            lines.close()
            for warning in lines.warnings:
                make_console(stderr=True).print(f"kaudit: warning: {warning}", markup=False,
                                                soft_wrap=True)
    before_output()

    if output_format == "text" and output is None:
        console = make_console()
        if not console.is_terminal:
            console = make_console(width=160)
        problems_report.render_text(report, console)
    else:
        if output_format == "json":
            content = problems_report.render_json(report)
        elif output_format == "sarif":
            content = problems_report.render_sarif(report)
        elif output_format == "markdown":
            content = problems_report.render_markdown(report)
        else:
            buffer = io.StringIO()
            problems_report.render_text(report, make_console(file=buffer, width=160,
                                                             no_color=True))
            content = buffer.getvalue()
        if output is None:
            sys.stdout.write(content)
        else:
            try:
                output.write_text(content, encoding="utf-8")
            except OSError as exc:
                raise ProblemsUsageError(f"cannot write {output}: {exc.strerror or exc}") from exc
            make_console(stderr=True).print(problems_report.summary_lines(report)[-1],
                                            markup=False, soft_wrap=True)
    threshold = fail_on or ("never" if output_format == "sarif" else "error")
    return exit_code(report.as_scan_report(), threshold)


