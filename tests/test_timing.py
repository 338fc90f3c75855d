"""The timing model: config checks, closed forms, queueing, determinism, monotonicity,
and the latency recorder."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from cxlhm.config import ConfigError, load_config
from cxlhm.media.ssd import IO_LEN, IO_OFFSET
from cxlhm.timing import (
    FIO_PERCENTILES, LatencyRecorder, TimingModel, charge_access, parse_timing, record,
)
from cxlhm.timing.closed_loop import closed_loop_reads

KiB, MiB = 1 << 10, 1 << 20


def model(profile: str = "cmm-h", **timing) -> TimingModel:
    cfg = load_config(profile, {"timing": timing} if timing else None)
    return TimingModel.from_device_config(cfg)


def rows(offsets, length) -> np.ndarray:
    r = np.zeros((len(offsets), 4), np.int64)
    r[:, IO_LEN] = length
    r[:, IO_OFFSET] = offsets
    return r


def closed_loop(m: TimingModel, offsets, length, qd, from_nand=True):
    n = len(offsets)
    lat = np.zeros(n)
    m.reset()
    makespan = closed_loop_reads(m.params, m.state, np.asarray(offsets, np.int64), np.full(n, length, np.int64),
                                 np.full(n, from_nand, np.bool_), qd, lat)
    return n / makespan * 1e9, lat


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("name", ["cmm-h", "cxl-dram", "nvme-tlc"])
def test_profiles_validate(name):
    cfg = load_config(name)
    m = TimingModel.from_device_config(cfg)
    assert m.settings.link_latency > 0
    if name == "cxl-dram":
        assert cfg.dram_bytes == cfg.capacity and m.settings.backing == "none"
    if name == "nvme-tlc":
        assert cfg.dram_slots == 2 and m.settings.backing == "nand"


@pytest.mark.parametrize("key, value, fragment", [
    ("bogus_latency", 5, "unknown key"),
    ("nand_read_latency", 0, "positive"),
    ("nand_read_latency", "0us", "positive"),
    ("link_latency", -90, "positive"),
    ("controller_latency", "-5ns", "duration"),
    ("nand_channels", 0, "positive integer"),
    ("nand_channels", 2.5, "positive integer"),
    ("nand_dies_per_channel", True, "positive integer"),
    ("link_bandwidth", "fast", "bandwidth"),
    ("dram_bandwidth", 0, "positive"),
    ("nand_page_size", 3000, "power of two"),
    ("backing", "ssd", "one of"),
    ("write_buffer_bytes", "4KiB", "at least one NAND page"),
])
def test_bad_parameters_name_key_and_file(tmp_path, key, value, fragment):
    user = tmp_path / "mine.yaml"
    user.write_text(f"timing:\n  {key}: {value!r}\n" if isinstance(value, str) else f"timing:\n  {key}: {value}\n")
    cfg = load_config(user)
    with pytest.raises(ConfigError) as err:
        TimingModel.from_device_config(cfg)
    assert err.value.key == f"timing.{key}"
    assert err.value.source == str(user)
    assert fragment in str(err.value)


def test_missing_key_is_named():
    timing = dict(load_config("cmm-h").timing)
    del timing["nand_read_latency"]
    with pytest.raises(ConfigError, match=r"timing\.nand_read_latency: missing"):
        parse_timing(timing, "x.yaml")


def test_units_parse():
    p = parse_timing({**load_config("cmm-h").timing, "link_bandwidth": "1GiB/s", "nand_read_latency": 45000}, "x")
    assert p.link_bandwidth == 1 << 30 and p.nand_read_latency == 45000.0
    p = parse_timing({**load_config("cmm-h").timing, "nand_channel_rate": "1.2GB/s"}, "x")
    assert p.nand_channel_rate == 1.2e9


# ---------------------------------------------------------------- closed forms
def test_hit_latency_is_link_controller_dram():
    m = model()
    s = m.settings
    got = m.charge_access(0.0, False, 64)
    assert got == pytest.approx(2 * s.link_latency + s.controller_latency + s.dram_latency
                                + 64e9 / s.dram_bandwidth + 64e9 / s.link_bandwidth, rel=1e-9)
    assert got == pytest.approx(300, rel=0.02)  # the profile's ~300 ns hybrid hit (250 ns CXL + 50 ns device DRAM)


def test_qd1_read_latency_closed_form():
    m = model()
    iops, lat = closed_loop(m, np.arange(200) * 977 * 4 * KiB, 4 * KiB, qd=1)
    expected = m.miss_read_latency_ns(4 * KiB)
    assert lat.mean() == pytest.approx(expected, rel=0.01)
    assert iops == pytest.approx(1e9 / expected, rel=0.01)
    s = m.settings  # tR plus overheads, nothing else
    per_byte = 1 / s.nand_channel_rate + 2 / s.dram_bandwidth + 1 / s.link_bandwidth
    assert expected == pytest.approx(s.nand_read_latency + s.ssd_command_latency + 4 * KiB * per_byte * 1e9
                                     + 2 * s.link_latency + s.controller_latency + 2 * s.dram_latency, rel=1e-9)


def test_random_read_iops_saturate_at_dies_over_tr():
    m = model()
    limit = m.settings.dies / m.settings.nand_read_latency * 1e9
    assert m.random_read_iops_limit(4 * KiB) == limit  # the dies bind, not the channels
    # pages spread evenly over the dies, queue deep enough to keep every die busy
    iops, _ = closed_loop(m, np.arange(60_000) * m.settings.nand_page_size, 4 * KiB, qd=256)
    assert iops == pytest.approx(limit, rel=0.01)
    # uniformly random pages get near it (dies sometimes idle by chance)
    rng = np.random.default_rng(0)
    iops, _ = closed_loop(m, rng.integers(0, 1 << 18, 60_000) * 4 * KiB, 4 * KiB, qd=2048)
    assert 0.85 * limit < iops <= limit


def test_sequential_bandwidth_channel_bound():
    m = model()
    s = m.settings
    assert m.sequential_read_bandwidth_limit() == s.nand_channels * s.nand_channel_rate
    iops, _ = closed_loop(m, np.arange(4000) * MiB, MiB, qd=16)
    assert iops * MiB == pytest.approx(s.nand_channels * s.nand_channel_rate, rel=0.01)


def test_sequential_bandwidth_link_bound():
    m = model(nand_channel_rate="20GB/s", nand_read_latency="5us", dram_bandwidth="200GB/s")
    assert m.sequential_read_bandwidth_limit() == m.settings.link_bandwidth
    iops, _ = closed_loop(m, np.arange(4000) * MiB, MiB, qd=16)
    assert iops * MiB == pytest.approx(m.settings.link_bandwidth, rel=0.01)


def test_hits_are_link_bound():
    m = model()
    iops, _ = closed_loop(m, np.arange(20_000) * 64 * KiB, 64 * KiB, qd=32, from_nand=False)
    assert iops * 64 * KiB == pytest.approx(m.settings.link_bandwidth, rel=0.01)


def test_write_backs_sustain_program_bandwidth():
    m = model()
    n = 4096  # 64 KiB blocks = 256 MiB, far more than the 2 MiB write buffer
    accepted = 0.0
    for i in range(0, n, 16):
        accepted = m.charge_background_write(0.0, rows(np.arange(i, i + 16) * 64 * KiB, 64 * KiB))
    durable = m.charge_flush(accepted)
    assert durable >= accepted
    assert n * 64 * KiB / durable * 1e9 == pytest.approx(m.write_back_bandwidth_limit(), rel=0.01)
    assert n * 64 * KiB / accepted * 1e9 == pytest.approx(m.write_back_bandwidth_limit(), rel=0.02)
    assert m.stats()["nand_page_programs"] == n * 64 * KiB // m.settings.nand_page_size


def test_hit_does_not_queue_behind_a_miss():
    """Backfilling: a hit issued with a miss outstanding uses the idle link before the
    miss's data needs it."""
    m = model()
    miss = m.charge_access(0.0, False, 64 * KiB, fills=rows([0], 64 * KiB))
    hit = m.charge_access(0.0, False, 64 * KiB)
    assert miss > 40_000
    assert hit == pytest.approx(m.hit_read_latency_ns(64 * KiB), rel=1e-9)


