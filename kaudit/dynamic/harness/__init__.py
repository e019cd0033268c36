"""What runs inside a job (never in the kaudit process): the job's supervisor and sandbox set-up
(`child`, `jail`), the fork server's loop (`server`), the dynamic pass's jobs (`kernel_job`,
`plain_run`, `problem_job`) and what they use (`poison`, `sentinels`, `guard`).

Jobs import this package from a copy in their own folder, as `harness`: its modules import only the
standard library, torch and each other (relatively), so that nothing in a job names kaudit.
kaudit's own process imports it as `kaudit.dynamic.harness` (the sentinels, to judge).
"""
