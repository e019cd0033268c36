"""The `kaudit` command: a thin typer layer over `kaudit.api`, the reporters and `kaudit.gate`."""

from __future__ import annotations

import atexit
import contextlib
import enum
import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.markup import escape
from rich.table import Column, Table

from kaudit import __version__
from kaudit.adapters.model import BENCHMARKS
from kaudit.api import scan_paths
from kaudit.report.model import Report
from kaudit.baseline import write_baseline
from kaudit.config import Config, ConfigError, load_config
from kaudit.discover import display_path
from kaudit.findings import Level
from kaudit.gate import EXIT_ERROR, FAIL_ON_CHOICES, exit_code
from kaudit.progress import DelayedProgress
from kaudit.report import json_report, text
from kaudit.report.console import make_console
from kaudit.rule import all_rules, rule_by_code
from kaudit.source import SourceModel, read_source

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Audit GPU kernels (KernelBench-style ModelNew modules) for fallbacks and integrity tricks.")
stderr = make_console(stderr=True)


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


class SandboxMode(str, enum.Enum):
    auto = "auto"
    on = "on"
    off = "off"


class ExecutorKind(str, enum.Enum):
    local = "local"
    ray = "ray"


class FailOn(str, enum.Enum):
    error = "error"
    warning = "warning"
    note = "note"
    never = "never"


assert tuple(f.value for f in FailOn) == FAIL_ON_CHOICES


Benchmark = enum.Enum("Benchmark", {name.replace("-", "_"): name for name in BENCHMARKS},
                      type=str)


class MinLevel(str, enum.Enum):
    note = "note"
    warning = "warning"
    error = "error"


