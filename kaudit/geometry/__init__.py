"""Launch geometry: the grid and block of every kernel launch, what the kernel indexes with, and a
small symbolic evaluator that compares the two. The KA2xx rules are small queries over this.

    algebra      symbolic expressions, their normal form, and the division recognisers
    vocabulary   the shared words: grids and blocks, stores, kernel facts, preconditions
    python_host  Python host code: names, module constants, attributes, Triton grids
    cpp_host     C++ host code: names, constants and macros, `<<<grid, block>>>` configurations
    kernels      what a CUDA or Triton kernel indexes with, stores, loops over and bounds
    analysis     every launch of a file with its facts; `LaunchRule`, the rules' shared loop

Nothing is executed; sympy is not needed.
"""

from kaudit.geometry.algebra import (
    ceil_div,
    classify_dim,
    equal,
    evaluate,
    floor_div,
    is_multiple,
    remainder_text,
    substitute,
)
from kaudit.geometry.analysis import (
    GeometryAnalysis,
    LaunchGeometry,
    LaunchRule,
    axis_index_name,
    grid_dim_name,
    show_value,
    store_axes,
)
from kaudit.geometry.cpp_host import parse_c_expr
from kaudit.geometry.python_host import parse_python_expr
from kaudit.geometry.vocabulary import Store

__all__ = [
    "GeometryAnalysis", "LaunchGeometry", "LaunchRule", "Store", "axis_index_name", "ceil_div",
    "classify_dim", "equal", "evaluate", "floor_div", "grid_dim_name", "is_multiple",
    "parse_c_expr", "parse_python_expr", "remainder_text", "show_value", "store_axes",
    "substitute",
]
