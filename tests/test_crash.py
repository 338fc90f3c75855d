"""Crash consistency.

1. Torn writes at a simulated power loss, in-process: the back end loses power while a
   write-back is in flight (a prefix of its 4 KiB pages lands, maybe a torn page), later
   writes never land, device DRAM is gone. After the reopen every block reads back as
   the bytes last written to it or raises PoisonError - never stale, torn or mixed.
2. kill -9 of a KV-store writer: a forked child runs the real KVStore on a small device
   whose KV crosses DRAM and SSD (write-back and write-buffer firmware), reports every
   committed key and every finished flush to a file, and is SIGKILLed - after a random
   delay, or at an injected point (the Nth SSD write, with or without a torn landing,
   the Nth index-journal append, the Nth integrity-log append). The parent reopens and
   checks the guarantee documented in docs/reliability.md:

     * commit() publishes a chunk; it is durable once a later flush() (or close())
       has returned. After a crash, every chunk committed before the last returned
       flush() is returned byte-exact; every other chunk ever written is returned
       byte-exact or reported missing; no torn or mixed chunk is ever served;
     * the index and the allocator agree (no leaked or overlapping extent);
     * a clean close loses nothing.

Why fork (not spawn): the firmware kernels are numba-compiled at first use (~5 s per
process); a child forked after the parent compiled them starts in milliseconds. The
report file is written with write(2) and not fsynced: a SIGKILL does not lose page-cache
writes, only a machine crash would.
"""
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.config import ConfigError
from cxlhm.device import DeviceClosed
from cxlhm.device import behind as device_behind
from cxlhm.device import waves as device_waves
from cxlhm.device.media import MediaPath
from cxlhm.integrity import PoisonError
from device_parts import open_parts
from host_runtime.driver import open_device
from host_runtime.kvstore import KVStore, PutStatus
from test_reliability import record_figure
from threads import wait_child

PAGE = 4096


# ====================================================================== 1. torn writes
def _pl_config(path, block=4 * PAGE, slots=4, **faults):
    return {"capacity": 64 * block, "block_size": block, "dram_bytes": slots * block,
            "backend": {"path": str(path), "faults": faults}}


def test_a_torn_write_back_is_caught_by_its_checksum(tmp_path):
    B = 4 * PAGE
    cfg = _pl_config(tmp_path / "t.img")
    with open_parts(cfg) as (dev, device):
        for i in range(8):
            dev.store(i * B, bytes([1 + i]) * B)
        dev.flush()  # v1 of blocks 0-7 is durable
        for i in range(8):
            dev.store(i * B, bytes([100 + i]) * B)  # v2: blocks 0-3 written back (evicted), 4-7 dirty in DRAM
        device.arm_power_loss(pages=1, torn_bytes=1024)  # the next write: 1 page + 1 KiB of it land
        with pytest.raises(DeviceClosed):
            for i in range(8, 12):
                dev.store(i * B, bytes([200 + i]) * B)  # evicts block 4: its write-back tears
        assert device.power_lost
        offset, landed, length = device.ssd.torn
        assert (offset, landed, length) == (4 * B, PAGE + 1024, B)
        assert device.ssd.injected["torn_write"] == 1
    # what the SSD holds for block 4 now: v2 for 5 KiB, then v1 - a mixed block
    raw = (tmp_path / "t.img").read_bytes()[4 * B:5 * B]
    assert raw[:PAGE + 1024] == bytes([104]) * (PAGE + 1024) and raw[PAGE + 1024:] == bytes([5]) * (B - PAGE - 1024)
    with open_device(cfg) as dev:
        report = dev.integrity_report()
        assert report["unclean_shutdown"] and report["lost_dirty_blocks"] == 3
        for i in range(4):
            assert dev.load(i * B, B) == bytes([100 + i]) * B  # written back whole before the cut
        with pytest.raises(PoisonError, match="checksum mismatch"):
            dev.load(4 * B, B)  # the torn block: neither v1 nor v2 nor a mix
        for i in range(5, 8):  # newest bytes were only in device DRAM: an error, not v1
            with pytest.raises(PoisonError, match="unclean shutdown"):
                dev.load(i * B + 7, 3)
        assert dev.load(8 * B, B) == bytes(B)  # the write the cut interrupted raised: block 8 as before it
        listed = dev.mailbox.poison()  # and Get Poison List names them
        assert {r["dpa"] for r in listed["records"]} == {4 * B, 5 * B, 6 * B, 7 * B}
        dev.store(4 * B, bytes([44]) * B)  # a whole-block write repairs it
        assert dev.load(4 * B, B) == bytes([44]) * B
    record_figure("faults", "torn_write", "injected_and_survived", 1, accumulate=True)


