import ast
import re
from collections.abc import Iterable, Iterator, Sequence

import tree_sitter

from kaudit.branches import alternatives
from kaudit.cpp import CppFunction, CppIndex
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import REFERENCE_KINDS, ForwardAnalysis, OpKind, walk_code
from kaudit.integrity import (
    assignments_in,
    calls_in,
    first_line,
    has_tensor_parameter,
    integer_value,
    is_int_literal,
    launches_in,
    local_values,
    loop_or_block_rest,
    parameters_of,
    within,
)
from kaudit.rule import Rule
from kaudit.source import FunctionNode, SourceModel, compact, walk_tree

#: a shape compared with a literal at least this large looks like a benchmark size, not a rank
SHAPE_LITERAL_MIN = 64
#: grids and sizes written as literals at least this large in host code
LAUNCH_LITERAL_MIN = 4096
SHAPE_ATTRIBUTES = frozenset({"shape"})
SHAPE_METHODS = frozenset({"size", "numel", "nelement"})
_CPP_SIZE = re.compile(r"(\.|->)(size|sizes|numel|shape|stride)\(")
_CPP_THROWS = ("TORCH_CHECK(false", "AT_ERROR(", "TORCH_CHECK_NOT_IMPLEMENTED(",
               "TORCH_INTERNAL_ASSERT(false", "throw")
_CPP_ALLOCATION = ("empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full",
                   "full_like", "empty_strided")


