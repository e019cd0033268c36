import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, Op, OpKind, walk_code
from kaudit.integrity import (
    ModuleFacts,
    assignments_in,
    depends_on_inputs,
    first_line,
    method_name,
    word_set,
)
from kaudit.python_scope import dotted_parts
from kaudit.rule import Rule
from kaudit.source import FunctionNode, SourceModel

CACHE_DECORATORS = frozenset({
    "functools.cache", "functools.lru_cache", "functools.cached_property",
    "cachetools.cached", "cachetools.func.lru_cache", "cachetools.func.ttl_cache",
    "methodtools.lru_cache",
})
GRAPH_NAMES = frozenset({"torch.cuda.CUDAGraph", "torch.cuda.graphs.CUDAGraph", "torch.cuda.graph",
                         "torch.cuda.graphs.graph"})
# methods that hand back (a view or copy of) the object they are called on
PASS_THROUGH = frozenset({
    "clone", "detach", "view", "view_as", "reshape", "reshape_as", "to", "contiguous", "float",
    "half", "bfloat16", "type_as", "expand", "expand_as", "squeeze", "unsqueeze", "permute",
    "transpose", "t", "flatten", "cuda", "requires_grad_", "detach_",
})
READ_METHODS = frozenset({"get", "setdefault", "pop", "__getitem__"})
STORE_METHODS = frozenset({"setdefault", "update", "__setitem__"})


@dataclass
class _Read:
    key: str  # "self._cache", "_RESULTS"
    node: ast.expr  # the read expression (`self._cache[k]`, `self._out`)
    via: ast.expr | None  # the name it was returned through, if any
    index: ast.expr | None  # the key it was looked up with, if any


