"""The KV store: sessions and their hints, prefix / sparse lookup, allocate + commit,
eviction, persistence across reopen (clean and unclean), tenant isolation on every
path, and the real mailbox path driving hymcache firmware."""
import os
import threading

import numpy as np
import pytest

from device_parts import open_parts
from host_runtime.kvstore import (IndexCorrupt, KVStore, NullHints, PutStatus, RecordingHints, Session)

KIB = 1024
BLOCK = 4 * KIB
CHUNK = 2 * BLOCK


def chunk(i, size=CHUNK):
    return np.full(size, i % 251, np.uint8)


@pytest.fixture
def image(tmp_path):
    return str(tmp_path / "kv.img")


@pytest.fixture
def dev_factory(image):
    opened = []

    def parts(**over):
        """(handle, device): for the tests that reach the device itself."""
        cfg = {"capacity": 1 << 22, "block_size": BLOCK, "dram_bytes": 4 * BLOCK,
               "backend": {"path": image}, **over}
        got = open_parts(cfg)
        opened.append(got.handle)
        return got

    def factory(**over):
        return parts(**over).handle

    factory.parts = parts
    yield factory
    for h in opened:
        if not h.closed:
            h.close()


@pytest.fixture
def store(dev_factory):
    rec = RecordingHints()
    s = KVStore(dev_factory(), hints=rec)
    s.rec = rec
    yield s
    s.close()


# ---------------------------------------------------------------- sessions and hints
def test_session_lifecycle_emits_hints_in_order(store):
    alice = store.tenant("alice")
    keys = alice.prefix_keys(np.arange(64), 16)
    s = alice.open_session("chat-1")
    assert store.rec.calls == []  # opening says nothing yet
    for i, k in enumerate(keys[:3]):
        assert s.append(k, chunk(i)) is PutStatus.STORED
    extents = [alice.extent_of(k) for k in keys[:3]]
    assert store.rec.calls == [("append", s.id, [e]) for e in extents]
    s.pause(expected_pause_ns=5_000_000)
    assert s.resume(keys) == 3
    assert s.next_prefix(keys[:2], deadline_ns=1000) == 2
    s.end()
    names = store.rec.names()
    assert names == ["append"] * 3 + ["session_pause", "session_resume", "next_prefix", "session_end"]
    _, sid, pause_ns = store.rec.calls[3]
    assert sid == [s.id] and pause_ns == 5_000_000
    # resume: the stored prefix, in order, merged into one range (the chunks are adjacent)
    assert store.rec.calls[4] == ("session_resume", s.id, [(extents[0][0], 3 * CHUNK)])
    assert store.rec.calls[6] == ("session_end", [s.id])
    with pytest.raises(ValueError, match="ended"):
        s.append(keys[3], chunk(3))


def test_resume_hints_only_the_leading_stored_chunks(store):
    t = store.tenant("t")
    keys = t.prefix_keys(np.arange(80), 16)
    for i in (0, 1, 3, 4):
        t.put_from(keys[i], chunk(i))
    s = t.open_session()
    assert s.resume(keys) == 2
    _, sid, ranges = store.rec.calls[-1]
    assert sid == s.id and sum(n for _, n in ranges) == 2 * CHUNK
    assert ranges[0][0] == t.extent_of(keys[0])[0]


def test_session_ids_are_distinct_and_accesses_are_tagged(store, monkeypatch):
    t = store.tenant("t")
    a, b = t.open_session(), t.open_session()
    assert a.id != b.id and a.id > 0
    seen = []
    real = store.handle.write_from
    monkeypatch.setattr(store.handle, "write_from", lambda hpa, buf, session=0: (seen.append(session), real(hpa, buf, session=session))[1])
    a.append(b"k1", chunk(1))
    assert seen == [a.id]


# ---------------------------------------------------------------- lookups and data
def test_prefix_and_sparse_lookup(store):
    t = store.tenant("t")
    keys = t.prefix_keys(np.arange(96), 16)
    for i in (0, 1, 2, 4):
        t.put_from(keys[i], chunk(i))
    assert t.lookup_prefix(keys) == 3
    assert t.lookup_sparse(keys).tolist() == [True, True, True, False, True, False]
    assert t.lookup_prefix([]) == 0 and t.lookup_sparse([]).shape == (0,)
    out = np.empty(CHUNK, np.uint8)
    assert t.get_into(keys[4], out) == CHUNK and (out == 4).all()
    assert t.get_into(keys[3], out) is None


