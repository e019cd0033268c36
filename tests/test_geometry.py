"""kaudit.geometry: the symbolic evaluator, the ceil/floor-division recognisers, grid and block
extraction, and what a kernel indexes with (axes, grid-stride loops, guards, coverage)."""

from __future__ import annotations

import textwrap

import pytest

from kaudit.geometry import (
    GeometryAnalysis,
    ceil_div,
    classify_dim,
    equal,
    evaluate,
    floor_div,
    is_multiple,
    parse_c_expr,
    parse_python_expr,
)
from kaudit.source import SourceModel

# --- the evaluator ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, n, value", [
    ("(n + 255) // 256", 1000, 4),
    ("n // 256", 1000, 3),
    ("-(-n // 256)", 1000, 4),
    ("triton.cdiv(n, 256)", 1000, 4),
    ("math.ceil(n / 256)", 1000, 4),
    ("int(n / 256)", 1000, 3),
    ("max(n // 256, 1)", 100, 1),
    ("min(triton.cdiv(n, 256), 2)", 100000, 2),
    ("n % 256 + (1 if n > 3 else 0)", 1000, 233),
    ("triton.next_power_of_2(n)", 1000, 1024),
    ("(n << 2) >> 4", 1000, 250),
])
def test_python_expressions_evaluate(text, n, value):
    assert evaluate(parse_python_expr(text), {"n": n}) == value


@pytest.mark.parametrize("text, n, value", [
    ("(n + 255) / 256", 1000, 4),
    ("n / 256", 1000, 3),
    ("-(-n / 256)", 1000, 3),  # C truncates toward zero: this is a floor, not a ceil
    ("(n + threads - 1) / threads", 1000, 4),
    ("(int)ceil(n / 256.0)", 1000, 4),
    ("(int)ceilf((float)n / threads)", 1000, 4),
    ("static_cast<int>(n / 256.0f)", 1000, 3),
    ("std::min((n + 255) / 256, 2)", 1000, 2),
    ("(n + 255) >> 8", 1000, 4),
    ("sizeof(float) * 256", 0, 1024),
    ("n % 256 ? n / 256 + 1 : n / 256", 1000, 4),
])
def test_c_expressions_evaluate(text, n, value):
    assert evaluate(parse_c_expr(text, "const int threads = 256;"), {"n": n}) == value


def test_names_resolve_through_host_declarations():
    grid = parse_c_expr("blocks", "const int threads = 256; int blocks = n / threads; "
                                  "if (n % threads) blocks++;")
    assert evaluate(grid, {"n": 1000}) == 4
    assert classify_dim(grid).kind == "ceil"


def test_symbolic_equality_and_multiples():
    assert equal(parse_c_expr("threads * 4", "const int threads = 256;"), parse_c_expr("1024"))
    assert equal(parse_python_expr("a * (b + 1)"), parse_python_expr("a + b * a"))
    assert not equal(parse_python_expr("a * b"), parse_python_expr("a + b"))
    assert is_multiple(parse_python_expr("rows * 1024"), parse_python_expr("256"))
    assert is_multiple(parse_python_expr("triton.cdiv(n, B) * B"), parse_python_expr("B"))
    assert not is_multiple(parse_python_expr("rows * 100"), parse_python_expr("256"))
    assert not is_multiple(parse_python_expr("N"), parse_python_expr("256"))
    assert is_multiple(parse_python_expr("N", {"N": "4096"}), parse_python_expr("256"))


@pytest.mark.parametrize("text", ["x.numel() // x.size(-1)", "x.numel() // x.shape[-1]",
                                  "x.numel() // (x.size(0) * x.size(1))", "x.numel() * 4 // x.size(2)"])
def test_element_count_is_a_multiple_of_each_size(text):
    assert is_multiple(parse_python_expr(text).args[0], parse_python_expr(text).args[1])
    assert classify_dim(parse_python_expr(text)).kind == "exact"


@pytest.mark.parametrize("text", ["x.numel() // (x.size(0) * x.size(-1))",  # maybe the same dimension
                                  "x.numel() // (x.size(1) * x.size(1))", "x.numel() // w.size(0) // 4"])
def test_element_count_divided_by_sizes_not_proven(text):
    assert classify_dim(parse_python_expr(text)).kind != "exact"


