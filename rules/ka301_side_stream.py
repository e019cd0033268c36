import ast
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import tree_sitter

from kaudit.cpp import CppCall, CppFunction, CppIndex
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.integrity import (
    ModuleFacts,
    callers_of,
    calls_in,
    compact,
    local_values,
    method_name,
    model_new_init,
    parameters_of,
    word_set,
)
from kaudit.python_scope import dotted_parts
from kaudit.rule import Rule
from kaudit.source import FunctionNode, SourceModel

STREAM_CONSTRUCTORS = frozenset({
    "torch.cuda.Stream", "torch.cuda.streams.Stream", "torch.Stream",
    "torch.cuda.ExternalStream", "torch.cuda.streams.ExternalStream",
})
STREAM_SCOPES = frozenset({
    "torch.cuda.stream", "torch.cuda.StreamContext", "torch.cuda.streams.StreamContext",
    "torch.cuda.set_stream", "torch.cuda.use_stream",
})
# C++: calls that create (or hand out) a stream other than the current one
CPP_CREATORS = frozenset({
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
    "cuStreamCreate", "cuStreamCreateWithPriority", "getStreamFromPool", "getStreamFromExternal",
})
# C++: calls that point a library handle at a stream (the stream is their second argument)
CPP_SET_STREAM = frozenset({
    "cublasSetStream", "cublasSetStream_v2", "cublasLtSetStream", "cudnnSetStream",
    "cusparseSetStream", "cusolverDnSetStream", "cufftSetStream",
})
CPP_JOINS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent",
    "cudaEventSynchronize", "cudaThreadSynchronize", "cuStreamSynchronize", "cuCtxSynchronize",
    "cuStreamWaitEvent", "stream_synchronize", "device_synchronize", "synchronize",
})
_CURRENT_STREAM_WORDS = ("getCurrentCUDAStream", "getDefaultCUDAStream", "cudaStreamLegacy",
                         "cudaStreamPerThread", "getCurrentStream", "getDefaultStream")
_NULL_STREAMS = frozenset({"0", "nullptr", "NULL", "cudaStreamDefault", "(cudaStream_t)0",
                           "static_cast<cudaStream_t>(0)", "cudaStream_t(0)", "0L", "0u"})


GRAPH_CAPTURES = frozenset({"torch.cuda.graph", "torch.cuda.graphs.graph"})


@dataclass
class _Stream:
    label: str
    creation: ast.Call
    uses_forward: list["_Event"] = field(default_factory=list)
    uses_init: list[ast.AST] = field(default_factory=list)


