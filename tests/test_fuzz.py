"""Fuzzing: every parser and entry point that takes outside input, driven
by hypothesis with inputs built to sit near the edges (valid-looking text with one
field wrong, binary files mutated from valid ones, raw pointers, wrong buffer sizes).

What each target must do with any input: succeed, or raise its documented exception
(ConfigError, JobFileError, TraceError / ValueError, or the shim's documented
ValueError / TypeError / KeyError / PermissionError and return codes) with a message
saying what is wrong - never another exception, never a hang (a per-case alarm), and
never a change to data stored before (the shim target re-reads it at the end).
The mailbox has its own fuzzer (tests/test_mailbox_fuzz.py). Each target counts the
cases it ran (docs/reliability.md collects the figures).

An optional atheris harness (coverage-guided, libFuzzer) drives the config, fio and
trace targets when atheris is installed: ``cd tests && python test_fuzz.py TARGET
[CORPUS_DIR] [libFuzzer args]`` (seed a corpus directory with ``atheris_corpus``).
"""
import asyncio
import contextlib
import dataclasses
import json
import os
from types import SimpleNamespace
import signal
import string
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cxlhm.config import ConfigError, load_config
from cxlhm_apps.fio import options as fio_options
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm.traces import TraceError
from firmware_policies import PolicyParamError
from cxlhm.traces.blocktrace import BlockTrace, read_block_trace, write_block_trace
from cxlhm.traces.formats import load_trace
from cxlhm.traces.lcs_csv import read_csv
from cxlhm.traces.mooncake import read_requests
from cxlhm.traces.oracle_general import read_oracle_general, write_oracle_general
from test_reliability import record_figure

HANG_S = 20.0  # per case; generous for a loaded 2-core machine
FAST = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(what: str):
    """Fail a case that runs longer than HANG_S (SIGALRM: the main thread only)."""
    def fire(signum, frame):
        raise Hang(f"{what} ran longer than {HANG_S} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def clear_message(exc: BaseException) -> None:
    event(f"rejected: {type(exc).__name__}")
    text = str(exc)
    assert text and len(text) < 4000, f"unhelpful error message: {text[:200]!r}"


class Counter:
    def __init__(self, target: str):
        self.target, self.n = target, 0

    def hit(self) -> None:
        self.n += 1

    def record(self) -> None:
        record_figure("fuzz", self.target, "cases", self.n, accumulate=True)


# ====================================================================== config
SIZES = ["4KiB", "64KiB", "1MiB", "2MiB", "3KiB", "0", "-4096", "1TiB", "64TiB", "1.5k", "4k", "abc", "", " 8 KiB ",
         "1" * 400, "9" * 30 + "p", "0x1000", "1e6"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.sampled_from(SIZES), st.text(max_size=20), st.lists(st.integers(), max_size=3),
                    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


VALID = {
    "name": st.sampled_from(["fuzz", "x" * 40]), "description": st.text(max_size=10),
    "capacity": st.sampled_from(["4MiB", "1GiB", 1 << 30, "1TiB", "64MiB"]),
    "block_size": st.sampled_from(["4KiB", "64KiB", "2MiB", 8192]),
    "dram_bytes": st.sampled_from(["64KiB", "1MiB", "8MiB", 1 << 20]),
    "data": st.just("none"), "clock": st.sampled_from(["wall", "model"]), "mode": st.just("explicit"),
    "seed": st.integers(0, 2**63 - 1),
    "backend.path": st.sampled_from([None, None, None, "~no_such_user_here/x.img", "~/x.img"]),
    "backend.queue_depth": st.integers(1, 4096), "backend.retries": st.integers(0, 100),
    "backend.faults": st.dictionaries(st.sampled_from(["read_error_rate", "short_write_rate", "spike_ns",
                                                       "capacity_bytes", "power_loss_at_write", "power_loss_pages",
                                                       "power_loss_torn_bytes", "power_loss_action", "gremlins"]),
                                      st.one_of(st.floats(0, 1), st.integers(-2, 5000), st.sampled_from(["kill", "x"])),
                                      max_size=3),
    "firmware.policy": st.sampled_from(["lru", "fifo", "clock", "arc", "s3fifo", "sieve", "hymcache", "belady", "nope"]),
    "firmware.params": st.dictionaries(st.sampled_from(["prefetch_budget", "buffer_fraction", "small_ratio",
                                                        "n_bit_counter", "victim_scan", "high_watermark", "bogus"]),
                                       st.one_of(st.floats(-1, 2), st.just(float("nan")), st.integers(-3, 10**6), st.booleans()),
                                       max_size=2),
    "firmware.write_mode": st.sampled_from([None, "write-back", "write-through", "write-buffer"]),
    "firmware.background": st.sampled_from(["thread", "manual"]),
    "timing": st.dictionaries(st.sampled_from(["link_latency", "dram_bandwidth", "nand_channels", "nand_page_size",
                                               "nand_read_latency", "backing", "write_buffer_bytes", "bogus_timing"]),
                              st.one_of(st.sampled_from(["90ns", "31.5GB/s", "16KiB", "45us", "nand", "dram", "-1ns",
                                                         "0", "fast", "1e3GB/s"]),
                                        st.integers(-5, 10**9), st.floats(allow_nan=True)), max_size=3),
}


@st.composite
def config_layer(draw):
    """A layer that is valid but for (usually) one or two keys: unknown key, wrong type,
    a size that is not a power of two, DRAM larger than the capacity, ..."""
    flat = {key: draw(VALID[key]) for key in draw(st.lists(st.sampled_from(sorted(VALID)), min_size=3, max_size=12,
                                                            unique=True))}
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(VALID) + ["unknown_key", "backend.bogus", "profile"]))
        flat[key] = draw(st.one_of(SCALARS, st.sampled_from(["cmm-h", "cxl-dram", "nope"])) if key == "profile"
                         else SCALARS)
    layer: dict = {}
    for dotted, value in flat.items():
        head, _, tail = dotted.partition(".")
        if tail:
            section = layer.setdefault(head, {})
            if isinstance(section, dict):
                section[tail] = value
        else:
            layer[head] = value
    return layer


