"""kill -9 campaigns over the pool: host processes killed at random moments while they
write (through the rings) and flush, and the service itself killed and restarted, with
every block checked after every kill. A block must hold a whole record of its owner
and index, of a version that was written (the last acknowledged one, or the one in
flight when the writer died), never an older one than the last flushed version after
a service restart, and never anything else: 0 wrong bytes. A block written after the
last flush may read as an error after the service was killed (its bytes were in device
DRAM only): it is then rewritten and flushed by the checker."""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest

from host_runtime.pool_client import PoolError
from pool_helpers import BLOCK, ServeProcess, attach, block_record, read_record

SLOTS, PER_SLOT = 4, 8
FORK = mp.get_context("fork")  # a host process in milliseconds (the test process runs no service threads)


def _writer(sock: str, key: bytes, slot: int, versions: list[int], ack_path: str, seed: int) -> None:
    """Writes its slot's blocks with rising versions, appending 'j v' once acknowledged
    and 'F' once a flush is; runs until killed."""
    rng = random.Random(seed)
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    host = attach(sock, f"w{slot}", ["t"], key)
    t = host.tenant("t")
    v = list(versions)
    n = 0
    while True:
        j = rng.randrange(PER_SLOT)
        v[j] += 1
        t.write_from((slot * PER_SLOT + j) * BLOCK, block_record(slot, j, v[j]))
        os.write(fd, f"{j} {v[j]}\n".encode())
        n += 1
        if n % 7 == 0:
            host.flush()
            os.write(fd, b"F\n")


class Ledger:
    """What the test knows was acknowledged, per block: the last version, and the last
    version acknowledged before an acknowledged flush."""

    def __init__(self):
        self.acked = np.zeros((SLOTS, PER_SLOT), np.int64)
        self.durable = np.zeros((SLOTS, PER_SLOT), np.int64)

    def absorb(self, slot: int, ack_path: str) -> None:
        if not os.path.exists(ack_path):
            return
        with open(ack_path) as f:
            lines = f.read().split("\n")
        os.unlink(ack_path)
        for line in lines[:-1]:  # the last piece may be a line the kill cut short
            if line == "F":
                self.durable[slot] = self.acked[slot]
            elif line:
                j, v = map(int, line.split())
                self.acked[slot, j] = max(self.acked[slot, j], v)


def _check_block(t, ledger: Ledger, slot: int, j: int, after_restart: bool, stats: dict) -> None:
    buf = np.empty(BLOCK, np.uint8)
    try:
        t.read_into((slot * PER_SLOT + j) * BLOCK, buf)
    except PoolError as exc:
        # only a block written since its last flush may be lost to a service kill
        assert after_restart and ledger.acked[slot, j] > ledger.durable[slot, j], \
            f"block {slot}/{j}: {exc} (acked v{ledger.acked[slot, j]}, durable v{ledger.durable[slot, j]})"
        v = int(ledger.acked[slot, j]) + 2  # rewritten whole: the poison goes
        t.write_from((slot * PER_SLOT + j) * BLOCK, block_record(slot, j, v))
        ledger.acked[slot, j] = v
        stats["lost_unflushed"] += 1
        return
    stats["bytes_checked"] += BLOCK
    acked, durable = ledger.acked[slot, j], ledger.durable[slot, j]
    if not buf.any():
        assert (durable if after_restart else acked) == 0, f"block {slot}/{j} reads zeros, acked v{acked}"
        return
    got = read_record(buf)
    assert got is not None, f"block {slot}/{j}: bytes that are no record (torn or foreign)"
    v, owner, index = got
    assert (owner, index) == (slot, j), f"block {slot}/{j} holds {owner}/{index}'s record"
    low = durable if after_restart else acked
    assert low <= v <= acked + 1, f"block {slot}/{j}: v{v}, expected v{low}..v{acked + 1}"
    ledger.acked[slot, j] = max(acked, v)  # an unacknowledged write that landed is the new truth


def campaign(tmp_path, points: int, service_every: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    serve = ServeProcess(tmp_path).start()
    ledger = Ledger()
    stats = {"host_kills": 0, "service_kills": 0, "bytes_checked": 0, "lost_unflushed": 0}
    checker = attach(serve.socket, "checker", ["t"], serve.authkey)
    try:
        for point in range(points):
            if service_every and point % service_every == service_every - 1:
                serve.kill()
                stats["service_kills"] += 1
                checker.close()
                serve.start()
                checker = attach(serve.socket, "checker", ["t"], serve.authkey)
                t = checker.tenant("t")
                for slot in range(SLOTS):
                    for j in range(PER_SLOT):
                        _check_block(t, ledger, slot, j, True, stats)
                checker.flush()
                ledger.durable[:] = ledger.acked
                continue
            slot = rng.randrange(SLOTS)
            ack = str(tmp_path / f"ack{slot}")
            p = FORK.Process(target=_writer, args=(serve.socket, serve.authkey, slot,
                                                   ledger.acked[slot].tolist(), ack, rng.randrange(1 << 30)))
            p.start()
            time.sleep(rng.uniform(0.0, 0.08))
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
            stats["host_kills"] += 1
            ledger.absorb(slot, ack)
            t = checker.tenant("t")
            for j in range(PER_SLOT):
                _check_block(t, ledger, slot, j, False, stats)
        checker.close()
    finally:
        serve.stop()
    return stats


def test_host_kills_leave_every_block_whole(tmp_path):
    stats = campaign(tmp_path, points=30, service_every=0)
    assert stats["host_kills"] == 30 and stats["bytes_checked"] >= 30 * PER_SLOT * BLOCK // 2


@pytest.mark.slow  # about ten service restarts and a thousand host processes
def test_kill_campaign_over_service_and_hosts(tmp_path):
    stats = campaign(tmp_path, points=int(os.environ.get("CXLHM_POOL_KILL_POINTS", 1000)), service_every=100,
                     seed=1)
    assert stats["host_kills"] + stats["service_kills"] >= 1000
    print(f"kill campaign: {stats}")