#: what each format shows without --min-level: people read text and Markdown, tools the rest
DEFAULT_MIN_LEVEL = {"text": Level.WARNING, "markdown": Level.WARNING, "json": Level.NOTE,
                     "sarif": Level.NOTE}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kaudit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[Optional[bool], typer.Option(  # noqa: UP007 - typer needs Optional
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = None,
          ) -> None:
    """kaudit command line."""


def _usage_error(message: str) -> NoReturn:
    stderr.print(f"kaudit: {escape(message)}", soft_wrap=True, style="red")
    raise typer.Exit(EXIT_ERROR)


def _codes(values: list[str] | None) -> list[str]:
    return [code.strip() for value in values or [] for code in value.split(",") if code.strip()]


@app.command()
def scan(
    paths: Annotated[list[Path], typer.Argument(help="Kernel files, folders or benchmark result trees.")],
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.text,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here, not stdout.")] = None,  # noqa: UP007,E501
    output_dir: Annotated[Optional[Path], typer.Option(help="Write every format into this folder.")] = None,  # noqa: UP007,E501
    select: Annotated[Optional[list[str]], typer.Option(help="Only these codes or prefixes (KA1, KA101), comma-separated.")] = None,  # noqa: UP007,E501
    ignore: Annotated[Optional[list[str]], typer.Option(help="Skip these codes or prefixes.")] = None,  # noqa: UP007
    fail_on: Annotated[Optional[FailOn], typer.Option(help="Exit 1 when a finding is at or above this level. Default: error; never for sarif.")] = None,  # noqa: UP007,E501
    min_level: Annotated[Optional[MinLevel], typer.Option(help="Show findings at or above this level (default: warning for text and markdown, note for json and sarif); the summary counts the rest. --fail-on still counts every finding.")] = None,  # noqa: UP007,E501
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Worker processes; with --dynamic also the kernels audited at once (default 1; spread over the visible GPUs).")] = None,  # noqa: UP007,E501
    baseline: Annotated[Optional[Path], typer.Option(help="Accepted findings (`kaudit baseline write`); only new ones fail.")] = None,  # noqa: UP007,E501
    baseline_timings: Annotated[Optional[Path], typer.Option(help="baseline_time_torch.json, to turn claimed runtimes into speedups.")] = None,  # noqa: UP007,E501
    suspicious_speedup: Annotated[Optional[float], typer.Option(help="Claimed speedups above this are suspicious until confirmed (default 10).")] = None,  # noqa: UP007,E501
    benchmark: Annotated[Optional[Benchmark], typer.Option(help="Read every path as this benchmark's layout (default: recognise each layout from its files).")] = None,  # noqa: UP007,E501
    policy: Annotated[Optional[str], typer.Option(help="What a submission may keep in PyTorch: kernelbench (default: some operators, when custom kernels do real work; KA108 lists them) or strict (none).")] = None,  # noqa: UP007,E501
    cache_dir: Annotated[Path, typer.Option(help="Cache of per-file results, by content.")] = Path(".kaudit_cache"),  # noqa: E501
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,  # noqa: E501
    dynamic: Annotated[bool, typer.Option("--dynamic", help="Also run each kernel against its reference problem in child processes (needs torch).")] = False,  # noqa: E501
    device: Annotated[str, typer.Option(help="--dynamic: auto, cuda or cpu.")] = "auto",
    problem: Annotated[Optional[Path], typer.Option(help="--dynamic: the reference problem of every kernel scanned.")] = None,  # noqa: UP007,E501
    problems_root: Annotated[Optional[Path], typer.Option("--problems", help="--dynamic: KernelBench problems folder (level1/, level2/, ...) for level_<L>_problem_<P> names.")] = None,  # noqa: UP007,E501
    tolerance: Annotated[Optional[str], typer.Option(help="--dynamic: kernelbench (default), kernelbench-v0, robust-kbench, kernelbenchx, fastkernels or atrex.")] = None,  # noqa: UP007,E501
    atol: Annotated[Optional[float], typer.Option(help="--dynamic: custom absolute tolerance (with --rtol).")] = None,  # noqa: UP007,E501
    rtol: Annotated[Optional[float], typer.Option(help="--dynamic: custom relative tolerance (with --atol).")] = None,  # noqa: UP007,E501
    timeout: Annotated[float, typer.Option(help="--dynamic: seconds per child process.")] = 300.0,
    memory_limit: Annotated[Optional[str], typer.Option(help="--dynamic: address-space cap of each child on CPU runs, e.g. 24G, or none (default: the physical memory).")] = None,  # noqa: UP007,E501
    temp_limit: Annotated[Optional[str], typer.Option(help="--dynamic: temporary disk the scan's jobs may hold at once, e.g. 50G, or none (default: 80% of the free space).")] = None,  # noqa: UP007,E501
    scales: Annotated[str, typer.Option(help="--dynamic: input scale factors for the scale-fragility probe (KD301), comma-separated.")] = "1e-3,1,1e3",  # noqa: E501
    artifacts: Annotated[Optional[Path], typer.Option("--artifacts", help="--dynamic: write SVG pictures of unwritten and out-of-bounds output regions (KD101, KD103) into this folder.")] = None,  # noqa: UP007,E501
    sandbox: Annotated[SandboxMode, typer.Option("--sandbox", help="--dynamic: run every job in an OS sandbox (Linux namespaces): auto (where it works, else a warning), on (refuse to run without it) or off.")] = SandboxMode.auto,  # noqa: E501
    timing: Annotated[str, typer.Option("--timing", help="--dynamic: time each kernel that passed beside its reference (verified speedups, KD701): auto (on with CUDA), on, off, or kernelbench (KernelBench's own method).")] = "auto",  # noqa: E501
    speedup_tolerance: Annotated[float, typer.Option(help="--dynamic --timing: KD701 when a claimed speedup exceeds the measured one by more than this factor.")] = 1.5,  # noqa: E501
    build_cache: Annotated[Optional[str], typer.Option("--build-cache", help="--dynamic: the folder of compiled extensions, shared by scans and processes (default: ~/.cache/kernel-builds), or none for a temporary one.")] = None,  # noqa: UP007,E501
    stream: Annotated[Optional[Path], typer.Option("--stream", help="Write one JSON line per kernel into this file the moment its verdict is final (path, verdict, findings, seconds, status, cached).")] = None,  # noqa: UP007,E501
    executor: Annotated[ExecutorKind, typer.Option("--executor", help="--dynamic: where each kernel's audit runs: local (this machine, --jobs at a time) or ray (one Ray task per kernel, one GPU each on CUDA; needs kaudit[ray]).")] = ExecutorKind.local,  # noqa: E501
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="--executor ray: the cluster to join (HOST:PORT of `ray start --head`; default: RAY_ADDRESS, a cluster started on this machine, else a new local one).")] = None,  # noqa: UP007,E501
) -> None:
    """Scan kernel files, folders and benchmark result trees."""
    if output_dir is not None:
        _make_folder(output_dir, "--output-dir")
    options = _dynamic_options(device, problem, problems_root, tolerance, atol, rtol, timeout,
                               scales=scales, jobs=jobs, artifacts=artifacts,
                               memory_limit=memory_limit, temp_limit=temp_limit,
                               sandbox=sandbox, build_cache=build_cache,
                               timing=(timing, speedup_tolerance),
                               executor=(executor, ray_address)) if dynamic else None
    report, config = _run_scan(paths, select, ignore, jobs, baseline, baseline_timings,
                               suspicious_speedup, None if no_cache else cache_dir,
                               benchmark.value if benchmark else None, policy=policy,
                               dynamic=options, stream=stream)
    shown_from = Level(min_level.value) if min_level else None
    if output_dir is not None:
        _write_all(report, config, output_dir, shown_from)
    if output_dir is None or output is not None or output_format is not OutputFormat.text:
        _write(report, output_format, output, config, shown_from)
    if output is not None or output_dir is not None or output_format is not OutputFormat.text:
        for error in report.errors:  # the text on stdout has them; a log should have them too
            kind = "internal error" if error.internal else "error"
            stderr.print(f"kaudit: {kind}: {error.path}: {error.message}", markup=False,
                         soft_wrap=True)
    threshold = fail_on.value if fail_on else ("never" if output_format is OutputFormat.sarif else "error")
    raise typer.Exit(exit_code(report, threshold))