def test_scatter_gather_and_contiguous_batch(store):
    t = store.tenant("t")
    parts = [np.full(100, 1, np.uint8), np.full(CHUNK - 100, 2, np.uint8)]
    assert t.put_from(b"g", parts) is PutStatus.STORED
    a, b = np.empty(CHUNK - 50, np.uint8), np.empty(50, np.uint8)
    assert t.get_into(b"g", [a, b]) == CHUNK
    assert (a[:100] == 1).all() and (a[100:] == 2).all() and (b == 2).all()
    for i in range(3):
        t.put_from(bytes([i]), chunk(i))
    out = np.zeros(4 * CHUNK, np.uint8)
    assert t.get_many_into([b"\0", b"\1", b"\2", b"missing"], out) == 3
    assert [int(out[i * CHUNK]) for i in range(4)] == [0, 1, 2, 0]


def test_allocate_write_in_place_then_commit(store):
    t = store.tenant("t")
    res = t.reserve(b"k", CHUNK)
    res.write(np.full(BLOCK, 7, np.uint8), 0)
    res.write(np.full(BLOCK, 9, np.uint8), BLOCK)
    assert not t.contains(b"k")  # invisible until published
    assert t.reserve(b"k", CHUNK) is PutStatus.IN_FLIGHT
    with pytest.raises(ValueError, match="leaves"):
        res.write(np.zeros(2, np.uint8), CHUNK - 1)
    assert res.commit()
    out = np.empty(CHUNK, np.uint8)
    t.get_into(b"k", out)
    assert (out[:BLOCK] == 7).all() and (out[BLOCK:] == 9).all()
    assert t.reserve(b"k", CHUNK) is PutStatus.EXISTS
    used = store.stats()["used_bytes"]
    res2 = t.reserve(b"other", CHUNK)
    res2.abort()
    assert store.stats()["used_bytes"] == used and not t.contains(b"other")


def test_wrong_sizes_are_rejected(store):
    t = store.tenant("t")
    t.put_from(b"k", chunk(1))
    with pytest.raises(ValueError, match="holds"):
        t.get_into(b"k", np.empty(CHUNK - 1, np.uint8))
    with pytest.raises(ValueError, match="holds"):
        t.get_into(b"k", np.empty(CHUNK + 1, np.uint8))
    assert t.get_into(b"k", np.empty(CHUNK + 1, np.uint8), exact=False) == CHUNK
    with pytest.raises(ValueError):
        t.put_from(b"empty", np.empty(0, np.uint8))
    with pytest.raises(ValueError, match="does not fit"):
        t.reserve(b"huge", store.capacity + 1)
    fixed = store.tenant("fixed", chunk_bytes=CHUNK)
    with pytest.raises(ValueError, match="stores 8192-byte chunks"):
        fixed.put_from(b"k", np.zeros(100, np.uint8))


def test_concurrent_puts_of_one_key_store_it_once(store):
    t = store.tenant("t")
    results, barrier = [], threading.Barrier(8)

    def put(i):
        barrier.wait()
        results.append(t.put_from(b"same", chunk(42)))

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results.count(PutStatus.STORED) == 1
    assert all(r in (PutStatus.STORED, PutStatus.EXISTS, PutStatus.IN_FLIGHT) for r in results)
    assert store.stats()["entries"] == 1 and store.stats()["used_bytes"] == CHUNK
    out = np.empty(CHUNK, np.uint8)
    assert t.get_into(b"same", out) == CHUNK and (out == 42).all()


def test_media_error_turns_into_a_miss(store, monkeypatch):
    t = store.tenant("t")
    t.put_from(b"k", chunk(1))

    def broken(*a, **kw):
        raise OSError(5, "injected media error")
    monkeypatch.setattr(store.handle, "read_view", broken)  # the store's read path
    assert t.get_into(b"k", np.empty(CHUNK, np.uint8)) is None
    monkeypatch.undo()
    assert not t.contains(b"k") and store.stats()["media_errors"] == 1
    assert store.stats()["used_bytes"] == 0  # the extent was freed


def test_hint_failures_are_counted_never_raised(dev_factory):
    class Broken(NullHints):
        def append(self, session, ranges):
            raise RuntimeError("mailbox down")
    s = KVStore(dev_factory(), hints=Broken())
    t = s.tenant("t")
    sess = t.open_session()
    assert sess.append(b"k", chunk(1)) is PutStatus.STORED
    assert s.stats()["hint_errors"] == 1
    s.close()


# ---------------------------------------------------------------- eviction
def small_store(dev_factory, chunks, **kw):
    return KVStore(dev_factory(), hints=RecordingHints(), window=(0, chunks * CHUNK), **kw)


