"""The pooled device service: one emulated CXL-HM device that several host processes
attach to at once.

It owns the device (firmware, SSD back end, device DRAM) and listens on a Unix socket.
A host attaches with its name and the tenants it serves; the service checks the grants,
then gives it
  * a mailbox register block of its own (a Mailbox over a HostPort: the firmware sees
    every host's hints, in the device's terms),
  * for each granted tenant, the tenant's partition of the HDM range (size, id) and a
    read-only mapping of the tenant's mirror (cxlhm/pool/mirror.py), through which the
    host loads recently used blocks without asking the service.
Everything else - misses, writes, chunk allocation, flush - is a request on the socket,
checked against the host's grants and the partition bounds on every call.

What is simplified against a multi-headed device: writes go through the service (so the
mirror stays coherent without a hardware coherence protocol), the mirror is a copy kept
beside the device's own DRAM cache rather than that cache itself, and isolation holds
against hosts that use the protocol (a process of the same user could still open the
service's files through /proc).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from multiprocessing import connection, reduction
from pathlib import Path

import numpy as np

from cxlhm.mailbox import Mailbox
from cxlhm.pool import protocol as P
from cxlhm.pool.layout import Layout, LayoutError
from cxlhm.pool.mirror import MirrorWriter
from cxlhm.pool.port import HostPort

log = logging.getLogger("cxlhm.pool")
ATTACH_MAX = 64 << 10


class _Tenant:
    """Service-side state of one partition: its mirror and the lock that orders device
    changes against mirror updates."""

    def __init__(self, partition, mirror: MirrorWriter):
        self.partition, self.mirror = partition, mirror
        self.lock = threading.Lock()


class _HostSession:
    def __init__(self, name: str, host_id: int, tenants: list[_Tenant], mailbox: Mailbox, port: HostPort):
        self.name, self.host_id, self.tenants, self.mailbox, self.port = name, host_id, tenants, mailbox, port
        self.by_id = {t.partition.id: t for t in tenants}
        self.ops = {op.name.lower(): 0 for op in P.Op}
        self.bytes_read = self.bytes_written = 0


class PoolService:
    """``PoolService(handle, socket_path, state_dir=...).start()``; ``close()`` when done.
    `handle`: an open host_runtime DeviceHandle (the service owns it from now on)."""

    def __init__(self, handle, socket_path: str | os.PathLike, *, state_dir: str | os.PathLike | None = None,
                 partition_bytes: int | None = None, mirror_bytes: int = 16 << 20,
                 grants: dict[str, list[str]] | None = None, authkey: bytes | None = None):
        self.handle = handle
        self.device = handle.device
        self.block_size = handle.block_size
        self.socket_path = str(socket_path)
        self.state_dir = Path(state_dir) if state_dir is not None else None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        if partition_bytes is None:
            partition_bytes = max(self.block_size, handle.capacity // 16 // self.block_size * self.block_size)
        self.layout = Layout(handle.capacity, self.block_size, partition_bytes,
                             self.state_dir / "pool.json" if self.state_dir is not None else None)
        self.mirror_entries = max(1, mirror_bytes // self.block_size)
        self.grants = {h: list(ts) for h, ts in grants.items()} if grants is not None else None
        self.authkey = authkey if authkey is not None else secrets.token_bytes(32)
        self._tenants: dict[str, _Tenant] = {}
        self._hosts: dict[int, _HostSession] = {}
        self._lock = threading.Lock()  # layout, tenants, hosts
        self._stop = threading.Event()
        self._listener: connection.Listener | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set = set()  # open host connections (close() shuts them down)

    # ------------------------------------------------------------ lifetime
    def start(self) -> "PoolService":
        if self._listener is not None:
            return self  # started already (``with PoolService(...).start() as svc``)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # a stale socket of a killed service
        self._listener = connection.Listener(self.socket_path, family="AF_UNIX", authkey=self.authkey)
        os.chmod(self.socket_path, 0o600)
        t = threading.Thread(target=self._accept_loop, name="cxlhm-pool-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def serve_forever(self) -> None:
        self._stop.wait()

    def close(self) -> None:
        """Stop accepting, drop every host, flush and close the device."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._listener is not None:
            try:  # wake the accept loop
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.socket_path)
            except OSError:
                pass
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # a host thread waiting for its next request wakes up with EOF
            try:
                with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(10)
        with self._lock:
            for host in self._hosts.values():
                host.mailbox.close()
            self._hosts.clear()
            self.layout.save()
        self.handle.close()
        for tenant in self._tenants.values():
            tenant.mirror.close()

    def __enter__(self) -> "PoolService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ attach
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, connection.AuthenticationError) as exc:
                if self._stop.is_set():
                    return
                log.warning("pool: refused a connection: %s", exc)
                continue
            if self._stop.is_set():
                conn.close()
                return
            t = threading.Thread(target=self._serve_host, args=(conn,), name="cxlhm-pool-host", daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _tenant(self, name: str) -> _Tenant:
        found = self._tenants.get(name)
        if found is None:
            part = self.layout.tenant(name)
            found = self._tenants[name] = _Tenant(part, MirrorWriter(name, self.mirror_entries, self.block_size))
        return found

    def _attach(self, conn) -> _HostSession | None:
        """Read the host's attach request, check it, answer, and hand over the mirrors."""
        raw = conn.recv_bytes(ATTACH_MAX)
        try:
            req = json.loads(raw)
            name, tenants, pid = req["host"], req["tenants"], int(req["pid"])
            if not isinstance(name, str) or not name or not isinstance(tenants, list) or not tenants \
                    or not all(isinstance(t, str) and t for t in tenants) or len(set(tenants)) != len(tenants):
                raise ValueError("expected {host: name, tenants: [distinct names], pid: int}")
        except (ValueError, KeyError, TypeError) as exc:
            conn.send_bytes(json.dumps({"error": f"bad attach request: {exc}"}).encode())
            return None
        if self.grants is not None:
            refused = [t for t in tenants if t not in self.grants.get(name, [])]
            if refused:
                conn.send_bytes(json.dumps({"error": f"host {name!r} is not granted tenant(s) {refused}"}).encode())
                return None
        with self._lock:
            try:
                host_id = self.layout.host_id(name)
                ts = [self._tenant(t) for t in tenants]
            except LayoutError as exc:
                conn.send_bytes(json.dumps({"error": str(exc)}).encode())
                return None
            port = HostPort(self.device, [t.partition for t in ts], self.layout.partition_bytes)
            mailbox = Mailbox(port).start()
            session = _HostSession(name, host_id, ts, mailbox, port)
            self._hosts[id(session)] = session
        conn.send_bytes(json.dumps({
            "host_id": host_id, "regs": mailbox.path, "block_size": self.block_size,
            "partition_bytes": self.layout.partition_bytes, "mirror_entries": self.mirror_entries,
            "tenants": [{"name": t.partition.name, "id": t.partition.id} for t in ts]}).encode())
        for t in ts:
            reduction.send_handle(conn, t.mirror.fd, pid)
        return session

    def _serve_host(self, conn) -> None:
        session = None
        with self._lock:
            self._conns.add(conn)
        try:
            session = self._attach(conn)
            if session is None:
                return
            while not self._stop.is_set():
                try:
                    msg = conn.recv_bytes(P.MAX_MESSAGE + P.REQUEST.size)
                except (EOFError, OSError):
                    return  # the host closed or was killed: nothing of it is left to clean but its session
                conn.send_bytes(self._handle(session, msg))
        except Exception:
            log.exception("pool: host connection failed")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            if session is not None:
                with self._lock:
                    self._hosts.pop(id(session), None)
                session.mailbox.close()

    # ------------------------------------------------------------ requests
    def _handle(self, s: _HostSession, msg: bytes) -> bytes:
        if len(msg) < P.REQUEST.size:
            return P.reply(P.Status.BAD_REQUEST, payload=b"short request")
        op, tid, a, b = P.REQUEST.unpack_from(msg)
        payload = memoryview(msg)[P.REQUEST.size:]
        try:
            op = P.Op(op)
        except ValueError:
            return P.reply(P.Status.BAD_REQUEST, payload=f"unknown op {op}".encode())
        s.ops[op.name.lower()] += 1
        try:
            if op is P.Op.FLUSH:
                return P.reply(v1=self.flush())
            if op is P.Op.STATS:
                return P.reply(payload=json.dumps(self.stats()).encode())
            tenant = s.by_id.get(tid)
            if tenant is None:
                return P.reply(P.Status.NOT_GRANTED, payload=f"host {s.name!r} was not given tenant {tid}".encode())
            if op is P.Op.READ:
                return self._read(s, tenant, a, b)
            if op is P.Op.WRITE:
                return self._write(s, tenant, a, payload)
            return self._put(s, tenant, payload)
        except OSError as exc:  # media errors, poison: the host sees a miss, the service lives on
            return P.reply(P.Status.DEVICE_ERROR, payload=str(exc).encode())

    def _check(self, offset: int, n: int) -> bytes | None:
        size = self.layout.partition_bytes
        if offset > size or n > size - offset:
            return P.reply(P.Status.OUT_OF_RANGE,
                           payload=f"[{offset:#x}, +{n}) is outside the tenant's {size}-byte partition".encode())
        if n > P.MAX_MESSAGE:
            return P.reply(P.Status.TOO_LARGE, payload=f"{n} bytes exceed one message ({P.MAX_MESSAGE})".encode())
        return None

    def _read(self, s: _HostSession, tenant: _Tenant, offset: int, n: int) -> bytes:
        bad = self._check(offset, n)
        if bad:
            return bad
        bs = self.block_size
        lo, hi = offset // bs * bs, -(-(offset + n) // bs) * bs  # whole blocks, to install them in the mirror
        buf = np.empty(hi - lo, np.uint8)
        with tenant.lock:
            self.handle.read_into(tenant.partition.base + lo, buf)
            tenant.mirror.install(lo // bs, buf)
        s.bytes_read += n
        return P.reply(payload=buf[offset - lo:offset - lo + n].tobytes())

    def _write_locked(self, tenant: _Tenant, offset: int, data: memoryview) -> None:
        bs = self.block_size
        n = len(data)
        first, last = offset // bs, (offset + n - 1) // bs
        tenant.mirror.invalidate(first, last - first + 1)  # before the device changes
        arr = np.frombuffer(data, np.uint8)
        self.handle.write_from(tenant.partition.base + offset, arr)
        whole_lo, whole_hi = -(-offset // bs), (offset + n) // bs
        if whole_hi > whole_lo:
            tenant.mirror.install(whole_lo, arr[whole_lo * bs - offset:whole_hi * bs - offset])

    def _write(self, s: _HostSession, tenant: _Tenant, offset: int, data: memoryview) -> bytes:
        bad = self._check(offset, len(data))
        if bad:
            return bad
        if len(data):
            with tenant.lock:
                self._write_locked(tenant, offset, data)
        s.bytes_written += len(data)
        return P.reply()

    def _put(self, s: _HostSession, tenant: _Tenant, chunk: memoryview) -> bytes:
        """Allocate room for a whole chunk (header + payload, built by the host) and write it."""
        size = self.layout.partition_bytes
        if not len(chunk) or len(chunk) > min(size, P.MAX_MESSAGE):
            return P.reply(P.Status.TOO_LARGE, payload=f"a {len(chunk)}-byte chunk: 1..{min(size, P.MAX_MESSAGE)} accepted".encode())
        bs = self.block_size
        tail = -len(chunk) % bs
        if tail:  # the allocation is whole blocks: write them whole, so they go to the mirror at once
            chunk = memoryview(bytes(chunk) + bytes(tail))
        with tenant.lock:
            offset, generation = tenant.partition.allocate(len(chunk), size, bs)
            self._write_locked(tenant, offset, chunk)
        s.bytes_written += len(chunk)
        return P.reply(v1=offset, v2=generation)

    # ------------------------------------------------------------ control
    def flush(self) -> int:
        """Make everything written so far durable: device DRAM to the SSD, then the layout."""
        with self._lock:
            tenants = list(self._tenants.values())
        for t in tenants:  # no write is half-done while the device flushes
            t.lock.acquire()
        try:
            written = self.handle.flush()
            with self._lock:
                self.layout.save()
        finally:
            for t in tenants:
                t.lock.release()
        return written

    def stats(self) -> dict:
        with self._lock:
            hosts = [{"host": h.name, "host_id": h.host_id, "tenants": [t.partition.name for t in h.tenants],
                      "ops": dict(h.ops), "bytes_read": h.bytes_read, "bytes_written": h.bytes_written,
                      "hints_delivered": h.port.hints_delivered, "hints_declined": h.port.hints_declined}
                     for h in self._hosts.values()]
            tenants = {name: {"id": t.partition.id, "allocations": t.partition.allocations,
                              "mirror_installs": t.mirror.installs, "mirror_invalidations": t.mirror.invalidations}
                       for name, t in self._tenants.items()}
        return {"hosts": hosts, "tenants": tenants, "device": self.handle.stats()}