class SideStream(Rule):
    """Work runs on a non-default CUDA stream that is never joined back to the current stream.

    ## What it does
    In Python, finds streams created with `torch.cuda.Stream(...)` (any alias, also
    `torch.Stream`, `ExternalStream`) and used on a forward path or in `ModelNew.__init__`:
    `with torch.cuda.stream(s):`, `stream=s` or `stream=s.cuda_stream` arguments, `s.wait_stream`,
    `s.cuda_stream` handed to an extension. The stream is joined when, after the work, the forward
    path calls `torch.cuda.current_stream().wait_stream(s)` outside the stream's own `with` block,
    `torch.cuda.synchronize()`, `s.synchronize()` (not the current stream's), or waits on an
    event (`current_stream().wait_event(e)`, `e.wait()`), and that join runs whenever the work
    runs: a join made only on the first call (a warm-up), inside a graph capture, or under a
    condition the work is not also under (`if x.requires_grad:`) does not count. The forward path
    is walked in execution order with its helpers inlined, a helper's parameters standing for the
    streams its call passes (`Fn.apply(x, self.side)`). The stream a CUDA graph is captured on
    (`torch.cuda.graph(g, stream=s)`) runs nothing: `g.replay()` runs on the current stream. Work
    done only in `__init__` is joined
    by any join in `__init__` or on the forward path. In C++/CUDA, finds `cudaStreamCreate*`,
    `at::cuda::getStreamFromPool`, `cublasSetStream`/`cublasSetStream_v2` (and the cuDNN, cuSPARSE,
    cuFFT equivalents) given a stream other than the current one, and `k<<<g, b, smem, stream>>>`
    launches whose stream is not `0`, `nullptr`, `at::cuda::getCurrentCUDAStream()` (any
    namespace, or a variable initialised from it, or a parameter every C++ caller passes such a
    stream), when the host function using it has no `cudaStreamSynchronize`,
    `cudaDeviceSynchronize` or `cudaStreamWaitEvent`. Reported at the creation (or at the launch
    when the stream's creation is not in view).

    ## Why is this bad?
    Harnesses time the current stream with CUDA events (or synchronise only it). Work queued on a
    private stream that the current stream never waits for is not timed, and can still be running
    when the output is compared, so the speedup is fiction and the result may be a race.

    ## Example
    ```python
    import torch

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.side = torch.cuda.Stream()

        def forward(self, x):
            with torch.cuda.stream(self.side):
                return ext.gelu_cuda(x)
    ```
    """

    code = "KA301"
    name = "side-stream"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("integrity", "timing", "streams")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        yield from self._python(model)
        if model.cuda_units:
            yield from self._cpp(model)

    # --- Python -------------------------------------------------------------------------------

    def _python(self, model: SourceModel) -> Iterator[Finding]:
        if not {"Stream", "ExternalStream"} & word_set(model):
            return  # every spelling names one of these (an alias is imported under the name)
        facts = ModuleFacts.of(model)
        creations = [c for c in facts.calls
                     if model.bindings.resolve(c.func) in STREAM_CONSTRUCTORS]
        if not creations:
            return
        streams: list[_Stream] = []
        names: dict[str, set[int]] = {}
        assigned: set[int] = set()
        for target, statement in facts.targets:
            value = getattr(statement, "value", None)
            if value is None or isinstance(statement, ast.Delete):
                continue
            made = [c for c in creations if any(c is n for n in ast.walk(value))]
            if not made:
                continue
            base = target.value if isinstance(target, ast.Subscript) else target
            parts = dotted_parts(base)
            if parts is None:
                continue
            label = ".".join(parts)
            streams.append(_Stream(label, made[0]))
            names.setdefault(label, set()).add(len(streams) - 1)
            assigned.update(id(c) for c in made)
        for call in creations:
            if id(call) not in assigned:
                streams.append(_Stream("torch.cuda.Stream(...)", call))
        analysis = ForwardAnalysis.of(model)
        init = model_new_init(model)
        checker = _PyStreams(model, streams, names, analysis)
        for function in analysis.reachable + ([init] if init is not None else []):
            checker.add_aliases(function)
        if analysis.forward is not None:
            checker.walk(analysis.forward, analysis.model_new)
        init_joined = init is not None and checker.scan_init(init)
        forward_joins_any = bool(checker.joins)
        fake = ""
        if checker.fake_joins:
            fake = (f" (the `wait_stream` at line {model.line_of(checker.fake_joins[0])} is inside "
                    "the stream's own `with` block, where the current stream is the side stream)")
        for i, stream in enumerate(streams):
            use, where, why = None, "", ""
            unjoined = [u for u in stream.uses_forward if not checker.joined(i, u)]
            if unjoined:
                use, where = min(unjoined, key=lambda u: u.order).node, "the forward path"
                if checker.joins_of(i):
                    why = (": the only joins run on some calls only (a first-call warm-up, a "
                           "graph capture or a condition such as `x.requires_grad`), or before "
                           "the work")
            elif stream.uses_init and not (forward_joins_any or init_joined):
                use, where = min(stream.uses_init, key=model.line_of), model.entry_member("__init__")
            if use is None:
                continue
            yield self.report(
                model, stream.creation,
                f"stream `{stream.label}` created here runs work on {where} (line "
                f"{model.line_of(use)}: `{_short(model, use)}`) and nothing joins it back"
                f"{why or ''}: no `torch.cuda.current_stream().wait_stream(...)`, "
                f"`synchronize()` or event wait on every call{fake}, so the timer never waits "
                "for that work")

    # --- C++ ----------------------------------------------------------------------------------

    def _cpp(self, model: SourceModel) -> Iterator[Finding]:
        index = CppIndex.of(model)
        resolver = _CppStreams(index)
        created: dict[tuple[int, str], CppCall] = {}  # (unit id, variable) -> creating call
        creation_calls: list[tuple[CppCall, str | None]] = []
        for call in index.calls:
            short = call.short_name
            if short in CPP_CREATORS and call.function is not None:
                variable = resolver.created_variable(call)
                creation_calls.append((call, variable))
                if variable:
                    created.setdefault((id(call.unit), variable), call)
        resolver.created = created
        # who uses each created stream: launches on it and handles pointed at it
        users: dict[int, set[int]] = {}
        unknown: list[tuple[tree_sitter.Node, CppFunction, str, object]] = []
        for launch in index.launches:
            if launch.function is None or len(launch.config) < 4:
                continue
            verdict = resolver.classify(launch.config[3], launch.function)
            if isinstance(verdict, CppCall):
                users.setdefault(id(verdict), set()).add(id(launch.function))
            elif verdict == "other":
                unknown.append((launch.node, launch.function,
                                f"kernel `{launch.kernel}` is launched on stream "
                                f"`{compact(launch.unit.text_of(launch.config[3]))}`", launch))
        for call in index.calls:
            if call.short_name in CPP_SET_STREAM and len(call.args) >= 2 \
                    and call.function is not None:
                verdict = resolver.classify(call.args[1], call.function)
                if isinstance(verdict, CppCall):
                    users.setdefault(id(verdict), set()).add(id(call.function))
                elif verdict == "other":
                    unknown.append((call.node, call.function,
                                    f"`{call.name}` points a library handle at stream "
                                    f"`{compact(call.unit.text_of(call.args[1]))}`", call))
        functions = {id(f): f for f in index.functions}
        for call, variable in creation_calls:
            assert call.function is not None
            using = [functions[i] for i in users.get(id(call), set()) if i in functions] \
                or [call.function]
            if all(resolver.joins(f) for f in using):
                continue
            where = ", ".join(sorted({f"`{f.name}`" for f in using}))
            yield self.report(
                model, call.unit.location(call.node),
                f"`{call.name}` creates a side stream{f' `{variable}`' if variable else ''} that "
                f"{where} uses with no `cudaStreamSynchronize`, `cudaDeviceSynchronize` or "
                "`cudaStreamWaitEvent` joining it back, so the timer never waits for that work")
        for node, function, what, item in unknown:
            if resolver.joins(function):
                continue
            unit = item.unit  # type: ignore[attr-defined]
            yield self.report(
                model, unit.location(node),
                f"{what}, not the current stream (`at::cuda::getCurrentCUDAStream()`), and "
                f"`{function.name}` never synchronises it back, so the timer never waits for it")


