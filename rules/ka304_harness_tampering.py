import ast
import re
from collections.abc import Iterable, Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.integrity import (
    ModuleFacts,
    first_line,
    imported_names,
    statement_targets,
    word_set,
)
from kaudit.python_scope import dotted_parts
from kaudit.rule import Rule
from kaudit.source import SourceModel

# settings that are meant to be assigned (their effect on numerics is the KA4xx rules' business)
CONFIG_PREFIXES = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.",
                   "torch._functorch.config.", "torch.fx.experimental._config.",
                   "triton.runtime.cache.", "numpy.set_printoptions")
INTROSPECTION = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "inspect.stack",
    "inspect.currentframe", "inspect.getouterframes", "inspect.getinnerframes", "inspect.trace",
    "sys._getframe", "sys._current_frames", "traceback.walk_stack", "sys.settrace",
    "sys.setprofile", "threading.settrace", "sys.modules.__setitem__",
})
FRAME_ATTRIBUTES = frozenset({"f_back", "f_locals", "f_globals", "tb_frame"})
DISPATCH_ESCAPES = frozenset({
    "_disable_current_modes", "_len_torch_dispatch_stack", "_pop_torch_dispatch_stack",
    "_pop_mode_temporarily", "_pop_mode", "_DisableTorchDispatch", "DisableTorchFunction",
    "DisableTorchFunctionSubclass", "_get_current_dispatch_mode",
    "_get_current_dispatch_mode_stack", "_len_torch_function_stack", "_pop_torch_function_stack",
    "_set_torch_function_mode", "_unset_torch_dispatch_mode", "_disable_torch_function",
    "_disabled_torch_function_impl",
})
MUTATING_CALLS = frozenset({"setattr", "delattr"})
# sys.modules: methods that change it or enumerate it (a membership test or `sys.modules[__name__]`
# is left alone)
MODULES_CHANGED = frozenset({"update", "pop", "setdefault", "__setitem__", "__delitem__", "clear",
                             "popitem"})
MODULES_LISTED = frozenset({"values", "items", "keys", "copy"})
LISTING_CALLS = frozenset({"list", "tuple", "sorted", "dict", "set", "iter", "enumerate"})
# attributes whose rebinding on the model (its instance or its class) replaces what a harness calls
MODEL_ENTRY_POINTS = frozenset({"forward", "__call__", "__class__", "_call_impl"})
# decoders of a hidden payload, for exec/eval/compile
PAYLOAD_DECODERS = frozenset({
    "base64.b64decode", "base64.b32decode", "base64.b16decode", "base64.a85decode",
    "base64.b85decode", "base64.decodebytes", "base64.urlsafe_b64decode",
    "base64.standard_b64decode", "zlib.decompress", "bz2.decompress", "lzma.decompress",
    "gzip.decompress", "codecs.decode", "marshal.loads", "binascii.a2b_base64",
    "binascii.unhexlify", "binascii.a2b_hex", "bytes.fromhex", "pickle.loads"})
CODE_RUNNERS = frozenset({"exec", "eval", "compile", "types.FunctionType", "types.CodeType",
                          "builtins.exec", "builtins.eval", "builtins.compile"})
# another process's memory, through libc
PROCESS_MEMORY = frozenset({"ptrace", "process_vm_writev", "process_vm_readv"})
# /proc files with nothing of another process in them
HARMLESS_PROC = frozenset({"/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/loadavg",
                           "/proc/version", "/proc/self/status", "/proc/driver/nvidia/version",
                           "/proc/self/cgroup", "/proc/sys/kernel/perf_event_paranoid"})
_ENTRY_POINT_ASSIGN = re.compile(r"\.\s*(?:forward|__call__|__class__|_call_impl)\s*=(?!=)")
# a line that assigns to `name.attr...` (or `name.attr[...]`), name not `self`: a cheap text test
# that spares most files the walk over their statements
_DOTTED_ASSIGN = re.compile(
    r"^[ \t]*(?!self\b)([A-Za-z_]\w*)[ \t]*\.[\w., \t]*(?:\[[^\]\n]*\])?[ \t]*(?:=(?!=)|[-+*/@%&|^]=)",
    re.M)
