"""Conformance suites for cxlhm's pluggable families, for outside implementations to run
the way the built-in ones do (subclass the suite in a test module; pytest collects it)."""
