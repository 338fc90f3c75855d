"""The device commands' flags generated from the declarations (cxlhm_apps/commands/
_device_args.py on cxlhm_apps/generated_flags.py): a flag per device-config key
(`--dram-bytes`, `--backend.kind`, `--timing.<key>`) and per declared parameter of each
registered firmware policy (`--<policy>.<param>`). They parse into the config the device
opens with, a policy registered at test time (or published as an entry point) gets its
flags with no edit to a command, a bad value, an unknown field and a flag of a policy that
does not run are refused naming the flag and what is accepted, and building the parser
for a command that is not asked for its help imports no compiled code."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest
from hypothesis import given, settings, strategies as st

from cxlhm import policies
from cxlhm.config import SCHEMA, load_config
from cxlhm.policies import Param
from cxlhm_apps import cli, generated_flags as gf
from cxlhm_apps.commands import _device_args as D
from cxlhm_apps.commands import run as run_command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cxlhm test")
    D.add_device_arguments(parser)
    return parser


def _config(argv):
    return D.config_from_args(_parser().parse_args(argv))


@functools.lru_cache(maxsize=1)
def _all_flags() -> tuple[gf.GeneratedFlag, ...]:
    return tuple(D.config_flags() + D.timing_flags() + D.policy_flags())


def _flag(name: str) -> gf.GeneratedFlag:
    return next(f for f in _all_flags() if f.flag == name)


def _same(a, b) -> bool:
    """Two configs equal but for where their values came from."""
    strip = dict(sources=(), provenance={})
    return dataclasses.replace(a, **strip) == dataclasses.replace(b, **strip)


# ---------------------------------------------------------------- into the config
def test_every_config_key_has_a_flag_and_the_flags_give_what_set_gives():
    flags = {f.flag for f in D.config_flags() + D.timing_flags()}
    for key, spec in SCHEMA.items():
        for dotted in ([f"{key}.{k}" for k in spec] if isinstance(spec, dict) else [key]):
            if dotted not in D.NOT_FLAGS and key not in D.NOT_FLAGS:
                assert (f"--{dotted}" if "." in dotted else f"--{dotted.replace('_', '-')}") in flags, dotted
    assert "--firmware.policy" not in flags and "--firmware.params" not in flags   # --policy and the policies' flags
    flagged = _config(["--dram-bytes", "64MiB", "--block-size", "16KiB", "--clock", "model", "--seed", "7",
                       "--backend.kind", "memory", "--backend.queue_depth", "32", "--backend.path", "null",
                       "--backend.faults", "{read_error_rate: 0.01}", "--firmware.write_mode", "write-through",
                       "--firmware.write_behind", "false", "--timing.nand_read_latency", "30us",
                       "--policy", "s3fifo", "--s3fifo.small_ratio", "0.2", "--name", "123"])
    set_ = _config(["--set", "dram_bytes=64MiB", "--set", "block_size=16KiB", "--set", "clock=model", "--set", "seed=7",
                    "--set", "backend.kind=memory", "--set", "backend.queue_depth=32", "--set",
                    "backend.faults={read_error_rate: 0.01}", "--set", "firmware.write_mode=write-through",
                    "--set", "firmware.write_behind=false", "--set", "timing.nand_read_latency=30us",
                    "--set", "firmware.policy=s3fifo", "--set", "firmware.params={small_ratio: 0.2}",
                    "--set", "name='123'"])
    assert _same(flagged, set_)
    assert (flagged.dram_bytes, flagged.block_size, flagged.backend.kind, flagged.backend.faults) == \
        (64 << 20, 16 << 10, "memory", {"read_error_rate": 0.01})
    assert flagged.firmware.params == {"small_ratio": 0.2} and flagged.timing["nand_read_latency"] == "30us"
    assert flagged.timing["nand_channels"] == load_config().timing["nand_channels"]   # the rest: the profile's
    assert flagged.name == "123"   # a key that takes text takes the text, though YAML reads a number


def test_the_flags_override_set_and_a_profile_file(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text("profile: cmm-h\ndram_bytes: 32MiB\nfirmware:\n  policy: s3fifo\n  params: {ghost_ratio: 0.5}\n")
    cfg = _config(["--device", str(path), "--set", "dram_bytes=16MiB", "--dram-bytes", "8MiB",
                   "--s3fifo.small_ratio", "0.3"])
    assert cfg.dram_bytes == 8 << 20
    assert cfg.firmware.policy == "s3fifo" and cfg.firmware.params == {"ghost_ratio": 0.5, "small_ratio": 0.3}


def test_a_device_opens_with_the_flags_through_the_command(monkeypatch, capsys):
    import host_runtime.driver as driver
    opened = []
    real = driver.open_device

    def spy(cfg, *a, **kw):
        opened.append(cfg)
        return real(cfg, *a, **kw)
    monkeypatch.setattr(driver, "open_device", spy)
    assert cli.main(["mailbox", "identify", "--backend.kind", "memory", "--capacity", "1GiB", "--dram-bytes", "8MiB",
                     "--policy", "hymcache", "--hymcache.victim_scan", "16", "--firmware.background", "manual"]) == 0
    hybrid = json.loads(capsys.readouterr().out)["hybrid"]
    assert (hybrid["capacity"], hybrid["dram_bytes"], hybrid["policy"]) == (1 << 30, 8 << 20, "hymcache")
    cfg, = opened
    assert cfg.firmware.params == {"victim_scan": 16} and cfg.backend.kind == "memory"


def test_run_gives_each_configuration_its_own_policys_flags(monkeypatch):
    seen = []

    def fake_open(cfg):
        seen.append(cfg)
        if len(seen) == 2:
            raise ValueError("stop here")
        import contextlib
        return contextlib.nullcontext(None)
    monkeypatch.setattr(run_command, "open_device", fake_open)
    monkeypatch.setattr(run_command, "replay_mission", lambda *a, **kw: None)
    argv = ["run", "--requests", "3", "--configs", "s3fifo,lru", "--no-plot", "--no-progress", "--dram-bytes", "16MiB",
            "--s3fifo.small_ratio", "0.25", "--timing.link_latency", "100ns"]
    assert cli.main(argv) == 2
    s3fifo, lru = seen
    assert s3fifo.firmware.params == {"small_ratio": 0.25} and lru.firmware.params == {}
    assert s3fifo.dram_bytes == lru.dram_bytes == 16 << 20 and s3fifo.timing["link_latency"] == "100ns"
    # the child that compiles a configuration ahead gets the device flags and that policy's own
    args = cli.build_parser("run").parse_args(argv)
    child = run_command._warmup_argv(args, "s3fifo")
    assert child[-6:] == ["--dram-bytes", "16MiB", "--timing.link_latency", "100ns", "--s3fifo.small_ratio", "0.25"]
    assert "--s3fifo.small_ratio" not in run_command._warmup_argv(args, "lru+hints")
    cli.build_parser("run").parse_args(["run", *child[1:]])


def test_mrc_takes_the_policy_flags_as_it_takes_param(tmp_path, capsys):
    from cxlhm.traces.blocktrace import write_block_trace
    from cxlhm.traces.synthetic import zipf_trace
    path = tmp_path / "z.cbt"
    write_block_trace(path, zipf_trace(3_000, 400, 0.8, seed=3))
    base = ["mrc", "--trace", str(path), "--policies", "fifo,s3fifo", "--sizes", "16,64", "--json", "--no-plot"]
    assert cli.main([*base, "--param", "s3fifo.small_ratio=0.4"]) == 0
    by_param = json.loads(capsys.readouterr().out)
    assert cli.main([*base, "--s3fifo.small_ratio", "0.4"]) == 0
    assert json.loads(capsys.readouterr().out) == by_param
    assert cli.main([*base]) == 0
    assert json.loads(capsys.readouterr().out)["s3fifo"] != by_param["s3fifo"]   # the parameter changes the curve
    assert cli.main([*base, "--hymcache.victim_scan", "3"]) == 2
    assert "--hymcache.victim_scan: firmware policy hymcache is not selected" in capsys.readouterr().err


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("argv, message", [
    (["--dram-bytes", "lots"], "--dram-bytes: expected a byte size such as 4096"),
    (["--dram-bytes", "100000"], "--dram-bytes: dram_bytes: 100000 is not a multiple of block_size 65536"),
    (["--backend.kind", "tape"], "--backend.kind: must be one of memory, ssd"),
    (["--backend.queue_depth", "0"], "--backend.queue_depth: must be an integer from 1 to 4096"),
    (["--firmware.write_behind", "maybe"], "--firmware.write_behind: must be true or false"),
    (["--timing.nand_channels", "9000"], "--timing.nand_channels: must be at most 4096"),
    (["--policy", "s3fifo", "--s3fifo.small_ratio", "x"], "--s3fifo.small_ratio: policy 's3fifo' parameter "
                                                            "'small_ratio' must be float, got 'x'; it takes a number"),
    (["--policy", "s3fifo", "--s3fifo.small_ratio", "1.5"], "--s3fifo.small_ratio: policy 's3fifo' parameter "
                                                              "'small_ratio' must be in [0, 1)"),
    (["--s3fifo.small_ratio", "0.2"], "--s3fifo.small_ratio: firmware policy s3fifo is not selected: the device runs "
                                      "lru (from "),
    (["--policy", "hymcache", "--s3fifo.small_ratio", "0.2"], "select it with --policy s3fifo"),
])
def test_a_bad_value_is_one_error_naming_the_flag_and_what_it_takes(capsys, argv, message):
    assert cli.main(["mailbox", "identify", "--backend.kind", "memory", "--capacity", "1GiB", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cxlhm mailbox: error: "), err
    assert message in err[0], err[0]


def test_an_unknown_field_or_name_names_what_is_accepted(capsys):
    for argv, message in ((["--s3fifo.small"], None),  # an abbreviation argparse takes: not refused
                          (["--s3fifo.nope"], "unknown option --s3fifo.nope; s3fifo takes --s3fifo.ghost_ratio, "
                                              "--s3fifo.move_to_main_threshold, --s3fifo.small_ratio"),
                          (["--backend.speed"], "backend takes --backend.faults, --backend.kind"),
                          (["--nosuch.knob"], "no firmware policy or device config section with options is named "
                                              "'nosuch'; those with options: backend, clock, firmware, hymcache")):
        if message is None:
            assert _parser().parse_args([*argv, "0.2"])
            continue
        with pytest.raises(SystemExit) as exc:
            cli.main(["mailbox", "identify", *argv, "1"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err, err
        usage = " ".join(err.splitlines()[:-1])   # short: the generated flags are one item (the help lists them)
        assert "[--KEY VALUE ...] [--NAME.FIELD VALUE ...]" in usage and "--dram-bytes" not in usage


# ---------------------------------------------------------------- registered at test time
@pytest.fixture
def knobs():
    """A policy registered at test time: LRU's hooks with parameters of its own."""
    policy = dataclasses.replace(policies.get("lru"), name="lru-knobs", params={
        "depth": Param(int, 4, "how deep the test looks", check=lambda v: v >= 1, check_text="must be at least 1"),
        "mode": Param(str, "fast", "a word")})
    policies.REGISTRY.add("lru-knobs", policy)
    yield policy
    policies.REGISTRY.unregister("lru-knobs")


