"""The dynamic side of kaudit: code that runs benchmark code, always in a child process.

`runner` runs one job in an isolated child (forked from `forkserver`, which has torch preloaded, or
a fresh `python -m kaudit.dynamic.child`) and hands back its JSON result and the files it wrote.
`problem_job` / `problems` are the child and parent sides of `kaudit problems`; `kernel_job`
(with `poison` and `sentinels`) / `kernels` those of `kaudit scan --dynamic`; `artifacts` draws
the pictures of unwritten and out-of-bounds regions. Nothing here imports torch at import time:
the static scan loads the KP rules, which import `kaudit.dynamic.probe_rule`.
"""