config_counter = Counter("config_parser")


def _check_config(layer) -> None:
    config_counter.hit()
    with no_hang("load_config"):
        try:
            cfg = load_config(layer)
        except ConfigError as exc:
            clear_message(exc)
            assert exc.key and exc.source
            return
    # a config that parses must also build a device (timing model, policy params,
    # memory check) or say why; timing-only, so nothing is allocated or written
    from host_runtime.driver import open_device
    cfg = dataclasses.replace(cfg, data="none", mode="explicit")
    with no_hang("open_device"):
        try:
            dev = open_device(cfg)
        except ConfigError as exc:
            clear_message(exc)
            return
        except PolicyParamError as exc:  # an offline policy (belady) in a device: documented by
            assert "offline" in str(exc)  # test_policy_conformance::test_offline_policy_refuses_a_device
            clear_message(exc)
            return
    event("accepted: device opened")
    dev.close()


@FAST
@given(config_layer())
def test_fuzz_config_dicts(layer):
    _check_config(layer)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                 config_layer().map(lambda d: json.dumps(d, default=str))))
def test_fuzz_config_yaml_files(tmp_path, text):
    config_counter.hit()
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with no_hang("load_config(yaml)"):
        try:
            load_config(str(path))
        except ConfigError as exc:
            clear_message(exc)


def test_a_home_directory_that_does_not_exist_is_a_config_error():
    with pytest.raises(ConfigError, match="backend.path"):
        load_config({"backend": {"path": "~no_such_user_here/ssd.img"}})


def test_an_image_name_with_no_room_for_its_sidecar_files_is_a_config_error(tmp_path):
    # found by test_fuzz_config_dicts: the name fit, "<name>.cxlhm.json" did not (OSError)
    with pytest.raises(ConfigError, match="backend.path.*at most 240"):
        load_config({"backend": {"path": str(tmp_path / ("x" * 241))}})
    assert load_config({"backend": {"path": str(tmp_path / ("x" * 240))}}).backend.path.endswith("x" * 240)


def test_zz_record_config_cases():
    config_counter.record()


