import ast
from collections.abc import Iterable, Iterator

import tree_sitter

from kaudit.cpp import CppFunction, CppIndex
from kaudit.dataflow import ReturnFlow, Source, forward_flows
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.integrity import names_in, parameters_of, tainted_names
from kaudit.rule import Rule
from kaudit.source import SourceModel

# Tensor methods that read only metadata, not the data (`x.size(0)`, `x.options()`).
_METADATA = frozenset({
    "size", "sizes", "dim", "ndimension", "numel", "options", "device", "dtype", "scalar_type",
    "is_cuda", "is_contiguous", "stride", "strides", "get_device", "type", "defined", "layout",
    "element_size", "itemsize", "nbytes", "sym_size", "sym_sizes", "sym_numel", "storage_offset",
    "is_floating_point", "requires_grad", "names", "suggest_memory_format",
})


class OutputNotFromKernel(Rule):
    """The tensor `forward` returns is not produced by a custom kernel from the inputs.

    ## What it does
    Follows each `return` of `ModelNew.forward` back through assignments, views and helpers to the
    calls that produced it, and to what was written into a returned buffer (a kernel it is handed
    to, `buf[...] = v`, `buf.copy_(v)`, `torch.op(..., out=buf)`). It reports the returns when:
    - `forward` runs a custom kernel but no return depends on its output: the value comes from
      PyTorch ops on the inputs alone, or the custom result was overwritten or cancelled out
      (`c + (torch.matmul(a, b) - c)`);
    - the returned buffer is a fresh allocation (`torch.empty_like`) that nothing writes, or a
      tensor made once and stored on the model (`self.out = torch.ones(...)` in `__init__`) that
      nothing on the forward path writes: every call returns the same values (reported whether or
      not a kernel runs);
    - the custom kernel that produces the output never reads forward's inputs: its C++ host
      function uses `x` only for its shape (`x.size(0)`, `x.options()`), or is not given it.
    A PyTorch op applied to the kernel's output is KA101's or KA108's finding, not this one.

    ## Why is this bad?
    The kernel runs, so "does it launch a kernel?" checks pass, yet the answer the harness compares
    is PyTorch's, whatever memory the allocator hands back (an `empty_like` buffer often still
    holds the reference's result from the previous call), or a value computed without looking at
    the input, which passes only because the problem's output barely depends on it.

    ## Example
    ```python
    import torch
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="mm", cpp_sources=MM_DECLARATION, cuda_sources=MM_KERNEL,
                      functions=["matmul_cuda"])

    class ModelNew(torch.nn.Module):
        def forward(self, a, b):
            c = ext.matmul_cuda(a, b)
            return c + (torch.matmul(a, b) - c)  # the kernel's result cancels out
    ```
    """

    code = "KA105"
    name = "output-not-from-kernel"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "dataflow", "correctness")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        if analysis.forward is None:
            return
        flows = forward_flows(analysis)
        if not flows:
            return
        runs_kernel = OpKind.CUSTOM_KERNEL in analysis.kinds_reached(analysis.forward.body,
                                                                     analysis.model_new)
        if all(flow.bypassing for flow in flows):
            stale = all(any(p.source in (Source.UNWRITTEN, Source.STORED) for p in flow.bypassing)
                        for flow in flows)
            if runs_kernel or stale:  # PyTorch alone and no kernel: KA101/KA107 say so
                for flow in flows:
                    yield self._bypass(model, flow)
            return
        if runs_kernel:
            yield from self._ignored_inputs(model, analysis, flows)

    def _bypass(self, model: SourceModel, flow: ReturnFlow) -> Finding:
        producer = next((p for p in flow.bypassing
                         if p.source in (Source.UNWRITTEN, Source.STORED)), flow.bypassing[0])
        line = model.line_of(producer.node)
        if producer.source is Source.UNWRITTEN:
            message = (f"forward returns {producer.description} (line {line}), a buffer no "
                       "custom kernel writes: its contents are whatever the allocator left")
        elif producer.source is Source.STORED:
            message = (f"forward returns {producer.description}, a tensor stored on the model "
                       "that nothing on the forward path writes: every call returns the same "
                       "values, whatever the inputs")
        else:
            message = (f"forward returns the result of {producer.description} (line {line}), "
                       "not of a custom kernel")
        return self.report(model, flow.statement, message)

    def _ignored_inputs(self, model: SourceModel, analysis: ForwardAnalysis,
                        flows: list[ReturnFlow]) -> Iterator[Finding]:
        """Every return comes straight from extension calls whose host functions read none of
        the data forward passes them from its inputs."""
        forward = analysis.forward
        assert forward is not None
        if not any(flow.producers for flow in flows):
            return  # nothing traced to any call (a CUDA graph's static buffer): no evidence
        inputs = tainted_names(model, forward)
        stored = _assigned_attributes(analysis)  # `self.x = x.clone()` carries the input too
        index = CppIndex.of(model)
        evidence: list[str] = []
        for flow in flows:
            for producer in flow.producers:
                call = producer.node
                if producer.source is not Source.CUSTOM or not isinstance(call, ast.Call) \
                        or not producer.callee or any(isinstance(a, ast.Starred) for a in call.args) \
                        or analysis.callees.enclosing_function(call) is not forward:
                    return  # only calls made in forward itself, with forward's own names
                host = index.function(index.bindings.get(producer.callee, producer.callee))
                if host is None or host.qualifier != "host":
                    return
                params = parameters_of(host)
                for position, argument in enumerate(call.args):
                    if any(n.attr in stored for n in ast.walk(argument)
                           if isinstance(n, ast.Attribute)):
                        return
                    if not names_in(argument) & inputs:
                        continue
                    if position >= len(params):
                        return
                    name, type_text = params[position]
                    if "Tensor" not in type_text:
                        continue  # a size or a flag computed from the input's shape
                    uses = _data_uses(host, name)
                    if uses is None:
                        return  # the host function reads this input's data
                    shown = ", ".join(f"`{u}`" for u in uses[:2]) or "nothing"
                    evidence.append(f"`{name}` (uses {shown})")
        statement = flows[0].statement
        what = "; ".join(dict.fromkeys(evidence)) or "none of forward's inputs are passed to it"
        yield self.report(model, statement,
                          f"the custom kernel that produces this output never reads forward's "
                          f"inputs: its host function reads only the shape of {what}" if evidence
                          else f"the custom call that produces this output is given none of "
                          f"forward's inputs ({what}): the result cannot depend on them")