def test_eviction_takes_ended_then_paused_then_active(dev_factory):
    s = small_store(dev_factory, 9)
    t = s.tenant("t")
    active, paused, ended = t.open_session("a"), t.open_session("p"), t.open_session("e")
    for sess, tag in ((ended, b"e"), (paused, b"p"), (active, b"a")):  # ended ones are the newest...
        for i in range(3):
            sess.append(tag + bytes([i]), chunk(i))
    ended.end()
    paused.pause()
    for i in range(3):  # ... yet they go first
        assert t.put_from(b"n" + bytes([i]), chunk(i)) is PutStatus.STORED
    assert not any(t.contains(b"e" + bytes([i])) for i in range(3))
    assert all(t.contains(tag + bytes([i])) for tag in (b"p", b"a") for i in range(3))
    for i in range(3):
        t.put_from(b"m" + bytes([i]), chunk(i))
    # then the cold new chunks and the paused session's, before the active session's
    assert all(t.contains(b"a" + bytes([i])) for i in range(3))
    assert s.stats()["evictions"] == 6
    assert list(t.evicted_keys)[:3] == [b"e\0", b"e\1", b"e\2"]
    s.close()


def test_pinned_and_leased_chunks_are_never_evicted(dev_factory):
    s = small_store(dev_factory, 4)
    t = s.tenant("t", max_pinned_bytes=2 * CHUNK)
    for i in range(4):
        t.put_from(bytes([i]), chunk(i))
    assert t.pin([b"\0", b"\1", b"\2"]) == 2  # the third is over the pin budget
    s.tenant("t", max_pinned_bytes=3 * CHUNK)  # room for a prefetch's protection too
    ticket = t.prefetch([b"\2"])
    assert ticket.ready == 1 and ticket.protected == 1
    assert t.put_from(b"new", chunk(9)) is PutStatus.STORED  # evicts \3, the only candidate
    assert [t.contains(bytes([i])) for i in range(4)] == [True, True, True, False]
    assert t.put_from(b"new2", chunk(9)) is PutStatus.STORED  # evicts "new" (not \2: leased)
    assert t.contains(b"\2") and not t.contains(b"new")
    s.wait(ticket)
    t.unpin([b"\0"])
    assert t.put_from(b"new3", chunk(9)) is PutStatus.STORED
    assert t.contains(b"\1")  # still pinned
    pins = [c for c in s.hints.calls if c[0] in ("pin", "unpin")]
    assert [c[0] for c in pins] == ["pin", "unpin"]
    s.close()


def test_no_space_when_nothing_is_evictable(dev_factory):
    s = small_store(dev_factory, 2)
    t = s.tenant("t")
    t.put_from(b"a", chunk(1)), t.put_from(b"b", chunk(2))
    t.pin([b"a", b"b"])
    assert t.put_from(b"c", chunk(3)) is PutStatus.NO_SPACE
    assert t.contains(b"a") and t.contains(b"b")
    s.close()


def test_mixed_sizes_evict_until_a_large_enough_hole(dev_factory):
    s = small_store(dev_factory, 8)
    t = s.tenant("t")
    for i in range(16):  # half-chunk entries (one block each)
        t.put_from(bytes([i]), chunk(i, BLOCK))
    assert t.put_from(b"big", chunk(0, 3 * CHUNK)) is PutStatus.STORED
    out = np.empty(3 * CHUNK, np.uint8)
    assert t.get_into(b"big", out) == 3 * CHUNK
    assert s.alloc.free_extents <= s.alloc.live_extents + 1
    s.close()


# ---------------------------------------------------------------- tenants
def test_tenant_isolation_on_every_path(store):
    a, b = store.tenant("a"), store.tenant("b")
    tokens = np.arange(64)
    ka, kb = a.prefix_keys(tokens, 16), b.prefix_keys(tokens, 16)
    assert not set(ka) & set(kb)  # identical tokens, different keys
    sa = a.open_session("shared-name")
    for i, k in enumerate(ka):
        sa.append(k, chunk(i))
    out = np.empty(CHUNK, np.uint8)
    # hit / probe: even with a's raw key bytes, b sees nothing
    assert b.lookup_prefix(ka) == 0 and not b.lookup_sparse(ka).any()
    assert b.get_into(ka[0], out) is None and not b.contains(ka[0])
    assert b.size_of(ka[0]) is None and b.extent_of(ka[0]) is None and b.keys() == []
    # hint: b's sessions and prefetches only ever reach b's extents
    sb = b.open_session("shared-name")  # same name, separate namespace
    before = len(store.rec.calls)
    assert sb.resume(ka) == 0 and sb.next_prefix(ka) == 0
    assert b.prefetch(ka).ready == 0
    assert all(not ranges for _, _, ranges in store.rec.calls[before:before + 1])
    assert not any(c[0] == "next_prefix" for c in store.rec.calls[before:])
    # pin / evict / remove: b's calls change nothing of a's
    assert b.pin(ka) == 0 and b.unpin(ka) == 0 and not b.remove(ka[0])
    assert a.lookup_prefix(ka) == 4 and a.stats()["pinned_bytes"] == 0
    # end: b cannot reach a's session by name, nor use a's session object
    assert b.session("shared-name") is sb and a.session("shared-name") is sa
    sb.end()
    assert sa.state == Session.ACTIVE
    with pytest.raises(PermissionError):
        b.get_into(ka[0], out, session=sa)
    with pytest.raises(PermissionError):
        b.put_from(b"x", chunk(0), session=sa)
    with pytest.raises(PermissionError):
        b.prefetch(kb, session=sa)
    # b's data of the same name and key bytes is separate
    assert b.put_from(ka[0], chunk(99)) is PutStatus.STORED
    a.get_into(ka[0], out)
    assert (out == 0).all()
    assert a.stats()["entries"] == 4 and b.stats()["entries"] == 1


