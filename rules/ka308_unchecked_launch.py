from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kaudit.cpp import CppCall, CppFunction, CppIndex
from kaudit.findings import Finding, Level, Precision
from kaudit.fix.edits import Fix, NoFix
from kaudit.integrity import callers_of, calls_in, compact, launches_in
from kaudit.rule import Rule
from kaudit.source import CudaUnit, SourceModel

if TYPE_CHECKING:
    from kaudit.fix.editor import Editor

# calls that report a launch error on their own
ERROR_QUERIES = frozenset({"cudaGetLastError", "cudaPeekAtLastError", "C10_CUDA_KERNEL_LAUNCH_CHECK",
                           "cuGetLastError", "hipGetLastError", "hipPeekAtLastError"})

_CUDA_CALL = re.compile(r"\b(cuda|cu|hip)[A-Z]\w*\(")
LAUNCH_CHECK = "C10_CUDA_KERNEL_LAUNCH_CHECK();"
CHECK_HEADER = "c10/cuda/CUDAException.h"
# headers that bring C10_CUDA_KERNEL_LAUNCH_CHECK with them (as of torch 2.x)
_HEADERS_WITH_CHECK = frozenset({
    CHECK_HEADER, "c10/cuda/CUDAFunctions.h", "c10/cuda/CUDAStream.h", "c10/cuda/CUDAGuard.h",
    "c10/cuda/CUDACachingAllocator.h", "ATen/cuda/CUDAContext.h", "ATen/cuda/CUDAContextLight.h",
    "ATen/cuda/Exceptions.h", "ATen/cuda/CUDAEvent.h",
})
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"][^\n]*", re.M)


class UncheckedLaunch(Rule):
    """A kernel launch whose failure nothing would notice.

    ## What it does
    For each C++ host function that launches kernels with `<<<...>>>`, looks for an error check
    after the launch in the same function: `cudaGetLastError()`, `cudaPeekAtLastError()`,
    `C10_CUDA_KERNEL_LAUNCH_CHECK()`, or any macro or function whose name contains `CHECK`
    (any case: `AT_CUDA_CHECK`, `CUDA_CHECK`, `checkCudaErrors`, `TORCH_CHECK`) wrapping a
    `cuda*` call. A launch in a helper counts as checked when every C++ caller of that helper
    checks after calling it. Reports once per host function, at the last unchecked launch,
    naming the unchecked kernels.

    ## Why is this bad?
    A launch that fails (too much shared memory, too many threads, an invalid grid) returns
    silently; the output keeps whatever bits were in memory, which can be the reference's answer
    left behind by the caching allocator. The benchmark then accepts a kernel that never ran.

    ## Example
    ```python
    from torch.utils.cpp_extension import load_inline

    src = '''
    __global__ void relu_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    torch::Tensor relu(torch::Tensor x) {
        auto y = torch::empty_like(x);
        int n = x.numel();
        relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y;
    }
    '''
    ext = load_inline(name="relu", cpp_sources="", cuda_sources=src, functions=["relu"])

    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.relu(x)
    ```

    ## Fix
    `kaudit fix --select KA308` adds `C10_CUDA_KERNEL_LAUNCH_CHECK();` on the line after the last
    unchecked launch, at its indentation, and `#include <c10/cuda/CUDAException.h>` when no
    included header defines it; a source that already checks launches another way
    (`CUDA_CHECK(cudaGetLastError());`) gets that check instead. Being a note, it is fixed only
    when selected by name.
    """

    code = "KA308"
    name = "unchecked-launch"
    level = Level.NOTE
    precision = Precision.HIGH
    tags = ("integrity", "robustness", "cuda")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        if not model.cuda_units:
            return
        index = CppIndex.of(model)
        for function in index.functions:
            if function.qualifier != "host":
                continue
            launches = launches_in(index, function)
            if not launches:
                continue
            checks = [c.node.start_byte for c in calls_in(index, function) if _is_check(c)]
            unchecked = [launch for launch in launches
                         if not any(position > launch.node.end_byte for position in checks)]
            if not unchecked or self._callers_check(index, function):
                continue
            last = max(unchecked, key=lambda launch: launch.node.start_byte)
            kernels = ", ".join(f"`{k}`" for k in dict.fromkeys(launch.kernel
                                                                 for launch in unchecked))
            yield self.report(
                model, last.unit.location(last.node),
                f"`{function.name}` launches {kernels} and never checks for a launch error "
                "afterwards (`cudaGetLastError()`, `C10_CUDA_KERNEL_LAUNCH_CHECK()`): a failed "
                "launch would go unnoticed and leave the output unwritten")

    def fix(self, editor: Editor, finding: Finding) -> Fix | None:
        index = CppIndex.of(editor.model)
        launch = next((launch for launch in index.launches
                       if launch.unit.location(launch.node) == finding.location), None)
        if launch is None:
            raise NoFix("the launch is no longer where it was reported")
        statement = launch.node.parent
        while statement is not None and statement.type != "expression_statement":
            statement = statement.parent
        if statement is None or statement.parent is None \
                or statement.parent.type != "compound_statement":
            raise NoFix("the launch is not a statement of its own in a `{ }` block")
        unit, text = launch.unit, launch.unit.text
        check, needs_header = _check_for(index, unit)
        start, end = editor.cpp_span(unit, statement)
        line_start = text.rfind("\n", 0, start) + 1
        indent = re.match(r"[ \t]*", text[line_start:]).group()  # type: ignore[union-attr]
        line_end = text.find("\n", end)
        line_end = line_end - 1 if line_end > end and text[line_end - 1] == "\r" else line_end
        rest = text[end:line_end].strip() if line_end >= 0 else "?"
        if not rest or rest.startswith("//"):
            edits = [editor.cpp_edit(unit, line_end, line_end, f"\n{indent}{check}")]
        else:  # more code follows on the line: right after the launch
            edits = [editor.cpp_edit(unit, end, end, f" {check}")]
        if needs_header:
            edits.append(_include_edit(editor, unit))
        return Fix(f"check the launch of `{launch.kernel}` with `{check}`", tuple(edits))

    @staticmethod
    def _callers_check(index: CppIndex, function: CppFunction) -> bool:
        callers = callers_of(index, function)
        if not callers:
            return False
        for call in callers:
            if call.function is None:
                return False
            after = [c for c in calls_in(index, call.function)
                     if _is_check(c) and c.node.start_byte > call.node.end_byte]
            if not after:
                return False
        return True