class OutputCaching(Rule):
    """The forward path hands back a stored result instead of computing it for these inputs.

    ## What it does
    Follows `ModelNew.forward` and the helpers whose result it returns, and reports:
    - a `return` of a value read from a store that the forward path fills with results computed
      from its inputs (a dict keyed on `x.data_ptr()`, `id(x)`, `x.shape`, a hash of the content,
      or a plain attribute such as `self._out`), when the return is conditional
      (`if key in self._cache: return self._cache[key]`, `if self._out is not None: return
      self._out`) or the store is (`if key not in cache: cache[key] = ext.run(x)` then `return
      cache[key]`), and the returned buffer is not handed to a kernel first;
    - `functools.cache`/`lru_cache` (any alias, also `lru_cache(...)(fn)`) on `forward` or on a
      helper that launches a custom kernel;
    - a CUDA graph (`torch.cuda.CUDAGraph`, `torch.cuda.graph`) whose `.replay()` on the forward
      path is not preceded, in the same function, by copying the inputs into the graph's static
      buffers (`static_x.copy_(x)` or `static_x[...] = x`).
    Caching a compiled extension, weights transposed once, kernels or configurations keyed by
    dtype or shape, and output buffers reused across calls are not reported when every call
    writes them before returning them: handed to a kernel, `torch.op(..., out=buf)`,
    `buf.copy_(...)`, an in-place method (`buf.addmm_(...)`) or `buf[...] = ...`, outside any
    branch the return is not also in (a write made only on the first call does not count).

    ## Why is this bad?
    Harnesses run the kernel on the same inputs several times (warm-up, correctness trials, timed
    loop). A submission that remembers its first answer is timed doing nothing, and a graph
    replayed without fresh inputs recomputes the captured inputs' result.

    ## Example
    ```python
    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self._cache = {}

        def forward(self, x):
            key = x.data_ptr()
            if key in self._cache:
                return self._cache[key]
            out = ext.softmax_cuda(x)
            self._cache[key] = out
            return out
    ```
    """

    code = "KA302"
    name = "output-caching"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("integrity", "timing", "caching")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        if analysis.forward is None:
            return
        yield from self._decorators(model, analysis)
        yield from self._stored_results(model, analysis)
        yield from self._graphs(model, analysis)

    # --- functools caches ---------------------------------------------------------------------

    def _decorators(self, model: SourceModel, analysis: ForwardAnalysis) -> Iterator[Finding]:
        for function in analysis.reachable:
            for decorator in function.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                resolved = model.bindings.resolve(target)
                if resolved not in CACHE_DECORATORS:
                    continue
                if function is analysis.forward or self._runs_kernel(analysis, function):
                    what = model.entry_name if function is analysis.forward \
                        else f"`{function.name}` (reached from {model.entry_name}, runs a kernel)"
                    yield self.report(
                        model, decorator,
                        f"`@{first_line(model, decorator, 40)}` memoises {what}: repeated calls "
                        "with the same arguments return the stored result without running it")
        if not {"functools", "lru_cache", "cachetools", "methodtools"} & word_set(model):
            return  # the decorators above can only come from these modules
        for call in ModuleFacts.of(model).calls:
            wrapper = call.func
            wrapped = call.args[0] if call.args else None
            if isinstance(wrapper, ast.Call):
                wrapper = wrapper.func  # lru_cache(maxsize=None)(fn)
            if model.bindings.resolve(wrapper) not in CACHE_DECORATORS \
                    or not isinstance(wrapped, ast.Name):
                continue
            function = model.functions.get(wrapped.id)
            if function is not None and self._runs_kernel(analysis, function):
                yield self.report(
                    model, call,
                    f"`{first_line(model, call, 50)}` memoises `{function.name}`, which runs a "
                    "custom kernel: repeated calls return the stored result")

    @staticmethod
    def _runs_kernel(analysis: ForwardAnalysis, function: FunctionNode) -> bool:
        owner = analysis.owner.get(function)
        return OpKind.CUSTOM_KERNEL in analysis.kinds_reached(function.body, owner)

    # --- stored results -----------------------------------------------------------------------

    def _stored_results(self, model: SourceModel, analysis: ForwardAnalysis) -> Iterator[Finding]:
        computed: list = []  # the stores, found once the first candidate read turns up

        def all_stores() -> tuple[dict, dict]:
            if not computed:
                computed.append(self._tainted_stores(model, analysis))
            return computed[0]

        pending: list[FunctionNode] = [analysis.forward]  # type: ignore[list-item]
        done: set[int] = set()
        reported: set[int] = set()
        while pending:
            function = pending.pop()
            if id(function) in done:
                continue
            done.add(id(function))
            ops = {id(op.node): op for op in analysis.function_ops(function)}
            locals_ = assignments_in(function)
            parents: dict[int, ast.AST] = {}
            replays: list[int] | None = None
            for ret in _returns(function):
                reads: list[_Read] = []
                for leaf, via in _leaves(ret.value, locals_):
                    op = ops.get(id(leaf))
                    if op is not None and op.kind is OpKind.HELPER and op.target is not None:
                        pending.append(op.target)
                        continue
                    read = _as_read(leaf, via, function, locals_, model)
                    if read is None:
                        continue
                    stores, stored_values = all_stores()
                    if read.key in stores:
                        reads.append(read)
                    # `self._out = self._impl(x); return self._out`: `_impl` produces the output
                    for owner, value in stored_values.get(read.key, []):
                        owner_ops = {id(o.node): o for o in analysis.function_ops(owner)}
                        for inner, _via in _leaves(value, assignments_in(owner)):
                            op = owner_ops.get(id(inner))
                            if op is not None and op.kind is OpKind.HELPER and op.target:
                                pending.append(op.target)
                if reads and replays is None:
                    parents = _parents(function)
                    replays = [n.lineno for n in _walk(function.body)
                               if isinstance(n, ast.Call) and method_name(n) == "replay"]
                    # a helper that replays the graph (`if self._run_graph(x): return out`)
                    replays += [getattr(op.node, "lineno", 0) for op in
                                analysis.function_ops(function)
                                if op.kind is OpKind.HELPER and op.target is not None
                                and any(isinstance(n, ast.Call) and method_name(n) == "replay"
                                        for n in _walk(op.target.body))]
                if reads and any(line <= ret.lineno for line in replays or ()):
                    continue  # a graph's static output, refreshed by the replay (see `_graphs`)
                for read in reads:
                    if id(read.node) in reported:
                        continue
                    conditional = _inside_branch(ret, parents)
                    own = [s for s in stores[read.key] if s[0] is function]
                    if not conditional and not (own and all(_inside_branch(s[1], parents)
                                                             for s in own)):
                        continue
                    if _consumed(read, ret, analysis.function_ops(function), parents) \
                            or _rewritten(read, ret, function, parents, model):
                        continue
                    reported.add(id(read.node))
                    store = stores[read.key][0][1]
                    shown = f"`{first_line(model, read.node, 40)}`"
                    if read.via is not None:
                        shown = f"`{first_line(model, read.via, 20)}` ({shown})"
                    yield self.report(
                        model, ret,
                        f"returns {shown}, a result stored by the forward path (line "
                        f"{model.line_of(store)}: `{first_line(model, store, 40)}`)"
                        f"{_keyed(model, read, function)}, instead of computing it for these "
                        "inputs")

    def _tainted_stores(self, model: SourceModel, analysis: ForwardAnalysis
                        ) -> tuple[dict[str, list[tuple[FunctionNode, ast.AST]]],
                                   dict[str, list[tuple[FunctionNode, ast.expr]]]]:
        """Store name -> (function, statement) where the forward path stores a value computed
        from that function's inputs into it; and store name -> (function, value) for every
        store on the forward path."""
        module_names = _module_names(model)
        stores: dict[str, list[tuple[FunctionNode, ast.AST]]] = {}
        values: dict[str, list[tuple[FunctionNode, ast.expr]]] = {}
        for function in analysis.reachable:
            declared_global = {n for node in _walk(function.body) if isinstance(node, ast.Global)
                               for n in node.names}
            aliases = _store_aliases(function, module_names)
            for node in _walk(function.body):
                pairs: list[tuple[ast.AST, ast.AST]] = []  # (target, value)
                if isinstance(node, ast.Assign):
                    pairs = [(t, node.value) for t in node.targets]
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    pairs = [(node.target, node.value)]
                elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                        and method_name(node.value) in STORE_METHODS:
                    call = node.value
                    stored = call.args if method_name(call) == "update" else call.args[1:]
                    pairs = [(ast.Subscript(value=call.func.value, slice=ast.Constant(0)),  # type: ignore[attr-defined]
                              ast.Tuple(elts=list(stored), ctx=ast.Load()))]
                for target, value in pairs:
                    key = _store_key(target, declared_global, module_names, aliases)
                    if not key:
                        continue
                    values.setdefault(key, []).append((function, value))  # type: ignore[arg-type]
                    if depends_on_inputs(model, function, value):
                        stores.setdefault(key, []).append((function, node))
        return stores, values

    # --- CUDA graphs ----------------------------------------------------------------------------

    def _graphs(self, model: SourceModel, analysis: ForwardAnalysis) -> Iterator[Finding]:
        if "raph" not in model.text:  # CUDAGraph, torch.cuda.graph, and their aliases
            return
        facts = ModuleFacts.of(model)
        if not any(model.bindings.resolve(c.func) in GRAPH_NAMES for c in facts.calls):
            return
        for function in analysis.reachable:
            ops = analysis.function_ops(function)
            for node in _walk(function.body):
                if not (isinstance(node, ast.Call) and method_name(node) == "replay"
                        and not node.args):
                    continue
                if self._fresh_inputs_copied(model, analysis, function, node, ops):
                    continue
                yield self.report(
                    model, node,
                    f"CUDA graph `{first_line(model, node.func, 40)}` is replayed without first "
                    "copying this call's inputs into its static input buffers (no "
                    "`static_x.copy_(x)` before the replay in "
                    f"`{function.name}`), so it returns the result for the captured inputs")

    @staticmethod
    def _fresh_inputs_copied(model: SourceModel, analysis: ForwardAnalysis,
                             function: FunctionNode, replay: ast.Call, ops: list[Op]) -> bool:
        """This call's inputs reach the graph's static buffers before the replay, on every path
        that replays: `static_x.copy_(x)`, `static_x[...] = x`, or static inputs cloned from
        the inputs and then captured."""
        line = replay.lineno
        parents = _parents(function)
        needed = _branches(replay, parents)
        for node in _walk(function.body):
            if getattr(node, "lineno", line + 1) > line or not _branches(node, parents) <= needed:
                continue
            if isinstance(node, ast.Call) and method_name(node) == "copy_" and node.args \
                    and depends_on_inputs(model, function, node.args[0]):
                return True
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript)
                                                    for t in node.targets) \
                    and depends_on_inputs(model, function, node.value):
                return True
            if isinstance(node, ast.Assign) and depends_on_inputs(model, function, node.value) \
                    and any(isinstance(n, ast.Call) and method_name(n) in ("clone", "copy_")
                            for n in ast.walk(node.value)):
                return True  # static inputs cloned from this call's inputs, then captured
        for op in ops:  # a helper that copies its arguments into the static buffers
            if op.kind is OpKind.HELPER and op.target is not None \
                    and getattr(op.node, "lineno", line + 1) <= line \
                    and any(depends_on_inputs(model, function, a)
                            for a in getattr(op.node, "args", [])):
                if any(isinstance(n, ast.Call) and method_name(n) == "copy_"
                       for n in _walk(op.target.body)):
                    return True
        return False


