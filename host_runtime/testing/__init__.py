"""Conformance suites for host-runtime parts an outside package can implement (content
directories), shipped like cxlhm.testing so the implementation runs them in its own tests."""
