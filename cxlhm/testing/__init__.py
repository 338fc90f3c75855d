"""Conformance suites shipped for outside packages: each plug-in family's suite lives in
its own submodule, to be subclassed by an implementation's tests."""
