from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import tree_sitter

from kaudit.cpp import CppFunction, CppIndex
from kaudit.findings import Finding, Level, Precision
from kaudit.cpp_library import library_calls
from kaudit.fix.edits import Edit, Fix, NoFix
from kaudit.forward import REFERENCE_KINDS, ForwardAnalysis, methods_of, walk_code
from kaudit.rule import Rule
from kaudit.source import CudaUnit, SourceModel

if TYPE_CHECKING:
    from kaudit.fix.editor import Editor

# Qualified names of dtypes below fp32 (as `Bindings.resolve` spells them).
_TORCH_LOW = frozenset({
    "torch.float16", "torch.half", "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2",
    "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz", "torch.HalfTensor", "torch.BFloat16Tensor",
    "torch.cuda.HalfTensor", "torch.cuda.BFloat16Tensor",
})
_TRITON_LOW = frozenset({
    "triton.language.float16", "triton.language.bfloat16", "triton.language.float8e4nv",
    "triton.language.float8e5", "triton.language.float8e4b15", "triton.language.float8e4b8",
    "triton.language.float8e5b16",
})
_LOW_DTYPES = _TORCH_LOW | _TRITON_LOW
_CAST_METHODS = frozenset({"to", "type", "view", "cast"})  # positional dtype arguments count here
_HALF_METHODS = frozenset({"half", "bfloat16"})
_TF32_PRECISIONS = frozenset({"tf32", "tf32x3"})

# CUDA: tokens that mean half / bfloat16 / fp8 / tf32 arithmetic inside a kernel.
_CUDA_LOW_TYPES = frozenset({
    "__half", "__half2", "__nv_bfloat16", "__nv_bfloat162", "nv_bfloat16", "nv_bfloat162",
    "__nv_fp8_e4m3", "__nv_fp8_e5m2", "__nv_fp8x2_e4m3", "__nv_fp8x2_e5m2", "__nv_fp8x4_e4m3",
    "__nv_fp8x4_e5m2",
})
_CUDA_TYPE_ONLY = frozenset({"half", "half2"})  # only as a type: `int half = n / 2` is common
_CUDA_LOW_INTRINSIC = re.compile(
    r"^__(?:\w*half\w*|\w*bfloat16\w*|float_to_tf32|h(?:add|sub|mul|div|fma|neg|max|min|abs)\w*)$")
_ATEN_LOW = frozenset({"Half", "BFloat16", "Float8_e4m3fn", "Float8_e5m2"})  # c10::Half, at::BFloat16
_PTX_LOW = re.compile(r"\.(?:f16|f16x2|bf16|bf16x2|tf32|e4m3|e5m2)\b")
_HOST_LOW_DTYPE = re.compile(r"\bk(?:Half|Float16|BFloat16|Float8_e4m3fn|Float8_e5m2)\b|"
                             r"ScalarType::(?:Half|BFloat16)\b")
_HOST_CAST_CALLS = frozenset({"to", "toType", "type", "dtype", "_to_copy", "view"})
_AUTOCAST_EFFECT = "matmuls and convolutions inside it run in fp16/bf16"
# Switches that change the precision of PyTorch's fp32 matmuls (their defaults are full fp32).
_MATMUL_TF32_FLAGS = frozenset({"torch.backends.cuda.matmul.allow_tf32"})
_MATMUL_PRECISION_SETTINGS = frozenset({"torch.backends.cuda.matmul.fp32_precision",
                                        "torch.backends.fp32_precision"})
# PyTorch ops (as KA101 and KA106 describe them) that run a cuBLAS matmul.
_MATMUL_OPS = re.compile(
    r"\b(matmul|mm|bmm|addmm|addmv|addbmm|baddbmm|mv|einsum|linear|Linear|Bilinear|bilinear|"
    r"LSTM|GRU|RNN|LSTMCell|GRUCell|RNNCell|MultiheadAttention|Transformer\w*|tensordot|"
    r"scaled_dot_product_attention|chain_matmul|multi_dot|gemm|bgemm)\b|`@`|library model|"
    r"reference `Model`")