_DELETE = re.compile(r"^[ \t]*del\b", re.M)
# a file can only reach the names above if one of these words is in its text
_PREFILTER = frozenset({"setattr", "delattr", "__setattr__", "__delattr__", "__builtins__", "gc",
                        "inspect", "sys", "traceback", "settrace", "modules", "proc", "ctypes",
                        "exec", "eval", "compile", "FunctionType", "CodeType"}) \
    | FRAME_ATTRIBUTES | DISPATCH_ESCAPES | PROCESS_MEMORY


class HarnessTampering(Rule):
    """The file rebinds what the harness relies on, or reads the harness's own state.

    ## What it does
    Anywhere in the file (module level too, but not under `if __name__ == "__main__":`), reports:
    - assignments to (or `del` of) an attribute of an imported module or name: `torch.allclose =
      ...`, `F.softmax = ...`, `time.perf_counter = ...`, `torch.cuda.Event.elapsed_time = ...`,
      `Model.forward = ...`, also through `setattr`/`delattr`/`object.__setattr__` and
      `module.__dict__[...] = ...`; settings meant to be assigned (`torch.backends.*`,
      `torch._dynamo.config.*`) are left to other rules;
    - edits of builtins (`builtins.X = ...`, `__builtins__[...] = ...`, `setattr(builtins, ...)`);
    - walking the interpreter's state: `gc.get_objects`/`get_referrers`, `inspect.stack`/
      `currentframe`, `sys._getframe`, `sys.settrace`, frame attributes (`f_back`, `f_locals`);
    - escaping PyTorch's dispatch and function modes: `torch._C._disable_current_modes`,
      `torch.utils._python_dispatch._disable_current_modes`, `_len_torch_dispatch_stack`,
      `_pop_mode_temporarily`, `DisableTorchFunction` and similar;
    - changing or listing `sys.modules` (`sys.modules[...] = ...`, `setattr(sys.modules["torch"],
      ...)`, `sys.modules.values()`, `for name in sys.modules`); a membership test and
      `sys.modules[__name__]` are left alone;
    - paths into `/proc` other than system information (`/proc/cpuinfo`, `/proc/meminfo`, ...):
      `/proc/self/mem`, `f"/proc/{pid}/environ"`; and libc's `ptrace`/`process_vm_writev`;
    - `ctypes` reaching a Python object's memory (`ctypes.pythonapi`, a ctypes call or
      `from_address` given `id(...)`); ctypes on tensor pointers (`x.data_ptr()`) is left alone;
    - rebinding the model's entry points: `self.forward = ...`, `self.__class__ = ...`,
      `ModelNew.__call__ = ...`, `type(self).forward = ...`, `setattr(self, "forward", ...)`;
    - `exec`/`eval`/`compile` (or `types.FunctionType`) of a payload decoded at run time
      (`base64`, `zlib`, `codecs`, `marshal`, `bytes.fromhex`, ...), directly or through a name.

    ## Why is this bad?
    A submission that replaces `torch.allclose`, the timer or `Event.elapsed_time` decides its own
    verdict; one that searches the garbage collector or caller frames can find the reference
    output and return it; one that disables dispatch modes escapes the harness's op tracing. One
    that rebinds functions through `sys.modules` or its own `forward` after the class is defined
    runs something other than the code the audit read; one that reads `/proc` or uses ctypes on
    Python objects can read or rewrite the harness's memory; an encoded payload hides the code.

    ## Example
    ```python
    import torch

    torch.allclose = lambda *args, **kwargs: True

    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.run(x)
    ```
    """

    code = "KA304"
    name = "harness-tampering"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("integrity", "tampering")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        seen_lines: set[int] = set()
        for node, message in self._findings(model):
            line = model.line_of(node)
            if line not in seen_lines:
                seen_lines.add(line)
                yield self.report(model, node, message)

    def _findings(self, model: SourceModel) -> Iterator[tuple[ast.AST, str]]:
        imported = imported_names(model)
        for target, statement in statement_targets(model) if _may_rebind(model, imported) else ():
            described = self._rebound(model, target, imported)
            if described:
                verb = "deletes" if isinstance(statement, ast.Delete) else "rebinds"
                yield target, (f"{verb} {described}, which belongs to an imported module or "
                               "name: the harness (or the reference) then runs this file's "
                               "replacement")
        if _ENTRY_POINT_ASSIGN.search(model.text) or "modules" in word_set(model):
            for target, _statement in statement_targets(model):
                described = _entry_point_or_modules(model, target)
                if described:
                    yield target, described
        if not _PREFILTER & word_set(model):
            return
        facts = ModuleFacts.of(model)
        for call in facts.calls:
            yield from self._call(model, call, imported)
            yield from _reaching_calls(model, call)
        for attribute in facts.attributes:
            resolved = model.bindings.resolve(attribute)
            if resolved in INTROSPECTION:
                yield attribute, (f"uses `{resolved}`, which walks the interpreter's objects or "
                                  "frames: it can find the harness's reference output or inputs")
            elif attribute.attr in FRAME_ATTRIBUTES:
                yield attribute, (f"reads frame attribute `.{attribute.attr}` "
                                  f"(`{first_line(model, attribute, 40)}`): code that walks caller "
                                  "frames can read the harness's local variables")
            elif attribute.attr in DISPATCH_ESCAPES and (resolved or "").startswith("torch."):
                yield attribute, self._dispatch_message(resolved or attribute.attr)
            elif resolved == "ctypes.pythonapi":
                yield attribute, ("uses `ctypes.pythonapi`, the interpreter's own C functions: it "
                                  "can read and rewrite any Python object, the harness's too")
            elif attribute.attr in PROCESS_MEMORY:
                yield attribute, (f"uses `{attribute.attr}`, which reads or writes another "
                                  "process's memory (the harness's, or the auditor's)")
        for node in _proc_paths(model):
            yield node, (f"uses the path `{first_line(model, node, 40)}` in /proc: another "
                         "process's (or its own) memory, environment or state, the harness's "
                         "included, is reachable there")
        for loop in _module_walk(model, ast.For):
            if model.bindings.resolve(loop.iter) == "sys.modules":
                yield loop.iter, _MODULES_LISTED_MESSAGE
        for name in facts.names:
            resolved = model.bindings.resolve(name)
            if resolved is None or name.id not in imported:
                continue
            if resolved in INTROSPECTION:
                yield name, (f"uses `{resolved}` (imported as `{name.id}`), which walks the "
                             "interpreter's objects or frames: it can find the harness's "
                             "reference output or inputs")
            elif resolved.split(".")[-1] in DISPATCH_ESCAPES and resolved.startswith("torch."):
                yield name, self._dispatch_message(resolved)

    @staticmethod
    def _dispatch_message(resolved: str) -> str:
        return (f"uses `{resolved}`, which disables or inspects PyTorch's dispatch/function "
                "modes: the harness's op tracing and checks stop seeing what runs")

    @staticmethod
    def _rebound(model: SourceModel, target: ast.AST, imported: dict[str, str]) -> str | None:
        """The imported thing an assignment target writes into, as written, or None."""
        if isinstance(target, ast.Subscript):
            inner = target.value
            if isinstance(inner, ast.Name) and inner.id == "__builtins__":
                return f"`{first_line(model, target, 50)}`"
            if isinstance(inner, ast.Attribute) and inner.attr == "__dict__":
                parts = dotted_parts(inner.value)
                if parts and (parts[0] in imported or parts[0] == "__builtins__"):
                    return f"`{first_line(model, target, 50)}`"
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) \
                    and inner.func.id == "vars" and inner.args:
                parts = dotted_parts(inner.args[0])
                if parts and parts[0] in imported:
                    return f"`{first_line(model, target, 50)}`"
            return None
        if not isinstance(target, ast.Attribute):
            return None
        parts = dotted_parts(target)
        if not parts:
            return None
        written = ".".join(parts)
        if parts[0] == "__builtins__":
            return f"`{written}`"
        if parts[0] not in imported:
            return None
        resolved = ".".join([imported[parts[0]], *parts[1:]])
        if resolved.startswith(CONFIG_PREFIXES):
            return None
        return f"`{written}`" if written == resolved else f"`{written}` (`{resolved}`)"

    def _call(self, model: SourceModel, call: ast.Call,
              imported: dict[str, str]) -> Iterator[tuple[ast.AST, str]]:
        func = call.func
        mutating = (isinstance(func, ast.Name) and func.id in MUTATING_CALLS
                    and func.id not in imported and func.id not in model.functions) \
            or (isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")
                and dotted_parts(func.value) in (["object"], ["type"]))
        if not mutating or not call.args:
            return
        if _rooted_at_sys_modules(model, call.args[0]):
            attribute = first_line(model, call.args[1], 30) if len(call.args) > 1 else "?"
            yield call, (f"`{first_line(model, func, 20)}` changes attribute {attribute} of a "
                         "module fetched from `sys.modules`: the harness (or the reference) then "
                         "runs this file's replacement")
            return
        if _is_model_instance(call.args[0]) and len(call.args) > 1 and \
                isinstance(call.args[1], ast.Constant) and call.args[1].value in MODEL_ENTRY_POINTS:
            yield call, (f"`{first_line(model, call, 50)}` rebinds the model's "
                         f"`{call.args[1].value}`: a harness calling the model runs that, not the "
                         "forward this file defines (and the audit reads)")
            return
        parts = dotted_parts(call.args[0])
        if not parts:
            return
        if parts[0] in ("__builtins__", "builtins") or parts[0] in imported:
            resolved = ".".join([imported.get(parts[0], parts[0]), *parts[1:]])
            if resolved.startswith(CONFIG_PREFIXES):
                return
            attribute = first_line(model, call.args[1], 30) if len(call.args) > 1 else "?"
            yield call, (f"`{first_line(model, func, 20)}` changes attribute {attribute} of "
                         f"`{'.'.join(parts)}`, an imported module or name: the harness (or the "
                         "reference) then runs this file's replacement")