def _is_check(call: CppCall) -> bool:
    short = call.short_name
    if short in ERROR_QUERIES:
        return True
    if "check" in short.lower() and call.args:
        arguments = "".join(compact(call.unit.text_of(a)) for a in call.args)
        return bool(_CUDA_CALL.search(arguments))
    return False


def _check_for(index: CppIndex, unit: CudaUnit) -> tuple[str, bool]:
    """The check to add in `unit`, and whether its header must be included: the unit's own way
    of checking `cudaGetLastError()` if it has one, else C10_CUDA_KERNEL_LAUNCH_CHECK."""
    included = {match.group(1) for match in _INCLUDE.finditer(unit.text)}
    if "C10_CUDA_KERNEL_LAUNCH_CHECK" in unit.text or included & _HEADERS_WITH_CHECK:
        return LAUNCH_CHECK, False
    for call in index.calls:
        if call.unit is unit and _is_check(call) and len(call.args) == 1 and compact(
                unit.text_of(call.args[0])) in ("cudaGetLastError()", "cudaPeekAtLastError()"):
            return compact(unit.text_of(call.node)) + ";", False
    return LAUNCH_CHECK, True


def _include_edit(editor: Editor, unit: CudaUnit):
    """`#include <c10/cuda/CUDAException.h>` after the unit's last include, or at its top."""
    include = f"#include <{CHECK_HEADER}>"
    last = None
    for last in _INCLUDE.finditer(unit.text):
        pass
    if last is not None:
        return editor.cpp_edit(unit, last.end(), last.end(), "\n" + include)
    first = len(unit.text) - len(unit.text.lstrip())
    return editor.cpp_edit(unit, first, first, include + "\n")
