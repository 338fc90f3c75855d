"""A host process's attachment to a pooled CXL-HM device (cxlhm.pool.PoolService).

    with PoolHost.attach("/run/cxlhm/pool.sock", "host-a", ["tenant-1"], authkey=key) as host:
        t = host.tenant("tenant-1")
        t.store(0, b"hello")               # through the service
        t.load(0, 5)                       # from the tenant's mirror when the block is there
        host.hints.session_resume(7, [(t.window_base, 1 << 20)])   # this host's own mailbox

Offsets are bytes of the tenant's partition. In hints (this host's mailbox), the host's
window is its tenants' partitions laid end to end in the order it asked for them:
`tenant.window_base + offset`.
"""
from __future__ import annotations

import functools
import json
import os
import threading
from multiprocessing import connection, reduction
from typing import Any

import numpy as np

from cxlhm.pool import protocol as P
from cxlhm.pool.mirror import MirrorReader
from host_runtime.buffers import byte_view
from host_runtime.mailbox import HintClient, MailboxClient

PoolError = P.PoolError


class AttachRefused(PoolError):
    pass


class PooledTenant:
    """One granted tenant partition of the pooled device, as this host reaches it."""

    def __init__(self, host: "PoolHost", name: str, tid: int, index: int, mirror: MirrorReader):
        self.host, self.name, self.id = host, name, tid
        self.size = host.partition_bytes
        self.window_base = index * host.partition_bytes
        self.mirror = mirror
        self.direct_hits = 0       # reads served from the mirror, no round trip
        self.service_reads = 0

    def read_into(self, offset: int, buf: Any) -> int:
        view = byte_view(buf, writable=True)
        if self.mirror.read(offset, view):
            self.direct_hits += 1
            return view.shape[0]
        self.service_reads += 1
        done = 0
        step = P.MAX_MESSAGE
        while done < view.shape[0]:  # a read larger than one message is several
            n = min(step, view.shape[0] - done)
            data = self.host._call(P.Op.READ, self.id, offset + done, n)[3]
            view[done:done + n] = np.frombuffer(data, np.uint8)
            done += n
        return done

    def load(self, offset: int, n: int) -> bytes:
        out = np.empty(n, np.uint8)
        self.read_into(offset, out)
        return out.tobytes()

    def write_from(self, offset: int, buf: Any) -> int:
        view = byte_view(buf, writable=False)
        for start in range(0, max(1, view.shape[0]), P.MAX_MESSAGE):
            part = view[start:start + P.MAX_MESSAGE]
            self.host._call(P.Op.WRITE, self.id, offset + start, 0, part.data)
        return view.shape[0]

    def store(self, offset: int, data: Any) -> None:
        self.write_from(offset, data)

    def put_chunk(self, chunk: bytes | memoryview) -> tuple[int, int]:
        """Allocate room in the partition and write `chunk` there: (offset, generation)."""
        _, offset, generation, _ = self.host._call(P.Op.PUT, self.id, 0, 0, chunk)
        return offset, generation


class PoolHost:
    def __init__(self, conn, name: str, reply: dict, mirrors: list[MirrorReader], mailbox_timeout: float = 10.0):
        self._conn, self.name = conn, name
        self.mailbox_timeout = mailbox_timeout
        self.host_id = reply["host_id"]
        self.block_size = reply["block_size"]
        self.partition_bytes = reply["partition_bytes"]
        self.regs_path = reply["regs"]
        self.tenants = {t["name"]: PooledTenant(self, t["name"], t["id"], i, m)
                        for i, (t, m) in enumerate(zip(reply["tenants"], mirrors))}
        self._lock = threading.Lock()
        self.closed = False

    @classmethod
    def attach(cls, address: str | os.PathLike, name: str, tenants: list[str], *, authkey: bytes,
               mailbox_timeout: float = 10.0) -> "PoolHost":
        """`mailbox_timeout`: seconds a mailbox command may take (every host's commands
        share one firmware, so more than a single host's default)."""
        conn = connection.Client(str(address), family="AF_UNIX", authkey=authkey)
        try:
            conn.send_bytes(json.dumps({"host": name, "tenants": list(tenants), "pid": os.getpid()}).encode())
            reply = json.loads(conn.recv_bytes())
            if "error" in reply:
                raise AttachRefused(P.Status.NOT_GRANTED, reply["error"])
            mirrors = [MirrorReader(reduction.recv_handle(conn), reply["mirror_entries"], reply["block_size"])
                       for _ in reply["tenants"]]
        except BaseException:
            conn.close()
            raise
        return cls(conn, name, reply, mirrors, mailbox_timeout)

    def tenant(self, name: str) -> PooledTenant:
        try:
            return self.tenants[name]
        except KeyError:
            raise KeyError(f"host {self.name!r} did not attach tenant {name!r} (it has {sorted(self.tenants)})") from None

    def _call(self, op: P.Op, tenant: int = 0, a: int = 0, b: int = 0, payload=b"") -> tuple[int, int, int, bytes]:
        with self._lock:
            if self.closed:
                raise PoolError(P.Status.BAD_REQUEST, f"host {self.name!r} is detached")
            self._conn.send_bytes(P.request(op, tenant, a, b, payload))
            raw = self._conn.recv_bytes()
        status, v1, v2 = P.REPLY.unpack_from(raw)
        body = raw[P.REPLY.size:]
        if status != P.Status.OK:
            raise PoolError(status, f"{op.name.lower()}: {body.decode(errors='replace')}")
        return status, v1, v2, body

    # ------------------------------------------------------------ mailbox
    @functools.cached_property
    def mailbox(self) -> MailboxClient:
        """This host's own register block on the pooled device."""
        return MailboxClient(self.regs_path, timeout=self.mailbox_timeout)

    @property
    def hints(self) -> HintClient:
        return self.mailbox.hints

    # ------------------------------------------------------------ control
    def flush(self) -> int:
        return self._call(P.Op.FLUSH)[1]

    def stats(self) -> dict:
        return json.loads(self._call(P.Op.STATS)[3])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if "mailbox" in self.__dict__:
            self.mailbox.close()
        self._conn.close()
        for t in self.tenants.values():
            t.mirror.close()

    def __enter__(self) -> "PoolHost":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
