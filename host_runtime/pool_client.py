"""A host process's attachment to a pooled CXL-HM device (cxlhm.pool.PoolService).

    key = open("/var/lib/cxlhm-pool/hosts/host-a.key", "rb").read()   # this host's own key
    with PoolHost.attach("/run/cxlhm/pool.sock", "host-a", ["tenant-1"], authkey=key) as host:
        t = host.tenant("tenant-1")
        t.store(0, b"hello")               # through the service
        t.load(0, 5)                       # from the tenant's mirror when the block is there
        host.hints.session_resume(7, [(t.window_base, 1 << 20)])   # this host's own mailbox

The host proves its name with its key (a challenge answered with HMAC-SHA256, see
cxlhm/pool/identity.py); the key never crosses the socket. Offsets are bytes of the
tenant's partition; one outside it is an error before anything is read. Once the service
this host attached to has closed, died or restarted, mirror reads miss and requests
fail with SERVICE_GONE: attach again. In hints (this host's mailbox), the host's
window is its tenants' partitions laid end to end in the order it asked for them:
`tenant.window_base + offset`.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import threading
from typing import Any

import numpy as np

from cxlhm.pool import protocol as P
from cxlhm.pool import wire
from cxlhm.pool.hitlog import HitRecorder
from cxlhm.pool.identity import proof
from cxlhm.pool.mirror import LifeReader, MirrorReader
from cxlhm.pool.rings import PAYLOAD, HostRings
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
        self.index = index
        self.window_base = index * host.partition_bytes
        self.mirror = mirror
        self.direct_hits = 0       # reads served from the mirror, no round trip
        self.service_reads = 0

    def _bounds(self, offset: int, n: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0 \
                or offset + n > self.size:
            raise PoolError(P.Status.OUT_OF_RANGE, f"[{offset}, +{n}) is outside tenant {self.name!r}'s "
                                                   f"{self.size}-byte partition (offsets 0..{self.size - n} accepted)")

    def read_into(self, offset: int, buf: Any) -> int:
        view = byte_view(buf, writable=True)
        self._bounds(offset, view.shape[0])
        if self.mirror.read(offset, view):
            self.direct_hits += 1
            if view.shape[0] and self.host.hits is not None:  # so the firmware sees this read too
                bs = self.host.block_size
                first = offset // bs
                self.host.hits.record(self.index, first, (offset + view.shape[0] - 1) // bs - first + 1)
            return view.shape[0]
        self.service_reads += 1
        done = 0
        while done < view.shape[0]:  # a read larger than the ring's buffer is several
            n = min(PAYLOAD, view.shape[0] - done)
            self.host._ring_call(P.Op.READ, self.index, offset + done, n, out=view[done:done + n])
            done += n
        return done

    def load(self, offset: int, n: int) -> bytes:
        out = np.empty(n, np.uint8)
        self.read_into(offset, out)
        return out.tobytes()

    def write_from(self, offset: int, buf: Any) -> int:
        view = byte_view(buf, writable=False)
        self._bounds(offset, view.shape[0])
        for start in range(0, max(1, view.shape[0]), PAYLOAD):
            part = view[start:start + PAYLOAD]
            self.host._ring_call(P.Op.WRITE, self.index, offset + start, part.shape[0], payload=part)
        return view.shape[0]

    def store(self, offset: int, data: Any) -> None:
        self.write_from(offset, data)

    def put_chunk(self, chunk: bytes | memoryview) -> tuple[int, int]:
        """Allocate room in the partition and write `chunk` there: (offset, generation)."""
        raw = np.frombuffer(chunk, np.uint8)
        if raw.shape[0] > PAYLOAD:  # too large for the rings: the service says so with a reason
            _, offset, generation, _ = self.host._call(P.Op.PUT, self.id, 0, 0, chunk)
            return offset, generation
        _, offset, generation = self.host._ring_call(P.Op.PUT, self.index, 0, raw.shape[0], payload=raw)
        return offset, generation


def handshake(address: str | os.PathLike, name: str, tenants: list[str], authkey: bytes,
              timeout: float = 30.0) -> tuple[socket.socket, dict, list[int]]:
    """Connect and attach: (the socket, the service's reply, the descriptors it sent:
    the life counter's, the hit log's, the rings' segment and its two eventfds, then one
    mirror's per tenant). AttachRefused says why not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        sock.settimeout(timeout)
        sock.connect(str(address))
        hello = json.loads(wire.recv(sock, 1 << 16))
        if "error" in hello:
            raise AttachRefused(P.Status.NOT_GRANTED, hello["error"])
        answer = proof(authkey, bytes.fromhex(hello["challenge"]), name)
        wire.send(sock, json.dumps({"host": name, "tenants": list(tenants), "proof": answer.hex()}).encode())
        raw, fds = wire.recv_with_fds(sock, 1 << 16, 5 + len(tenants))
        reply = json.loads(raw)
        if "error" in reply:
            raise AttachRefused(P.Status.NOT_GRANTED, reply["error"])
        if len(fds) != 5 + len(reply["tenants"]):
            raise AttachRefused(P.Status.BAD_REQUEST, f"the service sent {len(fds)} descriptors, "
                                                      f"{5 + len(reply['tenants'])} expected")
        sock.settimeout(None)
        return sock, reply, fds
    except wire.WireError as exc:
        for fd in fds:
            os.close(fd)
        sock.close()
        raise AttachRefused(P.Status.SERVICE_GONE, f"the pool service at {address} ended the attach ({exc}); "
                                                   "its log says why") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        sock.close()
        raise


class PoolHost:
    def __init__(self, conn, name: str, reply: dict, mirrors: list[MirrorReader], mailbox_timeout: float = 10.0,
                 life: LifeReader | None = None, hits: HitRecorder | None = None, rings: HostRings | None = None):
        self._conn, self.name = conn, name
        self.life, self.hits, self.rings = life, hits, rings
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
        sock, reply, fds = handshake(address, name, tenants, authkey)
        mirrors: list[MirrorReader] = []
        life = hits = rings = None
        try:
            life = LifeReader(fds.pop(0), reply["life"])
            hits = HitRecorder(fds.pop(0))
            rings = HostRings(fds.pop(0), fds.pop(0), fds.pop(0), watch=sock.fileno())
            while fds:
                mirrors.append(MirrorReader(fds.pop(0), reply["mirror_entries"], reply["block_size"], life))
        except BaseException:
            for fd in fds:
                os.close(fd)
            for m in mirrors:
                m.close()
            for x in (life, hits, rings):
                if x is not None:
                    x.close()
            sock.close()
            raise
        return cls(sock, name, reply, mirrors, mailbox_timeout, life, hits, rings)

    def tenant(self, name: str) -> PooledTenant:
        try:
            return self.tenants[name]
        except KeyError:
            raise KeyError(f"host {self.name!r} did not attach tenant {name!r} (it has {sorted(self.tenants)})") from None

    def _call(self, op: P.Op, tenant: int = 0, a: int = 0, b: int = 0, payload=b"") -> tuple[int, int, int, bytes]:
        with self._lock:
            if self.closed:
                raise PoolError(P.Status.BAD_REQUEST, f"host {self.name!r} is detached")
            if self.life is not None and not self.life.current:
                raise PoolError(P.Status.SERVICE_GONE, f"host {self.name!r}: the pool service it attached to "
                                                       "has closed or restarted since; attach again")
            try:
                wire.send(self._conn, P.request(op, tenant, a, b, payload))
                raw = wire.recv(self._conn, P.MAX_MESSAGE + P.REPLY.size + (1 << 16))
            except (wire.WireError, OSError) as exc:
                raise PoolError(P.Status.SERVICE_GONE, f"host {self.name!r}: the pool service went away ({exc}); "
                                                       "attach again") from None
        status, v1, v2 = P.REPLY.unpack_from(raw)
        body = raw[P.REPLY.size:]
        if status != P.Status.OK:
            raise PoolError(status, f"{op.name.lower()}: {body.decode(errors='replace')}")
        return status, v1, v2, body

    def _ring_call(self, op: P.Op, index: int, offset: int, n: int, *, payload=None, out=None) -> tuple[int, int, int]:
        """One request on the rings: `payload` goes in the shared buffer first, `out`
        is filled from it after. (status, v1, v2); PoolError unless OK."""
        with self._lock:
            if self.closed:
                raise PoolError(P.Status.BAD_REQUEST, f"host {self.name!r} is detached")
            if not self.life.current:
                raise PoolError(P.Status.SERVICE_GONE, f"host {self.name!r}: the pool service it attached to "
                                                       "has closed or restarted since; attach again")
            r = self.rings
            if payload is not None:
                r.payload[:n] = payload
            try:
                status, v1, v2 = r.call(int(op), index, offset, n, lambda: self.life.current)
            except (ConnectionError, OSError) as exc:
                raise PoolError(P.Status.SERVICE_GONE, f"host {self.name!r}: the pool service went away ({exc}); "
                                                       "attach again") from None
            if status != P.Status.OK:
                message = bytes(r.payload[:min(v1, 4096)]).decode(errors="replace")
                raise PoolError(status, f"{op.name.lower()}: {message}")
            if out is not None:
                out[:] = r.payload[:n]
        return status, v1, v2

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
        for x in (self.life, self.hits, self.rings):
            if x is not None:
                x.close()

    def __enter__(self) -> "PoolHost":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
