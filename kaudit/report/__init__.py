"""Renderers: a `Report` in, text or bytes out. No analysis happens here."""