# ====================================================================== fio job files
FIO_NAMES = sorted(o.name for o in fio_options.OPTIONS)
FIO_VALUES = ["4k", "1m", "randread", "randrw", "read", "write", "trim", "rw:4", "randread:0", "1", "0", "-1", "16",
              "128", "4k/50:8k/50", "4k/60:8k/50", "4k/:", "4k-64k", "zipf:1.2", "pareto:0.5", "normal:10",
              "random:", "10s", "1h", "5m", "cxlhm", "io_uring", "crc32c", "md5", "xxhash", "null", "${HOME}",
              "${NO_SUCH_VAR}", "$pagesize", "$ncpus", "$mb_memory", "100%", "50%", "1e9", "", "99.9:99.99",
              "1000", "1024", "true", "yes", "model", "wall", "9" * 40, "0x10", "lru", "hymcache"]


VALID_FIO = [("ioengine", "cxlhm"), ("size", "1g"), ("size", "4m"), ("runtime", "10"), ("time_based", None),
             ("rw", "randread"), ("rw", "randrw"), ("rw", "write"), ("rw", "read"), ("bs", "4k"), ("bs", "1m"),
             ("iodepth", "32"), ("iodepth", "1"), ("numjobs", "2"), ("rwmixread", "70"),
             ("random_distribution", "zipf:1.2"), ("random_distribution", "zoned_abs:90/128m:10/3968m"),
             ("cxlhm_dram", "256m"), ("bssplit", "4k/50:64k/50"), ("randseed", "7"), ("direct", "1"),
             ("verify", "crc32c"), ("ramp_time", "1"), ("cxlhm_clock", "model")]


@st.composite
def fio_text(draw):
    """A job file like bench/jobs/*.fio with a few lines added, dropped or mangled."""
    lines = ["; fuzz", "[global]"]
    lines += [k if v is None else f"{k}={v}" for k, v in draw(st.lists(st.sampled_from(VALID_FIO), max_size=4))]
    for j in range(draw(st.integers(1, 3))):
        lines.append(f"[job{j}]")
        lines += [k if v is None else f"{k}={v}" for k, v in draw(st.lists(st.sampled_from(VALID_FIO), max_size=5))]
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["option", "flag", "section", "comment", "include", "junk", "drop"]))
        at = draw(st.integers(0, len(lines)))
        if kind == "option":
            name = draw(st.one_of(st.sampled_from(FIO_NAMES), st.text(string.ascii_letters + "_", min_size=1, max_size=8)))
            lines.insert(at, f"{name}={draw(st.one_of(st.sampled_from(FIO_VALUES), st.text(max_size=12)))}")
        elif kind == "flag":
            lines.insert(at, draw(st.sampled_from(FIO_NAMES)))
        elif kind == "section":
            lines.insert(at, draw(st.sampled_from(["[job]", "[]", "[a", "[[x]]", "[ x ]", "[global]"])))
        elif kind == "comment":
            lines.insert(at, draw(st.sampled_from(["; c", "# c", "rw=read ; trailing", "bs=4k#x"])))
        elif kind == "include":
            lines.insert(at, draw(st.sampled_from(["include", "include nope.fio", "include /dev/null", "include ${X}"])))
        elif kind == "junk":
            lines.insert(at, draw(st.text(max_size=30)))
        elif lines:
            del lines[min(at, len(lines) - 1)]
    return "\n".join(lines)


fio_counter = Counter("fio_job_parser")


@FAST
@given(fio_text())
def test_fuzz_fio_job_files(text):
    fio_counter.hit()
    with no_hang("fio job parser"):
        try:
            jobs, _ = build_jobs([read_sections(text, "<fuzz>")])
        except JobFileError as exc:
            clear_message(exc)
            assert exc.path
            return
    event("accepted")
    assert jobs and all(j.values["bs"] for j in jobs)


def test_zz_record_fio_cases():
    fio_counter.record()


# ====================================================================== trace readers
trace_counter = Counter("trace_readers")


def _valid_block_trace(path, n, ts):
    rng = np.random.default_rng(n)
    trace = BlockTrace(blocks=rng.integers(0, 1000, n).astype(np.int64), writes=rng.random(n) < 0.3, block_size=4096,
                       timestamps_ns=np.arange(n, dtype=np.int64) * 1000 if ts else None)
    write_block_trace(path, trace)
    return trace


def _mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for pos, value, cut in edits:
        if cut and out:
            del out[pos % len(out):]
        elif out:
            out[pos % len(out)] = value
    return bytes(out)


