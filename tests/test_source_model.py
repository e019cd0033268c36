"""The source model: embedded C++/CUDA found through every spelling and mapped back to the line and
column a user opens; Triton kernels and launches; parse failures located."""

from __future__ import annotations

import textwrap

from kaudit.source import SourceModel

HEADER = "from torch.utils.cpp_extension import load_inline\n"


def model_of(code: str, path: str = "k.py") -> SourceModel:
    return SourceModel(path, HEADER + textwrap.dedent(code))


def first(unit, node_type):
    return next(unit.walk(frozenset({node_type})))


def locate(model: SourceModel, needle: str) -> tuple[int, int]:
    """1-based line and column of `needle` in the model's text."""
    for number, line in enumerate(model.lines, start=1):
        if needle in line:
            return number, line.index(needle) + 1
    raise AssertionError(needle)


def test_literal_source_maps_to_python_lines():
    model = model_of('''
        ext = load_inline(name="k", cpp_sources="void f();", cuda_sources="""
        __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }
        """, functions=["f"])
    ''')
    cpp, cuda = model.cuda_units
    assert (cpp.kind, cuda.kind) == ("cpp", "cuda")
    node = first(cuda, "subscript_expression")
    location = cuda.location(node)
    assert (location.line, location.column) == locate(model, "x[threadIdx.x]")
    assert location.end_column == location.column + len("x[threadIdx.x]")


def test_names_concatenation_escapes_and_fstrings():
    model = model_of('''
        BLOCK = 128
        HEAD = "#include <cuda.h>\\n"
        BODY = r"""
        __global__ void a(float* x) { x[0] = 2.0f; }
        """
        BODY += f"__global__ void b(float* y) {{ y[{BLOCK}] = 3.0f; }}\\n"
        src = HEAD + BODY + "__global__ void c(float* z) " "{ z[1] = 4.0f; }"
        ext = load_inline("k", "void f();", cuda_sources=[src], functions=["f"])
    ''')
    (cuda,) = [u for u in model.cuda_units if u.kind == "cuda"]
    assert "y[128] = 3.0f" in cuda.text
    subscripts = list(cuda.walk(frozenset({"subscript_expression"})))
    found = {cuda.text_of(n): cuda.location(n) for n in subscripts}
    for text, needle in (("x[0]", "x[0]"), ("z[1]", "z[1]")):
        assert (found[text].line, found[text].column) == locate(model, needle)
    line, _ = locate(model, "y[{BLOCK}]")
    assert found["y[128]"].line == line
    assert not cuda.tree.root_node.has_error


def test_non_ascii_source_keeps_columns():
    model = model_of('''
        ext = load_inline("k", "void f();", cuda_sources="// résumé ∑\\n__global__ void k(float* p) { p[2] = 0; }")
    ''')
    cuda = model.cuda_units[1]
    location = cuda.location(first(cuda, "subscript_expression"))
    assert (location.line, location.column) == locate(model, "p[2]")


def test_sources_on_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "k.cu").write_text("// kernel\n__global__ void k(float* q) { q[3] = 0; }\n")
    code = ("import os\nfrom torch.utils.cpp_extension import load\n"
            "ext = load(name='k', sources=[os.path.join(os.path.dirname(__file__), 'csrc', 'k.cu')])\n")
    model = SourceModel("kernel.py", code)
    (unit,) = model.cuda_units
    location = unit.location(first(unit, "subscript_expression"))
    assert (location.path, location.line, location.column) == ("csrc/k.cu", 2, 31)
    assert model.other_files == {"csrc/k.cu": unit.text}


def test_device_files_are_never_opened(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = SourceModel("k.py", "from torch.utils.cpp_extension import load\n"
                        "ext = load(name='k', sources=['/dev/stdin.cu', '/dev/zero'])\n")
    assert model.cuda_units == [] and len(model.unresolved_sources) == 2


def test_triton_kernels_and_launches():
    model = SourceModel("t.py", textwrap.dedent('''
        import triton as tr
        import triton.language as tl
        from triton import jit

        @tr.autotune(configs=[], key=["n"])
        @tr.jit
        def k1(x, n, BLOCK: tl.constexpr):
            pass

        @jit
        def k2(x):
            pass

        def not_a_kernel(x):
            pass

        def launch(x, n):
            k1[(tr.cdiv(n, 256),)](x, n, BLOCK=256)
            k2[lambda meta: (n // meta["B"],)](x)
            not_a_kernel(x)
    '''))
    assert set(model.triton_kernels) == {"k1", "k2"}
    assert [(l.kernel, model.line_of(l.call)) for l in model.triton_launches] == [("k1", 19), ("k2", 20)]
    assert model.code_of(model.triton_launches[0].grid) == "(tr.cdiv(n, 256),)"


def test_syntax_error_location_uses_python_words():
    model = SourceModel("k.py", "import torch\n\ndef f(:\n    pass\n")
    assert model.module is None
    assert (model.problem.code, model.problem.line) == ("KA001", 3)
    assert "invalid syntax" in model.problem.message or "expected" in model.problem.message


def test_unresolvable_sources_are_recorded():
    model = model_of('''
        import os
        ext = load_inline("k", os.environ["SRC"], functions=["f"])
    ''')
    (unresolved,) = model.unresolved_sources
    assert "built at run time" in unresolved.reason