class HardCodedShapes(Rule):
    """A fast path, or the launch itself, is tied to the benchmark's exact sizes.

    ## What it does
    In Python on the forward path, reports `if`/`elif`/`a if c else b` tests and `assert`s that
    compare a tensor's shape with an integer literal of at least 64 (`x.shape == (4096, 4096)`,
    `x.shape[0] == 128`, `x.size(1) != 4096`, `n in (4096, 8192)` with `n` taken from a shape),
    when one side runs a custom kernel and the other runs none (it returns something else), or
    when one side raises. Choosing between two custom kernels, and branches that fall back to
    PyTorch (KA102's business), are not reported.
    In C++ host code, reports the same comparisons in an `if` (not in `TORCH_CHECK`) where one
    side launches a kernel and the other does not or throws, and, in a host function that takes
    tensors, launches given an integer literal of at least 4096 as a kernel argument, directly
    or through a local (`long n = 16777216;` then `k<<<g, b>>>(x, y, n)`), when the kernel uses
    that parameter as a size (in a comparison or an index; a seed handed to `curand_init` is
    not a size). Grids fixed to a literal (`k<<<65536, 256>>>`) are KA202's finding, not
    repeated here. Block sizes, shared memory sizes, rank checks (`x.dim() == 3`), alignment
    checks (`x.size(1) % 4 == 0`), `TORCH_CHECK`s and size limits (`<=`, `>`) are not reported.

    ## Why is this bad?
    The kernel is only correct, or only fast, for the benchmark's shapes: other shapes are
    rejected, mis-computed or silently skipped. Claimed speedups then say nothing about the
    operation the problem describes, and hard-coded sizes can hide a grid that does not cover
    the real tensor.

    ## Example
    ```python
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="t", cpp_sources=CPP, cuda_sources=CUDA, functions=["transpose_4096"])

    class ModelNew(nn.Module):
        def forward(self, x):
            if x.shape == (4096, 4096):
                return ext.transpose_4096(x)
            return x.t()
    ```
    """

    code = "KA307"
    name = "hard-coded-shapes"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ("integrity", "specialisation", "shapes")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        yield from self._python(model)
        if model.cuda_units:
            yield from self._cpp(model)

    # --- Python -------------------------------------------------------------------------------

    def _python(self, model: SourceModel) -> Iterator[Finding]:
        analysis = ForwardAnalysis.of(model)
        for function in analysis.reachable:
            owner = analysis.owner.get(function)
            tests = {id(n) for n in walk_code(function.body)
                     if isinstance(n, (ast.If, ast.IfExp, ast.Assert)) and _literal_compare(n.test)}
            if not tests:
                continue
            shape_names = _shape_names(function)
            candidates = []
            for node, first, second, exclusive in alternatives(function.body):
                if id(node) in tests:
                    compare = _shape_literal_compare(node.test, shape_names)  # type: ignore[attr-defined]
                    if compare is not None:
                        kinds = (analysis.kinds_reached(first, owner),
                                 analysis.kinds_reached(second, owner))
                        candidates.append((node, first, second, exclusive, compare, kinds))
            # several size tests each leading to a kernel (`d == 64` / `d == 128`, else raise)
            # dispatch over the sizes the kernels support: not a gate on one benchmark shape
            dispatch = sum(1 for c in candidates if not isinstance(c[0], ast.Assert)
                           and OpKind.CUSTOM_KERNEL in c[5][0]) >= 2
            for node, first, second, exclusive, compare, kinds in candidates:
                where = model.header_location(node) if isinstance(node, ast.If) else node
                shown = first_line(model, compare, 50)
                if isinstance(node, ast.Assert):
                    yield self.report(model, where, f"`assert {shown}` accepts only the "
                                      "benchmark's shape; other shapes are rejected")
                    continue
                if dispatch:
                    continue
                raises = (_raises(first) and OpKind.CUSTOM_KERNEL not in kinds[0],
                          _raises(second) and OpKind.CUSTOM_KERNEL not in kinds[1])
                if exclusive and raises[0] != raises[1]:
                    yield self.report(
                        model, where,
                        f"`{shown}` compares a shape with a literal size and "
                        f"{'raises when it holds' if raises[0] else 'raises otherwise'}: the "
                        "kernel only accepts the benchmark's shape")
                    continue
                for fast in (0, 1) if exclusive else (0,):
                    other = kinds[1 - fast]
                    if OpKind.CUSTOM_KERNEL in kinds[fast] and OpKind.CUSTOM_KERNEL not in other \
                            and not other & REFERENCE_KINDS:
                        which = "holds" if fast == 0 else "fails"
                        yield self.report(
                            model, where,
                            f"the custom kernel runs only when `{shown}` {which}: the fast path "
                            "is gated on a literal benchmark shape and other shapes get no kernel")
                        break

    # --- C++ ----------------------------------------------------------------------------------

    def _cpp(self, model: SourceModel) -> Iterator[Finding]:
        index = CppIndex.of(model)
        launching = {f.name for f in index.functions
                     if f.qualifier == "host" and launches_in(index, f)}
        for function in index.functions:
            if function.qualifier != "host" or function.body is None:
                continue
            yield from self._cpp_gates(model, index, function, launching)
            if launches_in(index, function) and has_tensor_parameter(function):
                yield from self._cpp_literals(model, index, function)

    def _cpp_gates(self, model: SourceModel, index: CppIndex, function: CppFunction,
                   launching: set[str]) -> Iterator[Finding]:
        unit = function.unit
        body = function.body
        assert body is not None
        values = local_values(unit, body)
        candidates = []
        for node in unit.nodes(_IF_STATEMENT, body):
            condition = node.child_by_field_name("condition")
            compare = _cpp_shape_compare(unit, condition, values) if condition else None
            if compare is None:
                continue
            consequence = node.child_by_field_name("consequence")
            alternative = node.child_by_field_name("alternative")
            if consequence is None:
                continue
            first: list[tree_sitter.Node] = [consequence]
            exclusive = True
            if alternative is not None:
                second = [alternative]
            else:
                second = loop_or_block_rest(node)
                exclusive = _cpp_leaves(unit, consequence)
            launches = (_cpp_launches(index, function, first, launching),
                        _cpp_launches(index, function, second, launching))
            throws = (_cpp_throws(unit, first), _cpp_throws(unit, second))
            computes = (_cpp_library(index, function, first), _cpp_library(index, function, second))
            throws = (throws[0] and not launches[0], throws[1] and not launches[1])
            candidates.append((condition, compare, exclusive, launches, throws, computes))
        # several size tests each leading to a launch: a dispatch over supported sizes
        if sum(1 for c in candidates if c[3][0]) >= 2:
            return
        for condition, compare, exclusive, launches, throws, computes in candidates:
            shown = compact(unit.text_of(compare))
            if not exclusive:  # `if (n == 4096) { launch } ...`: the rest runs either way
                throws = (False, False)
                launches = (launches[0], launches[1] if launches[0] else False)
            if throws[0] != throws[1]:
                yield self.report(
                    model, unit.location(condition),
                    f"`{function.name}` {'throws when' if throws[0] else 'throws unless'} "
                    f"`{shown}`: the kernel only accepts the benchmark's shape")
            elif launches[0] != launches[1] and not computes[0 if launches[1] else 1]:
                which = "holds" if launches[0] else "fails"
                yield self.report(
                    model, unit.location(condition),
                    f"`{function.name}` launches its kernel only when `{shown}` {which}: the "
                    "fast path is gated on a literal benchmark shape")

    def _cpp_literals(self, model: SourceModel, index: CppIndex,
                      function: CppFunction) -> Iterator[Finding]:
        unit = function.unit
        assert function.body is not None
        values = local_values(unit, function.body)
        for launch in launches_in(index, function):
            for position, argument in enumerate(launch.args):
                size = _literal_size(unit, argument, values, grids=False)
                if size is None or size[0] < LAUNCH_LITERAL_MIN:
                    continue
                kernel = next((f for f in index.functions if f.name == launch.kernel
                               and f.qualifier == "global" and f.body is not None), None)
                names = [name for name, _ in parameters_of(kernel)] if kernel is not None else []
                if kernel is not None and position < len(names) \
                        and names[position] not in _sized_parameters(kernel):
                    continue  # a seed, a scale, a flag: the kernel never uses it as a size
                yield self.report(
                    model, unit.location(launch.node),
                    f"`{function.name}` passes `{launch.kernel}` the literal size "
                    f"{size[1]} although it takes tensors whose sizes it could read: the "
                    "kernel's extent fits the benchmark's shape only")
                break