def test_concurrent_issue_queues_on_the_same_die():
    m = model()
    first = m.charge_access(0.0, False, 4 * KiB, fills=rows([0], 4 * KiB))
    second = m.charge_access(0.0, False, 4 * KiB, fills=rows([4 * KiB], 4 * KiB))  # same page, same die
    other = m.charge_access(0.0, False, 4 * KiB, fills=rows([m.settings.nand_page_size], 4 * KiB))  # next channel
    assert second - first == pytest.approx(m.settings.nand_read_latency, rel=0.01)
    assert 0 <= other - first < 1000  # only DRAM and link are shared with the first: a few hundred ns


def test_fill_waits_for_write_buffer_when_full():
    m = model(write_buffer_bytes="16KiB")
    page = m.settings.nand_page_size
    m.charge_background_write(0.0, rows([0], page))  # fills the only buffer slot; programming until ~700 us
    done = m.charge_access(1000.0, False, 4 * KiB, fills=rows([10 * MiB], 64 * KiB), writebacks=rows([20 * MiB], 64 * KiB))
    assert done > m.settings.nand_program_latency
    assert m.stats()["write_stall_ns"] > 0


def test_write_without_fill_waits_for_its_victims_dram_read_out():
    """A whole-block write miss that evicts a dirty block has no fill, but its bytes go
    into the slot the victim is leaving: DRAM reads the victim out (into the write
    buffer, which has room), then takes the host's bytes - not tPROG."""
    m = model()
    s = m.settings
    b = 64 * KiB
    done = m.charge_access(0.0, True, b, writebacks=rows([MiB], b))
    dram = s.dram_latency + b / s.dram_bandwidth * 1e9
    expected = 2 * s.link_latency + b / s.link_bandwidth * 1e9 + s.controller_latency + 2 * dram
    assert done == pytest.approx(expected, rel=1e-9)
    assert done < s.nand_program_latency
    m.reset()  # the same write with a clean victim: only its own DRAM transfer
    assert m.charge_access(0.0, True, b) == pytest.approx(expected - dram, rel=1e-9)


