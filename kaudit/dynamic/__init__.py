"""The dynamic side of kaudit: code that runs benchmark code, always in a child process.

`runner` runs one job in its own process (started by `sandbox`: forked from `forkserver`, which has
torch preloaded, or a fresh interpreter; in the OS sandbox where it can be built) and hands back its
JSON result and the files it wrote. What runs inside jobs is `harness` (imported there under that
name, never naming kaudit): `harness.problem_job` / `problems` are the job and parent sides of
`kaudit problems`; `harness.kernel_job` and `harness.plain_run` (with `harness.poison` and
`harness.sentinels`) / `kernels` and `judge` those of `kaudit scan --dynamic`, which `pipeline`
runs inside a scan (`options`: what it is asked; `result_cache`: results by content); `artifacts` draws
the pictures of unwritten and out-of-bounds regions; `scratch`, `builds` and `selfcheck` keep
kaudit's temporary folders, build folders and own code. Nothing here imports torch at import time:
the static scan loads the KP rules, which import `kaudit.dynamic.probe_rule`.
"""
