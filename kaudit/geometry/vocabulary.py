"""The words the geometry modules share: grids and blocks (`Dims`), what a kernel stores and
bounds (`Store`, `IndexBound`, `KernelFacts`), host preconditions, axis names and the callee
names that round a division up. Every other geometry module imports from here and from
`algebra`, never from each other's internals, so the package has no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kaudit.findings import Location
from kaudit.geometry.algebra import Expr, clip, const

#: callee names (lower-cased, last component) that round a division up
CEIL_DIV_NAMES = frozenset({
    "cdiv", "ceil_div", "ceildiv", "div_up", "divup", "div_round_up", "ceil_divide", "ceildivide",
    "div_ceil", "divceil", "round_up_div", "cuda_ceil_div", "ceil_div_int", "idiv_ceil",
    "num_blocks_for", "blocks_for",
})
#: CUDA's built-in index objects, and the axis each member names
BUILTIN_OBJECTS = frozenset({"blockIdx", "threadIdx", "blockDim", "gridDim"})
AXES = {"x": 0, "y": 1, "z": 2}
AXIS_NAMES = "xyz"


@dataclass
class Dims:
    """A grid or block: up to three expressions, how many were written, and how it was written."""

    exprs: list[Expr]
    explicit: int
    text: str
    name: str = ""  # the variable it came from, if any
    unknown_reason: str = ""
    definition: str = ""  # what that variable was set to

    def shown(self) -> str:
        """`grid` as written, with its definition when it is a variable."""
        if self.definition and self.definition != self.text:
            return f"`{clip(self.text)}` (= `{clip(self.definition)}`)"
        return f"`{clip(self.text)}`"

    def get(self, axis: int) -> Expr:
        return self.exprs[axis] if axis < len(self.exprs) else const(1)

    def implicit(self, axis: int) -> bool:
        return axis >= self.explicit and not self.unknown_reason


@dataclass
class Store:
    """A write to global memory: `out[i] = ...`, `*(out + i) = ...`, `atomicAdd(&out[i], v)`,
    `tl.store(ptr + offs, v)`."""

    text: str
    location: Location
    guarded: bool  # a bound check, mask or loop condition on its index
    tokens: frozenset[str]  # what the index depends on, transitively
    extents: tuple[Expr, ...] = ()  # Triton: the `tl.arange` extents in the pointer


@dataclass
class IndexBound:
    """An upper bound on a global index (`i < n`, `if (i >= 4096) return;`, `mask = offs < N`):
    against an integer literal, a named constant of the file (`FEATURES`, `#define N 4096`), or
    a kernel parameter whose value the launch decides."""

    text: str
    location: Location
    literal: int | None = None  # the bound's value, for a literal or a named constant
    name: str = ""  # the named constant
    param: str = ""  # the kernel parameter


@dataclass
class KernelFacts:
    name: str
    lang: str  # "cuda" or "triton"
    params: list[str]
    size_params: list[str]  # integral (CUDA) or non-constexpr scalar (Triton) parameters
    block_axes: set[int]  # blockIdx / program_id axes the stored indices depend on
    thread_axes: set[int]  # threadIdx axes the stored indices depend on (CUDA)
    loop_axes: set[int]  # axes a loop walks over the whole size (grid-stride, persistent loops)
    stride_axes: set[int]  # axes with a loop stepping by gridDim / num_programs
    #: computes the coverage of every index (False) or of the stored indices only (True)
    coverage_source: Callable[[bool], dict[int, list[Expr]]]
    stores: list[Store]
    #: computes the bounds by constants (True) or by parameters (False) when first asked
    bounds_source: Callable[[bool], list[IndexBound]]
    shared: list[tuple[str, int | None]]  # static __shared__ arrays and their bytes
    template_params: list[str] = field(default_factory=list)
    constexpr: set[str] = field(default_factory=set)

    _coverage: dict[bool, dict[int, list[Expr]]] = field(default_factory=dict)
    _bounds: dict[bool, list[IndexBound]] = field(default_factory=dict)

    def _bounds_of(self, fixed: bool) -> list[IndexBound]:
        if fixed not in self._bounds:
            try:
                self._bounds[fixed] = self.bounds_source(fixed)
            except RecursionError:
                self._bounds[fixed] = []
        return self._bounds[fixed]

    @property
    def const_bounds(self) -> list[IndexBound]:
        """Upper bounds on the global index fixed in the kernel: a literal or a named constant
        (valued; one the file does not define is left out)."""
        return [b for b in self._bounds_of(True) if b.literal is not None]

    @property
    def param_bounds(self) -> list[IndexBound]:
        """Upper bounds on the global index by kernel parameters (`i < n`)."""
        return self._bounds_of(False)

    def _coverage_of(self, output_only: bool) -> dict[int, list[Expr]]:
        if output_only not in self._coverage:
            try:
                self._coverage[output_only] = self.coverage_source(output_only)
            except RecursionError:
                self._coverage[output_only] = {}
        return self._coverage[output_only]

    @property
    def coverage(self) -> dict[int, list[Expr]]:
        """Elements each block (program) covers along an axis, in kernel terms, by any index it
        reads or writes."""
        return self._coverage_of(False)

    @property
    def output_coverage(self) -> dict[int, list[Expr]]:
        """The same, by the indices of its stores only: what it covers of its outputs (a
        pooling window `oh * ks + di` that is only read is not there)."""
        return self._coverage_of(True)


@dataclass
class Precondition:
    """A host check that a size is a multiple of something (`TORCH_CHECK(n % 256 == 0)`,
    `assert n % BLOCK == 0`, `if n % B: raise`)."""

    text: str
    divisors: list[Expr]  # the `B` of each `X % B` in the check


def axes_of(tokens: Iterable[str], prefix: str) -> set[int]:
    """The axes named in index tokens: `blockIdx.y` -> 1 for prefix "blockIdx", `pid1` -> 1 for
    "pid" (Triton's `tl.program_id(1)`) or "nprog" (`tl.num_programs(1)`)."""
    out = set()
    for token in tokens:
        if prefix in ("pid", "nprog"):
            if token.startswith(prefix) and token[len(prefix):].isdigit():
                out.add(int(token[len(prefix):]))
        elif token.startswith(prefix + ".") and token[-1] in AXES:
            out.add(AXES[token[-1]])
    return out
