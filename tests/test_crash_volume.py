"""kill -9 at volume (slow): over a thousand crash points, over the device alone and over
the KV store on it. Each point forks a writer from this warmed process (the firmware
kernels are compiled once, here, so a child starts in milliseconds), kills it with
SIGKILL at a randomized point, reopens its image here and checks what came back.

The device writer writes whole blocks (one to three per call) with bytes that depend on
block and version, flushes now and then, and reports to a file with write(2) - the
version it is about to write, the write returning, the flush returning - so the report
survives the kill. After the reopen every block must read back as
  * the last version whose write returned, or the one in flight at the kill, or
  * a PoisonError (its newest bytes were in device DRAM only),
and never an older version, another block's bytes or a mix; a block flushed and not
written since must read back exactly. The KV half is tests/test_crash.py's campaign
(every chunk committed before the last returned flush() byte-exact, no chunk ever
served with wrong bytes, index and allocator agreeing) run at volume.

Kill points: after a random delay (this process's kill -9), at the Nth SSD write
before it lands, at the Nth SSD write with a torn landing, at the Nth integrity-log
append (before or after it). CXLHM_CRASH_POINTS sets the total (default 1200).
"""
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cxlhm.integrity import PoisonError
from host_runtime.driver import open_device
from test_crash import CRASH_MODES, _crash_campaign, reopen
from test_reliability import record_figure
from threads import wait_child

BLOCK = 4096
BLOCKS = 48
DEVICE = {"capacity": BLOCKS * BLOCK, "block_size": BLOCK, "dram_bytes": 6 * BLOCK}  # most writes cross to the SSD
DEVICE_MODES = ["delay", "ssd_write", "torn_write", "ilog"]


def _config(image, faults=None):
    return {**DEVICE, "backend": {"path": str(image), "faults": faults or {}}}


def block_bytes(block: int, version: int) -> np.ndarray:
    """Version `version` of `block`: every byte depends on both and on the offset."""
    return ((np.arange(BLOCK, dtype=np.int64) * 7 + block * 131 + version * 29) % 253 + 1).astype(np.uint8)


def _device_writer(image, report_path, faults, kill_ilog, n_ops, seed) -> None:
    """The child: whole-block writes of new versions, flushes, reported line by line."""
    from cxlhm import integrity
    fd = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    original, count = integrity.IntegrityLog.append, [0]

    def append(self, *args, **kw):  # counts, and kills at the chosen append
        count[0] += 1
        if kill_ilog and count[0] == kill_ilog[0] and kill_ilog[1] == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(self, *args, **kw)
        if kill_ilog and count[0] == kill_ilog[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    integrity.IntegrityLog.append = append
    rng = np.random.default_rng(seed)
    version = 0
    with open_device(_config(image, faults)) as dev:
        note("OPEN")
        for _ in range(n_ops):
            if rng.random() < 0.12:
                dev.flush()
                note("F")
                continue
            first = int(rng.integers(0, BLOCKS))
            blocks = list(range(first, min(BLOCKS, first + int(rng.integers(1, 4)))))
            version += 1
            note("w " + " ".join(f"{b}:{version}" for b in blocks))  # intent: may or may not land
            dev.store(first * BLOCK, np.concatenate([block_bytes(b, version) for b in blocks]))
            note("W")  # the write returned
        ssd_writes = dev.stats()["ssd_writes"]
    integrity.IntegrityLog.append = original
    note(f"CLOSED {ssd_writes} {count[0]}")
    os.close(fd)


def _expectations(lines: list[str]) -> dict[int, dict]:
    """Per block: the version acknowledged last, the one in flight at the kill, and
    whether its acknowledged version was flushed (and not written since)."""
    state: dict[int, dict] = {b: {"acked": 0, "inflight": None, "durable": True} for b in range(BLOCKS)}
    pending: list[tuple[int, int]] = []
    for line in lines:
        if line.startswith("w "):
            pending = [tuple(map(int, item.split(":"))) for item in line[2:].split()]
            for b, v in pending:
                state[b]["inflight"] = v
                state[b]["durable"] = False
        elif line == "W":
            for b, v in pending:
                state[b]["acked"], state[b]["inflight"] = v, None
            pending = []
        elif line == "F" or line.startswith("CLOSED"):
            for s in state.values():
                if s["inflight"] is None:
                    s["durable"] = True
    return state


def _verify_device(image, report_path) -> dict:
    lines = Path(report_path).read_text().splitlines()
    state = _expectations(lines)
    out = {"blocks": 0, "exact": 0, "poisoned": 0, "durable": 0, "wrong": 0}
    with reopen(_config(image)) as dev:
        for b, s in state.items():
            allowed = {s["acked"]} | ({s["inflight"]} if s["inflight"] is not None else set())
            out["blocks"] += 1
            out["durable"] += s["durable"]
            try:
                got = np.frombuffer(dev.load(b * BLOCK, BLOCK), np.uint8)
            except PoisonError:
                assert not s["durable"], f"block {b}: flushed version {s['acked']} lost"
                out["poisoned"] += 1
                continue
            if any(np.array_equal(got, block_bytes(b, v) if v else np.zeros(BLOCK, np.uint8)) for v in allowed):
                out["exact"] += 1
            else:
                out["wrong"] += 1
    assert out["wrong"] == 0, f"{out['wrong']} block(s) read back with bytes that were never their last write"
    return out


def _fork_writer(run, delay_s=None, timeout_s=60.0) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            run()
        except BaseException:  # noqa: BLE001 - the parent sees the exit status
            code = 2
        os._exit(code)
    return wait_child(pid, timeout=timeout_s, kill_after=delay_s, hang="the writer hung")


def _device_campaign(tmp_path, points: int, n_ops: int, seed: int) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    warm, report = tmp_path / "warm.img", tmp_path / "warm.log"
    _device_writer(warm, report, None, None, n_ops, seed)  # compile everything before forking
    start = time.monotonic()
    _device_writer(tmp_path / "clean.img", tmp_path / "clean.log", None, None, n_ops, seed)
    duration = time.monotonic() - start
    clean = _verify_device(tmp_path / "clean.img", tmp_path / "clean.log")
    assert clean["exact"] == BLOCKS and clean["poisoned"] == 0, clean  # a clean close loses nothing
    ssd_writes, appends = map(int, (tmp_path / "clean.log").read_text().splitlines()[-1].split()[1:])
    rng = np.random.default_rng(seed)
    summary = {"points": 0, "killed": 0, "wrong": 0, "blocks_checked": 0, "poisoned": 0, "durable_checked": 0,
               "by_mode": {m: 0 for m in DEVICE_MODES}}
    for i in range(points):
        mode = DEVICE_MODES[i % len(DEVICE_MODES)]
        faults, kill_ilog, delay = None, None, None
        if mode == "delay":
            delay = float(rng.uniform(0.0, duration))
        elif mode in ("ssd_write", "torn_write"):
            faults = {"power_loss_at_write": int(rng.integers(1, max(2, int(0.9 * ssd_writes)))),
                      "power_loss_action": "kill"}
            if mode == "ssd_write":
                faults.update(power_loss_pages=0, power_loss_torn_bytes=0)
        else:
            kill_ilog = (int(rng.integers(1, max(2, int(0.9 * appends)))), "before" if rng.random() < 0.5 else "after")
        image, report = tmp_path / f"d{i}.img", tmp_path / f"d{i}.log"
        status = _fork_writer(lambda: _device_writer(image, report, faults, kill_ilog, n_ops, seed + 1 + i), delay)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0), (mode, status)
        if not report.exists() or not report.read_text().startswith("OPEN"):
            continue  # killed before the device was open: nothing to check
        result = _verify_device(image, report)
        summary["points"] += 1
        summary["killed"] += killed
        summary["by_mode"][mode] += 1
        summary["wrong"] += result["wrong"]
        summary["blocks_checked"] += result["blocks"]
        summary["poisoned"] += result["poisoned"]
        summary["durable_checked"] += result["durable"]
        for suffix in ("", ".cxlhm.json", ".cxlhm.sums", ".cxlhm.ilog"):
            Path(str(image) + suffix).unlink(missing_ok=True)
        if (i + 1) % 100 == 0:
            print(f"  device: {i + 1}/{points} crash points", file=sys.stderr, flush=True)
    return summary


