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
# a line that assigns to `name.attr...` (or `name.attr[...]`), name not `self`: a cheap text test
# that spares most files the walk over their statements
_DOTTED_ASSIGN = re.compile(
    r"^[ \t]*(?!self\b)([A-Za-z_]\w*)[ \t]*\.[\w., \t]*(?:\[[^\]\n]*\])?[ \t]*(?:=(?!=)|[-+*/@%&|^]=)",
    re.M)
_DELETE = re.compile(r"^[ \t]*del\b", re.M)
# a file can only reach the names above if one of these words is in its text
_PREFILTER = frozenset({"setattr", "delattr", "__setattr__", "__delattr__", "__builtins__", "gc",
                        "inspect", "sys", "traceback", "settrace"}) | FRAME_ATTRIBUTES \
    | DISPATCH_ESCAPES


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
      `_pop_mode_temporarily`, `DisableTorchFunction` and similar.

    ## Why is this bad?
    A submission that replaces `torch.allclose`, the timer or `Event.elapsed_time` decides its own
    verdict; one that searches the garbage collector or caller frames can find the reference
    output and return it; one that disables dispatch modes escapes the harness's op tracing.

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
        if not _PREFILTER & word_set(model):
            return
        facts = ModuleFacts.of(model)
        for call in facts.calls:
            yield from self._call(model, call, imported)
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