def test_a_policy_registered_at_test_time_gets_its_flags(knobs, capsys):
    with pytest.raises(SystemExit):
        cli.main(["mailbox", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "firmware policy lru-knobs parameters" in text
    assert "--lru-knobs.depth INT how deep the test looks (default 4)" in text
    assert "--lru-knobs.mode TEXT a word (default fast)" in text
    cfg = _config(["--policy", "lru-knobs", "--lru-knobs.depth", "7", "--lru-knobs.mode", "123"])
    assert cfg.firmware.policy == "lru-knobs" and cfg.firmware.params == {"depth": 7, "mode": "123"}
    with pytest.raises(ValueError, match=r"--lru-knobs\.depth: .*must be at least 1, got 0"):
        _config(["--policy", "lru-knobs", "--lru-knobs.depth", "0"])


OUTSIDE = '''
import dataclasses
from cxlhm.policies import Param, get

POLICY = dataclasses.replace(get("fifo"), name="fifo-outside",
                             params={"lanes": Param(int, 2, "lanes the outside policy keeps")})
'''


def test_an_entry_point_policy_gets_its_flags_with_no_edit_to_the_command(tmp_path, monkeypatch):
    (tmp_path / "outside_fifo_flags.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="fifo-outside", value="outside_fifo_flags", group=policies.ENTRY_POINT_GROUP)
    monkeypatch.setattr(policies.REGISTRY, "entry_points", lambda: {"fifo-outside": ep})
    try:
        text = " ".join(_parser().format_help().split())
        assert "--fifo-outside.lanes INT lanes the outside policy keeps (default 2)" in text
        assert _config(["--policy", "fifo-outside", "--fifo-outside.lanes", "5"]).firmware.params == {"lanes": 5}
    finally:
        policies.REGISTRY._cache.pop("fifo-outside", None)
        sys.modules.pop("outside_fifo_flags", None)


# ---------------------------------------------------------------- the help
def test_run_help_lists_the_device_flags_with_types_defaults_and_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--dram-bytes SIZE device DRAM in front of the SSD (default 256MiB in cmm-h)" in text
    assert "--backend.kind {memory,ssd}" in text and "--firmware.background {thread,manual}" in text
    assert "--timing.nand_read_latency DURATION tR: page read from the array into the die's register " \
           "(default 45us in cmm-h)" in text
    assert "--s3fifo.small_ratio NUM share of DRAM slots for the small FIFO (default 0.1)" in text
    for name in policies.available():
        for param in policies.get(name).params:
            assert f"--{name}.{param} " in text
    assert "--firmware.policy" not in text and "--firmware.params" not in text
    assert "(default model in this command)" in text   # run's own default over the profile's wall clock


def test_parsing_without_the_help_or_a_policy_flag_imports_no_compiled_code():
    """The policies' and timing model's declarations import numba; a command line that
    names none of their flags does not pay for it."""
    code = ("import sys; from cxlhm_apps import cli; from cxlhm_apps.commands._device_args import config_from_args\n"
            "args = cli.build_parser('mailbox').parse_args(['mailbox', 'identify', '--dram-bytes', '8MiB',"
            " '--backend.kind', 'memory'])\n"
            "assert config_from_args(args).dram_bytes == 8 << 20\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------- values as text
@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=12))
def test_any_text_for_a_ranged_integer_is_a_value_or_an_error_naming_the_flag(text):
    flag = _flag("--backend.queue_depth")
    try:
        value = flag.convert(text)
    except ValueError as exc:
        assert str(exc).startswith("--backend.queue_depth: ") and "an integer from 1 to 4096" in str(exc)
    else:
        assert isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=12))
