"""`kaudit fix`: the fix suite generated from the fixtures (each fixable rule's `bad_x.py` becomes
`bad_x.fixed.py`, which re-scans clean, parses and stays as it is on a second run; honest code is
never touched), the engine's guarantees, the command, `--add-suppressions` and the reports'
fixes."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kaudit import Config, scan_paths, scan_source
from kaudit.config import code_matches
from kaudit.fix.edits import Edit, Fix, apply_edits
from kaudit.fix.engine import fix_text, fixes_of_text
from kaudit.fix.report import fixed_by_default
from kaudit.fix.suppress import add_suppressions
from kaudit.rule import all_rules, rule_by_code
from tests.conftest import FIXED_SUFFIX, FIXTURES, ROOT, RULE_FIXTURES, fixture_policy, rule_fixtures

FIXABLE = [rule.code for rule in all_rules() if rule.fixable()]
BAD = [p for p in rule_fixtures() if p.parent.name in FIXABLE and p.name.startswith("bad_")]
HONEST = sorted((FIXTURES / "honest").glob("*.py")) + \
    [p for p in rule_fixtures() if p.name.startswith("good_")] + \
    sorted((FIXTURES / "dynamic").glob("good_*/*.py"))


def fixed_path(fixture: Path) -> Path:
    return fixture.with_name(fixture.stem + FIXED_SUFFIX)


def only(*codes: str):
    return lambda finding: any(code_matches(code, finding.rule) for code in codes)


def display(path: Path) -> str:
    return str(path.relative_to(ROOT))


def config_of(fixture: Path) -> Config:
    return Config(policy=fixture_policy(fixture))


def test_the_fixable_rules():
    assert FIXABLE == ["KA004", "KA201", "KA308", "KA401"]
    assert all(fixed_path(p).exists() for p in BAD if p.parent.name != "KA401")


@pytest.mark.parametrize("fixture", BAD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bad_fixture_becomes_its_fixed_form(fixture):
    """`bad_x.fixed.py` is what fixing the rule's findings makes of `bad_x.py`; without one, the
    fixture's findings of that rule have no fix (KA401's half-precision casts)."""
    text = fixture.read_text(encoding="utf-8")
    result = fix_text(display(fixture), text, config_of(fixture), only(fixture.parent.name))
    expected = fixed_path(fixture)
    assert result.text == (expected.read_text(encoding="utf-8") if expected.exists() else text)
    assert not result.refused or not expected.exists() or all(
        "draws" not in r.reason and "parse" not in r.reason for r in result.refused)


@pytest.mark.parametrize("fixture", [p for p in BAD if fixed_path(p).exists()],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixed_form_parses_rescans_clean_and_is_stable(fixture):
    code = fixture.parent.name
    config = config_of(fixture)
    before = scan_source(fixture.read_text(encoding="utf-8"), display(fixture), config)
    text = fixed_path(fixture).read_text(encoding="utf-8")
    ast.parse(text)
    after = scan_source(text, display(fixture), config)
    assert not any(f.rule == "KA001" for f in after)
    assert Counter(f.rule for f in after if f.rule != code) <= \
        Counter(f.rule for f in before if f.rule != code), "a fix drew other findings"
    # what is left of the rule is what it cannot fix
    assert not [key for key in fixes_of_text(display(fixture), text, config) if key[0] == code]
    assert len([f for f in after if f.rule == code]) < len([f for f in before if f.rule == code])
    again = fix_text(display(fixture), text, config, only(code))
    assert again.text == text and not again.applied, "a second run changes nothing"


@pytest.mark.parametrize("path", HONEST, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_honest_code_is_never_changed(path):
    text = path.read_text(encoding="utf-8")
    config = config_of(path)
    default = fix_text(display(path), text, config, fixed_by_default)
    assert default.text == text and not default.applied
    if path.parent.name in FIXABLE:  # a rule's honest look-alikes, even with the rule selected
        assert fix_text(display(path), text, config, only(path.parent.name)).text == text


# --- the engine -------------------------------------------------------------------------------

TRITON = '''import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        grid = (n // 256,)
        copy_kernel[grid](x, y, n, BLOCK=256)
        return y
'''

GRID_FUNCTION = '''def grid(meta):
    return (meta["n"] // meta["BLOCK"],)


'''

SECOND_LAUNCH = '''        return self.back(y, x, n)

    def back(self, y, x, n):
        copy_kernel[grid](y, x, n, BLOCK=256)
        return x
'''


def test_edits_that_overlap_are_never_applied_together():
    with pytest.raises(ValueError):
        apply_edits("abcdef", [Edit(1, 4, "x"), Edit(3, 5, "y")])
    with pytest.raises(ValueError):
        apply_edits("abcdef", [Edit(2, 2, "x"), Edit(2, 2, "y")])
    assert apply_edits("abcdef", [Edit(4, 6, ""), Edit(0, 1, "A"), Edit(2, 2, "_")]) == "Ab_cd"
    # both launches share one grid function: their fixes edit the same division, applied once
    source = TRITON.replace("class ModelNew", GRID_FUNCTION + "class ModelNew").replace(
        "        grid = (n // 256,)\n", "").replace("        return y\n", SECOND_LAUNCH)
    assert [f.rule for f in scan_source(source)] == ["KA201", "KA201"]
    result = fix_text("k.py", source, Config(), only("KA201"))
    assert 'return (triton.cdiv(meta["n"], meta["BLOCK"]),)' in result.text
    assert [f.rule for f, _ in result.applied] == ["KA201"] and "//" not in result.text


def test_a_fix_that_would_not_parse_is_dropped(monkeypatch):
    rule = rule_by_code("KA201")
    monkeypatch.setattr(rule, "fix", lambda self, editor, finding: Fix(
        "break it", (Edit(0, 0, "(("),)))
    result = fix_text("k.py", TRITON, Config(), only("KA201"))
    assert result.text == TRITON and not result.applied
    assert result.refused and "does not parse" in result.refused[0].reason


def test_a_crashing_fix_is_a_refusal(monkeypatch):
    def crash(self, editor, finding):
        raise KeyError("boom")
    monkeypatch.setattr(rule_by_code("KA201"), "fix", crash)
    result = fix_text("k.py", TRITON, Config(), only("KA201"))
    assert result.text == TRITON
    assert "internal error in the fix: KeyError" in result.refused[0].reason


def test_ceiling_grid_over_an_unguarded_store_is_not_applied():
    source = TRITON.replace(", mask=mask), mask=mask)", "))")
    assert any(f.rule == "KA201" for f in scan_source(source))
    result = fix_text("k.py", source, Config(), only("KA201"))
    assert result.text == source
    assert "draws KA204" in result.refused[0].reason


SWITCHES = '''import torch
{line}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x @ x
'''


@pytest.mark.parametrize(("line", "fixed"), [
    ("if torch.cuda.is_available():\n    torch.backends.cuda.matmul.allow_tf32 = True  # fast",
     "if torch.cuda.is_available():\n    pass"),
    ("x = 1; torch.backends.cuda.matmul.allow_tf32 = True", "x = 1"),
    ("torch.backends.cuda.matmul.allow_tf32 = True; x = 1", "x = 1"),
    ("# faster matmuls\ntorch.set_float32_matmul_precision('medium')\nx = 1",
     "# faster matmuls\nx = 1"),
])
def test_precision_switches_are_removed(line, fixed):
    result = fix_text("k.py", SWITCHES.format(line=line), Config(), only("KA401"))
    assert result.text == SWITCHES.format(line=fixed)


def test_a_raw_one_line_string_cannot_take_a_new_line():
    source = ('import torch\nfrom torch.utils.cpp_extension import load_inline\n'
              'src = r"__global__ void k(float* y, int n) { int i = threadIdx.x; '
              'if (i < n) y[i] = 0; } '
              'void run(torch::Tensor y) { k<<<1, 256>>>(y.data_ptr<float>(), y.numel()); }"\n'
              'ext = load_inline(name="k", cpp_sources="void run(torch::Tensor y);", '
              'cuda_sources=src, functions=["run"])\n\n\n'
              'class ModelNew(torch.nn.Module):\n    def forward(self, y):\n'
              '        ext.run(y)\n        return y\n')
    assert any(f.rule == "KA308" for f in scan_source(source))
    result = fix_text("k.py", source, Config(), only("KA308"))
    assert result.text == source
    assert "raw string" in result.refused[0].reason


# --- the command --------------------------------------------------------------------------------


def kaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kaudit", *args], capture_output=True, text=True,
                          cwd=cwd)


def copy_fixtures(folder: Path, *names: str) -> list[Path]:
    copies = []
    for name in names:
        source = RULE_FIXTURES / name
        copies.append(folder / source.name)
        copies[-1].write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    return copies


def test_fix_writes_files_and_prints_a_summary(tmp_path):
    triton, tf32 = copy_fixtures(tmp_path, "KA201/bad_triton_floor_division.py",
                                 "KA401/bad_tf32_switches_triton.py")
    proc = kaudit("fix", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert triton.read_text() == fixed_path(RULE_FIXTURES / "KA201" / triton.name).read_text()
    assert tf32.read_text() == fixed_path(RULE_FIXTURES / "KA401" / tf32.name).read_text()
    assert "bad_triton_floor_division.py: fixed 3 findings (KA201 ×3)" in proc.stdout
    assert "kaudit: fixed 5 findings (KA201 ×3, KA401 ×2) in 2 files" in proc.stdout
    again = kaudit("fix", ".", cwd=tmp_path)
    assert again.returncode == 0 and "nothing to fix" in again.stdout


def test_a_file_reached_through_a_symlink_is_fixed_once(tmp_path):
    (triton,) = copy_fixtures(tmp_path, "KA201/bad_triton_floor_division.py")
    (tmp_path / "retimed").mkdir()
    (tmp_path / "retimed" / triton.name).symlink_to(f"../{triton.name}")
    proc = kaudit("fix", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert triton.read_text() == fixed_path(RULE_FIXTURES / "KA201" / triton.name).read_text()
    assert "kaudit: fixed 3 findings (KA201 ×3) in 1 file" in proc.stdout
    assert (tmp_path / "retimed" / triton.name).is_symlink()


def test_diff_prints_a_patch_and_writes_nothing(tmp_path):
    (fixture,) = copy_fixtures(tmp_path, "KA201/bad_cuda_int_division.py")
    original = fixture.read_text()
    proc = kaudit("fix", fixture.name, "--diff", cwd=tmp_path)
    assert proc.returncode == 1 and fixture.read_text() == original
    assert proc.stdout.startswith(f"--- a/{fixture.name}\n+++ b/{fixture.name}\n")
    assert "-    int blocks = n / threads;\n+    int blocks = (n + threads - 1) / threads;\n" \
        in proc.stdout
    assert "would have fixed 2 findings" in proc.stderr
    applied = subprocess.run(["patch", "-p1"], input=proc.stdout, text=True, cwd=tmp_path,
                             capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert fixture.read_text() == fixed_path(RULE_FIXTURES / "KA201" / fixture.name).read_text()


def test_usage_errors(tmp_path):
    assert kaudit("fix", "missing.py", cwd=tmp_path).returncode == 2
    (tmp_path / "k.py").write_text(TRITON)
    bad = kaudit("fix", "k.py", "--select", "not-a-code", cwd=tmp_path)
    assert bad.returncode == 2 and "not a rule code" in bad.stderr
    assert (tmp_path / "k.py").read_text() == TRITON


def test_notes_are_fixed_only_when_selected(tmp_path):
    (fixture,) = copy_fixtures(tmp_path, "KA308/bad_unchecked_launches.py")
    original = fixture.read_text()
    assert kaudit("fix", fixture.name, cwd=tmp_path).returncode == 0
    assert fixture.read_text() == original
    assert kaudit("fix", fixture.name, "--select", "KA308", cwd=tmp_path).returncode == 0
    assert fixture.read_text() == fixed_path(RULE_FIXTURES / "KA308" / fixture.name).read_text()


def test_a_file_changed_since_the_scan_is_not_written(tmp_path, monkeypatch):
    from kaudit.fix import command

    (fixture,) = copy_fixtures(tmp_path, "KA201/bad_cuda_int_division.py")
    real_fix = command.fix_text

    def edit_meanwhile(path, text, config, wanted):
        result = real_fix(path, text, config, wanted)
        fixture.write_text(text + "# saved by an editor meanwhile\n")
        return result

    monkeypatch.setattr(command, "fix_text", edit_meanwhile)
    out, err = _Stream(), _Stream()
    code = command.run_fix([str(fixture)], Config(), [], diff=False, suppress=False, out=out,
                           err=err)
    assert code == 1 and "changed since it was scanned; not written" in err.text
    assert fixture.read_text().endswith("# saved by an editor meanwhile\n")


class _Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def writelines(self, lines) -> None:
        self.text += "".join(lines)


def test_write_keeps_a_byte_order_mark_and_the_mode(tmp_path):
    import hashlib

    from kaudit.fix.command import write_if_unchanged

    target = tmp_path / "k.py"
    target.write_bytes(b"\xef\xbb\xbfx = 1\n")
    target.chmod(0o640)
    digest = hashlib.sha256(target.read_bytes()).digest()
    assert write_if_unchanged(str(target), digest, "x = 2\n", bom=True) is None
    assert target.read_bytes() == b"\xef\xbb\xbfx = 2\n" and target.stat().st_mode & 0o777 == 0o640
    assert write_if_unchanged(str(target), digest, "x = 3\n") is not None


# --- --add-suppressions ---------------------------------------------------------------------


def test_add_suppressions_waives_every_finding_in_place(tmp_path):
    copies = copy_fixtures(tmp_path, "KA201/bad_cuda_int_division.py",
                           "KA201/bad_triton_floor_division.py", "KA101/bad_torch_alias_matmul.py")
    before = scan_paths([str(p) for p in copies])
    assert any(f.rule != "KA004" for f in before.findings)
    proc = kaudit("fix", ".", "--add-suppressions", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not [f for f in scan_paths([str(p) for p in copies]).findings
                if not f.rule.startswith("KA0")]
    cuda = copies[0].read_text()
    # inside the CUDA string: a C++ comment, after the marker already on the line
    assert "(x.data_ptr<float>(), y.data_ptr<float>(), n);  // expect: KA201  " \
           "// kaudit: ignore[KA201]\n" in cuda
    triton = copies[1].read_text()
    assert "swish_kernel[grid](x, y, n, BLOCK_SIZE=BLOCK_SIZE)  # expect: KA201  " \
           "# kaudit: ignore[KA201]\n" in triton
    again = kaudit("fix", ".", "--add-suppressions", cwd=tmp_path)
    assert "nothing to suppress" in again.stdout


def test_added_suppressions_merge_with_the_one_on_the_line():
    source = TRITON.replace("copy_kernel[grid](x, y, n, BLOCK=256)",
                            "copy_kernel[grid](x, y, n, BLOCK=256)  # kaudit: ignore[KA101]")
    result = add_suppressions("k.py", source, Config(), lambda f: True)
    assert "copy_kernel[grid](x, y, n, BLOCK=256)  # kaudit: ignore[KA101, KA201]\n" in result.text
    assert not [f for f in scan_source(result.text) if f.rule == "KA201"]


def test_no_suppression_inside_a_string_that_is_not_cuda():
    source = TRITON.replace("        copy_kernel[grid](x, y, n, BLOCK=256)\n",
                            '        copy_kernel[grid](x, y, n, BLOCK=256); note = """\n'
                            'done"""\n')
    assert any(f.rule == "KA201" for f in scan_source(source))
    result = add_suppressions("k.py", source, Config(), only("KA201"))
    assert "ends inside a string" in result.refused[0].reason and result.text == source