def test_quota_makes_a_tenant_evict_only_its_own(dev_factory):
    s = small_store(dev_factory, 8)
    a = s.tenant("a", quota_bytes=3 * CHUNK)
    b = s.tenant("b")
    for i in range(3):
        b.put_from(bytes([i]), chunk(i))
    for i in range(10):
        assert a.put_from(bytes([i]), chunk(i)) is PutStatus.STORED
    assert all(b.contains(bytes([i])) for i in range(3))
    assert a.stats()["used_bytes"] == 3 * CHUNK and b.stats()["evicted"] == 0
    s.close()


def test_reservation_protects_a_tenant_from_global_eviction(dev_factory):
    s = small_store(dev_factory, 6)
    a = s.tenant("a")
    b = s.tenant("b", reserved_bytes=2 * CHUNK)
    for i in range(2):
        b.put_from(bytes([i]), chunk(i))
    for i in range(20):  # a floods the store
        assert a.put_from(bytes([i]), chunk(i)) is PutStatus.STORED
    assert b.contains(b"\0") and b.contains(b"\1")
    assert a.stats()["entries"] == 4
    s.close()


def test_evictions_report_only_the_requesters_own_keys(dev_factory):
    s = small_store(dev_factory, 2)
    a, b = s.tenant("a"), s.tenant("b")
    b.put_from(b"b0", chunk(0)), b.put_from(b"b1", chunk(1))
    res = a.reserve(b"a0", CHUNK)
    assert res.evicted == []  # b's chunk made room, but a is not told which
    res.commit()
    assert list(b.evicted_keys) == [b"b0"]


# ---------------------------------------------------------------- persistence
def test_index_survives_a_clean_restart(dev_factory, image):
    h = dev_factory()
    s = KVStore(h)
    t = s.tenant("alice")
    keys = t.prefix_keys(np.arange(100), 16)
    for i, k in enumerate(keys):
        t.put_from(k, chunk(i))
    t.remove(keys[5])
    s.close()
    h.close()
    assert os.path.exists(image + ".kvindex")
    s2 = KVStore(dev_factory())
    t2 = s2.tenant("alice")
    assert t2.prefix_keys(np.arange(100), 16) == keys  # the salt persisted
    assert t2.lookup_prefix(keys) == 5 and t2.lookup_sparse(keys).sum() == 5
    out = np.empty(CHUNK, np.uint8)
    assert t2.get_into(keys[4], out) == CHUNK and (out == 4).all()
    assert t2.put_from(b"new", chunk(7)) is PutStatus.STORED  # the allocator knows what is used
    for k in keys[:5]:
        t2.get_into(k, out)
    assert s2.stats()["used_bytes"] == 6 * CHUNK
    s2.close()


def test_index_survives_a_clean_restart_in_window_mode(dev_factory, image):
    """A window device offers no block checksums: its chunks are kept without a
    fingerprint, and a reopen must not try to take one."""
    from cxlhm.window import probe
    if probe() is not None:
        pytest.skip(f"userfaultfd window unavailable: {probe()}")
    h = dev_factory(mode="window")
    s = KVStore(h)
    t = s.tenant("alice")
    keys = t.prefix_keys(np.arange(64), 16)
    for i, k in enumerate(keys):
        t.put_from(k, chunk(i))
    s.close()
    h.close()
    s2 = KVStore(dev_factory(mode="window"))
    t2 = s2.tenant("alice")
    out = np.empty(CHUNK, np.uint8)
    assert t2.lookup_prefix(keys) == 4
    for i, k in enumerate(keys):
        assert t2.get_into(k, out) == CHUNK and (out == i % 251).all()
    s2.close()


def crash(store, handle, device):
    """Simulate the host dying: no store close, the device image marked unclean."""
    os.close(store._journal.fd)
    store._journal.fd = -1
    handle.close()
    device._write_metadata(clean=False)


