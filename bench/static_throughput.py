#!/usr/bin/env python3
"""Static-scan throughput benchmark for kaudit.

Generates a deterministic synthetic corpus of KernelBench-style kernel modules
(half CUDA through ``load_inline``, half Triton, ~20% with cheating patterns),
times a plain in-process regex scan of it as a floor, then times
``python -m kaudit scan DIR --format json --jobs J`` end to end.

    python bench/static_throughput.py [--files N] [--seed S] [--jobs 1,2]
                                      [--repeat R] [--keep DIR] [--check] [--json]

--check only generates the corpus and validates it (ast.parse, size, markers).

With --corpus DIR (repeatable) it times real kernels instead, next to KernelBench's static
checker loaded from --kernelbench-checker PATH or --kernelbench KERNELBENCH_DIR, in the same
run (bench/corpus_throughput.py).
Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

REPO_ROOT = Path(__file__).resolve().parent.parent

BACKENDS = ("cuda", "triton")
PROBLEM_KINDS = ("elementwise", "matmul", "softmax", "reduction", "layernorm")
CHEAT_KINDS = ("torch_in_forward", "try_fallback", "inherits_model")
CHEAT_RATE = 0.2
MIN_LINES, MAX_LINES = 100, 300


class BenchError(Exception):
    """A benchmark step failed in a way the user must see (bad exit code, bad JSON, ...)."""


def log(message: str) -> None:
    # Progress goes to stderr so stdout stays a clean table or JSON document.
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Template helpers
# --------------------------------------------------------------------------

def fill(template: str, **values: object) -> str:
    """Dedent a template and substitute ``${name}`` fields.

    string.Template rather than str.format because CUDA bodies and dict
    literals are full of braces that would all need doubling.
    """
    return Template(textwrap.dedent(template).strip("\n")).substitute(values)


def indent(text: str, level: int = 1) -> str:
    pad = "    " * level
    return "\n".join(pad + line if line.strip() else "" for line in text.splitlines())


# --------------------------------------------------------------------------
# Problem catalogue
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class ElementwiseOp:
    torch_expr: str   # reference expression over `x`
    cuda_expr: str    # CUDA expression over the float `v`
    triton_expr: str  # Triton expression over the block `x`


ELEMENTWISE_OPS = {
    "relu": ElementwiseOp("torch.relu(x)", "fmaxf(v, 0.0f)", "tl.maximum(x, 0.0)"),
    "gelu": ElementwiseOp(
        'F.gelu(x, approximate="tanh")',
        "0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))",
        "x * tl.sigmoid(1.702 * x)",
    ),
    "sigmoid": ElementwiseOp("torch.sigmoid(x)", "1.0f / (1.0f + expf(-v))", "tl.sigmoid(x)"),
    "swish": ElementwiseOp("x * torch.sigmoid(x)", "v / (1.0f + expf(-v))", "x * tl.sigmoid(x)"),
    "leaky_relu": ElementwiseOp(
        "F.leaky_relu(x, negative_slope=0.01)", "v > 0.0f ? v : 0.01f * v", "tl.where(x > 0, x, 0.01 * x)"
    ),
    "hardtanh": ElementwiseOp(
        "F.hardtanh(x, min_val=-1.0, max_val=1.0)",
        "fminf(fmaxf(v, -1.0f), 1.0f)",
        "tl.minimum(tl.maximum(x, -1.0), 1.0)",
    ),
    "tanh": ElementwiseOp("torch.tanh(x)", "tanhf(v)", "2.0 * tl.sigmoid(2.0 * x) - 1.0"),
}


@dataclass(frozen=True)
class ReduceOp:
    torch_expr: str
    cuda_init: str
    cuda_accumulate: str   # per-thread step over row_ptr[c]
    cuda_combine: str      # shared-memory tree step
    cuda_finalize: str
    triton_other: str      # masked-load fill value
    triton_init: str
    triton_accumulate: str
    triton_finalize: str


REDUCE_OPS = {
    "sum": ReduceOp(
        "torch.sum(x, dim=self.dim)", "0.0f", "acc + row_ptr[c]", "sdata[tid] + sdata[tid + s]", "sdata[0]",
        "0.0", "tl.zeros((BLOCK_SIZE,), dtype=tl.float32)", "acc + vals", "tl.sum(acc, axis=0)",
    ),
    "mean": ReduceOp(
        "torch.mean(x, dim=self.dim)", "0.0f", "acc + row_ptr[c]", "sdata[tid] + sdata[tid + s]",
        "sdata[0] / cols", "0.0", "tl.zeros((BLOCK_SIZE,), dtype=tl.float32)", "acc + vals",
        "tl.sum(acc, axis=0) / n_cols",
    ),
    "max": ReduceOp(
        "torch.max(x, dim=self.dim)[0]", "-FLT_MAX", "fmaxf(acc, row_ptr[c])",
        "fmaxf(sdata[tid], sdata[tid + s])", "sdata[0]", 'float("-inf")',
        'tl.full((BLOCK_SIZE,), float("-inf"), dtype=tl.float32)', "tl.maximum(acc, vals)",
        "tl.max(acc, axis=0)",
    ),
}


@dataclass
class Problem:
    kind: str
    op: str                  # activation / reduction name, or the kind itself
    description: str
    forward_params: str      # "x" or "A, B"
    call_args: str           # arguments the custom op receives from forward
    init_params: str         # __init__ parameters ("" when none)
    reference_init: list[str]
    new_init: list[str]      # ModelNew.__init__ lines after super().__init__
    reference_expr: str      # Model.forward return expression
    cheat_expr: str          # what a cheating ModelNew.forward returns instead
    consts: dict[str, object]
    input_lines: list[str]   # get_inputs body, before the return
    input_names: str
    init_inputs: str


def make_problem(kind: str, rng: random.Random) -> Problem:
    batch = rng.choice([16, 32, 64, 128, 256, 1024, 4096])
    dim = rng.choice([256, 1024, 4096, 16384, 65536])
    x_inputs = ["x = torch.randn(batch_size, dim)"]
    if kind == "elementwise":
        op = rng.choice(sorted(ELEMENTWISE_OPS))
        expr = ELEMENTWISE_OPS[op].torch_expr
        return Problem(kind, op, f"a {op} activation", "x", "x", "", [], [], expr, expr,
                       {"batch_size": batch, "dim": dim}, x_inputs, "x", "[]")
    if kind == "matmul":
        m, k, n = (rng.choice([256, 512, 1024, 2048, 4096]) for _ in range(3))
        cheat = rng.choice(["torch.matmul(A, B)", "torch.mm(A, B)", "torch.bmm(A.unsqueeze(0), B.unsqueeze(0))[0]"])
        return Problem(kind, "matmul", "a single matrix multiplication (C = A * B)", "A, B", "A, B", "", [], [],
                       "torch.matmul(A, B)", cheat, {"M": m, "K": k, "N": n},
                       ["A = torch.randn(M, K)", "B = torch.randn(K, N)"], "A, B", "[]")
    if kind == "softmax":
        cheat = rng.choice(["F.softmax(x, dim=-1)", "torch.softmax(x, dim=1)", "x.softmax(dim=-1)"])
        return Problem(kind, "softmax", "a row-wise softmax", "x", "x", "", [], [], "torch.softmax(x, dim=1)",
                       cheat, {"batch_size": batch, "dim": dim}, x_inputs, "x", "[]")
    if kind == "reduction":
        op = rng.choice(sorted(REDUCE_OPS))
        expr = REDUCE_OPS[op].torch_expr
        return Problem(kind, op, f"a {op} reduction over one dimension", "x", "x", "dim",
                       ["self.dim = dim"], ["self.dim = dim"], expr, expr,
                       {"batch_size": batch, "dim": dim, "reduce_dim": 1}, x_inputs, "x", "[reduce_dim]")
    if kind == "layernorm":
        return Problem(
            kind, "layernorm", "layer normalisation over the last dimension", "x",
            "x, self.weight, self.bias, self.eps", "normalized_shape",
            ["self.ln = nn.LayerNorm(normalized_shape=normalized_shape)"],
            ["self.weight = nn.Parameter(torch.ones(normalized_shape))",
             "self.bias = nn.Parameter(torch.zeros(normalized_shape))",
             f"self.eps = {rng.choice(['1e-5', '1e-6'])}"],
            "self.ln(x)", "F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)",
            {"batch_size": batch, "features": dim}, ["x = torch.randn(batch_size, features)"], "x",
            "[(features,)]",
        )
    raise ValueError(f"unknown problem kind {kind!r}")


# --------------------------------------------------------------------------
# Per-file design: every random decision is taken here, so rendering is pure
# and can be repeated while filler is added to hit the target length.
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class AuxOp:
    """A small in-place epilogue kernel, giving files 1-3 kernels."""
    name: str
    kernel_params: str
    cuda_body: str
    cuda_literals: str   # neutral values when fused into the main host function
    host_params: str     # pybind-facing parameters of a standalone launcher
    host_args: str
    triton_params: str
    triton_expr: str
    py_args: str         # neutral values passed from Python


AUX_OPS = (
    AuxOp("scale", "float alpha", "data[i] = data[i] * alpha;", "1.0f", "double alpha",
          "static_cast<float>(alpha)", "alpha", "vals * alpha", "1.0"),
    AuxOp("shift", "float beta", "data[i] = data[i] + beta;", "0.0f", "double beta",
          "static_cast<float>(beta)", "beta", "vals + beta", "0.0"),
    AuxOp("clamp", "float lo, float hi", "data[i] = fminf(fmaxf(data[i], lo), hi);", "-FLT_MAX, FLT_MAX",
          "double lo, double hi", "static_cast<float>(lo), static_cast<float>(hi)", "lo, hi",
          "tl.minimum(tl.maximum(vals, lo), hi)", "-3.0e38, 3.0e38"),
)

NAME_PREFIXES = ("fused", "fast", "tiled", "opt", "custom", "my", "vec", "warp", "blocked", "simple", "naive", "lean")
KIND_ALIASES = {
    "matmul": ("matmul", "gemm", "mm", "sgemm"),
    "softmax": ("softmax", "row_softmax", "safe_softmax"),
    "layernorm": ("layernorm", "layer_norm", "ln"),
}


@dataclass
class Design:
    index: int
    backend: str
    cheat: str | None
    problem: Problem
    stem: str
    target_lines: int
    block: int               # CUDA threads per block / Triton BLOCK_SIZE
    tile: int                # matmul tile edge
    aux: list[AuxOp]
    aux_in_python: bool      # epilogues called from forward rather than fused into the host function
    grid_style: str          # Triton: "tuple", "lambda" or "inline"
    grid_stride: bool        # CUDA elementwise: grid-stride loop vs guarded index
    launch_check: bool       # CUDA: cudaGetLastError after launch
    ext_on_self: bool        # CUDA: ModelNew keeps the extension as self.ext
    qualified_load_inline: bool
    load_inline_extras: list[str]
    host_suffix: str
    cuda_inputs: bool        # get_inputs moves tensors to the GPU
    except_clause: str

    @property
    def kernel(self) -> str:
        return f"{self.stem}_kernel"

    @property
    def host(self) -> str:
        return f"{self.stem}_{self.host_suffix}"

    @property
    def ext_var(self) -> str:
        return f"{self.stem}_ext"

    @property
    def wrapper(self) -> str:
        return f"triton_{self.stem}"

    def aux_kernel(self, aux: AuxOp) -> str:
        return f"{self.stem}_{aux.name}_kernel"

    def aux_entry(self, aux: AuxOp) -> str:
        # Python-callable name: pybind function (CUDA) or launcher (Triton).
        return f"{self.stem}_{aux.name}" if self.backend == "cuda" else f"_{self.stem}_{aux.name}"

    @property
    def file_name(self) -> str:
        return f"{self.index:04d}_{self.backend}_{self.stem}.py"


def plan_file(index: int, rng: random.Random) -> Design:
    backend = BACKENDS[index % 2]  # strict alternation keeps the CUDA/Triton split even for small N
    kind = rng.choice(PROBLEM_KINDS)
    cheat = rng.choice(CHEAT_KINDS) if rng.random() < CHEAT_RATE else None
    problem = make_problem(kind, rng)
    if kind in KIND_ALIASES:
        alias = rng.choice(KIND_ALIASES[kind])
    elif kind == "reduction":
        alias = rng.choice([f"{problem.op}_reduce", f"row_{problem.op}"])
    else:
        alias = problem.op
    n_aux = rng.choice([0, 0, 1, 1, 2]) if backend == "cuda" else rng.choice([0, 0, 1])
    extras = [e for e in ('extra_cuda_cflags=["-O3"]', "verbose=False", 'extra_cflags=["-O2"]') if rng.random() < 0.5]
    return Design(
        index=index,
        backend=backend,
        cheat=cheat,
        problem=problem,
        stem=f"{rng.choice(NAME_PREFIXES)}_{alias}",
        target_lines=rng.randint(MIN_LINES, MAX_LINES),
        block=rng.choice([128, 256, 512, 1024]),
        tile=rng.choice([16, 32]) if backend == "cuda" else rng.choice([32, 64, 128]),
        aux=rng.sample(AUX_OPS, n_aux),
        aux_in_python=backend == "triton" or rng.random() < 0.5,
        grid_style=rng.choice(["tuple", "lambda", "inline"]),
        grid_stride=rng.random() < 0.5,
        launch_check=rng.random() < 0.4,
        ext_on_self=rng.random() < 0.5,
        qualified_load_inline=rng.random() < 0.25,
        load_inline_extras=extras,
        host_suffix=rng.choice(["cuda", "forward", "launcher"]),
        cuda_inputs=rng.random() < 0.4,
        except_clause=rng.choice(["except Exception:", "except RuntimeError:", "except Exception as exc:"]),
    )


# --------------------------------------------------------------------------
# CUDA pieces
# --------------------------------------------------------------------------

def cuda_epilogue(d: Design) -> str:
    """Lines appended after the main launch (fused epilogues, launch check)."""
    lines: list[str] = []
    if not d.aux_in_python:
        for aux in d.aux:
            lines += [
                "{",
                "    // in-place epilogue over the whole output",
                "    const int64_t total = out.numel();",
                "    const int epi_blocks = (int)((total + 255) / 256);",
                f"    {d.aux_kernel(aux)}<<<epi_blocks, 256>>>(out.data_ptr<float>(), {aux.cuda_literals}, total);",
                "}",
            ]
    if d.launch_check:
        lines.append(f'TORCH_CHECK(cudaGetLastError() == cudaSuccess, "{d.kernel} launch failed");')
    return "".join("\n    " + line for line in lines)


def cuda_elementwise(d: Design) -> tuple[str, str, str]:
    expr = ELEMENTWISE_OPS[d.problem.op].cuda_expr
    if d.grid_stride:
        body = fill("""
            // grid-stride loop so any grid size covers the tensor
            for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
                 idx += (int64_t)blockDim.x * gridDim.x) {
                const float v = x[idx];
                out[idx] = ${expr};
            }
        """, expr=expr)
    else:
        body = fill("""
            const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
            if (idx < n) {
                const float v = x[idx];
                out[idx] = ${expr};
            }
        """, expr=expr)
    kernel = (f"__global__ void {d.kernel}(const float* __restrict__ x, float* __restrict__ out, int64_t n) {{\n"
              f"{indent(body)}\n}}")
    host = fill("""
        torch::Tensor ${host}(torch::Tensor x) {
            TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
            auto x_c = x.contiguous();
            auto out = torch::empty_like(x_c);
            const int64_t n = x_c.numel();
            const int block = ${block};
            const int grid = (int)((n + block - 1) / block);
            ${kernel}<<<grid, block>>>(x_c.data_ptr<float>(), out.data_ptr<float>(), n);${epilogue}
            return out;
        }
    """, host=d.host, block=d.block, kernel=d.kernel, epilogue=cuda_epilogue(d))
    return kernel, host, f"torch::Tensor {d.host}(torch::Tensor x);"


def cuda_matmul(d: Design) -> tuple[str, str, str]:
    kernel = fill("""
        #define TILE ${tile}

        __global__ void ${kernel}(
            const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
            __shared__ float As[TILE][TILE];
            __shared__ float Bs[TILE][TILE];
            const int row = blockIdx.y * TILE + threadIdx.y;
            const int col = blockIdx.x * TILE + threadIdx.x;
            float acc = 0.0f;
            for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
                const int a_col = t * TILE + threadIdx.x;
                const int b_row = t * TILE + threadIdx.y;
                As[threadIdx.y][threadIdx.x] = (row < M && a_col < K) ? A[row * K + a_col] : 0.0f;
                Bs[threadIdx.y][threadIdx.x] = (b_row < K && col < N) ? B[b_row * N + col] : 0.0f;
                __syncthreads();
                #pragma unroll
                for (int k = 0; k < TILE; ++k) {
                    acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
                }
                __syncthreads();
            }
            if (row < M && col < N) {
                C[row * N + col] = acc;
            }
        }
    """, tile=d.tile, kernel=d.kernel)
    host = fill("""
        torch::Tensor ${host}(torch::Tensor A, torch::Tensor B) {
            TORCH_CHECK(A.dim() == 2 && B.dim() == 2, "expected 2D inputs");
            TORCH_CHECK(A.size(1) == B.size(0), "inner dimensions must match");
            auto a = A.contiguous();
            auto b = B.contiguous();
            const int M = a.size(0);
            const int K = a.size(1);
            const int N = b.size(1);
            auto out = torch::zeros({M, N}, a.options());
            dim3 block(TILE, TILE);
            dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
            ${kernel}<<<grid, block>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), M, N, K);${epilogue}
            return out;
        }
    """, host=d.host, kernel=d.kernel, epilogue=cuda_epilogue(d))
    return kernel, host, f"torch::Tensor {d.host}(torch::Tensor A, torch::Tensor B);"


# Shared-memory tree reduction used by the row-wise CUDA kernels.
TREE_REDUCE = """
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] = ${combine};
        }
        __syncthreads();
    }