@pytest.mark.parametrize("text, kind", [
    ("n // d", "rows"), ("x.numel() // w.size(0)", "rows"), ("n // (c * h * w)", "rows"),
    ("n // (4 * d)", "floor"), ("n // BLOCK", "floor"), ("n // (BLOCK * d)", "floor"),
])
def test_division_by_a_data_dimension_counts_rows(text, kind):
    assert classify_dim(parse_python_expr(text)).kind == kind


def test_sizes_times_exact_divisions_are_sizes():
    grid = parse_python_expr("b * (x.numel() // (x.size(0) * x.size(1)))")
    assert classify_dim(grid).kind == "size"


# --- ceil and floor divisions, every spelling ------------------------------------------------

PY_CEIL = ["(n + 255) // 256", "(n + B - 1) // B", "triton.cdiv(n, B)", "cdiv(n, B)", "-(-n // B)",
           "(n - 1) // B + 1", "math.ceil(n / B)", "n // B + (n % B != 0)", "n // B + (1 if n % B else 0)",
           "max(triton.cdiv(n, B), 1)", "n // B + 1", "(4 * n + 127) // 128"]
C_CEIL = ["(n + 255) / 256", "(n + threads - 1) / threads", "(n - 1) / 256 + 1", "ceil_div(n, 256)",
          "at::ceil_div(n, threads)", "DIV_UP(n, 256)", "(int)ceil(n / 256.0)", "ceilf((float)n / threads)",
          "(n + 255) >> 8", "n / 256 + (n % 256 != 0)", "(n % 256) ? n / 256 + 1 : n / 256",
          "(rows * cols + 255) / 256", "(n - 2 + 127) / 128"]
PY_FLOOR = ["n // 256", "n // B", "int(n / B)", "math.floor(n / B)", "max(n // B, 1)", "(n - 1) // B",
            "n >> 8"]
C_FLOOR = ["n / 256", "n / threads", "n >> 8", "-(-n / 256)", "(int)(n / 256.0f)", "n / 4 / 256",
           "(rows * cols) / 256"]


@pytest.mark.parametrize("text", PY_CEIL)
def test_python_ceil_spellings(text):
    """Each spelling rounds up, with a symbolic block `B` and with a known one."""
    assert classify_dim(parse_python_expr(text, {"B": "1024"})).kind == "ceil"
    expr = parse_python_expr(text)  # B stays a symbol: the recogniser does not need its value
    assert ceil_div(expr) is not None and floor_div(expr) is None
    assert classify_dim(expr).kind == "ceil"


@pytest.mark.parametrize("text", C_CEIL)
def test_c_ceil_spellings(text):
    expr = parse_c_expr(text, "const int threads = 256;")
    assert ceil_div(expr) is not None and floor_div(expr) is None
    assert classify_dim(expr).kind == "ceil"


@pytest.mark.parametrize("text", PY_FLOOR)
def test_python_floor_spellings(text):
    expr = parse_python_expr(text)
    assert ceil_div(expr) is None and floor_div(expr) is not None
    assert classify_dim(expr).kind == "floor"


@pytest.mark.parametrize("text", C_FLOOR)
def test_c_floor_spellings(text):
    expr = parse_c_expr(text, "const int threads = 256;")
    assert ceil_div(expr) is None and floor_div(expr) is not None
    assert classify_dim(expr).kind == "floor"


def test_other_grid_classes():
    assert classify_dim(parse_python_expr("(n + 127) // 256")).kind == "partial"
    assert classify_dim(parse_python_expr("rows * 1024 // 256")).kind == "exact"
    assert classify_dim(parse_python_expr("min(triton.cdiv(n, 256), 1024)")).kind == "capped"
    assert classify_dim(parse_python_expr("4096 // 256")).kind == "const"
    assert classify_dim(parse_python_expr("rows * heads")).kind == "size"
    floor = classify_dim(parse_c_expr("n / 4 / 256"))
    assert floor.kind == "floor" and evaluate(floor.division.den) == 1024


# --- launches and kernels --------------------------------------------------------------------


def launches(source: str):
    model = SourceModel("k.py", textwrap.dedent(source))
    return GeometryAnalysis.of(model).launches