_CUDA_NODE_TYPES = frozenset({"identifier", "type_identifier", "gnu_asm_expression"})
#: every token `_low_token` reports contains one of these: code without any is not walked
_LOW_HINT = re.compile(r"half|bfloat16|fp8|tf32|__h(?:add|sub|mul|div|fma|neg|max|min|abs)|Half|BFloat16|"
                       r"Float8|asm")


class PrecisionDowngrade(Rule):
    """The submission computes in lower precision (fp16, bf16, tf32) than the fp32 problem.

    ## What it does
    Reports, when the problem is fp32 (the file's `get_inputs`/`Model`, if present, create no
    fp16/bf16 tensors): on the forward path and in `ModelNew.__init__`, casts to half precision
    (`.half()`, `.bfloat16()`, `.to(torch.float16)` under any alias, `dtype=torch.half` in
    allocations) and `torch.autocast`/`torch.cuda.amp.autocast` regions; anywhere in the file,
    `torch.backends.cuda.matmul.allow_tf32 = True`, `torch.backends.cuda.matmul.fp32_precision`
    or `torch.backends.fp32_precision = "tf32"` and
    `torch.set_float32_matmul_precision("high"/"medium")`, when the forward path runs a PyTorch
    matmul they affect (`torch.matmul`, `nn.Linear`, `@`, an LSTM, `at::matmul` in the
    extension); `cudnn.allow_tf32 = True` is PyTorch's default and is not reported, nor is a flag
    PyTorch does not have; in `@triton.jit` kernels, casts to
    `tl.float16`/`tl.bfloat16`, `dtype=tl.float16` accumulators and `tl.dot(...,
    allow_tf32=True)` or `input_precision="tf32"`/`"tf32x3"`; in CUDA, the first use of `__half`,
    `half2`, `__nv_bfloat16`, their intrinsics (`__float2half`, `__hfma`), tf32 WMMA or f16/bf16/
    tf32 PTX in each `__global__` kernel (or the `__device__` functions it calls, or its launch's
    template arguments), and host code casting tensors to `kHalf`/`kBFloat16`. One finding per
    expression; per kernel in CUDA.

    A plain `tl.dot(a, b)` on fp32 data is not reported although Triton then uses tf32 by default
    (that would flag almost every Triton matmul); nor are kernels templated on `scalar_t` and
    dispatched with `AT_DISPATCH_FLOATING_TYPES_AND_HALF` (they run fp32 on fp32 inputs).

    ## Why is this bad?
    Half precision and tf32 run several times faster on tensor cores, so a "speedup" can come from
    doing less precise arithmetic rather than from a better kernel. Loose tolerances (1e-2) often
    let the error pass, but the kernel does not solve the fp32 problem it was measured against.

    ## Example
    ```python
    import torch

    class ModelNew(torch.nn.Module):
        def forward(self, a, b):
            out = ext.matmul_cuda(a.half(), b.half())
            return out.float()
    ```

    ## Fix
    `kaudit fix` removes the global switches (`allow_tf32 = True`, `fp32_precision = "tf32"`,
    `set_float32_matmul_precision("high"/"medium")`; `pass` where the switch was a block's only
    statement) and makes `tl.dot` compute in fp32 (`allow_tf32=False`, `input_precision="ieee"`).
    Casts, autocast regions and half-precision CUDA are rewrites of the algorithm: no fix.
    """

    code = "KA401"
    name = "precision-downgrade"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ("numerics", "precision")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        if model.module is None or _problem_is_low_precision(model):
            return
        yield from self._global_switches(model)
        yield from self._python_paths(model)
        yield from self._triton_kernels(model)
        if model.cuda_units:
            yield from self._cuda(model)

    def fix(self, editor: Editor, finding: Finding) -> Fix | None:
        kind = finding.metrics.get("kind")
        if kind == "tf32":  # a global switch: remove its statement
            node = editor.node_at(finding.location, (ast.Assign, ast.Call))
            statement = node if isinstance(node, ast.Assign) else next(
                (s for s in editor.model.nodes if isinstance(s, ast.Expr) and s.value is node), None)
            if statement is None:
                raise NoFix("the switch is part of a larger expression")
            if isinstance(statement, ast.Assign) and len(statement.targets) != 1:
                raise NoFix("the statement assigns other names too")
            return Fix(f"remove `{_short(editor.model, statement)}`",
                       (editor.remove_statement(statement),))
        call = editor.node_at(finding.location, ast.Call) if kind == "triton" else None
        if not isinstance(call, ast.Call) or _tf32_dot(editor.model, call) is None:
            return None
        edits = []
        for keyword in call.keywords:
            start, end = editor.span(keyword.value)
            if keyword.arg == "allow_tf32" and _is_true(keyword.value):
                edits.append(Edit(start, end, "False"))
            elif keyword.arg == "input_precision" and isinstance(keyword.value, ast.Constant) \
                    and keyword.value.value in _TF32_PRECISIONS:
                written = editor.text[start:end]
                edits.append(Edit(start, end, written.replace(keyword.value.value, "ieee")))
        return Fix("compute `tl.dot` in fp32", tuple(edits))

    # --- Python ---------------------------------------------------------------------------

    def _global_switches(self, model: SourceModel) -> Iterator[Finding]:
        """Switches that turn on tf32 for fp32 matmuls, reported when the forward path runs a
        PyTorch matmul they affect. cuDNN's convolutions already use tf32 by default
        (`cudnn.allow_tf32`, `cudnn.conv.fp32_precision`): setting that again changes nothing,
        and neither does assigning a flag PyTorch does not have."""
        switches: list[tuple[ast.AST, str]] = []
        for node in model.nodes:
            if isinstance(node, ast.Assign) and _is_true(node.value):
                for target in node.targets:
                    if model.bindings.resolve(target) in _MATMUL_TF32_FLAGS:
                        switches.append((node, f"`{model.code_of(target)} = True` lets fp32 "
                                               "matmuls run in tf32"))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and node.value.value in _TF32_PRECISIONS:
                for target in node.targets:
                    if model.bindings.resolve(target) in _MATMUL_PRECISION_SETTINGS:
                        switches.append((node, f"`{model.code_of(target)} = "
                                               f"{node.value.value!r}` runs fp32 matmuls in tf32"))
            elif isinstance(node, ast.Call) and \
                    model.bindings.resolve(node.func) == "torch.set_float32_matmul_precision":
                arg = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg == "precision"), None)
                if isinstance(arg, ast.Constant) and arg.value in ("high", "medium"):
                    switches.append((node, f"`torch.set_float32_matmul_precision({arg.value!r})` "
                                           "runs fp32 matmuls in tf32/bf16"))
        if not switches:
            return
        matmul = _library_matmul(model)
        if matmul is None:
            return  # no PyTorch matmul runs: the switch has nothing to act on
        for node, message in switches:
            yield self.report(model, node, f"{message} ({matmul})", kind="tf32")

    def _python_paths(self, model: SourceModel) -> Iterator[Finding]:
        analysis = ForwardAnalysis.of(model)
        functions = list(analysis.reachable)
        own = set(methods_of(analysis.model_new).values()) if analysis.model_new else set()
        if analysis.model_new is not None:
            init = methods_of(analysis.model_new).get("__init__")
            if init is not None and init not in functions:
                functions.append(init)
        for function in functions:
            where = model.entry_member(function.name) if function in own \
                else f"`{function.name}`"
            for decorator in function.decorator_list:
                region = _autocast(model, decorator)
                if region:
                    yield self.report(model, decorator, f"{where} runs under `{region}`: "
                                      f"{_AUTOCAST_EFFECT}", kind="autocast")
            for node in walk_code(function.body):
                if not isinstance(node, ast.Call):
                    continue
                region = _autocast(model, node)
                if region:
                    yield self.report(model, node, f"{where} opens `{region}`: "
                                      f"{_AUTOCAST_EFFECT}", kind="autocast")
                    continue
                message = _low_cast(model, node)
                if message:
                    yield self.report(model, node, f"{where} {message}", kind="python-cast")

    def _triton_kernels(self, model: SourceModel) -> Iterator[Finding]:
        for kernel in model.triton_kernels.values():
            for node in ast.walk(kernel.node):
                if not isinstance(node, ast.Call):
                    continue
                message = _low_cast(model, node) or _tf32_dot(model, node)
                if message:
                    yield self.report(model, node, f"Triton kernel `{kernel.name}` {message}",
                                      kind="triton")

    # --- CUDA -----------------------------------------------------------------------------

    def _cuda(self, model: SourceModel) -> Iterator[Finding]:
        index = CppIndex.of(model)
        device = {f.name: f for f in index.functions if f.qualifier == "device"}
        calls_by_function: dict[int, list[str]] = {}
        for call in index.calls:
            if call.function is not None and call.function.qualifier != "host":
                calls_by_function.setdefault(id(call.function), []).append(call.short_name)
        reported: set[tuple[str, int, int]] = set()
        flagged_kernels: set[str] = set()
        for kernel in index.functions:
            if kernel.qualifier != "global":
                continue
            hit = _first_low_use_in(kernel, device, calls_by_function)
            if hit is None:
                continue
            function, node, token = hit
            location = function.unit.location(node)
            flagged_kernels.add(kernel.name)
            key = (location.path, location.line, location.column)
            if key in reported:
                continue
            reported.add(key)
            inside = "" if function is kernel else f" (in `__device__` `{function.name}`)"
            yield self.report(model, location,
                              f"CUDA kernel `{kernel.name}` computes in reduced precision: "
                              f"{token}{inside}", kind="cuda")
        for launch in index.launches:
            if launch.kernel in flagged_kernels:
                continue
            callee = launch.node.child_by_field_name("function")
            node_token = _first_low_token(launch.unit, callee) if callee is not None else None
            if node_token is not None:
                flagged_kernels.add(launch.kernel)
                yield self.report(model, launch.unit.location(node_token[0]),
                                  f"CUDA kernel `{launch.kernel}` is launched in reduced precision: "
                                  f"{node_token[1]}", kind="cuda")
        for call in index.calls:
            if call.function is not None and call.function.qualifier != "host":
                continue
            message = _host_cast(call.unit, call.node, call.short_name)
            if message:
                yield self.report(model, call.unit.location(call.node),
                                  f"host code {message}", kind="cuda-host")


