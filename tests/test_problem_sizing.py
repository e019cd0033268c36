"""The sizing job (`harness/problem_sizes.py`): what a problem's forward holds at once on the
meta device, and what the job loads to find it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

def test_live_bytes_follow_storages_not_tensors():
    """A storage lives while any tensor holds it: a 3-D matmul's result (an unsafe view of the
    product) and a detached tensor keep theirs alive after the first tensor is gone."""
    torch = pytest.importorskip("torch", reason="the sizing job needs torch")
    from kaudit.dynamic.harness.problem_sizes import _LiveBytes

    mib = 1 << 20

    def peak(forward, *shapes):
        values = [torch.empty(shape, device="meta") for shape in shapes]
        with torch.no_grad(), _LiveBytes(torch) as live:
            forward(*values)
        return live.peak / mib

    assert peak(lambda a, b: torch.matmul(a, b) * 2, (2, 256, 1024), (1024, 256)) == 1.0
    assert peak(lambda x: (lambda y: y * torch.sigmoid(y))(torch.matmul(x, x.mT)),
                (2, 256, 256)) == 1.5

    def detached(x):
        y = x * 2
        kept = y.detach()
        del y
        return kept + 1

    assert peak(detached, (256, 1024)) == 2.0
    assert peak(lambda x: torch.empty(0, device="meta").resize_(256, 1024) + 0, (1,)) == 2.0


def test_the_sizing_job_sees_the_temporaries_forward_makes(tmp_path):
    """Swish's sigmoid lives beside its product: forward holds twice its output at once."""
    pytest.importorskip("torch", reason="the sizing job needs torch")
    from kaudit.dynamic.problem_sizing import size_problems

    problem = tmp_path / "swish.py"
    problem.write_text("import torch\n\nclass Model(torch.nn.Module):\n"
                       "    def forward(self, x):\n        return x * torch.sigmoid(x)\n\n"
                       "def get_inputs():\n    return [torch.rand(64, 1024)]\n\n"
                       "def get_init_inputs():\n    return []\n")
    size = size_problems([str(problem)], 42)[str(problem)]
    output = 64 * 1024 * 4
    assert (size.outputs, size.forward) == (output, 2 * output)
    assert (size.inputs64, size.forward64) == (2 * output, 4 * output)