# --- helpers --------------------------------------------------------------------------------------

def _walk(nodes: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """Nodes of a function body, not entering nested functions, lambdas or classes."""
    return walk_code(nodes, into_functions=False)


def _returns(function: FunctionNode) -> Iterator[ast.Return]:
    for node in _walk(function.body):
        if isinstance(node, ast.Return) and node.value is not None:
            yield node


def _parents(function: FunctionNode) -> dict[int, ast.AST]:
    parents: dict[int, ast.AST] = {}
    for node in _walk(function.body):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return parents


def _inside_branch(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """True when `node` runs only on some paths: under an `if`, a loop or an `except`."""
    current = parents.get(id(node))
    while current is not None:
        if isinstance(current, (ast.If, ast.IfExp, ast.While, ast.For, ast.ExceptHandler,
                                ast.match_case)):
            return True
        current = parents.get(id(current))
    return False


def _leaves(expr: ast.AST, locals_: dict[str, list[ast.expr]], via: ast.expr | None = None,
            depth: int = 0) -> Iterator[tuple[ast.expr, ast.expr | None]]:
    """What a returned expression can be: tuple elements, both arms of `a if c else b`, the
    receiver of `.clone()`-like calls, and the values a returned local name was assigned."""
    if depth > 6:
        return
    if isinstance(expr, (ast.Tuple, ast.List)):
        for element in expr.elts:
            yield from _leaves(element, locals_, via, depth + 1)
    elif isinstance(expr, ast.IfExp):
        yield from _leaves(expr.body, locals_, via, depth + 1)
        yield from _leaves(expr.orelse, locals_, via, depth + 1)
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr in PASS_THROUGH:
        yield from _leaves(expr.func.value, locals_, via, depth + 1)
    elif isinstance(expr, ast.Name) and expr.id in locals_:
        for value in locals_[expr.id]:
            yield from _leaves(value, locals_, via or expr, depth + 1)
    elif isinstance(expr, (ast.Call, ast.Subscript, ast.Attribute, ast.Name)):
        yield expr, via  # type: ignore[misc]


def _store_aliases(function: FunctionNode, module_names: set[str]) -> dict[str, str]:
    """`cache = self._cache` inside a function -> {"cache": "self._cache"}."""
    out: dict[str, str] = {}
    for name, values in assignments_in(function).items():
        if len(values) == 1:
            parts = dotted_parts(values[0])
            if parts and ((parts[0] == "self" and len(parts) == 2)
                          or (len(parts) == 1 and parts[0] in module_names)):
                out[name] = ".".join(parts)
    return out


def _store_key(target: ast.AST, declared_global: set[str], module_names: set[str],
               aliases: dict[str, str]) -> str | None:
    container = target.value if isinstance(target, ast.Subscript) else None
    parts = dotted_parts(container if container is not None else target)
    if not parts:
        return None
    if parts[0] == "self" and len(parts) == 2:
        return ".".join(parts)
    if len(parts) == 1:
        if parts[0] in aliases and container is not None:
            return aliases[parts[0]]
        if (container is not None and parts[0] in module_names) or parts[0] in declared_global:
            return parts[0]
    return None


def _as_read(leaf: ast.expr, via: ast.expr | None, function: FunctionNode,
             locals_: dict[str, list[ast.expr]], model: SourceModel) -> _Read | None:
    container: ast.AST | None = None
    index: ast.expr | None = None
    if isinstance(leaf, ast.Subscript):
        container, index = leaf.value, leaf.slice
    elif isinstance(leaf, ast.Call) and method_name(leaf) in READ_METHODS and leaf.args:
        container, index = leaf.func.value, leaf.args[0]  # type: ignore[attr-defined]
    parts = dotted_parts(container if container is not None else leaf)
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "self"):
        return None
    key = ".".join(parts)
    if len(parts) == 1:
        if container is not None and key in locals_:  # `store = self._cache; store[k]`
            values = locals_[key]
            alias = dotted_parts(values[0]) if len(values) == 1 else None
            if not alias:
                return None
            key = ".".join(alias)
        elif key not in _module_names(model):
            return None  # a local or a parameter, not something kept between calls
    return _Read(key, leaf, via, index)


def _module_names(model: SourceModel) -> set[str]:
    """Names assigned at module level (where a cache kept between calls can live)."""
    def build() -> set[str]:
        names: set[str] = set()
        for statement in model.module.body if model.module is not None else []:
            targets = statement.targets if isinstance(statement, ast.Assign) else \
                [statement.target] if isinstance(statement, ast.AnnAssign) else []
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        return names

    return model.memo("module-names", build)


def _consumed(read: _Read, ret: ast.Return, ops: list[Op], parents: dict[int, ast.AST]) -> bool:
    """The returned buffer is handed to a kernel (or a helper) before it is returned, on every
    path that reaches the return, so it is a reused output buffer, not a stored answer."""
    needed = _branches(ret, parents)
    wanted = {ast.dump(read.node)}
    if read.via is not None:
        wanted.add(ast.dump(read.via))
    for op in ops:
        if op.kind not in (OpKind.CUSTOM_KERNEL, OpKind.HELPER) or not isinstance(op.node, ast.Call):
            continue
        line = getattr(op.node, "lineno", 0)
        if line > ret.lineno or (read.via is not None and line < read.node.lineno):
            continue
        arguments = [*op.node.args, *(k.value for k in op.node.keywords)]
        if any(ast.dump(a) in wanted for a in arguments) and \
                _branches(op.node, parents) <= needed:
            return True
    return False


def _rewritten(read: _Read, ret: ast.Return, function: FunctionNode,
               parents: dict[int, ast.AST], model: SourceModel) -> bool:
    """The returned attribute is written on every path that reaches the return, before it:
    `torch.op(..., out=self.buf)`, `self.buf.copy_(...)`, `self.buf.add_(...)`, `self.buf[...] =
    ...`, or `self.out = ...` just computed. A write under a branch the return is not also in (a
    first-call warm-up, `if self.out is None: self.out = ...`) does not count."""
    if read.index is not None:
        return False  # a lookup in a cache keyed on the inputs
    keys = {read.key} | ({read.via.id} if isinstance(read.via, ast.Name) else set())
    for _ in range(2):  # `self.out_t = self.out.T` then `torch.matmul(..., out=self.out_t)`
        for node in _walk(function.body):
            if isinstance(node, ast.Assign) and _is_view_of(node.value, keys):
                keys.update(".".join(p) for p in map(dotted_parts, node.targets) if p)
    needed = _branches(ret, parents)
    writes: set[frozenset[tuple[int, str]]] = set()
    for node in _walk(function.body):
        if getattr(node, "lineno", ret.lineno + 1) > ret.lineno:
            continue
        written = False
        if isinstance(node, ast.Call):
            out = next((k.value for k in node.keywords if k.arg == "out"), None)
            method = method_name(node)
            receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
            written = (out is not None and _is_view_of(out, keys)) or _pointer_passed(
                node, keys, model) or (
                receiver is not None and _is_view_of(receiver, keys) and method is not None
                and method.endswith("_") and not method.startswith("_")
                and method not in ("zero_", "fill_", "detach_", "requires_grad_"))
        elif isinstance(node, ast.Assign):  # `self.buf[...] = v`, or `self.out = fresh` then return
            written = any((isinstance(t, ast.Subscript) and _names(t.value, keys))
                          or _names(t, {read.key}) for t in node.targets)
        if written:
            writes.add(frozenset(_branches(node, parents)))
    return any(branches <= needed for branches in _joined(writes))


def _joined(writes: set[frozenset[tuple[int, str]]]) -> set[frozenset[tuple[int, str]]]:
    """Writes made in both arms of an `if` count as made before it."""
    found = set(writes)
    grew = True
    while grew:
        grew = False
        for branches in list(found):
            for conditional, part in branches:
                if part != "body":
                    continue
                rest = branches - {(conditional, part)}
                if rest | {(conditional, "orelse")} in found and rest not in found:
                    found.add(rest)
                    grew = True
    return found


_INSPECTING = frozenset({"print", "len", "isinstance", "id", "hash", "str", "repr", "type",
                         "getattr", "hasattr", "bool", "float", "int"})


def _pointer_passed(call: ast.Call, keys: set[str], model: SourceModel) -> bool:
    """The buffer, a view of it or its `data_ptr()` is handed to code outside PyTorch (a kernel,
    a helper: `self._matmul_into(a, b, self.out)`, `kernel(grid, block, (self.out.data_ptr(),
    ...))`), which writes it."""
    resolved = model.bindings.resolve(call.func) or ""
    if resolved.startswith("torch.") or (isinstance(call.func, ast.Name)
                                         and call.func.id in _INSPECTING):
        return False
    for argument in [*call.args, *(k.value for k in call.keywords)]:
        for node in ast.walk(argument):
            if isinstance(node, ast.Call) and method_name(node) == "data_ptr" \
                    and _is_view_of(node.func.value, keys):  # type: ignore[attr-defined]
                return True
            if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) \
                    and _is_view_of(node, keys):
                return True
    return False


