"""A pytest plugin, registered by cxlhm's install (entry point group ``pytest11``): each
firmware compile announces itself on the terminal even while pytest captures output.

cxlhm prints "cxlhm: compiling the lru firmware ..." before a compile that the disk cache
cannot serve (a minute or more on a fresh install); pytest captures stderr, so a
conformance suite's first run sat silent for minutes. With this plugin the same line
goes out through pytest's terminal reporter, past the capture, once per compile:

    tests/test_my_policy.py
    cxlhm: compiling the lecar firmware (once per install; cached in ~/.cache/cxlhm) ...
    ........

With capture off (``-s``) cxlhm's own line already shows, and the plugin adds nothing.
Disable it with ``-p no:cxlhm``.
"""
from __future__ import annotations

import os
from pathlib import Path

_STATE: dict = {}


def _show(config, message: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        reporter.write_line(message)
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(message, yellow=True)


def pytest_configure(config):
    if config.getoption("capture", "fd") == "no":
        return  # cxlhm's own stderr line is visible
    try:
        from cxlhm import jit
    except Exception:  # cxlhm broken or half-installed: the tests will say so, not the plugin
        return
    original = jit.compiling_notice
    pytest_pid = os.getpid()

    def compiling_notice(what: str, folder: Path) -> None:
        fresh = not any(Path(folder).glob("*.nbi"))  # the same test cxlhm makes before it says so
        original(what, folder)
        # A test's forked child must not touch pytest's capture: resuming it there puts
        # pytest's capture file back on the child's stderr, and what the child says next is lost.
        if fresh and os.getpid() == pytest_pid:
            _show(config, f"cxlhm: compiling {what} (once per install; cached in {jit.cache_dir()}) ...")

    jit.compiling_notice = compiling_notice
    _STATE["restore"] = (jit, original)


def pytest_unconfigure(config):
    restore = _STATE.pop("restore", None)
    if restore is not None:
        module, original = restore
        module.compiling_notice = original
