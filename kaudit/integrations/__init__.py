"""Drop-in replacements for benchmark harnesses' own functions, each gated by kaudit's audit."""