EDITS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.booleans()), max_size=4)


@FAST
@given(kind=st.sampled_from(["cbt", "oracle", "random"]), n=st.integers(0, 50), ts=st.booleans(), edits=EDITS,
       raw=st.binary(max_size=300))
def test_fuzz_binary_trace_readers(tmp_path, kind, n, ts, edits, raw):
    trace_counter.hit()
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "t.bin"
    if kind == "cbt":
        _valid_block_trace(path, n, ts)
        path.write_bytes(_mutate(path.read_bytes(), edits))
    elif kind == "oracle":
        write_oracle_general(path, _valid_block_trace(path, n, ts))
        path.write_bytes(_mutate(path.read_bytes(), edits))
    else:
        path.write_bytes(raw)
    for reader in (read_block_trace, read_oracle_general):
        with no_hang(reader.__name__):
            try:
                trace = reader(path)
            except TraceError as exc:
                clear_message(exc)
                continue
        assert trace.blocks.dtype == np.int64 and (trace.blocks >= 0).all()
        assert trace.blocks.shape == trace.writes.shape


_NUMBERS = st.integers(-5, 10**20).map(str)
CSV_FIELDS = st.one_of(_NUMBERS, _NUMBERS, _NUMBERS, st.sampled_from(["get", "set", "read", "write", "del", "", "nan",
                                                                    "inf", "1e5", "-0", "x", " 7", "3.5"]),
                       st.text(max_size=6))
_GOOD_SPECS = st.sampled_from(["obj-id-col=2", "time-col=1, obj-id-col=2, obj-size-col=3, op-col=4, delimiter=,",
                               "time-col=1, obj-id-col=2, obj-size-col=3", "obj-id-col=2, op-col=3", "obj-id-col=1",
                               "obj-id-col=1, obj-id-is-num=false", "obj-id-col=2, has-header=true",
                               "obj-id-col=1, delimiter=;", "obj-id-col=2, delimiter=tab"])
_BAD_SPECS = st.sampled_from(["obj-id-col=9", "obj-id-col=0", "time-col=1", "obj-id-col=2, delimiter=;;",
                              "obj-id-col=2, has-header=maybe", "obj-id-col=x", "bogus=1, obj-id-col=1", "", ",,,"])
CSV_SPECS = st.one_of(_GOOD_SPECS, _GOOD_SPECS, _GOOD_SPECS, _BAD_SPECS, st.text(max_size=40))  # mostly specs that parse


@FAST
@given(spec=CSV_SPECS, rows=st.lists(st.lists(CSV_FIELDS, max_size=5), max_size=12), sep=st.sampled_from([",", "\t", ";"]))
def test_fuzz_csv_trace_reader(tmp_path, spec, rows, sep):
    trace_counter.hit()
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "t.csv"
    path.write_text("\n".join(sep.join(r) for r in rows), encoding="utf-8", errors="surrogatepass")
    with no_hang("read_csv"):
        try:
            trace = read_csv(path, spec)
        except TraceError as exc:
            clear_message(exc)
            return
        except ValueError as exc:  # a bad spec: parse_csv_spec's documented error, naming the spec
            assert "CSV spec" in str(exc), exc
            clear_message(exc)
            return
    assert (trace.blocks >= 0).all() and trace.blocks.shape == trace.writes.shape


JSON_VALUES = st.one_of(st.integers(-10, 2**70), st.floats(allow_nan=True), st.text(max_size=5), st.none(), st.booleans(),
                        st.lists(st.integers(-3, 2**66), max_size=6))


@FAST
@given(lines=st.lists(st.one_of(
    st.fixed_dictionaries({"timestamp": JSON_VALUES, "input_length": JSON_VALUES, "output_length": JSON_VALUES,
                           "hash_ids": JSON_VALUES}).map(json.dumps),
    st.fixed_dictionaries({"timestamp": st.integers(0, 10**6), "input_length": st.integers(0, 10**5),
                           "output_length": st.integers(0, 999),
                           "hash_ids": st.lists(st.integers(0, 2**40), max_size=8)}).map(json.dumps),
    st.text(max_size=30), st.just(""), st.just("[1,2]"), st.just("{}")), max_size=8),
    limit=st.one_of(st.none(), st.integers(0, 5)))