def test_power_loss_configured_by_the_fault_plan_is_deterministic(tmp_path):
    results = []
    for run in range(2):
        path = tmp_path / f"d{run}.img"
        cfg = _pl_config(path, power_loss_at_write=6)
        cfg["seed"] = 1234
        with open_parts(cfg) as (dev, device):
            try:
                for i in range(20):
                    dev.store(i * 4 * PAGE, bytes([i + 1]) * (4 * PAGE))
            except DeviceClosed:
                pass
            results.append((device.ssd.torn, i))
        with open_device(_pl_config(path)) as dev:
            assert dev.unclean_shutdown_detected
    assert results[0] == results[1] and results[0][0] is not None


def _write_pattern(block: int, version: int, nbytes: int) -> np.ndarray:
    """Bytes that name their block and version in every 8-byte word."""
    return np.full(nbytes // 8, block << 32 | version, np.uint64).view(np.uint8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1),
       ops=st.lists(st.one_of(st.tuples(st.just("w"), st.integers(0, 15), st.integers(1, 3)),
                              st.tuples(st.just("f"), st.just(0), st.just(0))), min_size=4, max_size=40),
       cut=st.integers(1, 30), pages=st.integers(-1, 3), torn=st.sampled_from([-1, 0, 512, 2048, 3584]),
       via_config=st.booleans(), policy=st.sampled_from(["lru", "hymcache"]))
def test_after_any_power_loss_blocks_read_back_last_written_or_poison(tmp_path, seed, ops, cut, pages, torn,
                                                                       via_config, policy):
    B, blocks = 4 * PAGE, 16
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "p.img"
    faults = {"power_loss_at_write": cut, "power_loss_pages": pages, "power_loss_torn_bytes": torn} if via_config else {}
    cfg = _pl_config(path, **faults)
    cfg["seed"] = seed
    cfg["firmware"] = {"policy": policy, "background": "manual"}
    version: dict[int, int] = {}  # block -> last version whose write returned (absent: never written)
    durable: set[int] = set()      # blocks whose last write was covered by a flush that returned
    in_flight = None               # the blocks of a write that had not returned when the power went
    with open_parts(cfg) as (dev, device):
        try:
            in_flight = set(range(blocks))
            dev.store(0, np.concatenate([_write_pattern(b, 0, B) for b in range(blocks)]))  # v0 everywhere
            version.update({b: 0 for b in range(blocks)})
            in_flight = None
            dev.flush()
            durable = set(range(blocks))
            if not via_config:
                device.arm_power_loss(cut, pages=pages, torn_bytes=torn)
            for i, (op, first, n) in enumerate(ops, start=1):
                if op == "f":
                    dev.flush()
                    durable = set(version)
                    continue
                n = min(n, blocks - first)
                data = np.concatenate([_write_pattern(first + j, i, B) for j in range(n)])
                in_flight = set(range(first, first + n))
                durable -= in_flight  # a write in flight supersedes what was durable
                dev.store(first * B, data)
                for j in range(n):
                    version[first + j] = i
                in_flight = None
                if policy == "hymcache":
                    dev.run_background(4)  # write buffering: background flushes
        except DeviceClosed:
            pass
        if not device.power_lost:
            device.simulate_power_loss()  # the power goes at the end instead
        torn = getattr(device.ssd, "injected", {}).get("torn_write", 0)
    exact = poisoned = 0
    with open_device(_pl_config(path)) as dev:
        for b in range(blocks):
            try:
                got = np.frombuffer(dev.load(b * B, B), np.uint64)
            except PoisonError:
                assert b not in durable, f"block {b} was durable (flushed, not written since) but is poisoned"
                poisoned += 1
                continue
            words = set(got.tolist())
            assert len(words) == 1, f"block {b} holds a mix of versions {sorted(words)}"
            word = words.pop()
            if b not in version:  # never written (the power went during the first write): zeros
                assert word == 0 or (in_flight and b in in_flight), f"block {b} was never written, holds {word:#x}"
                continue
            assert word >> 32 == b, f"block {b} holds block {word >> 32}'s bytes"
            allowed = {version[b]} | (set(range(len(ops) + 1)) if in_flight and b in in_flight else set())
            assert word & 0xFFFFFFFF in allowed, f"block {b}: version {word & 0xFFFFFFFF}, last written {version[b]}"
            exact += 1
    record_figure("faults", "power_loss", "injected_and_survived", 1, accumulate=True)
    record_figure("faults", "torn_write", "injected_and_survived", torn, accumulate=True)
    record_figure("crash", "power_loss_property", "blocks_checked", blocks, accumulate=True)
    record_figure("crash", "power_loss_property", "blocks_poisoned_not_stale", poisoned, accumulate=True)
    record_figure("crash", "power_loss_property", "corrupt_reads", 0, accumulate=True)


