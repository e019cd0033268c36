"""The kernel graph and the return data flow behind KA104, KA105 and KA107."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kaudit.dataflow import ReturnTracer, Source
from kaudit.forward import ForwardAnalysis
from kaudit.graph import KernelGraph, render_dot, render_text
from kaudit.source import SourceModel
from tests.conftest import ROOT, RULE_FIXTURES


def graph_of(path) -> KernelGraph:
    return KernelGraph.of(SourceModel(str(path.relative_to(ROOT)), path.read_text()))


def edges(graph: KernelGraph) -> set[tuple[str, str, str]]:
    return {(u, v, k) for u, v, k in graph.graph.edges(data="kind")}


def test_forward_to_kernels_through_helpers_and_indirect_launches():
    graph = graph_of(RULE_FIXTURES / "KA104" / "good_indirect_launches.py")
    assert {
        ("py:ModelNew.forward", "ext:softplus_scaled", "calls"),
        ("ext:softplus_scaled", "cpp:softplus_scaled", "binds"),
        ("cpp:softplus_scaled", "cpp:launch_softplus", "calls"),
        ("cpp:launch_softplus", "cpp:softplus_kernel", "launches"),
        ("cpp:softplus_kernel", "cpp:softplus", "calls"),
        ("cpp:softplus_scaled", "cpp:scale_kernel", "references"),
        ("py:ModelNew.forward", "ext:softplus_scaled", "returns"),
    } <= edges(graph)
    reached = graph.reachable_from(graph.forward)
    assert {"cpp:softplus_kernel", "cpp:scale_kernel", "cpp:softplus"} <= reached
    assert graph.location("cpp:softplus_kernel").line == 10


def test_pybind_and_triton_edges():
    pybind = graph_of(RULE_FIXTURES / "KA107" / "good_launch_through_helpers.py")
    assert ("ext:abs_fwd", "cpp:abs_cuda", "binds") in edges(pybind)
    assert "cpp:PYBIND11_MODULE" not in pybind.graph
    triton = graph_of(RULE_FIXTURES / "KA104" / "good_init_and_jit_helpers.py")
    assert {("py:ModelNew.forward", "triton:gelu_kernel", "launches"),
            ("triton:gelu_kernel", "triton:_gelu", "calls"),
            ("py:ModelNew.__init__", "triton:copy_kernel", "launches")} <= edges(triton)


def test_text_and_dot_rendering():
    graph = graph_of(RULE_FIXTURES / "KA104" / "bad_unused_global_stub.py")
    text = render_text(graph)
    assert text.splitlines()[0].startswith("ModelNew.forward [forward]")
    assert "launches relu_kernel [kernel]" in text
    assert "not reached from forward:" in text and "relu_vec4_kernel [kernel]" in text
    dot = render_dot(graph)
    assert dot.startswith("digraph kaudit {") and dot.rstrip().endswith("}")
    assert '"cpp:relu" -> "cpp:relu_kernel" [label="launches"];' in dot


def test_graph_command():
    proc = subprocess.run([sys.executable, "-m", "kaudit", "graph",
                           "fixtures/rules/KA105/bad_cancelled_result.py", "--format", "dot"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and '"py:ModelNew.forward" -> "torch:`torch.matmul`"' in proc.stdout
    missing = subprocess.run([sys.executable, "-m", "kaudit", "graph", "nope.py"],
                             capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "not a file" in missing.stderr


def flows(body: str) -> list[tuple[Source, ...]]:
    code = textwrap.dedent('''
        import torch
        import triton
        from dsl_runtime import launch
        from torch.utils.cpp_extension import load_inline
        ext = load_inline(name="e", cpp_sources="torch::Tensor f(torch::Tensor x);", functions=["f"])

        class ModelNew(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ones = torch.ones(4)
                self.state = None

            def _update(self, x):
                self.state = ext.f(x)

            def forward(self, x, y):
        ''') + textwrap.indent(textwrap.dedent(body), " " * 8)
    analysis = ForwardAnalysis(SourceModel("k.py", code))
    return [tuple(p.source for p in flow.producers)
            for flow in ReturnTracer(analysis).flows(analysis.forward)]


@pytest.mark.parametrize(("body", "expected"), [
    ("return ext.f(x)", [(Source.CUSTOM,)]),
    ("c = ext.f(x)\nreturn c + (torch.mm(x, y) - c)", [(Source.REFERENCE,)]),
    ("c = ext.f(x)\nc = torch.mm(x, y)\nreturn c", [(Source.REFERENCE,)]),
    ("c = ext.f(x)\nreturn torch.relu(c)", [(Source.DERIVED,)]),
    ("out = torch.empty_like(x)\nreturn out", [(Source.UNWRITTEN,)]),
    ("out = torch.empty_like(x)\next.f(x, out)\nreturn out.view(-1)", [(Source.CUSTOM,)]),
    ("if x.is_cuda:\n    c = ext.f(x)\nelse:\n    c = torch.mm(x, y)\nreturn c",
     [(Source.CUSTOM, Source.REFERENCE)]),
    ("c = ext.f(x)\nc @= y\nreturn c", [(Source.DERIVED,)]),
    ("return x, self.weight", [(Source.INPUT, Source.INPUT)]),
    ("return x * y", [(Source.REFERENCE,)]),
    ("out = torch.zeros_like(x)\nout[0] = ext.f(x)[0]\nreturn out", [(Source.CUSTOM,)]),
    ("out = torch.empty_like(x)\nout.copy_(torch.mm(x, y))\nreturn out", [(Source.REFERENCE,)]),
    ("out = torch.empty_like(x)\ntorch.add(x, y, out=out)\nreturn out", [(Source.REFERENCE,)]),
    ("c = torch.mm(x, y)\next.f(c)\nreturn c", [(Source.CUSTOM,)]),  # an in-place kernel
    ("c = torch.mm(x, y)\nd = ext.f(c)\nreturn c", [(Source.REFERENCE,)]),  # c is only read
    ("self.h = ext.f(x)\nreturn torch.relu(self.h)", [(Source.DERIVED,)]),
    ("ys = torch.empty_like(x)\nfor xs, part in zip(x.chunk(2), ys.chunk(2)):\n"
     "    ext.f(xs, part)\nreturn ys", [(Source.CUSTOM,)]),
    ("out = torch.zeros_like(x)\nfor i in range(2):\n    out[i] += ext.f(x)[i]\nreturn out",
     [(Source.CUSTOM,)]),
    ("out = torch.empty_like(x)\nlaunch(out)\nreturn out", [(Source.UNKNOWN,)]),  # a DSL launcher
    ("out = torch.empty_like(x)\np = out.data_ptr()\nreturn out", [(Source.UNKNOWN,)]),
    ("return self.ones", [(Source.STORED,)]),
    ("self._update(x)\nreturn self.state", [(Source.UNKNOWN,)]),  # a helper sets it
])
def test_return_producers(body, expected):
    assert flows(body) == expected


_CALLEES = """\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="e", cpp_sources="torch::Tensor f(torch::Tensor x);", functions=["f"])


