"""Every subcommand over hostile inputs (tests/hostile/ and bad options): one
`cxlhm <command>: error: ...` line and a non-zero status; never a traceback, a hang or
exit 0. Each case runs in a forked child of this (already imported) process, so a case
costs milliseconds, a hang is caught by a timeout and a crash cannot take the suite down."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

HOSTILE = Path(__file__).resolve().parent / "hostile"
TIMEOUT_S = 60  # generous: a loaded machine; every case here fails before any real work
H = str(HOSTILE)

RUN = [
    ("missing trace", ["run", "--trace", "/nonexistent/trace.jsonl"]),
    ("empty trace", ["run", "--trace", f"{H}/empty.jsonl"]),
    ("blank trace", ["run", "--trace", f"{H}/blank_lines.jsonl"]),
    ("not json", ["run", "--trace", f"{H}/not_json.jsonl"]),
    ("not utf-8", ["run", "--trace", f"{H}/not_utf8.jsonl"]),
    ("hash id 2^63", ["run", "--trace", f"{H}/hash_id_2_63.jsonl"]),
    ("negative hash id", ["run", "--trace", f"{H}/negative_hash_id.jsonl"]),
    ("float hash id", ["run", "--trace", f"{H}/float_hash_id.jsonl"]),
    ("list line", ["run", "--trace", f"{H}/list_line.jsonl"]),
    ("string timestamp", ["run", "--trace", f"{H}/string_timestamp.jsonl"]),
    ("deep json", ["run", "--trace", f"{H}/deep_json.jsonl"]),
    ("trace /dev/zero", ["run", "--trace", "/dev/zero"]),
    ("trace is a folder", ["run", "--trace", H]),
    ("chunk 0", ["run", "--trace", f"{H}/tiny.jsonl", "--chunk-bytes", "0"]),
    ("chunk negative", ["run", "--trace", f"{H}/tiny.jsonl", "--chunk-bytes", "-64"]),
    ("chunk 1e", ["run", "--trace", f"{H}/tiny.jsonl", "--chunk-bytes", "1e"]),
    ("chunk odd", ["run", "--trace", f"{H}/tiny.jsonl", "--chunk-bytes", "12"]),
    ("chunk 1TiB", ["run", "--trace", f"{H}/tiny.jsonl", "--chunk-bytes", "1TiB"]),
    ("requests 0", ["run", "--requests", "0"]),
    ("requests text", ["run", "--requests", "many"]),
    ("configs unknown", ["run", "--trace", f"{H}/tiny.jsonl", "--configs", "nosuch"]),
    ("configs offline", ["run", "--trace", f"{H}/tiny.jsonl", "--configs", "belady"]),
    ("configs suffix", ["run", "--trace", f"{H}/tiny.jsonl", "--configs", "lru+magic"]),
    ("configs empty", ["run", "--trace", f"{H}/tiny.jsonl", "--configs", ","]),
    ("configs twice", ["run", "--trace", f"{H}/tiny.jsonl", "--configs", "lru,lru"]),
    ("lead negative", ["run", "--trace", f"{H}/tiny.jsonl", "--lead", "-1"]),
    ("lead nan", ["run", "--trace", f"{H}/tiny.jsonl", "--lead", "nan"]),
    ("lead inf", ["run", "--trace", f"{H}/tiny.jsonl", "--lead", "inf"]),
    ("out missing folder", ["run", "--trace", f"{H}/tiny.jsonl", "--out", "/nonexistent/dir/cdf.png"]),
    ("out is a folder", ["run", "--trace", f"{H}/tiny.jsonl", "--out", H]),
    ("set capacity 2^80 text", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "capacity=2^80"]),
    ("set capacity 2^80", ["run", "--trace", f"{H}/tiny.jsonl", "--set", f"capacity={2**80}"]),
    ("set bad yaml", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "dram_bytes=[unclosed"]),
    ("set deep yaml", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "dram_bytes=" + "[" * 5000 + "]" * 5000]),
    ("set no value", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "dram_bytes"]),
    ("set no key", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "=64MiB"]),
    ("set empty part", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "firmware..policy=lru"]),
    ("set unknown key", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "warp_drive=1"]),
    ("set section scalar", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "firmware=lru"]),
    ("set block 3", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "block_size=3"]),
    ("set dram huge", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "dram_bytes=1PiB"]),
    ("set clock odd", ["run", "--trace", f"{H}/tiny.jsonl", "--set", "clock=sundial"]),
    ("set backend in missing folder", ["run", "--trace", f"{H}/tiny.jsonl", "--set",
                                       "backend.path=/nonexistent/dir/img"]),
    ("device /dev/zero", ["run", "--trace", f"{H}/tiny.jsonl", "--device", "/dev/zero"]),
    ("device missing", ["run", "--trace", f"{H}/tiny.jsonl", "--device", "/nonexistent.yaml"]),
    ("device unknown profile", ["run", "--trace", f"{H}/tiny.jsonl", "--device", "warp9"]),
    ("device deep yaml", ["run", "--trace", f"{H}/tiny.jsonl", "--device", f"{H}/deep.yaml"]),
    ("device list yaml", ["run", "--trace", f"{H}/tiny.jsonl", "--device", f"{H}/list.yaml"]),
    ("device bad yaml", ["run", "--trace", f"{H}/tiny.jsonl", "--device", f"{H}/not_yaml.yaml"]),
    ("device binary", ["run", "--trace", f"{H}/tiny.jsonl", "--device", f"{H}/binary.yaml"]),
    ("device capacity 2^80", ["run", "--trace", f"{H}/tiny.jsonl", "--device", f"{H}/capacity_2_80.yaml"]),
    ("device is a folder", ["run", "--trace", f"{H}/tiny.jsonl", "--device", f"{H}/"]),
]

MRC = [
    ("missing trace", ["mrc", "--trace", "/nonexistent/t.jsonl"]),
    ("empty trace", ["mrc", "--trace", f"{H}/empty.jsonl", "--no-plot"]),
    ("hash id 2^63", ["mrc", "--trace", f"{H}/hash_id_2_63.jsonl", "--no-plot"]),
    ("not utf-8", ["mrc", "--trace", f"{H}/not_utf8.jsonl", "--no-plot"]),
    ("deep json", ["mrc", "--trace", f"{H}/deep_json.jsonl", "--no-plot"]),
    ("trace /dev/zero", ["mrc", "--trace", "/dev/zero", "--format", "mooncake", "--no-plot"]),
    ("oracle /dev/zero", ["mrc", "--trace", "/dev/zero", "--format", "oracle-general", "--no-plot"]),
    ("truncated oracle", ["mrc", "--trace", f"{H}/truncated.oracleGeneral.bin", "--no-plot"]),
    ("garbage cbt", ["mrc", "--trace", f"{H}/garbage.cbt", "--no-plot"]),
    ("bad csv", ["mrc", "--trace", f"{H}/bad.csv", "--no-plot"]),
    ("unknown format", ["mrc", "--trace", f"{H}/tiny.jsonl", "--format", "parquet"]),
    ("unguessable name", ["mrc", "--trace", f"{H}/README.md"]),
    ("sizes text", ["mrc", "--trace", f"{H}/tiny.jsonl", "--sizes", "lots", "--no-plot"]),
    ("sizes zero", ["mrc", "--trace", f"{H}/tiny.jsonl", "--sizes", "0", "--no-plot"]),
    ("sizes negative share", ["mrc", "--trace", f"{H}/tiny.jsonl", "--sizes", "-5%", "--no-plot"]),
    ("sizes nan share", ["mrc", "--trace", f"{H}/tiny.jsonl", "--sizes", "nan%", "--no-plot"]),
    ("sizes empty", ["mrc", "--trace", f"{H}/tiny.jsonl", "--sizes", ",", "--no-plot"]),
    ("policies unknown", ["mrc", "--trace", f"{H}/tiny.jsonl", "--policies", "nosuch", "--no-plot"]),
    ("policies empty", ["mrc", "--trace", f"{H}/tiny.jsonl", "--policies", ",", "--no-plot"]),
    ("param shape", ["mrc", "--trace", f"{H}/tiny.jsonl", "--param", "lru", "--no-plot"]),
    ("param bad yaml", ["mrc", "--trace", f"{H}/tiny.jsonl", "--policies", "s3fifo", "--param",
                        "s3fifo.small_ratio=[", "--no-plot"]),
    ("param deep yaml", ["mrc", "--trace", f"{H}/tiny.jsonl", "--policies", "s3fifo", "--param",
                         "s3fifo.small_ratio=" + "[" * 5000 + "]" * 5000, "--no-plot"]),
    ("param unknown key", ["mrc", "--trace", f"{H}/tiny.jsonl", "--policies", "s3fifo", "--param",
                           "s3fifo.nonsense=1", "--no-plot"]),
    ("param other policy", ["mrc", "--trace", f"{H}/tiny.jsonl", "--policies", "lru", "--param",
                            "s3fifo.small_ratio=0.2", "--no-plot"]),
    ("limit zero", ["mrc", "--trace", f"{H}/tiny.jsonl", "--limit", "0", "--no-plot"]),
    ("limit negative", ["mrc", "--trace", f"{H}/tiny.jsonl", "--limit", "-3", "--no-plot"]),
    ("block size zero", ["mrc", "--trace", f"{H}/tiny.jsonl", "--block-size", "0", "--no-plot"]),
    ("block size text", ["mrc", "--trace", f"{H}/tiny.jsonl", "--block-size", "big", "--no-plot"]),
    ("timing unknown", ["mrc", "--trace", f"{H}/tiny.jsonl", "--timing", "warp9", "--no-plot"]),
    ("timing /dev/zero", ["mrc", "--trace", f"{H}/tiny.jsonl", "--timing", "/dev/zero", "--no-plot"]),
    ("out missing folder", ["mrc", "--trace", f"{H}/tiny.jsonl", "--out", "/nonexistent/dir/mrc.png"]),
    ("out is a folder", ["mrc", "--trace", f"{H}/tiny.jsonl", "--out", H]),
]

MAILBOX = [
    ("poison dpa negative", ["mailbox", "poison", "--dpa", "-1"]),
    ("poison dpa past capacity", ["mailbox", "poison", "--dpa", str(2**70)]),
    ("poison length negative", ["mailbox", "poison", "--length", "-4096"]),
    ("poison length zero", ["mailbox", "poison", "--length", "0"]),
    ("poison length oversized", ["mailbox", "poison", "--length", str(2**64)]),
    ("poison range past the end", ["mailbox", "poison", "--set", "capacity=1GiB", "--dpa", str(2**30 - 64),
                                   "--length", "4096"]),
    ("poison dpa text", ["mailbox", "poison", "--dpa", "zero"]),
    ("regs missing", ["mailbox", "identify", "--regs", "/nonexistent/regs"]),
    ("regs /dev/zero", ["mailbox", "identify", "--regs", "/dev/zero", "--timeout", "1"]),
    ("timeout negative", ["mailbox", "identify", "--timeout", "-1"]),
    ("timeout nan", ["mailbox", "identify", "--timeout", "nan"]),
    ("action unknown", ["mailbox", "reboot"]),
    ("device /dev/zero", ["mailbox", "identify", "--device", "/dev/zero"]),
    ("set deep yaml", ["mailbox", "identify", "--set", "dram_bytes=" + "[" * 5000 + "]" * 5000]),
    ("set capacity 2^80", ["mailbox", "identify", "--set", f"capacity={2**80}"]),
]

DEVICE = [
    ("no action", ["device"]),
    ("serve without socket", ["device", "serve"]),
    ("serve negative partition", ["device", "serve", "--socket", "/nonexistent/p.sock", "--state",
                                  "/nonexistent/state", "--partition-bytes", "-1"]),
    ("serve capacity 2^80", ["device", "serve", "--socket", "/nonexistent/p.sock", "--state", "/nonexistent/state",
                             "--set", f"capacity={2**80}"]),
]

# calibrate: every case must fail before it measures (8 points of --runtime) or writes a
# byte; the backend never exists, so a check that let a case through cannot lay out a file
_NO_IMG = "/nonexistent/dir/ssd.img"
_TMP_IMG = os.path.join(tempfile.gettempdir(), "cxlhm-hostile-calibrate-never-created.img")
_CAL = ["calibrate", "--backend", _NO_IMG, "--size", "16MiB", "--runtime", "0.01s"]
CALIBRATE = [
    ("no backend", ["calibrate"]),
    ("backend missing folder", _CAL),
    ("backend /dev/zero", ["calibrate", "--backend", "/dev/zero", "--size", "16MiB", "--runtime", "0.01s"]),
    ("backend /proc/self/mem", ["calibrate", "--backend", "/proc/self/mem", "--size", "16MiB", "--runtime", "0.01s"]),
    ("backend is a folder", ["calibrate", "--backend", H, "--size", "16MiB", "--runtime", "0.01s"]),
    ("backend holds data", ["calibrate", "--backend", f"{H}/tiny.jsonl", "--size", "16MiB", "--runtime", "0.01s"]),
    ("backend name too long", ["calibrate", "--backend", "/tmp/" + "x" * 300, "--size", "16MiB", "--runtime", "0.01s"]),
    ("size 0", ["calibrate", "--backend", _TMP_IMG, "--size", "0"]),
    ("size 1e", ["calibrate", "--backend", _TMP_IMG, "--size", "1e"]),
    ("size not MiB-aligned", ["calibrate", "--backend", _TMP_IMG, "--size", "17000000"]),
    ("size 2^80", ["calibrate", "--backend", _TMP_IMG, "--size", str(2**80), "--runtime", "0.01s"]),
    ("size 1PiB", ["calibrate", "--backend", _TMP_IMG, "--size", "1PiB", "--runtime", "0.01s"]),
    ("runtime 0", _CAL[:-1] + ["0"]),
    ("runtime nan", _CAL[:-1] + ["nan"]),
    ("runtime 1e30s", _CAL[:-1] + ["1e30s"]),
    ("runtime 100000h", _CAL[:-1] + ["100000h"]),
    ("runtime text", _CAL[:-1] + ["soon"]),
    ("device unknown", _CAL + ["--device", "warp9"]),
    ("device /dev/zero", _CAL + ["--device", "/dev/zero"]),
    ("device not nand", _CAL + ["--device", "cxl-dram"]),
    ("device deep yaml", _CAL + ["--device", f"{H}/deep.yaml"]),
    ("device binary", _CAL + ["--device", f"{H}/binary.yaml"]),
    ("output missing folder", _CAL + ["-o", "/nonexistent/dir/fragment.yaml"]),
    ("output is a folder", _CAL + ["-o", H]),
    ("output /dev/full", _CAL + ["-o", "/dev/full"]),
    ("seed negative", _CAL + ["--seed=-1"]),
    ("seed 2^70", _CAL + ["--seed", str(2**70)]),
    ("seed text", _CAL + ["--seed", "x"]),
]
# what the error line must name: the check that is meant to catch the case, not a later one
CALIBRATE_BLAMES = {"size 2^80": "--size", "size 1PiB": "--size", "runtime 100000h": "--runtime",
                    "output missing folder": "--output", "output is a folder": "--output",
                    "output /dev/full": "--output", "seed negative": "--seed", "seed 2^70": "--seed",
                    "backend /dev/zero": "/dev/zero", "backend is a folder": "Is a directory",
                    "device not nand": "backing"}

POLICIES = [
    ("unknown name", ["policies", "nosuch"]),
]

TRACE = [
    ("export missing input", ["trace", "export", "/nonexistent/t.jsonl", "/tmp/x.csv", "--format", "csv"]),
    ("export unknown format", ["trace", "export", f"{H}/tiny.jsonl", "/tmp/x.bin", "--format", "parquet"]),
    ("export empty trace", ["trace", "export", f"{H}/empty.jsonl", "/tmp/x.csv", "--format", "csv"]),
    ("export not utf-8", ["trace", "export", f"{H}/not_utf8.jsonl", "/tmp/x.csv", "--format", "csv"]),
    ("export onto its input", ["trace", "export", f"{H}/tiny.jsonl", f"{H}/tiny.jsonl", "--format", "csv"]),
    ("export out missing folder", ["trace", "export", f"{H}/tiny.jsonl", "/nonexistent/dir/x.csv", "--format", "csv"]),
    ("export obj size 0", ["trace", "export", f"{H}/tiny.jsonl", "/tmp/x.csv", "--format", "csv", "--obj-size", "0"]),
    ("import truncated oracle", ["trace", "import", f"{H}/truncated.oracleGeneral.bin", "/tmp/x.cbt", "--format",
                                 "oracleGeneral"]),
    ("import bad csv", ["trace", "import", f"{H}/bad.csv", "/tmp/x.cbt", "--format", "csv"]),
    ("import /dev/zero", ["trace", "import", "/dev/zero", "/tmp/x.cbt", "--format", "csv"]),
    ("import bad spec", ["trace", "import", f"{H}/bad.csv", "/tmp/x.cbt", "--format", "csv", "--csv-spec", "x=1"]),
    ("no action", ["trace"]),
]

DOCTOR = [
    ("missing config", ["doctor", "--engine", "lmcache", "/nonexistent/lmcache.yaml"]),
    ("config is a folder", ["doctor", "--engine", "lmcache", H]),
    ("config /dev/zero", ["doctor", "--engine", "lmcache", "/dev/zero"]),
    ("config not yaml", ["doctor", "--engine", "lmcache", f"{H}/not_yaml.yaml"]),
    ("config binary", ["doctor", "--engine", "lmcache", f"{H}/binary.yaml"]),
    ("config deep", ["doctor", "--engine", "lmcache", f"{H}/deep.yaml"]),
    ("unknown engine", ["doctor", "--engine", "warp", f"{H}/list.yaml"]),
    ("no engine", ["doctor", f"{H}/list.yaml"]),
]

CLI = [
    ("unknown command", ["warp"]),
    ("no command", []),
]

_SERVE = ["device", "serve", "--socket", "/nonexistent/pool.sock", "--state"]
DEVICE += [
    ("grant without tenant", _SERVE + ["/nonexistent/state", "--grant", "host="]),
    ("mirror bytes text", _SERVE + ["/nonexistent/state", "--mirror-bytes", "lots"]),
    ("no host names", _SERVE + ["/nonexistent/state", "--max-host-names", "0"]),
    ("host names past 16 bits", _SERVE + ["/nonexistent/state", "--max-host-names", "65536"]),
    ("state is a file", _SERVE + [f"{H}/tiny.jsonl"]),
    ("state not creatable", _SERVE + [f"{H}/tiny.jsonl/state"]),
]
CASES = [(f"{args[0] if args else 'cxlhm'}: {name}", args) for group in (RUN, MRC, MAILBOX, DEVICE, CALIBRATE,
                                                                                   POLICIES, TRACE, DOCTOR, CLI)
         for name, args in group]


def run_forked(argv: list[str], timeout: float = TIMEOUT_S) -> tuple[int | None, str, str, int]:
    """(exit status or None on a hang, stdout, stderr, peak RSS in KiB) of cli.main(argv) in a child."""
    from cxlhm_apps.cli import main
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = os.fdopen(1, "w", closefd=False)
                sys.stderr = os.fdopen(2, "w", closefd=False)
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code if isinstance(code, int) else 1)
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            done, raw, usage = os.wait4(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            _, _, usage = os.wait4(pid, 0)
        out.seek(0)
        err.seek(0)
        return status, out.read().decode(errors="replace"), err.read().decode(errors="replace"), usage.ru_maxrss


@pytest.fixture(autouse=True)
def _no_state_outside(tmp_path, monkeypatch):
    monkeypatch.setenv("CXLHM_OUT_DIR", str(tmp_path / "out"))
    monkeypatch.delenv("CXLHM_TRACEBACK", raising=False)


@pytest.mark.parametrize("argv", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_gets_one_clear_error(argv):
    status, out, err, _ = run_forked(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    assert status is not None, f"hung for {TIMEOUT_S} s"
    assert "Traceback" not in err and "Traceback" not in out, err
    assert "internal error" not in err, err
    assert status not in (0, None), f"exit {status} for bad input; stdout: {out[-500:]}"
    if command in {"run", "mrc", "mailbox", "policies", "calibrate", "trace"} and argv != ["trace"]:
        lines = [line for line in err.splitlines() if line.strip()]
        prefix = f"cxlhm {command}: error: " if command != "trace" else f"cxlhm trace {argv[1]}: error: "
        assert lines and (lines[-1].startswith(prefix) or lines[-1].startswith("cxlhm trace: error: ")), err
        assert len(lines[-1]) < 2000, "one line, not a dump"


def test_mrc_out_folder_writes_nothing_beside_it(tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    status, _, err, _ = run_forked(["mrc", "--trace", f"{H}/tiny.jsonl", "--out", str(folder)])
    assert status == 2 and "is a folder" in err
    assert not (tmp_path / "plots.png").exists()
    assert list(folder.iterdir()) == []


def test_every_subcommand_is_covered():
    from cxlhm_apps.cli import COMMANDS
    covered = {args[0] for _, args in CASES if args}
    # fio and serve-bench keep their hostile inputs with their own tests
    missing = set(COMMANDS.builtin_names()) - covered - {"fio", "serve-bench"}
    assert not missing, f"no hostile cases for: {', '.join(sorted(missing))}"


@pytest.mark.parametrize("name", sorted(CALIBRATE_BLAMES))
def test_calibrate_refuses_before_measuring_and_names_the_option(name):
    argv = dict(CALIBRATE)[name]
    status, _, err, _ = run_forked(argv)
    line = [entry for entry in err.splitlines() if entry.strip()][-1]
    assert status == 2 and line.startswith("cxlhm calibrate: error: "), err
    assert CALIBRATE_BLAMES[name] in line, line
    assert not os.path.exists(_TMP_IMG), "a refused calibration created its backend file"
