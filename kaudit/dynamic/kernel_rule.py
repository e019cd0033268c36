"""The base of the KD rules: documented like every rule, reported by `kaudit scan --dynamic` only.

A KD rule keeps the base class's empty `check`, so the static scan never emits it. Its findings come
from `kaudit.dynamic.kernels`, which runs the kernel and its reference problem in child processes.
Its Example is a kernel file; its fixtures are paired problem/kernel folders in `fixtures/dynamic/`
(markers on the `def forward` line of `ModelNew` in `kernel.py`), run by tests/test_dynamic.py.
A KD rule tagged `not-run` says that the kernel was not audited (no CUDA, no reference problem,
the reference failed): the kernel's verdict is then `unverified`, never `trusted`
(`kaudit.verdicts.NOT_AUDITED_TAG`).
"""

from __future__ import annotations

from typing import ClassVar

from kaudit.rule import Rule


class DynamicRule(Rule):
    audit: ClassVar[str] = "dynamic"