# --- Python helpers ------------------------------------------------------------------------------

def _is_shape(expr: ast.AST, shape_names: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in shape_names
    if isinstance(expr, ast.Attribute) and expr.attr in SHAPE_ATTRIBUTES:
        return True
    if isinstance(expr, ast.Subscript):
        return _is_shape(expr.value, shape_names)
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in SHAPE_METHODS:
            return True
        if isinstance(expr.func, ast.Name) and expr.func.id in ("tuple", "list") and expr.args:
            return _is_shape(expr.args[0], shape_names)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return _is_shape(expr.left, shape_names) and _is_shape(expr.right, shape_names)
    return False


def _shape_names(function: FunctionNode) -> set[str]:
    names: set[str] = set()
    assigned = assignments_in(function)
    for _ in range(2):
        for name, values in assigned.items():
            if values and all(_is_shape(v, names) for v in values):
                names.add(name)
    return names


def _int_value(expr: ast.AST) -> int | None:
    """An integer constant expression (`4096`, `2 * 4096`, `1 << 14`)."""
    value = is_int_literal(expr)
    if value is not None or not isinstance(expr, ast.BinOp):
        return value
    left, right = _int_value(expr.left), _int_value(expr.right)
    if left is None or right is None:
        return None
    if isinstance(expr.op, ast.Mult):
        return left * right
    if isinstance(expr.op, ast.Add):
        return left + right
    if isinstance(expr.op, ast.Sub):
        return left - right
    if isinstance(expr.op, ast.FloorDiv) and right:
        return left // right
    if isinstance(expr.op, ast.LShift) and 0 <= right < 64:
        return left << right
    if isinstance(expr.op, ast.Pow) and 0 <= right < 64:
        return left ** right
    return None


def _big_literal(expr: ast.AST) -> bool:
    value = _int_value(expr)
    if value is not None:
        return value >= SHAPE_LITERAL_MIN
    if isinstance(expr, ast.Call) and len(expr.args) == 1:  # torch.Size([4096, 4096])
        return _big_literal(expr.args[0])
    if isinstance(expr, (ast.Tuple, ast.List, ast.Set)) and expr.elts:
        values = [_int_value(e) for e in expr.elts]
        return all(v is not None for v in values) and max(values) >= SHAPE_LITERAL_MIN  # type: ignore[type-var]
    return False


def _literal_compare(test: ast.AST) -> bool:
    """A cheap first look: the test compares something with a literal size of at least 64."""
    return any(isinstance(node, ast.Compare) and len(node.ops) == 1
               and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
               and (_big_literal(node.comparators[0]) or _big_literal(node.left))
               for node in ast.walk(test))


def _shape_literal_compare(test: ast.AST, shape_names: set[str]) -> ast.Compare | None:
    for node in ast.walk(test):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1:
            continue
        if not isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
            continue
        left, right = node.left, node.comparators[0]
        if (_is_shape(left, shape_names) and _big_literal(right)) or \
                (_is_shape(right, shape_names) and _big_literal(left)
                 and not isinstance(node.ops[0], (ast.In, ast.NotIn))):
            return node
    return None


def _raises(block: Sequence[ast.AST]) -> bool:
    return any(isinstance(statement, ast.Raise) for statement in block)


# --- C++ helpers ---------------------------------------------------------------------------------

_RELATIONAL = frozenset({"<", "<=", ">", ">="})


def _sized_parameters(kernel: CppFunction) -> set[str]:
    """The kernel's parameters it uses as sizes: in a comparison (`i < n`, a loop bound) or a
    memory index, directly or through locals computed from them. A seed handed to
    `curand_init`, a scale or a flag is not a size."""
    unit, body = kernel.unit, kernel.body
    assert body is not None
    used: set[str] = set()
    for node in unit.nodes(_SIZE_USES, body):
        if node.type == "subscript_expression":
            indices = node.child_by_field_name("indices")
            used |= _identifiers_in(unit, indices) if indices is not None else set()
        else:
            operator = node.child_by_field_name("operator")
            if operator is not None and operator.type in _RELATIONAL:
                used |= _identifiers_in(unit, node)
    values = local_values(unit, body)
    for _ in range(3):  # `int total = rows * cols; if (i < total)`: rows and cols are sizes
        used |= {name for local in list(used) for value in values.get(local, ())
                 for name in _identifiers_in(unit, value)}
    return used & {name for name, _ in parameters_of(kernel)}


_SIZE_USES = ("subscript_expression", "binary_expression")
_IF_STATEMENT = ("if_statement",)


def _identifiers_in(unit, node: tree_sitter.Node) -> set[str]:
    return {unit.text_of(n) for n in walk_tree(node, _IDENTIFIER)}


_IDENTIFIER = frozenset({"identifier"})


def _cpp_is_size(unit, node: tree_sitter.Node, values: dict[str, list[tree_sitter.Node]],
                 depth: int = 0) -> bool:
    written = compact(unit.text_of(node))
    if _CPP_SIZE.search(written):
        return True
    if node.type == "identifier" and depth < 3:
        assigned = values.get(written, [])
        return bool(assigned) and all(_cpp_is_size(unit, v, values, depth + 1) for v in assigned)
    if node.type in ("parenthesized_expression", "cast_expression") and node.named_child_count:
        return _cpp_is_size(unit, node.named_children[-1], values, depth)
    return False


def _cpp_shape_compare(unit, condition: tree_sitter.Node,
                       values: dict[str, list[tree_sitter.Node]]) -> tree_sitter.Node | None:
    for node in walk_tree(condition):
        if node.type != "binary_expression":
            continue
        operator = node.child_by_field_name("operator")
        if operator is None or operator.type not in ("==", "!="):
            continue
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            continue
        for size, literal in ((left, right), (right, left)):
            value = integer_value(unit, literal)
            if value is not None and value >= SHAPE_LITERAL_MIN \
                    and _cpp_is_size(unit, size, values):
                return node
    return None


def _cpp_leaves(unit, block: tree_sitter.Node) -> bool:
    last = block.named_children[-1] if block.type == "compound_statement" \
        and block.named_children else block
    return last.type in ("return_statement", "throw_statement") or \
        compact(unit.text_of(last)).startswith(_CPP_THROWS[:4])


def _cpp_launches(index: CppIndex, function: CppFunction, blocks: list[tree_sitter.Node],
                  launching: set[str]) -> bool:
    for block in blocks:
        if any(within(launch.node, block) for launch in launches_in(index, function)):
            return True
        if any(within(call.node, block) and call.short_name in launching
               for call in calls_in(index, function)):
            return True
    return False


def _cpp_throws(unit, blocks: list[tree_sitter.Node]) -> bool:
    for block in blocks:
        for node in walk_tree(block):
            if node.type == "throw_statement":
                return True
            if node.type == "call_expression" and \
                    compact(unit.text_of(node)).startswith(_CPP_THROWS[:4]):
                return True
    return False


def _cpp_library(index: CppIndex, function: CppFunction, blocks: list[tree_sitter.Node]) -> bool:
    """The branch computes with ATen / cuBLAS / cuDNN (a fallback other rules report)."""
    for block in blocks:
        for call in calls_in(index, function):
            if not within(call.node, block):
                continue
            name = call.name.split("<")[0]
            if name.startswith(("at::", "torch::")) and call.short_name not in _CPP_ALLOCATION:
                return True
            if name.startswith(("cublas", "cudnn", "cublasLt")):
                return True
    return False


def _literal_size(unit, node: tree_sitter.Node, values: dict[str, list[tree_sitter.Node]],
                  grids: bool = True) -> tuple[int, str] | None:
    """(value, as written) when `node` is an integer literal expression, a `dim3(...)` of them,
    or a local initialised only from one."""
    value = integer_value(unit, node)
    if value is not None:
        return value, compact(unit.text_of(node))
    if grids and node.type == "call_expression":  # dim3(128, 128)
        callee = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        if callee is not None and unit.text_of(callee) == "dim3" and arguments is not None:
            return _product(unit, arguments)
    if node.type == "identifier":
        assigned = values.get(unit.text_of(node), [])
        if len(assigned) == 1:
            value_node = assigned[0]
            if value_node.type in ("argument_list", "initializer_list"):  # dim3 grid(128, 128);
                found = _product(unit, value_node) if grids else None
            elif value_node.type == "identifier":
                found = None
            else:
                found = _literal_size(unit, value_node, values, grids)
            if found is not None:
                return found[0], f"{unit.text_of(node)} = {found[1]}"
    return None


def _product(unit, arguments: tree_sitter.Node) -> tuple[int, str] | None:
    numbers = [integer_value(unit, a) for a in arguments.named_children]
    if not numbers or any(n is None for n in numbers):
        return None
    total = 1
    for n in numbers:
        total *= n  # type: ignore[operator]
    return total, compact(unit.text_of(arguments))
