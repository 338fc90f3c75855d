"""The pooled device service: one emulated CXL-HM device that several host processes
attach to at once. It is one file because its request paths - the socket's and the
rings' - share its lock, its tenants and hosts tables, and the order of mirror updates
against device changes; apart, each would borrow that state from the others. What stands
alone lives beside it: identity.py, statefiles.py, layout.py, tenants.py, mirror.py,
rings.py, hitlog.py, hitreplay.py, wire.py. Its lock guards tables only: a new tenant's
fill, the layout's writes and every socket wait happen outside it (tenants.py, layout.py).

It owns the device (firmware, SSD back end, device DRAM) and listens on a Unix socket.
A host proves who it is (cxlhm/pool/identity.py: a challenge answered with its own key)
and names the tenants it serves; the service checks them against that host's grants,
then gives it
  * a mailbox register block of its own (a Mailbox over a HostPort: the firmware sees
    every host's hints, in the device's terms),
  * for each granted tenant, the tenant's partition of the HDM range (size, id) and a
    sealed, read-only descriptor of the tenant's mirror (cxlhm/pool/mirror.py), through
    which the host loads recently used blocks without asking the service,
  * a read-only descriptor of the service's life counter (a host of an earlier life misses).
Everything else - misses, writes, chunk allocation, flush - is a request on the socket,
checked against the host's grants and the partition bounds on every call.

What no host can do to the others: stop the accept loop (each connection is served by a
thread of its own, the whole handshake has one deadline, a listen backlog of 128, at most
`max_pending` handshakes and `max_hosts` hosts at once, one host name at most
`max_sessions_per_host` of them, `max_host_names` names recorded in all), hold more than
the bytes it has actually sent (messages are read in pieces as they arrive, at most
MAX_MESSAGE each), see another host's counters (STATS answers with the asking host's own
and its tenants'), or make the device flush in a loop (FLUSH does nothing while the
host's tenants hold no unflushed write, and one host's flushes are spaced
`flush_interval_s` apart).

What is simplified against a multi-headed device: writes go through the service (so the
mirror stays coherent without a hardware coherence protocol), the mirror is a copy kept
beside the device's own DRAM cache rather than that cache itself, and isolation holds
against hosts that use the protocol as another user would (a process of the service's
own user could still open the service's files through /proc).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

import numpy as np

from cxlhm.mailbox import Mailbox
from cxlhm.pool import protocol as P
from cxlhm.pool import statefiles, wire
from cxlhm.pool.statefiles import claim_socket, machine_memory
from cxlhm.pool.hitlog import REPORT_INTERVAL_S, HitLog
from cxlhm.pool.hitreplay import HitReplay
from cxlhm.pool.identity import Identities, IdentityError, check_name
from cxlhm.pool.layout import Layout, LayoutError, LayoutSaver
from cxlhm.pool.mirror import HEADER, MirrorWriter, ServiceLife, read_only_fd
from cxlhm.pool.port import HostPort, PinBudget
from cxlhm.pool.rings import PAYLOAD, ServiceRings
from cxlhm.pool.tenants import Tenant, TenantTable, zero_fill

log = logging.getLogger("cxlhm.pool")
ATTACH_MAX = 64 << 10
HOST_IDLE_POLL_S = 0.05  # a host's mailbox thread, idle: 20 polls a second (not 200), many hosts stay cheap


class _HostSession:
    def __init__(self, name: str, host_id: int, tenants: list[Tenant], mailbox: Mailbox, port: HostPort,
                 hits: HitLog, rings: ServiceRings):
        self.name, self.host_id, self.tenants, self.mailbox, self.port = name, host_id, tenants, mailbox, port
        self.hits, self.rings = hits, rings
        self.by_id = {t.partition.id: t for t in tenants}
        self.ops = {op.name.lower(): 0 for op in P.Op}
        self.bytes_read = self.bytes_written = 0
        self.last_flush = 0.0
        self.conn: socket.socket | None = None  # its socket: hung up on if its rings fail, so it is told


class PoolService:
    """``PoolService(handle, socket_path, state_dir=...).start()``; ``close()`` when done.
    `handle`: an open host_runtime DeviceHandle (the service owns it from now on).
    `grants`: host name -> tenants (each granted host gets a key of its own, see
    `host_key`); without grants the pool is open to every host proving `authkey`."""

    def __init__(self, handle, socket_path: str | os.PathLike, *, state_dir: str | os.PathLike | None = None,
                 partition_bytes: int | None = None, mirror_bytes: int = 16 << 20,
                 grants: dict[str, list[str]] | None = None, authkey: bytes | None = None,
                 max_hosts: int = 32, max_sessions_per_host: int | None = None, max_pending: int = 16,
                 auth_deadline_s: float = 5.0, max_host_names: int = 0xFFFF,
                 flush_interval_s: float = 0.5, pin_fraction: float = 0.25, socket_mode: int = 0o600):
        self.handle = handle
        self.device = handle  # it offers the device interface its ports and hit replay use (HostDevice)
        self.block_size = handle.block_size
        self.socket_path = str(socket_path)
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self._state_fd = -1
        if self.state_dir is not None:
            statefiles.make_folder(self.state_dir)
            self._state_fd = statefiles.hold_folder(self.state_dir)
        try:
            if partition_bytes is None:
                partition_bytes = max(self.block_size, handle.capacity // 16 // self.block_size * self.block_size)
            self.layout = Layout(handle.capacity, self.block_size, partition_bytes,
                                 self.state_dir / "pool.json" if self.state_dir is not None else None,
                                 max_host_names)
            # a mirror larger than a partition would never fill: it is cut to one
            self.mirror_entries = max(1, min(mirror_bytes, partition_bytes) // self.block_size)
            need = max(mirror_bytes, self.mirror_entries * (HEADER + self.block_size) * self.layout.max_tenants)
            if need > machine_memory() // 2:
                raise LayoutError(f"mirror_bytes {mirror_bytes}: the mirrors of up to {self.layout.max_tenants} "
                                  f"tenants would take {need} bytes, more than half of this machine's "
                                  f"{machine_memory()}; give less")
            if not (0 < pin_fraction <= 1):
                raise LayoutError(f"pin_fraction must be in (0, 1], got {pin_fraction}")
            self.pin_blocks = max(1, int(self.device.cfg.dram_bytes // self.block_size * pin_fraction))
            self.identities = Identities(self.state_dir, grants,
                                         pool_key=authkey if authkey is not None else secrets.token_bytes(32))
        except BaseException:
            self._release_state()
            raise
        self.authkey = self.identities.pool_key
        if socket_mode & ~0o660 or not socket_mode & 0o600 == 0o600:
            self._release_state()
            raise LayoutError(f"socket_mode {socket_mode:o}: 600 (this user's hosts) or 660 (and its group's) "
                              "expected; the key proof, not the mode, decides who attaches")
        self.socket_mode = socket_mode
        self.max_hosts, self.max_pending = max_hosts, max_pending
        # one name's attachments at once (its processes): a quarter of the slots by default, so one key
        # holder attaching in a loop cannot take every slot from the other names
        self.max_sessions_per_host = max(1, min(max_hosts, max_sessions_per_host if max_sessions_per_host
                                                else max_hosts // 4))
        self.auth_deadline_s, self.flush_interval_s = auth_deadline_s, flush_interval_s
        self._hosts: dict[int, _HostSession] = {}
        self._lock = threading.Lock()  # layout, tenants, hosts, connections (tables only, never I/O)
        self._tenants = TenantTable(self.layout, self._lock, self._zero_fill, self._new_tenant)
        self.saver = LayoutSaver(self.layout, self._lock)
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._sock_ino = None
        self.life: ServiceLife | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._pending = 0
        self.counts = {"hit_blocks_reported": 0, "refused_busy": 0, "refused_auth": 0, "handshake_failures": 0, "device_flushes": 0,
                       "flushes_skipped": 0, "layout_save_errors": 0}
        self._hit_replay = HitReplay(self.device, self.block_size, self.layout.partition_bytes,
                                     self.mirror_entries, self.counts)

    def host_key(self, host: str) -> bytes:
        """The key host `host` proves (its own where granted, else the pool's)."""
        key = self.identities.key_for(host)
        if key is None:
            raise KeyError(f"host {host!r} has no grant in this pool")
        return key

    def grant(self, host: str, tenants: list[str]) -> bytes:
        """Grant `tenants` to `host` from now on; returns its key."""
        return self.identities.grant(host, tenants)

    # ------------------------------------------------------------ lifetime
    def start(self) -> "PoolService":
        if self._sock is not None:
            return self  # started already (``with PoolService(...).start() as svc``)
        claim_socket(self.socket_path)
        self.life = ServiceLife(self.state_dir)  # before anyone attaches: hosts of the last life miss from now on
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~self.socket_mode)
        try:
            sock.bind(self.socket_path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        self._sock_ino = os.stat(self.socket_path).st_ino
        sock.listen(128)
        self._sock = sock
        t = threading.Thread(target=self._accept_loop, name="cxlhm-pool-accept", daemon=True)
        t.start()
        self._threads.append(t)
        r = threading.Thread(target=self._report_loop, name="cxlhm-pool-hits", daemon=True)
        r.start()
        self._threads.append(r)
        return self

    def close(self) -> None:
        """Stop accepting, drop every host, flush and close the device, then save the
        layout (a layout that cannot be saved costs ring space after a restart; a device
        left unflushed would cost acknowledged data)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
            except OSError:
                pass
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # a host thread waiting for its next request wakes up with EOF
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(10)
        with self._lock:
            hosts = list(self._hosts.values())
            self._hosts.clear()
        for host in hosts:
            self._hit_replay.replay(host.hits, host.tenants)
            host.mailbox.close()
            host.hits.close()
            host.rings.wake()
        for t in self._threads:
            t.join(10)
        if self.life is not None:
            self.life.end()
        try:
            self.handle.close()  # flushes device DRAM to the SSD
        finally:
            try:
                self.saver.save()
            except OSError as exc:
                self.counts["layout_save_errors"] += 1
                log.error("pool: the device is flushed and closed, but the layout could not be saved (%s); "
                          "after a restart, ring space written since the last saved layout is handed out again",
                          exc)
            for tenant in self._tenants.ready.values():
                tenant.mirror.close()
            if self._sock is not None:
                self._sock.close()
                try:
                    if os.stat(self.socket_path).st_ino == self._sock_ino:
                        os.unlink(self.socket_path)
                except OSError:
                    pass
            self._release_state()

    def _release_state(self) -> None:
        if self._state_fd >= 0:
            os.close(self._state_fd)
            self._state_fd = -1

    def __enter__(self) -> "PoolService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ attach
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError as exc:
                if self._stop.is_set() or exc.errno in (errno.EINVAL, errno.EBADF):
                    return
                log.warning("pool: accept failed: %s", exc)
                time.sleep(0.05)  # EMFILE and the like: do not spin
                continue
            with self._lock:
                busy = self._pending >= self.max_pending
                if not busy:
                    self._pending += 1
                    self._conns.add(conn)
            if busy:
                self.counts["refused_busy"] += 1
                self._refuse_quietly(conn, f"the service has {self.max_pending} attaches in progress; retry")
                continue
            t = threading.Thread(target=self._serve_host, args=(conn,), name="cxlhm-pool-host", daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    @staticmethod
    def _refuse_quietly(conn: socket.socket, message: str) -> None:
        try:
            conn.setblocking(False)
            wire.send(conn, json.dumps({"error": message}).encode())
        except OSError:
            pass
        conn.close()

    def _zero_fill(self, part) -> None:  # a new partition's, outside the lock (tenants.py says why)
        zero_fill(self.handle, part, self.layout.partition_bytes, P.MAX_MESSAGE, self._stop)

    def _new_tenant(self, part) -> Tenant:
        return Tenant(part, MirrorWriter(part.name, self.mirror_entries, self.block_size), PinBudget(self.pin_blocks))

    def _no_room(self, name: str) -> str | None:
        """Why the service takes no more attachments (of host `name`); under the lock."""
        if self._stop.is_set():
            return "the service is closing"
        if len(self._hosts) >= self.max_hosts:
            return f"the service serves at most {self.max_hosts} hosts at once; all attached"
        if sum(h.name == name for h in self._hosts.values()) >= self.max_sessions_per_host:
            return (f"host {name!r} has {self.max_sessions_per_host} attachments already, the most "
                    "one host name may hold at once; close one first")
        return None

    def _attach(self, conn: socket.socket) -> _HostSession | None:
        """The handshake (under the caller's deadline): challenge, proof, grants, reply
        with the descriptors. None (the host told why) if refused."""
        def refuse(message: str) -> None:
            wire.send(conn, json.dumps({"error": message}).encode())

        deadline = time.monotonic() + self.auth_deadline_s  # for the whole handshake, not each read
        challenge = secrets.token_bytes(32)
        wire.send(conn, json.dumps({"challenge": challenge.hex(), "life": self.life.value}).encode())
        raw = wire.recv(conn, ATTACH_MAX, deadline)
        conn.settimeout(self.auth_deadline_s)  # (the reply's send: the read left the time that remained)
        try:
            req = json.loads(raw)
            name, tenants, answer = req["host"], req["tenants"], bytes.fromhex(req["proof"])
            if not isinstance(tenants, list) or not tenants or len(set(map(str, tenants))) != len(tenants):
                raise ValueError("tenants: a list of distinct names expected")
            check_name(name)
            for t in tenants:
                check_name(t, "tenant")
        except (ValueError, KeyError, TypeError, AttributeError, IdentityError) as exc:
            return refuse(f"bad attach request: {exc}; expected {{host: name, tenants: [names], proof: hex}}")
        if not self.identities.verify(name, challenge, answer):
            self.counts["refused_auth"] += 1
            return refuse(f"host {name!r}: authentication failed (not the key of {name!r})")
        refused = self.identities.allowed(name, tenants)
        if refused:
            return refuse(f"host {name!r} is not granted tenant(s) {refused}")
        with self._lock:
            why = busy = self._no_room(name)
            if not busy:
                try:
                    host_id = self.layout.host_id(name)
                except LayoutError as exc:
                    why = str(exc)
        if why:
            self.counts["refused_busy"] += bool(busy)
            return refuse(why)
        try:  # outside the lock: a new tenant's fill and a layout write take a while
            ts = [self._tenants.get(t) for t in tenants]
            self.saver.save_for(name, tenants)  # its ids are durable before it is told them
        except LayoutError as exc:
            return refuse(str(exc))
        except OSError as exc:  # the layout could not be saved: the state folder's disk is full, ...
            return refuse(f"the service cannot record host {name!r}: {exc.strerror or exc} "
                          f"(its state folder {self.state_dir})")
        port = HostPort(self.device, [t.partition for t in ts], self.layout.partition_bytes,
                        pins={t.partition.id: t.pins for t in ts})
        hits, rings = HitLog(name), ServiceRings(name)
        mailbox = Mailbox(port, idle_poll_s=HOST_IDLE_POLL_S).start()
        session = _HostSession(name, host_id, ts, mailbox, port, hits, rings)
        session.conn = conn
        with self._lock:
            full = self._no_room(name)  # again: others may have attached while its tenants were made
            if not full:
                self._hosts[id(session)] = session
        if full:
            mailbox.close(), hits.close(), rings.close()
            self.counts["refused_busy"] += 1
            return refuse(full)
        fds = [read_only_fd(self.life.fd), os.dup(hits.fd), *rings.fds()] + [read_only_fd(t.mirror.fd) for t in ts]
        try:
            wire.send(conn, json.dumps({
                "host_id": host_id, "regs": mailbox.path, "block_size": self.block_size,
                "partition_bytes": self.layout.partition_bytes, "mirror_entries": self.mirror_entries,
                "life": self.life.value,
                "tenants": [{"name": t.partition.name, "id": t.partition.id} for t in ts]}).encode(), fds)
        except BaseException:
            self._drop(session)
            session.rings.close()  # (its ring thread never started)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        t = threading.Thread(target=self._serve_rings, args=(session,), name="cxlhm-pool-rings", daemon=True)
        t.start()
        self._threads.append(t)
        return session

    def _drop(self, session: _HostSession) -> None:
        with self._lock:
            gone = self._hosts.pop(id(session), None) is not None
        if gone:
            self._hit_replay.replay(session.hits, session.tenants)
            session.mailbox.close()
            session.hits.close()
            session.rings.wake()  # its ring thread ends and closes the rings

    # ------------------------------------------------------------ mirror hits -> firmware
    def _report_loop(self) -> None:
        while not self._stop.wait(REPORT_INTERVAL_S):
            self.report_hits()

    def report_hits(self) -> int:
        """Replay every host's mirror hits since the last report as device reads (the
        firmware counts and ranks them as any read); returns the blocks reported."""
        with self._lock:
            hosts = list(self._hosts.values())
        return sum(self._hit_replay.replay(h.hits, h.tenants) for h in hosts)

    def _serve_host(self, conn: socket.socket) -> None:
        session = None
        pending = True
        try:
            conn.settimeout(self.auth_deadline_s)
            try:
                session = self._attach(conn)
            finally:
                with self._lock:
                    self._pending -= 1
                pending = False
            if session is None:
                return
            conn.settimeout(None)
            while not self._stop.is_set():
                try:
                    msg = wire.recv(conn, P.MAX_MESSAGE + P.REQUEST.size)
                except wire.WireError:
                    return  # the host closed or was killed, or broke the framing: its session goes
                wire.send(conn, self._handle(session, msg))
        except (wire.WireError, OSError) as exc:
            if session is None:
                self.counts["handshake_failures"] += 1
                log.info("pool: an attach failed: %s", exc)
        except Exception:
            log.exception("pool: host connection failed")
        finally:
            if pending:
                with self._lock:
                    self._pending -= 1
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            if session is not None:
                self._drop(session)

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
                return P.reply(v1=self._host_flush(s))
            if op is P.Op.STATS:
                return P.reply(payload=json.dumps(self.host_stats(s)).encode())
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

    def _read(self, s: _HostSession, tenant: Tenant, offset: int, n: int) -> bytes:
        bad = self._check(offset, n)
        if bad:
            return bad
        return P.reply(payload=self._read_blocks(s, tenant, offset, n).tobytes())

    def _read_blocks(self, s: _HostSession, tenant: Tenant, offset: int, n: int) -> np.ndarray:
        """The bytes (a view of a buffer of the service's own), the whole blocks around
        them read from the device and installed in the mirror."""
        bs = self.block_size
        lo, hi = offset // bs * bs, -(-(offset + n) // bs) * bs
        buf = np.empty(hi - lo, np.uint8)
        with tenant.lock:
            self.handle.read_into(tenant.partition.base + lo, buf)
            tenant.mirror.install(lo // bs, buf)
        s.bytes_read += n
        return buf[offset - lo:offset - lo + n]

    # ------------------------------------------------------------ the rings (the data plane)
    def _serve_rings(self, s: _HostSession) -> None:
        r = s.rings
        try:
            while not self._stop.is_set() and not r.stopping:
                r.wait()
                if self._stop.is_set() or r.stopping:
                    break
                for entry in r.pending():
                    self._ring_entry(s, entry)
        except Exception:
            log.exception("pool: host %r's rings failed", s.name)
            try:  # its requests would wait forever: hang up, the host's next wait ends with SERVICE_GONE
                s.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        finally:
            r.close()

    def _ring_entry(self, s: _HostSession, entry: np.ndarray) -> None:
        r = s.rings
        w0, offset, n, buf = (int(x) for x in entry)
        op, index, tag = w0 & 0xFF, (w0 >> 8) & 0xFFFFFF, w0 >> 32
        if op not in (P.Op.READ, P.Op.WRITE, P.Op.PUT) or buf > PAYLOAD or n > PAYLOAD - buf:
            return self._ring_reply(r, tag, P.reply(P.Status.BAD_REQUEST, payload=(
                f"ring entry: op {op} (READ, WRITE or PUT), buffer [{buf}, +{n}) within {PAYLOAD} bytes "
                "expected").encode()))
        op = P.Op(op)
        s.ops[op.name.lower()] += 1
        if index >= len(s.tenants):
            return self._ring_reply(r, tag, P.reply(P.Status.NOT_GRANTED, payload=(
                f"host {s.name!r} attached {len(s.tenants)} tenants; there is no tenant {index}").encode()))
        tenant = s.tenants[index]
        try:
            if op is P.Op.READ:
                bad = self._check(offset, n)
                if bad:
                    return self._ring_reply(r, tag, bad)
                r.payload[buf:buf + n] = self._read_blocks(s, tenant, offset, n)
                return r.complete(tag, P.Status.OK)
            data = memoryview(r.payload[buf:buf + n].copy())  # the device and the mirror get the same bytes
            reply = self._write(s, tenant, offset, data) if op is P.Op.WRITE else self._put(s, tenant, data)
        except OSError as exc:
            reply = P.reply(P.Status.DEVICE_ERROR, payload=str(exc).encode())
        self._ring_reply(r, tag, reply)

    @staticmethod
    def _ring_reply(r: ServiceRings, tag: int, reply: bytes) -> None:
        status, v1, v2 = P.REPLY.unpack_from(reply)
        if status != P.Status.OK:  # the message goes where the host looks for it
            message = reply[P.REPLY.size:P.REPLY.size + 4096]
            r.payload[:len(message)] = np.frombuffer(message, np.uint8)
            v1 = len(message)
        r.complete(tag, status, v1, v2)

    def _write_locked(self, tenant: Tenant, offset: int, data: memoryview) -> None:
        bs = self.block_size
        n = len(data)
        first, last = offset // bs, (offset + n - 1) // bs
        tenant.mirror.invalidate(first, last - first + 1)  # before the device changes
        tenant.dirty = True
        arr = np.frombuffer(data, np.uint8)
        self.handle.write_from(tenant.partition.base + offset, arr)
        whole_lo, whole_hi = -(-offset // bs), (offset + n) // bs
        if whole_hi > whole_lo:
            tenant.mirror.install(whole_lo, arr[whole_lo * bs - offset:whole_hi * bs - offset])

    def _write(self, s: _HostSession, tenant: Tenant, offset: int, data: memoryview) -> bytes:
        bad = self._check(offset, len(data))
        if bad:
            return bad
        if len(data):
            with tenant.lock:
                self._write_locked(tenant, offset, data)
        s.bytes_written += len(data)
        return P.reply()

    def _put(self, s: _HostSession, tenant: Tenant, chunk: memoryview) -> bytes:
        """Allocate room for a whole chunk (header + payload, built by the host) and write it."""
        size = self.layout.partition_bytes
        if not len(chunk) or len(chunk) > min(size, P.MAX_MESSAGE):
            return P.reply(P.Status.TOO_LARGE,
                           payload=f"a {len(chunk)}-byte chunk: 1..{min(size, P.MAX_MESSAGE)} accepted".encode())
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
    def _host_flush(self, s: _HostSession) -> int:
        """A host's FLUSH: nothing to do while none of its tenants holds an unflushed
        write; otherwise one device flush, at most one per `flush_interval_s` for this
        host (it waits, the others do not)."""
        if not any(t.dirty for t in s.tenants):
            self.counts["flushes_skipped"] += 1
            return 0
        wait = s.last_flush + self.flush_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        s.last_flush = time.monotonic()
        return self.flush()

    def flush(self) -> int:
        """Make everything written so far durable: device DRAM to the SSD, then the layout
        (a layout that cannot be saved is logged and counted; the device is flushed)."""
        with self._flush_lock:
            with self._lock:
                tenants = list(self._tenants.ready.values())
            for t in tenants:  # no write is half-done while the device flushes
                t.lock.acquire()
            try:
                written = self.handle.flush()
                self.counts["device_flushes"] += 1
                for t in tenants:
                    t.dirty = False
            finally:
                for t in tenants:
                    t.lock.release()
            try:
                self.saver.save()  # outside the lock: hosts attach meanwhile
            except OSError as exc:
                self.counts["layout_save_errors"] += 1
                log.error("pool: the device is flushed, but the layout could not be saved: %s", exc)
            return written

    def host_stats(self, s: _HostSession) -> dict:
        """What a host may know: its own session's counters and its own tenants'."""
        with self._lock:
            return {"host": s.name, "host_id": s.host_id, "ops": dict(s.ops), "bytes_read": s.bytes_read,
                    "bytes_written": s.bytes_written, "hints_delivered": s.port.hints_delivered,
                    "hints_declined": s.port.hints_declined,
                    "tenants": {t.partition.name: self._tenant_stats(t) for t in s.tenants}}

    @staticmethod
    def _tenant_stats(t: Tenant) -> dict:
        return {"id": t.partition.id, "allocations": t.partition.allocations,
                "mirror_installs": t.mirror.installs, "mirror_invalidations": t.mirror.invalidations,
                "pinned_blocks": t.pins.pinned, "pin_budget_blocks": t.pins.limit}

    def stats(self) -> dict:
        """Everything (the service's own view, for its operator; hosts get host_stats)."""
        with self._lock:
            hosts = [{"host": h.name, "host_id": h.host_id, "tenants": [t.partition.name for t in h.tenants],
                      "ops": dict(h.ops), "bytes_read": h.bytes_read, "bytes_written": h.bytes_written,
                      "hints_delivered": h.port.hints_delivered, "hints_declined": h.port.hints_declined}
                     for h in self._hosts.values()]
            tenants = {name: self._tenant_stats(t) for name, t in self._tenants.ready.items()}
        return {"hosts": hosts, "tenants": tenants, "service": dict(self.counts), "device": self.handle.stats()}