# --- reports --------------------------------------------------------------------------------


def test_sarif_results_carry_fixes_that_reproduce_the_fix():
    from tests.test_sarif import render, validate

    paths = [RULE_FIXTURES / "KA201" / "bad_cuda_escaped_string.py",
             RULE_FIXTURES / "KA401" / "bad_tf32_switches_triton.py",
             RULE_FIXTURES / "KA004" / "bad_unused_ignore.py"]
    log = render(paths)
    validate(log)
    with_fixes = [r for r in log["runs"][0]["results"] if "fixes" in r]
    assert {r["ruleId"] for r in with_fixes} == {"KA004", "KA201", "KA401"}
    assert len(with_fixes) == 1 + 2 + 2
    assert not [r for r in log["runs"][0]["results"] if r["ruleId"] == "KA308" and "fixes" in r]
    for result in with_fixes:
        (change,) = result["fixes"][0]["artifactChanges"]
        path = ROOT / change["artifactLocation"]["uri"]
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)

        def offset(line: int, column: int) -> int:
            return sum(len(x) for x in lines[:line - 1]) + column - 1

        edits = [Edit(offset(r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"]),
                      offset(r["deletedRegion"]["endLine"], r["deletedRegion"]["endColumn"]),
                      r.get("insertedContent", {}).get("text", ""))
                 for r in change["replacements"]]
        fixed = apply_edits(text, edits)
        assert fixed != text
        assert sum(1 for f in scan_source(fixed, str(path.relative_to(ROOT)))
                   if f.rule == result["ruleId"]) < \
            sum(1 for f in scan_source(text, str(path.relative_to(ROOT)))
                if f.rule == result["ruleId"])


def test_json_says_which_findings_are_fixable():
    proc = subprocess.run([sys.executable, "-m", "kaudit", "scan", "--format", "json",
                           "--no-cache", "--policy", "strict",
                           "fixtures/rules/KA201/bad_triton_floor_division.py",
                           "fixtures/rules/KA101/bad_torch_alias_matmul.py"],
                          capture_output=True, text=True, cwd=ROOT)
    findings = json.loads(proc.stdout)["findings"]
    fixable = [f for f in findings if "fix" in f]
    assert {f["rule"] for f in fixable} == {"KA201"} and len(fixable) == 3
    # notes' fixes are not computed during a scan (the KA101 fixture's launch draws KA308)
    assert any(f["rule"] == "KA308" and "fix" not in f for f in findings)
    assert any(f["rule"] == "KA101" and "fix" not in f for f in findings)
    first = next(f for f in fixable if f["rule"] == "KA201")["fix"]
    assert first["description"].startswith("round the grid up")
    assert (first["edits"][0]["line"], first["edits"][0]["text"]) == \
        (36, "triton.cdiv(n, BLOCK_SIZE)")


def test_a_plain_scan_does_not_import_libcst():
    """The fix machinery stays out of the scan, and out of JSON and SARIF reports whose findings
    have no fix `kaudit fix` would apply by default: their speed does not change."""
    code = ("import sys\nfrom kaudit.cli import main\n"
            "sys.argv = ['kaudit', 'scan', 'fixtures/rules/KA201', 'fixtures/rules/KA004', "
            "'--no-cache']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'libcst' not in sys.modules, 'libcst imported'\n"
            "import kaudit\nfrom kaudit.report import json_report, sarif\n"
            "from kaudit.rule import all_rules\n"
            "report = kaudit.scan_paths(['fixtures/honest'])\n"
            "assert {f.rule for f in report.findings} == {'KA308'}\n"
            "json_report.render(report), sarif.render(report, list(all_rules()))\n"
            "assert 'libcst' not in sys.modules, 'libcst imported for notes'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "KA201" in proc.stdout


# --- the fixed kernels compute the whole output -----------------------------------------------

RUN_FIXED = '''
import importlib.util, json, sys
import torch

def load(path):
    spec = importlib.util.spec_from_file_location("fixed_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

results = {}
for path, init, shape, reference in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    model = load(path).ModelNew(*init)
    x = torch.randn(*shape, device=sys.argv[2])
    out = model(x)
    expected = eval(reference)(x)
    results[path] = bool(torch.allclose(out, expected, atol=1e-5, rtol=1e-5))
print(json.dumps(results))
'''

# (fixture, ModelNew's arguments, input shape: sizes with a partial last block, reference)
TRITON_FIXED = [
    ("KA201/bad_triton_floor_division", [1.5], [3, 1001], "lambda x: x * torch.sigmoid(x) * 2.25"),
    ("KA201/bad_triton_imported_as", [], [3, 1001], "torch.relu"),
    ("KA201/bad_triton_no_module_import", [], [3, 1001], "lambda x: x * x"),
]
CUDA_FIXED = [
    ("KA201/bad_cuda_int_division", [1000], [37, 1000],
     "lambda x: torch.nn.functional.gelu(x, approximate='tanh')"),
    ("KA201/bad_cuda_dim3_and_vectorized", [0.5], [37, 1000],
     "lambda x: torch.sigmoid(x.t() * 0.5)"),
    ("KA201/bad_cuda_escaped_string", [], [37, 1001], "lambda x: -x"),
    ("KA308/bad_unchecked_launches", ["both"], [37, 1001], "lambda x: x * x + x.abs()"),
    ("KA308/bad_fstring_no_header", [], [37, 1001], "torch.exp"),
    ("KA004/bad_unused_ignore", [], [37, 1001], "torch.relu"),
]


def run_fixed(cases, device: str, suffix: str, **env: str) -> dict[str, bool]:
    spec = [[str(RULE_FIXTURES / f"{name}{suffix}"), init, shape, reference]
            for name, init, shape, reference in cases]
    proc = subprocess.run([sys.executable, "-c", RUN_FIXED, json.dumps(spec), device],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {Path(path).name: ok for path, ok in json.loads(proc.stdout).items()}


def test_fixed_triton_grids_cover_the_output():
    """Under Triton's CPU interpreter: the fixed launches write every element, the bad ones
    leave the tail unwritten."""
    pytest.importorskip("triton")
    fixed = run_fixed(TRITON_FIXED, "cpu", FIXED_SUFFIX, TRITON_INTERPRET="1")
    assert all(fixed.values()), fixed
    bad = run_fixed(TRITON_FIXED, "cpu", ".py", TRITON_INTERPRET="1")
    assert not any(bad.values()), bad


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("KAUDIT_TEST_DEVICE") != "cuda",
                    reason="needs a CUDA device and nvcc (KAUDIT_TEST_DEVICE=cuda)")
def test_fixed_cuda_sources_compile_and_cover_the_output():
    """The fixed CUDA fixtures build with load_inline (the added header and checks compile) and
    compute the whole output."""
    fixed = run_fixed(CUDA_FIXED, "cuda", FIXED_SUFFIX)
    assert all(fixed.values()), fixed