"""


def tree_reduce(combine: str) -> str:
    # Indented one level: it is spliced into a kernel body at column 0.
    return indent(fill(TREE_REDUCE, combine=combine))


def cuda_row_host(d: Design, out_alloc: str, extra_params: str = "", extra_args: str = "") -> str:
    """Host function for the one-block-per-row kernels (softmax, reduction, layernorm)."""
    return fill("""
        torch::Tensor ${host}(torch::Tensor x${extra_params}) {
            TORCH_CHECK(x.dim() == 2, "expected a 2D input");
            auto x_c = x.contiguous();
            const int rows = x_c.size(0);
            const int cols = x_c.size(1);
            auto out = ${out_alloc};
            const int threads = ${block};
            const size_t smem = threads * sizeof(float);
            ${kernel}<<<rows, threads, smem>>>(x_c.data_ptr<float>()${extra_args}, out.data_ptr<float>(), rows, cols);${epilogue}
            return out;
        }
    """, host=d.host, extra_params=extra_params, out_alloc=out_alloc, block=d.block, kernel=d.kernel,
        extra_args=extra_args, epilogue=cuda_epilogue(d))


def cuda_softmax(d: Design) -> tuple[str, str, str]:
    kernel = fill("""
        __global__ void ${kernel}(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
            extern __shared__ float sdata[];
            const int row = blockIdx.x;
            const int tid = threadIdx.x;
            if (row >= rows) return;
            const float* row_in = x + (int64_t)row * cols;
            float* row_out = out + (int64_t)row * cols;

            // pass 1: row maximum, for numerical stability
            float local_max = -FLT_MAX;
            for (int c = tid; c < cols; c += blockDim.x) {
                local_max = fmaxf(local_max, row_in[c]);
            }
            sdata[tid] = local_max;
            __syncthreads();
        ${reduce_max}
            const float row_max = sdata[0];
            __syncthreads();

            // pass 2: sum of exponentials
            float local_sum = 0.0f;
            for (int c = tid; c < cols; c += blockDim.x) {
                local_sum += expf(row_in[c] - row_max);
            }
            sdata[tid] = local_sum;
            __syncthreads();
        ${reduce_sum}
            const float inv_sum = 1.0f / sdata[0];

            // pass 3: normalise
            for (int c = tid; c < cols; c += blockDim.x) {
                row_out[c] = expf(row_in[c] - row_max) * inv_sum;
            }
        }
    """, kernel=d.kernel, reduce_max=tree_reduce("fmaxf(sdata[tid], sdata[tid + s])"),
        reduce_sum=tree_reduce("sdata[tid] + sdata[tid + s]"))
    host = cuda_row_host(d, "torch::empty_like(x_c)")
    return kernel, host, f"torch::Tensor {d.host}(torch::Tensor x);"


def cuda_reduction(d: Design) -> tuple[str, str, str]:
    op = REDUCE_OPS[d.problem.op]
    kernel = fill("""
        __global__ void ${kernel}(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
            extern __shared__ float sdata[];
            const int row = blockIdx.x;
            const int tid = threadIdx.x;
            if (row >= rows) return;
            const float* row_ptr = x + (int64_t)row * cols;
            float acc = ${init};
            for (int c = tid; c < cols; c += blockDim.x) {
                acc = ${accumulate};
            }
            sdata[tid] = acc;
            __syncthreads();
            // tree reduction in shared memory; blockDim.x is a power of two
        ${reduce}
            if (tid == 0) {
                out[row] = ${finalize};
            }
        }
    """, kernel=d.kernel, init=op.cuda_init, accumulate=op.cuda_accumulate,
        reduce=tree_reduce(op.cuda_combine), finalize=op.cuda_finalize)
    host = cuda_row_host(d, "torch::empty({rows}, x_c.options())")
    return kernel, host, f"torch::Tensor {d.host}(torch::Tensor x);"


def cuda_layernorm(d: Design) -> tuple[str, str, str]:
    kernel = fill("""
        __global__ void ${kernel}(
            const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
            float eps, float* __restrict__ out, int rows, int cols) {
            extern __shared__ float sdata[];
            const int row = blockIdx.x;
            const int tid = threadIdx.x;
            if (row >= rows) return;
            const float* row_in = x + (int64_t)row * cols;
            float* row_out = out + (int64_t)row * cols;

            float sum = 0.0f;
            for (int c = tid; c < cols; c += blockDim.x) {
                sum += row_in[c];
            }
            sdata[tid] = sum;
            __syncthreads();
        ${reduce}
            const float mean = sdata[0] / cols;
            __syncthreads();

            float sq = 0.0f;
            for (int c = tid; c < cols; c += blockDim.x) {
                const float diff = row_in[c] - mean;
                sq += diff * diff;
            }
            sdata[tid] = sq;
            __syncthreads();
        ${reduce}
            const float rstd = rsqrtf(sdata[0] / cols + eps);

            for (int c = tid; c < cols; c += blockDim.x) {
                row_out[c] = (row_in[c] - mean) * rstd * gamma[c] + beta[c];
            }
        }
    """, kernel=d.kernel, reduce=tree_reduce("sdata[tid] + sdata[tid + s]"))
    params = ", torch::Tensor weight, torch::Tensor bias, double eps"
    args = ", weight.data_ptr<float>(), bias.data_ptr<float>(), static_cast<float>(eps)"
    host = cuda_row_host(d, "torch::empty_like(x_c)", params, args)
    return kernel, host, f"torch::Tensor {d.host}(torch::Tensor x{params});"


CUDA_MAIN = {
    "elementwise": cuda_elementwise,
    "matmul": cuda_matmul,
    "softmax": cuda_softmax,
    "reduction": cuda_reduction,
    "layernorm": cuda_layernorm,
}


def cuda_aux(d: Design, aux: AuxOp) -> tuple[str, str | None, str | None]:
    """Epilogue kernel, plus a standalone launcher when forward calls it directly."""
    kernel = fill("""
        __global__ void ${name}(float* __restrict__ data, ${params}, int64_t n) {
            const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) {
                ${body}
            }
        }
    """, name=d.aux_kernel(aux), params=aux.kernel_params, body=aux.cuda_body)
    if not d.aux_in_python:
        return kernel, None, None
    host = fill("""
        torch::Tensor ${entry}(torch::Tensor t, ${params}) {
            auto data = t.contiguous();
            const int64_t n = data.numel();
            const int threads = 256;
            const int blocks = (int)((n + threads - 1) / threads);
            ${kernel}<<<blocks, threads>>>(data.data_ptr<float>(), ${args}, n);
            return data;
        }
    """, entry=d.aux_entry(aux), params=aux.host_params, kernel=d.aux_kernel(aux), args=aux.host_args)
    return kernel, host, f"torch::Tensor {d.aux_entry(aux)}(torch::Tensor t, {aux.host_params});"


def render_cuda_extension(d: Design, device_fillers: list[str]) -> str:
    """cuda_sources / cpp_sources strings and the load_inline call."""
    main_kernel, main_host, main_decl = CUDA_MAIN[d.problem.kind](d)
    kernels, hosts, decls, functions = [], [main_host], [main_decl], [d.host]
    for aux in d.aux:
        kernel, host, decl = cuda_aux(d, aux)
        kernels.append(kernel)
        if host is not None:
            hosts.append(host)
            decls.append(decl)
            functions.append(d.aux_entry(aux))
    includes = "#include <torch/extension.h>\n#include <cuda_runtime.h>\n#include <cfloat>"
    source = "\n\n".join([includes, *device_fillers, *kernels, main_kernel, *hosts])
    cuda_var, cpp_var = f"{d.stem}_cuda_source", f"{d.stem}_cpp_source"
    if len(decls) == 1:
        cpp = f'{cpp_var} = "{decls[0]}"'
    else:
        cpp = f'{cpp_var} = """\n' + "\n".join(decls) + '\n"""'
    loader = "torch.utils.cpp_extension.load_inline" if d.qualified_load_inline else "load_inline"
    call_lines = [
        f'    name="{d.stem}_{d.index}",',
        f"    cpp_sources={cpp_var},",
        f"    cuda_sources={cuda_var},",
        "    functions=[" + ", ".join(f'"{f}"' for f in functions) + "],",
        *(f"    {extra}," for extra in d.load_inline_extras),
    ]
    load = f"{d.ext_var} = {loader}(\n" + "\n".join(call_lines) + "\n)"
    return f'{cuda_var} = """\n{source}\n"""\n\n{cpp}\n\n{load}'


# --------------------------------------------------------------------------
# Triton pieces
# --------------------------------------------------------------------------

def triton_grid(d: Design, tuple_expr: str, lambda_expr: str) -> tuple[list[str], str]:
    """Setup lines and the subscript for `kernel[...]` in the chosen launch style."""
    if d.grid_style == "lambda":
        return [f"grid = lambda meta: {lambda_expr}"], "grid"
    if d.grid_style == "tuple":
        return [f"grid = {tuple_expr}"], "grid"
    return [], tuple_expr


def triton_launcher(name: str, params: str, prologue: list[str], grid: tuple[list[str], str],
                    kernel: str, args: str, result: str) -> str:
    setup, subscript = grid
    body = [*prologue, *setup, f"{kernel}[{subscript}]({args})", f"return {result}"]
    return f"def {name}({params}):\n" + "\n".join("    " + line for line in body)


def triton_elementwise(d: Design) -> tuple[str, str]:
    kernel = fill("""
        @triton.jit
        def ${kernel}(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
            pid = tl.program_id(axis=0)
            block_start = pid * BLOCK_SIZE
            offsets = block_start + tl.arange(0, BLOCK_SIZE)
            mask = offsets < n_elements  # the last block may run past the end
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
            out = ${expr}
            tl.store(out_ptr + offsets, out, mask=mask)
    """, kernel=d.kernel, expr=ELEMENTWISE_OPS[d.problem.op].triton_expr)
    grid = triton_grid(d, f"(triton.cdiv(n_elements, {d.block}),)",
                       '(triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)')
    launcher = triton_launcher(
        d.wrapper, "x: torch.Tensor", ["x = x.contiguous()", "out = torch.empty_like(x)", "n_elements = out.numel()"],
        grid, d.kernel, f"x, out, n_elements, BLOCK_SIZE={d.block}", "out")
    return kernel, launcher


def triton_matmul(d: Design) -> tuple[str, str]:
    kernel = fill("""
        @triton.jit
        def ${kernel}(
            a_ptr, b_ptr, c_ptr,
            M, N, K,
            stride_am, stride_ak,
            stride_bk, stride_bn,
            stride_cm, stride_cn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        ):
            pid_m = tl.program_id(0)
            pid_n = tl.program_id(1)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, tl.cdiv(K, BLOCK_K)):
                k_remaining = K - k * BLOCK_K
                a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_remaining), other=0.0)
                b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_remaining) & (offs_n[None, :] < N), other=0.0)
                acc += tl.dot(a, b)
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
            c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(c_ptrs, acc, mask=c_mask)
    """, kernel=d.kernel)
    grid = triton_grid(d, f"(triton.cdiv(M, {d.tile}), triton.cdiv(N, {d.tile}))",
                       '(triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))')
    launcher = triton_launcher(
        d.wrapper, "A: torch.Tensor, B: torch.Tensor",
        ['assert A.shape[1] == B.shape[0], "incompatible dimensions"', "M, K = A.shape", "_, N = B.shape",
         "C = torch.empty((M, N), device=A.device, dtype=torch.float32)"],
        grid, d.kernel,
        "A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1), "
        f"BLOCK_M={d.tile}, BLOCK_N={d.tile}, BLOCK_K=32", "C")
    return kernel, launcher


def triton_softmax(d: Design) -> tuple[str, str]:
    kernel = fill("""
        @triton.jit
        def ${kernel}(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
            # one program per row; BLOCK_SIZE covers the whole row
            row_idx = tl.program_id(0)
            row_start = in_ptr + row_idx * in_row_stride
            col_offsets = tl.arange(0, BLOCK_SIZE)
            mask = col_offsets < n_cols
            row = tl.load(row_start + col_offsets, mask=mask, other=-float("inf"))
            row_minus_max = row - tl.max(row, axis=0)
            numerator = tl.exp(row_minus_max)
            denominator = tl.sum(numerator, axis=0)
            result = numerator / denominator
            out_start = out_ptr + row_idx * out_row_stride
            tl.store(out_start + col_offsets, result, mask=mask)
    """, kernel=d.kernel)
    launcher = triton_launcher(
        d.wrapper, "x: torch.Tensor",
        ["n_rows, n_cols = x.shape", "out = torch.empty_like(x)", "BLOCK_SIZE = triton.next_power_of_2(n_cols)"],
        triton_grid(d, "(n_rows,)", "(n_rows,)"), d.kernel,
        "out, x, x.stride(0), out.stride(0), n_cols, BLOCK_SIZE=BLOCK_SIZE", "out")
    return kernel, launcher


def triton_reduction(d: Design) -> tuple[str, str]:
    op = REDUCE_OPS[d.problem.op]
    kernel = fill("""
        @triton.jit
        def ${kernel}(x_ptr, out_ptr, n_cols, row_stride, BLOCK_SIZE: tl.constexpr):
            row = tl.program_id(0)
            acc = ${init}
            for start in range(0, n_cols, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                mask = cols < n_cols
                vals = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=${other})
                acc = ${accumulate}
            result = ${finalize}
            tl.store(out_ptr + row, result)
    """, kernel=d.kernel, init=op.triton_init, other=op.triton_other, accumulate=op.triton_accumulate,
        finalize=op.triton_finalize)
    launcher = triton_launcher(
        d.wrapper, "x: torch.Tensor",
        ["x = x.contiguous()", "n_rows, n_cols = x.shape",
         "out = torch.empty((n_rows,), device=x.device, dtype=x.dtype)"],
        triton_grid(d, "(n_rows,)", "(n_rows,)"), d.kernel,
        f"x, out, n_cols, x.stride(0), BLOCK_SIZE={d.block}", "out")
    return kernel, launcher


def triton_layernorm(d: Design) -> tuple[str, str]:
    kernel = fill("""
        @triton.jit
        def ${kernel}(X, Y, W, B, stride, N, eps, BLOCK_SIZE: tl.constexpr):
            row = tl.program_id(0)
            X += row * stride
            Y += row * stride
            _mean = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            for off in range(0, N, BLOCK_SIZE):
                cols = off + tl.arange(0, BLOCK_SIZE)
                a = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
                _mean += a
            mean = tl.sum(_mean, axis=0) / N
            _var = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            for off in range(0, N, BLOCK_SIZE):
                cols = off + tl.arange(0, BLOCK_SIZE)
                x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
                x = tl.where(cols < N, x - mean, 0.0)
                _var += x * x
            var = tl.sum(_var, axis=0) / N
            rstd = 1 / tl.sqrt(var + eps)
            for off in range(0, N, BLOCK_SIZE):
                cols = off + tl.arange(0, BLOCK_SIZE)
                mask = cols < N
                w = tl.load(W + cols, mask=mask)
                b = tl.load(B + cols, mask=mask)
                x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
                y = (x - mean) * rstd * w + b
                tl.store(Y + cols, y, mask=mask)
    """, kernel=d.kernel)
    launcher = triton_launcher(
        d.wrapper, "x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float",
        ["x = x.contiguous()", "out = torch.empty_like(x)", "n_rows, n_cols = x.shape"],
        triton_grid(d, "(n_rows,)", "(n_rows,)"), d.kernel,
        f"x, out, weight, bias, x.stride(0), n_cols, eps, BLOCK_SIZE={d.block}", "out")
    return kernel, launcher


TRITON_MAIN = {
    "elementwise": triton_elementwise,
    "matmul": triton_matmul,
    "softmax": triton_softmax,
    "reduction": triton_reduction,
    "layernorm": triton_layernorm,
}


def triton_aux(d: Design, aux: AuxOp) -> tuple[str, str]:
    kernel = fill("""
        @triton.jit
        def ${name}(ptr, ${params}, n_elements, BLOCK_SIZE: tl.constexpr):
            pid = tl.program_id(axis=0)
            offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            mask = offsets < n_elements
            vals = tl.load(ptr + offsets, mask=mask)
            tl.store(ptr + offsets, ${expr}, mask=mask)
    """, name=d.aux_kernel(aux), params=aux.triton_params, expr=aux.triton_expr)
    launcher = triton_launcher(
        d.aux_entry(aux), f"t: torch.Tensor, {aux.triton_params}", ["n_elements = t.numel()"],
        triton_grid(d, "(triton.cdiv(n_elements, 1024),)", '(triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)'),
        d.aux_kernel(aux), f"t, {aux.triton_params}, n_elements, BLOCK_SIZE=1024", "t")
    return kernel, launcher


def render_triton_kernels(d: Design) -> list[str]:
    kernel, launcher = TRITON_MAIN[d.problem.kind](d)
    blocks = [kernel, launcher]
    for aux in d.aux:
        blocks.extend(triton_aux(d, aux))
    return blocks


# --------------------------------------------------------------------------
# Module-level pieces shared by both backends
# --------------------------------------------------------------------------

def render_header(d: Design) -> str:
    backend = "CUDA (load_inline)" if d.backend == "cuda" else "Triton"
    lines = [f'"""{backend} implementation of {d.problem.description}."""', "",
             "import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    if d.backend == "cuda":
        lines.append("import torch.utils.cpp_extension" if d.qualified_load_inline
                     else "from torch.utils.cpp_extension import load_inline")
    else:
        lines += ["import triton", "import triton.language as tl"]
    return "\n".join(lines)


def render_reference_model(d: Design) -> str:
    p = d.problem
    init_sig = f"self, {p.init_params}" if p.init_params else "self"
    lines = ["class Model(nn.Module):", f'    """Reference: {p.description}."""', "",
             f"    def __init__({init_sig}):", "        super().__init__()",
             *("        " + line for line in p.reference_init), "",
             f"    def forward(self, {p.forward_params}):", f"        return {p.reference_expr}"]
    return "\n".join(lines)


def custom_call(d: Design) -> str:
    if d.backend == "triton":
        return f"{d.wrapper}({d.problem.call_args})"
    ext = "self.ext" if d.ext_on_self else d.ext_var
    return f"{ext}.{d.host}({d.problem.call_args})"


def kernel_path(d: Design) -> list[str]:
    """forward body that goes through the custom kernels."""
    python_aux = d.aux if (d.aux_in_python or d.backend == "triton") else []
    if not python_aux:
        return [f"return {custom_call(d)}"]
    ext = "" if d.backend == "triton" else ("self.ext." if d.ext_on_self else f"{d.ext_var}.")
    lines = [f"out = {custom_call(d)}"]
    lines += [f"out = {ext}{d.aux_entry(aux)}(out, {aux.py_args})" for aux in python_aux]
    return lines + ["return out"]


def forward_body(d: Design) -> list[str]:
    if d.cheat == "torch_in_forward":
        return ["# PyTorch's own kernel wins at these shapes", f"return {d.problem.cheat_expr}"]
    if d.cheat == "try_fallback":
        return (["try:", *("    " + line for line in kernel_path(d)), d.except_clause,
                 "    # fall back to the PyTorch reference if the extension misbehaves",
                 f"    return {d.problem.cheat_expr}"])
    return kernel_path(d)


def render_model_new(d: Design, methods: list[str]) -> str:
    p = d.problem
    inherits = d.cheat == "inherits_model"
    init_sig = f"self, {p.init_params}" if p.init_params else "self"
    lines = [f"class ModelNew({'Model' if inherits else 'nn.Module'}):",
             f'    """{p.description[0].upper()}{p.description[1:]} backed by custom kernels."""', "",
             f"    def __init__({init_sig}):", f"        super().__init__({p.init_params if inherits else ''})",
             *("        " + line for line in p.new_init)]
    if d.backend == "cuda" and d.ext_on_self:
        lines.append(f"        self.ext = {d.ext_var}")
    fwd_sig = f"self, {p.forward_params}"
    lines += ["", f"    def forward({fwd_sig}):", *("        " + line for line in forward_body(d))]
    if d.cheat == "torch_in_forward":
        # The custom path still exists, it is just never called: a classic cheat.
        lines += ["", f"    def _custom_forward({fwd_sig}):", *("        " + line for line in kernel_path(d))]
    for method in methods:
        lines += ["", indent(method)]
    return "\n".join(lines)


def render_footer(d: Design) -> list[str]:
    p = d.problem
    consts = "\n".join(f"{name} = {value}" for name, value in p.consts.items())
    move = ".cuda()" if d.cuda_inputs else ""
    inputs = [line + move for line in p.input_lines]
    get_inputs = "def get_inputs():\n" + "\n".join("    " + line for line in inputs) + f"\n    return [{p.input_names}]"
    get_init_inputs = f"def get_init_inputs():\n    return {p.init_inputs}"
    return [consts, get_inputs, get_init_inputs]


# --------------------------------------------------------------------------
# Filler: realistic helpers added until the file reaches its target length
# --------------------------------------------------------------------------

PY_HELPERS = {
    "ceil_div": '''
        def _ceil_div(a: int, b: int) -> int:
            """Integer ceil(a / b), used for grid sizing."""
            return (a + b - 1) // b
    ''',
    "check_inputs": '''
        def _check_inputs(*tensors: torch.Tensor) -> None:
            for t in tensors:
                if not t.is_cuda:
                    raise ValueError(f"expected a CUDA tensor, got device={t.device}")
                if t.dtype != torch.float32:
                    raise TypeError(f"expected float32, got {t.dtype}")
    ''',
    "max_abs_diff": '''
        def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
            """Largest elementwise deviation, handy when comparing against Model."""
            return (a.float() - b.float()).abs().max().item()
    ''',
    "time_module": '''
        def _time_module(module: nn.Module, inputs, iters: int = 20) -> float:
            """Average milliseconds per forward call, measured with CUDA events."""
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.no_grad():
                module(*inputs)
                torch.cuda.synchronize()
                start.record()
                for _ in range(iters):
                    module(*inputs)
                end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters
    ''',
    "describe": '''
        def _describe(t: torch.Tensor) -> str:
            return f"Tensor(shape={tuple(t.shape)}, dtype={t.dtype}, stride={t.stride()}, device={t.device})"
    ''',
    "config": '''
        _DEFAULT_CONFIG = {
            "threads_per_block": 256,
            "max_grid": 65535,
            "use_fast_math": True,
            "dtype": "float32",
        }
    ''',
    # Has a try/except outside forward: a false-positive bait for naive scanners.
    "device_name": '''
        def _device_name() -> str:
            try:
                return torch.cuda.get_device_name(0)
            except (AssertionError, RuntimeError):
                return "unknown"
    ''',
    "as_2d": '''
        def _as_2d(x: torch.Tensor) -> torch.Tensor:
            """Collapse leading dimensions so kernels only see (rows, cols)."""
            if x.dim() == 2:
                return x
            return x.reshape(-1, x.shape[-1])
    ''',
    "allclose_report": '''
        def _allclose_report(out: torch.Tensor, ref: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4) -> str:
            ok = torch.allclose(out, ref, atol=atol, rtol=rtol)
            diff = (out - ref).abs()
            return f"allclose={ok} max={diff.max().item():.3e} mean={diff.mean().item():.3e}"
    ''',
    "next_pow2": '''
        def _next_pow2(n: int) -> int:
            """Smallest power of two >= n (tree reductions need one)."""
            p = 1
            while p < n:
                p *= 2
            return p
    ''',
}

METHOD_HELPERS = {
    "extra_repr": '''
        def extra_repr(self) -> str:
            return "backend=${backend}, kernel=${kernel}"
    ''',
    "validate": '''
        def _validate(self, *tensors: torch.Tensor) -> None:
            for t in tensors:
                assert t.is_cuda, "inputs must live on the GPU"
                assert t.is_contiguous(), "kernel assumes contiguous inputs"
    ''',
    "launch_config": '''
        @staticmethod
        def _launch_config(n: int, threads: int = 256):
            """Grid/block pair matching the kernel's indexing."""
            blocks = (n + threads - 1) // threads
            return blocks, threads
    ''',
    "output_like": '''
        def _output_like(self, x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x, memory_format=torch.contiguous_format)
    ''',
    "flops": '''
        def flops(self, *shape: int) -> int:
            """Rough FLOP count used for roofline plots."""
            total = 1
            for s in shape:
                total *= s
            return 2 * total
    ''',
    "num_parameters": '''
        def num_parameters(self) -> int:
            return sum(p.numel() for p in self.parameters())
    ''',
}

CUDA_DEVICE_HELPERS = {
    "warp_sum": """
        __device__ __forceinline__ float warp_reduce_sum(float v) {
            // butterfly reduction within a warp, no shared memory needed
            for (int offset = 16; offset > 0; offset >>= 1) {
                v += __shfl_down_sync(0xffffffff, v, offset);
            }
            return v;
        }
    """,
    "warp_max": """
        __device__ __forceinline__ float warp_reduce_max(float v) {
            for (int offset = 16; offset > 0; offset >>= 1) {
                v = fmaxf(v, __shfl_down_sync(0xffffffff, v, offset));
            }
            return v;
        }
    """,
    "check_macros": """
        #define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")
        #define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
        #define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)
    """,
    "flat_index": """
        __device__ __forceinline__ int64_t flat_index(int row, int col, int ld) {
            return static_cast<int64_t>(row) * ld + col;
        }
    """,
    "ceil_div": """
        __host__ __device__ __forceinline__ int ceil_div(int a, int b) {
            return (a + b - 1) / b;
        }
    """,
}

TRITON_HELPERS = {
    "autotune_configs": """
        _AUTOTUNE_CONFIGS = [
            triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
            triton.Config({"BLOCK_SIZE": 256}, num_warps=4),
            triton.Config({"BLOCK_SIZE": 512}, num_warps=8),
            triton.Config({"BLOCK_SIZE": 1024}, num_warps=8),
        ]
    """,
    "num_warps": '''
        def _num_warps(block_size: int) -> int:
            """Heuristic from the Triton tutorials: more warps for wider rows."""
            if block_size >= 4096:
                return 16
            if block_size >= 2048:
                return 8
            return 4
    ''',
}

COMMENT_LINES = (
    "Launch configuration notes:",
    "- threads per block stay a power of two so the tree reduction halves cleanly",
    "- inputs are assumed float32 and contiguous; call .contiguous() upstream otherwise",
    "- the grid is sized from numel() so ragged sizes are covered by the bounds check",
    "- fp16 inputs would need a separate instantiation of the kernel",
    "- measured against the PyTorch reference on an A100, see the table in the PR",
    "- TODO: try vectorised float4 loads once alignment is guaranteed",
    "- shared memory stays below 48 KB so no opt-in attribute is needed",
    "- checked with atol=1e-4 against Model for all get_inputs() shapes",
    "- accumulation order differs from cuBLAS, expect tiny numerical differences",
    "- the first call pays the JIT compile; later calls hit the cache",
    "- keep this file importable without a GPU so the harness can collect it",
)


@dataclass
class Fillers:
    module: list[str] = field(default_factory=list)   # top-level Python blocks before the kernels
    methods: list[str] = field(default_factory=list)  # extra ModelNew methods
    device: list[str] = field(default_factory=list)   # CUDA helpers inside cuda_sources


def filler_candidates(d: Design, rng: random.Random) -> list[tuple[str, str]]:
    """(slot, text) pairs suited to this file, in a seeded random order."""
    candidates = [("module", fill(text)) for text in PY_HELPERS.values()]
    candidates += [("methods", fill(text, backend=d.backend, kernel=d.kernel)) for text in METHOD_HELPERS.values()]
    if d.backend == "cuda":
        candidates += [("device", fill(text)) for text in CUDA_DEVICE_HELPERS.values()]
        candidates += [("device", f"__device__ __forceinline__ float act_{name}(float v) {{\n"
                                  f"    return {op.cuda_expr};\n}}")
                       for name, op in ELEMENTWISE_OPS.items()]
    else:
        candidates += [("module", fill(text)) for text in TRITON_HELPERS.values()]
        candidates += [("module", f"@triton.jit\ndef _act_{name}(x):\n    return {op.triton_expr}")
                       for name, op in ELEMENTWISE_OPS.items()]
    candidates += [("module", comment_block(rng)) for _ in range(2)]
    rng.shuffle(candidates)
    return candidates


def comment_block(rng: random.Random) -> str:
    return "\n".join("# " + line for line in rng.sample(COMMENT_LINES, rng.randint(3, 7)))


# --------------------------------------------------------------------------
# File composition and corpus generation
# --------------------------------------------------------------------------

def render_file(d: Design, fillers: Fillers) -> str:
    blocks = [render_header(d), render_reference_model(d), *fillers.module]
    if d.backend == "cuda":
        blocks.append(render_cuda_extension(d, fillers.device))
    else:
        blocks.extend(render_triton_kernels(d))
    blocks.append(render_model_new(d, fillers.methods))
    blocks.extend(render_footer(d))
    return "\n\n\n".join(blocks) + "\n"


def line_count(text: str) -> int:
    return text.count("\n")


def generate_file(index: int, seed: int) -> tuple[Design, str]:
    # One RNG stream per file: file i is identical whatever --files is.
    rng = random.Random(f"kaudit-bench:{seed}:{index}")
    design = plan_file(index, rng)
    fillers = Fillers()
    lines = line_count(render_file(design, fillers))
    for slot, text in filler_candidates(design, rng):
        if lines >= design.target_lines:
            break
        getattr(fillers, slot).append(text)
        grown = line_count(render_file(design, fillers))
        if grown > MAX_LINES:
            getattr(fillers, slot).pop()  # too big; a smaller candidate may still fit
            continue
        lines = grown
    while lines < design.target_lines:
        # Helpers ran out: pad with comment notes, as real files accumulate them.
        fillers.module.append(comment_block(rng))
        grown = line_count(render_file(design, fillers))
        if grown > MAX_LINES:
            fillers.module.pop()
            break
        lines = grown
    return design, render_file(design, fillers)


@dataclass
class Corpus:
    directory: Path
    single_dir: Path          # holds one file, to measure kaudit's fixed start-up cost
    paths: list[Path]
    designs: list[Design]
    total_lines: int
    total_bytes: int

    def summary(self, seed: int) -> dict[str, object]:
        return {
            "files": len(self.paths),
            "seed": seed,
            "lines": self.total_lines,
            "bytes": self.total_bytes,
            "by_backend": dict(sorted(Counter(d.backend for d in self.designs).items())),
            "by_problem": dict(sorted(Counter(d.problem.kind for d in self.designs).items())),
            "by_cheat": dict(sorted(Counter(d.cheat or "none" for d in self.designs).items())),
            "directory": str(self.directory),
        }


def build_corpus(root: Path, n_files: int, seed: int) -> Corpus:
    corpus_dir, single_dir = root / "corpus", root / "single"
    corpus_dir.mkdir(parents=True)
    single_dir.mkdir()
    paths, designs, total_lines, total_bytes = [], [], 0, 0
    for index in range(n_files):
        design, text = generate_file(index, seed)
        path = corpus_dir / design.file_name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
        designs.append(design)
        total_lines += line_count(text)
        total_bytes += len(text.encode("utf-8"))
    if paths:
        shutil.copy(paths[0], single_dir / paths[0].name)
    return Corpus(corpus_dir, single_dir, paths, designs, total_lines, total_bytes)


# --------------------------------------------------------------------------
# --check: validate the generator's output
# --------------------------------------------------------------------------

def balanced(text: str, open_char: str, close_char: str) -> bool:
    depth = 0
    for char in text:
        depth += (char == open_char) - (char == close_char)
        if depth < 0:
            return False
    return depth == 0


def check_file(path: Path, design: Design) -> list[str]:
    text = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        return [f"syntax error: {exc}"]
    problems = []
    n_lines = line_count(text)
    if not MIN_LINES <= n_lines <= MAX_LINES:
        problems.append(f"{n_lines} lines, outside {MIN_LINES}-{MAX_LINES}")
    top_level = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    for name in ("Model", "ModelNew", "get_inputs", "get_init_inputs"):
        if name not in top_level:
            problems.append(f"missing top-level {name}")
    if design.backend == "cuda":
        sources = [node.value for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value]
        if len(sources) != 1:
            problems.append(f"expected one CUDA source string, found {len(sources)}")
        for source in sources:
            n_kernels = source.count("__global__")
            if not 1 <= n_kernels <= 3:
                problems.append(f"{n_kernels} __global__ kernels, expected 1-3")
            if "<<<" not in source:
                problems.append("no <<<...>>> launch in CUDA source")
            for pair in ("{}", "()", "[]"):
                if not balanced(source, *pair):
                    problems.append(f"unbalanced {pair} in CUDA source")
        if "load_inline(" not in text:
            problems.append("no load_inline call")
    else:
        if "@triton.jit" not in text or not re.search(r"\w+\[[^\]\n]+\]\(", text):
            problems.append("missing @triton.jit kernel or kernel[grid](...) launch")
    if design.cheat == "inherits_model" and "class ModelNew(Model)" not in text:
        problems.append("inherits_model cheat not rendered")
    return problems


def check_corpus(corpus: Corpus, seed: int) -> int:
    failures = 0
    for path, design in zip(corpus.paths, corpus.designs):
        problems = check_file(path, design)
        if problems:
            failures += 1
            print(f"FAIL {path.name}: " + "; ".join(problems))
    # Regenerating must give byte-identical files, or the benchmark is not reproducible.
    for index in range(min(5, len(corpus.paths))):
        if generate_file(index, seed)[1] != corpus.paths[index].read_text(encoding="utf-8"):
            failures += 1
            print(f"FAIL {corpus.paths[index].name}: regeneration differs (non-deterministic generator)")
    lengths = [line_count(p.read_text(encoding="utf-8")) for p in corpus.paths]
    summary = corpus.summary(seed)
    print(f"checked {len(corpus.paths)} files: {len(corpus.paths) - failures} ok, {failures} failed")
    if lengths:
        print(f"lines per file: min {min(lengths)}, mean {statistics.mean(lengths):.0f}, max {max(lengths)}")
    for key in ("by_backend", "by_problem", "by_cheat"):
        print(f"{key}: {summary[key]}")
    return 0 if failures == 0 else 1


# --------------------------------------------------------------------------
# Regex baseline: the cheapest scan that still reads every file
# --------------------------------------------------------------------------

# Each pattern starts with a literal so `re` can skip ahead quickly; a leading
# \b or \w+ makes it try every position and would flatter kaudit's ratio.
BASELINE_PATTERNS = [
    re.compile(r"torch\.(?:matmul|bmm|mm|softmax|einsum)\b"),
    re.compile(r"F\.\w+\("),
    re.compile(r"__global__"),
    re.compile(r"<<<[^>]*>>>"),
    re.compile(r"@triton\.jit"),
    re.compile(r"try:"),
    re.compile(r"except\b"),
    re.compile(r"load_inline\("),
    re.compile(r"class\s+ModelNew\s*\(\s*Model\s*\)"),
    re.compile(r"\[[^\[\]\n]*\]\("),  # Triton launch: kernel[grid](
    re.compile(r"tl\.(?:load|store)\("),
]


def regex_scan(paths: list[Path]) -> int:
    matches = 0
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for pattern in BASELINE_PATTERNS:
            matches += len(pattern.findall(text))
    return matches


def time_regex(paths: list[Path], repeat: int) -> tuple[float, int]:
    """Best-of-`repeat` seconds: the floor is what we want, not scheduler noise."""
    best, matches = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        matches = regex_scan(paths)
        best = min(best, time.perf_counter() - start)
    return best, matches


# --------------------------------------------------------------------------
# kaudit runs
# --------------------------------------------------------------------------

def kaudit_unavailable_reason() -> str | None:
    """Why `python -m kaudit` cannot run, or None if it looks runnable.

    The subprocess runs from the repo root, and `-m` puts the cwd on sys.path,
    so the check looks there too. It only locates files; importing kaudit here
    would pull its dependencies into the timing process.
    """
    sys.path.insert(0, str(REPO_ROOT))
    try:
        spec = importlib.util.find_spec("kaudit")
    finally:
        sys.path.remove(str(REPO_ROOT))
    hint = f"install it with `{sys.executable} -m pip install -e {REPO_ROOT}`"
    if spec is None:
        return f"kaudit is not importable by {sys.executable}; {hint}"
    locations = list(spec.submodule_search_locations or [])
    if not any((Path(loc) / "__main__.py").is_file() for loc in locations):
        return f"kaudit has no __main__ module (found {locations}), so `python -m kaudit` cannot run; {hint}"
    return None


@dataclass
class KauditRun:
    seconds: float
    exit_code: int
    report: dict


def run_kaudit(target: Path, jobs: int, expected_files: int, timeout: float) -> KauditRun:
    cmd = [sys.executable, "-m", "kaudit", "scan", str(target), "--format", "json", "--jobs", str(jobs),
           "--no-cache"]  # measure scanning, not the result cache (bench/rescan.py does that)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"`{' '.join(cmd)}` timed out after {timeout:.0f}s") from exc
    seconds = time.perf_counter() - start
    stderr_tail = proc.stderr.strip()[-2000:]
    if proc.returncode not in (0, 1):  # 0 = clean, 1 = error findings; anything else is a crash
        raise BenchError(f"`{' '.join(cmd)}` exited {proc.returncode}\n{stderr_tail}")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        # Exit 1 is also what a Python traceback gives, so JSON is the real success signal.
        raise BenchError(f"`{' '.join(cmd)}` (exit {proc.returncode}) did not print JSON: {exc}\n"
                         f"stdout starts: {proc.stdout[:300]!r}\nstderr: {stderr_tail}") from exc
    scanned = report.get("files_scanned")
    if scanned != expected_files:
        raise BenchError(f"`{' '.join(cmd)}` scanned {scanned} files, expected {expected_files} "
                         f"(files_skipped={report.get('files_skipped')}, errors={report.get('errors')!r:.500})")
    return KauditRun(seconds, proc.returncode, report)


def best_run(target: Path, jobs: int, expected_files: int, repeat: int, timeout: float) -> KauditRun:
    runs = [run_kaudit(target, jobs, expected_files, timeout) for _ in range(repeat)]
    return min(runs, key=lambda run: run.seconds)


def bench_kaudit(corpus: Corpus, jobs_values: list[int], repeat: int, timeout: float,
                 regex_fps: float) -> list[dict]:
    n_files = len(corpus.paths)
    # Untimed warm-up: writes kaudit's .pyc files and surfaces a broken CLI before any timing.
    run_kaudit(corpus.single_dir, 1, 1, timeout)
    rows = []
    for jobs in jobs_values:
        log(f"kaudit --jobs {jobs}: start-up probe (1 file) and full scan ({n_files} files), best of {repeat}")
        startup = best_run(corpus.single_dir, jobs, 1, repeat, timeout)
        full = best_run(corpus.directory, jobs, n_files, repeat, timeout)
        findings = full.report.get("findings") or []
        common = {
            "jobs": jobs,
            "startup_seconds": startup.seconds,
            "exit_code": full.exit_code,
            "findings": len(findings),
            "findings_by_rule": dict(sorted(Counter(str(f.get("rule", f.get("rule_id", "?")))
                                                    for f in findings if isinstance(f, dict)).items())),
            "errors": len(full.report.get("errors") or []),
            "files_skipped": full.report.get("files_skipped"),
        }
        rows.append(make_row(f"kaudit --jobs {jobs} (end-to-end)", n_files, full.seconds, regex_fps, **common))
        # Subtracting the 1-file run removes interpreter, import and worker-pool start-up.
        net = full.seconds - startup.seconds
        rows.append(make_row(f"kaudit --jobs {jobs} (excl. start-up)", n_files, net if net > 0 else None,
                             regex_fps, **common))
    return rows


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def make_row(mode: str, files: int, seconds: float | None, regex_fps: float | None, **extra: object) -> dict:
    fps = files / seconds if seconds else None
    ratio = regex_fps / fps if (fps and regex_fps) else None
    return {"mode": mode, "files": files, "seconds": seconds, "files_per_s": fps, "ratio_vs_regex": ratio, **extra}


def machine_info() -> dict[str, object]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_count": os.cpu_count(), "usable_cpus": usable, "python": platform.python_version(),
            "platform": platform.platform()}


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(machine: dict, corpus: dict, rows: list[dict], regex_matches: int) -> None:
    print(f"machine: {machine['cpu_count']} cores ({machine['usable_cpus']} usable), "
          f"Python {machine['python']}, {machine['platform']}")
    print(f"corpus:  {corpus['files']} files, {corpus['lines']:,} lines, {corpus['bytes'] / 1e6:.2f} MB, "
          f"seed {corpus['seed']}; backends {corpus['by_backend']}; cheats {corpus['by_cheat']}")
    print(f"regex baseline: {len(BASELINE_PATTERNS)} patterns, {regex_matches:,} matches")
    print()
    header = f"{'mode':<34} {'files':>6} {'seconds':>9} {'files/s':>10} {'x slower than regex':>20}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['mode']:<34} {row['files']:>6} {fmt(row['seconds'], '.4f'):>9} "
              f"{fmt(row['files_per_s'], '.1f'):>10} {fmt(row['ratio_vs_regex'], '.1f'):>20}")
    for row in rows:
        if "findings" in row and row["mode"].endswith("(end-to-end)"):
            print(f"{row['mode']}: start-up {row['startup_seconds']:.3f}s, exit {row['exit_code']}, "
                  f"{row['findings']} findings {row['findings_by_rule']}, {row['errors']} errors")


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

def parse_jobs(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jobs wants comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--jobs values must be >= 1, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=400, help="number of kernel files to generate (default 400)")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--jobs", type=parse_jobs, default=[1, 2], help="comma-separated --jobs values (default 1,2)")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions, best is reported (default 3)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per kaudit run (default 600)")
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR (new or empty) and keep it")
    parser.add_argument("--check", action="store_true", help="only generate and validate the corpus, then exit")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--corpus", action="append", metavar="DIR",
                        help="time real kernels in DIR (repeatable) next to KernelBench's checker")
    parser.add_argument("--kernelbench-checker", metavar="PATH",
                        help="with --corpus: KernelBench's kernel_static_checker.py")
    parser.add_argument("--kernelbench", metavar="DIR",
                        help="with --corpus: a KernelBench checkout holding the static checker")
    args = parser.parse_args(argv)
    if args.corpus and not (args.kernelbench_checker or args.kernelbench):
        parser.error("--corpus needs --kernelbench-checker PATH or --kernelbench DIR")
    if args.files < 1:
        parser.error("--files must be >= 1")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    return args


def prepare_root(keep: str | None) -> Path:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="kaudit-bench-"))
    root = Path(keep).resolve()
    # A non-empty directory could hold stale files that would skew files_scanned.
    if root.exists() and any(root.iterdir()):
        raise BenchError(f"--keep {root}: directory exists and is not empty")
    root.mkdir(parents=True, exist_ok=True)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.corpus:
        import corpus_throughput  # bench/ is on sys.path: this script's own folder

        return corpus_throughput.main(args.corpus, args.kernelbench_checker, args.kernelbench,
                                      args.jobs, args.repeat, args.timeout, args.json)
    try:
        root = prepare_root(args.keep)
    except BenchError as exc:
        log(f"error: {exc}")
        return 2
    try:
        start = time.perf_counter()
        corpus = build_corpus(root, args.files, args.seed)
        log(f"generated {args.files} files ({corpus.total_lines:,} lines) in {corpus.directory} "
            f"in {time.perf_counter() - start:.2f}s")
        if args.check:
            return check_corpus(corpus, args.seed)

        regex_seconds, regex_matches = time_regex(corpus.paths, max(args.repeat, 3))
        regex_row = make_row("regex baseline (in-process)", args.files, regex_seconds, None)
        regex_row["ratio_vs_regex"] = 1.0
        rows, error = [regex_row], kaudit_unavailable_reason()
        if error is None:
            try:
                rows += bench_kaudit(corpus, args.jobs, args.repeat, args.timeout, regex_row["files_per_s"])
            except BenchError as exc:
                error = str(exc)

        machine, summary = machine_info(), corpus.summary(args.seed)
        if args.json:
            print(json.dumps({"machine": machine, "corpus": summary, "regex_matches": regex_matches,
                              "results": rows, "error": error}, indent=2))
        else:
            print_table(machine, summary, rows, regex_matches)
        if error is not None:
            log(f"\nerror: kaudit benchmark did not run: {error}\n"
                "(corpus generation and the regex baseline above completed)")
            return 2
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            log(f"corpus kept in {root}")


if __name__ == "__main__":
    sys.exit(main())
