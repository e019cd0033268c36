"""The `kaudit` command: a thin typer layer over `kaudit.api`, the reporters and `kaudit.gate`."""

from __future__ import annotations

import enum
import io
import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kaudit import __version__
from kaudit.api import Report, scan_paths
from kaudit.baseline import write_baseline
from kaudit.config import Config, ConfigError, load_config
from kaudit.discover import display_path
from kaudit.gate import EXIT_ERROR, FAIL_ON_CHOICES, exit_code
from kaudit.progress import DelayedProgress
from kaudit.report import json_report, text
from kaudit.rule import all_rules, rule_by_code
from kaudit.source import SourceModel, read_source

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Audit GPU kernels (KernelBench-style ModelNew modules) for fallbacks and integrity tricks.")
stderr = Console(stderr=True)


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


class SandboxMode(str, enum.Enum):
    auto = "auto"
    on = "on"
    off = "off"


class FailOn(str, enum.Enum):
    error = "error"
    warning = "warning"
    note = "note"
    never = "never"


assert tuple(f.value for f in FailOn) == FAIL_ON_CHOICES


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
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Worker processes; with --dynamic also the kernels audited at once (default 1; spread over the visible GPUs).")] = None,  # noqa: UP007,E501
    baseline: Annotated[Optional[Path], typer.Option(help="Accepted findings (`kaudit baseline write`); only new ones fail.")] = None,  # noqa: UP007,E501
    baseline_timings: Annotated[Optional[Path], typer.Option(help="baseline_time_torch.json, to turn claimed runtimes into speedups.")] = None,  # noqa: UP007,E501
    suspicious_speedup: Annotated[Optional[float], typer.Option(help="Claimed speedups above this are suspicious until confirmed (default 10).")] = None,  # noqa: UP007,E501
    cache_dir: Annotated[Path, typer.Option(help="Cache of per-file results, by content.")] = Path(".kaudit_cache"),  # noqa: E501
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,  # noqa: E501
    dynamic: Annotated[bool, typer.Option("--dynamic", help="Also run each kernel against its reference problem in child processes (needs torch).")] = False,  # noqa: E501
    device: Annotated[str, typer.Option(help="--dynamic: auto, cuda or cpu.")] = "auto",
    problem: Annotated[Optional[Path], typer.Option(help="--dynamic: the reference problem of every kernel scanned.")] = None,  # noqa: UP007,E501
    problems_root: Annotated[Optional[Path], typer.Option("--problems", help="--dynamic: KernelBench problems folder (level1/, level2/, ...) for level_<L>_problem_<P> names.")] = None,  # noqa: UP007,E501
    tolerance: Annotated[Optional[str], typer.Option(help="--dynamic: kernelbench (default), kernelbench-v0 or robust-kbench.")] = None,  # noqa: UP007,E501
    atol: Annotated[Optional[float], typer.Option(help="--dynamic: custom absolute tolerance (with --rtol).")] = None,  # noqa: UP007,E501
    rtol: Annotated[Optional[float], typer.Option(help="--dynamic: custom relative tolerance (with --atol).")] = None,  # noqa: UP007,E501
    timeout: Annotated[float, typer.Option(help="--dynamic: seconds per child process.")] = 300.0,
    scales: Annotated[str, typer.Option(help="--dynamic: input scale factors for the scale-fragility probe (KD301), comma-separated.")] = "1e-3,1,1e3",  # noqa: E501
    artifacts: Annotated[Optional[Path], typer.Option("--artifacts", help="--dynamic: write SVG pictures of unwritten and out-of-bounds output regions (KD101, KD103) into this folder.")] = None,  # noqa: UP007,E501
    sandbox: Annotated[SandboxMode, typer.Option("--sandbox", help="--dynamic: run every job in an OS sandbox (Linux namespaces): auto (where it works, else a warning), on (refuse to run without it) or off.")] = SandboxMode.auto,  # noqa: E501
) -> None:
    """Scan kernel files, folders and benchmark result trees."""
    report, config = _run_scan(paths, select, ignore, jobs, baseline, baseline_timings,
                               suspicious_speedup, None if no_cache else cache_dir)
    if dynamic:
        _run_dynamic(paths, report, config, device, problem, problems_root, tolerance, atol, rtol,
                     timeout, scales=scales, jobs=jobs, artifacts=artifacts, sandbox=sandbox)
    if output_dir is not None:
        _write_all(report, config, output_dir)
    if output_dir is None or output is not None or output_format is not OutputFormat.text:
        _write(report, output_format, output, config)
    threshold = fail_on.value if fail_on else ("never" if output_format is OutputFormat.sarif else "error")
    raise typer.Exit(exit_code(report, threshold))


