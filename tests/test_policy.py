"""The policy (`--policy kernelbench|strict`, config `policy`) and the judgement it rests on:
which custom kernels do real work and which only copy, view or fill."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from kaudit import Config, scan_source
from kaudit.config import ConfigError, load_config
from kaudit.custom_work import CustomWork
from kaudit.source import SourceModel
from tests.conftest import ROOT, RULE_FIXTURES

PARTIAL = RULE_FIXTURES / "KA108" / "bad_gemm_kept_fused_epilogue.py"


def codes(path, policy: str) -> set[str]:
    return {f.rule for f in scan_source(path.read_text(), str(path), Config(policy=policy))
            if f.level.value != "note"}


def test_partial_replacement_is_a_warning_by_default_and_an_error_when_strict():
    assert codes(PARTIAL, "kernelbench") == {"KA108"}
    assert codes(PARTIAL, "strict") == {"KA101"}


def test_copy_only_kernel_is_no_excuse_under_either_policy():
    decoy = RULE_FIXTURES / "KA101" / "bad_copy_kernel_after_pytorch.py"
    assert "KA101" in codes(decoy, "kernelbench") and "KA101" in codes(decoy, "strict")
    assert "KA108" not in codes(decoy, "kernelbench")


def test_policy_from_the_command_line_and_from_pyproject(in_tmp):
    kernel = in_tmp / "kernel.py"
    kernel.write_text(PARTIAL.read_text())

    def rules(*args: str) -> set[str]:
        proc = subprocess.run([sys.executable, "-m", "kaudit", "scan", "kernel.py", "-f", "json",
                               "--no-cache", *args], capture_output=True, text=True, cwd=in_tmp)
        return {f["rule"] for f in json.loads(proc.stdout)["findings"]}

    assert "KA108" in rules() and "KA101" not in rules()
    assert "KA101" in rules("--policy", "strict")
    (in_tmp / "pyproject.toml").write_text('[tool.kaudit]\npolicy = "strict"\n')
    assert load_config(in_tmp).policy == "strict"
    assert "KA101" in rules()
    assert "KA108" in rules("--policy", "kernelbench")


def test_unknown_policy_is_a_usage_error(in_tmp):
    (in_tmp / "kernel.py").write_text(PARTIAL.read_text())
    proc = subprocess.run([sys.executable, "-m", "kaudit", "scan", "kernel.py", "--policy", "lax"],
                          capture_output=True, text=True, cwd=in_tmp)
    assert proc.returncode == 2 and "policy" in proc.stderr
    with pytest.raises(ConfigError):
        Config(policy="lax")


def test_policy_is_part_of_the_cache_key():
    assert Config(policy="strict").cache_key() != Config().cache_key()


def work(kernel_body: str) -> bool:
    """Whether a one-kernel CUDA extension called from forward does real work."""
    code = textwrap.dedent('''
        import torch
        from torch.utils.cpp_extension import load_inline
        src = """
        __global__ void k(const float* a, const float* b, float* out, const int* idx, float s, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i >= n) return;
            BODY
        }
        torch::Tensor run(torch::Tensor a) {
            k<<<1, 1>>>(nullptr, nullptr, nullptr, nullptr, 1.0f, 0);
            return a;
        }
        """
        ext = load_inline(name="w", cpp_sources="torch::Tensor run(torch::Tensor a);",
                          cuda_sources=src, functions=["run"])

        class ModelNew(torch.nn.Module):
            def forward(self, a):
                return ext.run(a)
        ''').replace("BODY", kernel_body)
    return CustomWork(SourceModel("k.py", code)).real_work


@pytest.mark.parametrize(("body", "computes"), [
    ("out[i] = a[i];", False),
    ("out[i] = 0.0f;", False),
    ("out[i] = s;", False),
    ("out[i] = a[idx[i] + 1];", False),  # a gather: the arithmetic is in the index
    ("float v = a[i]; out[i] = v;", False),
    ("out[i] = i < n / 2 ? a[i] : b[i - n / 2];", False),  # choosing a source is a copy
    ("float4 v = reinterpret_cast<const float4*>(a)[i]; reinterpret_cast<float4*>(out)[i] = v;",
     False),
    ("out[i] = a[i] * s;", True),
    ("out[i] = a[i] + b[i];", True),
    ("out[i] = a[i] > 0.0f ? a[i] : 0.0f;", True),
    ("out[i] = fmaxf(a[i], 0.0f);", True),
    ("float acc = 0.0f; for (int j = 0; j < n; ++j) acc += a[j]; out[i] = acc;", True),
    ("atomicAdd(&out[0], a[i]);", True),
    ("float v = a[i]; out[i] = -v;", True),
])
def test_cuda_kernels_that_compute(body, computes):
    assert work(body) is computes


def triton_work(body: str) -> bool:
    code = textwrap.dedent('''
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            BODY

        class ModelNew(torch.nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                k[(1,)](x, y, x.numel(), BLOCK=1024)
                return y
        ''').replace("BODY", body)
    return CustomWork(SourceModel("t.py", code)).real_work


@pytest.mark.parametrize(("body", "computes"), [
    ("tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)", False),
    ("x = tl.load(x_ptr + offs * 2 + 1, mask=mask)\n    tl.store(y_ptr + offs, x.to(tl.float32), mask=mask)",
     False),
    ("tl.store(y_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=mask)", False),
    ("x = tl.load(x_ptr + offs, mask=mask)\n    tl.store(y_ptr + offs, x * 2.0, mask=mask)", True),
    ("x = tl.load(x_ptr + offs, mask=mask)\n    tl.store(y_ptr + offs, tl.exp(x), mask=mask)", True),
    ("x = tl.load(x_ptr + offs, mask=mask)\n    tl.store(y_ptr, tl.sum(x, axis=0))", True),
])
def test_triton_kernels_that_compute(body, computes):
    assert triton_work(body) is computes


def test_unseen_kernels_count_as_real_work():
    code = textwrap.dedent('''
        import torch
        from torch.utils.cpp_extension import load_inline
        ext = load_inline(name="e", cpp_sources=SOURCES, functions=["run"])

        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return torch.relu(ext.run(x))
        ''')
    assert CustomWork(SourceModel("k.py", code)).real_work
    assert {f.rule for f in scan_source(code)} & {"KA101", "KA108"} == {"KA108"}


def test_partial_replacement_lists_the_remaining_ops_in_source_order():
    """Ops are found by walking from forward (a helper's after forward's own); the message lists
    them by line, so identical files get identical messages."""
    source = PARTIAL.read_text().replace(
        "class ModelNew(nn.Module):",
        "def _normalise(y):\n    return torch.nn.functional.layer_norm(y, y.shape[-1:])\n\n\n"
        "class ModelNew(nn.Module):").replace(
        "        return out\n", "        return _normalise(out)\n")
    found = [f for f in scan_source(source, "kernel.py", Config(policy="kernelbench"))
             if f.rule == "KA108"]
    assert len(found) == 1
    ops = found[0].metrics["ops"]
    assert len(ops) == 2 and "layer_norm" in ops[0] and "Linear" in ops[1], ops
    assert found[0].message.index("layer_norm") < found[0].message.index("Linear")