def _library_matmul(model: SourceModel) -> str | None:
    """The first PyTorch matmul the forward path runs (in Python or in the extension's host
    code), described; None when there is none."""
    analysis = ForwardAnalysis.of(model)
    for function in analysis.reachable:
        for op in analysis.function_ops(function):
            if op.kind in REFERENCE_KINDS and _MATMUL_OPS.search(op.description):
                return f"the forward path runs {op.description}, line {model.line_of(op.node)}"
    for call in library_calls(model):
        if call.category in ("aten", "method") and _MATMUL_OPS.search(call.evidence):
            return f"{call.place} runs {call.evidence}"
    return None


# --- Python helpers ----------------------------------------------------------------------------

def _is_low_dtype(model: SourceModel, expr: ast.AST) -> str | None:
    name = model.bindings.resolve(expr)
    if name in _LOW_DTYPES:
        return name
    return None


def _low_cast(model: SourceModel, call: ast.Call) -> str | None:
    """`.half()`, `.to(torch.float16)`, `dtype=torch.bfloat16`, `tl.cast(x, tl.float16)`."""
    func = call.func
    for keyword in call.keywords:
        if keyword.arg in ("dtype", "out_dtype") and _is_low_dtype(model, keyword.value):
            return f"uses `{keyword.arg}={model.code_of(keyword.value)}` in `{_short(model, call)}`"
    if isinstance(func, ast.Attribute):
        if func.attr in _HALF_METHODS and not call.args and not call.keywords:
            return f"casts to {func.attr} with `{_short(model, call)}`"
        if func.attr in _CAST_METHODS:
            for arg in call.args:
                if _is_low_dtype(model, arg):
                    return f"casts to `{model.code_of(arg)}` with `{_short(model, call)}`"
    return None


