"""Pooled device bench: several host processes attached to one device service.

  1. the data plane, against a single-host device of the same configuration measured in
     the same run: a pooled hit (a read from the tenant's mirror, in a host process) vs a
     single-host device DRAM hit, and a pooled miss (missing the mirror and the device
     DRAM: a ring entry, the device's SSD read, the bytes through the shared buffer) vs a
     single-host device miss; the device's hit counter before and after the pooled hits
     (mirror hits are reported to the firmware); trials alternate, medians reported;
  2. multi-turn sessions over H host processes, each turn on the next host (round-robin:
     the KV a turn needs was stored by another host), a small partition so the ring
     overwrites old chunks: the content directory's figures of merit, summed over hosts.

    python bench/bench_pool.py                      # 4 hosts, 48 sessions x 6 turns
    python bench/bench_pool.py --hosts 8 --sessions 96
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_dir, command, machine  # noqa: E402

from cxlhm.pool import PoolService  # noqa: E402
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


def _timed(fn, reps: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(reps):
        fn()
    return (time.perf_counter_ns() - start) / reps / 1000


def pooled_probe(sock, nbytes, region, reps, q):
    """In a host process: (mirror hit us, pooled miss us, direct hits)."""
    with PoolHost.attach(sock, "probe", ["probe"], authkey=KEY) as host:
        t = host.tenant("probe")
        buf = np.empty(nbytes, np.uint8)
        t.read_into(0, buf)
        hits = _timed(lambda: t.read_into(0, buf), reps)
        direct = t.direct_hits
        cursor = [nbytes]

        def miss():  # sequential through a region larger than the mirror and the device DRAM
            t.read_into(cursor[0], buf)
            cursor[0] = cursor[0] + nbytes if cursor[0] + 2 * nbytes <= region else nbytes
        before = t.service_reads
        misses = _timed(miss, reps)
        q.put((hits, misses, direct, t.service_reads - before))


def single_host(handle, nbytes, region, reps) -> tuple[float, float]:
    """(DRAM hit us, miss us) of the same reads on a single-host device."""
    buf = np.empty(nbytes, np.uint8)
    handle.read_into(0, buf)
    hits = _timed(lambda: handle.read_into(0, buf), reps)
    cursor = [nbytes]

    def miss():
        handle.read_into(cursor[0], buf)
        cursor[0] = cursor[0] + nbytes if cursor[0] + 2 * nbytes <= region else nbytes
    return hits, _timed(miss, reps)


def data_plane(tmp: Path, block: int, nbytes: int, reps: int, trials: int) -> None:
    dram = 256 * block
    region = 8 * dram  # larger than the device DRAM and the mirror: each step reads from the SSD
    cfg = {"capacity": 16 * region, "block_size": block, "dram_bytes": dram}
    fill = np.random.default_rng(1).integers(0, 256, region, np.uint8)
    single = open_device({**cfg, "backend": {"path": str(tmp / "single.img")}})
    single.write_from(0, fill)
    single.flush()
    handle = open_device({**cfg, "backend": {"path": str(tmp / "pooled.img")}})
    ctx = mp.get_context("spawn")
    rows = []
    with PoolService(handle, tmp / "probe.sock", partition_bytes=2 * region, mirror_bytes=dram // 4,
                     authkey=KEY).start() as svc:
        with PoolHost.attach(svc.socket_path, "writer", ["probe"], authkey=KEY) as w:
            w.tenant("probe").write_from(0, fill)
        svc.flush()
        for _ in range(trials):  # alternate: the machine's load moves both alike
            s_hit, s_miss = single_host(single, nbytes, region, reps)
            svc.report_hits()
            hits_before = handle.stats()["hits"]
            q = ctx.Queue()
            p = ctx.Process(target=pooled_probe, args=(svc.socket_path, nbytes, region, reps, q))
            p.start()
            p_hit, p_miss, direct, service_reads = q.get(timeout=600)
            p.join(60)
            svc.report_hits()
            reported = handle.stats()["hits"] - hits_before
            rows.append((s_hit, s_miss, p_hit, p_miss, direct, service_reads, reported))
    single.close()
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    s_hit, s_miss, p_hit, p_miss = med
    blocks = nbytes // block
    print(f"data plane, {nbytes >> 10} KiB reads, {reps} per figure, median of {trials} alternating trials:")
    print(f"  single-host device: DRAM hit {s_hit:.1f} us, miss {s_miss:.1f} us")
    print(f"  pooled (a host process): mirror hit {p_hit:.1f} us, miss (ring entry + device) {p_miss:.1f} us")
    print(f"  pooled hit / single-host DRAM hit = {p_hit / s_hit:.2f}x (target <= 1.5x: "
          f"{'met' if p_hit <= 1.5 * s_hit else 'NOT met'})")
    print(f"  pooled miss / single-host miss   = {p_miss / s_miss:.2f}x (target <= 2x: "
          f"{'met' if p_miss <= 2 * s_miss else 'NOT met'})")
    last = rows[-1]
    print(f"  firmware hits counted during the pooled run: {last[6]} blocks, of which the {last[4]} mirror hits "
          f"({last[4] * blocks} blocks) reported; {last[5]} misses went through the rings")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--chunk-kib", type=int, default=16)
    ap.add_argument("--partition-chunks", type=int, default=160, help="chunks the tenant partition holds (default 160)")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--skip-sessions", action="store_true", help="only the data plane figures")
    args = ap.parse_args()
    print(f"# command: {command()}")
    print(f"# machine: {machine()} (shared with other agents' jobs while measured: figures are noisy)")
    tmp = Path(tempfile.mkdtemp(prefix="cxlhm-bench-pool-", dir=bench_dir()))
    block = 4 << 10
    chunk = args.chunk_kib << 10
    data_plane(tmp, block, chunk, args.reps, args.trials)
    if args.skip_sessions:
        return 0
    part = args.partition_chunks * -(-(chunk + 64) // block) * block  # a chunk takes whole blocks
    handle = open_device({"capacity": 64 * part, "block_size": block, "dram_bytes": 1024 * block,
                          "backend": {"path": str(tmp / "pool.img")}})
    with PoolService(handle, tmp / "pool.sock", state_dir=tmp / "state", partition_bytes=part,
                     mirror_bytes=part, authkey=KEY).start() as svc:
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