def test_the_integrity_log_compacts_and_a_torn_tail_is_ignored(tmp_path, monkeypatch):
    from cxlhm import integrity
    monkeypatch.setattr(integrity, "COMPACT_MIN_RECORDS", 64)
    B = 4 * PAGE
    cfg = _pl_config(tmp_path / "c.img")
    with open_parts(cfg) as (dev, device):
        for rnd in range(12):  # 16 blocks x 12 rounds through 4 slots: hundreds of SUM / DIRTY records
            for b in range(16):
                dev.store(b * B, _write_pattern(b, rnd, B))
        dev.flush()
        log = device.checksums.log
        assert log.records <= 4 * 16 + 64 + 40  # compacted: bounded by the live blocks, not the history
        dev.store(0, _write_pattern(0, 99, B))  # dirty in DRAM only when the power goes
        device.simulate_power_loss()
    with open(str(tmp_path / "c.img") + ".cxlhm.ilog", "ab") as f:
        f.write(b"\x30\x00\x00\x00torn")  # a frame cut short by the crash
    with open_device(cfg) as dev:
        with pytest.raises(PoisonError, match="unclean shutdown"):
            dev.load(0, 8)
        for b in range(1, 16):
            assert np.array_equal(np.frombuffer(dev.load(b * B, B), np.uint8), _write_pattern(b, 11, B))
        assert dev.integrity_report()["log_records_replayed"] > 0
    with open_parts(cfg) as (dev, device):  # a clean close in between: the saved state is whole, the log starts empty
        assert not dev.unclean_shutdown_detected
        assert device.checksums.log.records == 0
        with pytest.raises(PoisonError):  # the poison itself survives
            dev.load(0, 8)


# ====================================================================== 2. kill -9 of a KV writer
BLOCK = PAGE
KV_DEVICE = {"capacity": 1 << 23, "block_size": BLOCK, "dram_bytes": 12 * BLOCK}  # 48 KiB of DRAM, 8 MiB window


def _kv_config(image, policy="lru", faults=None):
    return {**KV_DEVICE, "backend": {"path": str(image), "faults": faults or {}},
            "firmware": {"policy": policy}}


def chunk_bytes(key: bytes) -> np.ndarray:
    """The content of chunk `key` (b"k<i>-<nbytes>"): every byte depends on the key and
    the offset, so a chunk with a block of another chunk (or of another version) shows."""
    i, n = key[1:].split(b"-")
    i, n = int(i), int(n)
    return ((np.arange(n, dtype=np.int64) * 131 + i * 7919) % 251).astype(np.uint8)


