"""Recursion and cycles in every graph and call walk: self-recursive and mutually recursive methods,
functions, C++ and Triton helpers, attribute and alias cycles, containers holding themselves and
classes that are their own base. A scan of such a file ends, with findings and no internal error
(`return self.forward(x)` in forward once ended a whole scan with exit 2)."""

from __future__ import annotations

import textwrap

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kaudit import Config
from kaudit.engine import scan_text
from kaudit.graph import KernelGraph, render_text
from kaudit.source import SourceModel

HEADER = '''\
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline

CUDA = """
__device__ float dev_a(float v) { return v > 0 ? dev_b(v - 1) : v; }
__device__ float dev_b(float v) { return dev_a(v) + dev_b(v); }
__global__ void kern(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = dev_a(x[i]);
}
torch::Tensor host_b(torch::Tensor x, int d);
torch::Tensor host_a(torch::Tensor x, int d) {
    if (d > 0) return host_b(x, d - 1);
    auto y = torch::empty_like(x);
    kern<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return host_a(y, d);
}
torch::Tensor host_b(torch::Tensor x, int d) { return host_a(x, d); }
"""
ext = load_inline(name="cyc", cpp_sources="torch::Tensor host_a(torch::Tensor x, int d);",
                  cuda_sources=CUDA, functions=["host_a"])


@triton.jit
def jit_a(x):
    return jit_b(x) + 1


@triton.jit
def jit_b(x):
    return jit_a(x) * 2


@triton.jit
def tri(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, jit_a(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


alias_a = alias_b
alias_b = alias_a
'''

# Statements a method or function body may hold; NAME is replaced by another callable's name.
CALLS = [
    "x = self.NAME(x)",
    "x = NAME(x)",
    "return self.NAME(x)",
    "return NAME(x)",
    "x = self.forward(x)",
    "return self.forward(x)",
    "x = self(x)",
    "x = alias_a(x)",
    "x = self.op(x)",
    "x = self.seq(x)",
    "for layer in self.layers:\n    x = layer(x)",
    "x = getattr(self, 'NAME')(x)",
    "x = self.blocks['k'](x)",
    "x = ext.host_a(x, 3)",
    "tri[(1,)](x, x, x.numel(), BLOCK=128)",
    "x = torch.relu(x) * x",
    "x = self.buf",
    "self.buf = x",
    "x.copy_(self.NAME(x))",
]
INIT = [
    "self.op = self.op",
    "self.op = self.seq",
    "self.seq = nn.Sequential(self.seq, Block())",
    "self.seq = self.op",
    "self.layers = nn.ModuleList([self, Block()])",
    "self.layers = self.make_layers()",
    "self.blocks = nn.ModuleDict({'k': self})",
    "self.op = getattr(self, 'op')",
    "self.buf = torch.ones(4)",
    "self.op = ext.host_a",
    "self.op = torch.jit.script(self)",
]


def _method(name: str, body: list[str], is_method: bool) -> str:
    params = "self, x" if is_method else "x"
    lines = body or ["pass"]
    text = "\n".join(lines) + "\nreturn x"
    if not is_method:
        text = text.replace("self.", "").replace("self(", "forward(")
    return f"def {name}({params}):\n" + textwrap.indent(text, "    ")


@st.composite
def cyclic_files(draw) -> str:
    method_names = ["forward", *[f"m{i}" for i in range(draw(st.integers(0, 3)))]]
    function_names = [f"f{i}" for i in range(draw(st.integers(0, 2)))]
    names = method_names + function_names

    def body() -> list[str]:
        statements = draw(st.lists(st.sampled_from(CALLS), max_size=5))
        return [s.replace("NAME", draw(st.sampled_from(names))) for s in statements]

    parts = [HEADER]
    for name in function_names:
        parts.append(_method(name, body(), is_method=False))
    block_base = draw(st.sampled_from(["nn.Module", "Block", "ModelNew"]))
    parts.append(f"class Block({block_base}):\n"
                 + textwrap.indent(_method("forward", body(), is_method=True), "    "))
    base = draw(st.sampled_from(["nn.Module", "Block", "Model"]))
    if base == "Model":
        parts.append("class Model(ModelNew):\n    def forward(self, x):\n"
                     "        return super().forward(x)")
    init = draw(st.lists(st.sampled_from(INIT), max_size=5))
    methods = [_method("__init__", ["super().__init__()", *init], is_method=True),
               _method("make_layers", ["return self.make_layers()"], is_method=True)]
    methods += [_method(name, body(), is_method=True) for name in method_names]
    parts.append(f"class ModelNew({base}):\n" + textwrap.indent("\n\n".join(methods), "    "))
    return "\n\n".join(parts) + "\n"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cyclic_files(), st.sampled_from(["kernelbench", "strict"]))
def test_cycles_end_without_internal_errors(source, policy):
    result = scan_text(source, "cyclic.py", Config(policy=policy))
    assert result.errors == [], (result.errors, source)
    render_text(KernelGraph.of(SourceModel("cyclic.py", source)))


def test_forward_that_calls_itself():
    """The CUDA-L1 level-3 shape: a fallback that re-enters forward."""
    source = HEADER + textwrap.dedent('''
        class ModelNew(nn.Module):
            def forward(self, x):
                if x.dim() != 2:
                    x = x.reshape(x.shape[0], -1)
                    return self.forward(x)
                return ext.host_a(x, 1)
        ''')
    result = scan_text(source, "self_call.py", Config())
    assert result.errors == []
    assert {f.rule for f in result.findings} >= {"KA308"}  # the scan got through every rule