def test_any_text_for_a_policy_float_is_a_value_or_an_error_naming_the_flag(text):
    flag = _flag("--s3fifo.small_ratio")
    try:
        value = flag.convert(text)
    except ValueError as exc:
        assert str(exc).startswith("--s3fifo.small_ratio: ") and "a number (must be in [0, 1))" in str(exc)
    else:
        assert isinstance(value, float) and 0 <= value < 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 1 << 20), unit=st.sampled_from(["", "KiB", "MiB", "GiB"]))
def test_a_size_reads_back_as_its_bytes(n, unit):
    assert _flag("--dram-bytes").convert(f"{n}{unit}") == n * {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]


@settings(max_examples=100, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False))
def test_a_number_in_any_form_python_writes_reads_back_equal(x):
    """repr gives 1e-07 and 1e+16, which YAML 1.1 alone reads as text."""
    assert gf.read_value(repr(x)) == x


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_text_for_any_device_flag_is_a_value_or_an_error_naming_the_flag(data):
    """No declaration's parser lets another exception out (a mapping where a size goes,
    a list where a path goes, text YAML cannot read)."""
    flag = data.draw(st.sampled_from(_all_flags()), label="flag")
    text = data.draw(st.one_of(st.text(max_size=16), st.sampled_from(
        ["{a: 1}", "[1, 2]", "null", "~", "-1", "1e400", "0x10", "1_000", "true", "''", "{", "&a [*a]", "!!binary x"])),
        label="text")
    try:
        flag.convert(text)
    except ValueError as exc:
        assert str(exc).startswith(f"{flag.flag}: "), exc


