"""A throwaway redis-server on a loopback port, for the directory's tests and bench.

    with RedisServer() as server:      # skips nothing itself: raises if redis-server is absent
        RedisDirectory(server.url)
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time


class RedisUnavailable(RuntimeError):
    """redis-server is not installed, or did not come up."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, binary: str | None = None):
        self.binary = binary or shutil.which("redis-server")
        if not self.binary:
            raise RedisUnavailable("redis-server is not installed (Debian: apt-get install redis-server)")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="cxlhm-redis-")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "RedisServer":
        # no persistence, loopback only: a scratch server for this process's tests
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir.name, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisUnavailable(f"redis-server exited with status {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RedisUnavailable(f"redis-server did not answer on port {self.port} within {timeout} s")

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        return out.split()[2].removeprefix("v=") if out else "?"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self._dir.cleanup()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def server_or_skip() -> RedisServer:
    """A started server for a test, or the test skipped saying why there is none."""
    import pytest
    pytest.importorskip("redis")
    try:
        return RedisServer().start()
    except RedisUnavailable as exc:
        pytest.skip(str(exc))