def _run_scan(paths: list[Path], select, ignore, jobs, baseline, timings, suspicious, cache_dir
              ) -> tuple[Report, Config]:
    try:
        config = load_config().with_options(
            select=_codes(select), ignore=_codes(ignore), jobs=jobs,
            baseline=str(baseline) if baseline else None,
            baseline_timings=str(timings) if timings else None,
            suspicious_speedup=suspicious, cache_dir=str(cache_dir) if cache_dir else None)
    except (ConfigError, ValueError) as exc:
        _usage_error(f"configuration error: {exc}")
    progress = DelayedProgress("scanning")
    try:
        report = scan_paths([str(p) for p in paths], config, on_file=progress.update)
    except (FileNotFoundError, ConfigError) as exc:
        _usage_error(str(exc))
    finally:
        progress.stop()
    return report, config


def _jobs_guarded(mode: SandboxMode):
    """Before kaudit runs benchmark code: the sandbox mode (`on` where it cannot be built is a
    usage error), stale temporary folders of killed runs removed, SIGTERM unwinding (running jobs
    killed, temporary folders removed), and kaudit's own code imported and fingerprinted. Returns
    the fingerprint, for `_refuse_if_changed`."""
    from kaudit.dynamic import sandbox, scratch
    from kaudit.dynamic.selfcheck import Installation

    sandbox.set_mode(mode.value)
    try:
        sandbox.active()
    except sandbox.SandboxError as exc:
        _usage_error(str(exc))
    scratch.remove_stale()
    scratch.on_terminate(sandbox.kill_all)
    scratch.exit_on_sigterm()
    return Installation.before_jobs()


def _refuse_if_changed(installation) -> None:
    changed = installation.changed()
    if changed:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        _usage_error(f"refusing to report: kaudit's own installed code changed during the dynamic "
                     f"pass ({shown}); a job may have edited it. Reinstall kaudit and scan again "
                     "with --sandbox on")


def _run_dynamic(paths: list[Path], report: Report, config: Config, device: str,
                 problem: Path | None, problems_root: Path | None, tolerance: str | None,
                 atol: float | None, rtol: float | None, timeout: float, *, scales: str,
                 jobs: int | None, artifacts: Path | None,
                 sandbox: SandboxMode = SandboxMode.auto) -> None:
    from kaudit.dynamic import tolerance as tolerances  # torch: only from here on
    from kaudit.dynamic.problems_cli import parse_scales

    if problem is not None and not problem.is_file():
        _usage_error(f"--problem: not a file: {problem}")
    if problems_root is not None and not problems_root.is_dir():
        _usage_error(f"--problems: not a folder: {problems_root}")
    if artifacts is not None and artifacts.exists() and not artifacts.is_dir():
        _usage_error(f"--artifacts: not a folder: {artifacts}")
    try:
        chosen = tolerances.resolve(tolerance, atol, rtol)
        scale_factors = parse_scales(scales)
    except ValueError as exc:
        _usage_error(str(exc))
    try:
        from kaudit.dynamic.kernels import DynamicOptions, run_dynamic
    except ImportError as exc:
        _usage_error(f"--dynamic needs torch (the `dynamic` extra): {exc}")
    options = DynamicOptions(chosen, device, str(problem) if problem else None,
                             str(problems_root) if problems_root else None, timeout,
                             scales=scale_factors, jobs=jobs or 1,
                             artifacts_dir=str(artifacts) if artifacts else None)
    installation = _jobs_guarded(sandbox)
    try:
        run_dynamic([str(p) for p in paths], report, options, config)
    except ValueError as exc:
        _usage_error(str(exc))
    _refuse_if_changed(installation)


def _dynamic_sarif(report: Report, static: str, config: Config) -> str:
    """The static SARIF log with a second run, category kaudit/dynamic/, for dynamic findings."""
    from kaudit.report import sarif

    log = json.loads(static)
    dynamic = json.loads(sarif.render(report, [r for r in all_rules() if r.audit == "dynamic"
                                               and config.is_enabled(r.code)],
                                      category="kaudit/dynamic/"))
    log["runs"].append(dynamic["runs"][0])
    return json.dumps(log, indent=2) + "\n"


def _render(report: Report, output_format: OutputFormat, config: Config,
            folder: Path | None = None) -> str:
    """`folder`: where the output goes (Markdown links to pictures are relative to it)."""
    if output_format is OutputFormat.json:
        return json_report.render(report)
    if output_format is OutputFormat.sarif:
        from kaudit.report import sarif

        static = sarif.render(report, [r for r in all_rules()
                                       if r.audit == "static" and config.is_enabled(r.code)])
        return _dynamic_sarif(report, static, config) if "dynamic" in report.summary else static
    if output_format is OutputFormat.markdown:
        from kaudit.report import markdown

        return markdown.render(report, str(folder) if folder is not None else None)
    buffer = io.StringIO()
    text.render(report, Console(file=buffer, no_color=True, highlight=False, width=140))
    return buffer.getvalue()


def _write(report: Report, output_format: OutputFormat, output: Path | None, config: Config) -> None:
    if output_format is OutputFormat.text and output is None:
        console = Console(highlight=False)
        if not console.is_terminal:
            console = Console(highlight=False, width=140)  # tables need room in logs and pipes
        text.render(report, console)
        return
    content = _render(report, output_format, config, output.parent if output else None)
    if output is None:
        sys.stdout.write(content)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(content, encoding="utf-8")
        stderr.print(text.summary(report), highlight=False)