def test_write_without_fill_waits_while_a_full_write_buffer_holds_the_victim():
    """No room in the write buffer: the victim's bytes stay in the slot until a page
    slot frees (the previous page's tPROG ends), and the host's write waits for that."""
    m = model(write_buffer_bytes="16KiB")  # one page slot
    s = m.settings
    page = s.nand_page_size
    dram = lambda n: s.dram_latency + n / s.dram_bandwidth * 1e9  # noqa: E731
    m.charge_background_write(0.0, rows([0], page))  # fills the only slot, programmed at once
    program_end = dram(page) + page / s.nand_channel_rate * 1e9 + s.nand_program_latency
    done = m.charge_access(1000.0, True, page, writebacks=rows([MiB], page))
    assert done == pytest.approx(program_end + dram(page) + s.link_latency, rel=1e-9)
    assert m.stats()["write_stall_ns"] > 0


def test_contiguous_fills_share_a_page_read():
    m = model()
    m.charge_access(0.0, False, 64 * KiB, fills=rows(np.arange(16) * 4 * KiB, 4 * KiB))
    assert m.stats()["nand_page_reads"] == 64 * KiB // m.settings.nand_page_size


def test_dram_only_device_never_touches_nand():
    m = model("cxl-dram")
    done = m.charge_access(0.0, True, 64 * KiB, fills=rows([0], 64 * KiB), writebacks=rows([MiB], 64 * KiB))
    assert done < 10_000
    assert m.stats()["nand_page_reads"] == 0 and m.stats()["nand_page_programs"] == 0


def test_write_through_waits_for_the_write_buffer():
    m = model()
    plain = m.charge_access(0.0, True, 64 * KiB)
    m.reset()
    through = m.charge_access(0.0, True, 64 * KiB, through_bytes=64 * KiB)
    assert through > plain


# ---------------------------------------------------------------- determinism, monotonicity
def _mixed_run(m: TimingModel) -> np.ndarray:
    rng = np.random.default_rng(7)
    out = np.zeros(3000)
    t = 0.0
    for i in range(3000):
        kind = rng.integers(0, 4)
        off = int(rng.integers(0, 1 << 14)) * 64 * KiB
        fills = rows([off], 64 * KiB) if kind else None
        wbs = rows([off + 8 * MiB], 64 * KiB) if kind == 3 else None
        out[i] = m.charge_access(t, bool(kind == 2), 16 * KiB, fills=fills, writebacks=wbs)
        t += float(rng.integers(0, 20_000))
    return out


def test_bit_identical_runs():
    a = _mixed_run(model())
    b = _mixed_run(model())
    m = model()
    _mixed_run(m)
    m.reset()
    c = _mixed_run(m)
    assert a.tobytes() == b.tobytes() == c.tobytes()


def test_more_dies_never_slower():
    rng = np.random.default_rng(3)
    offsets = rng.integers(0, 1 << 18, 20_000) * 4 * KiB
    last_iops, last_lat = 0.0, np.inf
    for dies in (1, 2, 4, 8, 16):
        iops, lat = closed_loop(model(nand_dies_per_channel=dies), offsets, 4 * KiB, qd=32)
        assert iops >= last_iops and lat.mean() <= last_lat
        last_iops, last_lat = iops, lat.mean()


def test_larger_dram_never_more_lru_misses():
    from cxlhm.device import Device
    rng = np.random.default_rng(5)
    blocks = (rng.zipf(1.2, 2000) % 300).astype(np.int64)
    misses = []
    for slots in (8, 16, 32, 64, 128):
        dev = Device(load_config({"data": "none", "capacity": "64MiB", "block_size": "64KiB",
                                  "dram_bytes": slots * 64 * KiB}))
        for b in blocks:
            dev.access(np.array([b * 64 * KiB]), np.array([4096]), 0, False)
        misses.append(dev.stats()["misses"])
        dev.close()
    assert misses == sorted(misses, reverse=True)