def _is_view_of(expr: ast.AST, keys: set[str]) -> bool:
    """`buf.T`, `buf[0]`, `buf.view(...)`, `buf.transpose(0, 1)` for a `buf` in `keys`."""
    while True:
        if isinstance(expr, ast.Subscript) or (isinstance(expr, ast.Attribute)
                                               and expr.attr in ("T", "mT")):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in PASS_THROUGH | {"narrow", "select", "chunk", "split"}:
            expr = expr.func.value
        else:
            parts = dotted_parts(expr)
            return parts is not None and ".".join(parts) in keys


def _names(expr: ast.AST, keys: set[str]) -> bool:
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    parts = dotted_parts(expr)
    return parts is not None and ".".join(parts) in keys


def _branches(node: ast.AST, parents: dict[int, ast.AST]) -> set[tuple[int, str]]:
    """The branches a node runs under: (conditional statement, which of its parts)."""
    found: set[tuple[int, str]] = set()
    child, current = node, parents.get(id(node))
    while current is not None:
        if isinstance(current, (ast.If, ast.IfExp, ast.While, ast.For, ast.ExceptHandler,
                                ast.match_case)):
            part = next((name for name in ("body", "orelse", "test", "iter")
                         if _holds(getattr(current, name, None), child)), "")
            if part in ("body", "orelse"):
                found.add((id(current), part))
        child, current = current, parents.get(id(current))
    return found


def _holds(field: object, child: ast.AST) -> bool:
    return field is child or (isinstance(field, list) and any(item is child for item in field))


def _keyed(model: SourceModel, read: _Read, function: FunctionNode) -> str:
    """", keyed on `x.data_ptr()`" when the lookup key says what it is."""
    if read.index is None:
        return ""
    expressions = [read.index]
    locals_ = assignments_in(function)
    for node in ast.walk(read.index):
        if isinstance(node, ast.Name) and node.id in locals_:
            expressions.extend(locals_[node.id])
    kinds = []
    for expr in expressions:
        for node in ast.walk(expr):
            if isinstance(node, ast.Attribute) and node.attr in ("data_ptr", "shape", "size",
                                                                  "untyped_storage", "_version"):
                kinds.append(f"`.{node.attr}`")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("id", "hash"):
                kinds.append(f"`{node.func.id}()`")
            elif isinstance(node, ast.Attribute) and node.attr in ("item", "tobytes", "sum",
                                                                    "hexdigest", "digest"):
                kinds.append("the tensor's content")
    kinds = list(dict.fromkeys(kinds))
    return f", keyed on {', '.join(kinds)}" if kinds else \
        f", keyed on `{first_line(model, read.index, 30)}`"
