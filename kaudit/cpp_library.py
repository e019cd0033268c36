"""Library compute in the host code of a file's C++/CUDA extensions: ATen/libtorch ops, cuBLAS,
cuDNN, cuFFT, cuSPARSE, and calls back into Python. KA106 reports them when they replace the custom
kernel; KA108 lists them among the library ops a partial replacement keeps.

Host functions that are neither exported nor referenced anywhere, code run once at module import
(the body of `PYBIND11_MODULE` outside its lambdas, namespace-scope initialisers), allocation and
shape helpers, `TORCH_CHECK`, and stream or handle setup are not library compute.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import tree_sitter

from kaudit.cpp import CppCall, CppFunction, CppIndex
from kaudit.integrity import find_words
from kaudit.source import CudaUnit, SourceModel, find_nodes
from kaudit.torch_ops import TENSOR_COMPUTE_METHODS

# ATen / libtorch ops that compute (matched on the unqualified name after `at::`, `torch::`,
# `at::native::`, `torch::nn::functional::`, ... with `_out`, `_cuda`, `_cpu` suffixes, a trailing
# `_` and leading `_` removed). Allocation, shape and copy helpers are deliberately absent.
ATEN_COMPUTE = TENSOR_COMPUTE_METHODS | frozenset({
    "add", "addcmul", "addcdiv", "addmv", "addr", "ger", "inner", "vdot", "tensordot", "kron",
    "chain_matmul", "multi_dot", "conv_transpose1d", "conv_transpose3d", "convolution",
    "cudnn_convolution", "cudnn_convolution_transpose", "miopen_convolution", "mkldnn_convolution",
    "bilinear", "embedding", "embedding_bag", "max_pool1d", "max_pool2d", "max_pool3d",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "max_pool2d_with_indices", "lp_pool2d", "scaled_dot_product_attention",
    "scaled_dot_product_flash_attention", "scaled_dot_product_efficient_attention",
    "flash_attention_forward", "efficient_attention_forward", "multi_head_attention_forward",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_similarity",
    "pairwise_distance", "cdist", "normalize", "native_layer_norm", "native_batch_norm",
    "native_group_norm", "rms_norm", "interpolate", "upsample_bilinear2d", "upsample_nearest2d",
    "pixel_shuffle", "softmin", "glu", "prelu", "rrelu", "threshold", "hardshrink", "softshrink",
    "tanhshrink", "logsigmoid", "neg", "sinh", "cosh", "tan", "atan", "asin", "acos", "atan2",
    "remainder", "fmod", "lerp", "logcumsumexp", "median", "nansum", "nanmean", "var_mean",
    "std_mean", "renorm", "frobenius_norm", "nuclear_norm", "dist", "gelu_backward",
    "relu6", "celu", "silu", "addmm_activation", "linear_relu", "fused_dropout",
})

# Method names that give back a tensor when called on one (a receiver built from them stays a
# tensor), on top of the compute methods themselves.
_TENSOR_TO_TENSOR = frozenset({
    "contiguous", "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "to", "clone",
    "t", "narrow", "slice", "select", "squeeze", "unsqueeze", "flatten", "expand", "expand_as",
    "cuda", "cpu", "float", "detach", "index_select", "copy_", "fill_", "zero_", "type_as",
})

# at:: / torch:: factories returning a tensor (for `auto y = torch::empty_like(x); y.sum()`).
_TENSOR_FACTORIES = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "rand", "randn", "rand_like", "randn_like", "randint", "arange", "linspace",
    "from_blob", "tensor", "cat", "stack", "clone", "empty_cuda",
})

# Names called unqualified after `using namespace at;` / `using namespace torch;`: only the ones no
# ordinary C/C++ code defines (no `max`, `exp`, `log`, `abs` -- those are std:: or CUDA math too).
_UNQUALIFIED_STRONG = frozenset({
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear", "softmax",
    "log_softmax", "layer_norm", "batch_norm", "group_norm", "instance_norm",
    "scaled_dot_product_attention", "cross_entropy", "max_pool2d", "avg_pool2d",
})

_TENSOR_TYPES = frozenset({"Tensor", "torch::Tensor", "at::Tensor", "::torch::Tensor",
                           "::at::Tensor"})
_PY_OBJECT_TYPES = frozenset({"py::object", "py::function", "pybind11::object",
                              "pybind11::function", "py::handle", "pybind11::handle"})
_MODULE_INIT = frozenset({"PYBIND11_MODULE", "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL",
                          "TORCH_LIBRARY_FRAGMENT"})
_PY_IMPORT = frozenset({"py::module::import", "py::module_::import", "pybind11::module::import",
                        "pybind11::module_::import", "PyImport_ImportModule", "PyImport_Import",
                        "PyImport_ImportModuleLevel", "py::eval", "py::exec", "pybind11::eval",
                        "pybind11::exec", "PyRun_String", "PyRun_SimpleString"})
_PY_CALL = re.compile(r"^(PyObject_Call\w*|PyObject_Vectorcall\w*|PyEval_CallObject\w*|"
                      r"PyEval_CallFunction|PyEval_CallMethod)$")

_CUBLAS_SETUP = re.compile(
    r"^cublas(Xt)?(Create|Destroy|Set|Get|Logger|Init|Shutdown|Alloc|Free|Migrate|UpdateDevice)")
_CUBLASLT_COMPUTE = frozenset({"cublasLtMatmul", "cublasLtMatrixTransform"})
_CUDNN_SETUP = re.compile(r"^cudnn(Create|Destroy|Set|Get|Find|Init|Query|Restore|Derive|Backend(?!Execute)"
                          r"|Cnn|Ops|Adv|Graph)")
_CUDNN_COMPUTE = re.compile(r"(Forward|Backward|Execute|Tensor|CTCLoss)\w*$")
_CUFFT_COMPUTE = re.compile(r"^cufft(Xt)?Exec\w*$")
_CUSPARSE_COMPUTE = re.compile(r"^cusparse(SpMM|SpMV|SpGEMM_compute|SpGEMMreuse_compute|SDDMM|SpSV_solve"
                               r"|SpSM_solve|[SDCZ]csrmm2?|[SDCZ]csrmv|[SDCZ]gemmi)$")

_USING_NAMESPACE = re.compile(r"\busing\s+namespace\s+(?:::)?(at|torch)\s*;")
_USING_NAME = re.compile(r"\busing\s+(?:::)?(?:at|torch)(?:::\w+)*::(\w+)\s*;")
_NAMESPACE_ALIAS = re.compile(r"\bnamespace\s+(\w+)\s*=\s*(?:::)?((?:at|torch)(?:::\w+)*)\s*;")


@dataclass(frozen=True)
class LibraryCall:
    call: CppCall
    category: str  # "aten", "method", "library", "python"
    evidence: str

    @property
    def place(self) -> str:
        """"host function `f`", "a function bound in `PYBIND11_MODULE`" or "host code"."""
        function = self.call.function
        if function is None:
            return "host code"
        if function.name in _MODULE_INIT:
            return f"a function bound in `{function.name}`"
        return f"host function `{function.name}`"


def library_calls(model: SourceModel) -> list[LibraryCall]:
    """Every library compute call in the host code of the file's extensions, one per expression
    (`x.matmul(w).sum()` is the matmul), in source order."""
    def build() -> list[LibraryCall]:
        if not model.cuda_units:
            return []
        index = CppIndex.of(model)
        if not index.calls:
            return []
        context = _Context(model, index)
        return _innermost([hit for call in index.calls for hit in context.classify(call)])

    return model.memo("cpp-library-calls", build)


class _Context:
    """Per-file facts the classification needs, computed lazily."""

    def __init__(self, model: SourceModel, index: CppIndex) -> None:
        self.model = model
        self.index = index
        self.aliases: dict[str, str] = {}  # namespace alias -> "at"/"torch..." target
        self.using_namespace = False
        self.using_names: set[str] = set()
        for unit in model.cuda_units:
            text = unit.text
            if "namespace" in text or "using" in text:
                for match in _NAMESPACE_ALIAS.finditer(text):
                    self.aliases[match.group(1)] = match.group(2)
                self.using_namespace |= bool(_USING_NAMESPACE.search(text))
                self.using_names.update(_USING_NAME.findall(text))
        self.defined = {f.name for f in index.functions}
        self._live: set[str] | None = None
        self._tensors: dict[int, set[str]] = {}
        self._py_objects: dict[int, set[str]] = {}
        self._global_py_objects: set[str] | None = None

    # --- which host code counts --------------------------------------------------------------

    def live(self, function: CppFunction) -> bool:
        """Exported, referenced from elsewhere, or a module-init block (its lambdas)."""
        if function.name in _MODULE_INIT:
            return True
        if self._live is None:
            exported = {name for ext in self.model.extensions for name in ext.functions}
            exported |= set(self.index.bindings.values())
            roots_known = bool(exported)
            live = set(exported)
            if not roots_known:
                live = {f.name for f in self.index.functions}
            else:
                for unit in self.model.cuda_units:
                    live |= _referenced_identifiers(unit, self.defined)
            self._live = live
        return function.name in self._live

    # --- classification ---------------------------------------------------------------------

    def classify(self, call: CppCall) -> Iterator[LibraryCall]:
        function = call.function
        if function is not None and function.qualifier != "host":
            return
        in_init = function is None or (function.name in _MODULE_INIT and not _in_lambda(call.node))
        if function is not None and not self.live(function):
            return
        base = _strip_templates(call.name).lstrip(":")
        # vendor libraries: plain C identifiers
        library = _library_compute(base)
        if library is not None:
            if not in_init:
                yield LibraryCall(call, "library", f"{library} (`{base}`)")
            return
        if in_init:
            return
        python = self._python_call(call, base)
        if python is not None:
            yield LibraryCall(call, "python", python)
            return
        aten = self._aten_op(base)
        if aten is not None:
            if not _in_check(call):
                yield LibraryCall(call, "aten", aten)
            return
        callee = call.node.child_by_field_name("function")
        if callee is not None and callee.type == "field_expression":
            method = self._tensor_method(call, callee)
            if method is not None and not _in_check(call):
                yield LibraryCall(call, "method", method)

    def _aten_op(self, base: str) -> str | None:
        parts = base.split("::")
        if len(parts) == 1:
            if base in self.using_names and base in ATEN_COMPUTE and base not in self.defined:
                return f"the ATen op `{base}` (brought in by `using`)"
            if self.using_namespace and base in _UNQUALIFIED_STRONG and base not in self.defined:
                return f"the ATen op `{base}` (under `using namespace`)"
            return None
        alias = ""
        if parts[0] in self.aliases:
            alias = f" (written `{base}`)"
            parts = self.aliases[parts[0]].split("::") + parts[1:]
        if parts[0] not in ("at", "torch"):
            return None
        written = f"`{'::'.join(parts)}`{alias}"
        if "blas" in parts[:-1]:  # at::cuda::blas::gemm, at::cuda::blas::bgemm
            return f"cuBLAS through ATen ({written})"
        if "_ops" in parts[:-1]:  # at::_ops::mm::call(...)
            position = parts.index("_ops")
            op = parts[position + 1] if position + 1 < len(parts) else ""
            return f"the ATen op {written}" if _normalise(op) in ATEN_COMPUTE else None
        if _normalise(parts[-1]) in ATEN_COMPUTE and not _is_plumbing_namespace(parts):
            return f"the ATen op {written}"
        return None

    def _tensor_method(self, call: CppCall, callee: tree_sitter.Node) -> str | None:
        method = callee.child_by_field_name("field")
        receiver = callee.child_by_field_name("argument")
        if method is None or receiver is None:
            return None
        method_name = call.unit.text_of(method).split("<")[0]
        if _normalise(method_name) not in ATEN_COMPUTE or "->" in call.name:
            return None
        if not self._is_tensor(receiver, call):
            return None
        receiver_text = _compact(call.unit.text_of(receiver))
        if len(receiver_text) > 40:
            receiver_text = receiver_text[:37] + "..."
        return f"the tensor method `{receiver_text}.{method_name}()` (an ATen op)"

    def _is_tensor(self, node: tree_sitter.Node, call: CppCall, depth: int = 0) -> bool:
        if depth > 8:
            return False
        if node.type == "parenthesized_expression" and node.named_child_count == 1:
            return self._is_tensor(node.named_children[0], call, depth + 1)
        if node.type == "identifier":
            return call.function is not None and \
                call.unit.text_of(node) in self._tensor_names(call.function, node)
        if node.type == "call_expression":
            return self._returns_tensor(node, call, depth)
        return False

    def _returns_tensor(self, node: tree_sitter.Node, call: CppCall, depth: int) -> bool:
        callee = node.child_by_field_name("function")
        if callee is None:
            return False
        if callee.type == "field_expression":
            method = callee.child_by_field_name("field")
            receiver = callee.child_by_field_name("argument")
            if method is None or receiver is None:
                return False
            name = call.unit.text_of(method).split("<")[0]
            return (name in _TENSOR_TO_TENSOR or _normalise(name) in ATEN_COMPUTE) and \
                self._is_tensor(receiver, call, depth + 1)
        name = _strip_templates(_compact(call.unit.text_of(callee))).lstrip(":")
        parts = name.split("::")
        if len(parts) > 1 and parts[0] in self.aliases:
            parts = self.aliases[parts[0]].split("::") + parts[1:]
        return len(parts) > 1 and parts[0] in ("at", "torch") and \
            (parts[-1] in _TENSOR_FACTORIES or _normalise(parts[-1]) in ATEN_COMPUTE) and \
            not _is_plumbing_namespace(parts)

    def _tensor_names(self, function: CppFunction, anchor: tree_sitter.Node) -> set[str]:
        """Parameters and locals of `function` (and of lambdas inside it) that hold tensors:
        declared `torch::Tensor`/`at::Tensor`, or `auto` initialised from a tensor expression."""
        key = id(function)
        if key in self._tensors:
            return self._tensors[key]
        names: set[str] = set()
        self._tensors[key] = names
        pending_auto: list[tuple[str, tree_sitter.Node]] = []
        unit = function.unit
        for node in _walk(function.node, frozenset({"parameter_declaration", "declaration"})):
            type_node = node.child_by_field_name("type")
            if type_node is None:
                continue
            type_text = _compact(unit.text_of(type_node))
            for declarator in node.children_by_field_name("declarator"):
                name, value = _declared(unit, declarator)
                if name is None:
                    continue
                if type_text in _TENSOR_TYPES and not _is_pointer(declarator):
                    names.add(name)
                elif type_text == "auto" and value is not None:
                    pending_auto.append((name, value))
        fake = CppCall("", anchor, unit, function, ())
        for _ in range(3):  # `auto a = x.contiguous(); auto b = a.view(...)`: a short fixpoint
            grew = False
            for name, value in pending_auto:
                if name not in names and self._is_tensor(value, fake):
                    names.add(name)
                    grew = True
            if not grew:
                break
        return names

    def _python_call(self, call: CppCall, base: str) -> str | None:
        if base in _PY_IMPORT:
            argument = call.unit.text_of(call.args[0]) if call.args else ""
            return f"a call back into Python (`{base}({argument})`)"
        if _PY_CALL.match(base):
            return f"a call back into Python (`{base}`)"
        callee = call.node.child_by_field_name("function")
        if callee is None:
            return None
        if callee.type == "call_expression":  # obj.attr("matmul")(x, w)
            inner = callee.child_by_field_name("function")
            if inner is not None and inner.type == "field_expression":
                field = inner.child_by_field_name("field")
                if field is not None and call.unit.text_of(field) == "attr":
                    text = _compact(call.unit.text_of(callee))
                    return f"a call back into Python (`{text[:60]}(...)`)"
        if callee.type == "identifier" and call.function is not None:
            name = call.unit.text_of(callee)
            if name in self._py_object_names(call.function):
                return f"a call back into Python (the Python object `{name}`)"
        return None

    def _py_object_names(self, function: CppFunction) -> set[str]:
        key = id(function)
        if key not in self._py_objects:
            names = set(self._global_py_names())
            for node in _walk(function.node, frozenset({"parameter_declaration", "declaration"})):
                names |= _declared_of_types(function.unit, node, _PY_OBJECT_TYPES)
            self._py_objects[key] = names
        return self._py_objects[key]

    def _global_py_names(self) -> set[str]:
        if self._global_py_objects is None:
            names: set[str] = set()
            for unit in self.model.cuda_units:
                if "py" not in unit.text:
                    continue
                for node in unit.tree.root_node.named_children:
                    if node.type == "declaration":
                        names |= _declared_of_types(unit, node, _PY_OBJECT_TYPES)
            self._global_py_objects = names
        return self._global_py_objects


def _library_compute(base: str) -> str | None:
    if base.startswith("cublasLt"):
        return "cuBLASLt" if base.split("_")[0] in _CUBLASLT_COMPUTE else None
    if base.startswith("cublas"):
        return None if _CUBLAS_SETUP.match(base) or not base[6:7].isupper() else "cuBLAS"
    if base.startswith("cudnn"):
        if _CUDNN_SETUP.match(base) or not _CUDNN_COMPUTE.search(base[5:]):
            return None
        return "cuDNN"
    if _CUFFT_COMPUTE.match(base):
        return "cuFFT"
    if _CUSPARSE_COMPUTE.match(base):
        return "cuSPARSE"
    return None


def _normalise(name: str) -> str:
    """`_softmax` / `softmax_out` / `addmm_out_cuda` / `relu_` -> the op's plain name."""
    name = name.split("<")[0]
    for suffix in ("_cuda", "_cpu", "_out", "_symint"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    for suffix in ("_cuda", "_out"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.strip("_")


def _is_plumbing_namespace(parts: list[str]) -> bool:
    """at::cuda::*, torch::autograd::*, ...: streams, guards, utilities; never the ops."""
    middle = parts[1:-1]
    return any(p in ("cuda", "autograd", "jit", "utils", "indexing", "detail", "cuda_utils",
                     "meta", "profiler") for p in middle) and "blas" not in middle \
        and "native" not in middle


_CHECK_MACROS = re.compile(r"^(TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|AT_ASSERT\w*|assert)$")


def _in_check(call: CppCall) -> bool:
    """Inside `TORCH_CHECK(...)` / `assert(...)`: validating inputs, not producing the output."""
    parent = call.node.parent
    while parent is not None and parent.type not in ("function_definition", "lambda_expression",
                                                     "compound_statement"):
        if parent.type == "call_expression":
            callee = parent.child_by_field_name("function")
            if callee is not None and _CHECK_MACROS.match(call.unit.text_of(callee)):
                return True
        parent = parent.parent
    return False


def _in_lambda(node: tree_sitter.Node) -> bool:
    parent = node.parent
    while parent is not None and parent.type != "function_definition":
        if parent.type == "lambda_expression":
            return True
        parent = parent.parent
    return False


def _walk(root: tree_sitter.Node, types: frozenset[str]) -> Iterator[tree_sitter.Node]:
    found = find_nodes(root, tuple(sorted(types)))
    yield from sorted((n for nodes in found.values() for n in nodes),
                      key=lambda node: (node.start_byte, -node.end_byte))


def _declared(unit: CudaUnit, declarator: tree_sitter.Node
              ) -> tuple[str | None, tree_sitter.Node | None]:
    """(name, initial value) of one declarator: `x`, `&x`, `y = expr`, `y(expr)`."""
    value = None
    node = declarator
    if node.type == "init_declarator":
        value = node.child_by_field_name("value")
        if value is not None and value.type == "argument_list":
            value = value.named_children[0] if value.named_child_count == 1 else None
        node = node.child_by_field_name("declarator")
    while node is not None and node.type in ("reference_declarator", "pointer_declarator"):
        inner = node.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in node.named_children if c.type.endswith(("identifier", "declarator"))), None)
        node = inner
    if node is None or node.type != "identifier":
        return None, None
    return unit.text_of(node), value


