"""One worked example per plug-in family, each the single file an outside package would
add, run through that family's conformance suite by tests/test_example_*.py (the index
is docs/extending.md)."""
