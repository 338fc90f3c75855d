"""Shared set-up of the pool tests: a device service in this process or as a `cxlhm
device serve` subprocess, and host processes that attach to it."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cxlhm.pool import PoolService
from host_runtime.directory import SharedMemoryDirectory, open_directory
from host_runtime.driver import open_device
from host_runtime.pool_client import PoolHost
from host_runtime.pooled_kv import PooledKV

KIB = 1024
BLOCK = 4 * KIB
PARTITION = 256 * KIB
DEVICE = {"capacity": 1 << 21, "block_size": BLOCK, "dram_bytes": 16 * BLOCK}


def chunk_data(key: bytes, n: int = 3 * KIB, version: int = 0) -> bytes:
    """Bytes that say which key and version they are (a wrong read cannot pass for right)."""
    seed = int.from_bytes(hashlib.sha256(key + version.to_bytes(4, "little")).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, n, np.uint8).tobytes()


def keys(n: int, salt: bytes = b"") -> list[bytes]:
    return [hashlib.sha256(salt + i.to_bytes(4, "little")).digest() for i in range(n)]


def in_process_service(tmp_path: Path, **kw) -> PoolService:
    handle = open_device({**DEVICE, "backend": {"path": str(tmp_path / "pool.img")}})
    kw.setdefault("partition_bytes", PARTITION)
    kw.setdefault("mirror_bytes", 32 * BLOCK)
    try:
        return PoolService(handle, tmp_path / "pool.sock", state_dir=tmp_path / "state", authkey=b"k" * 32,
                           **kw).start()
    except BaseException:
        handle.close()
        raise


def attach(service_or_socket, name: str, tenants: list[str], authkey: bytes | None = None) -> PoolHost:
    """`authkey` defaults to the in-process service's key for `name` (or b"k" * 32)."""
    if isinstance(service_or_socket, PoolService):
        sock = service_or_socket.socket_path
        if authkey is None:
            authkey = service_or_socket.host_key(name)
    else:
        sock = service_or_socket
    return PoolHost.attach(sock, name, tenants, authkey=authkey if authkey is not None else b"k" * 32)


def pooled_kv(host: PoolHost, tenant: str, directory: str) -> PooledKV:
    """`directory`: a shared-memory table's path, or any directory URL (redis://...)."""
    return PooledKV(host.tenant(tenant), open_directory(directory) if "://" in directory
                    else SharedMemoryDirectory.attach(directory))