def _run_scan(paths: list[Path], select, ignore, jobs, baseline, timings, suspicious, cache_dir,
              benchmark: str | None = None, policy: str | None = None, dynamic=None,
              stream: Path | None = None) -> tuple[Report, Config]:
    try:
        config = load_config().with_options(
            select=_codes(select), ignore=_codes(ignore), jobs=jobs, policy=policy,
            baseline=str(baseline) if baseline else None,
            baseline_timings=str(timings) if timings else None,
            suspicious_speedup=suspicious, cache_dir=str(cache_dir) if cache_dir else None,
            benchmark=benchmark)
    except (ConfigError, ValueError) as exc:
        _usage_error(f"configuration error: {exc}")
    progress = DelayedProgress("scanning")
    kernels = DelayedProgress("running kernels")
    lines = _open_stream(stream)

    def on_kernel(outcome) -> None:
        if outcome.status is not None:
            kernels.finished(outcome.done, outcome.total, outcome.verdict.path,
                             outcome.verdict.verdict, outcome.seconds or 0.0)
        if lines is not None:
            lines.write(outcome.to_dict())

    if dynamic is not None:
        _on_sigterm()
    try:
        report = scan_paths([str(p) for p in paths], config, on_file=progress.update,
                            dynamic=dynamic, on_kernel=on_kernel)
    except (FileNotFoundError, ConfigError) as exc:
        _usage_error(str(exc))
    except Exception as exc:
        from kaudit.dynamic.selfcheck import InstallationChanged
        from kaudit.dynamic.sandbox import SandboxError

        if isinstance(exc, (SandboxError, InstallationChanged)):
            _usage_error(str(exc))
        raise
    finally:
        progress.stop()
        kernels.stop()
        if lines is not None:
            lines.close()
    for warning in report.warnings + (lines.warnings if lines is not None else []):
        stderr.print(f"kaudit: warning: {warning}", markup=False, soft_wrap=True)
    return report, config


def _open_stream(path: Path | None):
    if path is None:
        return None
    from kaudit.report.stream import JsonLines

    try:
        return JsonLines(path)
    except OSError as exc:
        _usage_error(f"--stream: cannot write {path}: {exc.strerror or exc}")


