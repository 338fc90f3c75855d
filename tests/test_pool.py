"""One device, many hosts: the pool service, host processes attached to it, the shared
content directory, isolation, and what kills leave behind."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from cxlhm.mailbox.hints import HintKind
from cxlhm.pool import protocol as P
from cxlhm.pool import wire
from cxlhm.pool.port import HostPort, device_session
from cxlhm.testing.redis_server import server_or_skip
from host_runtime.directory import Location, LocationKind, SharedMemoryDirectory
from host_runtime.mailbox import MailboxCommandError
from host_runtime.pool_client import AttachRefused, PoolError
from host_runtime.pooled_kv import PooledKV
from pool_helpers import (BLOCK, PARTITION, ServeProcess, attach, block_record, chunk_data, host_lookup,
                          host_mixed, host_spin, host_store, in_process_service, keys, read_record)

CTX = mp.get_context("spawn")


@pytest.fixture
def service(tmp_path):
    svc = in_process_service(tmp_path)
    yield svc
    svc.close()


@pytest.fixture
def directory(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=10_000)
    yield d
    d.close()


def run_hosts(*targets, timeout: float = 240) -> list[dict]:
    q = CTX.Queue()
    procs = [CTX.Process(target=fn, args=(*args, q)) for fn, args in targets]
    for p in procs:
        p.start()
    out = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return out


# ---------------------------------------------------------------- sharing across hosts
@pytest.fixture(scope="module")
def redis_url():
    server = server_or_skip()
    yield server.url
    server.stop()


@pytest.mark.parametrize("where", ["shm", pytest.param("redis", marks=pytest.mark.slow)])
def test_store_on_one_host_hit_on_another_prefix_and_sparse(service, directory, where, request):
    sock, key = service.socket_path, service.authkey
    address = directory.path if where == "shm" else request.getfixturevalue("redis_url")
    skip = {4, 7}
    stored = CTX.Event()
    results = run_hosts((host_store, (sock, key, "host-a", "t", address, b"s", 10, skip, stored)),
                        (host_lookup, (sock, key, "host-b", "t", address, b"s", 10, stored)))
    (seen,) = [r for r in results if "prefix" in r]
    assert seen["prefix"] == 4                                   # stops at the first gap
    assert seen["hit"] == [i not in skip for i in range(10)]     # sparse: every other hit, with gaps
    assert seen["right"]
    m = seen["metrics"]
    assert m["remote_hits"] == 16 and m["stale_entries"] == 0  # both passes verified host-a's 8 chunks
    assert seen["direct_hits"] > 0  # blocks host-a wrote were loaded from the mirror, no round trip


def test_hosts_share_chunks_through_a_redis_directory(service, redis_url):
    from host_runtime.directory.redis import RedisDirectory
    a, b = attach(service, "a", ["t"]), attach(service, "b", ["t"])
    ka = PooledKV(a.tenant("t"), RedisDirectory(redis_url, namespace="pool-test"))
    kb = PooledKV(b.tenant("t"), RedisDirectory(redis_url, namespace="pool-test"))
    ks = keys(6, b"redis")
    for i in (0, 1, 3, 5):
        ka.put(ks[i], chunk_data(ks[i]))
    ok, out = kb.get_many(ks)
    assert ok.tolist() == [True, True, False, True, False, True]
    assert all(bytes(out[i]) == chunk_data(ks[i]) for i in (0, 1, 3, 5))
    assert kb.metrics.remote_hits == 4 and kb.prefix_hits(ks) == 2
    a.close(), b.close()


def test_mirror_stays_coherent_with_writes(service):
    a, b = attach(service, "a", ["t"]), attach(service, "b", ["t"])
    ta, tb = a.tenant("t"), b.tenant("t")
    ta.write_from(0, block_record(1, 0, 1))
    assert read_record(np.frombuffer(tb.load(0, BLOCK), np.uint8)) == (1, 1, 0)
    hits = tb.direct_hits
    ta.write_from(0, block_record(1, 0, 2))  # the mirror entry is replaced before b reads again
    assert read_record(np.frombuffer(tb.load(0, BLOCK), np.uint8)) == (2, 1, 0)
    assert tb.direct_hits == hits + 1
    ta.write_from(100, b"xyz")  # a partial block: dropped from the mirror, read through the service
    reads = tb.service_reads
    assert tb.load(100, 3) == b"xyz" and tb.service_reads == reads + 1
    assert tb.load(100, 3) == b"xyz" and tb.direct_hits == hits + 2  # the miss put it back
    a.close(), b.close()


def test_stale_directory_entry_is_a_miss_never_wrong_bytes(service, directory):
    a = attach(service, "a", ["t"])
    kv = PooledKV(a.tenant("t"), directory)
    k = keys(1, b"old")[0]
    kv.put(k, chunk_data(k))
    # the ring wraps: later chunks overwrite the first one, whose entry stays in the directory
    for i, f in enumerate(keys(PARTITION // BLOCK, b"new")):
        kv.put(f, chunk_data(f, 1000))
    assert directory.lookup(k) is not None
    assert kv.get(k) is None
    assert kv.metrics.stale_entries == 1 and kv.metrics.wasted_bytes > 0 and kv.metrics.staleness_rate == 1.0
    a.close()


def test_prefetch_hints_reach_the_firmware_for_another_hosts_chunks(service, directory):
    a, b = attach(service, "a", ["t"]), attach(service, "b", ["t"])
    ka, kb = PooledKV(a.tenant("t"), directory), PooledKV(b.tenant("t"), directory)
    ks = keys(6, b"p")
    for k in ks:
        ka.put(k, chunk_data(k))
    delivered = service.stats()["hosts"][1]["hints_delivered"]
    assert kb.prefetch(ks[:4], session=9) == 4
    assert service.stats()["hosts"][1]["hints_delivered"] == delivered + 4
    kb.get_many(ks[:2])
    m = kb.metrics
    assert (m.prefetched, m.prefetched_used, m.prefetched_remote, m.prefetched_remote_used) == (4, 2, 4, 2)
    assert m.prefetch_accuracy == 0.5
    a.close(), b.close()


# ---------------------------------------------------------------- isolation
def test_a_host_gets_only_the_tenants_it_was_granted(tmp_path):
    svc = in_process_service(tmp_path, grants={"a": ["t1"], "b": ["t2"]})
    try:
        with pytest.raises(AttachRefused, match="not granted tenant"):
            attach(svc, "b", ["t1"])
        a, b = attach(svc, "a", ["t1"]), attach(svc, "b", ["t2"])
        a.tenant("t1").write_from(0, b"secret of t1")
        assert b.tenant("t2").load(0, 12) != b"secret of t1"  # another partition, another device range
        with pytest.raises(PoolError, match="was not given tenant"):
            b._call(P.Op.READ, a.tenant("t1").id, 0, 12)  # asking by id does not help
        with pytest.raises(KeyError, match="did not attach tenant"):
            b.tenant("t1")
        with pytest.raises(PoolError, match="outside tenant 't1'"):
            a.tenant("t1").load(PARTITION - 4, 8)
        with pytest.raises(ValueError, match="read-only"):
            a.tenant("t1").mirror.blocks[0, 0] = 1  # the mirror is mapped read-only
        with pytest.raises(TypeError, match="readonly"):
            a.tenant("t1").mirror._mm[0] = 1
        a.close(), b.close()
    finally:
        svc.close()


def test_other_tenants_locations_read_as_misses(service, directory):
    a, b = attach(service, "a", ["t1"]), attach(service, "b", ["t2"])
    ka, kb = PooledKV(a.tenant("t1"), directory), PooledKV(b.tenant("t2"), directory)
    k = keys(1, b"x")[0]
    ka.put(k, chunk_data(k))
    assert kb.get(k) is None and kb.metrics.verified_hits == 0  # found in the directory, not readable here
    a.close(), b.close()


def test_hints_outside_a_hosts_window_are_refused(service):
    a = attach(service, "a", ["t1", "t2"])
    a.hints.session_resume(5, [(0, 2 * PARTITION)])  # both of its partitions: fine
    with pytest.raises(MailboxCommandError):
        a.hints.session_resume(5, [(2 * PARTITION, BLOCK)])  # past its window
    a.close()


class _Recorder:
    """Stands in for the pooled Device behind a port: records the hints it is given."""
    block_size, cfg, closed = BLOCK, None, False

    def __init__(self):
        self.calls = []

    def hint(self, kind, session, first_block, n_blocks, arg=0, *, lock_timeout=-1):
        self.calls.append((kind, session, first_block, n_blocks))
        return True


def test_port_moves_hints_to_the_tenants_device_blocks():
    from cxlhm.pool.layout import TenantPartition
    rec = _Recorder()
    per = PARTITION // BLOCK
    port = HostPort(rec, [TenantPartition("x", 3, 3 * PARTITION), TenantPartition("y", 1, PARTITION)], PARTITION)
    assert port.capacity == 2 * PARTITION
    port.hint(HintKind.NEXT_PREFIX, 7, per - 2, 4)  # crosses from the host's first partition to its second
    assert rec.calls == [(HintKind.NEXT_PREFIX, device_session(3, 7), 4 * per - 2, 2),
                         (HintKind.NEXT_PREFIX, device_session(1, 7), per, 2)]
    rec.calls.clear()
    port.hint(HintKind.SESSION_END, 7, 0, 0)
    assert {c[1] for c in rec.calls} == {device_session(3, 7), device_session(1, 7)}
    assert port.hint(HintKind.SESSION_END, 1 << 41, 0, 0) is False  # too wide to qualify: declined


# ---------------------------------------------------------------- faults
def test_killed_host_leaves_the_others_and_the_device_correct(service):
    sock, key = service.socket_path, service.authkey
    ready = CTX.Event()
    victim = CTX.Process(target=host_spin, args=(sock, key, "victim", "t", 0, ready))
    victim.start()
    assert ready.wait(240)
    survivor = attach(service, "survivor", ["t"])
    t = survivor.tenant("t")
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    for j in range(8):
        t.write_from((8 + j) * BLOCK, block_record(1, j, 5))
    buf = np.empty(BLOCK, np.uint8)
    for j in range(8):  # the victim's blocks hold some whole version of its writes
        t.read_into(j * BLOCK, buf)
        got = read_record(buf)
        assert got is None and not buf[:24].any() or got[1:] == (0, j)
        t.read_into((8 + j) * BLOCK, buf)
        assert read_record(buf) == (5, 1, j)
    hosts = {h["host"] for h in service.stats()["hosts"]}
    assert "victim" not in hosts and "survivor" in hosts  # its session (and mailbox) went with it
    assert survivor.hints.session_end(1).declined == 0  # the device still takes commands
    survivor.close()


@pytest.mark.slow  # two service start-ups in child processes (about a minute on a loaded 2-core machine)
def test_killed_service_restarts_with_everything_flushed(tmp_path, directory):
    serve = ServeProcess(tmp_path).start()
    try:
        host = attach(serve.socket, "a", ["t"], serve.authkey)
        kv = PooledKV(host.tenant("t"), directory)
        flushed, later = keys(12, b"flushed"), keys(6, b"later")
        for k in flushed:
            kv.put(k, chunk_data(k))
        host.flush()
        for k in later:
            kv.put(k, chunk_data(k))
        serve.kill()
        host.close()
        serve.start()
        host = attach(serve.socket, "a", ["t"], serve.authkey)
        kv = PooledKV(host.tenant("t"), directory)
        ok, out = kv.get_many(flushed)
        assert ok.all() and all(bytes(out[i]) == chunk_data(k) for i, k in enumerate(flushed))
        ok, out = kv.get_many(later)  # written after the flush: kept or a miss, never wrong bytes
        assert all(bytes(out[i]) == chunk_data(k) for i, k in enumerate(later) if ok[i])
        kv.put(keys(1, b"next")[0], chunk_data(keys(1, b"next")[0]))  # the ring goes on past the flushed chunks
        assert kv.get_many(flushed)[0].all()
        host.close()
    finally:
        assert serve.stop() == 0  # SIGTERM: flush, close, exit 0


def test_serve_command_errors_are_clean(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "device", "serve", "--socket", str(tmp_path / "s"),
                          "--state", str(tmp_path / "st"), "--grant", "nohost"], capture_output=True, text=True)
    assert out.returncode == 2 and "cxlhm device: error: --grant 'nohost'" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "device", "serve", "--socket", str(tmp_path / "s"),
                          "--state", str(tmp_path / "st"), "--partition-bytes", "3KiB", "--set", "block_size=4KiB",
                          "--set", "capacity=1MiB", "--set", "dram_bytes=64KiB"], capture_output=True, text=True)
    assert out.returncode == 2 and "partition_bytes must be a positive multiple" in out.stderr


def test_bad_requests_are_answered_not_fatal(service):
    a = attach(service, "a", ["t"])
    with pytest.raises(PoolError, match="unknown op"):
        wire.send(a._conn, P.REQUEST.pack(99, 0, 0, 0))
        raw = wire.recv(a._conn, 1 << 16)
        raise PoolError(P.REPLY.unpack_from(raw)[0], raw[P.REPLY.size:].decode())
    wire.send(a._conn, b"xx")
    assert P.REPLY.unpack_from(wire.recv(a._conn, 1 << 16))[0] == P.Status.BAD_REQUEST
    with pytest.raises(PoolError, match="chunk"):
        a.tenant("t").put_chunk(b"x" * (PARTITION + 1))
    a.tenant("t").store(0, b"still fine")
    assert a.tenant("t").load(0, 10) == b"still fine"
    a.close()


@pytest.mark.slow  # sixteen spawned host processes
def test_sixteen_hosts_mixed_load_lose_no_update(service, directory):
    hosts, blocks_each, rounds = 16, 4, 60
    sock, key = service.socket_path, service.authkey
    results = run_hosts(*[(host_mixed, (sock, key, f"h{me}", "t", directory.path, me, hosts, blocks_each, rounds))
                          for me in range(hosts)], timeout=600)
    assert [r["bad"] for r in results] == [[]] * hosts  # no torn, mixed or misplaced read anywhere
    reader = attach(service, "checker", ["t", "chunks"])
    t = reader.tenant("t")
    buf = np.empty(BLOCK, np.uint8)
    for r in results:  # every block holds its owner's last write
        for j, v in enumerate(r["versions"]):
            t.read_into((r["me"] * blocks_each + j) * BLOCK, buf)
            if v:
                assert read_record(buf) == (v, r["me"], j)
    published = [keys(1, f"{me}/{r}".encode())[0] for me in range(hosts) for r in range(0, rounds, 20)]
    assert directory.lookup_sparse(published).n_hits == len(published)  # no publish lost either
    kv = PooledKV(reader.tenant("chunks"), directory)
    ok, out = kv.get_many(published)
    assert ok.all() and all(bytes(o) == chunk_data(k, 512) for o, k in zip(out, published))
    reader.close()


def test_closing_the_service_with_hosts_attached_is_prompt(tmp_path):
    import time
    svc = in_process_service(tmp_path)
    hosts = [attach(svc, f"h{i}", ["t"]) for i in range(3)]
    hosts[0].tenant("t").store(0, b"x")
    started = time.monotonic()
    svc.close()
    assert time.monotonic() - started < 8  # hosts' connections are shut, not waited out (10 s each)
    with pytest.raises((PoolError, EOFError, OSError)):
        hosts[1].tenant("t").load(0, 1)
    for h in hosts:
        h.close()


def test_mirror_invalidates_a_range_wider_than_itself():
    from cxlhm.pool.mirror import MirrorReader, MirrorWriter
    w = MirrorWriter("t", 4, BLOCK)
    r = MirrorReader(os.dup(w.fd), 4, BLOCK)
    w.install(9, np.full(BLOCK, 7, np.uint8))  # block 9 lives in entry 1
    out = np.empty(BLOCK, np.uint8)
    assert r.read(9 * BLOCK, out) and (out == 7).all()
    w.invalidate(0, 12)  # blocks 0..11: more blocks than entries
    assert not r.read(9 * BLOCK, out)
    w.install(20, np.full(2 * BLOCK, 3, np.uint8))
    w.invalidate(0, 12)  # blocks 20, 21 are outside: kept
    assert r.read(20 * BLOCK, np.empty(2 * BLOCK, np.uint8))
    r.close(), w.close()
