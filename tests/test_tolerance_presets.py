"""The benchmarks' own correctness checks (`kaudit.dynamic.tolerance` presets), on CPU tensors:
what each accepts and rejects, including what their slack lets through."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from kaudit.dynamic.tolerance import PRESETS, resolve  # noqa: E402


def _reference(n: int = 1000, dtype=torch.float32):
    return torch.linspace(1.0, 2.0, n, dtype=torch.float64).to(dtype)


def test_fastkernels_accepts_one_percent_garbage():
    check = PRESETS["fastkernels"]
    reference = _reference()
    garbage = reference.clone()
    garbage[:10] = 12345.0  # 1 % of the output is anything at all
    assert check.matched(reference, garbage) == pytest.approx(0.99)
    assert check.accepts(reference, garbage)
    assert not PRESETS["kernelbench"].accepts(reference, garbage)  # allclose: every element
    garbage[:11] = 12345.0  # 1.1 %: over the slack
    assert not check.accepts(reference, garbage)


def test_fastkernels_rejects_nan_inf_and_zeros_whatever_the_share():
    check = PRESETS["fastkernels"]
    reference = _reference()
    for bad in (float("nan"), float("inf")):
        out = reference.clone()
        out[0] = bad  # one element in a thousand, inside the 1 % slack
        assert not check.accepts(reference, out)
    assert not check.accepts(reference, torch.zeros_like(reference))
    assert check.accepts(torch.zeros(8), torch.zeros(8))


def test_fastkernels_bounds_per_dtype_relative_to_the_reference():
    check = PRESETS["fastkernels"]
    reference = torch.full((100,), 1000.0)
    assert check.accepts(reference, reference + 0.9)  # 1e-5 + 1e-3 * 1000 = 1.00001
    assert not check.accepts(reference, reference + 1.1)
    half = reference.half()
    assert check.accepts(half, half + 8)  # 1e-2 + 1e-2 * 1000 = 10.01 in half precision
    assert not check.accepts(half, half + 16)


def test_kernelbenchx_assert_close_semantics():
    check = PRESETS["kernelbenchx"]
    reference = _reference()
    assert check.accepts(reference, reference * (1 + 5e-6))
    assert not check.accepts(reference, reference * (1 + 5e-5))  # fp32: rtol 1e-5
    half = reference.bfloat16()
    assert check.accepts(half, half)
    nan = torch.tensor([float("nan"), 1.0])
    assert check.accepts(nan, nan.clone())  # equal_nan=True: NaN where the reference has NaN
    assert not PRESETS["kernelbench"].accepts(nan, nan.clone())
    assert not check.accepts(torch.tensor([3, 4]), torch.tensor([3, 5]))  # integers exact


def test_kernelbenchx_rtol_scales_the_reference_not_the_candidate():
    check = PRESETS["kernelbenchx"]
    # a zero reference leaves only atol, however large the candidate (allclose would scale
    # rtol by the candidate's magnitude: 1e-5 + 1e-5 * 1e6 = 10 would let 9 through)
    assert not check.accepts(torch.tensor([0.0]), torch.tensor([9.0e6 * 1e-6]))
    assert PRESETS["kernelbench-v0"].accepts(torch.tensor([0.0]), torch.tensor([0.009]))
    assert not check.accepts(torch.tensor([0.0]), torch.tensor([2e-5]))


def test_atrex_float64_allclose():
    check = PRESETS["atrex"]
    reference = _reference(100, torch.bfloat16)
    assert check.accepts(reference, reference * 1.04)  # rtol 0.05
    assert not check.accepts(reference, reference * 1.2)
    assert not check.accepts(torch.tensor([1, 2]), torch.tensor([1, 3]))  # integers exact


def test_every_preset_rejects_a_shape_mismatch_and_accepts_equality():
    for preset in PRESETS.values():
        reference = _reference(64)
        assert preset.accepts(reference, reference.clone()), preset.name
        assert not preset.accepts(reference, reference[:32]), preset.name


def test_new_presets_resolve_by_name():
    for name in ("kernelbenchx", "fastkernels", "atrex"):
        assert resolve(name, None, None).name == name
    assert resolve("fastkernels", None, None).to_dict()["min_matched"] == 0.99
    assert "min_matched" not in resolve("kernelbench", None, None).to_dict()


def test_kernelbenchx_thresholds_follow_the_output_dtype():
    """EVAL/1_exe_acc.py: rtol = atol = 5e-3 for float16/bfloat16, 1e-5 for float32/float64."""
    check = PRESETS["kernelbenchx"]
    reference = torch.full((64,), 2.0)
    off = reference * (1 + 2e-3)  # 4e-3 away: inside 5e-3 + 5e-3 * 2, far outside 1e-5 * 3
    assert not check.accepts(reference, off)
    assert not check.accepts(reference.double(), off.double())
    for half in (torch.float16, torch.bfloat16):
        assert check.accepts(reference.to(half), off.to(half)), half
        assert not check.accepts(reference.to(half), (reference * 1.05).to(half)), half
    assert "atol 0.005, rtol 0.005" in check.check_text("bfloat16")
    assert "atol 1e-05, rtol 1e-05" in check.check_text("float32")


def test_kernelbenchx_precision_thresholds_replace_the_tolerance():
    """A quantized task's `precision_thresholds`: cosine, relative L1 and RMSE instead of
    assert_close; keys it leaves out take the benchmark's defaults; the dtype must still match."""
    check = PRESETS["kernelbenchx"].with_precision_thresholds(
        {"cosine_sim": 0.95, "l1_relative": 0.05})
    assert check.precision_thresholds == {"cosine_sim": 0.95, "l1_relative": 0.05, "rmse": 0.01}
    assert PRESETS["kernelbenchx"].with_precision_thresholds({}) is PRESETS["kernelbenchx"]
    reference = torch.linspace(-1, 1, 1000)
    quantized = reference * 1.005  # 0.5 % off: assert_close rejects it, the metrics pass it
    assert not PRESETS["kernelbenchx"].accepts(reference, quantized)
    assert check.accepts(reference, quantized)
    assert not check.accepts(reference, reference * 1.1)  # relative L1 0.1 > 0.05
    assert not check.accepts(reference, torch.zeros_like(reference))  # cosine 0
    assert check.accepts(torch.zeros(8), torch.zeros(8))  # both all-zero: cosine 1
    assert not check.accepts(reference, quantized.double())  # the dtypes must match
    assert "relative L1 <= 0.05" in check.check_text("float32")
    assert check.to_dict()["precision_thresholds"]["cosine_sim"] == 0.95
    assert check.summary("bfloat16") == {"preset": "kernelbenchx", "atol": 5e-3, "rtol": 5e-3,
                                         "precision_thresholds": check.precision_thresholds}
    assert PRESETS["kernelbenchx"].summary("float32") == {
        "preset": "kernelbenchx", "atol": 1e-5, "rtol": 1e-5}