def test_the_help_lists_the_policy_flags_from_a_cache_without_importing_compiled_code(tmp_path):
    """The policies' declarations import numba (~1 s): the help keeps what it shows of
    them on disk, keyed by the files that declare them; the second help imports nothing
    compiled and prints the same text."""
    code = ("import argparse, sys\n"
            "from cxlhm_apps.commands._device_args import add_device_arguments\n"
            "p = argparse.ArgumentParser(prog='x'); add_device_arguments(p)\n"
            "text = p.format_help(); print('numba' in sys.modules); print(text)")
    env = {**__import__("os").environ, "CXLHM_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
            for _ in range(2)]
    assert runs[0].startswith("True\n") and runs[1].startswith("False\n")   # built once, then read
    assert runs[0].split("\n", 1)[1] == runs[1].split("\n", 1)[1]
    assert "--hymcache.victim_scan INT" in runs[1] and "--timing.backing" in runs[1]
    assert [p.name.split("-")[0] for p in (tmp_path / "flags").iterdir()] == ["device"]


def test_the_cache_of_the_help_follows_the_installed_policies(monkeypatch):
    stamp = D._declarations_stamp()
    assert D._declarations_stamp() == stamp
    ep = EntryPoint(name="other", value="other_policy", group=D.POLICY_ENTRY_POINTS)
    monkeypatch.setattr(D, "entry_points", lambda group: [ep] if group == D.POLICY_ENTRY_POINTS else [])
    assert D._declarations_stamp() != stamp
    assert D.POLICY_ENTRY_POINTS == policies.ENTRY_POINT_GROUP
