"""Inline suppressions in Python and in embedded CUDA, and the unused-suppression note."""

from __future__ import annotations

from kaudit import Config, scan_source

KERNEL = '''import torch
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="k", cpp_sources="void run();", cuda_sources="""
__global__ void k(float* x) { x[0] = 1; }  // kaudit: ignore[KA101]
""", functions=["run"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        ext.run()
        return torch.relu(x){comment}
'''


def findings(comment: str, config: Config | None = None) -> list[tuple[str, int]]:
    """KA101 and KA004 findings (the kernel's unused stub draws others, not under test here).
    The strict policy makes `torch.relu` an error next to an extension kaudit cannot see."""
    config = config or Config(policy="strict")
    return [(f.rule, f.line) for f in scan_source(KERNEL.replace("{comment}", comment), config=config)
            if f.rule in ("KA004", "KA101")]


def test_unsuppressed():
    assert findings("") == [("KA004", 5), ("KA101", 12)]


def test_code_prefix_and_bare_ignores():
    for comment in ("  # kaudit: ignore[KA101]", "  # kaudit: ignore[KA1xx]",
                    "  # kaudit: ignore[KA1]", "  # kaudit: ignore", "  # kaudit:ignore[KA103, KA101]"):
        assert ("KA101", 12) not in findings(comment), comment


def test_other_codes_do_not_suppress():
    assert ("KA101", 12) in findings("  # kaudit: ignore[KA102]")
    assert ("KA004", 12) in findings("  # kaudit: ignore[KA102]")


def test_cuda_comment_suppression_is_reported_when_unused():
    assert ("KA004", 5) in findings("")


def test_unused_note_only_for_enabled_rules():
    assert ("KA004", 12) not in findings("  # kaudit: ignore[KA102]",
                                         Config(ignore=("KA102",), policy="strict"))


def test_malformed_suppression_is_left_alone():
    assert ("KA101", 12) in findings("  # kaudit: ignore[not a code]")