def test_unclean_shutdown_drops_chunks_not_flushed(dev_factory):
    h, device = dev_factory.parts()
    s = KVStore(h)
    t = s.tenant("t")
    t.put_from(b"durable", chunk(1))
    t.put_from(b"removed", chunk(2))
    s.flush()
    t.remove(b"removed")         # a delete always survives (dropping it could expose reused bytes)
    t.put_from(b"late", chunk(3))  # never flushed: its bytes may not be on the SSD
    crash(s, h, device)
    s2 = KVStore(dev_factory())
    t2 = s2.tenant("t")
    assert t2.contains(b"durable") and not t2.contains(b"removed") and not t2.contains(b"late")
    assert s2.stats()["dropped_on_open"] == 1
    out = np.empty(CHUNK, np.uint8)
    assert t2.get_into(b"durable", out) == CHUNK and (out == 1).all()
    s2.close()


def test_torn_journal_tail_is_ignored(dev_factory, image):
    h = dev_factory()
    s = KVStore(h)
    s.tenant("t").put_from(b"k", chunk(1))
    s.close()
    h.close()
    with open(image + ".kvindex", "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")  # a record cut short by a crash
    s2 = KVStore(dev_factory())
    assert s2.tenant("t").contains(b"k")
    s2.close()


def test_index_for_another_window_is_a_clear_error(dev_factory, image):
    h = dev_factory()
    KVStore(h).close()
    with pytest.raises(IndexCorrupt, match="capacity"):
        KVStore(h, window=(0, 1 << 20))
    with open(image + ".kvindex", "wb") as f:
        f.write(b"\x05\x00\x00\x00\x00\x00\x00\x00hello")
    with pytest.raises(IndexCorrupt, match="not a cxlhm KV index"):
        KVStore(h)


def test_one_index_one_store(dev_factory):
    h = dev_factory()
    s = KVStore(h)
    with pytest.raises(RuntimeError, match="in use by another KVStore"):
        KVStore(h)
    s.close()
    KVStore(h).close()