def test_the_sizing_counts_what_torchs_own_float64_convolutions_unfold():
    """The float64 runs use torch's own convolutions (cuDNN off), which unfold their input, a
    sample and a group at a time: sized without it, 12 of KernelBench level 1's convolutions ran
    out of memory at their ask on the H200 and ran again (a 3D transposed one three times)."""
    torch = pytest.importorskip("torch", reason="the sizing job needs torch")
    from kaudit.dynamic.harness.problem_sizes import _LiveBytes

    def peak(layer, shape, dtype=torch.float64):
        layer = layer.to(device="meta", dtype=dtype)
        given = torch.empty(shape, device="meta", dtype=dtype)
        with torch.no_grad(), _LiveBytes(torch) as live:
            layer(given)
        return live.peak

    output = 2 * 8 * 34 * 34 * 8  # (2, 8, 34, 34) in float64
    transposed = peak(torch.nn.ConvTranspose2d(4, 8, 3), (2, 4, 32, 32))
    assert transposed == output + 8 * 9 * 32 * 32 * 8, "(C_out x 3 x 3) rows over its input"
    assert peak(torch.nn.ConvTranspose2d(4, 8, 3), (2, 4, 32, 32), torch.float32) == output / 2
    standard = peak(torch.nn.Conv2d(4, 8, 3, groups=2), (2, 4, 34, 34))
    grouped = 2 * 8 * 32 * 32 * 8
    assert standard == grouped + (2 * 9 * 32 * 32 + 2 * 4 * 34 * 34 // 2 + grouped // 8) * 8, \
        "a group's (C_in / 2 x 3 x 3) rows over the output, and each group's input and output"
    assert peak(torch.nn.Conv2d(4, 4, 3, groups=4), (2, 4, 34, 34)) == 2 * 4 * 32 * 32 * 8
    assert peak(torch.nn.Conv2d(4, 8, 1), (2, 4, 32, 32)) == grouped, "1x1: nothing unfolded"
    assert peak(torch.nn.Conv2d(4, 8, 1, dilation=2), (2, 4, 32, 32)) == grouped + 4 * 32 * 32 * 8
    assert peak(torch.nn.Conv3d(4, 8, 1), (2, 4, 8, 8, 8)) == (2 * 8 + 4) * 8 * 8 * 8 * 8, \
        "3D ones unfold even at 1x1x1"


SIZE_IN_A_FRESH_INTERPRETER = """
import json, sys
import torch
from kaudit.dynamic.harness import problem_sizes
if sys.argv[1] == "real":
    import torch._dynamo
found = problem_sizes.size_problems({"paths": json.loads(sys.argv[2]), "init_seed": 42}, sys.argv[3])
print(json.dumps({"compiler": type(sys.modules.get("torch._dynamo")).__name__,
                  "sizes": found["sizes"]}))
"""


def test_the_sizing_job_sizes_without_importing_torchs_compiler(tmp_path):
    """`torch._disable_dynamo` imports torch's compiler at the first call of the meta device's
    Python kernels and of a dispatch mode: 3.5 s of the sizing job's start on the H200's host,
    before the first problem could start. A stub stands in, and the sizes are those the real
    compiler gives; a problem that asks the compiler for more than `disable` gets the real one."""
    pytest.importorskip("torch", reason="the sizing job needs torch")
    conv = tmp_path / "conv.py"
    conv.write_text("import torch\n\nclass Model(torch.nn.Module):\n"
                    "    def __init__(self):\n        super().__init__()\n"
                    "        self.conv = torch.nn.Conv2d(3, 8, 3)\n"
                    "    def forward(self, x):\n        return torch.relu(self.conv(x)).sum(1)\n\n"
                    "def get_inputs():\n    return [torch.rand(2, 3, 16, 16)]\n\n"
                    "def get_init_inputs():\n    return []\n")
    compiles = tmp_path / "compiles.py"
    compiles.write_text(conv.read_text().replace(
        "    def forward(self, x):\n",
        "    def forward(self, x):\n        torch._dynamo.config.suppress_errors\n"))

    def sized(mode: str, *problems) -> dict:
        found = subprocess.run(
            [sys.executable, "-c", SIZE_IN_A_FRESH_INTERPRETER, mode,
             json.dumps([str(problem) for problem in problems]), str(tmp_path)],
            capture_output=True, text=True, timeout=120)
        assert found.returncode == 0, found.stderr[-2000:]
        return json.loads(found.stdout.splitlines()[-1])

    stubbed, real = sized("stub", conv), sized("real", conv)
    assert (stubbed["compiler"], real["compiler"]) == ("_CompilerStub", "module")
    assert stubbed["sizes"] == real["sizes"] and stubbed["sizes"][str(conv)]["flops"] > 0
    asked = sized("stub", conv, compiles)
    assert asked["compiler"] == "module", "asked for its config, the real compiler is loaded"
    assert asked["sizes"][str(compiles)]["error"] is None
    assert asked["sizes"][str(compiles)]["forward"] == real["sizes"][str(conv)]["forward"]


def test_problems_are_sized_by_jobs_side_by_side(tmp_path, monkeypatch):
    """A job sized KernelBench level 1's 100 problems in about 3 s on the H200's host, before
    the first problem could start: each of `jobs` jobs sizes every `jobs`-th problem, and the
    sizes are those one job finds."""
    pytest.importorskip("torch", reason="the sizing job needs torch")
    from kaudit.dynamic import problem_sizing

    paths = []
    for width in (64, 128, 256):
        problem = tmp_path / f"relu_{width}.py"
        problem.write_text("import torch\n\nclass Model(torch.nn.Module):\n"
                           "    def forward(self, x):\n        return torch.relu(x)\n\n"
                           f"def get_inputs():\n    return [torch.rand(8, {width})]\n\n"
                           "def get_init_inputs():\n    return []\n")
        paths.append(str(problem))
    asked, real_run = [], problem_sizing.run_job
    monkeypatch.setattr(problem_sizing, "run_job",
                        lambda job, gate=None: asked.append(job.args["paths"]) or real_run(job, gate))
    together = problem_sizing.size_problems(paths, 42, jobs=2)
    assert sorted(asked, key=len) == [[paths[1]], [paths[0], paths[2]]]
    assert together == problem_sizing.size_problems(paths, 42)
    assert [together[path].inputs for path in paths] == [8 * 64 * 4, 8 * 128 * 4, 8 * 256 * 4]


def test_as_many_sizing_jobs_as_the_problems_and_the_cores_are_worth(monkeypatch):
    from kaudit.dynamic.problem_sizing import sizing_jobs

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert (sizing_jobs(100), sizing_jobs(30), sizing_jobs(5)) == (4, 2, 1)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert sizing_jobs(100) == 1