def _make_folder(folder: Path, option: str) -> None:
    """A folder to write into, made now, before the scan: a bad one is a usage error."""
    if folder.exists() and not folder.is_dir():
        _usage_error(f"{option}: not a folder: {folder}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _usage_error(f"{option}: cannot create {folder}: {exc.strerror or exc}")


def _on_sigterm() -> None:
    """SIGTERM and SIGINT kill the running jobs and unwind (temporary folders removed)."""
    from kaudit.dynamic import sandbox, scratch

    scratch.on_terminate(sandbox.kill_all)
    scratch.exit_on_sigterm()


def _jobs_ready(mode: SandboxMode) -> None:
    """Before kaudit starts jobs for benchmark problems: `selfcheck.ready_jobs` (`on` where the
    sandbox cannot be built is a usage error) and SIGTERM unwinding."""
    from kaudit.dynamic.sandbox import SandboxError
    from kaudit.dynamic.selfcheck import ready_jobs

    try:
        ready_jobs(mode.value)
    except SandboxError as exc:
        _usage_error(str(exc))
    _on_sigterm()


def _refuse_if_changed(installation) -> None:
    from kaudit.dynamic.selfcheck import InstallationChanged

    changed = installation.changed()
    if changed:
        _usage_error(str(InstallationChanged(changed)))


def _dynamic_options(device: str, problem: Path | None, problems_root: Path | None,
                     tolerance: str | None, atol: float | None, rtol: float | None,
                     timeout: float, *, scales: str, jobs: int | None, artifacts: Path | None,
                     memory_limit: str | None, temp_limit: str | None = None,
                     sandbox: SandboxMode = SandboxMode.auto, build_cache: str | None = None,
                     timing: tuple[str, float] = ("auto", 1.5),
                     executor: tuple[ExecutorKind, str | None] = (ExecutorKind.local, None)):
    """`scan --dynamic`'s options, checked before anything is scanned: a bad one is a usage
    error."""
    from kaudit.dynamic import tolerance as tolerances
    from kaudit.dynamic.options import DynamicOptions, TimingSettings, ray_missing

    if problem is not None and not problem.is_file():
        _usage_error(f"--problem: not a file: {problem}")
    if problems_root is not None and not problems_root.is_dir():
        _usage_error(f"--problems: not a folder: {problems_root}")
    if artifacts is not None and artifacts.exists() and not artifacts.is_dir():
        _usage_error(f"--artifacts: not a folder: {artifacts}")
    kind, ray_address = executor
    if ray_address is not None and kind is not ExecutorKind.ray:
        _usage_error("--ray-address needs --executor ray")
    if kind is ExecutorKind.ray and ray_missing():
        _usage_error(ray_missing())
    try:
        from kaudit.dynamic.limits import parse_memory_limit, parse_temp_limit
        from kaudit.dynamic.problems_cli import parse_scales

        chosen = tolerances.resolve(tolerance, atol, rtol)
        scale_factors = parse_scales(scales)
        memory = parse_memory_limit(memory_limit) if memory_limit is not None else None
        temp = parse_temp_limit(temp_limit) if temp_limit is not None else None
        timing_settings = TimingSettings(timing[0], speedup_tolerance=timing[1])
    except ValueError as exc:
        _usage_error(str(exc))
    builds = {} if build_cache is None else \
        {"extensions_dir": None if build_cache.lower() == "none" else build_cache}
    return DynamicOptions(chosen, device, str(problem) if problem else None,
                          str(problems_root) if problems_root else None, timeout,
                          scales=scale_factors, jobs=jobs or 1,
                          artifacts_dir=str(artifacts) if artifacts else None,
                          memory_limit=memory, temp_limit=temp, sandbox=sandbox.value,
                          timing=timing_settings,
                          benchmark_checks=tolerance is None and atol is None and rtol is None,
                          executor=kind.value, ray_address=ray_address, **builds)


def _shown(report: Report, output_format: OutputFormat, shown_from: Level | None) -> Report:
    return report.at_least(shown_from or DEFAULT_MIN_LEVEL[output_format.value])


def _render(report: Report, output_format: OutputFormat, config: Config,
            folder: Path | None = None, shown_from: Level | None = None) -> str:
    """`folder`: where the output goes (Markdown links to pictures are relative to it)."""
    report = _shown(report, output_format, shown_from)
    if output_format is OutputFormat.json:
        return json_report.render(report)
    if output_format is OutputFormat.sarif:
        from kaudit.report import sarif

        return sarif.render_scan(report, config.is_enabled)
    if output_format is OutputFormat.markdown:
        from kaudit.report import markdown

        return markdown.render(report, str(folder) if folder is not None else None)
    buffer = io.StringIO()
    text.render(report, make_console(file=buffer, no_color=True, width=140))
    return buffer.getvalue()


def _write(report: Report, output_format: OutputFormat, output: Path | None, config: Config,
           shown_from: Level | None) -> None:
    if output_format is OutputFormat.text and output is None:
        console = make_console()
        if not console.is_terminal:
            console = make_console(width=140)  # tables need room in logs and pipes
        text.render(_shown(report, output_format, shown_from), console)
        return
    content = _render(report, output_format, config, output.parent if output else None,
                      shown_from)
    if output is None:
        sys.stdout.write(content)
    else:
        _write_file(output, content)
        stderr.print(text.summary(_shown(report, output_format, shown_from)), markup=False,
                     soft_wrap=True)


def _write_file(path: Path, content: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    except OSError as exc:
        _usage_error(f"cannot write {path}: {exc.strerror or exc}")


def _write_all(report: Report, config: Config, folder: Path, shown_from: Level | None) -> None:
    """Every format at once; SARIF per category, so GitHub accepts each upload."""
    names = {OutputFormat.text: "kaudit.txt", OutputFormat.json: "kaudit.json",
             OutputFormat.sarif: "kaudit-static.sarif", OutputFormat.markdown: "kaudit.md"}
    for output_format, name in names.items():
        if output_format is OutputFormat.sarif:  # one SARIF file per category
            from kaudit.report import sarif

            shown = _shown(report, output_format, shown_from)
            for run in sarif.scan_runs(shown, config.is_enabled):
                audit = run["automationDetails"]["id"].split("/")[1]
                _write_file(folder / f"kaudit-{audit}.sarif", sarif.dumps(sarif.log([run])))
        else:
            _write_file(folder / name, _render(report, output_format, config, folder, shown_from))
    stderr.print(f"{text.summary(_shown(report, OutputFormat.text, shown_from))}; reports in "
                 f"{folder}/", markup=False, soft_wrap=True)


class GraphFormat(str, enum.Enum):
    text = "text"
    dot = "dot"


@app.command()
def graph(
    file: Annotated[Path, typer.Argument(help="One kernel file.")],
    output_format: Annotated[GraphFormat, typer.Option("--format", "-f")] = GraphFormat.text,
) -> None:
    """Print the kernel graph: forward -> helpers -> extension -> host code -> kernels."""
    if not file.is_file():
        _usage_error(f"not a file: {file}")
    text_, problem = read_source(file)
    model = SourceModel(display_path(str(file)), text_, problem)
    if model.problem is not None:
        _usage_error(f"{model.path}:{model.problem.line}: {model.problem.message}")
    from kaudit.graph import KernelGraph, render_dot, render_text  # networkx: only here

    kernel_graph = KernelGraph.of(model)
    sys.stdout.write(render_dot(kernel_graph) if output_format is GraphFormat.dot
                     else render_text(kernel_graph))


@app.command("rules")
def list_rules(
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="text, json or markdown (the README's table)")] = OutputFormat.text,  # noqa: E501
) -> None:
    """List every rule: code, name, level, precision, summary."""
    rows = [{"code": r.code, "name": r.name, "level": r.level.value, "precision": r.precision.value,
             "family": r.family(), "tags": list(r.tags), "summary": r.docs().summary}
            for r in all_rules()]
    if output_format is OutputFormat.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if output_format is OutputFormat.markdown:
        from kaudit.report.markdown import rules_table

        sys.stdout.write(rules_table(all_rules()))
        return
    if output_format is not OutputFormat.text:
        _usage_error("`kaudit rules --format` is text, json or markdown")
    console = make_console()
    console.print(_rules_table(rows, console.width))