def _may_rebind(model: SourceModel, imported: dict[str, str]) -> bool:
    text = model.text
    if "__builtins__" in text or "__dict__" in text or "vars(" in text or _DELETE.search(text):
        return True
    return any(match.group(1) in imported for match in _DOTTED_ASSIGN.finditer(text))


_MODULES_LISTED_MESSAGE = ("lists `sys.modules`: code that walks every loaded module can find and "
                           "change the harness's own (its save, its comparison, its timer)")


def _module_walk(model: SourceModel, kind: type) -> list:
    """Every node of `kind` in the module (not under `if __name__ == "__main__":`)."""
    def build() -> list:
        found = []
        if model.module is None:
            return found
        stack: list[ast.AST] = [model.module]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and _main_guard(node):
                stack.extend(node.orelse)
                continue
            if isinstance(node, (ast.For, ast.Constant, ast.JoinedStr, ast.Expr)):
                found.append(node)
            stack.extend(ast.iter_child_nodes(node))
        return found

    nodes = model.memo("ka304-nodes", build)
    return [n for n in nodes if isinstance(n, kind)]


def _main_guard(node: ast.If) -> bool:
    test = node.test
    if not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _rooted_at_sys_modules(model: SourceModel, expr: ast.AST) -> bool:
    """`sys.modules[...]`, `sys.modules.get(...)` (any alias of sys.modules)."""
    if isinstance(expr, ast.Subscript):
        return model.bindings.resolve(expr.value) == "sys.modules"
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        return expr.func.attr == "get" and model.bindings.resolve(expr.func.value) == "sys.modules"
    return False


