"""`kaudit fix`: the rules' safe fixes, applied without losing formatting or comments.

A rule that can fix declares `fix(editor, finding)` next to its `check` (Fixit-style) and returns a
`Fix`: text edits computed from the finding's location and the parse. This package holds what is
shared: the edit model (`edits`), the edit engine that maps rule intents onto text, with libcst for
Python and through string escapes for embedded C++ (`editor`), the judge that keeps only fixes
that parse and remove their finding (`engine`), `--add-suppressions` (`suppress`) and the command
(`command`). Only `edits` is imported by the scan; the rest loads libcst and runs when asked.
"""
