"""The parser fuzz targets: what is drawn for each untrusted text or file input, and the
check each drawn input must pass. Inputs sit near the edges (valid-looking text with one
field wrong, binary files mutated from valid ones, YAML that nests or lies).

Allowed outcomes: a parsed value that holds up (a config also opens a timing-only
device), or the documented error (ConfigError naming key and source, JobFileError
naming file and line, TraceError, the CSV spec's ValueError) with a clear message -
never another exception and never a hang. tests/test_fuzz.py runs them under pytest,
tests/fuzz_volume.py at volume."""
from __future__ import annotations

import dataclasses
import json
import os
import string
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from hypothesis import event
from hypothesis import strategies as st

from cxlhm.config import ConfigError, load_config
from cxlhm.traces import TraceError
from cxlhm.traces.blocktrace import BlockTrace, read_block_trace, write_block_trace
from cxlhm.traces.formats import load_trace
from cxlhm.traces.lcs_csv import read_csv
from cxlhm.traces.mooncake import read_requests
from cxlhm.traces.oracle_general import read_oracle_general, write_oracle_general
from cxlhm_apps.commands._device_args import config_overrides
from cxlhm_apps.fio import options as fio_options
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from firmware_policies import PolicyParamError
from fuzzkit import clear_message, no_hang

# a parsed config also builds a device (timing model, policy params, memory check);
# the volume run does that for one accepted config in DEVICE_SAMPLE (the parse is the target)
DEVICE_SAMPLE = 1
_accepted = [0]


def _event(text: str) -> None:
    try:
        event(text)
    except Exception:  # noqa: BLE001 - outside a hypothesis test
        pass


# ====================================================================== config: dicts, YAML files, --set
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
    "firmware.write_behind": st.sampled_from([True, False, "yes", 1, None]),
    "timing": st.dictionaries(st.sampled_from(["link_latency", "dram_bandwidth", "nand_channels", "nand_page_size",
                                               "nand_read_latency", "backing", "write_buffer_bytes", "bogus_timing"]),
                              st.one_of(st.sampled_from(["90ns", "31.5GB/s", "16KiB", "45us", "nand", "dram", "-1ns",
                                                         "0", "fast", "1e3GB/s"]),
                                        st.integers(-5, 10**9), st.floats(allow_nan=True)), max_size=3),
}


_LAYER_KEYS = st.lists(st.sampled_from(sorted(VALID)), min_size=3, max_size=12, unique=True)
_EXTRA_KEYS = st.sampled_from(sorted(VALID) + ["unknown_key", "backend.bogus", "profile"])
_PROFILE_VALUES = st.one_of(SCALARS, st.sampled_from(["cmm-h", "cxl-dram", "nope"]))


@st.composite
def config_layer(draw):
    """A layer that is valid but for (usually) one or two keys: unknown key, wrong type,
    a size that is not a power of two, DRAM larger than the capacity, ..."""
    flat = {key: draw(VALID[key]) for key in draw(_LAYER_KEYS)}
    for _ in range(draw(st.integers(0, 2))):
        key = draw(_EXTRA_KEYS)
        flat[key] = draw(_PROFILE_VALUES if key == "profile" else SCALARS)
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




def _build_device(cfg) -> None:
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
    _event("accepted: device opened")
    dev.close()


def _accepted_config(cfg) -> None:
    _accepted[0] += 1
    if _accepted[0] % DEVICE_SAMPLE == 0:
        _build_device(cfg)


def check_config_layer(layer) -> None:
    with no_hang("load_config"):
        try:
            cfg = load_config(layer)
        except ConfigError as exc:
            clear_message(exc)
            assert exc.key and exc.source
            return
    _accepted_config(cfg)


def check_config_yaml(text: str, folder: str) -> None:
    path = Path(folder) / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with no_hang("load_config(yaml)"):
        try:
            load_config(str(path))
        except ConfigError as exc:
            clear_message(exc)


YAML_TEXT = st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                      config_layer().map(lambda d: json.dumps(d, default=str)))

SET_KEYS = st.one_of(st.sampled_from(sorted(VALID) + ["unknown_key", "backend.bogus", "profile", "firmware..policy",
                                                      "", ".", "a.b.c.d", "timing.nand_channels", "firmware"]),
                     st.text(string.ascii_letters + "._", max_size=12))
SET_VALUES = st.one_of(st.sampled_from(SIZES), st.sampled_from([
    "[unclosed", "{a: 1", "{a: 1}", "!!python/object:os.system", "&a [*a, *a]", "*nope", "'x", '"\\u12"',
    "~", "null", "yes", ".nan", "-.inf", "0o777", "0b101", "1_000", "2^80", str(2**80), "- a\n- b", ": x",
    "lru", "hymcache", "write-back", "model", "none", "\t", "#c"]),
    st.integers(1, 300).map(lambda n: "[" * n + "]" * n), st.text(max_size=24))
