#!/usr/bin/env bash
# .corpora/ for bench/gpu_checks.sh, from bare clones of the public repositories:
#   bash bench/corpora.sh MIRRORS    (MIRRORS/<owner>+<name>/repo, as the `fetch` tool leaves them)
# KernelBench problems (MIT), KernelBenchX's data, timing templates and utils and Atrex-Bench's data
# (Apache-2.0), FastKernels' package, 80 CUDA kernels the technoabsurdist/KernelBench fork's runs
# claim correct (MIT), and a subset of CUDA-L1's h100_xsm.json (GPL-3.0: read where it lies, never
# committed). Nothing here is vendored: .corpora/ stays out of git.
set -eu
M=${1:?usage: bench/corpora.sh MIRRORS}
C=.corpora; rm -rf "$C"; mkdir -p "$C"
git -C "$M/ScalingIntelligence+KernelBench/repo" archive HEAD KernelBench | tar x -C "$C"
mv "$C/KernelBench" "$C/kb"
git -C "$M/BonnieW05+KernelBenchX/repo" archive --prefix=kbx/ HEAD data metrics/golden_metrics utils | tar x -C "$C"
grep -E '"task_id": "(Activation/(relu|sigmoid|tanh|leaky_relu)|Random/logspace)\.py"' \
  "$C/kbx/data/kbx_corpus/all_records.jsonl" > "$C/kbx/data/timed.jsonl"
git -C "$M/Snowflake-AI-Research+fastkernels/repo" archive HEAD fastkernels | tar x -C "$C"
mkdir -p "$C/cudal1"
git -C "$M/sekstini+CUDA-L1/repo" show HEAD:optimized_cuda_code/h100_xsm.json > "$C/cudal1/h100_xsm.json"
git -C "$M/ScalingIntelligence+KernelBench/repo" show \
  "$(git -C "$M/ScalingIntelligence+KernelBench/repo" log --all --format=%h -1 -- results/timing/A100_modal)^:results/timing/A100_modal/baseline_time_torch.json" \
  > "$C/a100_baseline.json" 2>/dev/null || true
python3 - "$M/technoabsurdist+KernelBench/repo" "$C" <<'PY'
import json, os, re, subprocess, sys
repo, out = sys.argv[1], sys.argv[2]
git = lambda *a: subprocess.run(["git", "-C", repo, *a], capture_output=True, text=True).stdout
# a compact subset of CUDA-L1: a few tasks of each level
data = json.load(open(f"{out}/cudal1/h100_xsm.json"))
json.dump({k: [e for i, e in enumerate(v) if i % 33 == 3][:3] for k, v in data.items()},
          open(f"{out}/cudal1/h100_sub.json", "w"), indent=1)
taken = 0
for run in ["gemini_level1_run", "gemini_level2_run", "qwen3_level1_run", "qwencoder_level1_run",
            "qwencoder_level2_run"]:
    claims = json.loads(git("show", f"HEAD:runs/{run}/eval_results.json") or "{}")
    kept = 0
    for path in git("ls-tree", "--name-only", "HEAD", f"runs/{run}/").split():
        number = re.search(r"level_\d+_problem_(\d+)_sample_\d+_kernel\.py$", path)
        if not number or taken >= 80 or kept >= 25 or not (claims.get(number[1]) or {}).get("correctness"):
            continue
        text = git("show", f"HEAD:{path}")
        if "load_inline" in text:
            os.makedirs(f"{out}/real80/{run}", exist_ok=True)
            open(f"{out}/real80/{run}/{os.path.basename(path)}", "w").write(text)
            taken, kept = taken + 1, kept + 1
    if kept:
        json.dump(claims, open(f"{out}/real80/{run}/eval_results.json", "w"))
os.makedirs(f"{out}/real8/gemini_level1_run", exist_ok=True)
for name in sorted(os.listdir(f"{out}/real80/gemini_level1_run"))[:8]:
    os.link(f"{out}/real80/gemini_level1_run/{name}", f"{out}/real8/gemini_level1_run/{name}")
print(f"{taken} real kernels")
PY
du -sh "$C"