def test_journal_compaction_keeps_the_index(dev_factory):
    h = dev_factory()
    s = KVStore(h, compact_factor=1)
    t = s.tenant("t")
    for round_ in range(6):
        for i in range(400):
            t.put_from(bytes([i % 256, i // 256]), chunk(i, BLOCK))
        for i in range(0, 400, 2):
            t.remove(bytes([i % 256, i // 256]))
    assert s.counters["compactions"] >= 2
    keys = t.keys()
    s.close()
    t2 = KVStore(h).tenant("t")
    assert sorted(t2.keys()) == sorted(keys)


# ---------------------------------------------------------------- the real hint path
def test_mailbox_hints_drive_hymcache_prefetch(dev_factory):
    h = dev_factory(firmware={"policy": "hymcache", "background": "manual"}, dram_bytes=16 * BLOCK)
    client = h.mailbox  # the device's own mailbox, started now (closed with the handle)
    client.timeout = 30
    try:
        s = KVStore(h, hints=h.hint_sink("mailbox"))
        t = s.tenant("t")
        keys = t.prefix_keys(np.arange(96), 16)
        sess = t.open_session()
        for i, k in enumerate(keys):
            sess.append(k, chunk(i))
        sess.pause(10_000_000_000)
        other = s.tenant("other")
        for i in range(40):  # other traffic pushes the session's chunks to the SSD
            other.put_from(bytes([i]), chunk(i))
        s.flush()
        while h.run_background():
            pass
        before = h.stats()
        assert sess.resume(keys) == 6
        client.wait_background()
        while h.run_background():
            pass
        after = h.stats()
        assert after["prefetch_issued"] > before["prefetch_issued"]
        out = np.empty(CHUNK, np.uint8)
        for i, k in enumerate(keys):
            assert sess.get_into(k, out) == CHUNK and (out == i).all()
        assert h.stats()["prefetch_useful"] > before["prefetch_useful"]
        sess.end()
        s.close()
    finally:
        h.close()


def test_device_hints_pin_the_extents_blocks(dev_factory):
    from cxlhm import blocktable as btm
    h, device = dev_factory.parts(dram_bytes=8 * BLOCK)
    s = KVStore(h, hints=h.hint_sink("direct"))
    t = s.tenant("t")
    t.put_from(b"k", chunk(1))
    assert t.pin([b"k"]) == 1
    assert int(device.bt.scalars[btm.N_PINNED]) == CHUNK // BLOCK
    t.unpin([b"k"])
    assert int(device.bt.scalars[btm.N_PINNED]) == 0
    s.close()


# ---------------------------------------------------------------- regressions: wrong bytes, leaks, lost chunks
def test_a_chunk_kept_by_a_reopen_after_a_device_only_open_survives_the_next_crash(dev_factory):
    """crash -> the device opened (and cleanly closed) on its own -> the store reopens,
    flushes, closes cleanly -> crash: every chunk the clean close kept is still kept."""
    h, device = dev_factory.parts()
    s = KVStore(h)
    t = s.tenant("t")
    t.put_from(b"durable", chunk(1))
    s.flush()
    t.put_from(b"late", chunk(2))
    h.flush()  # its bytes reached the SSD, but the store never recorded that
    crash(s, h, device)
    dev_factory().close()  # e.g. `cxlhm mailbox health --set backend.path=IMG`: clears the device's mark
    s2 = KVStore(dev_factory())
    out = np.empty(CHUNK, np.uint8)
    kept = {k for k in (b"durable", b"late") if s2.tenant("t").get_into(k, out) == CHUNK}
    assert b"durable" in kept
    s2.flush()
    s2.close()
    s2.handle.close()
    h3, device3 = dev_factory.parts()
    s3 = KVStore(h3)
    assert set(s3.tenant("t").keys()) == kept
    crash(s3, h3, device3)
    s4 = KVStore(dev_factory())
    t4 = s4.tenant("t")
    assert set(t4.keys()) == kept and s4.stats()["failed_verification"] == 0
    for k in kept:
        assert t4.get_into(k, out) == CHUNK and (out == (1 if k == b"durable" else 2)).all()
    s4.close()


def test_a_reservation_never_reads_bytes_it_did_not_write(dev_factory):
    s = small_store(dev_factory, 1)  # one extent: every chunk reuses it
    bob, alice = s.tenant("bob"), s.tenant("alice")
    bob.put_from(b"secret", np.full(CHUNK, 0xBB, np.uint8))
    bob.remove(b"secret")
    res = alice.reserve(b"k", CHUNK)
    out = np.full(CHUNK, 1, np.uint8)
    assert res.read_into(out) == CHUNK and (out == 0).all()  # not bob's bytes
    res.write(np.full(BLOCK, 7, np.uint8), BLOCK)
    res.read_into(out)
    assert (out[:BLOCK] == 0).all() and (out[BLOCK:] == 7).all()
    part = np.empty(BLOCK, np.uint8)
    res.read_into(part, BLOCK // 2)
    assert (part[:BLOCK // 2] == 0).all() and (part[BLOCK // 2:] == 7).all()
    assert res.commit()
    alice.get_into(b"k", out)  # the unwritten half of a committed chunk is zeros too
    assert (out[:BLOCK] == 0).all() and (out[BLOCK:] == 7).all()
    s.close()


@pytest.mark.parametrize("finish", ["abort", "commit-then-remove"])
def test_a_finished_reservation_cannot_read_the_extent_again(dev_factory, finish):
    s = small_store(dev_factory, 1)
    alice, bob = s.tenant("alice"), s.tenant("bob")
    res = alice.reserve(b"k", CHUNK)
    res.write(chunk(1))
    if finish == "abort":
        res.abort()
    else:
        res.commit()
        alice.remove(b"k")
    bob.put_from(b"bobs", np.full(CHUNK, 0xBB, np.uint8))  # lands in the same extent
    with pytest.raises(ValueError, match="already committed or aborted"):
        res.read_into(np.empty(CHUNK, np.uint8))
    with pytest.raises(ValueError, match="already committed or aborted"):
        res.write(chunk(3))
    out = np.empty(CHUNK, np.uint8)
    assert bob.get_into(b"bobs", out) == CHUNK and (out == 0xBB).all()
    s.close()


def test_a_tenant_with_a_secret_opens_only_with_it(dev_factory, image):
    h = dev_factory()
    s = KVStore(h)
    secret = os.urandom(32)
    alice = s.tenant("alice", secret=secret)
    keys = alice.prefix_keys(np.arange(64), 16)
    alice.put_from(keys[0], chunk(5))
    for who in ({}, {"secret": os.urandom(32)}, {"salt": b"alice"}):
        with pytest.raises(PermissionError):
            s.tenant("alice", **who)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        s.tenant("carol", secret=b"short")
    assert s.tenant("alice", secret=secret) is alice
    named = s.tenant("bob")
    with pytest.raises(PermissionError):
        s.tenant("bob", secret=os.urandom(32))  # a name-identified tenant is not taken over with a secret
    assert named.prefix_keys(np.arange(64), 16) != keys
    s.close()
    h.close()
    assert secret not in open(image + ".kvindex", "rb").read()  # only a keyed hash of it is stored
    s2 = KVStore(dev_factory())
    with pytest.raises(PermissionError):
        s2.tenant("alice")
    alice2 = s2.tenant("alice", secret=secret)
    assert alice2.prefix_keys(np.arange(64), 16) == keys  # same secret, same keys across restarts
    out = np.empty(CHUNK, np.uint8)
    assert alice2.get_into(keys[0], out) == CHUNK and (out == 5).all()
    s2.close()


def test_a_prefetch_never_waited_for_stays_within_the_pin_budget_and_is_released(dev_factory):
    import gc
    s = small_store(dev_factory, 2)
    t = s.tenant("t", max_pinned_bytes=0)
    t.put_from(b"a", chunk(1)), t.put_from(b"b", chunk(2))
    ticket = t.prefetch([b"a", b"b"])
    assert ticket.ready == 2 and ticket.protected == 0  # hinted, but a zero budget protects nothing
    assert t.put_from(b"c", chunk(3)) is PutStatus.STORED
    s.tenant("t", max_pinned_bytes=CHUNK)
    ticket = t.prefetch([b"b", b"c"])
    assert ticket.protected == 1 and t.stats()["protected_bytes"] == CHUNK
    assert t.put_from(b"d", chunk(4)) is PutStatus.STORED and t.contains(b"b")  # c went, b is protected
    used = s.stats()["used_bytes"]
    assert t.remove(b"b")  # removing a prefetched chunk frees its extent at once
    assert s.stats()["used_bytes"] == used - CHUNK
    del ticket
    gc.collect()
    assert t.stats()["protected_bytes"] == 0  # a dropped ticket ends its protection
    t2 = t.prefetch([b"d"])
    assert s.wait(t2) == 1 and t2.done and t.stats()["protected_bytes"] == 0
    s.check()
    s.close()


# ---------------------------------------------------------------- pin leases
class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def leased_store(dev_factory, chunks, **tenant_limits):
    s = small_store(dev_factory, chunks)
    s._leases.clock = clock = FakeClock()
    t = s.tenant("t", **tenant_limits)
    return s, t, clock


def test_a_lease_keeps_chunks_until_its_deadline_then_a_put_releases_it(dev_factory):
    s, t, clock = leased_store(dev_factory, 2)
    t.put_from(b"a", chunk(1)), t.put_from(b"b", chunk(2))
    lease = t.lease_pins([b"a", b"b", b"missing"], 30.0, lease_id="lookup-1")
    assert lease.pinned == 2 and t.stats()["pinned_bytes"] == 2 * CHUNK
    assert t.put_from(b"c", chunk(3)) is PutStatus.NO_SPACE  # both pinned, nothing to evict
    clock.now += 29.9
    assert t.put_from(b"c", chunk(3)) is PutStatus.NO_SPACE
    clock.now += 0.2  # past the deadline: the put itself releases the lease, then evicts
    assert t.put_from(b"c", chunk(3)) is PutStatus.STORED
    assert t.stats()["pinned_bytes"] == 0 and t.counters["leases_expired"] == 1
    assert lease.released and lease.release() == 0 and t.release_pins("lookup-1") == 0
    calls = [c[0] for c in s.hints.calls if c[0] in ("pin", "unpin")]
    assert calls == ["pin", "unpin"]
    s.check()
    s.close()


def test_a_lease_released_by_id_or_replaced_by_the_same_lookup(dev_factory):
    s, t, clock = leased_store(dev_factory, 4)
    for i in range(4):
        t.put_from(bytes([i]), chunk(i))
    t.lease_pins([b"\0", b"\1"], 10, lease_id="L")
    again = t.lease_pins([b"\2"], 10, lease_id="L")  # the lookup again: the old pins go
    assert again.pinned == 1 and t.stats()["pinned_bytes"] == CHUNK
    other = t.lease_pins([b"\2", b"\3"], 10, lease_id="M")  # nests on \2
    assert t.release_pins("L") == 1 and t.stats()["pinned_bytes"] == 2 * CHUNK  # \2 still held by M
    assert other.release() == 2 and t.stats()["pinned_bytes"] == 0
    assert t.release_pins("nobody") == 0
    s.close()


def test_leases_and_plain_pins_share_the_pin_budget_and_nest(dev_factory):
    s, t, clock = leased_store(dev_factory, 4, max_pinned_bytes=2 * CHUNK)
    for i in range(4):
        t.put_from(bytes([i]), chunk(i))
    assert t.pin([b"\0"]) == 1
    lease = t.lease_pins([b"\0", b"\1", b"\2"], 5, lease_id="L")
    assert lease.pinned == 2  # \0 nests (no budget), \1 fits, \2 is over the budget
    clock.now += 6
    t.put_from(b"x", chunk(9))  # any put releases expired leases
    assert lease.released and t.stats()["pinned_bytes"] == CHUNK  # the plain pin on \0 stays
    assert t.lease_pins([b"\1", b"\2"], 5).pinned == 1  # the budget is back: \1 fits, \2 does not
    s.close()


def test_a_lease_on_a_chunk_removed_and_stored_again_never_unpins_the_new_one(dev_factory):
    s, t, clock = leased_store(dev_factory, 4)
    t.put_from(b"k", chunk(1))
    lease = t.lease_pins([b"k"], 5)
    t.remove(b"k")
    assert t.stats()["pinned_bytes"] == 0
    t.put_from(b"k", chunk(2))
    t.pin([b"k"])
    assert lease.release() == 0 and t.stats()["pinned_bytes"] == CHUNK
    s.check()
    s.close()


def test_a_plain_unpin_never_takes_a_leases_pin_nor_a_lease_a_plain_pin(dev_factory):
    s, t, clock = leased_store(dev_factory, 4)
    t.put_from(b"k", chunk(1))
    lease = t.lease_pins([b"k"], 5)
    assert t.unpin([b"k"]) == 0  # pinned by the lease alone: nothing of unpin()'s to take
    assert t.stats()["pinned_bytes"] == CHUNK
    assert t.pin([b"k"]) == 1
    assert lease.release() == 1  # the lease's own pin ends ...
    assert t.stats()["pinned_bytes"] == CHUNK  # ... the plain one stays
    assert t.unpin([b"k"]) == 1 and t.unpin([b"k"]) == 0
    assert t.stats()["pinned_bytes"] == 0
    s.check()
    s.close()


def test_an_idle_store_releases_expired_leases_by_itself(dev_factory):
    import time
    s = small_store(dev_factory, 4)
    t = s.tenant("t")
    t.put_from(b"k", chunk(1))
    lease = t.lease_pins([b"k"], 0.05)
    deadline = time.monotonic() + 30  # generous: the timer thread may be slow to run under load
    while not lease.released and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.released and t.stats()["pinned_bytes"] == 0 and t.counters["leases_expired"] == 1
    s.close()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), 1e9, "5", True])
def test_a_lease_duration_out_of_range_is_a_clear_error(dev_factory, bad):
    s = small_store(dev_factory, 2)
    with pytest.raises(ValueError, match="lease"):
        s.tenant("t").lease_pins([b"k"], bad)
    s.close()


def test_pins_and_leases_against_a_model(dev_factory):
    """Plain pins, leases, releases, expiry, removals and puts in any order: every chunk
    is pinned exactly as often as its plain pins plus the live leases holding it, pinned
    bytes add up and stay within the budget, and pinned chunks are never evicted."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    keys = [bytes([i]) for i in range(6)]
    op = st.one_of(
        st.tuples(st.just("put"), st.sampled_from(keys)),
        st.tuples(st.just("remove"), st.sampled_from(keys)),
        st.tuples(st.just("pin"), st.sampled_from(keys)),
        st.tuples(st.just("unpin"), st.sampled_from(keys)),
        st.tuples(st.just("lease"), st.lists(st.sampled_from(keys), max_size=3), st.sampled_from(["A", "B", None]),
                  st.sampled_from([1.0, 5.0])),
        st.tuples(st.just("release"), st.sampled_from(["A", "B"])),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0, 6.0])),
    )

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(op, max_size=30))
    def run(ops):
        handle = dev_factory()  # a fresh image and index each example
        s = KVStore(handle, hints=RecordingHints(), window=(0, 4 * CHUNK), index_path=False)
        s._leases.clock = clock = FakeClock()
        t = s.tenant("t", max_pinned_bytes=2 * CHUNK)
        plain: dict[bytes, int] = {}   # key -> plain pins (model)
        leases: dict = {}              # id -> (lease object, keys it pinned, deadline)
        anonymous: list = []
        try:
            for o in ops:
                kind = o[0]
                if kind == "put":
                    t.put_from(o[1], chunk(o[1][0]))
                elif kind == "remove":
                    if t.remove(o[1]):
                        plain.pop(o[1], None)
                elif kind == "pin":
                    if t.pin([o[1]]):
                        plain[o[1]] = plain.get(o[1], 0) + 1
                elif kind == "unpin":
                    if t.unpin([o[1]]):
                        plain[o[1]] -= 1
                elif kind == "lease":
                    lease = t.lease_pins(o[1], o[3], lease_id=o[2])
                    (leases.__setitem__(o[2], lease) if o[2] is not None else anonymous.append(lease))
                elif kind == "release":
                    t.release_pins(o[1])
                else:
                    clock.now += o[1]
                    t.contains(keys[0])  # a probe never releases: only puts, gets, removes and pins do
                live = [lease for lease in [*leases.values(), *anonymous] if not lease.released]
                for key in keys:
                    entry = t.index.get(key)
                    want = 0 if entry is None else plain.get(key, 0) + sum(
                        e is entry for lease in live for e in lease.entries)
                    assert (entry.pins if entry is not None else 0) == want, (key, o)
                pinned = sum(s._extent_bytes(e) for e in t.index.values() if e.pins)
                assert t.pinned_bytes == pinned <= t.max_pinned_bytes
                for key, n in plain.items():
                    assert n == 0 or t.contains(key)  # a plainly pinned chunk is never evicted
            s.check()
        finally:
            s.close()
            handle.close()
    run()
