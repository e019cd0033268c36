"""The dynamic side of kaudit: code that runs benchmark code, always in a child process.

`runner` starts an isolated child (`python -m kaudit.dynamic.child`) for one job and hands back its
JSON result and the files it wrote; `problem_job` is the child side of `kaudit problems`, and
`problems` the parent side (probes, findings, summaries). Nothing here imports torch at import time:
the static scan loads the KP rules, which import `kaudit.dynamic.probe_rule`.
"""
