"""The pooled device against hosts that do not follow the protocol, and against the
accidents of its state folder: each test is one way a host or an operator could break
isolation, stop the service or lose acknowledged data, and what happens instead."""
from __future__ import annotations

import errno
import json
import mmap
import os
import socket
import time

import numpy as np
import pytest

from cxlhm.pool import PoolService, protocol as P, wire
from cxlhm.pool.identity import IdentityError, proof
from cxlhm.pool.layout import LayoutError
from cxlhm.pool.mirror import MirrorReader, ServiceLife, segment_bytes
from cxlhm.pool.statefiles import StateError
from host_runtime.driver import open_device
from host_runtime.pool_client import AttachRefused, PoolError, handshake
from pool_helpers import BLOCK, DEVICE, PARTITION, attach, block_record, in_process_service, read_record, wait_for


@pytest.fixture
def service(tmp_path):
    svc = in_process_service(tmp_path)
    yield svc
    svc.close()


def raw_connect(svc: PoolService) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(svc.socket_path)
    return s


# ---------------------------------------------------------------- identity
def test_a_host_cannot_attach_under_another_hosts_name(tmp_path):
    svc = in_process_service(tmp_path, grants={"host-a": ["t1"], "host-b": ["t2"]})
    try:
        key_a, key_b = svc.host_key("host-a"), svc.host_key("host-b")
        assert key_a != key_b and len(key_a) == 32
        with pytest.raises(AttachRefused, match="authentication failed"):
            attach(svc, "host-a", ["t1"], authkey=key_b)   # b's key, a's name
        with pytest.raises(AttachRefused, match="authentication failed"):
            attach(svc, "host-a", ["t1"], authkey=b"k" * 32)  # the pool-wide key opens no granted name
        with pytest.raises(AttachRefused, match="not granted"):
            attach(svc, "host-b", ["t1"], authkey=key_b)   # its own name, another's tenant
        a = attach(svc, "host-a", ["t1"], authkey=key_a)
        a.tenant("t1").store(0, b"t1 only")
        b = attach(svc, "host-b", ["t2"], authkey=key_b)
        assert b.tenant("t2").load(0, 7) != b"t1 only"
        a.close(), b.close()
        # keys live in the state folder, one file per host, this user's only
        path = tmp_path / "state" / "hosts" / "host-a.key"
        assert path.read_bytes() == key_a and path.stat().st_mode & 0o077 == 0
    finally:
        svc.close()


def test_grants_and_keys_survive_a_restart_and_a_replayed_proof_fails(tmp_path):
    svc = in_process_service(tmp_path, grants={"h": ["t"]})
    key = svc.host_key("h")
    s = raw_connect(svc)
    hello = json.loads(wire.recv(s, 4096))
    answer = proof(key, bytes.fromhex(hello["challenge"]), "h").hex()
    s.close()
    s = raw_connect(svc)  # a proof for one challenge does not answer another
    wire.recv(s, 4096)
    wire.send(s, json.dumps({"host": "h", "tenants": ["t"], "proof": answer}).encode())
    assert "authentication failed" in json.loads(wire.recv(s, 4096))["error"]
    s.close()
    svc.close()
    svc = in_process_service(tmp_path)  # no grants given: the saved ones hold
    try:
        with pytest.raises(AttachRefused, match="authentication failed"):
            attach(svc, "h", ["t"], authkey=b"k" * 32)
        attach(svc, "h", ["t"], authkey=key).close()
    finally:
        svc.close()