def _assigned_attributes(analysis: ForwardAnalysis) -> set[str]:
    """Attributes the forward path assigns (`self.static_x = x.clone()`)."""
    found: set[str] = set()
    for function in analysis.reachable:
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for element in ast.walk(target):
                        if isinstance(element, ast.Attribute):
                            found.add(element.attr)
    return found


def _data_uses(function: CppFunction, name: str) -> list[str] | None:
    """How a host function uses a tensor parameter when it reads only metadata (`x.size(0)`,
    `x.options()`, a `CHECK_INPUT(x)` macro): those uses; None when it may read the data."""
    body = function.body
    if body is None:
        return None
    unit = function.unit
    uses: list[str] = []
    for identifier in unit.nodes_of(("identifier",), body).get("identifier", []):
        if unit.text_of(identifier) != name:
            continue
        use = _metadata_use(unit, identifier)
        if use is None:
            return None
        uses.append(use)
    return uses


def _metadata_use(unit, identifier: tree_sitter.Node) -> str | None:
    parent = identifier.parent
    if parent is not None and parent.type == "field_expression" \
            and parent.child_by_field_name("argument") == identifier:
        field = parent.child_by_field_name("field")
        call = parent.parent
        if field is not None and unit.text_of(field) in _METADATA and call is not None \
                and call.type == "call_expression":
            return "".join(unit.text_of(call).split())
        return None
    if parent is not None and parent.type == "argument_list":
        call = parent.parent
        callee = call.child_by_field_name("function") if call is not None else None
        text = unit.text_of(callee) if callee is not None else ""
        if text.isupper() or text.startswith(("TORCH_CHECK", "AT_ASSERT")):
            return "".join(unit.text_of(call).split())  # a checking macro: CHECK_INPUT(x)
    return None
