"""Conformance suites for host-runtime parts an outside package can implement, shipped
like cxlhm.testing so the implementation runs them in its own tests: engine adapters
(shim.ShimConformance) and content directories (directory.DirectoryConformance)."""
