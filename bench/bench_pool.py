"""Pooled device bench: several host processes attached to one device service.

  1. the hit path: a block read from the tenant's mirror (no round trip) against the
     same read through the service, on one host;
  2. multi-turn sessions over H host processes, each turn on the next host (round-robin:
     the KV a turn needs was stored by another host), a small partition so the ring
     overwrites old chunks: the content directory's figures of merit, summed over hosts.

    python bench/bench_pool.py                      # 4 hosts, 48 sessions x 6 turns
    python bench/bench_pool.py --hosts 8 --sessions 96
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine  # noqa: E402

from cxlhm.pool import PoolService  # noqa: E402
from cxlhm.pool import protocol as P  # noqa: E402
from host_runtime.directory import DirectoryMetrics, SharedMemoryDirectory  # noqa: E402
from host_runtime.driver import open_device  # noqa: E402
from host_runtime.kvkeys import prefix_keys  # noqa: E402
from host_runtime.pool_client import PoolHost  # noqa: E402
from host_runtime.pooled_kv import PooledKV  # noqa: E402

KEY = b"bench-pool-authkey-0123456789abc"
TOKENS_PER_CHUNK = 256


def session_tokens(s: int, turns: int) -> np.ndarray:
    return np.random.default_rng(s).integers(0, 50000, turns * TOKENS_PER_CHUNK)


def host_worker(sock, dir_path, me, hosts, sessions, turns, chunk_bytes, barrier, q):
    with PoolHost.attach(sock, f"h{me}", ["t"], authkey=KEY) as host:
        kv = PooledKV(host.tenant("t"), SharedMemoryDirectory.attach(dir_path))
        for turn in range(turns):
            mine = [s for s in range(sessions) if (s + turn) % hosts == me]
            prefixes = {s: prefix_keys(session_tokens(s, turns)[:(turn + 1) * TOKENS_PER_CHUNK], TOKENS_PER_CHUNK)
                        for s in mine}
            for s in mine:  # the router sent these turns here: announce their prefixes (stored by other hosts)
                kv.prefetch(prefixes[s][:-1], session=s + 1)
            for s in mine:
                fps = prefixes[s]
                ok, _ = kv.get_many(fps, tokens_per_chunk=TOKENS_PER_CHUNK)
                for i in np.flatnonzero(~ok):  # recompute what was not found, store it
                    kv.put(fps[i], np.full(chunk_bytes, (s + i) % 251, np.uint8))
            barrier.wait(600)  # a host that died breaks the barrier for the others: the bench fails, not hangs
        q.put(kv.metrics)


def hit_path(svc: PoolService, nbytes: int, reps: int) -> tuple[float, float]:
    with PoolHost.attach(svc.socket_path, "probe", ["probe"], authkey=KEY) as host:
        t = host.tenant("probe")
        t.write_from(0, np.ones(nbytes, np.uint8))
        buf = np.empty(nbytes, np.uint8)
        t.read_into(0, buf)
        start = time.perf_counter_ns()
        for _ in range(reps):
            t.read_into(0, buf)
        direct = (time.perf_counter_ns() - start) / reps
        assert t.direct_hits >= reps
        start = time.perf_counter_ns()
        for _ in range(reps):
            host._call(P.Op.READ, t.id, 0, nbytes)
        service = (time.perf_counter_ns() - start) / reps
    return direct, service


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--chunk-kib", type=int, default=16)
    ap.add_argument("--partition-chunks", type=int, default=160, help="chunks the tenant partition holds (default 160)")
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
    print(f"# command: {command()}")
    print(f"# machine: {machine()} (shared with other agents' jobs while measured: figures are noisy)")
    tmp = Path(tempfile.mkdtemp(prefix="cxlhm-bench-pool-"))
    block = 4 << 10
    chunk = args.chunk_kib << 10
    part = args.partition_chunks * -(-(chunk + 64) // block) * block  # a chunk takes whole blocks
    handle = open_device({"capacity": 64 * part, "block_size": block, "dram_bytes": 1024 * block,
                          "backend": {"path": str(tmp / "pool.img")}})
    with PoolService(handle, tmp / "pool.sock", state_dir=tmp / "state", partition_bytes=part,
                     mirror_bytes=part, authkey=KEY).start() as svc:
        direct, service = hit_path(svc, chunk, args.reps)
        print(f"hit path, one {args.chunk_kib} KiB read: mirror {direct / 1000:.1f} us, through the service "
              f"{service / 1000:.1f} us ({service / direct:.1f}x)")
        d = SharedMemoryDirectory.create(tmp / "dir.shm", entries=args.sessions * args.turns * 2)
        ctx = mp.get_context("spawn")
        barrier, q = ctx.Barrier(args.hosts), ctx.Queue()
        procs = [ctx.Process(target=host_worker, args=(svc.socket_path, d.path, me, args.hosts, args.sessions,
                                                       args.turns, chunk, barrier, q)) for me in range(args.hosts)]
        start = time.time()
        for p in procs:
            p.start()
        total = sum((q.get(timeout=1200) for _ in procs), DirectoryMetrics())
        for p in procs:
            p.join()
        print(f"{args.hosts} hosts, {args.sessions} sessions x {args.turns} turns (turn t of session s on host "
              f"(s+t) mod {args.hosts}), {args.chunk_kib} KiB chunks, a partition of {args.partition_chunks} chunks, "
              f"{time.time() - start:.1f} s wall:")
        print(total.table())
        print(f"verified hits {total.verified_hits}/{total.keys_looked_up} keys")
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
