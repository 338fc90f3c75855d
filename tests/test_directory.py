"""The content directory: both back ends pass the one conformance suite; the embedded
one also across processes and after a killed writer; the metrics' arithmetic."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

from host_runtime.testing.directory import DirectoryConformance, fp, loc
from cxlhm.testing.redis_server import server_or_skip
from host_runtime.directory import DirectoryMetrics, SharedMemoryDirectory
from host_runtime.directory.shm import DirectoryFileError


class TestSharedMemoryDirectory(DirectoryConformance):
    def make_directory(self):
        d = SharedMemoryDirectory.create(entries=50_000)
        os.unlink(d.path)  # the mapping and the fd keep it alive; nothing left behind
        return d

    def other_client(self, directory):
        return SharedMemoryDirectory.attach(f"/proc/self/fd/{directory._fd}")


@pytest.fixture(scope="module")
def redis_server():
    server = server_or_skip()
    yield server
    server.stop()


class TestRedisDirectory(DirectoryConformance):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server):
        self.server = redis_server
        self.namespaces = 0

    def make_directory(self):
        from host_runtime.directory.redis import RedisDirectory
        self.namespaces += 1
        d = RedisDirectory(self.server.url, namespace=f"t{os.getpid()}-{id(self)}-{self.namespaces}")
        d.clear()
        return d

    def other_client(self, directory):
        from host_runtime.directory.redis import RedisDirectory
        return RedisDirectory(self.server.url, namespace=directory.namespace[:-1].decode())


# ---------------------------------------------------------------- embedded: many processes
def _writer(path: str, w: int, n: int) -> None:
    d = SharedMemoryDirectory.attach(path)
    for start in range(0, n, 250):
        d.publish_many([fp(i, bytes([w])) for i in range(start, start + 250)], [loc(i) for i in range(start, start + 250)])
    d.close()


def _stuck_writer(path: str, ready) -> None:
    d = SharedMemoryDirectory.attach(path)
    with d._writer():  # holds the cross-process lock until killed
        ready.set()
        signal.pause()


def test_processes_publish_into_one_table(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=40_000)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(d.path, w, 4000)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    for w in range(4):
        hits = d.lookup_sparse([fp(i, bytes([w])) for i in range(4000)])
        assert hits.n_hits == 4000 and hits.location(3999) == loc(3999)
    assert d.live == 16000
    d.close()


def test_killed_writer_releases_the_lock(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=1000)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_stuck_writer, args=(d.path, ready))
    p.start()
    assert ready.wait(60)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert d.publish(fp(1), loc(1)) and d.lookup(fp(1)) == loc(1)  # would hang if the lock survived
    d.close()


def test_full_directory_drops_and_counts(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=10, max_probe=4)
    stored = d.publish_many([fp(i) for i in range(200)], [loc(i) for i in range(200)])
    assert stored < 200 and d.dropped == 200 - stored and d.live == stored
    assert d.lookup_sparse([fp(i) for i in range(200)]).n_hits == stored


def test_not_a_directory_file(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"x" * 8192)
    with pytest.raises(DirectoryFileError, match="not a cxlhm directory"):
        SharedMemoryDirectory.attach(junk)
    with pytest.raises(ValueError, match="entries"):
        SharedMemoryDirectory.create(tmp_path / "d", entries=0)


def test_metrics_arithmetic():
    a = DirectoryMetrics(keys_looked_up=10, entries_returned=6, verified_hits=5, remote_hits=3, stale_entries=1,
                         wasted_bytes=4096, useful_tokens=80, metadata_ops=20, prefetched=4, prefetched_used=3)
    b = DirectoryMetrics(keys_looked_up=10, entries_returned=4, verified_hits=4, remote_hits=1, useful_tokens=20,
                         metadata_ops=10)
    s = a + b
    assert s.remote_hit_ratio == 4 / 20 and s.staleness_rate == 1 / 10
    assert s.metadata_ops_per_useful_token == 30 / 100 and s.prefetch_accuracy == 3 / 4
    assert "staleness rate" in s.table() and s.as_dict()["wasted_bytes"] == 4096
    assert DirectoryMetrics().metadata_ops_per_useful_token == 0.0


def test_open_directory_by_url(tmp_path, redis_server):
    from host_runtime.directory import DIRECTORIES, open_directory
    from host_runtime.directory.redis import RedisDirectory
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=100)
    d.publish(fp(1), loc(1))
    with open_directory(f"shm://{tmp_path / 'dir.shm'}") as again:
        assert again.lookup(fp(1)) == loc(1)
    with open_directory(redis_server.url) as r:
        assert isinstance(r, RedisDirectory)
    assert {"redis", "shm"} <= set(DIRECTORIES.names())
    with pytest.raises(LookupError, match="unknown content directory 'etcd'; available: redis, shm"):
        open_directory("etcd://x")
    with pytest.raises(ValueError, match="expected a URL"):
        open_directory("/dev/shm/x")
    d.close()
