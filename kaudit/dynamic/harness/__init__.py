"""What runs inside a job (never in the parent process): the job's supervisor and sandbox set-up
(`child`, `jail`), the fork server's loop (`server`), the dynamic pass's jobs (`kernel_job`,
`plain_run`, `problem_job`) and what they use (`poison`, `sentinels`, `guard`).

Jobs import this package from a copy in their own folder, as `harness`: its modules import only the
standard library, torch and each other (relatively), and their text never names the scanner
that runs them, so that nothing in a job does. The parent imports this package too, under its
own name (the sentinels, to judge).
"""
