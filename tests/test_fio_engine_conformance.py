"""Every built-in fio ioengine through the conformance suite (cxlhm_apps.fio.testing),
and the protocol's registry: versions, flags and the engines' own option declarations."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.registry import BrokenEntry
from cxlhm_apps.fio.ioengine import (ENGINES, IOENGINE_VERSION, EngineFlags, IOEngineOps, engine_options,
                                     refused_engine_option)
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, load_jobs, read_sections
from cxlhm_apps.fio.options import OPTIONS
from cxlhm_apps.fio.testing import IOEngineConformance

BUILT_IN = ("cxlhm", "psync", "sync", "pvsync", "pvsync2", "mmap", "posixaio", "libaio", "io_uring")


PRIO_VALUES = {"prioclass": "2", "prio": "4"}  # (the job's priority: an option of every file engine)
CMDPRIO_VALUES = {"cmdprio_percentage": "20,30", "cmdprio_class": "2", "cmdprio": "3",
                  "cmdprio_bssplit": "64k/25/1/1:64k/75/3/2,4k/10", "prioclass": "3", "prio": "4"}


class TestCxlhmEngine(IOEngineConformance):
    engine = "cxlhm"
    job_lines = "cxlhm_dram=1m\ncxlhm_block_size=4k\n"
    option_values = {"cxlhm_profile": "cmm-h", "cxlhm_policy": "lru", "cxlhm_dram": "1m", "cxlhm_block_size": "4k",
                     "cxlhm_clock": "wall", **CMDPRIO_VALUES}


class TestPsyncEngine(IOEngineConformance):
    engine = "psync"
    option_values = PRIO_VALUES


class TestSyncEngine(IOEngineConformance):
    engine = "sync"
    option_values = PRIO_VALUES


class TestPvsyncEngine(IOEngineConformance):
    engine = "pvsync"
    option_values = PRIO_VALUES


class TestPvsync2Engine(IOEngineConformance):
    engine = "pvsync2"
    option_values = {"hipri": "0", **PRIO_VALUES}


class TestMmapEngine(IOEngineConformance):
    engine = "mmap"
    option_values = PRIO_VALUES


class TestPosixaioEngine(IOEngineConformance):
    engine = "posixaio"
    option_values = PRIO_VALUES


class TestLibaioEngine(IOEngineConformance):
    engine = "libaio"
    option_values = CMDPRIO_VALUES


class TestIoUringEngine(IOEngineConformance):
    engine = "io_uring"
    option_values = CMDPRIO_VALUES


def parse(text: str):
    return build_jobs([read_sections(text, "t.fio")])[0]


def test_every_built_in_engine_is_one_ops_object_of_this_version():
    assert set(BUILT_IN) <= set(ENGINES.builtin_names())
    for name in BUILT_IN:
        ops = ENGINES.get(name)
        assert isinstance(ops, IOEngineOps) and ops.name == name and ops.version == IOENGINE_VERSION
    assert ENGINES.get("cxlhm").flags == EngineFlags.USES_DEVICE | EngineFlags.MEASURES_SLAT
    assert {n for n in BUILT_IN if ENGINES.get(n).sync} == {"psync", "sync", "pvsync", "pvsync2", "mmap"}


def test_an_engine_of_another_version_is_broken_naming_both_versions():
    old = dataclasses.replace(ENGINES.get("psync"), name="psync-old", version=IOENGINE_VERSION - 1)
    ENGINES.add("psync-old", old)
    try:
        with pytest.raises(BrokenEntry, match=f"version {IOENGINE_VERSION - 1}; this cxlhm runs version "
                                              f"{IOENGINE_VERSION}"):
            ENGINES.get("psync-old")
        with pytest.raises(JobFileError, match=r"t.fio:2: option 'ioengine'.*version 0"):
            parse("[j]\nioengine=psync-old\n")
    finally:
        ENGINES.unregister("psync-old")


def test_an_engine_may_not_take_a_shared_option_name():
    bad = dataclasses.replace(ENGINES.get("psync"), name="bad", options=ENGINES.get("pvsync2").options)
    from cxlhm_apps.fio.options import BY_NAME
    bad = dataclasses.replace(bad, options=(dataclasses.replace(bad.options[0], name="iodepth"),))
    assert "iodepth" in BY_NAME
    ENGINES.add("bad", bad)
    try:
        with pytest.raises(BrokenEntry, match="'iodepth' is one of the job options every engine shares"):
            ENGINES.get("bad")
    finally:
        ENGINES.unregister("bad")


def test_engine_options_come_from_the_engines_declarations():
    options = engine_options()
    assert options["hipri"][1] == ("pvsync2",)
    assert {name for name, (_opt, owners) in options.items() if owners == ("cxlhm",)} == {
        "cxlhm_profile", "cxlhm_policy", "cxlhm_dram", "cxlhm_block_size", "cxlhm_clock"}
    with pytest.raises(JobFileError, match=r"t.fio:3: option 'cxlhm_dram': applies to ioengine=cxlhm only \(this "
                                           r"job uses ioengine=psync\)"):
        parse("[j]\nioengine=psync\ncxlhm_dram=1m\n")
    assert parse("[j]\nioengine=pvsync2\nhipri\n")[0]["hipri"] is True


def test_hipri_is_pvsync2s_and_io_uring_refuses_it_by_its_own_declaration():
    with pytest.raises(JobFileError) as info:
        parse("[j]\nioengine=io_uring\nhipri=1\n")
    assert "t.fio:3: option 'hipri': ioengine=io_uring does not model it: IORING_SETUP_IOPOLL" in str(info.value)
    with pytest.raises(JobFileError, match=r"t.fio:3: option 'hipri': applies to ioengine=pvsync2 only \(this job "
                                           r"uses ioengine=psync\)"):
        parse("[j]\nioengine=psync\nhipri=1\n")


@pytest.mark.parametrize("name, engine", [("sqthread_poll", "io_uring"), ("fixedbufs", "io_uring"),
                                          ("registerfiles", "io_uring"), ("userspace_reap", "libaio")])
def test_an_engines_refused_option_says_whose_it_is_and_why(name, engine):
    assert f"ioengine={engine}" in refused_engine_option(name)
    with pytest.raises(JobFileError) as info:
        parse(f"[j]\nioengine={engine}\n{name}=1\n")
    assert f"t.fio:3: option '{name}': fio's option of ioengine={engine}, not modelled here" in str(info.value)


def test_every_refused_option_of_a_file_is_listed_at_once(tmp_path):
    path = tmp_path / "t.fio"
    path.write_text("[j]\nioengine=io_uring\nsqthread_poll=1\nfixedbufs=1\nhipri=1\n")
    with pytest.raises(JobFileError) as info:
        load_jobs([str(path)])
    text = str(info.value)
    assert all(f"t.fio:{n}: option" in text for n in (3, 4, 5)), text


_GOOD = {"hipri": "1", "cxlhm_profile": "cmm-h", "cxlhm_policy": "lru", "cxlhm_dram": "1m",
         "cxlhm_block_size": "4k", "cxlhm_clock": "wall"}
_ENGINE_NAMES = sorted(set(_GOOD) | {name for e in BUILT_IN for name in ENGINES.get(e).refused})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(BUILT_IN), names=st.sets(st.sampled_from(_ENGINE_NAMES), max_size=6))
def test_a_job_is_refused_exactly_the_engine_options_its_engine_does_not_declare(engine, names):
    import re
    import tempfile
    declared = {opt.name for opt in ENGINES.get(engine).options}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/t.fio"
        with open(path, "w") as f:
            f.write(f"[j]\nioengine={engine}\n" + "".join(f"{n}={_GOOD.get(n, '1')}\n" for n in sorted(names)))
        try:
            load_jobs([path])
            refused = set()
        except JobFileError as exc:
            refused = set(re.findall(r"t\.fio:\d+: option '(\w+)'", str(exc)))
    # an engine's option is refused by the engines that do not declare it; one of fio's
    # general options (sync) only by an engine that names it among those it does not model
    general = {n for n in names if n in {o.name for o in OPTIONS}}
    want = (names - general - declared) | {n for n in general if n in ENGINES.get(engine).refused}
    assert refused - {"ioengine"} == want  # (ioengine: libaio on a machine without its calls)
