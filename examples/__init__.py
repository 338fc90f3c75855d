"""Worked examples, one file per plug-in family (see docs/extending.md). Not installed
with cxlhm: the tests import them from the checkout."""