#: the summary column's narrowest useful width; level and precision give way to it
_SUMMARY_WIDTH = 32


def _rules_table(rows: list[dict], width: int) -> Table:
    """The rules as a table that fits `width` columns: names never cut, summaries wrapped;
    precision, then level, are left out when there is no room for them."""
    name_width = max(len(row["name"]) for row in rows)
    wanted = ["code", "name", "level", "precision"]
    fixed = {"code": 5, "name": name_width, "level": 7, "precision": 9}
    while len(wanted) > 2 and \
            sum(fixed[c] for c in wanted) + 3 * (len(wanted) + 1) + _SUMMARY_WIDTH > width:
        wanted.pop()
    table = Table(*(Column(c, no_wrap=True, min_width=fixed[c]) for c in wanted),
                  Column("summary", overflow="fold", ratio=1))
    for row in rows:
        table.add_row(*(escape(row[c]) for c in wanted), escape(row["summary"]))
    return table


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A rule code, e.g. KA101.")]) -> None:
    """Show a rule's documentation."""
    rule = rule_by_code(code)
    if rule is None:
        _usage_error(f"unknown rule code {code!r}; `kaudit rules` lists them")
    header = f"# {rule.code} {rule.name}\n\nlevel: {rule.level.value} · precision: " \
             f"{rule.precision.value} · family: {rule.family()}\n\n"
    console = make_console()
    if console.is_terminal:
        from rich.markdown import Markdown

        console.print(Markdown(header + rule.docs().markdown))
    else:
        sys.stdout.write(header + rule.docs().markdown + "\n")