def _writer(image, report_path, policy, faults, kill, n_ops, seed, *, instrument=True) -> None:
    """The child: a KV writer that reports what returned, until it is killed. (The
    parent runs it once uninstrumented, to compile every kernel before it forks.)"""
    import host_runtime.kvstore as kvs
    from cxlhm import integrity

    fd = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    counts = {"journal": 0, "ilog": 0}

    def counting(kind, original):
        def wrapper(self, *args, **kw):
            counts[kind] += 1
            if kill and kill[0] == kind and counts[kind] == kill[1]:
                if kill[2] == "before":
                    os.kill(os.getpid(), signal.SIGKILL)
                original(self, *args, **kw)
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kw)
        return wrapper

    if instrument:
        kvs._Journal.append = counting("journal", kvs._Journal.append)
        integrity.IntegrityLog.append = counting("ilog", integrity.IntegrityLog.append)
    rng = np.random.default_rng(seed)
    h = open_device(_kv_config(image, policy, faults))
    store = KVStore(h)
    t = store.tenant("writer")
    session = t.open_session("s")
    committed: list[bytes] = []
    note("OPEN")
    for i in range(n_ops):
        r = rng.random()
        if r < 0.62 or not committed:
            nbytes = int(rng.choice([BLOCK, 2 * BLOCK, 3 * BLOCK - 512, BLOCK // 2]))
            key = f"k{i}-{nbytes}".encode()
            data = chunk_bytes(key)
            how = rng.integers(0, 3)
            if how == 0:
                status = t.put_from(key, data)
            elif how == 1:
                status = session.append(key, data)
            else:  # allocate, write in place in pieces (out of order), commit
                res = t.reserve(key, nbytes)
                if isinstance(res, PutStatus):
                    status = res
                else:
                    half = nbytes // 2
                    res.write(data[half:], half)
                    res.write(data[:half], 0)
                    res.commit()
                    status = PutStatus.STORED
            if status is PutStatus.STORED:
                note(f"C {key.decode()}")
                committed.append(key)
        elif r < 0.75:
            key = committed.pop(int(rng.integers(0, len(committed))))
            note(f"R {key.decode()}")  # intent first: after the crash it may or may not be gone
            t.remove(key)
        elif r < 0.85:
            store.flush()
            note("F")  # every commit above this line is durable
        else:
            key = committed[int(rng.integers(0, len(committed)))]
            out = np.empty(len(chunk_bytes(key)), np.uint8)
            if t.get_into(key, out) is not None and not np.array_equal(out, chunk_bytes(key)):
                note(f"BAD {key.decode()}")
    store.close()
    stats = h.stats()
    h.close()
    note("CLOSED " + json.dumps({"ssd_writes": stats["ssd_writes"], **counts}))
    os.close(fd)


def _run_child(image, report, policy, faults, kill, n_ops, seed, delay_s=None, timeout_s=60.0) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            _writer(image, report, policy, faults, kill, n_ops, seed)
        except BaseException as exc:  # noqa: BLE001 - reported, the parent fails the test
            try:
                with open(report, "a") as f:
                    f.write(f"EXC {type(exc).__name__}: {exc}\n")
            finally:
                code = 2
        os._exit(code)
    return wait_child(pid, timeout=timeout_s, kill_after=delay_s, hang="the writer hung")


def reopen(config, timeout_s: float = 10.0):
    """open_device once the killed writer's image lock is gone: the kernel drops a dead
    process's io_uring file references asynchronously, a few milliseconds after it is
    reaped, and the lock goes with the last one."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return open_device(config)
        except ConfigError as exc:
            if "already open" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _verify_after_crash(image, report_path, policy) -> dict:
    lines = Path(report_path).read_text().splitlines()
    assert not any(l.startswith(("EXC", "BAD")) for l in lines), [l for l in lines if l.startswith(("EXC", "BAD"))]
    committed: list[str] = []
    removing: set[str] = set()
    durable_upto = 0
    attempted = set()
    for line in lines:
        if line.startswith("C "):
            committed.append(line[2:])
        elif line.startswith("R "):
            removing.add(line[2:])
        elif line == "F":
            durable_upto = len(committed)
    clean = bool(lines) and lines[-1].startswith("CLOSED")
    durable = {k for k in (committed if clean else committed[:durable_upto]) if k not in removing}
    out = {"committed": len(committed), "durable": len(durable), "corrupt": 0, "missing_durable": 0,
           "present": 0, "clean": clean}
    with reopen(_kv_config(image, policy)) as h:
        store = KVStore(h)
        try:
            store.check()  # the recovered index and allocator agree: no leak, no overlap
            t = store.tenant("writer")
            # every key the writer could have put: committed ones and the one in flight
            for key in t.keys():
                attempted.add(key)
            for key in attempted | {k.encode() for k in committed}:
                expected = chunk_bytes(key)
                if not t.contains(key):
                    assert key.decode() not in durable, f"durable chunk {key!r} is missing"
                    continue
                got = np.empty(expected.size, np.uint8)
                n = t.get_into(key, got)
                if n is None:  # a read error turned it into a miss: allowed only for non-durable chunks
                    assert key.decode() not in durable, f"durable chunk {key!r} could not be read"
                    continue
                if not np.array_equal(got, expected):
                    out["corrupt"] += 1
                out["present"] += 1
            store.check()  # and still after the reads dropped what could not be read
        finally:
            store.close()
    assert out["corrupt"] == 0, f"{out['corrupt']} chunk(s) served with wrong bytes"
    return out


CRASH_MODES = ["delay", "ssd_write", "torn_write", "journal", "ilog", "write_buffer"]


def _crash_point(mode: str, i: int, totals: dict, rng) -> dict:
    """The child's fault config / kill point / delay for crash point i of `mode`."""
    policy, faults, kill, delay = "lru", None, None, None
    if mode == "delay":
        delay = float(rng.uniform(0.0, 0.9 * totals["duration"]))  # (each child's workload differs a little)
    elif mode in ("ssd_write", "torn_write", "write_buffer"):
        if mode == "write_buffer":
            policy = "hymcache"
        n = int(rng.integers(1, max(2, int(0.9 * totals["ssd_writes"][policy])) + 1))
        faults = {"power_loss_at_write": n, "power_loss_action": "kill"}
        if mode != "torn_write":
            faults.update(power_loss_pages=0, power_loss_torn_bytes=0)  # killed before it lands
    else:
        kind = "journal" if mode == "journal" else "ilog"
        kill = (kind, int(rng.integers(1, max(2, int(0.9 * totals[kind])) + 1)), "before" if rng.random() < 0.5 else "after")
    return {"policy": policy, "faults": faults, "kill": kill, "delay": delay}


def _crash_campaign(tmp_path, points: int, n_ops: int, seed: int) -> dict:
    # warm up in this process: the writer's whole workload once, and a verification, so
    # every kernel is compiled before the forks and children run at full speed at once
    for policy in ("lru", "hymcache"):
        image, report = tmp_path / f"warm-{policy}.img", tmp_path / f"warm-{policy}.log"
        _writer(image, report, policy, None, None, n_ops, seed, instrument=False)
        _verify_after_crash(image, report, policy)
    # clean runs: the guarantee of a clean close, and the counts the kill points are drawn from
    totals = {"ssd_writes": {}}
    for policy in ("lru", "hymcache"):
        image, report = tmp_path / f"clean-{policy}.img", tmp_path / f"clean-{policy}.log"
        start = time.monotonic()
        status = _run_child(image, report, policy, None, None, n_ops, seed)
        duration = time.monotonic() - start
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, Path(report).read_text()[-2000:]
        result = _verify_after_crash(image, report, policy)
        assert result["clean"] and result["present"] == result["durable"], result  # a clean close loses nothing
        last = json.loads(Path(report).read_text().splitlines()[-1][len("CLOSED "):])
        totals["ssd_writes"][policy] = last["ssd_writes"]
        if policy == "lru":
            totals.update(duration=duration, journal=last["journal"], ilog=last["ilog"])
    rng = np.random.default_rng(seed)
    summary = {"points": 0, "killed": 0, "corrupt_reads": 0, "durable_checked": 0, "chunks_read": 0,
               "by_mode": {m: 0 for m in CRASH_MODES}}
    for i in range(points):
        mode = CRASH_MODES[i % len(CRASH_MODES)]
        point = _crash_point(mode, i, totals, rng)
        image, report = tmp_path / f"crash{i}.img", tmp_path / f"crash{i}.log"
        status = _run_child(image, report, point["policy"], point["faults"], point["kill"], n_ops,
                            seed + 1 + i, delay_s=point["delay"])
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0), \
            (mode, status, Path(report).read_text()[-2000:] if report.exists() else "")
        if not report.exists():  # killed before the writer even opened its report
            continue
        result = _verify_after_crash(image, report, point["policy"])
        summary["points"] += 1
        summary["killed"] += killed
        summary["by_mode"][mode] += 1
        summary["corrupt_reads"] += result["corrupt"]
        summary["durable_checked"] += result["durable"]
        summary["chunks_read"] += result["present"]
        for suffix in ("", ".kvindex", ".cxlhm.json", ".cxlhm.sums", ".cxlhm.ilog"):  # keep tmp small
            Path(str(image) + suffix).unlink(missing_ok=True)
        if (i + 1) % 100 == 0:
            print(f"  kv store: {i + 1}/{points} crash points", file=sys.stderr, flush=True)
    return summary


def test_kill_9_of_a_kv_writer_never_serves_a_torn_chunk(tmp_path):
    summary = _crash_campaign(tmp_path, points=20, n_ops=120, seed=20260)
    print(f"\ncrash points tried: {summary['points']} ({summary['killed']} killed), corrupt reads: "
          f"{summary['corrupt_reads']}, chunks read back: {summary['chunks_read']}, by mode: {summary['by_mode']}")
    assert summary["corrupt_reads"] == 0
    assert summary["points"] >= 18 and summary["killed"] >= 14
    assert all(summary["by_mode"][m] for m in CRASH_MODES)
    record_figure("crash", "kv_kill9", "points", summary["points"])
    record_figure("crash", "kv_kill9", "killed", summary["killed"])
    record_figure("crash", "kv_kill9", "corrupt_reads", summary["corrupt_reads"])
    record_figure("crash", "kv_kill9", "chunks_read_back", summary["chunks_read"])
    record_figure("crash", "kv_kill9", "durable_chunks_checked", summary["durable_checked"])


@pytest.mark.slow
def test_kill_9_campaign_long(tmp_path):
    summary = _crash_campaign(tmp_path, points=300, n_ops=400, seed=777)
    print(f"\ncrash points tried: {summary['points']} ({summary['killed']} killed), corrupt reads: "
          f"{summary['corrupt_reads']}, by mode: {summary['by_mode']}")
    assert summary["corrupt_reads"] == 0
    record_figure("crash", "kv_kill9_slow", "points", summary["points"])
    record_figure("crash", "kv_kill9_slow", "corrupt_reads", summary["corrupt_reads"])


def test_a_lost_chunk_after_a_crash_is_a_miss_and_its_extent_is_reused_safely(tmp_path):
    """The chunk whose bytes were only in device DRAM is dropped on reopen (not
    flushed); the extent goes back to the allocator, and a new chunk written there is
    served with its own bytes."""
    image = tmp_path / "m.img"
    h, device = open_parts(_kv_config(image))
    s = KVStore(h)
    t = s.tenant("a")
    keep, lose = b"k1-8192", b"k2-8192"
    t.put_from(keep, chunk_bytes(keep))
    s.flush()
    t.put_from(lose, chunk_bytes(lose))
    device.simulate_power_loss()  # DRAM gone, index journal as the kill left it
    s._journal.close()
    h2 = open_device(_kv_config(image))
    s2 = KVStore(h2)
    try:
        t2 = s2.tenant("a")
        assert t2.contains(keep) and not t2.contains(lose)
        s2.check()
        again = b"k3-8192"
        t2.put_from(again, chunk_bytes(again))
        out = np.empty(8192, np.uint8)
        assert t2.get_into(again, out) == 8192 and np.array_equal(out, chunk_bytes(again))
        assert t2.get_into(keep, out) == 8192 and np.array_equal(out, chunk_bytes(keep))
    finally:
        s2.close()
        h2.close()


def test_a_chunk_whose_blocks_were_reused_is_dropped_by_its_fingerprint(tmp_path):
    """Defence in depth: if the index outlives a delete (a machine crash that lost the
    journal's delete record) and the extent now holds another chunk's bytes, the
    fingerprint taken at flush no longer matches and the stale entry is dropped."""
    image = tmp_path / "f.img"
    h, device = open_parts(_kv_config(image))
    s = KVStore(h)
    t = s.tenant("a")
    old = b"k1-8192"
    t.put_from(old, chunk_bytes(old))
    s.flush()
    hpa, _ = t.extent_of(old)
    index = Path(str(image) + ".kvindex").read_bytes()  # the index as it was, with `old` durable
    t.remove(old)
    t.put_from(b"k9-8192", chunk_bytes(b"k9-8192"))
    assert t.extent_of(b"k9-8192")[0] == hpa  # the same extent, reused
    s.flush()
    s._journal.close()
    s._journal = None
    device.simulate_power_loss()
    Path(str(image) + ".kvindex").write_bytes(index)  # the delete "never reached" the index
    h2 = open_device(_kv_config(image))
    s2 = KVStore(h2)
    try:
        t2 = s2.tenant("a")
        assert not t2.contains(old)
        assert s2.counters["failed_verification"] == 1
        s2.check()
    finally:
        s2.close()
        h2.close()


def test_kill_9_between_write_back_waves_never_serves_a_torn_chunk(tmp_path, monkeypatch):
    """The campaign again with waves as small as a block: every put of whole blocks that
    evicts two or more dirty ones writes them back in waves, so the kill points (the Nth
    integrity-log append, the Nth SSD write, a random delay) land between waves too."""
    monkeypatch.setattr(device_waves, "WAVE_BYTES", BLOCK)
    waves = []
    real = MediaPath.write_back_in_waves

    def counted(self, cut, after_wave):
        waves.append(len(cut))
        return real(self, cut, after_wave)

    monkeypatch.setattr(MediaPath, "write_back_in_waves", counted)
    summary = _crash_campaign(tmp_path, points=8, n_ops=100, seed=4242)
    assert waves and max(waves) >= 2  # the warm-up in this process wrote back in waves
    assert summary["corrupt_reads"] == 0
    assert summary["points"] >= 6 and summary["killed"] >= 4


def test_kill_9_with_writes_behind_never_serves_a_torn_chunk(tmp_path, monkeypatch):
    """The campaign again with write-behind from one block up: every put of whole blocks
    goes to the SSD behind the writer, so the kill points (the Nth integrity-log append -
    its SUM records -, a random delay) land with a write-behind logged and not submitted,
    in flight, or landed and not yet recorded."""
    monkeypatch.setattr(device_behind, "BEHIND_MIN_BYTES", BLOCK)
    started = []
    real = device_behind.WriteBehind._start

    def counted(self, slots, *args):
        started.append(slots.shape[0])
        return real(self, slots, *args)

    monkeypatch.setattr(device_behind.WriteBehind, "_start", counted)
    summary = _crash_campaign(tmp_path, points=8, n_ops=100, seed=5151)
    assert started  # the warm-up in this process wrote behind
    assert summary["corrupt_reads"] == 0
    assert summary["points"] >= 6 and summary["killed"] >= 4