def test_fuzz_mooncake_trace_reader(tmp_path, lines, limit):
    trace_counter.hit()
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "t.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")  # (lone surrogates: not UTF-8)
    for fmt in (None, "mooncake"):
        with no_hang("mooncake reader"):
            try:
                if fmt is None:
                    requests = read_requests(path, limit=limit)
                    assert limit is None or len(requests) <= limit
                    assert all((r.hash_ids >= 0).all() for r in requests)
                else:
                    load_trace(path, fmt, limit=limit)
            except TraceError as exc:
                clear_message(exc)


@pytest.mark.parametrize("reader", ["mooncake", "csv"])
def test_non_utf8_trace_text_is_a_trace_error(tmp_path, reader):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\x81\x00abc\n1,2\n")
    with pytest.raises(TraceError):
        read_requests(path) if reader == "mooncake" else read_csv(path, "obj-id-col=1")


def test_zz_record_trace_cases():
    trace_counter.record()


# ====================================================================== shim adapters
SHIM_SIZE = 8192
REFERENCE = {f"ref-{i}".encode(): np.full(SHIM_SIZE, 200 + i, np.uint8) for i in range(4)}
KEYS = st.one_of(st.sampled_from([b"a", b"b", "c", "d", 7, 2**64 + 3, b"x" * 1024]),
                 st.binary(min_size=0, max_size=12), st.text(max_size=8), st.integers(-5, 2**128 - 1),  # see below
                 st.sampled_from([None, 1.5, b"", [b"a"], True, b"y" * 1025]))
SIZES_ = st.one_of(st.sampled_from([SHIM_SIZE, SHIM_SIZE - 1, SHIM_SIZE + 1, 0, 1, 4096, 1 << 40]),
                   st.integers(-10, 3 * SHIM_SIZE))
BUFFERS = st.one_of(SIZES_.map(lambda n: ("np", n)), st.just(("bytes", SHIM_SIZE)), st.just(("readonly", SHIM_SIZE)),
                    st.just(("list", SHIM_SIZE)), st.just(("f32", SHIM_SIZE)), st.just(("noncontig", SHIM_SIZE)),
                    st.sampled_from([("none", 0), ("str", 0), ("int", 0)]))
OPS = st.lists(st.tuples(st.sampled_from([
    "put", "get", "get_loose", "exists", "prefix", "allocate", "remove", "pin", "unpin", "prefetch", "read_range",
    "get_many", "touch", "session",
    "mc_put", "mc_get", "mc_register", "mc_exist", "mc_size", "mc_remove", "mc_batch",
    "sg_set", "sg_get", "sg_exists", "sg_batch", "sg_v1",
    "lm_put", "lm_get", "lm_contains", "lm_remove",
    "vl_lookup", "vl_store", "vl_load", "vl_events"]),
    KEYS, SIZES_, BUFFERS, st.integers(-2**64, 2**64)), min_size=1, max_size=14)

SHIM_ERRORS = (ValueError, TypeError, KeyError, PermissionError)