class Block(nn.Module):
    def forward(self, x):
        return ext.f(x)


def make_layer():
    layers = []
    layers.append(Block())
    return nn.Sequential(*layers)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
INIT

    def forward(self, x):
FORWARD
"""


def ops_of(init: str, forward: str) -> list[tuple[str, str]]:
    """(kind, callee or description) of each op `ModelNew.forward` runs, helpers included."""
    code = _CALLEES.replace("INIT", textwrap.indent(init, " " * 8)).replace(
        "FORWARD", textwrap.indent(forward, " " * 8))
    analysis = ForwardAnalysis(SourceModel("k.py", code))
    return sorted((op.kind.value, op.callee or op.description) for function in analysis.reachable
                  for op in analysis.function_ops(function) if op.kind.value != "helper")


@pytest.mark.parametrize(("init", "forward", "expected"), [
    ("self.op = ext.f", "return self.op(x)", [("custom-kernel", "f")]),
    ("try:\n    self.e = ext\nexcept Exception:\n    self.e = None", "return self.e.f(x)",
     [("custom-kernel", "f")]),
    ("self.blocks = nn.ModuleList([Block() for _ in range(3)])",
     "for block in self.blocks:\n    x = block(x)\nreturn x", [("custom-kernel", "f")]),
    ("self.layer = make_layer()", "return self.layer(x)", [("custom-kernel", "f")]),
    ("self.heads = nn.ModuleDict({'a': Block(), 'b': nn.Linear(4, 4)})",
     "return self.heads['a'](x)",
     [("custom-kernel", "f"), ("reference-op", "`torch.nn.Linear` module `self.heads['a']`")]),
    ("setattr(self, 'stage0', Block())", "return getattr(self, f'stage{0}')(x)",
     [("custom-kernel", "f")]),
    ("self.act = torch.jit.script(nn.GELU())", "return self.act(x)",
     [("reference-op", "`torch.nn.GELU` module `self.act`")]),
    ("self.loop = self.loop", "return self.loop(x)", []),  # a cycle resolves to nothing
])
def test_callees_are_followed(init, forward, expected):
    assert ops_of(init, forward) == sorted(expected)


def test_forward_rebound_in_init_is_followed():
    """`self.forward = self._fast` in __init__: the fast path is what runs."""
    code = _CALLEES.replace("INIT", "        self.forward = self._fast").replace(
        "FORWARD", "        raise NotImplementedError\n\n    def _fast(self, x):\n"
                   "        return Block()(x)")
    graph = KernelGraph.of(SourceModel("k.py", code))
    assert "ext:f" in graph.reachable_from(graph.forward)


def test_recursive_helper_is_traced_without_recursion_error():
    """A helper that calls itself (here through the value it returns) ends the trace with an
    unknown producer instead of recursing until Python gives up."""
    text = textwrap.dedent("""
        import torch
        from torch.utils.cpp_extension import load_inline

        ext = load_inline(name="e", cpp_sources="torch::Tensor op(torch::Tensor x);",
                          functions=["op"])

        def repeat(x, n):
            return ext.op(x) if n == 0 else repeat(ext.op(x), n - 1)

        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return repeat(x, 3)
        """)
    from kaudit.config import Config
    from kaudit.engine import scan_text

    assert scan_text(text, "recursive.py", Config()).errors == []
    model = SourceModel("recursive.py", text)
    flows = ReturnTracer(ForwardAnalysis.of(model)).flows(ForwardAnalysis.of(model).forward)
    assert {p.source for flow in flows for p in flow.producers} <= {Source.CUSTOM, Source.UNKNOWN}