def _is_pointer(declarator: tree_sitter.Node) -> bool:
    node = declarator
    if node.type == "init_declarator":
        node = node.child_by_field_name("declarator") or node
    return node.type == "pointer_declarator"


def _declared_of_types(unit: CudaUnit, node: tree_sitter.Node, types: frozenset[str]) -> set[str]:
    type_node = node.child_by_field_name("type")
    if type_node is None or _compact(unit.text_of(type_node)) not in types:
        return set()
    names = set()
    for declarator in node.children_by_field_name("declarator"):
        name, _value = _declared(unit, declarator)
        if name is not None:
            names.add(name)
    return names


def _referenced_identifiers(unit: CudaUnit, defined: set[str]) -> set[str]:
    """Defined function names that appear in the unit other than where they are declared."""
    if not defined:
        return set()
    found: set[str] = set()
    for _, node in find_words(unit, sorted(defined), frozenset({"identifier"})):
        parent = node.parent
        if parent is not None and parent.type == "function_declarator" \
                and parent.child_by_field_name("declarator") == node:
            continue
        text = unit.text_of(node)
        if text in defined:
            found.add(text)
    return found


def _innermost(hits: list[LibraryCall]) -> list[LibraryCall]:
    """One finding per expression: `x.matmul(w).sum()` reports the matmul; for a Python call
    chain `import("torch").attr("mm")(...)` the outermost call (the invocation) is kept."""
    kept = []
    for hit in hits:
        node = hit.call.node
        callee = node.child_by_field_name("function")
        redundant = False
        for other in hits:
            if other is hit or other.call.unit is not hit.call.unit:
                continue
            if hit.category == "python" == other.category:
                outer = other.call.node.child_by_field_name("function")
                if outer is not None and _contains(outer, node):
                    redundant = True
            elif callee is not None and _contains(callee, other.call.node) \
                    and hit.category != "python":
                redundant = True
            if redundant:
                break
        if not redundant:
            kept.append(hit)
    return kept


def _contains(outer: tree_sitter.Node, inner: tree_sitter.Node) -> bool:
    return outer.start_byte <= inner.start_byte and inner.end_byte <= outer.end_byte


def _strip_templates(name: str) -> str:
    """`at::cuda::blas::gemm<float>` -> `at::cuda::blas::gemm`; nested `<...>` removed."""
    if "<" not in name:
        return name
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def _compact(text: str) -> str:
    return "".join(text.split())