# ---------------------------------------------------------------- the mirror
def test_mirror_descriptors_are_sealed_and_read_only(service):
    writer = attach(service, "writer", ["t"])
    writer.tenant("t").write_from(0, block_record(1, 0, 1))
    sock, reply, fds = handshake(service.socket_path, "hostile", ["t"], service.authkey)
    try:
        life_fd, hits_fd, ring_fd, _, _, mirror_fd = fds
        size = segment_bytes(reply["mirror_entries"], reply["block_size"])
        with pytest.raises(OSError):
            os.pwrite(mirror_fd, b"forged", 64)
        with pytest.raises(OSError):
            mmap.mmap(mirror_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.ftruncate(mirror_fd, 0)  # a truncated mirror would SIGBUS the service
        rw = os.open(f"/proc/self/fd/{mirror_fd}", os.O_RDWR)  # reopened read-write through /proc: still sealed
        try:
            for act in (lambda: os.pwrite(rw, b"forged", 64), lambda: os.ftruncate(rw, 0),
                        lambda: os.ftruncate(rw, 2 * size),
                        lambda: mmap.mmap(rw, size, mmap.MAP_SHARED, mmap.PROT_WRITE)):
                with pytest.raises(OSError) as err:
                    act()
                assert err.value.errno in (errno.EPERM, errno.EACCES, errno.EBUSY)
        finally:
            os.close(rw)
        with pytest.raises(OSError):
            os.pwrite(life_fd, b"\0" * 8, 0)
        with pytest.raises(OSError):
            os.ftruncate(hits_fd, 0)  # the hit log is the host's to write, not to shrink
        with pytest.raises(OSError):
            os.ftruncate(ring_fd, 0)  # nor its rings
        assert os.fstat(mirror_fd).st_size == size
    finally:
        for fd in fds:
            os.close(fd)
        sock.close()
    reader = attach(service, "reader", ["t"])
    t = reader.tenant("t")
    assert read_record(np.frombuffer(t.load(0, BLOCK), np.uint8)) == (1, 1, 0) and t.direct_hits == 1
    writer.tenant("t").write_from(0, block_record(1, 0, 2))  # the service still writes its mirror
    assert read_record(np.frombuffer(t.load(0, BLOCK), np.uint8)) == (2, 1, 0) and t.direct_hits == 2
    writer.close(), reader.close()


def test_offsets_outside_the_partition_are_refused_before_the_mirror(service):
    a = attach(service, "a", ["t"])
    t = a.tenant("t")
    t.write_from(0, block_record(1, 0, 1))
    t.write_from(0, b"x")  # invalidates entry 0 (tag 0): partition block -1 must not match it
    buf = np.empty(BLOCK, np.uint8)
    for offset in (-BLOCK, -1, PARTITION, PARTITION - 1):
        with pytest.raises(PoolError, match="outside tenant 't'"):
            t.read_into(offset, buf)
        with pytest.raises(PoolError, match="outside tenant 't'"):
            t.write_from(offset, buf)
    assert not t.mirror.read(-BLOCK, buf)
    a.close()


# ---------------------------------------------------------------- what hosts may know and do
def test_stats_answer_with_the_asking_hosts_own_counters(service):
    a, b = attach(service, "host-a", ["t1"]), attach(service, "host-b", ["t2"])
    a.tenant("t1").store(0, b"x" * 10)
    seen = b.stats()
    assert seen["host"] == "host-b" and set(seen["tenants"]) == {"t2"}
    assert "host-a" not in json.dumps(seen) and "t1" not in json.dumps(seen)
    assert a.stats()["bytes_written"] == 10
    a.close(), b.close()


def test_flush_does_nothing_for_a_clean_host_and_is_spaced_for_a_busy_one(tmp_path):
    svc = in_process_service(tmp_path, flush_interval_s=0.2)
    try:
        a = attach(svc, "a", ["t"])
        t = a.tenant("t")
        t.store(0, b"x")
        a.flush()
        before = svc.counts["device_flushes"]
        for _ in range(50):  # nothing written since: no device flush at all
            assert a.flush() == 0
        assert svc.counts["device_flushes"] == before
        started = time.monotonic()
        for i in range(4):
            t.store(0, bytes([i]))
            a.flush()
        assert time.monotonic() - started >= 0.6  # 4 flushes, 0.2 s apart at least
        assert svc.counts["device_flushes"] == before + 4
        a.close()
    finally:
        svc.close()


def test_pin_budget_per_tenant(tmp_path):
    svc = in_process_service(tmp_path, pin_fraction=0.25)  # 16 DRAM slots: 4 blocks per tenant
    try:
        a, b = attach(svc, "a", ["t1"]), attach(svc, "b", ["t2"])
        assert a.hints.pin([(0, 16 * BLOCK)]).declined == 1  # more than its share
        assert a.hints.pin([(0, 4 * BLOCK)]).declined == 0
        assert a.hints.pin([(8 * BLOCK, BLOCK)]).declined == 1  # the share is used up
        assert b.hints.pin([(0, 4 * BLOCK)]).declined == 0  # another tenant has its own
        a.hints.unpin([(0, 2 * BLOCK)])
        assert a.hints.pin([(8 * BLOCK, 2 * BLOCK)]).declined == 0
        assert svc.stats()["tenants"]["t1"]["pinned_blocks"] == 4
        a.close(), b.close()
    finally:
        svc.close()


def test_mirror_bytes_beyond_the_machine_are_refused(tmp_path):
    handle = open_device({**DEVICE, "backend": {"path": str(tmp_path / "pool.img")}})
    try:
        with pytest.raises(LayoutError, match="more than half of this machine"):
            PoolService(handle, tmp_path / "s.sock", partition_bytes=PARTITION,
                        mirror_bytes=1 << 40)
    finally:
        handle.close()


# ---------------------------------------------------------------- denial of service
def test_a_silent_connection_blocks_nobody_and_is_dropped_at_the_deadline(tmp_path):
    svc = in_process_service(tmp_path, auth_deadline_s=0.5)
    try:
        silent = [raw_connect(svc) for _ in range(3)]
        started = time.monotonic()
        attach(svc, "a", ["t"]).close()
        assert time.monotonic() - started < 3
        for s in silent:  # the hello, then the service hangs up at its deadline
            wire.recv(s, 4096)
            with pytest.raises(wire.WireError):
                wire.recv(s, 4096)
            s.close()
        assert svc.counts["handshake_failures"] >= 3
    finally:
        svc.close()


@pytest.mark.parametrize("bad", [b"not json", b"[]", b'{"host": 1, "tenants": ["t"], "proof": "00"}',
                                 b'{"host": "a", "tenants": "t", "proof": "00"}',
                                 b'{"host": "a", "tenants": ["t"], "proof": "zz"}',
                                 b'{"host": "../x", "tenants": ["t"], "proof": "00"}', b"\xff" * 100])
def test_malformed_handshakes_are_answered_and_the_service_goes_on(service, bad):
    s = raw_connect(service)
    wire.recv(s, 4096)
    wire.send(s, bad)
    assert "error" in json.loads(wire.recv(s, 4096))
    s.close()
    attach(service, "a", ["t"]).close()


def test_oversized_and_truncated_frames_cost_the_sender_only(service):
    s = raw_connect(service)
    wire.recv(s, 4096)
    s.sendall(wire.FRAME.pack(1 << 30))  # announces a GiB
    with pytest.raises(wire.WireError):
        wire.recv(s, 4096)  # hung up on, nothing allocated
    s.close()
    a = attach(service, "a", ["t"])
    a._conn.sendall(wire.FRAME.pack(P.MAX_MESSAGE) + b"x" * 100)  # a stalled big request on its own connection
    b = attach(service, "b", ["t"])
    b.tenant("t").store(0, b"fine")
    assert b.tenant("t").load(0, 4) == b"fine"
    a.close(), b.close()


def test_hosts_and_pending_attaches_are_bounded(tmp_path):
    svc = in_process_service(tmp_path, max_hosts=3, max_pending=2, auth_deadline_s=2)
    try:
        hosts = [attach(svc, f"h{i}", ["t"]) for i in range(3)]
        with pytest.raises(AttachRefused, match="at most 3 hosts"):
            attach(svc, "h3", ["t"])
        hosts.pop().close()
        assert wait_until(lambda: len(svc.stats()["hosts"]) == 2)
        hosts.append(attach(svc, "h3", ["t"]))
        assert wait_until(lambda: svc._pending == 0)  # h3's handshake thread finishes after h3 has its reply
        silent = [raw_connect(svc) for _ in range(2)]
        time.sleep(0.2)
        extra = raw_connect(svc)  # a third handshake in progress: refused at once, with a reason
        assert "attaches in progress" in json.loads(wire.recv(extra, 4096))["error"]
        for s in silent + [extra]:
            s.close()
        for h in hosts:
            h.close()
    finally:
        svc.close()


def wait_until(predicate, timeout: float = 10) -> bool:
    return wait_for(predicate, timeout)


# ---------------------------------------------------------------- the state folder and the socket
def test_a_second_service_on_the_same_state_is_refused(tmp_path):
    svc = in_process_service(tmp_path)
    other = open_device({**DEVICE, "backend": {"path": str(tmp_path / "other.img")}})
    try:
        with pytest.raises(StateError, match="in use by another pool service"):
            PoolService(other, tmp_path / "other.sock", state_dir=tmp_path / "state", partition_bytes=PARTITION)
    finally:
        other.close()
        svc.close()


def test_planted_links_in_the_state_folder_are_not_followed(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in ("pool.tmp", "pool.json.tmp", "grants.json.tmp"):
        (state / name).symlink_to(victim)
    svc = in_process_service(tmp_path, grants={"a": ["t"]})
    try:
        attach(svc, "a", ["t"]).close()  # a new tenant and host: the layout is saved
        svc.flush()
    finally:
        svc.close()
    assert victim.read_text() == "precious"
    assert not (state / "pool.json").is_symlink() and json.loads((state / "pool.json").read_text())["tenants"]
    (state / "pool.json").unlink()
    (state / "pool.json").symlink_to(victim)
    with pytest.raises(LayoutError, match="symlink"):
        in_process_service(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_state_folder_of_another_user_or_writable_by_others_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 12345, 12345)
    with pytest.raises(StateError, match="belongs to uid 12345"):
        in_process_service(tmp_path)
    os.chown(state, 0, 0)
    state.chmod(0o777)
    with pytest.raises(StateError, match="writable by group or others"):
        in_process_service(tmp_path)


def test_a_socket_path_that_is_not_a_stale_socket_is_never_deleted(tmp_path):
    image = tmp_path / "pool.img"
    handle = open_device({**DEVICE, "backend": {"path": str(image)}})
    handle.close()
    size = image.stat().st_size
    handle = open_device({**DEVICE, "backend": {"path": str(tmp_path / "b.img")}})
    try:
        svc = PoolService(handle, image, state_dir=tmp_path / "state", partition_bytes=PARTITION)
        with pytest.raises(StateError, match="is not a socket"):
            svc.start()
    finally:
        handle.close()
    assert image.stat().st_size == size


def test_a_live_socket_is_not_taken_over_and_a_stale_one_is(tmp_path):
    svc = in_process_service(tmp_path)
    second = open_device({**DEVICE, "backend": {"path": str(tmp_path / "b.img")}})
    try:
        other = PoolService(second, svc.socket_path, state_dir=tmp_path / "state2", partition_bytes=PARTITION)
        with pytest.raises(StateError, match="another service is serving on it"):
            other.start()
        attach(svc, "a", ["t"]).close()  # the first one still serves
    finally:
        second.close()
        svc.close()
    stale = socket.socket(socket.AF_UNIX)  # a socket nobody listens on any more
    stale.bind(svc.socket_path)
    stale.close()
    svc = in_process_service(tmp_path)
    attach(svc, "a", ["t"]).close()
    svc.close()


def test_an_empty_or_short_key_is_refused_not_used(tmp_path):
    from cxlhm_apps.commands.device import authkey
    state = tmp_path / "st"
    state.mkdir(mode=0o700)
    (state / "authkey").write_bytes(b"")
    with pytest.raises(IdentityError, match="holds 0 bytes"):
        authkey(state)
    (state / "authkey").unlink()
    key = authkey(state)
    assert len(key) == 32 and authkey(state) == key and not list(state.glob("*.tmp"))
    handle = open_device({**DEVICE, "backend": {"path": str(tmp_path / "p.img")}})
    try:
        with pytest.raises(IdentityError, match="at least 16"):
            PoolService(handle, tmp_path / "s.sock", partition_bytes=PARTITION, authkey=b"")
    finally:
        handle.close()


# ---------------------------------------------------------------- lost or wrong data
def test_close_flushes_the_device_first_even_when_the_layout_cannot_be_saved(tmp_path, monkeypatch):
    svc = in_process_service(tmp_path)
    a = attach(svc, "a", ["t"])
    for j in range(20):
        a.tenant("t").write_from(j * BLOCK, block_record(1, j, 1))
    a.close()

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(svc.layout, "write", full)
    svc.close()  # logs the layout error, goes on
    assert svc.counts["layout_save_errors"] == 1
    handle = open_device({**DEVICE, "backend": {"path": str(tmp_path / "pool.img")}})
    try:
        buf = np.empty(BLOCK, np.uint8)
        for j in range(20):  # the tenant's partition is the first: device offset = partition offset
            handle.read_into(j * BLOCK, buf)
            assert read_record(buf) == (1, 1, j)
    finally:
        handle.close()


def test_attach_on_a_full_disk_is_a_clear_refusal(service, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(service.layout, "write", full)
    with pytest.raises(AttachRefused, match="No space left on device"):
        attach(service, "new-host", ["new-tenant"])
    monkeypatch.undo()
    attach(service, "new-host", ["new-tenant"]).close()


def test_a_host_of_an_earlier_service_life_misses_and_is_told(tmp_path):
    svc = in_process_service(tmp_path)
    a = attach(svc, "a", ["t"])
    t = a.tenant("t")
    t.write_from(0, block_record(1, 0, 1))
    assert read_record(np.frombuffer(t.load(0, BLOCK), np.uint8)) == (1, 1, 0) and t.direct_hits == 1
    life = ServiceLife(tmp_path / "state")  # what a restarted service does first (this one was "killed")
    buf = np.empty(BLOCK, np.uint8)
    assert not t.mirror.read(0, buf)  # the frozen mirror is not served any more
    with pytest.raises(PoolError, match="closed or restarted since; attach again") as err:
        t.read_into(0, buf)
    assert err.value.status == P.Status.SERVICE_GONE
    life.end()
    a.close()
    svc.close()
    b = attach(in_process_service(tmp_path), "a", ["t"])  # the same holds after a clean close
    b.close()


def test_a_closed_service_ends_its_hosts_mirror_hits(tmp_path):
    svc = in_process_service(tmp_path)
    a = attach(svc, "a", ["t"])
    t = a.tenant("t")
    t.write_from(0, block_record(1, 0, 1))
    svc.close()
    assert not t.mirror.read(0, np.empty(BLOCK, np.uint8))
    with pytest.raises(PoolError) as err:
        t.load(0, BLOCK)
    assert err.value.status == P.Status.SERVICE_GONE
    a.close()


def test_mirror_reader_refuses_a_segment_of_the_wrong_size(tmp_path):
    fd = os.memfd_create("x")
    os.ftruncate(fd, 100)
    with pytest.raises(OSError, match="a mirror of 100 bytes"):
        MirrorReader(fd, 4, BLOCK)


# ---------------------------------------------------------------- what the directory holds or does
def _pooled(service, tmp_path, name="a", tenant="t"):
    from host_runtime.directory import SharedMemoryDirectory
    from host_runtime.pooled_kv import PooledKV
    host = attach(service, name, [tenant])
    path = tmp_path / "dir.shm"
    d = SharedMemoryDirectory.attach(path) if path.exists() else SharedMemoryDirectory.create(path, entries=1000)
    return host, d, PooledKV(host.tenant(tenant), d)


@pytest.mark.parametrize("bad_word0", [7 << 56, 0xFE << 56 | 1])  # kinds no reader knows
def test_entries_of_unknown_kind_are_misses(service, tmp_path, bad_word0):
    from host_runtime.directory.location import key_array
    from pool_helpers import chunk_data, keys
    host, d, kv = _pooled(service, tmp_path)
    ks = keys(3, b"kind")
    for k in ks:
        kv.put(k, chunk_data(k))
    d.publish_words(key_array([ks[1]]), np.array([[bad_word0, 0, 64 << 32]], np.uint64))
    ok, out = kv.get_many(ks)
    assert ok.tolist() == [True, False, True] and bytes(out[2]) == chunk_data(ks[2])
    assert kv.metrics.bad_entries == 1
    assert kv.prefetch(ks, session=3) == 2  # the two good ones are still hinted
    host.close(), d.close()


def test_entries_outside_the_partition_are_misses_and_do_not_stop_prefetch(service, tmp_path):
    from host_runtime.directory import Location, LocationKind
    from pool_helpers import chunk_data, keys
    host, d, kv = _pooled(service, tmp_path)
    ks = keys(4, b"range")
    for k in ks:
        kv.put(k, chunk_data(k))
    tid = host.tenant("t").id
    d.publish(ks[1], Location(LocationKind.POOL, host.host_id, tid, PARTITION - 8, 4096))
    d.publish(ks[2], Location(LocationKind.POOL, host.host_id, tid, (1 << 64) - 4096, 4096))
    before = service.stats()["hosts"][0]["hints_delivered"]
    assert kv.prefetch(ks, session=5) == 2
    assert service.stats()["hosts"][0]["hints_delivered"] == before + 2
    ok, _ = kv.get_many(ks)
    assert ok.tolist() == [True, False, False, True] and kv.metrics.bad_entries == 4  # 2 in each pass
    host.close(), d.close()


def test_a_directory_that_cannot_answer_is_misses_and_a_counted_error(service):
    from host_runtime.directory.redis import RedisDirectory
    from host_runtime.pooled_kv import PooledKV
    from pool_helpers import chunk_data, keys
    with socket.socket() as s:  # a port nobody listens on: the server is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = attach(service, "a", ["t"])
    directory = RedisDirectory(f"redis://127.0.0.1:{port}/0", namespace="down")
    kv = PooledKV(host.tenant("t"), directory)
    k = keys(1, b"down")[0]
    where = kv.put(k, chunk_data(k))  # stored on the device, not published
    assert kv.metrics.directory_errors == 1
    raw = host.tenant("t").load(where.offset + 64, where.length)
    assert raw == chunk_data(k)
    ok, out = kv.get_many([k])
    assert not ok.any() and kv.metrics.directory_errors == 2
    assert kv.prefetch([k], session=1) == 0 and kv.metrics.directory_errors == 3
    host.close()


def _hold_image(path: str, ready) -> None:
    handle = open_device({**DEVICE, "backend": {"path": path}})
    handle.write_from(0, np.full(BLOCK, 5, np.uint8))
    ready.set()
    time.sleep(600)


def test_reopening_an_image_right_after_its_owner_was_killed_waits_for_the_lock(tmp_path, caplog):
    import logging
    import multiprocessing as mp
    from cxlhm.configerror import ConfigError
    ctx = mp.get_context("spawn")
    path = str(tmp_path / "img")
    for _ in range(1):  # the owner's lock lingers after a kill for a moment, not always as long
        ready = ctx.Event()
        p = ctx.Process(target=_hold_image, args=(path, ready))
        p.start()
        assert ready.wait(120)
        with pytest.raises(ConfigError, match="already open by another device.*waited 0.5 s"):
            open_device({**DEVICE, "backend": {"path": path}})  # a live owner: refused after the wait
        os.kill(p.pid, 9)
        p.join(30)
        with caplog.at_level(logging.INFO, logger="cxlhm.media"):
            handle = open_device({**DEVICE, "backend": {"path": path}})  # at once: no refusal
        handle.close()


def test_a_byte_flipped_in_a_block_no_host_wrote_is_an_error_not_data(tmp_path):
    from host_runtime.directory import Location, LocationKind, SharedMemoryDirectory
    from host_runtime.pooled_kv import PooledKV
    svc = in_process_service(tmp_path)
    a = attach(svc, "a", ["t0", "t"])
    base = a.tenant("t").id * PARTITION
    a.tenant("t").write_from(0, block_record(1, 0, 1))
    a.close()
    svc.close()
    with open(tmp_path / "pool.img", "r+b") as img:  # a block of t no host ever wrote
        img.seek(base + 5 * BLOCK + 17)
        img.write(b"\x5a")
    svc = in_process_service(tmp_path)
    try:
        a = attach(svc, "a", ["t"])
        t = a.tenant("t")
        with pytest.raises(PoolError, match="checksum mismatch|poison") as err:
            t.load(5 * BLOCK, BLOCK)
        assert err.value.status == P.Status.DEVICE_ERROR
        assert read_record(np.frombuffer(t.load(0, BLOCK), np.uint8)) == (1, 1, 0)
        assert t.load(6 * BLOCK, BLOCK) == bytes(BLOCK)  # its neighbours: zeros, verified
        d = SharedMemoryDirectory.create(tmp_path / "d.shm", entries=100)
        kv = PooledKV(t, d)
        k = b"k" * 32
        d.publish(k, Location(LocationKind.POOL, a.host_id, t.id, 5 * BLOCK, 100))
        assert kv.get(k) is None and kv.metrics.stale_entries == 1  # through the KV path: a miss
        d.close()
        a.close()
    finally:
        svc.close()


# ---------------------------------------------------------------- mirror hits reach the firmware
def test_mirror_hits_are_reported_to_the_firmware(service):
    a = attach(service, "a", ["t0", "t"])
    t = a.tenant("t")
    t.write_from(0, np.ones(4 * BLOCK, np.uint8))
    service.report_hits()
    before = service.handle.stats()["hits"]
    buf = np.empty(4 * BLOCK, np.uint8)
    for _ in range(10):
        t.read_into(0, buf)
    assert t.direct_hits == 10 and t.service_reads == 0
    assert wait_until(lambda: service.counts["hit_blocks_reported"] >= 40)  # the reporter's own pace
    assert service.handle.stats()["hits"] - before >= 40
    a.close()


def test_a_host_scribbling_on_its_hit_log_reports_only_its_own_blocks(service):
    from cxlhm.pool import hitlog
    a = attach(service, "a", ["t"])
    b = attach(service, "b", ["t2"])
    b.tenant("t2").write_from(0, np.ones(BLOCK, np.uint8))
    rng = np.random.default_rng(5)
    ring, header = a.hits._ring, a.hits._header
    for tail in (3, 10**12, 0, 2**63, 5):  # garbage entries, tails that rewind or leap
        ring[:] = rng.integers(0, 2**63, ring.shape[0], dtype=np.uint64)
        header[hitlog.TAIL] = tail
        service.report_hits()
    a.tenant("t").write_from(BLOCK, np.ones(2 * BLOCK, np.uint8))  # blocks 1 and 2 are in its mirror now
    service.report_hits()
    before = service.counts["hit_blocks_reported"]
    a.hits.record(0, 1, 2)  # and one honest report: two blocks of its own partition, mirrored
    service.report_hits()
    assert wait_until(lambda: service.counts["hit_blocks_reported"] == before + 2)
    time.sleep(0.05)
    assert service.counts["hit_blocks_reported"] == before + 2
    assert b.tenant("t2").load(0, 1) == b"\x01"  # the service is fine
    a.close(), b.close()


# ---------------------------------------------------------------- the hostile-host fuzzer (a few hundred cases)
def test_a_hostile_host_cannot_stop_the_service_or_reach_another_tenant():
    from hypothesis import given, settings, HealthCheck
    import fuzz_pool
    world = fuzz_pool.open_world()
    try:
        @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(fuzz_pool.CASE)
        def one(case):
            world.check(case)
        one()
        assert min(world.cases.values()) > 0
        assert len(world.statuses) >= 3  # answered with OK and with errors of several kinds
    finally:
        world.close()


def test_the_grant_command_makes_one_key_per_host_that_the_service_honours(tmp_path):
    import subprocess
    import sys
    state = tmp_path / "state"
    out = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "device", "grant", "--state", str(state),
                          "host-a=t1", "host-b=t1,t2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"its key: {state / 'hosts' / 'host-a.key'}" in out.stdout
    key_a = (state / "hosts" / "host-a.key").read_bytes()
    assert len(key_a) == 32 and (state / "hosts" / "host-a.key").stat().st_mode & 0o077 == 0
    bad = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "device", "grant", "--state", str(state),
                          "../evil=t1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "host name '../evil'" in bad.stderr and "Traceback" not in bad.stderr
    svc = in_process_service(tmp_path)
    try:
        attach(svc, "host-a", ["t1"], authkey=key_a).close()
        with pytest.raises(AttachRefused, match="not granted"):
            attach(svc, "host-a", ["t2"], authkey=key_a)
        attach(svc, "host-b", ["t1", "t2"], authkey=(state / "hosts" / "host-b.key").read_bytes()).close()
    finally:
        svc.close()


def test_ring_entries_are_checked_like_socket_requests(service):
    from cxlhm.pool import rings as R
    a = attach(service, "a", ["t"])
    b = attach(service, "b", ["t2"])
    b.tenant("t2").write_from(0, block_record(2, 0, 1))
    cases = [(P.Op.READ, 1, 0, BLOCK, P.Status.NOT_GRANTED),          # a tenant index it did not attach
             (P.Op.READ, 0, PARTITION, 1, P.Status.OUT_OF_RANGE),
             (P.Op.READ, 0, 2**64 - BLOCK, BLOCK, P.Status.OUT_OF_RANGE),
             (P.Op.WRITE, 0, 0, R.PAYLOAD + 1, P.Status.BAD_REQUEST),  # past its buffer
             (P.Op.FLUSH, 0, 0, 0, P.Status.BAD_REQUEST),              # not a ring op
             (P.Op.PUT, 0, 0, 0, P.Status.TOO_LARGE)]
    for op, index, offset, n, want in cases:
        with pytest.raises(PoolError) as err:
            a._ring_call(op, index, offset, n)
        assert err.value.status == want, (op, index, offset, n, str(err.value))
    assert read_record(np.frombuffer(b.tenant("t2").load(0, BLOCK), np.uint8)) == (1, 2, 0)
    a.tenant("t").store(0, b"after")  # the rings go on
    assert a.tenant("t").load(0, 5) == b"after"
    a.close(), b.close()


def test_mirror_install_and_invalidate_across_the_wrap():
    from cxlhm.pool.mirror import MirrorWriter
    w = MirrorWriter("t", 4, BLOCK)
    r = MirrorReader(os.dup(w.fd), 4, BLOCK)
    data = np.concatenate([np.full(BLOCK, i, np.uint8) for i in range(6)])
    w.install(3, data)  # blocks 3..8 into 4 entries: the last four (5..8) win, entries 1,2,3,0
    out = np.empty(BLOCK, np.uint8)
    assert not r.read(3 * BLOCK, out) and not r.read(4 * BLOCK, out)
    for b in range(5, 9):
        assert r.read(b * BLOCK, out) and (out == b - 3).all()
    whole = np.empty(4 * BLOCK, np.uint8)
    assert r.read(5 * BLOCK, whole) and (whole.reshape(4, BLOCK)[:, 0] == [2, 3, 4, 5]).all()  # a wrapped read
    assert r.read(5 * BLOCK + 100, np.empty(BLOCK, np.uint8))  # unaligned, across two entries
    w.invalidate(7, 3)  # blocks 7..9: entries 3 and 0
    assert r.read(5 * BLOCK, out) and r.read(6 * BLOCK, out)
    assert not r.read(7 * BLOCK, out) and not r.read(8 * BLOCK, out)
    assert w.invalidations == 2
    r.close(), w.close()


def test_the_socket_is_this_users_or_its_groups_never_everyones(tmp_path):
    import stat as st
    svc = in_process_service(tmp_path)
    assert st.S_IMODE(os.stat(svc.socket_path).st_mode) == 0o600
    svc.close()
    svc = in_process_service(tmp_path, socket_mode=0o660)
    assert st.S_IMODE(os.stat(svc.socket_path).st_mode) == 0o660
    svc.close()
    with pytest.raises(LayoutError, match="socket_mode 666"):
        in_process_service(tmp_path, socket_mode=0o666)


# ---------------------------------------------------------------- a co-tenant holding a valid key for its own tenant
def test_a_handshake_dripped_a_byte_at_a_time_is_cut_at_the_deadline(tmp_path):
    """The deadline covers the whole handshake, not each read: connections that send one
    byte just inside it, again and again, cannot hold every handshake slot."""
    svc = in_process_service(tmp_path, auth_deadline_s=0.5, max_pending=2)
    sloths = []
    try:
        for _ in range(2):
            s = raw_connect(svc)
            wire.recv(s, 4096)
            s.sendall(wire.FRAME.pack(60000))  # announces a big attach request, then drips it
            sloths.append(s)
        attached, deadline = None, time.monotonic() + 10
        while attached is None and time.monotonic() < deadline:
            for s in sloths:
                try:
                    s.sendall(b" ")
                except OSError:
                    pass  # hung up on: what should happen
            try:
                attached = attach(svc, "a", ["t"])
            except AttachRefused as exc:
                assert "attaches in progress" in str(exc)
                time.sleep(0.2)
        assert attached is not None, "two dripping handshakes kept every other host out"
        attached.close()
    finally:
        for s in sloths:
            s.close()
        svc.close()


def test_one_host_name_cannot_take_every_host_slot(tmp_path):
    svc = in_process_service(tmp_path, max_hosts=4, max_sessions_per_host=2,
                             grants={"greedy": ["t1"], "other": ["t2"]})
    try:
        greedy = [attach(svc, "greedy", ["t1"]) for _ in range(2)]
        with pytest.raises(AttachRefused, match="'greedy' has 2 attachments"):
            attach(svc, "greedy", ["t1"])
        other = attach(svc, "other", ["t2"])  # room is left for the other names
        other.tenant("t2").store(0, b"ok")
        for h in greedy + [other]:
            h.close()
    finally:
        svc.close()


def test_a_host_jamming_its_eventfds_or_completion_tail_stops_only_itself(tmp_path):
    """A host may write anything to the descriptors and words it was handed: an eventfd
    counter pushed to its maximum (where a blocking write waits forever), a completion
    tail at 2**64 - 1. The service's ring thread must neither hang nor die, and a
    closing service must not wait on it."""
    import threading
    from cxlhm.pool import rings as R

    def submit_raw(h, op, length):
        tail = int(h.rings.header[R.SQ_TAIL])
        h.rings.sq[tail % R.DEPTH] = (int(op), 0, length, 0)
        h.rings.header[R.SQ_TAIL] = tail + 1
        os.eventfd_write(h.rings.submitted, 1)

    svc = in_process_service(tmp_path)
    try:
        for _ in range(3):  # jam the completion eventfd, submit, hang up; again
            a = attach(svc, "jammer", ["t"])
            os.eventfd_write(a.rings.completed, 0xFFFFFFFFFFFFFFFE)
            submit_raw(a, P.Op.WRITE, 1)
            assert wait_until(lambda: a.stats()["ops"]["write"] == 1)  # the entry was served
            try:  # and the submission eventfd, which the service writes to stop the ring thread
                os.eventfd_write(a.rings.submitted, 0xFFFFFFFFFFFFFFFE)
            except BlockingIOError:
                pass
            a.close()
        assert wait_until(lambda: not any(t.name == "cxlhm-pool-rings" for t in threading.enumerate())), \
            "ring threads of hosts that hung up are still there"
        a = attach(svc, "tail", ["t"])
        a.rings.header[R.CQ_TAIL] = 2**64 - 1
        submit_raw(a, P.Op.WRITE, 1)
        assert wait_until(lambda: a.stats()["ops"]["write"] == 1)
        done = []
        worker = threading.Thread(target=lambda: done.append(a.tenant("t").store(0, b"own")), daemon=True)
        worker.start()
        worker.join(10)
        assert done, "the service's ring thread died of a completion tail the host wrote"
        b = attach(svc, "b", ["t"])
        b.tenant("t").store(0, b"fine")
        assert b.tenant("t").load(0, 4) == b"fine"
        a.close(), b.close()
    finally:
        started = time.monotonic()
        svc.close()
        assert time.monotonic() - started < 5


def test_a_forged_hit_log_replays_only_mirrored_blocks_within_a_budget(service):
    """Hits the host did not have (blocks its tenant's mirror does not hold) are not
    replayed, and one pass replays at most its mirrors' blocks plus a log of repeats:
    a host appending whole-partition reports in a loop cannot make the service read its
    partition over and over (two stores for the host, megabytes of device reads for the
    service)."""
    from cxlhm.pool import hitlog
    a = attach(service, "a", ["t"])
    t = a.tenant("t")
    t.write_from(0, np.ones(2 * BLOCK, np.uint8))  # blocks 0 and 1 are mirrored, the rest are not
    service.report_hits()
    before_hits, before = service.handle.stats()["hits"], service.counts["hit_blocks_reported"]
    for _ in range(3):
        for _ in range(hitlog.ENTRIES):
            a.hits.record(0, 0, PARTITION // BLOCK)  # "the whole partition, again"
        service.report_hits()
    reported = service.counts["hit_blocks_reported"] - before
    budget = service.mirror_entries + hitlog.ENTRIES  # per pass: its mirror's blocks, and a log of repeats
    assert 0 < reported <= 3 * budget < 3 * hitlog.ENTRIES * (PARTITION // BLOCK), reported
    a.hits.record(0, 5, 3)  # blocks never mirrored: no hit to replay
    service.report_hits()
    assert service.counts["hit_blocks_reported"] - before == reported
    assert service.handle.stats()["hits"] - before_hits <= reported
    buf = np.empty(2 * BLOCK, np.uint8)
    for _ in range(5):  # honest hits are still reported, each one
        assert t.read_into(0, buf) and t.direct_hits
    service.report_hits()
    assert service.counts["hit_blocks_reported"] - before == reported + 10
    a.close()


def test_a_host_whose_rings_failed_is_told_not_left_waiting(service, monkeypatch):
    import threading
    a = attach(service, "a", ["t"])
    a.tenant("t").store(0, b"before")

    def broken(*_):
        raise RuntimeError("a fault in the service's ring code")
    monkeypatch.setattr(service, "_ring_entry", broken)
    outcome = []

    def call():
        try:
            a.tenant("t").store(0, b"after")
            outcome.append("answered")
        except PoolError as exc:
            outcome.append(exc.status)
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(10)
    assert outcome == [P.Status.SERVICE_GONE], outcome
    monkeypatch.undo()
    b = attach(service, "b", ["t"])  # the service goes on
    assert b.tenant("t").load(0, 6) == b"before"
    a.close(), b.close()


def test_ring_tails_wrap_at_two_to_the_64(service):
    """A host that left its submission tail at 2**64 - 1 (the service skips the leap)
    submits on: the tail wraps to 0, as a u64 counter does, and the entry is served."""
    from cxlhm.pool import rings as R
    a = attach(service, "a", ["t"])
    a.rings.header[R.SQ_TAIL] = 2**64 - 1
    os.eventfd_write(a.rings.submitted, 1)
    ring = next(h for h in service._hosts.values() if h.name == "a").rings
    assert wait_until(lambda: ring.consumed == 2**64 - 1)
    a.tenant("t").store(0, b"wrapped")
    assert int(a.rings.header[R.SQ_TAIL]) == 0 and ring.consumed == 0
    assert a.tenant("t").load(0, 7) == b"wrapped"
    a.close()


def test_a_layout_with_every_host_id_taken_still_loads(tmp_path):
    """In an open pool any key holder names itself: attaching under new names until the
    65535 host ids are taken makes pool.json several MiB, and a restart must still read it."""
    from cxlhm.pool.layout import Layout
    path = tmp_path / "pool.json"
    layout = Layout(1 << 21, BLOCK, PARTITION, path)
    layout.hosts = {f"{i:064d}": i + 1 for i in range(0xFFFF)}
    layout.save()
    assert path.stat().st_size > 4 << 20
    again = Layout(1 << 21, BLOCK, PARTITION, path)
    assert len(again.hosts) == 0xFFFF
    with pytest.raises(LayoutError, match="recorded 65535 host names, its max_host_names"):
        again.host_id("one-more")