def _is_model_instance(expr: ast.AST) -> bool:
    """`self`, `self.__class__`, `type(anything)` (a class reached through an instance)."""
    if isinstance(expr, ast.Name):
        return expr.id == "self"
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "type":
        return len(expr.args) == 1
    if isinstance(expr, ast.Attribute) and expr.attr == "__class__":
        return _is_model_instance(expr.value)
    return False


def _entry_point_or_modules(model: SourceModel, target: ast.AST) -> str | None:
    """What an assignment target rebinds, when it is the model's entry point or sys.modules."""
    if isinstance(target, ast.Subscript) and model.bindings.resolve(target.value) == "sys.modules":
        return (f"rebinds `{first_line(model, target, 50)}`, an entry of `sys.modules`: code "
                "importing that module then gets this file's object")
    if not isinstance(target, ast.Attribute):
        return None
    root = target.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if _rooted_at_sys_modules(model, root):
        return (f"rebinds `{first_line(model, target, 50)}`, an attribute of a module fetched from "
                "`sys.modules`: the harness (or the reference) then runs this file's replacement")
    if target.attr not in MODEL_ENTRY_POINTS:
        return None
    owner = target.value
    defined = isinstance(owner, ast.Name) and owner.id in _classes(model)
    if _is_model_instance(owner) or defined:
        return (f"rebinds `{first_line(model, target, 50)}`: a harness calling the model runs that, "
                "not the forward this file defines (and the audit reads)")
    return None