def _autocast(model: SourceModel, node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    name = model.bindings.resolve(node.func) or ""
    if not (name.startswith("torch.") and name.endswith(".autocast")):
        return None
    for keyword in node.keywords:
        if keyword.arg == "enabled" and isinstance(keyword.value, ast.Constant) \
                and keyword.value.value is False:
            return None
        if keyword.arg == "dtype" and model.bindings.resolve(keyword.value) in (
                "torch.float32", "torch.float"):
            return None
    return _short(model, node)


def _tf32_dot(model: SourceModel, call: ast.Call) -> str | None:
    if model.bindings.resolve(call.func) != "triton.language.dot":
        return None
    for keyword in call.keywords:
        if keyword.arg == "allow_tf32" and _is_true(keyword.value):
            return f"asks for tf32 with `{_short(model, call)}`"
        if keyword.arg == "input_precision" and isinstance(keyword.value, ast.Constant) \
                and keyword.value.value in _TF32_PRECISIONS:
            return f"asks for tf32 with `{_short(model, call)}`"
    return None


def _is_true(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is True


def _short(model: SourceModel, node: ast.AST, limit: int = 70) -> str:
    text = " ".join(model.code_of(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problem_is_low_precision(model: SourceModel) -> bool:
    """The file's own `get_inputs`/`get_init_inputs`/reference `Model` use fp16/bf16: the
    problem is not fp32, so half precision is the task, not a downgrade."""
    places: list[ast.AST] = [model.functions[name] for name in ("get_inputs", "get_init_inputs")
                             if name in model.functions]
    if "Model" in model.classes:
        places.append(model.classes["Model"])
    for place in places:
        for node in ast.walk(place):
            if isinstance(node, ast.Call) and _low_cast(model, node):
                return True
    return False


# --- CUDA helpers ------------------------------------------------------------------------------

def _first_low_use_in(kernel: CppFunction, device: dict[str, CppFunction],
                      calls_by_function: dict[int, list[str]]
                      ) -> tuple[CppFunction, tree_sitter.Node, str] | None:
    """The first half-precision token in the kernel, else in the device functions it calls."""
    seen: set[int] = set()
    pending: list[CppFunction] = [kernel]
    while pending:
        function = pending.pop(0)
        if id(function) in seen:
            continue
        seen.add(id(function))
        found = _first_low_token(function.unit, function.node)
        if found is not None:
            return function, found[0], found[1]
        for name in calls_by_function.get(id(function), ()):
            if name in device:
                pending.append(device[name])
    return None


def _first_low_token(unit: CudaUnit, root: tree_sitter.Node
                     ) -> tuple[tree_sitter.Node, str] | None:
    if not _LOW_HINT.search(unit.text_of(root)):
        return None
    stack = [root]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in _CUDA_NODE_TYPES:
            found = _low_token(unit, node)
            if found is not None:
                return node, found
            if kind == "gnu_asm_expression":
                continue
        stack.extend(reversed(node.children))
    return None


def _low_token(unit: CudaUnit, node: tree_sitter.Node) -> str | None:
    kind = node.type
    if kind == "gnu_asm_expression":
        for child in node.children:
            if child.type in ("string_literal", "concatenated_string"):
                match = _PTX_LOW.search(unit.text_of(child))
                if match:
                    return f"inline PTX with `{match.group(0)}` operands"
        return None
    text = unit.text_of(node)
    if text in _CUDA_LOW_TYPES:
        return f"`{text}`"
    if kind == "type_identifier" and text in _CUDA_TYPE_ONLY:
        return f"the `{text}` type"
    if kind == "identifier" and _CUDA_LOW_INTRINSIC.match(text):
        return f"`{text}`"
    if text in _ATEN_LOW or text == "tf32":
        parent = node.parent
        if parent is not None and parent.type == "qualified_identifier":
            scope = parent.child_by_field_name("scope")
            scope_text = unit.text_of(scope) if scope is not None else ""
            if text == "tf32" and scope_text == "precision":
                return "`wmma::precision::tf32` fragments"
            if text in _ATEN_LOW and scope_text in ("c10", "at"):
                return f"`{scope_text}::{text}`"
    return None


def _host_cast(unit: CudaUnit, node: tree_sitter.Node, short: str) -> str | None:
    """`x.to(torch::kHalf)`, `x.half()`, `options().dtype(at::kBFloat16)` in host code."""
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    if callee is None or arguments is None:
        return None
    if short in _HALF_METHODS and callee.type == "field_expression" \
            and arguments.named_child_count == 0:
        return f"casts a tensor to {short} (`{_compact(unit.text_of(node))[:60]}`)"
    if short in _HOST_CAST_CALLS:
        match = _HOST_LOW_DTYPE.search(unit.text_of(arguments))
        if match:
            return f"casts or allocates in `{match.group(0)}` (`{_compact(unit.text_of(node))[:60]}`)"
    return None


def _compact(text: str) -> str:
    return " ".join(text.split())