def _buffer(kind, n):
    if kind == "np":
        return np.zeros(max(0, min(n, 1 << 20)), np.uint8)
    if kind == "bytes":
        return bytes(n)
    if kind == "readonly":
        a = np.zeros(n, np.uint8)
        a.flags.writeable = False
        return a
    if kind == "list":
        return [np.zeros(n // 2, np.uint8), np.zeros(n - n // 2, np.uint8)]
    if kind == "f32":
        return np.zeros(n // 4, np.float32)
    if kind == "noncontig":
        return np.zeros(2 * n, np.uint8)[::2]
    return {"none": None, "str": "abc", "int": 5}[kind]


class _HostPool:
    """SGLang's host KV pool, the parts the backend uses (flat pages, 4 tokens each)."""
    page_size = 4
    get_page_buffer_meta = None

    def __init__(self):
        self.kv_buffer = np.zeros((32, SHIM_SIZE // 4), np.uint8)

    def get_data_page(self, index, flat=True):
        return self.kv_buffer[index:index + 4].reshape(-1).copy()

    def get_dummy_flat_data_page(self):
        return np.empty(SHIM_SIZE, np.uint8)

    def set_from_flat_data_page(self, index, page):
        self.kv_buffer[index:index + 4] = np.asarray(page).reshape(4, -1)


@pytest.fixture(scope="module")
def shim_world(tmp_path_factory):
    from host_runtime.driver import open_device
    from host_runtime.kvstore import KVStore, NullHints
    from host_runtime.shim.api import KVShim
    from host_runtime.shim.lmcache import CxlhmRemoteConnector
    from host_runtime.shim.mooncake import CxlhmMooncakeStore
    from host_runtime.shim.sglang import CxlhmHiCacheStorage
    from host_runtime.shim.vllm import CxlhmTier
    path = tmp_path_factory.mktemp("shimfuzz") / "s.img"
    handle = open_device({"capacity": 1 << 22, "block_size": 4096, "dram_bytes": 8 * 4096, "backend": {"path": str(path)}})
    store = KVStore(handle, hints=NullHints())
    ref = KVShim(store.tenant("reference"))
    for key, value in REFERENCE.items():  # another tenant's data ...
        ref.put_from(key, value)
    shim = KVShim(store.tenant("fuzz"))
    for key, value in REFERENCE.items():  # ... and the fuzzed tenant's own, under keys the fuzzer never names
        shim.put_from(b"own-" + key, value)
    ref.pin(list(REFERENCE))  # pinned: the fuzzer's puts fill the window, and must not evict them
    shim.pin([b"own-" + k for k in REFERENCE])
    store.flush()
    pool = np.zeros(4 * SHIM_SIZE, np.uint8)
    world = {"store": store, "handle": handle, "ref": ref, "shim": shim, "pool": pool,
             "mc": CxlhmMooncakeStore(shim), "sg": CxlhmHiCacheStorage(shim=shim),
             "lm": CxlhmRemoteConnector(shim=shim),
             "vl": CxlhmTier(SimpleNamespace(kv_events_config=SimpleNamespace(enable_kv_cache_events=True)),
                             memoryview(np.zeros((4, SHIM_SIZE), np.uint8)), "CxlhmTier", shim=shim),
             "reservations": [], "tickets": []}
    world["mc"].register_buffer(pool.ctypes.data, pool.nbytes)
    world["sg"].register_mem_pool_host(_HostPool())
    yield world
    store.close()
    handle.close()


def _run_op(w, op, key, size, buf_kind, number):
    from host_runtime.kvstore import PutStatus, Reservation
    from host_runtime.shim import mooncake as mc
    shim, pool = w["shim"], w["pool"]
    buf = _buffer(*buf_kind) if buf_kind[0] != "np" else _buffer("np", size)
    ptr = pool.ctypes.data + (number % (2 * pool.nbytes)) - pool.nbytes // 2 if number % 3 else number
    if op == "put":
        assert isinstance(shim.put_from(key, buf), PutStatus)
    elif op == "get":
        got = shim.get_into(key, buf)
        assert got is None or isinstance(got, int)
    elif op == "get_loose":
        shim.get_into(key, buf, exact=False)
    elif op == "exists":
        assert isinstance(shim.exists([key, b"a"]), list)
    elif op == "prefix":
        assert 0 <= shim.lookup_prefix([key, b"b", key]) <= 3
    elif op == "allocate":
        res = shim.allocate(key, size)
        if isinstance(res, Reservation):
            try:
                res.write(buf, number % (abs(size) + 1))
            except SHIM_ERRORS:
                pass
            (shim.commit if number % 2 else shim.abort)(res)
    elif op == "remove":
        shim.remove(key)
    elif op in ("pin", "unpin"):
        getattr(shim, op)([key])
    elif op == "prefetch":
        shim.wait(shim.prefetch([key, b"a"], deadline_ns=abs(number) % 10**9))
    elif op == "read_range":
        shim.read_range(key, number % (2 * SHIM_SIZE) - 10, buf)
    elif op == "get_many":
        shim.get_many_into([key, b"a"], buf)
    elif op == "touch":
        shim.touch([key])
    elif op == "session":
        s = shim.session(str(number % 3))
        s.append(key, buf) if number % 2 else s.end()
    elif op == "mc_put":
        assert shim_code(w["mc"].put_from(key, ptr, size))
    elif op == "mc_get":
        assert shim_code(w["mc"].get_into(key, ptr, size))
    elif op == "mc_register":
        assert w["mc"].register_buffer(number, size) in (mc.OK, mc.INVALID_PARAMS)
        w["mc"].unregister_buffer(number)
    elif op == "mc_exist":
        assert w["mc"].is_exist(key) in (1, 0, -1)
    elif op == "mc_size":
        assert isinstance(w["mc"].get_size(key), int)
    elif op == "mc_remove":
        assert w["mc"].remove(key) in (mc.OK, mc.OBJECT_NOT_FOUND, mc.INVALID_PARAMS)
    elif op == "mc_batch":
        assert all(shim_code(c) for c in w["mc"].batch_get_into([key, key], [ptr, ptr], [size]))
    elif op == "sg_set":
        assert w["sg"].set(key, buf) in (True, False)
    elif op == "sg_get":
        w["sg"].get(key, buf)
        w["sg"].get(key, None, target_location=ptr, target_sizes=size)
    elif op == "sg_exists":
        assert w["sg"].exists(key) in (True, False)
    elif op == "sg_batch":
        assert isinstance(w["sg"].batch_exists([key, key]), int)
    elif op == "sg_v1":
        getattr(w["sg"], "batch_set_v1" if number % 2 else "batch_get_v1")([key], np.arange(abs(size) % 9) + number % 24)
    elif op == "lm_put":
        from host_runtime.shim.lmcache import BytesMemoryObj
        obj = BytesMemoryObj(max(0, min(size, 1 << 16)))
        asyncio.run(w["lm"].put(key, obj))
    elif op == "lm_get":
        asyncio.run(w["lm"].get(key))
    elif op == "lm_contains":
        w["lm"].batched_contains([key, b"a"])
    elif op == "lm_remove":
        w["lm"].remove_sync(key)
    elif op == "vl_lookup":
        assert w["vl"].lookup(key, None).name in ("HIT", "MISS", "RETRY")
    elif op in ("vl_store", "vl_load"):
        job = SimpleNamespace(job_id=number, keys=[key], chunk_ids=[number % 6], is_promotion=op == "vl_load")
        try:
            (w["vl"].submit_store if op == "vl_store" else w["vl"].submit_load)(job)
        finally:
            w["vl"].drain_jobs()
            w["vl"].get_finished_jobs()
    elif op == "vl_events":
        list(w["vl"].take_events())


def shim_code(code) -> bool:
    from host_runtime.shim import mooncake as mc
    return isinstance(code, int) and (code >= 0 or code in (mc.INVALID_PARAMS, mc.OBJECT_NOT_FOUND,
                                                            mc.OBJECT_ALREADY_EXISTS, mc.NO_AVAILABLE_HANDLE))


shim_counter = Counter("shim_adapters")


def _reserved(key) -> bool:
    try:
        from host_runtime import kvkeys
        return kvkeys.normalize_key(key).startswith((b"own-", b"ref-"))
    except Exception:  # noqa: BLE001 - not a key at all
        return False


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(OPS)
def test_fuzz_shim_adapter_entry_points(shim_world, ops):
    w = shim_world
    for op, key, size, buf_kind, number in ops:
        if _reserved(key):
            continue
        shim_counter.hit()
        with no_hang(f"shim {op}"):
            try:
                _run_op(w, op, key, size, buf_kind, number)
            except SHIM_ERRORS as exc:
                clear_message(exc)
    # stored data unchanged: the other tenant's and this tenant's own chunks read back exact
    out = np.empty(SHIM_SIZE, np.uint8)
    for key, value in REFERENCE.items():
        assert w["ref"].get_into(key, out) == SHIM_SIZE and np.array_equal(out, value)
        assert w["shim"].get_into(b"own-" + key, out) == SHIM_SIZE and np.array_equal(out, value)
    w["store"].check()  # index and allocator agree after whatever the fuzzer did


def test_int_keys_of_129_bits_are_refused_with_a_value_error():
    from host_runtime import kvkeys
    with pytest.raises(ValueError):
        kvkeys.normalize_key(2**128)


def test_zz_record_shim_cases():
    shim_counter.record()


# ====================================================================== longer runs
@pytest.mark.slow
@settings(max_examples=3000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(config_layer().map(lambda x: ("config", x)), fio_text().map(lambda x: ("fio", x))))
def test_fuzz_parsers_long(case):
    kind, value = case
    if kind == "config":
        _check_config(value)
    else:
        test_fuzz_fio_job_files.hypothesis.inner_test(value)


# ====================================================================== atheris (optional)
def atheris_corpus(target: str, folder: Path) -> Path:
    """A seed corpus for a target: the project's own valid inputs (libFuzzer adds to it)."""
    import shutil
    folder.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    if target == "fio":
        for job in (repo / "bench" / "jobs").glob("*.fio"):
            shutil.copy(job, folder)
    elif target == "config":
        for profile in (repo / "cxlhm" / "profiles").glob("*.yaml"):
            shutil.copy(profile, folder)
    else:
        trace = _valid_block_trace(folder / "seed.cbt", 20, True)
        write_oracle_general(folder / "seed.oracle", trace)
        (folder / "seed.jsonl").write_text('{"timestamp": 1, "input_length": 600, "output_length": 5, '
                                           '"hash_ids": [1, 2]}\n')
    return folder


def test_atheris_harness_runs_when_installed(tmp_path):
    """The coverage-guided harness below, 500 executions per target from a seed corpus,
    when atheris is installed (it is not a dependency)."""
    pytest.importorskip("atheris")
    import subprocess
    for target in ATHERIS_TARGETS:
        corpus = atheris_corpus(target, tmp_path / target)
        out = subprocess.run([sys.executable, __file__, target, str(corpus), "-runs=500",
                              f"-artifact_prefix={tmp_path}/"],
                             capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)
        assert out.returncode == 0, (target, out.stderr[-3000:])
        runs = int(next(line.split()[1] for line in out.stderr.splitlines() if line.startswith("Done ")))
        record_figure("fuzz", f"atheris_{target}", "cases", runs, accumulate=True)


def _mod(name: str):
    """The module as loaded now (the atheris runner reloads cxlhm instrumented)."""
    import importlib
    return importlib.import_module(name)


def _atheris_config(data: bytes) -> None:
    text = data.decode("utf-8", "replace")  # as a file is read: a seed corpus of YAML files works as is
    path = Path(tempfile.gettempdir()) / f"cxlhm-atheris-{os.getpid()}.yaml"
    path.write_text(text)
    config = _mod("cxlhm.config")
    try:
        config.load_config(str(path))
    except config.ConfigError:
        pass


def _atheris_fio(data: bytes) -> None:
    text = data.decode("utf-8", "replace")  # seed with bench/jobs/*.fio
    jobfile = _mod("cxlhm_apps.fio.jobfile")
    try:
        jobfile.build_jobs([jobfile.read_sections(text, "<atheris>")])
    except jobfile.JobFileError:
        pass


def _atheris_traces(data: bytes) -> None:
    path = Path(tempfile.gettempdir()) / f"cxlhm-atheris-{os.getpid()}.trace"
    path.write_bytes(data)
    error = _mod("cxlhm.traces").TraceError
    for reader in (_mod("cxlhm.traces.blocktrace").read_block_trace,
                   _mod("cxlhm.traces.oracle_general").read_oracle_general,
                   _mod("cxlhm.traces.mooncake").read_requests):
        try:
            reader(path)
        except error:
            pass


ATHERIS_TARGETS = {"config": _atheris_config, "fio": _atheris_fio, "traces": _atheris_traces}

if __name__ == "__main__":  # python tests/test_fuzz.py TARGET [CORPUS_DIR] [libFuzzer options]
    import atheris
    # reload cxlhm with coverage instrumentation (only cxlhm: instrumenting numpy and
    # hypothesis too would make every run crawl)
    for name in [m for m in sys.modules if m == "cxlhm" or m.startswith("cxlhm.")]:
        del sys.modules[name]
    with atheris.instrument_imports(include=["cxlhm"]):
        import cxlhm.config  # noqa: F401
        import cxlhm_apps.fio.jobfile  # noqa: F401
        import cxlhm.traces.blocktrace  # noqa: F401
        import cxlhm.traces.mooncake  # noqa: F401
        import cxlhm.traces.oracle_general  # noqa: F401
    target = ATHERIS_TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0]] + sys.argv[2:], target)
    atheris.Fuzz()
