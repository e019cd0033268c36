"""Shape sweeps (KD302, `kaudit.dynamic.shapes`): which module-level sizes of a problem are
perturbed. The sweep itself runs on the fixtures (bad_width_constant_triton, good_width_triton)
in tests/test_dynamic.py."""

from __future__ import annotations

from kaudit.dynamic.shapes import perturbed_sizes


def test_module_level_integer_sizes_are_made_one_larger():
    text = ("import torch\n"
            "batch_size = 16\n"
            "dim = 16384\n"
            "kernel_size = 3\n"          # a kernel size, not a tensor size
            "eps = 1e-5\n"
            "use_bias = True\n"
            "a, b = 64, 64\n"
            "shape: int = 32\n"
            "def get_inputs():\n"
            "    width = 128\n"           # not module level
            "    return [torch.randn(batch_size, dim)]\n")
    assert perturbed_sizes(text) == {"batch_size": 17, "dim": 16385}
    assert all(size % 32 for size in perturbed_sizes(text).values())
    assert perturbed_sizes("def broken(:\n") == {}
    assert perturbed_sizes("def get_inputs():\n    return [torch.randn(16, 128)]\n") == {}