SET_OPTIONS = st.lists(st.one_of(st.tuples(SET_KEYS, SET_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"),
                                 st.text(max_size=16)), min_size=1, max_size=4)


def check_set_options(items: list[str]) -> None:
    """`--set KEY=VALUE` options as the CLI reads them, then the config they override."""
    with no_hang("--set"):
        try:
            cfg = load_config(None, config_overrides(SimpleNamespace(overrides=items, policy=None)))
        except ConfigError as exc:
            clear_message(exc)
            assert exc.key is not None and exc.source
            return
    _accepted_config(cfg)


CONFIG_INPUTS = st.one_of(config_layer().map(lambda x: ("dict", x)), YAML_TEXT.map(lambda x: ("yaml", x)),
                          SET_OPTIONS.map(lambda x: ("set", x)))


def check_config_input(case, folder: str) -> None:
    kind, value = case
    if kind == "dict":
        check_config_layer(value)
    elif kind == "yaml":
        check_config_yaml(value, folder)
    else:
        check_set_options(value)


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


# built once: a strategy built inside a draw is validated again on every case
_FIO_OPTIONS = st.lists(st.sampled_from(VALID_FIO), max_size=4)
_FIO_JOB_OPTIONS = st.lists(st.sampled_from(VALID_FIO), max_size=5)
_FIO_EDIT_KINDS = st.sampled_from(["option", "flag", "section", "comment", "include", "junk", "drop"])
_FIO_NAME = st.one_of(st.sampled_from(FIO_NAMES), st.text(string.ascii_letters + "_", min_size=1, max_size=8))
_FIO_VALUE = st.one_of(st.sampled_from(FIO_VALUES), st.text(max_size=12))
_FIO_LINES = {
    "flag": st.sampled_from(FIO_NAMES),
    "section": st.sampled_from(["[job]", "[]", "[a", "[[x]]", "[ x ]", "[global]"]),
    "comment": st.sampled_from(["; c", "# c", "rw=read ; trailing", "bs=4k#x"]),
    "include": st.sampled_from(["include", "include nope.fio", "include /dev/null", "include ${X}"]),
    "junk": st.text(max_size=30),
}


@st.composite
def fio_text(draw):
    """A job file like bench/jobs/*.fio with a few lines added, dropped or mangled."""
    lines = ["; fuzz", "[global]"]
    lines += [k if v is None else f"{k}={v}" for k, v in draw(_FIO_OPTIONS)]
    for j in range(draw(st.integers(1, 3))):
        lines.append(f"[job{j}]")
        lines += [k if v is None else f"{k}={v}" for k, v in draw(_FIO_JOB_OPTIONS)]
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(_FIO_EDIT_KINDS)
        at = draw(st.integers(0, len(lines)))
        if kind == "option":
            lines.insert(at, f"{draw(_FIO_NAME)}={draw(_FIO_VALUE)}")
        elif kind in _FIO_LINES:
            lines.insert(at, draw(_FIO_LINES[kind]))
        elif lines:
            del lines[min(at, len(lines) - 1)]
    return "\n".join(lines)


def check_fio_text(text: str) -> None:
    with no_hang("fio job parser"):
        try:
            jobs, _ = build_jobs([read_sections(text, "<fuzz>")])
        except JobFileError as exc:
            clear_message(exc)
            assert exc.path
            return
    _event("accepted")
    assert jobs and all(j.values["bs"] for j in jobs)


# ====================================================================== trace readers
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


BINARY_TRACES = st.tuples(st.sampled_from(["cbt", "oracle", "random"]), st.integers(0, 50), st.booleans(), EDITS,
                          st.binary(max_size=300))


def check_binary_trace(case, folder: str) -> None:
    kind, n, ts, edits, raw = case
    path = Path(folder) / "t.bin"
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


CSV_TRACES = st.tuples(CSV_SPECS, st.lists(st.lists(CSV_FIELDS, max_size=5), max_size=12), st.sampled_from([",", "\t", ";"]))


def check_csv_trace(case, folder: str) -> None:
    spec, rows, sep = case
    path = Path(folder) / "t.csv"
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


JSONL_TRACES = st.tuples(st.lists(st.one_of(
    st.fixed_dictionaries({"timestamp": JSON_VALUES, "input_length": JSON_VALUES, "output_length": JSON_VALUES,
                           "hash_ids": JSON_VALUES}).map(json.dumps),
    st.fixed_dictionaries({"timestamp": st.integers(0, 10**6), "input_length": st.integers(0, 10**5),
                           "output_length": st.integers(0, 999),
                           "hash_ids": st.lists(st.integers(0, 2**40), max_size=8)}).map(json.dumps),
    st.text(max_size=30), st.just(""), st.just("[1,2]"), st.just("{}")), max_size=8),
    st.one_of(st.none(), st.integers(0, 5)))


def check_jsonl_trace(case, folder: str) -> None:
    lines, limit = case
    path = Path(folder) / "t.jsonl"
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


TRACE_INPUTS = st.one_of(BINARY_TRACES.map(lambda x: ("binary", x)), CSV_TRACES.map(lambda x: ("csv", x)),
                         JSONL_TRACES.map(lambda x: ("jsonl", x)))


def check_trace_input(case, folder: str) -> None:
    kind, value = case
    {"binary": check_binary_trace, "csv": check_csv_trace, "jsonl": check_jsonl_trace}[kind](value, folder)


def scratch_folder() -> str:
    """A private folder for the files a volume run writes and rewrites per case."""
    return tempfile.mkdtemp(prefix=f"cxlhm-fuzz-{os.getpid()}-")


# ====================================================================== raw bytes (the coverage-guided run)
CSV_SPEC_CHOICES = ["obj-id-col=2", "time-col=1, obj-id-col=2, obj-size-col=3, op-col=4, delimiter=,",
                    "obj-id-col=1, obj-id-is-num=false", "obj-id-col=2, has-header=true", "obj-id-col=1, delimiter=;",
                    "obj-id-col=2, delimiter=tab"]


def check_config_bytes(data: bytes, folder: str) -> None:
    """Raw bytes as a config file (first byte even) or, line by line, as --set options."""
    if not data or data[0] % 2 == 0:
        path = Path(folder) / "fuzz.yaml"
        path.write_bytes(data[1:])
        with no_hang("load_config(file)"):
            try:
                cfg = load_config(str(path))
            except ConfigError as exc:
                clear_message(exc)
                return
        _accepted_config(cfg)
    else:
        check_set_options(data[1:].decode("utf-8", "surrogateescape").splitlines()[:8] or [""])


def check_fio_bytes(data: bytes) -> None:
    check_fio_text(data.decode("utf-8", "replace"))


def check_trace_bytes(data: bytes, folder: str) -> None:
    """Raw bytes as a trace file: block and oracleGeneral readers, a CSV reader (the second
    byte picks a spec), the Mooncake reader - the first byte picks which."""
    kind = data[0] % 3 if data else 0
    body = data[2:]
    if kind == 0:
        check_binary_trace(("random", 0, False, [], body), folder)
        return
    path = Path(folder) / "t.txt"
    path.write_bytes(body)
    with no_hang("text trace reader"):
        try:
            if kind == 1:
                spec = CSV_SPEC_CHOICES[(data[1] if len(data) > 1 else 0) % len(CSV_SPEC_CHOICES)]
                trace = read_csv(path, spec)
                assert (trace.blocks >= 0).all() and trace.blocks.shape == trace.writes.shape
            else:
                requests = read_requests(path)
                assert all((r.hash_ids >= 0).all() for r in requests)
        except TraceError as exc:
            clear_message(exc)


def seed_corpus(target: str, folder: Path) -> Path:
    """The project's own valid inputs, as the coverage-guided run's first corpus."""
    import shutil
    folder.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    if target == "fio":
        for job in (repo / "bench" / "jobs").glob("*.fio"):
            shutil.copy(job, folder)
    elif target == "config":
        for profile in (repo / "cxlhm" / "profiles").glob("*.yaml"):
            (folder / profile.name).write_bytes(b"\x00" + profile.read_bytes())
        (folder / "set").write_bytes(b"\x01dram_bytes=64KiB\nfirmware.policy=lru\nbackend.faults.spike_ns=5\n")
    else:
        (folder / "cbt").write_bytes(b"\x00\x00" + _block_trace_bytes(folder / "seed.cbt"))
        (folder / "csv").write_bytes(b"\x01\x01" + b"1,2,4096,get\n2,3,4096,set\n")
        (folder / "jsonl").write_bytes(b"\x02\x00" + b'{"timestamp": 1, "input_length": 600, "output_length": 5, '
                                       b'"hash_ids": [1, 2]}\n')
        (folder / "seed.cbt").unlink()
    return folder


def _block_trace_bytes(path: Path) -> bytes:
    _valid_block_trace(path, 20, True)
    return path.read_bytes()