@dataclass(frozen=True)
class _Event:
    """A use of a stream, or a join, met while walking the forward path in execution order."""

    node: ast.AST
    order: int
    branches: frozenset[tuple[int, str]]  # the conditional parts it runs under


class _PyStreams:
    """Aliases, uses and joins of the Python streams of one file. The forward path is walked in
    execution order with helpers inlined at their call sites, remembering under which branches
    each use and each join runs: a join counts for a use only when it comes after it and runs
    whenever the use does (not only on a first call, in a graph capture or `if x.requires_grad`)."""

    def __init__(self, model: SourceModel, streams: list[_Stream], names: dict[str, set[int]],
                 analysis: ForwardAnalysis):
        self.model = model
        self.analysis = analysis
        self.streams = streams
        self.names = names
        self.inline = {id(s.creation): i for i, s in enumerate(streams)}
        self.fake_joins: list[ast.AST] = []
        #: (streams joined, or None for all) -> the join
        self.joins: list[tuple[set[int] | None, _Event]] = []
        self.current_names: set[str] = set()
        self._order = 0
        self._active: set[int] = set()

    def refs(self, expr: ast.AST | None) -> set[int]:
        """Which streams an expression denotes (`self.side`, `self.streams[i]`, an alias)."""
        if expr is None:
            return set()
        if isinstance(expr, ast.Call) and id(expr) in self.inline:
            return {self.inline[id(expr)]}
        while isinstance(expr, ast.Subscript):
            expr = expr.value
        parts = dotted_parts(expr)
        return set(self.names.get(".".join(parts), set())) if parts else set()

    def mentioned(self, expr: ast.AST) -> set[int]:
        found: set[int] = set()
        for node in ast.walk(expr):
            if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
                found |= self.refs(node)
        return found

    def add_aliases(self, function: FunctionNode) -> None:
        for _ in range(2):
            for node in ast.walk(function):
                if isinstance(node, (ast.For, ast.comprehension)):
                    target, value, whole = node.target, node.iter, True
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value, whole = node.targets[0], node.value, False
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    target, value, whole = node.optional_vars, node.context_expr, False
                else:
                    continue
                if not whole and self._is_current_stream(value):
                    self.current_names.update(_plain_names(target))
                    continue
                found = self.mentioned(value) if whole else self.refs(value)
                if not found:
                    continue
                for name in _plain_names(target):
                    self.names.setdefault(name, set()).update(found)

    def _is_current_stream(self, expr: ast.AST) -> bool:
        return isinstance(expr, ast.Call) and self.model.bindings.resolve(expr.func) in (
            "torch.cuda.current_stream", "torch.cuda.default_stream")

    # --- the forward path, in execution order -------------------------------------------------

    def walk(self, function: FunctionNode, cls: ast.ClassDef | None,
             branches: frozenset[tuple[int, str]] = frozenset()) -> None:
        if id(function) in self._active:
            return  # recursion: the body was walked on the way in
        self._active.add(id(function))
        try:
            self._block(function.body, cls, branches, set())
        finally:
            self._active.discard(id(function))

    def _block(self, statements: list[ast.stmt], cls, branches, in_stream: set[int]) -> None:
        for statement in statements:
            self._statement(statement, cls, branches, in_stream)

    def _statement(self, node: ast.stmt, cls, branches, in_stream: set[int]) -> None:
        def part(name: str, owner: ast.AST = node) -> frozenset[tuple[int, str]]:
            return branches | {(id(owner), name)}

        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(node, ast.If):
            self._expression(node.test, cls, branches, in_stream)
            self._block(node.body, cls, part("body"), in_stream)
            self._block(node.orelse, cls, part("orelse"), in_stream)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._expression(node.iter if not isinstance(node, ast.While) else node.test, cls,
                             branches, in_stream)
            self._block(node.body, cls, part("body"), in_stream)
            self._block(node.orelse, cls, part("orelse"), in_stream)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self._block(node.body, cls, branches, in_stream)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                self._block(handler.body, cls, part("body", handler), in_stream)
            self._block(node.orelse, cls, branches, in_stream)  # type: ignore[attr-defined]
            self._block(node.finalbody, cls, branches, in_stream)  # type: ignore[attr-defined]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            inner_streams, inner = set(in_stream), branches
            for item in node.items:
                self._expression(item.context_expr, cls, branches, in_stream)
                call = item.context_expr
                resolved = self.model.bindings.resolve(call.func) \
                    if isinstance(call, ast.Call) else None
                if resolved in STREAM_SCOPES:
                    argument = call.args[0] if call.args else _keyword(call, "stream")
                    inner_streams |= self.refs(argument)
                elif resolved in GRAPH_CAPTURES:
                    inner = inner | {(id(node), "capture")}  # runs when the graph is captured
            self._block(node.body, cls, inner, inner_streams)
        elif isinstance(node, ast.Match):
            self._expression(node.subject, cls, branches, in_stream)
            for case in node.cases:
                self._block(case.body, cls, part("body", case), in_stream)
        else:
            self._expression(node, cls, branches, in_stream)

    def _expression(self, node: ast.AST, cls, branches, in_stream: set[int]) -> None:
        """Calls in source order (arguments before the call), helpers inlined."""
        calls: list[ast.AST] = []
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef,
                                    ast.ClassDef)):
                continue
            if isinstance(current, (ast.Call, ast.Attribute)):
                calls.append(current)
            if isinstance(current, ast.IfExp):
                self._expression(current.test, cls, branches, in_stream)
                self._expression(current.body, cls, branches | {(id(current), "body")}, in_stream)
                self._expression(current.orelse, cls, branches | {(id(current), "orelse")},
                                 in_stream)
                continue
            stack.extend(ast.iter_child_nodes(current))
        calls.sort(key=lambda n: (getattr(n, "end_lineno", 0), getattr(n, "end_col_offset", 0)))
        for call in calls:
            self._event(call, cls, branches, in_stream)

    def _event(self, node: ast.AST, cls, branches, in_stream: set[int]) -> None:
        self._order += 1
        event = _Event(node, self._order, frozenset(branches))
        if isinstance(node, ast.Attribute):
            if node.attr == "cuda_stream":
                self._use(self.refs(node.value), event)
            return
        assert isinstance(node, ast.Call)
        model = self.model
        resolved = model.bindings.resolve(node.func)
        method = method_name(node)
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        if resolved in STREAM_SCOPES:
            argument = node.args[0] if node.args else _keyword(node, "stream")
            self._use(self.refs(argument), event)
        stream_arg = _keyword(node, "stream")
        if stream_arg is not None and resolved not in GRAPH_CAPTURES:
            # a capture's stream records, it runs nothing: `replay()` runs on the current stream
            self._use(self.refs(stream_arg), event)
        if resolved == "torch.cuda.synchronize" or (resolved or "").endswith(
                "cuda.device_synchronize"):
            self.joins.append((None, event))
        elif method == "synchronize" and receiver is not None:
            joined = self.refs(receiver)
            if joined:
                self.joins.append((joined, event))
            elif not (self._is_current_stream(receiver)
                      or (isinstance(receiver, ast.Name) and receiver.id in self.current_names)):
                self.joins.append((None, event))  # an event's or device's synchronize
        elif method in ("wait_stream", "wait_event"):
            if self.refs(receiver):
                self._use(self.refs(receiver), event)
            elif in_stream:
                self.fake_joins.append(node)
            else:
                joined = self.refs(node.args[0]) if method == "wait_stream" and node.args else set()
                self.joins.append((joined or None, event))
        elif method == "wait":
            if not node.args or not self.refs(node.args[0]):
                self.joins.append((None, event))
        elif method == "record_stream" and node.args:
            self._use(self.refs(node.args[0]), event)
        for op in self.analysis.classify_all(node, cls):
            if op.kind is OpKind.HELPER and op.target is not None:
                owner = self.analysis.owner.get(op.target, self.analysis.class_of(op.target))
                with self._passed(node, op.target):
                    self.walk(op.target, owner, branches)

    @contextlib.contextmanager
    def _passed(self, call: ast.Call, target: FunctionNode) -> Iterator[None]:
        """While a helper is walked, its parameters denote the streams its call passes them
        (`launch(x, self.side)`, `Fn.apply(x, self.side)`), and nothing outside it."""
        params = [a.arg for a in (*target.args.posonlyargs, *target.args.args)]
        if params and params[0] in ("self", "cls", "ctx"):
            params = params[1:]  # bound by the call (`apply` passes the autograd context)
        passed = dict(zip(params, call.args)) if not any(
            isinstance(a, ast.Starred) for a in call.args) else {}
        passed.update({k.arg: k.value for k in call.keywords if k.arg})
        bound = {name: found for name, value in passed.items() if (found := self.refs(value))}
        saved = {name: self.names.get(name) for name in bound}
        for name, found in bound.items():
            self.names[name] = found
        try:
            yield
        finally:
            for name, before in saved.items():
                if before is None:
                    self.names.pop(name, None)
                else:
                    self.names[name] = before

    def _use(self, found: set[int], event: _Event) -> None:
        for i in found:
            self.streams[i].uses_forward.append(event)

    def joins_of(self, stream: int) -> list[_Event]:
        return [event for streams, event in self.joins if streams is None or stream in streams]

    def joined(self, stream: int, use: _Event) -> bool:
        """A join of this stream comes after the use and runs whenever the use runs."""
        return any(join.order > use.order and join.branches <= use.branches
                   for join in self.joins_of(stream))

    def scan_init(self, init: FunctionNode) -> bool:
        """Record `__init__`'s uses; True when it joins anything back."""
        joined = False
        for node in ast.walk(init):
            if isinstance(node, ast.Call):
                resolved = self.model.bindings.resolve(node.func)
                method = method_name(node)
                if resolved in STREAM_SCOPES:
                    argument = node.args[0] if node.args else _keyword(node, "stream")
                    for i in self.refs(argument):
                        self.streams[i].uses_init.append(node)
                if resolved == "torch.cuda.synchronize" or method in ("synchronize", "wait",
                                                                      "wait_event"):
                    joined = True
                elif method == "wait_stream" and not self.refs(node.func.value):  # type: ignore[attr-defined]
                    joined = True
        return joined


