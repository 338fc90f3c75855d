"""Injected SSD faults, checksums and poison: the device retries, then returns an error
for what it cannot produce - never stale, zero or corrupt bytes."""
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.config import ConfigError
from cxlhm.integrity import PoisonError
from device_parts import open_parts
from host_runtime.driver import open_device

BLOCK = 4096
SLOTS = 4


def dev_config(path, **faults):
    return {"capacity": 256 * BLOCK, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK,
            "backend": {"path": str(path), "faults": faults, "retries": faults.pop("retries", 3)}}


def evict_all(dev):
    for i in range(SLOTS):
        dev.load((200 + i) * BLOCK, 1)


def test_transient_read_errors_are_retried_and_invisible(tmp_path):
    with open_device(dev_config(tmp_path / "a.img")) as dev:
        data = np.random.default_rng(0).integers(0, 256, 40 * BLOCK, dtype=np.uint8)
        dev.store(0, data)
    with open_parts(dev_config(tmp_path / "a.img", read_error_rate=0.3, short_read_rate=0.2, retries=8)) as (dev, device):
        assert dev.load(0, data.size) == data.tobytes()
        s = dev.stats()
        assert s["media_retries"] > 0 and s["poisoned_blocks"] == 0
        assert device.ssd.injected["read_error"] > 0 and device.ssd.injected["short_read"] > 0


def test_permanent_read_errors_poison_the_block_and_are_listed(tmp_path):
    path = tmp_path / "b.img"
    with open_device(dev_config(path)) as dev:
        dev.store(0, b"A" * (3 * BLOCK))
    with open_device(dev_config(path, read_error_rate=1.0)) as dev:
        with pytest.raises(PoisonError, match="block 1"):
            dev.load(BLOCK + 10, 5)
        listed = dev.poison_records(0, 256 * BLOCK, 16)
        assert [(r.dpa, r.length) for r in listed.records] == [(BLOCK, BLOCK)]
        with pytest.raises(PoisonError):  # still poisoned: no second chance for stale bytes
            dev.load(BLOCK, 1)
        with pytest.raises(PoisonError):  # a partial write cannot repair it
            dev.store(BLOCK, b"x")
        dev.store(BLOCK, b"B" * BLOCK)  # a whole-block write replaces the lost bytes
        assert dev.load(BLOCK, BLOCK) == b"B" * BLOCK
    with open_device(dev_config(path)) as dev:  # the repair was written back at close
        assert dev.load(BLOCK, BLOCK) == b"B" * BLOCK
        assert dev.load(0, BLOCK) == b"A" * BLOCK


def test_poison_survives_reopen(tmp_path):
    path = tmp_path / "c.img"
    with open_device(dev_config(path)) as dev:
        dev.store(0, b"C" * BLOCK)
    with open_device(dev_config(path, read_error_rate=1.0)) as dev:
        with pytest.raises(PoisonError):
            dev.load(0, 1)
    with open_device(dev_config(path)) as dev:  # healthy media now, but the device said the bytes were lost
        with pytest.raises(PoisonError):
            dev.load(0, 1)


def test_checksum_mismatch_is_poison_never_data(tmp_path):
    path = tmp_path / "d.img"
    with open_device(dev_config(path)) as dev:
        dev.store(5 * BLOCK, b"good" * (BLOCK // 4))
        dev.flush()
        evict_all(dev)
        with open(path, "r+b") as f:  # the media rots behind the device's back
            f.seek(5 * BLOCK + 100)
            f.write(b"rot")
        with pytest.raises(PoisonError, match="checksum"):
            dev.load(5 * BLOCK, 8)
        assert dev.stats()["checksum_mismatches"] == 1


def test_failed_write_backs_poison_the_victims(tmp_path):
    with open_device(dev_config(tmp_path / "e.img", write_error_rate=1.0)) as dev:
        dev.store(0, b"D" * (2 * BLOCK))
        evict_all(dev)  # the dirty blocks cannot reach the SSD: their bytes are gone
        with pytest.raises(PoisonError, match="write-back failed"):
            dev.load(0, 1)
        assert dev.stats()["poisoned_blocks"] == 2


def test_a_full_back_end_poisons_what_no_longer_fits(tmp_path):
    with open_parts(dev_config(tmp_path / "f.img", capacity_bytes=3 * BLOCK)) as (dev, device):
        for i in range(8):
            dev.store(i * BLOCK, bytes([i + 1]) * BLOCK)
        evict_all(dev)
        assert device.ssd.injected["enospc"] > 0
        assert dev.load(0, BLOCK) == b"\x01" * BLOCK  # written before the back end filled up
        with pytest.raises(PoisonError, match="No space"):
            dev.load(7 * BLOCK, 1)


def test_bad_fault_config_names_the_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        open_device(dev_config(tmp_path / "g.img", read_error_rate=2.0))
    assert info.value.key == "backend.faults" and "read_error_rate" in str(info.value)
    with pytest.raises(ConfigError, match="unknown fault key"):
        open_device(dev_config(tmp_path / "g.img", gremlins=1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), read_err=st.sampled_from([0.0, 0.2, 0.6]),
       write_err=st.sampled_from([0.0, 0.2, 0.6]), short=st.sampled_from([0.0, 0.3]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 60 * BLOCK), st.integers(1, 2 * BLOCK)), max_size=40))