def test_kernels_callable_from_compiled_code():
    """The lead's planner and trace loop call the kernels from their own njit code."""
    @numba.njit(nogil=True)
    def loop(params, state, values, meta, fills):
        t = 0.0
        for i in range(100):
            fills[0, 2] = i * 65536
            done = charge_access(params, state, t, False, 4096, fills, 1, fills, 0, 0.0, 0)
            record(values, meta, done - t)
            t = done
        return t
    m = model()
    rec = LatencyRecorder(capacity=128)
    end = loop(m.params, m.state, rec.values, rec.meta, rows([0], 64 * KiB))
    assert rec.count == 100 and end > 100 * m.settings.nand_read_latency


# ---------------------------------------------------------------- latency recorder
def test_recorder_full_percentiles_match_numpy():
    rng = np.random.default_rng(1)
    x = rng.lognormal(10, 1, 10_000)
    rec = LatencyRecorder(capacity=20_000)
    rec.record_many(x)
    pct = rec.percentiles()
    assert list(pct) == list(FIO_PERCENTILES) and len(pct) == 17
    for p, v in pct.items():
        assert v == np.percentile(x, p, method="inverted_cdf")
    s = rec.summary()
    assert s["N"] == 10_000 and s["min"] == x.min() and s["max"] == x.max()
    assert s["mean"] == pytest.approx(x.mean(), rel=1e-9) and s["stddev"] == pytest.approx(x.std(ddof=1), rel=1e-6)
    assert s["percentile"]["99.000000"] == pct[99.0]


def test_recorder_samples_every_kth_and_decimates_when_full():
    rec = LatencyRecorder(capacity=1000, every=3)
    rec.record_many(np.arange(900, dtype=float))
    assert np.array_equal(rec.samples, np.arange(0, 900, 3))
    small = LatencyRecorder(capacity=8)
    small.record_many(np.arange(100, dtype=float))
    assert small.every == 16 and small.count == 100
    assert np.array_equal(small.samples, np.arange(0, 100, 16))  # still evenly spaced
    assert small.summary()["max"] == 99.0  # exact over every access


def test_recorder_cdf():
    rec = LatencyRecorder()
    rec.record_many([10.0, 20.0, 30.0, 40.0])
    xs, fr = rec.cdf()
    assert np.array_equal(xs, [10, 20, 30, 40]) and np.array_equal(fr, [0.25, 0.5, 0.75, 1.0])
    assert np.array_equal(rec.cdf([5, 20, 100]), [0.0, 0.5, 1.0])


# ---------------------------------------------------------------- the timeline primitive
def _first_fit(busy, ready, duration):
    """Brute force: the earliest start >= ready where [start, start+duration) is idle."""
    start = ready
    for s, e in sorted(busy):
        if e <= start:
            continue
        if s >= start + duration:
            break
        start = max(start, e)
    return start


@pytest.mark.parametrize("seed", range(4))
def test_timeline_is_first_fit_and_never_double_books(seed):
    from cxlhm.timing import timeline as TL
    rng = np.random.default_rng(seed)
    state = np.zeros(TL.SIZE)
    busy = []
    horizon = 0.0
    for _ in range(3000):
        horizon += float(rng.integers(0, 30))
        ready = horizon + float(rng.integers(0, 400))
        duration = float(rng.integers(1, 20))
        live = [(s, e) for s, e in busy if e > horizon]
        end = TL.reserve(state, 0, horizon, ready, duration)
        start = end - duration
        assert start >= ready
        assert all(end <= s or start >= e for s, e in live)  # never overlaps earlier work
        if len(live) < TL.SLOTS - 1:  # below capacity nothing is merged: exact first fit
            assert start == _first_fit(live, ready, duration)
        busy = live + [(start, end)]


def test_timeline_full_merges_gaps_but_never_double_books():
    from cxlhm.timing import timeline as TL
    rng = np.random.default_rng(9)
    state = np.zeros(TL.SIZE)
    busy = []
    for _ in range(2000):  # horizon stays at 0: nothing is ever forgotten
        ready = float(rng.integers(0, 100_000))
        end = TL.reserve(state, 0, 0.0, ready, 5.0)
        start = end - 5.0
        assert start >= _first_fit(busy, ready, 5.0)  # merging only ever delays
        assert all(end <= s or start >= e for s, e in busy)
        busy.append((start, end))
    assert TL.SLOTS - 2 <= state[0] <= TL.SLOTS  # full: merged instead of growing