def test_a_kernelbenchx_task_is_judged_by_its_precision_thresholds(tmp_path):
    """The checkout's `data/kernelbenchx_v1.json` gives a task its own thresholds; the others
    keep assert_close."""
    from kaudit.adapters import kernelbenchx
    from kaudit.dynamic.adapted import benchmark_check

    data = tmp_path / "data"
    for task in ("Quantization/matmul_w8a8.py", "Math/add.py"):
        (data / "kernelbenchx" / task).parent.mkdir(parents=True, exist_ok=True)
        (data / "kernelbenchx" / task).write_text(
            "def f(x):\n    return x\n" + kernelbenchx.SEPARATOR + "\n", encoding="utf-8")
    (data / "kernelbenchx_v1.json").write_text(json.dumps([
        {"name": "matmul_w8a8", "file": "Quantization/matmul_w8a8.py",
         "precision_thresholds": {"cosine_sim": 0.95, "l1_relative": 0.05, "rmse": 0.1}},
        {"name": "add", "file": "Math/add.py"}]), encoding="utf-8")
    quantized, _ = kernelbenchx.problem_spec(str(data / "kernelbenchx/Quantization/matmul_w8a8.py"))
    check = benchmark_check(quantized)
    assert check.name == "kernelbenchx"
    assert check.precision_thresholds == {"cosine_sim": 0.95, "l1_relative": 0.05, "rmse": 0.1}
    plain, _ = kernelbenchx.problem_spec(str(data / "kernelbenchx/Math/add.py"))
    assert benchmark_check(plain) is PRESETS["kernelbenchx"]