def test_under_any_faults_reads_are_exact_or_errors(tmp_path, seed, read_err, write_err, short, ops):
    # a fresh file per example: hypothesis reuses tmp_path and repeats seeds, and an
    # image left by an earlier example would hold bytes this example's model never saw
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / f"h{seed}.img"
    model = bytearray(64 * BLOCK)
    lost = np.zeros(64 * BLOCK, bool)  # bytes the device told us it lost (a write brings them back)
    cfg = dev_config(path, read_error_rate=read_err, write_error_rate=write_err,
                     short_read_rate=short, short_write_rate=short, retries=1)
    cfg["seed"] = seed
    rng = np.random.default_rng(seed)
    with open_parts(cfg) as (dev, device):
        for is_write, off, n in ops:
            blocks = set(range(off // BLOCK, (off + n - 1) // BLOCK + 1))
            if is_write:
                data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                try:
                    dev.store(off, data)
                except PoisonError:  # a partial write whose block could not be read: nothing landed
                    continue
                model[off:off + n] = data
                lost[off:off + n] = False
            else:
                try:
                    got = dev.load(off, n)
                except PoisonError:
                    poison = device.poison
                    assert blocks & set(poison.blocks), "an error must name a poisoned block"
                    for b in blocks & set(poison.blocks):
                        gone = np.ones(BLOCK, bool)
                        for lo, hi in poison.valid.get(b, ()):
                            gone[lo:hi] = False
                        lost[b * BLOCK:(b + 1) * BLOCK] |= gone
                    continue
                assert not lost[off:off + n].any(), "bytes reported lost came back"
                assert got == bytes(model[off:off + n])
        _record_injected(device.ssd.injected if hasattr(device.ssd, "injected") else {})


# ---------------------------------------------------------------- figures (docs/reliability.md)
# Reliability tests record what they injected, tried and checked here; run
#   .venv/bin/python tests/test_reliability.py
# after the tests to print the table. The file lives under out/ (not tracked); each
# figure remembers the pytest process that wrote it, so accumulated counts restart
# with every run instead of growing forever.
import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

FIGURES = Path(os.environ.get("CXLHM_RELIABILITY_FIGURES") or Path(__file__).resolve().parent.parent / "out" /
               "reliability" / "figures.json")


def _lock_figures(lock, timeout_s: float = 60.0) -> None:
    """The figures file's lock, waiting at most `timeout_s`: another process on this
    checkout (a stopped pytest, a bench) holding it fails this test, never hangs it."""
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock.name} stayed locked for {timeout_s:.0f} s: another process on this "
                                   "checkout holds it (set CXLHM_RELIABILITY_FIGURES to write elsewhere)") from None
            time.sleep(0.05)


def record_figure(group: str, name: str, metric: str, value, *, accumulate: bool = False) -> None:
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with open(FIGURES.with_suffix(".lock"), "a") as lock:
        _lock_figures(lock)
        try:
            data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
        except ValueError:
            data = {}
        key = f"{group}/{name}/{metric}"
        old = data.get(key)
        if accumulate and old is not None and old.get("session") == os.getpid():
            value = old["value"] + value
        data[key] = {"value": value, "session": os.getpid()}
        tmp = FIGURES.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, FIGURES)