class ServeProcess:
    """`cxlhm device serve` as a child process (so a test can kill -9 it)."""

    def __init__(self, tmp_path: Path, *extra: str):
        self.socket = str(tmp_path / "serve.sock")
        self.state = tmp_path / "serve-state"
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> "ServeProcess":
        cmd = [sys.executable, "-m", "cxlhm_apps.cli", "device", "serve", "--socket", self.socket,
               "--state", str(self.state), "--partition-bytes", str(PARTITION), "--mirror-bytes", str(32 * BLOCK),
               *[f"--set={k}={v}" for k, v in DEVICE.items()], *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # the ready line (blocks until served, or EOF if it failed)
        if "serving" not in line:
            self.proc.wait(timeout)
            raise RuntimeError(f"cxlhm device serve did not start: {line}{self.proc.stderr.read()}")
        return self

    @property
    def authkey(self) -> bytes:
        return (self.state / "authkey").read_bytes()

    def host_key(self, name: str) -> bytes:
        return (self.state / "hosts" / f"{name}.key").read_bytes()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------- host processes (spawned)
def block_record(owner: int, index: int, version: int, n: int = BLOCK) -> np.ndarray:
    """A block that names its owner, index and version in its first 24 bytes and whose
    rest follows from them: any mix of two writes, or a stale copy, is detectable."""
    out = np.frombuffer(chunk_data(f"{owner}/{index}".encode(), n, version), np.uint8).copy()
    out[:24] = np.array([version, owner, index], np.uint64).view(np.uint8)
    return out


def read_record(buf: np.ndarray) -> tuple[int, int, int] | None:
    """(version, owner, index) if the block is exactly what block_record wrote, else None."""
    version, owner, index = (int(x) for x in buf[:24].view(np.uint64))
    if version > 1 << 32 or owner > 64 or index > 1 << 20:
        return None
    return (version, owner, index) if np.array_equal(buf, block_record(owner, index, version, buf.shape[0])) else None


def host_store(sock, authkey, name, tenant, dir_path, salt, n, skip, stored, q):
    with attach(sock, name, [tenant], authkey) as host:
        kv = pooled_kv(host, tenant, dir_path)
        ks = keys(n, salt)
        for i, k in enumerate(ks):
            if i not in skip:
                kv.put(k, chunk_data(k), tokens=16)
        stored.set()
        q.put({"host_id": host.host_id})


def host_lookup(sock, authkey, name, tenant, dir_path, salt, n, stored, q):
    """Starts with the storing host (their start-ups overlap), looks up once it has stored."""
    if not stored.wait(300):
        raise TimeoutError("the storing host never finished")
    with attach(sock, name, [tenant], authkey) as host:
        kv = pooled_kv(host, tenant, dir_path)
        ks = keys(n, salt)
        prefix = kv.prefix_hits(ks, tokens_per_chunk=16)
        ok, out = kv.get_many(ks, tokens_per_chunk=16)
        right = all(bytes(out[i]) == chunk_data(ks[i]) for i in range(n) if ok[i])
        t = host.tenant(tenant)
        q.put({"prefix": prefix, "hit": ok.tolist(), "right": right, "direct_hits": t.direct_hits,
               "service_reads": t.service_reads, "metrics": kv.metrics.as_dict()})


def host_mixed(sock, authkey, name, tenant, dir_path, me, hosts, blocks_each, rounds, q):
    """Mixed load: write own blocks with rising versions, read everyone's, publish and look
    up chunks; report the last version of every own block and every bad read seen."""
    rng = np.random.default_rng(me)
    bad = []
    with attach(sock, name, [tenant, "chunks"], authkey) as host:  # chunks in a partition of their own
        t = host.tenant(tenant)
        kv = pooled_kv(host, "chunks", dir_path)
        version = [0] * blocks_each
        buf = np.empty(BLOCK, np.uint8)
        for r in range(rounds):
            j = int(rng.integers(blocks_each))
            version[j] += 1
            t.write_from((me * blocks_each + j) * BLOCK, block_record(me, j, version[j]))
            other = int(rng.integers(hosts))
            oj = int(rng.integers(blocks_each))
            t.read_into((other * blocks_each + oj) * BLOCK, buf)
            got = read_record(buf)
            if (buf[:24].any() and got is None) or (got is not None and got[1:] != (other, oj)):
                bad.append(("block", other, oj))
            if r % 20 == 0:  # 6 chunks a host: all fit the chunk partition together
                k = keys(1, f"{me}/{r}".encode())[0]
                kv.put(k, chunk_data(k, 512), tokens=8)
                ok, out = kv.get_many(keys(1, f"{other}/{r}".encode()), tokens_per_chunk=8)
                if ok[0] and bytes(out[0]) != chunk_data(keys(1, f"{other}/{r}".encode())[0], 512):
                    bad.append(("chunk", other, r))
        q.put({"me": me, "versions": version, "bad": bad, "metrics": kv.metrics.as_dict()})


def host_spin(sock, authkey, name, tenant, me, ready):
    """Writes its own blocks in a loop until killed."""
    with attach(sock, name, [tenant], authkey) as host:
        t = host.tenant(tenant)
        v = 0
        while True:
            v += 1
            t.write_from(me * 8 * BLOCK + (v % 8) * BLOCK, block_record(me, v % 8, v))
            if v == 16:
                ready.set()