def _plain_names(target: ast.AST) -> list[str]:
    """Names bound by a plain target (`s`, `a, b`, `i, (s, c)`); attributes are not aliases."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _plain_names(element)]
    return []


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _short(model: SourceModel, node: ast.AST) -> str:
    text = " ".join(model.code_of(node).split())
    return text if len(text) <= 50 else text[:47] + "..."


class _CppStreams:
    """What a C++ stream expression is: the current stream, a created side stream, or other."""

    def __init__(self, index: CppIndex) -> None:
        self.index = index
        self.created: dict[tuple[int, str], CppCall] = {}
        self._joins: dict[int, bool] = {}

    def created_variable(self, call: CppCall) -> str | None:
        """`cudaStreamCreate(&s)` -> "s"; `auto s = at::cuda::getStreamFromPool();` -> "s"."""
        if call.short_name.startswith(("cudaStreamCreate", "cuStreamCreate")) and call.args:
            return _base_identifier(call.unit.text_of(call.args[0]))
        parent = call.node.parent
        while parent is not None and parent.type in ("call_expression", "field_expression",
                                                     "parenthesized_expression", "argument_list"):
            parent = parent.parent
        if parent is not None and parent.type == "init_declarator":
            name = parent.child_by_field_name("declarator")
            return call.unit.text_of(name) if name is not None else None
        if parent is not None and parent.type == "assignment_expression":
            left = parent.child_by_field_name("left")
            return _base_identifier(call.unit.text_of(left)) if left is not None else None
        return None

    def classify(self, node: tree_sitter.Node, function: CppFunction, depth: int = 0
                 ) -> CppCall | str:
        """"current", "param" (unknown, from outside C++), "other", or the creating call."""
        unit = function.unit
        written = compact(unit.text_of(node))
        if written in _NULL_STREAMS or any(w in written for w in _CURRENT_STREAM_WORDS):
            return "current"
        inner = _cast_operand(node)
        if inner is not None:
            return self.classify(inner, function, depth + 1)
        if node.type == "call_expression":
            callee = node.child_by_field_name("function")
            name = compact(unit.text_of(callee)) if callee is not None else ""
            short = name.split("<")[0].replace("->", ".").split("::")[-1].split(".")[-1]
            if short in CPP_CREATORS:
                return next((c for c in self.index.calls if c.node == node), "other")
            if short == "stream" and callee is not None and callee.type == "field_expression":
                inner = callee.child_by_field_name("argument")
                return self.classify(inner, function, depth + 1) if inner is not None else "other"
        variable = _base_identifier(written)
        if variable is None or depth > 6:
            return "other"
        made = self.created.get((id(unit), variable))
        if made is not None:
            return made
        params = [name for name, _type in parameters_of(function)]
        if variable in params:
            return self._from_callers(function, params.index(variable), depth)
        body = function.body
        values = local_values(unit, body) if body is not None else {}
        if variable not in values:
            values = local_values(unit, unit.tree.root_node)
        if variable not in values:
            return "other"
        verdicts = [self.classify(v, function, depth + 1) for v in values[variable]]
        for verdict in verdicts:
            if isinstance(verdict, CppCall) or verdict == "other":
                return verdict
        return "param" if "param" in verdicts else "current"

    def _from_callers(self, function: CppFunction, position: int, depth: int) -> CppCall | str:
        callers = callers_of(self.index, function)
        if not callers:
            return "param"  # reached from Python only; the Python side is checked there
        verdicts = []
        for call in callers:
            if call.function is None or position >= len(call.args):
                verdicts.append("param")
                continue
            verdicts.append(self.classify(call.args[position], call.function, depth + 1))
        for verdict in verdicts:
            if isinstance(verdict, CppCall):
                return verdict
        if "other" in verdicts:
            return "other"
        return "param" if "param" in verdicts else "current"

    def joins(self, function: CppFunction) -> bool:
        key = id(function)
        if key not in self._joins:
            self._joins[key] = any(c.short_name in CPP_JOINS for c in calls_in(self.index, function))
        return self._joins[key]


def _cast_operand(node: tree_sitter.Node) -> tree_sitter.Node | None:
    """`(cudaStream_t)h`, `reinterpret_cast<cudaStream_t>(h)`, `(h)` -> the node of `h`."""
    if node.type == "parenthesized_expression" and node.named_child_count == 1:
        return node.named_children[0]
    if node.type == "cast_expression":
        return node.child_by_field_name("value")
    if node.type == "call_expression":
        callee = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        if callee is not None and callee.type == "template_function" and arguments is not None \
                and arguments.named_child_count == 1:
            name = callee.child_by_field_name("name")
            if name is not None and name.type == "identifier" and \
                    name.text in (b"reinterpret_cast", b"static_cast", b"const_cast",
                                  b"bit_cast"):
                return arguments.named_children[0]
    return None


def _base_identifier(written: str) -> str | None:
    """`&streams[i]` -> "streams", `side` -> "side", `ctx.stream` -> None."""
    text = compact(written).lstrip("&*(").rstrip(")")
    text = text.split("[")[0]
    return text if text.isidentifier() else None
