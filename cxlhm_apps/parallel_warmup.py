"""First runs compile the firmware of every configuration, one after the other (about a
minute each on a fresh install). `ParallelWarmup` overlaps them: the moment the run
starts compiling (cxlhm's "compiling" notice), each configuration still to come gets a
short replay of its own in a child process - at most one per spare core - which compiles
that configuration's firmware into the shared disk cache while this process compiles
its own. Before a configuration runs here, its child is waited for, so its code comes
from the cache. With a warm cache nothing is announced, and nothing is started.

    with ParallelWarmup(["lru", "hymcache+hints"], child_argv) as warm:
        for label in labels:
            warm.wait_for(label)
            ...run it...
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


class ParallelWarmup:
    def __init__(self, labels: Sequence[str], child_argv: Callable[[str], list[str]], *,
                 spare_cores: int | None = None):
        self.labels = list(labels)
        self.child_argv = child_argv
        self.spare = max(0, (os.cpu_count() or 1) - 1) if spare_cores is None else spare_cores
        self.children: dict[str, subprocess.Popen] = {}
        self.position = 0  # the configuration running here
        self._jit = None
        self._notice = None

    def __enter__(self) -> "ParallelWarmup":
        if len(self.labels) > 1 and self.spare > 0:
            from cxlhm import jit
            self._jit, self._notice = jit, jit.compiling_notice
            original = jit.compiling_notice

            def compiling_notice(what, folder):
                original(what, folder)
                if not any(Path(folder).glob("*.nbi")):  # the test cxlhm makes before it says so
                    self._start_children()
            jit.compiling_notice = compiling_notice
        return self

    def _start_children(self) -> None:
        if self.children:
            return
        waiting = self.labels[self.position + 1:][: self.spare]
        for label in waiting:
            self.children[label] = subprocess.Popen(
                [sys.executable, "-m", "cxlhm_apps.cli", *self.child_argv(label)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if waiting:
            print(f"cxlhm: compiling {', '.join(waiting)} alongside, in {len(waiting)} more process"
                  f"{'es' if len(waiting) > 1 else ''}", file=sys.stderr, flush=True)

    def wait_for(self, label: str) -> None:
        """Before `label` runs here: its child (if any) has finished compiling it."""
        self.position = self.labels.index(label)
        child = self.children.pop(label, None)
        if child is not None:
            child.wait()  # its status does not matter: this process compiles whatever is missing

    def __exit__(self, *exc) -> None:
        if self._jit is not None:
            self._jit.compiling_notice = self._notice
        for child in self.children.values():  # an interrupted run: its children go too
            child.terminate()
            child.wait()
        self.children.clear()