def _classes(model: SourceModel) -> set[str]:
    return model.memo("ka304-classes", lambda: {
        node.name for node in (model.module.body if model.module is not None else [])
        if isinstance(node, ast.ClassDef)})


def _reaching_calls(model: SourceModel, call: ast.Call) -> Iterator[tuple[ast.AST, str]]:
    """sys.modules changed or listed; ctypes given `id(...)`; code run from a decoded payload."""
    func = call.func
    resolved = model.bindings.resolve(func) or (func.id if isinstance(func, ast.Name) else None)
    if isinstance(func, ast.Attribute) and model.bindings.resolve(func.value) == "sys.modules":
        if func.attr in MODULES_CHANGED:
            yield call, (f"changes `sys.modules` (`.{func.attr}`): code importing a module then gets "
                         "this file's object")
        elif func.attr in MODULES_LISTED:
            yield call, _MODULES_LISTED_MESSAGE
        return
    if isinstance(func, ast.Name) and func.id in LISTING_CALLS and call.args and \
            func.id not in model.functions and \
            model.bindings.resolve(call.args[0]) == "sys.modules":
        yield call, _MODULES_LISTED_MESSAGE
        return
    ctypes_call = (resolved or "").startswith("ctypes.") or (
        isinstance(func, ast.Attribute) and func.attr in ("from_address", "from_buffer"))
    if ctypes_call and any(_calls_id(arg) for arg in [*call.args, *(k.value for k in call.keywords)]):
        yield call, (f"`{first_line(model, call, 50)}` reaches a Python object's memory through "
                     "ctypes (`id(...)`): it can read or rewrite the harness's objects")
        return
    if resolved in CODE_RUNNERS and resolved not in model.functions and call.args:
        decoder = _decoder_in(model, call.args[0])
        if decoder:
            yield call, (f"`{resolved.split('.')[-1]}` runs code decoded at run time "
                         f"(`{decoder}`): what it does is hidden from the audit")


def _calls_id(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "id"
               for n in ast.walk(expr))


def _decoder_in(model: SourceModel, expr: ast.AST, depth: int = 0) -> str | None:
    """The payload decoder an expression calls, directly or (one level) through a name."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            name = model.bindings.resolve(node.func)
            if name in PAYLOAD_DECODERS:
                return name
            if isinstance(node.func, ast.Attribute) and node.func.attr == "fromhex":
                return "bytes.fromhex"
        elif isinstance(node, ast.Name) and depth == 0:
            for _op, value in model.bindings.assignments.get(node.id, []):
                found = _decoder_in(model, value, depth + 1)
                if found:
                    return found
    return None


def _proc_paths(model: SourceModel) -> list[ast.AST]:
    """String literals and f-strings naming a /proc path with another process's state in it."""
    if "/proc" not in model.text:
        return []
    docstrings = {id(node.value) for node in _module_walk(model, ast.Expr)
                  if isinstance(node.value, ast.Constant)}
    found = []
    in_fstrings = set()
    for node in _module_walk(model, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                       for v in node.values)
        in_fstrings.update(id(v) for v in node.values)
        if "/proc/" in text and text not in HARMLESS_PROC:
            found.append(node)
    for node in _module_walk(model, ast.Constant):
        if isinstance(node.value, str) and id(node) not in docstrings \
                and id(node) not in in_fstrings and node.value.strip() not in HARMLESS_PROC \
                and (node.value == "/proc" or node.value.startswith("/proc/")):
            found.append(node)
    return found