def cuda_module(kernels: str, host: str) -> str:
    return (
        "from torch.utils.cpp_extension import load_inline\n"
        f"src = '''\n{textwrap.dedent(kernels)}\n"
        f"torch::Tensor run(torch::Tensor x) {{\n    auto y = torch::empty_like(x);\n"
        f"    int n = x.numel();\n{textwrap.indent(textwrap.dedent(host), '    ')}\n    return y;\n}}\n'''\n"
        "ext = load_inline(name='e', cpp_sources='', cuda_sources=src, functions=['run'])\n"
    )


ELEMENTWISE = """
__global__ void k(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


def test_cuda_grid_and_block_extraction():
    host = """
    const int threads = 256;
    int blocks = n / threads;
    dim3 block(16, 16), grid((n + 15) / 16, 4);
    dim3 g = dim3(n / 256);
    k<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    k<<<grid, block, 1024 * sizeof(float)>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    k<<<g, dim3(128)>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    """
    first, second, third = launches(cuda_module(ELEMENTWISE, host))
    assert first.grid.name == "blocks" and first.dim(0).kind == "floor"
    assert evaluate(first.block.get(0)) == 256
    assert second.grid.explicit == 2 and second.dim(0).kind == "ceil" and evaluate(second.grid.get(1)) == 4
    assert [evaluate(second.block.get(a)) for a in range(3)] == [16, 16, 1]
    assert evaluate(second.shared) == 4096
    assert third.grid.explicit == 1 and third.grid.implicit(1) and third.dim(0).kind == "floor"
    assert evaluate(third.coverage(0)[0]) == 128


def test_triton_grid_extraction():
    source = """
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, 0.0, mask=offs < n)

    def run(x):
        n = x.numel()
        k[(n // 1024,)](x, n, BLOCK=1024)
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        k[grid](x, n, BLOCK=512)

        def grid2(META):
            return (triton.cdiv(n, META["BLOCK"]), 1)
        k[grid2](x, n, 256)
    """
    tuple_grid, lambda_grid, def_grid = launches(source)
    assert tuple_grid.dim(0).kind == "floor"
    assert tuple_grid.coverage_matches(0, tuple_grid.dim(0).division.den) is not None
    assert lambda_grid.dim(0).kind == "ceil" and evaluate(lambda_grid.dim(0).division.den) == 512
    assert def_grid.grid.explicit == 2 and evaluate(def_grid.dim(0).division.den) == 256


def test_index_dimensions_cuda():
    kernels = """
    __global__ void two_d(const float* x, float* y, int rows, int cols) {
        int col = blockIdx.x * blockDim.x + threadIdx.x;
        int row = blockIdx.y * blockDim.y + threadIdx.y;
        if (row < rows && col < cols) y[row * cols + col] = x[row * cols + col];
    }
    __global__ void batched(float* y, int per) {
        int b = blockIdx.z;
        int i = blockIdx.x * 128 + threadIdx.x;
        if (i < per) y[b * per + i] = 0.f;
    }
    """
    host = """
    two_d<<<dim3(4, 4), dim3(16, 16)>>>(x.data_ptr<float>(), y.data_ptr<float>(), 8, 8);
    batched<<<4, 128>>>(y.data_ptr<float>(), n);
    """
    two_d, batched = launches(cuda_module(kernels, host))
    assert two_d.kernel.block_axes == {0, 1} and two_d.kernel.thread_axes == {0, 1}
    assert [evaluate(c) for c in two_d.coverage(1)] == [16]
    assert batched.kernel.block_axes == {0, 2}
    assert [evaluate(c) for c in batched.coverage(0)] == [128]


def test_index_dimensions_triton():
    source = """
    import triton.language as tl
    from triton import jit

    @jit
    def k(x_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(axis=1)
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + row * n_cols + cols, 1.0, mask=cols < n_cols)

    def run(x):
        k[(4, 4)](x, x.shape[1], BLOCK=128)
    """
    launch, = launches(source)
    assert launch.kernel.block_axes == {0, 1}
    assert [evaluate(c) for c in launch.coverage(0)] == [128]


@pytest.mark.parametrize("loop, axes", [
    ("for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)\n"
     "    y[i] = 0;", {0}),
    ("int stride = gridDim.x * blockDim.x;\n"
     "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = 0;", {0}),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
     "while (i < n) { y[i] = 0; i += blockDim.x * gridDim.x; }", {0}),
    ("for (int r = blockIdx.y; r < n; r += gridDim.y) y[r] = 0;", {1}),
    ("for (int i = threadIdx.x; i < n; i += blockDim.x) y[blockIdx.x * n + i] = 0;", set()),
    ("for (int k = 0; k < n; ++k) y[blockIdx.x] += 1;", set()),
])
def test_grid_stride_detection_cuda(loop, axes):
    kernels = f"__global__ void k(float* y, int n) {{\n{loop}\n}}"
    launch, = launches(cuda_module(kernels, "k<<<128, 256>>>(y.data_ptr<float>(), n);"))
    assert launch.kernel.stride_axes == axes
    assert all(launch.covered_by_loop(a) for a in axes)


@pytest.mark.parametrize("body, covered, strided", [
    ("for tile in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):\n"
     "        offs = tile * BLOCK + tl.arange(0, BLOCK)\n"
     "        tl.store(x_ptr + offs, 0.0, mask=offs < n)", {0}, {0}),
    ("for tile in range(tl.program_id(0), n, NUM_SMS):\n"
     "        tl.store(x_ptr + tile, 0.0)", {0}, {0}),
    ("for k in range(0, n, BLOCK):\n"
     "        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
     "        tl.store(x_ptr + offs, 0.0, mask=offs < n)", set(), set()),
])
def test_grid_stride_detection_triton(body, covered, strided):
    source = (
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        f"def k(x_ptr, n, NUM_SMS: tl.constexpr, BLOCK: tl.constexpr):\n    {body}\n\n"
        "def run(x):\n    k[(132,)](x, x.numel(), NUM_SMS=132, BLOCK=256)\n"
    )
    launch, = launches(source)
    assert launch.kernel.loop_axes == covered and launch.kernel.stride_axes == strided


@pytest.mark.parametrize("body, guarded", [
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\nif (i >= n) return;\ny[i] = 0;", True),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\nif (i < n) { y[i] = 0; }", True),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\nbool ok = i < n;\nif (ok) y[i] = 0;", True),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\ny[min(i, n - 1)] = 0;", True),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\ny[i] = 0;", False),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\n*(y + i) = 0;", False),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;\natomicAdd(&y[i], 1.0f);", False),
    ("__shared__ float s[256];\ns[threadIdx.x] = 0;", None),
])
def test_store_guards_cuda(body, guarded):
    kernels = f"__global__ void k(float* y, int n) {{\n{body}\n}}"
    launch, = launches(cuda_module(kernels, "k<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), n);"))
    stores = launch.kernel.stores
    if guarded is None:
        assert stores == []
    else:
        assert [s.guarded for s in stores] == [guarded]


def test_static_shared_memory_and_constant_bounds():
    kernels = """
    #define TILE 64
    __global__ void k(float* y, int n) {
        __shared__ float a[TILE][TILE];
        __shared__ double b[128];
        extern __shared__ float dyn[];
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (threadIdx.x < 32) a[0][threadIdx.x] = 0;
        if (i < 4096) y[i] = a[0][0] + b[0] + dyn[0];
    }
    """
    launch, = launches(cuda_module(kernels, "k<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), n);"))
    assert dict(launch.kernel.shared) == {"a": 64 * 64 * 4, "b": 128 * 8}
    assert [b.literal for b in launch.kernel.const_bounds] == [4096]
    assert launch.kernel.size_params == ["n"]


# --- the package's layers -------------------------------------------------------------------

GEOMETRY_LAYERS = ["algebra", "vocabulary", "python_host", "cpp_host", "kernels", "analysis"]
# python_host and cpp_host are one layer: neither imports the other
SAME_LAYER = {("python_host", "cpp_host"), ("cpp_host", "python_host")}


@pytest.mark.parametrize("module", GEOMETRY_LAYERS)
def test_geometry_modules_import_only_lower_layers(module):
    """Each module imports only the ones listed before it, so the package has no import cycle."""
    import ast
    from pathlib import Path

    import kaudit.geometry

    path = Path(kaudit.geometry.__file__).parent / f"{module}.py"
    imported = {node.module.rsplit(".", 1)[-1] for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("kaudit.geometry.")}
    lower = set(GEOMETRY_LAYERS[:GEOMETRY_LAYERS.index(module)])
    assert imported <= lower, f"{module} imports {sorted(imported - lower)}"
    assert not {(module, other) for other in imported} & SAME_LAYER
