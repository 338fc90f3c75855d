"""The hymcache firmware: hinted prefix prefetch, write buffering, demotion, pins."""
import numpy as np
import pytest

from cxlhm.mailbox.hints import HintKind
from device_parts import open_parts

BLOCK = 4096
SLOTS = 16


@pytest.fixture
def open_dev(tmp_path):
    opened = []

    def parts(policy="hymcache", params=None, **extra):
        """(handle, device): white-box tests read the device's parts."""
        cfg = {"capacity": 1 << 22, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK,
               "backend": {"path": str(tmp_path / "ssd.img")},
               "firmware": {"policy": policy, "params": params or {}, "background": "manual"}, **extra}
        opened.append(open_parts(cfg))
        return opened[-1]

    def factory(*args, **kwargs):
        return parts(*args, **kwargs).handle

    factory.parts = parts
    yield factory
    for dev, _ in opened:
        dev.close()


def drain(dev):
    while dev.run_background():
        pass


def fill_and_evict_prefix(dev, session=7, prefix_blocks=6):
    """Session writes its prefix, then other traffic pushes it out of DRAM to the SSD."""
    prefix = np.arange(prefix_blocks * BLOCK, dtype=np.uint32).view(np.uint8)[: prefix_blocks * BLOCK]
    dev.store(0, prefix, session=session)
    for i in range(3 * SLOTS):
        dev.store((100 + i) * BLOCK, bytes([i % 256]) * BLOCK, session=99)
    drain(dev)
    dev.flush()
    return prefix


@pytest.mark.parametrize("policy", ["hymcache", "lru"])
def test_hinted_prefix_is_read_with_zero_foreground_ssd_reads(open_dev, policy):
    dev = open_dev(policy)
    prefix = fill_and_evict_prefix(dev)
    dev.hint(HintKind.SESSION_RESUME, 7, 0, 6)
    drain(dev)
    before = dev.stats()
    assert dev.load(0, prefix.size, session=7) == prefix.tobytes()
    after = dev.stats()
    foreground_misses = after["misses"] - before["misses"]
    if policy == "hymcache":
        assert foreground_misses == 0 and after["fill_reads"] == before["fill_reads"]
        assert after["prefetch_useful"] - before["prefetch_useful"] == 6
        assert after["prefetch_accuracy"] == 1.0
    else:  # LRU ignores the hint: every prefix block misses
        assert foreground_misses == 6


def test_appends_stay_in_dram_until_idle_then_reach_the_ssd(open_dev, tmp_path):
    dev = open_dev()
    dev.hint(HintKind.APPEND, 3, 10, 4)
    dev.store(10 * BLOCK, b"A" * (4 * BLOCK), session=3)
    assert dev.stats()["ssd_write_bytes"] == 0
    with open(tmp_path / "ssd.img", "rb") as f:
        f.seek(10 * BLOCK)
        assert f.read(4) == bytes(4)
    drain(dev)  # the device is idle: the buffer is written back
    stats = dev.stats()
    assert stats["bg_flushes"] == 4 and stats["dirty_blocks"] == 0
    with open(tmp_path / "ssd.img", "rb") as f:
        f.seek(10 * BLOCK)
        assert f.read(4 * BLOCK) == b"A" * (4 * BLOCK)


def test_write_buffer_drains_between_watermarks_without_idle_flush(open_dev):
    # buffer = 8 slots; above 6 dirty, drain down to 2
    dev = open_dev(params={"buffer_fraction": 0.5, "high_watermark": 0.75, "low_watermark": 0.25, "idle_flush": 0})
    for i in range(6):
        dev.store(i * BLOCK, b"x" * BLOCK)
    assert dev.run_background() == 0  # at the watermark, nothing to do
    dev.store(6 * BLOCK, b"x" * BLOCK)
    drain(dev)
    assert dev.stats()["dirty_blocks"] == 2
    assert dev.stats()["bg_flushes"] == 5