@app.command("fix")
def fix_command(
    paths: Annotated[list[Path], typer.Argument(help="Kernel files or folders.")],
    select: Annotated[Optional[list[str]], typer.Option(help="Only these codes or prefixes (KA201, KA4). Without it: the fixes of errors and warnings, and unused suppressions.")] = None,  # noqa: UP007,E501
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff of the fixes; write nothing (exit 1 if there is one).")] = False,  # noqa: E501
    add_suppressions: Annotated[bool, typer.Option("--add-suppressions", help="Instead of fixing, add `# kaudit: ignore[CODE]` on each finding's line.")] = False,  # noqa: E501
) -> None:
    """Apply the safe fixes (KA004, KA201, KA308, KA401), keeping formatting and comments."""
    from kaudit.fix.command import run_fix  # libcst: only here

    try:
        config = load_config().with_options(select=_codes(select))
        code = run_fix([str(p) for p in paths], config, _codes(select), diff=diff,
                       suppress=add_suppressions, out=sys.stdout, err=sys.stderr)
    except (ConfigError, ValueError) as exc:
        _usage_error(f"configuration error: {exc}")
    except FileNotFoundError as exc:
        _usage_error(str(exc))
    raise typer.Exit(code)


baseline_app = typer.Typer(help="Accept the current findings, so that only new ones fail.",
                           no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("write")
def baseline_write(
    paths: Annotated[list[Path], typer.Argument(help="What to scan, as `kaudit scan` would.")],
    output: Annotated[Path, typer.Option("--output", "-o")] = Path("kaudit-baseline.json"),
    select: Annotated[Optional[list[str]], typer.Option()] = None,  # noqa: UP007
    ignore: Annotated[Optional[list[str]], typer.Option()] = None,  # noqa: UP007
) -> None:
    """Scan and write the findings as a baseline for `kaudit scan --baseline`."""
    report, _config = _run_scan(paths, select, ignore, None, None, None, None, None)
    count = write_baseline(report.findings, str(output))
    stderr.print(f"kaudit: {count} findings written to {output}", markup=False, soft_wrap=True)


@app.command()
def problems(
    paths: Annotated[list[Path], typer.Argument(help="KernelBench problem files (class Model, get_inputs, get_init_inputs) or folders of them.")],  # noqa: E501
    tolerance: Annotated[Optional[str], typer.Option(help="The check to audit: kernelbench (default: 1e-4 fp32, 1e-2 fp16/bf16), kernelbench-v0 (1e-2), robust-kbench (1e-5), kernelbenchx (1e-5 fp32, 5e-3 fp16/bf16), fastkernels (99 % of elements within 1e-5+1e-3|ref| fp32, 1e-2 fp16/bf16), atrex (atol 1e-2, rtol 0.05 in float64).")] = None,  # noqa: UP007,E501
    atol: Annotated[Optional[float], typer.Option(help="A custom check: absolute tolerance (with --rtol).")] = None,  # noqa: UP007,E501
    rtol: Annotated[Optional[float], typer.Option(help="A custom check: relative tolerance (with --atol).")] = None,  # noqa: UP007,E501
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    seeds: Annotated[int, typer.Option(min=1, help="Input seeds per problem.")] = 3,
    scales: Annotated[str, typer.Option(help="Input scale factors for the conditioning probe.")] = "1e-3,1,1e3",  # noqa: E501
    timeout: Annotated[float, typer.Option(help="Seconds per problem before its process is killed.")] = 300.0,  # noqa: E501
    memory_limit: Annotated[Optional[str], typer.Option(help="Address-space cap of each problem's process on CPU runs, e.g. 24G, or none (default: the physical memory).")] = None,  # noqa: UP007,E501
    temp_limit: Annotated[Optional[str], typer.Option(help="Temporary disk the problems' processes may hold at once, e.g. 50G, or none (default: 80% of the free space).")] = None,  # noqa: UP007,E501
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Problems run at once (on one GPU they share its memory).")] = 1,  # noqa: E501
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.text,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here, not stdout.")] = None,  # noqa: UP007,E501
    fail_on: Annotated[Optional[FailOn], typer.Option(help="Exit 1 when a finding is at or above this level. Default: error; never for sarif.")] = None,  # noqa: UP007,E501
    sandbox: Annotated[SandboxMode, typer.Option("--sandbox", help="Run every problem in an OS sandbox (Linux namespaces): auto, on or off.")] = SandboxMode.auto,  # noqa: E501
    stream: Annotated[Optional[Path], typer.Option("--stream", help="Write one JSON line per problem into this file the moment it ends (path, verdict: its worst finding's level, status, findings, seconds).")] = None,  # noqa: UP007,E501
) -> None:
    """Audit benchmark problems: can their correctness check tell a real kernel from a trivial
    one? Each problem runs in a child process; needs torch (the `dynamic` extra)."""
    from kaudit.dynamic.problems_cli import (  # torch: only here
        ProblemsUsageError,
        run_command,
    )

    from kaudit.dynamic.selfcheck import Installation

    _jobs_ready(sandbox)
    # kaudit's code imported and fingerprinted once the problems are found, the sizing job
    # starting beside it (`audit_problems`)
    installation: list[Installation] = []
    try:
        code = run_command(paths, tolerance=tolerance, atol=atol, rtol=rtol, device=device,
                           seeds=seeds, scales=scales, timeout=timeout, jobs=jobs,
                           memory_limit=memory_limit, temp_limit=temp_limit,
                           output_format=output_format.value, output=output,
                           fail_on=fail_on.value if fail_on else None,
                           before_jobs=lambda: installation.append(Installation.before_jobs()),
                           before_output=lambda: _refuse_if_changed(installation[0]),
                           stream=stream)
    except ProblemsUsageError as exc:
        _usage_error(str(exc))
    raise typer.Exit(code)


def main() -> None:
    try:
        app()
    except Exception as exc:  # pragma: no cover - the last guard against a traceback
        stderr.print(f"kaudit: internal error: {exc.__class__.__name__}: {escape(str(exc))}",
                     soft_wrap=True)
        sys.exit(EXIT_ERROR)


def command() -> NoReturn:
    """The `kaudit` command and `python -m kaudit`: `main`, then `leave` (a program that calls
    `main` itself gets its SystemExit, as before)."""
    try:
        main()
    except SystemExit as exit_:
        leave(exit_.code)
    leave(0)


def leave(code: object) -> NoReturn:
    """Exit as `sys.exit(code)` would, less the interpreter's teardown: the threads joined, the
    atexit handlers run (temporary folders, the fork server) and the output flushed, then the
    process ends. With torch loaded the teardown took 0.4 s after `import torch` and 0.6-1.2 s
    after a dynamic pass's imports, on two cores: time every such command spent after its
    report was written."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message, and 1
        print(code, file=sys.stderr)
        status = 1
    # what the interpreter does at exit, in its order: idle pool workers woken and threads
    # joined, then the atexit handlers
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except Exception as exc:  # noqa: BLE001 - the report did not get out: not a success
        if not isinstance(exc, BrokenPipeError):
            with contextlib.suppress(Exception):
                print(f"kaudit: could not write the output: {exc}", file=sys.stderr)
        status = status or 120  # the interpreter's status for output it could not flush
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(status & 0xFF)
