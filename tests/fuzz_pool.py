"""A hostile host against the pool service: whatever it sends on its socket or writes into
the shared memory it was given (its rings, its hit log), the service answers it with a
status or ignores it, never dies, never slows past a deadline, and never changes what
another tenant's host reads.

A case is one of:
  wire   a raw request message on the hostile host's socket (any op, tenant, offsets,
         payload, or bytes that are not a request at all) - a reply must come back
  ring   a submission entry with any op, tenant index, offset, length and buffer offset,
         or a scribble over the ring segment's header and entries - a well-formed
         submission must complete with a status, a scribble must not hurt the service
  hits   a scribble over the hit log followed by a report pass
  hello  a new connection sending arbitrary handshake bytes - refused with a reason
After every case the honest host (another tenant) reads its blocks back right, through
its mirror and through the rings.

Used by tests/test_pool_hostile.py (a few hundred cases) and tests/fuzz_volume.py
(`make fuzz`, at volume)."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from cxlhm.pool import hitlog, protocol as P, rings as R, wire
from host_runtime.pool_client import PoolError, handshake
from pool_helpers import BLOCK, PARTITION, attach, block_record, in_process_service, read_record

U64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, BLOCK - 1, BLOCK, PARTITION - BLOCK, PARTITION,
                                                           PARTITION + 1, 2**63, 2**64 - 1, 2**64 - BLOCK]))
LENGTH = st.one_of(st.integers(0, 3 * BLOCK), st.sampled_from([R.PAYLOAD, R.PAYLOAD + 1, 2**32, 2**64 - 1]))

WIRE = st.builds(lambda op, tenant, a, b, payload, raw: ("wire", raw if raw is not None else
                                                         P.REQUEST.pack(op, tenant, a, b) + payload),
                 st.integers(0, 255), st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2])),
                 U64, LENGTH.filter(lambda n: n < 2**64), st.binary(max_size=64),
                 st.one_of(st.none(), st.binary(max_size=40)))
RING = st.builds(lambda op, index, offset, n, buf, payload: ("ring", op, index, offset, n, buf, payload),
                 st.one_of(st.integers(0, 255), st.sampled_from([1, 2, 3])), st.one_of(st.integers(0, 2**24 - 1),
                                                                                       st.just(0)),
                 U64, LENGTH, st.one_of(st.just(0), st.integers(0, R.PAYLOAD + 10)), st.binary(max_size=64))
SCRIBBLE = st.builds(lambda where, writes: ("scribble", where, writes), st.sampled_from(["rings", "hits"]),
                     st.lists(st.tuples(st.integers(0, 1023), st.integers(0, 2**64 - 1)), min_size=1, max_size=8))
HELLO = st.builds(lambda data: ("hello", data), st.binary(max_size=200))
CASE = st.one_of(WIRE, RING, SCRIBBLE, HELLO)


class PoolFuzz:
    """A service, an honest host of tenant "victim" and a hostile host of tenant "hostile"."""

    def __init__(self, folder: Path):
        self.svc = in_process_service(folder, auth_deadline_s=1.0)
        self.honest = attach(self.svc, "honest", ["victim"])
        t = self.honest.tenant("victim")
        for j in range(4):
            t.write_from(j * BLOCK, block_record(7, j, 1))
        self.sock, reply, fds = handshake(self.svc.socket_path, "hostile", ["hostile"], self.svc.authkey)
        life, hits, seg, self.submitted, completed, mirror = fds
        for fd in (life, mirror):
            os.close(fd)
        self.rings = R.HostRings(seg, self.submitted, completed)
        self.hits = hitlog.HitRecorder(hits)
        self.tag = 0
        self.cases = {"wire": 0, "ring": 0, "scribble": 0, "hello": 0}
        self.statuses: dict[int, int] = {}

    def close(self) -> None:
        self.honest.close()
        self.sock.close()
        self.rings.close()
        self.hits.close()
        self.svc.close()

    # ------------------------------------------------------------ one case
    def check(self, case) -> None:
        kind = case[0]
        self.cases[kind] += 1
        getattr(self, f"_{kind}")(*case[1:])
        self._honest_reads_right()

    def _wire(self, msg: bytes) -> None:
        self.sock.settimeout(20)
        wire.send(self.sock, msg)
        raw = wire.recv(self.sock, P.MAX_MESSAGE + 4096)
        status = P.REPLY.unpack_from(raw)[0]
        self.statuses[status] = self.statuses.get(status, 0) + 1
        assert status in set(P.Status), f"an unknown status {status}"

    def _service_rings(self) -> R.ServiceRings:
        return next(h for h in self.svc._hosts.values() if h.name == "hostile").rings

    def _ring(self, op, index, offset, n, buf, payload) -> None:
        r = self.rings
        r.payload[:len(payload)] = np.frombuffer(payload, np.uint8)
        tail = self._service_rings().consumed  # where the service will look (a scribble may have moved it)
        self.tag = tag = (self.tag + 1) % (1 << 32) or 1
        r.cq[:] = 0
        r.sq[tail % R.DEPTH] = (op | index << 8 | tag << 32, offset, n, buf)
        r.header[R.SQ_TAIL] = (tail + 1) % (1 << 64)  # (a scribble may have left the tail at 2**64 - 1)
        os.eventfd_write(r.submitted, 1)
        deadline = time.monotonic() + 20
        while True:
            done = np.flatnonzero(r.cq[:, 0] == tag)
            if done.shape[0]:
                break
            assert time.monotonic() < deadline, "a ring entry was never completed"
            time.sleep(0.0002)
        status = int(r.cq[done[0], 1])
        self.statuses[status] = self.statuses.get(status, 0) + 1
        assert status in set(P.Status), f"an unknown status {status}"

    def _scribble(self, where, writes) -> None:
        if where == "rings":
            words = np.frombuffer(self.rings._mm, np.uint64, (R.CQ_AT + R.DEPTH * R.ENTRY_WORDS * 8) // 8)
            for at, value in writes:
                words[at if at < 16 else at % words.shape[0]] = value
            os.eventfd_write(self.rings.submitted, 1)
            time.sleep(0.005)  # whatever the service makes of it, it makes of it now
        else:
            words = np.frombuffer(self.hits._mm, np.uint64)
            for at, value in writes:
                words[at % words.shape[0]] = value
            self.svc.report_hits()

    def _hello(self, data: bytes) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        try:
            s.connect(self.svc.socket_path)
            json.loads(wire.recv(s, 4096))
            s.sendall(wire.FRAME.pack(len(data)) + data if data[:1] != b"\x00" else data)
            try:
                answer = json.loads(wire.recv(s, 1 << 16))
                assert "error" in answer, f"an attach with garbage was accepted: {answer}"
            except wire.WireError:
                pass  # a broken frame, hung up on at the deadline: fine too
        finally:
            s.close()

    def _honest_reads_right(self) -> None:
        t = self.honest.tenant("victim")
        buf = np.empty(BLOCK, np.uint8)
        for j in range(4):
            t.read_into(j * BLOCK, buf)  # from the mirror or through its own rings
            assert read_record(buf) == (1, 7, j), f"the honest host's block {j} reads wrong"
        try:
            self.honest._ring_call(P.Op.READ, 0, 0, BLOCK, out=buf)
        except PoolError as exc:
            raise AssertionError(f"the honest host's rings fail: {exc}") from None
        assert read_record(buf) == (1, 7, 0)


def open_world() -> PoolFuzz:
    return PoolFuzz(Path(tempfile.mkdtemp(prefix="cxlhm-fuzz-pool-")))