@pytest.mark.slow
def test_a_thousand_kill_9_points_over_the_device_and_the_kv_store(tmp_path):
    total = int(os.environ.get("CXLHM_CRASH_POINTS", "1200"))
    start = time.monotonic()
    device = _device_campaign(tmp_path / "device", points=total // 2, n_ops=150, seed=4242)
    device_s = time.monotonic() - start
    (tmp_path / "kv").mkdir()
    kv = _crash_campaign(tmp_path / "kv", points=total - total // 2, n_ops=120, seed=9191)
    wall = time.monotonic() - start
    print(f"\ndevice: {device['points']} kill -9 points ({device['killed']} killed), {device['blocks_checked']} blocks "
          f"read back, {device['durable_checked']} of them flushed, {device['poisoned']} poisoned, "
          f"{device['wrong']} wrong; by mode {device['by_mode']}; {device_s:.0f} s")
    print(f"kv store: {kv['points']} kill -9 points ({kv['killed']} killed), {kv['chunks_read']} chunks read back, "
          f"{kv['durable_checked']} durable chunks checked, {kv['corrupt_reads']} corrupt; by mode {kv['by_mode']}; "
          f"{wall - device_s:.0f} s")
    print(f"total: {device['points'] + kv['points']} kill -9 points, {wall:.0f} s wall")
    assert device["wrong"] == 0 and kv["corrupt_reads"] == 0
    assert device["points"] + kv["points"] >= 0.95 * total
    assert all(device["by_mode"].values()) and all(kv["by_mode"][m] for m in CRASH_MODES)
    assert device["killed"] >= 0.8 * device["points"] and kv["killed"] >= 0.8 * kv["points"]
    for name, figures in (("device_kill9_volume", device), ("kv_kill9_volume", kv)):
        for metric in ("points", "killed"):
            record_figure("crash", name, metric, figures[metric])
    record_figure("crash", "device_kill9_volume", "wrong_blocks", device["wrong"])
    record_figure("crash", "device_kill9_volume", "blocks_read_back", device["blocks_checked"])
    record_figure("crash", "kv_kill9_volume", "corrupt_reads", kv["corrupt_reads"])
    record_figure("crash", "kv_kill9_volume", "chunks_read_back", kv["chunks_read"])