def _record_injected(injected: dict) -> None:
    for kind, n in injected.items():
        if n:
            record_figure("faults", kind, "injected_and_survived", n, accumulate=True)


def test_latency_spikes_and_a_full_back_end_are_counted(tmp_path):
    with open_parts(dev_config(tmp_path / "s.img", spike_rate=0.5, spike_ns=200_000, capacity_bytes=12 * BLOCK)) as (dev, device):
        data = np.random.default_rng(1).integers(0, 256, 10 * BLOCK, dtype=np.uint8)
        dev.store(0, data)
        dev.flush()
        evict_all(dev)
        assert dev.load(0, data.size) == data.tobytes()  # slower, same bytes
        for i in range(20, 30):
            dev.store(i * BLOCK, b"z" * BLOCK)
        evict_all(dev)
        lost = 0
        for i in range(20, 30):
            try:
                assert dev.load(i * BLOCK, BLOCK) == b"z" * BLOCK
            except PoisonError:
                lost += 1
        injected = dict(device.ssd.injected)
    assert injected["spike"] > 0 and injected["enospc"] > 0 and lost > 0
    _record_injected({"spike": injected["spike"], "enospc": injected["enospc"]})


if __name__ == "__main__":
    import sys
    data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    if not data:
        sys.exit(f"no figures in {FIGURES}: run the reliability tests first")
    print(f"figures from {FIGURES}")
    for key in sorted(data):
        group, name, metric = key.split("/")
        print(f"  {group:10s} {name:34s} {metric:28s} {data[key]['value']}")


def test_register_traffic_survives_another_process_truncating_the_file(tmp_path):
    """A hostile process truncates the register file over and over while four client
    threads run commands: the device process must never fault (a mapped register page
    past the new end of the file would be SIGBUS), and the mailbox works afterwards."""
    import os
    import signal
    import threading
    import time

    from cxlhm.mailbox import Opcode
    from host_runtime.mailbox import MailboxClient, MailboxError
    from cxlhm.mailbox.registers import NotARegisterFile

    config = {"capacity": 64 * BLOCK, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK,
              "backend": {"path": str(tmp_path / "warm.img")}}
    with open_device(config) as dev:  # compile the firmware's kernels before the fork
        MailboxClient(dev.start_mailbox()).identify()
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # the device process
        code = 3
        try:
            with open_device({**config, "backend": {"path": str(tmp_path / "dev.img")}}) as dev:
                mailbox = dev.start_mailbox()
                os.write(from_child, mailbox.path.encode() + b"\n")
                os.read(to_child, 1)  # until the parent is done
                os.write(from_child, f"{mailbox.registers_restored} {int(mailbox._threads[0].is_alive())}\n".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(from_child)  # so a dead child reads as end of file, never a hang
    os.close(to_child)
    try:
        path = os.read(to_parent, 4096).decode().strip()
        assert path, "the device process died before it served"
        stop = threading.Event()
        commands = [0]
        truncations = [0]

        def traffic():
            while not stop.is_set():
                try:
                    with MailboxClient(path, timeout=5, ready_timeout=5, busy_timeout=2) as client:
                        for _ in range(50):
                            client.execute(Opcode.IDENTIFY)
                            client.execute(Opcode.GET_HEALTH_INFO)
                            commands[0] += 2
                except (MailboxError, NotARegisterFile, ValueError):
                    pass  # a client that met a truncated file may fail; the device must not

        clients = [threading.Thread(target=traffic) for _ in range(4)]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            os.truncate(path, 0)
            truncations[0] += 1
            time.sleep(0.0005)
        stop.set()
        for t in clients:
            t.join(30)
        with MailboxClient(path, timeout=10, busy_timeout=5) as client:
            assert client.identify()["max_message_size"] >= 2048
        os.write(from_parent, b"x")
        restored, alive = map(int, os.read(to_parent, 4096).split())
    finally:
        os.close(from_parent)
        os.close(to_parent)
        _, status = os.waitpid(pid, 0)
    assert not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS), "the device process died of SIGBUS"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert alive, "the firmware thread died"
    assert truncations[0] > 100 and commands[0] > 100 and restored > 0
