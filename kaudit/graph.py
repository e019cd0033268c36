"""The kernel graph: one directed graph (networkx) per file, from `ModelNew.forward` through the
Python helpers it calls, the compiled extension functions, their C++ host functions and the
`<<<...>>>` launches, down to `__global__` kernels and `__device__` helpers; `kernel[grid](...)`
launches lead to `@triton.jit` functions. `returns` edges record which call produced the tensor
`forward` returns. Nodes carry their kind, a label and a source location."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import networkx as nx

from kaudit.cpp import CppIndex
from kaudit.dataflow import Source, forward_flows
from kaudit.findings import Location
from kaudit.forward import ForwardAnalysis, Op, OpKind
from kaudit.python_scope import dotted_parts
from kaudit.source import FunctionNode, SourceModel

#: C++ "functions" that only declare bindings
_BINDING_BLOCKS = frozenset({"PYBIND11_MODULE", "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL",
                             "TORCH_LIBRARY_FRAGMENT"})
#: node kinds that mean "custom code runs on the device"
KERNEL_KINDS = frozenset({"kernel", "triton", "custom-op"})


class KernelGraph:
    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.graph = nx.MultiDiGraph()
        self.analysis = ForwardAnalysis.of(model)
        self.cpp = CppIndex.of(model)
        self.forward: str | None = None
        #: `backward` of the autograd Functions forward reaches: they run in the backward pass
        self.backward: list[str] = []
        self.unbound_extension_calls: list[str] = []
        self._add_cpp()
        self._add_triton()
        self._add_python()

    @classmethod
    def of(cls, model: SourceModel) -> KernelGraph:
        return model.memo("kernel-graph", lambda: cls(model))

    # --- queries --------------------------------------------------------------------------

    def reachable_from(self, node: str | None) -> set[str]:
        if node is None or node not in self.graph:
            return set()
        return {node} | nx.descendants(self.graph, node)

    def used(self) -> set[str]:
        """What runs when the model is built or called: reachable from the entry point, from
        `ModelNew.__init__` (weight preparation) or from a `backward` forward reaches."""
        model = self.model
        init = f"py:{model.model_new.name}.__init__" if model.model_new else ""
        used = self.reachable_from(self.forward) | self.reachable_from(init)
        for backward in self.backward:
            used |= self.reachable_from(backward)
        return used

    def nodes_of_kind(self, *kinds: str) -> Iterator[str]:
        return (n for n, data in self.graph.nodes(data=True) if data["kind"] in kinds)

    def location(self, node: str) -> Location:
        return self.graph.nodes[node]["location"]

    def label(self, node: str) -> str:
        return self.graph.nodes[node]["label"]

    # --- construction ---------------------------------------------------------------------

    def _node(self, node_id: str, kind: str, label: str, location: Location) -> str:
        if node_id not in self.graph:
            self.graph.add_node(node_id, kind=kind, label=label, location=location)
        return node_id

    def _add_cpp(self) -> None:
        kernels = {f.name for f in self.cpp.functions if f.qualifier == "global"}
        for function in self.cpp.functions:
            if function.name in _BINDING_BLOCKS:
                continue
            kind = {"global": "kernel", "device": "device"}.get(function.qualifier, "host")
            self._node(f"cpp:{function.name}", kind, function.name, function.location())
        defined = {f.name for f in self.cpp.functions}
        for call in self.cpp.calls:
            if call.function is not None and call.short_name in defined:
                self.graph.add_edge(f"cpp:{call.function.name}", f"cpp:{call.short_name}",
                                    kind="calls", location=call.unit.location(call.node))
        for launch in self.cpp.launches:
            if launch.function is not None and launch.kernel in defined:
                self.graph.add_edge(f"cpp:{launch.function.name}", f"cpp:{launch.kernel}",
                                    kind="launches", location=launch.unit.location(launch.node))
        # A kernel named in a host function (cudaLaunchKernel((void*)k, ...), a function pointer,
        # cudaFuncSetAttribute(k, ...)) may be launched from there: count it, to stay quiet.
        for function in self.cpp.functions:
            if function.qualifier != "host" or function.body is None:
                continue
            if function.name in _BINDING_BLOCKS:
                continue
            body_text = function.unit.text_of(function.body)
            if not any(name in body_text and not self.graph.has_edge(f"cpp:{function.name}", f"cpp:{name}")
                       for name in kernels):
                continue  # every kernel it names is one it launches: nothing to add
            for identifier in function.unit.nodes_of(("identifier",), function.body).get("identifier", []):
                name = function.unit.text_of(identifier)
                edge = (f"cpp:{function.name}", f"cpp:{name}")
                if name in kernels and not self.graph.has_edge(*edge):
                    self.graph.add_edge(*edge, kind="references",
                                        location=function.unit.location(identifier))
        for ext in self.model.extensions:
            for name in ext.functions:
                self._extension_node(name, self.model.location(ext.call))
        for exported in self.cpp.bindings:
            self._extension_node(exported, None)

    def _extension_node(self, name: str, location: Location | None) -> str:
        target = self.cpp.bindings.get(name, name)
        if location is None and f"cpp:{target}" in self.graph:
            location = self.location(f"cpp:{target}")
        node = self._node(f"ext:{name}", "extension", name, location or Location(self.model.path))
        if f"cpp:{target}" in self.graph:
            self.graph.add_edge(node, f"cpp:{target}", kind="binds", location=location)
        return node

    def _add_triton(self) -> None:
        kernels = self.model.triton_kernels
        for name, kernel in kernels.items():
            # A jit function that returns a value is a device helper (Triton kernels cannot
            # return), the counterpart of a CUDA __device__ function.
            returns = any(isinstance(n, ast.Return) and n.value is not None
                          for n in ast.walk(kernel.node))
            self._node(f"triton:{name}", "triton-helper" if returns else "triton", name,
                       self.model.header_location(kernel.node))
        for name, kernel in kernels.items():  # @triton.jit helpers called from a kernel's body
            for node in ast.walk(kernel.node):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and node.func.id in kernels and node.func.id != name:
                    self.graph.add_edge(f"triton:{name}", f"triton:{node.func.id}", kind="calls",
                                        location=self.model.location(node))

    def _add_python(self) -> None:
        analysis = self.analysis
        for function in analysis.reachable:
            self._python_node(function)
        # What __init__ uses (weight preparation kernels, say) is used, though not on the forward path.
        init = analysis.methods(analysis.model_new).get("__init__") if analysis.model_new else None
        if init is not None:
            self._add_ops(init, analysis.ops_in(init.body, analysis.model_new))
        if analysis.forward is not None:
            self.forward = self._python_node(analysis.forward)
            self.graph.nodes[self.forward]["kind"] = "forward"
            for rebound in analysis.rebound:  # `self.forward = self._fast_path` in __init__
                self.graph.add_edge(self.forward, self._python_node(rebound), kind="calls",
                                    location=self.model.header_location(rebound))
        for function in analysis.reachable:
            self._add_ops(function, analysis.function_ops(function))
            owner = analysis.class_of(function)
            backward = analysis.methods(owner).get("backward") \
                if owner is not None and function.name == "forward" else None
            if backward is not None and backward not in analysis.reachable:
                self._add_ops(backward, analysis.ops_in(backward.body, owner))
                self.backward.append(self._python_node(backward))
        for flow in forward_flows(analysis):
            for producer in flow.producers:
                if producer.source is not Source.UNKNOWN:
                    target = self._producer_node(producer)
                    self.graph.add_edge(self.forward, target, kind="returns",
                                        location=self.model.location(flow.statement))

    def _python_node(self, function: FunctionNode) -> str:
        owner = self.analysis.owner.get(function) or self.analysis.class_of(function)
        label = f"{owner.name}.{function.name}" if owner else function.name
        return self._node(f"py:{label}", "python", label, self.model.header_location(function))

    def _add_ops(self, function: FunctionNode, ops) -> None:
        source = self._python_node(function)
        for op in ops:
            location = self.model.location(op.node)
            if op.kind is OpKind.HELPER and op.target is not None:
                self.graph.add_edge(source, self._python_node(op.target), kind="calls",
                                    location=location)
            elif op.kind is OpKind.CUSTOM_KERNEL:
                target = self._custom_node(op.node, op.callee, location)
                self.graph.add_edge(source, target, kind=(
                    "launches" if target.startswith("triton:") else "calls"), location=location)
            elif op.kind in (OpKind.REFERENCE_OP, OpKind.REFERENCE_MODEL):
                node = self._node(f"torch:{op.description}", "torch", op.description, location)
                self.graph.add_edge(source, node, kind="calls", location=location)

    def _custom_node(self, call: ast.AST, callee: str, location: Location) -> str:
        assert isinstance(call, ast.Call)
        if isinstance(call.func, ast.Subscript):
            name = callee or (dotted_parts(call.func.value) or ["?"])[-1]
            if name in self.model.triton_kernels:
                return f"triton:{name}"
        parts = dotted_parts(call.func) or ["?"]
        if callee and not callee.startswith("torch."):
            parts = [callee]
        if parts[0] == "torch":
            node = self._node(f"op:{'.'.join(parts)}", "custom-op", ".".join(parts), location)
            if f"ext:{parts[-1]}" in self.graph:  # registered with TORCH_LIBRARY in this file
                self.graph.add_edge(node, f"ext:{parts[-1]}", kind="binds", location=location)
            return node
        node = f"ext:{parts[-1]}"
        if node not in self.graph:
            self.unbound_extension_calls.append(".".join(parts))
            self._node(node, "extension", parts[-1], location)
        return node

    def _producer_node(self, producer) -> str:
        location = self.model.location(producer.node)
        if producer.source is Source.CUSTOM and isinstance(producer.node, ast.Call):
            return self._custom_node(producer.node, producer.callee, location)
        kind = "torch" if producer.source is Source.REFERENCE else "value"
        prefix = "torch" if kind == "torch" else "value"
        return self._node(f"{prefix}:{producer.description}", kind, producer.description, location)


def render_text(graph: KernelGraph) -> str:
    """An indented tree from `ModelNew.forward`, then what it cannot reach."""
    lines: list[str] = []
    g = graph.graph

    def visit(node: str, depth: int, seen: set[str]) -> None:
        edges = sorted(g.out_edges(node, data="kind"), key=lambda e: (e[1], e[2]))
        for _source, target, kind in edges:
            loc = g.nodes[target]["location"]
            lines.append(f"{'    ' * depth}{kind} {graph.label(target)} "
                         f"[{g.nodes[target]['kind']}] ({loc.path}:{loc.line})")
            if target not in seen and kind != "returns":
                visit(target, depth + 1, seen | {target})

    if graph.forward is None:
        lines.append(f"no {graph.model.entry_name.strip('`')}")
    else:
        loc = graph.location(graph.forward)
        lines.append(f"{graph.label(graph.forward)} [forward] ({loc.path}:{loc.line})")
        visit(graph.forward, 1, {graph.forward})
    reachable = graph.reachable_from(graph.forward)
    unreachable = [n for n in g.nodes if n not in reachable
                   and g.nodes[n]["kind"] in ("kernel", "triton", "extension", "host")]
    if unreachable:
        lines.append("not reached from forward:")
        for node in sorted(unreachable):
            loc = graph.location(node)
            lines.append(f"    {graph.label(node)} [{g.nodes[node]['kind']}] ({loc.path}:{loc.line})")
    return "\n".join(lines) + "\n"


def render_dot(graph: KernelGraph) -> str:
    def quote(text: str) -> str:
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'

    lines = ["digraph kaudit {", "  rankdir=LR;", "  node [shape=box, fontname=monospace];"]
    for node, data in sorted(graph.graph.nodes(data=True)):
        label = f"{data['label']}\n{data['kind']} {data['location'].path}:{data['location'].line}"
        lines.append(f"  {quote(node)} [label={quote(label)}];")
    for source, target, kind in sorted(graph.graph.edges(data="kind")):
        style = ", style=dashed" if kind == "returns" else ""
        lines.append(f"  {quote(source)} -> {quote(target)} [label={quote(kind)}{style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