def _write_all(report: Report, config: Config, folder: Path) -> None:
    """Every format at once; SARIF per category, so GitHub accepts each upload."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {OutputFormat.text: "kaudit.txt", OutputFormat.json: "kaudit.json",
             OutputFormat.sarif: "kaudit-static.sarif", OutputFormat.markdown: "kaudit.md"}
    for output_format, name in names.items():
        (folder / name).write_text(_render(report, output_format, config, folder),
                                   encoding="utf-8")
    if "dynamic" in report.summary:  # one SARIF file per category
        log = json.loads((folder / names[OutputFormat.sarif]).read_text(encoding="utf-8"))
        for name, runs in (("kaudit-static.sarif", log["runs"][:1]),
                           ("kaudit-dynamic.sarif", log["runs"][1:])):
            (folder / name).write_text(json.dumps({**log, "runs": runs}, indent=2) + "\n",
                                       encoding="utf-8")
    stderr.print(f"{text.summary(report)}; reports in {folder}/", highlight=False)


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
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="text or json")] = OutputFormat.text,  # noqa: E501
) -> None:
    """List every rule: code, name, level, precision, summary."""
    rows = [{"code": r.code, "name": r.name, "level": r.level.value, "precision": r.precision.value,
             "family": r.family(), "tags": list(r.tags), "summary": r.docs().summary}
            for r in all_rules()]
    if output_format is OutputFormat.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if output_format is OutputFormat.sarif:
        _usage_error("`kaudit rules --format` is text or json")
    table = Table("code", "name", "level", "precision", "summary")
    for row in rows:
        table.add_row(row["code"], row["name"], row["level"], row["precision"], row["summary"])
    Console().print(table)


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A rule code, e.g. KA101.")]) -> None:
    """Show a rule's documentation."""
    rule = rule_by_code(code)
    if rule is None:
        _usage_error(f"unknown rule code {code!r}; `kaudit rules` lists them")
    header = f"# {rule.code} {rule.name}\n\nlevel: {rule.level.value} · precision: " \
             f"{rule.precision.value} · family: {rule.family()}\n\n"
    console = Console()
    if console.is_terminal:
        from rich.markdown import Markdown

        console.print(Markdown(header + rule.docs().markdown))
    else:
        sys.stdout.write(header + rule.docs().markdown + "\n")


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
    stderr.print(f"kaudit: {count} findings written to {output}", highlight=False)


@app.command()
def problems(
    paths: Annotated[list[Path], typer.Argument(help="KernelBench problem files (class Model, get_inputs, get_init_inputs) or folders of them.")],  # noqa: E501
    tolerance: Annotated[Optional[str], typer.Option(help="The check to audit: kernelbench (default: 1e-4 fp32, 1e-2 fp16/bf16), kernelbench-v0 (1e-2), robust-kbench (1e-5).")] = None,  # noqa: UP007,E501
    atol: Annotated[Optional[float], typer.Option(help="A custom check: absolute tolerance (with --rtol).")] = None,  # noqa: UP007,E501
    rtol: Annotated[Optional[float], typer.Option(help="A custom check: relative tolerance (with --atol).")] = None,  # noqa: UP007,E501
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    seeds: Annotated[int, typer.Option(min=1, help="Input seeds per problem.")] = 3,
    scales: Annotated[str, typer.Option(help="Input scale factors for the conditioning probe.")] = "1e-3,1,1e3",  # noqa: E501
    timeout: Annotated[float, typer.Option(help="Seconds per problem before its process is killed.")] = 300.0,  # noqa: E501
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Problems run at once (on one GPU they share its memory).")] = 1,  # noqa: E501
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.text,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here, not stdout.")] = None,  # noqa: UP007,E501
    fail_on: Annotated[Optional[FailOn], typer.Option(help="Exit 1 when a finding is at or above this level. Default: error; never for sarif.")] = None,  # noqa: UP007,E501
    sandbox: Annotated[SandboxMode, typer.Option("--sandbox", help="Run every problem in an OS sandbox (Linux namespaces): auto, on or off.")] = SandboxMode.auto,  # noqa: E501
) -> None:
    """Audit benchmark problems: can their correctness check tell a real kernel from a trivial
    one? Each problem runs in a child process; needs torch (the `dynamic` extra)."""
    from kaudit.dynamic.problems_cli import (  # torch: only here
        ProblemsUsageError,
        run_command,
    )

    installation = _jobs_guarded(sandbox)
    try:
        code = run_command(paths, tolerance=tolerance, atol=atol, rtol=rtol, device=device,
                           seeds=seeds, scales=scales, timeout=timeout, jobs=jobs,
                           output_format=output_format.value, output=output,
                           fail_on=fail_on.value if fail_on else None,
                           before_output=lambda: _refuse_if_changed(installation))
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
