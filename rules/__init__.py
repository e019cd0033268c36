"""kaudit's rules, one module each, named `<code>_<name>.py`. Installed as `kaudit.rules`.

Adding a rule: write one module here with one `kaudit.rule.Rule` subclass (code, name, level,
precision, tags, a docstring with What it does / Why is this bad? / Example, and `check`), and its
fixtures in `fixtures/rules/<CODE>/` (`bad_*.py` marked with `# expect: CODE`, `good_*.py`).
The test suite picks both up by itself.
"""