def test_clean_victims_first_so_foreground_misses_do_not_wait_for_write_backs(open_dev):
    dev = open_dev(params={"idle_flush": 0, "buffer_fraction": 1.0, "high_watermark": 1.0})
    for i in range(SLOTS // 2):
        dev.store(i * BLOCK, b"d" * BLOCK)  # dirty, older
    for i in range(SLOTS // 2):
        dev.load((50 + i) * BLOCK, 1)  # clean, newer
    dev.load(200 * BLOCK, 1)  # a miss: the oldest clean block goes, not a dirty one
    assert dev.stats()["writebacks"] == 0


def test_session_end_cancels_its_prefetches_and_demotes_its_blocks(open_dev):
    dev = open_dev()
    fill_and_evict_prefix(dev)
    dev.hint(HintKind.SESSION_RESUME, 7, 0, 6)
    dev.hint(HintKind.SESSION_END, 7, 0, 0)
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 0
    # demotion: an ended session's resident blocks are the first victims
    dev.load(300 * BLOCK, BLOCK, session=5)
    dev.load(301 * BLOCK, BLOCK, session=6)
    dev.hint(HintKind.SESSION_END, 5, 0, 0)
    for i in range(SLOTS - 2):
        dev.load((400 + i) * BLOCK, 1, session=8)
    before = dev.stats()["misses"]
    dev.load(301 * BLOCK, 1, session=6)  # session 6's block survived, session 5's did not
    assert dev.stats()["misses"] == before
    dev.load(300 * BLOCK, 1, session=5)
    assert dev.stats()["misses"] == before + 1


def test_prefetch_budget_is_never_exceeded(open_dev):
    dev = open_dev(params={"prefetch_budget": 0.25})  # 4 of 16 slots
    fill_and_evict_prefix(dev, prefix_blocks=12)
    dev.hint(HintKind.SESSION_RESUME, 7, 0, 12)
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 4
    dev.load(0, 2 * BLOCK, session=7)  # reading two frees budget for two more
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 6


def test_prefetches_past_their_deadline_are_dropped(open_dev):
    dev = open_dev(params={"fill_ns": 10**12})  # no read can meet a deadline 1 ms away
    fill_and_evict_prefix(dev)
    dev.hint(HintKind.NEXT_PREFIX, 7, 0, 6, 1_000_000)
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 0
    dev.hint(HintKind.NEXT_PREFIX, 7, 0, 6, 0)  # no deadline
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 6


@pytest.mark.parametrize("policy", ["hymcache", "lru"])
def test_pinned_blocks_are_never_evicted_and_pins_are_bounded(open_dev, policy):
    dev = open_dev(policy)
    dev.store(0, b"p" * (4 * BLOCK))
    dev.flush()  # clean, so hymcache's clean-first victim choice does not keep them anyway
    assert dev.hint(HintKind.PIN, 0, 0, 4)
    for i in range(4 * SLOTS):
        dev.load((100 + i) * BLOCK, 1)
    before = dev.stats()["misses"]
    assert dev.load(0, 4 * BLOCK) == b"p" * (4 * BLOCK)
    assert dev.stats()["misses"] == before
    assert not dev.hint(HintKind.PIN, 0, 50, SLOTS)  # would leave no slot for misses
    assert dev.hint(HintKind.UNPIN, 0, 0, 4)
    for i in range(4 * SLOTS):
        dev.load((100 + i) * BLOCK, 1)
    dev.load(0, 1)
    assert dev.stats()["misses"] == before + 4 * SLOTS + 1


def test_hymcache_loses_no_byte_under_heavy_eviction(open_dev):
    dev = open_dev()
    rng = np.random.default_rng(5)
    model = bytearray(1 << 20)
    for step in range(400):
        off = int(rng.integers(0, (1 << 20) - 3 * BLOCK))
        n = int(rng.integers(1, 3 * BLOCK))
        session = int(rng.integers(1, 5))
        kind = rng.random()
        if kind < 0.4:
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            dev.store(off, data, session=session)
            model[off:off + n] = data
        elif kind < 0.8:
            assert dev.load(off, n, session=session) == bytes(model[off:off + n])
        else:
            hint = [HintKind.SESSION_RESUME, HintKind.NEXT_PREFIX, HintKind.SESSION_END,
                    HintKind.SESSION_PAUSE, HintKind.APPEND][step % 5]
            dev.hint(hint, session, off // BLOCK, 3, 0)
            dev.run_background(int(rng.integers(1, 8)))
    dev.close()
    dev2 = open_dev()
    assert dev2.load(0, len(model)) == bytes(model)


def test_hints_through_the_mailbox_reach_the_firmware(open_dev):
    """The whole host path: HintClient -> mailbox registers -> firmware thread -> policy."""
    dev = open_dev()
    prefix = fill_and_evict_prefix(dev)
    receipt = dev.hint_sink("mailbox").session_resume(7, [(0, prefix.size)], wait=True)
    assert receipt is not None
    drain(dev)
    before = dev.stats()["misses"]
    assert dev.load(0, prefix.size, session=7) == prefix.tobytes()
    assert dev.stats()["misses"] == before
    assert dev.mailbox.identify()  # the standard commands answer on the same mailbox


def test_unpin_of_a_range_larger_than_dram_walks_dram_not_the_range(open_dev):
    dev, device = open_dev.parts("lru")
    dev.store(0, b"p" * (3 * BLOCK))
    assert dev.hint(HintKind.PIN, 0, 1, 2)
    assert device.bt.scalars[1] == 2  # N_PINNED
    assert dev.hint(HintKind.UNPIN, 0, 0, (1 << 22) // BLOCK)  # the whole window
    assert device.bt.scalars[1] == 0


# ---------------------------------------------------------------- prefetch pollution

def _resident(device, block):
    from cxlhm import blocktable as btm
    return btm.lookup(device.bt, block) >= 0


def fill_dram_clean(dev, first=100, session=1):
    """DRAM full of clean blocks first .. first + SLOTS - 1, read in that order (first is the LRU end)."""
    for i in range(SLOTS):
        dev.load((first + i) * BLOCK, 1, session=session)


@pytest.mark.parametrize("reread", [True, False])
@pytest.mark.parametrize("policy", ["hymcache", "lru"])
def test_pollution_counts_host_misses_on_blocks_a_prefetch_evicted(open_dev, policy, reread):
    dev, device = open_dev.parts(policy)
    fill_dram_clean(dev)
    if policy == "hymcache":  # the hinted prefetch evicts the LRU end, block 100
        dev.hint(HintKind.SESSION_RESUME, 7, 0, 1)
        drain(dev)
    else:  # the metric lives in the firmware, not the policy: a plain prefetch counts the same
        dev.prefetch(np.array([0]))
    assert dev.stats()["prefetch_issued"] == 1 and not _resident(device, 100)
    if reread:
        dev.load(100 * BLOCK, 1)  # X, pushed out by the prefetch, is missed: pollution
    else:
        dev.load(101 * BLOCK, 1)  # a hit
        dev.load(300 * BLOCK, 1)  # a miss, but on a block no prefetch evicted
    dev.load(0, 1, session=7)
    stats = dev.stats()
    assert stats["prefetch_pollution"] == (1 if reread else 0)
    assert stats["prefetch_useful"] == 1
    assert stats["prefetch_pollution_rate"] == (1.0 if reread else 0.0)


def test_pollution_is_counted_once_and_not_for_demand_evictions(open_dev):
    dev = open_dev("lru")
    fill_dram_clean(dev)
    dev.prefetch(np.array([0]))  # evicts 100
    dev.load(100 * BLOCK, 1)  # pollution 1; this miss evicts 101 (a demand eviction)
    dev.load(101 * BLOCK, 1)  # a miss, not pollution
    dev.prefetch(np.array([1]))  # evicts 102 ...
    dev.prefetch(np.array([102]))  # ... which a prefetch brings back: not a host miss
    dev.load(102 * BLOCK, 1)
    assert dev.stats()["prefetch_pollution"] == 1


def test_prefetch_ghost_table_is_bounded():
    from cxlhm import blocktable as btm
    bt = btm.new_block_table(64)
    for block in range(10_000):
        btm.ghost_add(bt, block)
    assert bt.scalars[btm.N_GHOSTS] == bt.ghost.shape[0] == 64
    kept = [b for b in range(10_000) if btm.ghost_take(bt, b)]
    assert len(kept) == 64 and min(kept) >= 10_000 - 64 * 8  # recent evictions, never old ones
    assert bt.scalars[btm.N_GHOSTS] == 0 and not btm.ghost_take(bt, 9_999)


# ---------------------------------------------------------------- aging of unread prefetches

def test_stale_prefetch_is_evicted_before_a_recently_read_block_and_a_fresh_one_is_kept(open_dev):
    dev, device = open_dev.parts()
    fill_dram_clean(dev)
    dev.hint(HintKind.SESSION_RESUME, 8, 10, 2)  # session B: blocks 10, 11
    drain(dev)
    dev.hint(HintKind.SESSION_RESUME, 7, 0, 3)  # session A, about to resume: blocks 0-2
    drain(dev)
    assert all(_resident(device, b) for b in (0, 1, 2, 10, 11))
    dev.load(10 * BLOCK, BLOCK, session=8)  # B's request reads 10 and never 11 ...
    dev.hint(HintKind.SESSION_PAUSE, 8, 0, 0)  # ... and is served: 11 is a stale prefetch
    dev.load(115 * BLOCK, 1, session=1)  # a recently read block
    dev.load(400 * BLOCK, 1, session=9)  # a miss: the stale prefetch is the victim
    # 11 goes although plain LRU order would take 105 (read before 11 was prefetched)
    assert not _resident(device, 11) and all(_resident(device, b) for b in range(105, 116))
    for i in range(3 * SLOTS):  # heavy foreground traffic: A's fresh prefetches stay
        dev.load((500 + i) * BLOCK, 1, session=9)
    before = dev.stats()
    dev.load(0, 3 * BLOCK, session=7)
    after = dev.stats()
    assert after["misses"] == before["misses"] and after["prefetch_useful"] == 4  # 0-2 and 10
    assert after["prefetch_unused"] == 1  # 11


def test_served_sessions_free_the_prefetch_budget(open_dev):
    dev = open_dev(params={"prefetch_budget": 0.25})  # 4 of 16 slots
    dev.hint(HintKind.SESSION_RESUME, 7, 0, 4)
    drain(dev)
    dev.hint(HintKind.SESSION_RESUME, 8, 20, 4)
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 4  # the budget is full of session 7's unread blocks
    dev.hint(HintKind.SESSION_PAUSE, 7, 0, 0)  # 7 was served without reading them
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 8  # session 8's queued prefix went out
    dev.hint(HintKind.SESSION_PAUSE, 8, 0, 0)
    dev.hint(HintKind.SESSION_RESUME, 9, 40, 4)
    dev.hint(HintKind.SESSION_PAUSE, 9, 0, 0)  # served before its prefetch ran: cancelled
    drain(dev)
    assert dev.stats()["prefetch_issued"] == 8


@pytest.mark.parametrize("ttl_ns, kept", [(1_000_000, False), (10**12, True)])
def test_unread_prefetch_protection_times_out(open_dev, ttl_ns, kept):
    dev, device = open_dev.parts(params={"prefetch_ttl_ns": ttl_ns}, clock="model", data="none")
    fill_dram_clean(dev)
    dev.hint(HintKind.SESSION_RESUME, 7, 0, 2)  # never read, session never paused
    drain(dev)
    for i in range(2, SLOTS):
        dev.load((100 + i) * BLOCK, 1, session=1)  # every other block is newer
    dev.advance_to(dev.now_ns() + 2_000_000)
    dev.run_background()  # the firmware's next round reads the time (hosts' accesses do not set it)
    dev.load(400 * BLOCK, 1, session=9)
    assert _resident(device, 0) == kept  # timed out: an ordinary LRU candidate, here the oldest
    assert _resident(device, 102) != kept


# ---------------------------------------------------------------- write absorption counters

def test_write_buffer_counters_coalesced_bytes_buffer_reads_and_host_path_write_backs(open_dev, tmp_path):
    dev = open_dev(params={"idle_flush": 0})
    dev.store(0, b"a" * BLOCK)
    dev.store(100, b"b" * 50)  # onto a dirty block: absorbed
    dev.load(0, 10)  # served from the buffer
    stats = dev.stats()
    assert stats["write_coalesced_bytes"] == 50 and stats["buffer_read_hits"] == 1
    assert stats["ssd_write_bytes"] == 0 and stats["fg_writebacks"] == 0
    lru = open_dev("lru", backend={"path": str(tmp_path / "lru.img")})  # one device per image
    for i in range(SLOTS + 2):  # write-back LRU: misses evict dirty blocks on the host's path
        lru.store(i * BLOCK, b"x" * BLOCK)
    assert lru.stats()["fg_writebacks"] == 2
    hym = open_dev(backend={"path": str(tmp_path / "hym.img")})
    for i in range(SLOTS + 2):  # hymcache: flushed when idle, so misses find clean victims
        hym.store(i * BLOCK, b"x" * BLOCK)
        drain(hym)
    assert hym.stats()["fg_writebacks"] == 0 and hym.stats()["bg_flushes"] == SLOTS + 2


def test_background_finds_nothing_to_flush_after_a_host_flush(open_dev):
    dev, device = open_dev.parts()
    dev.store(0, b"w" * (3 * BLOCK))
    dev.flush()
    assert dev.run_background() == 0
    assert device.ps.w_ends[2] == 0  # the written-blocks list was pruned, not rescanned


def test_session_end_demotes_the_blocks_a_session_owns_now(open_dev):
    """SESSION_END walks the session's own blocks (an owner list, not every DRAM slot):
    a block read since by another session belongs to that one and stays; blocks of a
    session that never sent a hint are found too."""
    dev = open_dev()
    dev.load(300 * BLOCK, BLOCK, session=5)
    dev.load(301 * BLOCK, BLOCK, session=5)
    dev.load(301 * BLOCK, 1, session=6)  # now session 6's
    dev.load(302 * BLOCK, BLOCK, session=70_000)  # never hinted
    dev.hint(HintKind.SESSION_END, 5, 0, 0)
    dev.hint(HintKind.SESSION_END, 70_000, 0, 0)
    for i in range(SLOTS - 1):  # fills DRAM, then evicts two blocks: the demoted ones
        dev.load((400 + i) * BLOCK, 1, session=8)
    before = dev.stats()["misses"]
    dev.load(301 * BLOCK, 1, session=6)  # survived: not session 5's any more
    assert dev.stats()["misses"] == before
    dev.load(300 * BLOCK, 1, session=5)  # demoted, so evicted first
    dev.load(302 * BLOCK, 1, session=70_000)
    assert dev.stats()["misses"] == before + 2
