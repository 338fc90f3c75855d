"""Sixteen concurrent clients, as threads on one device and on one KV store, and as host
processes on a pooled device (its blocks and its shared KV chunks): no lost update.
Every client keeps what was acknowledged to it; at the end every acknowledged write is
visible with the right bytes (each block or chunk names its owner, index and version,
and the rest of its bytes follow from them, so a stale, torn, mixed or misplaced copy
cannot pass), and the store's index and allocator agree."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from host_runtime.driver import open_device
from host_runtime.kvstore import KVStore, NullHints, PutStatus
from pool_helpers import BLOCK, block_record, chunk_data, read_record

CLIENTS = 16


def run_clients(work, n: int = CLIENTS) -> list:
    """`work(me)` in n threads started together; their results, or the first error."""
    results, errors = [None] * n, []
    start = threading.Barrier(n)

    def one(me):
        try:
            start.wait()
            results[me] = work(me)
        except BaseException as exc:  # noqa: BLE001 - raised in the test thread below
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(me,)) for me in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client hung"
    if errors:
        raise errors[0]
    return results


def test_sixteen_threads_on_one_device_lose_no_update(tmp_path):
    blocks_each, rounds = 4, 60
    # 8 slots of DRAM for 64 blocks in use: the clients' writes evict each other's blocks
    with open_device({"capacity": 4 * CLIENTS * blocks_each * BLOCK, "block_size": BLOCK, "dram_bytes": 8 * BLOCK,
                      "backend": {"path": str(tmp_path / "t.img")}}) as dev:
        def block_of(me, j):  # interleaved: every client's blocks sit between the others'
            return j * CLIENTS + me

        def work(me):
            rng = np.random.default_rng(me)
            versions = [0] * blocks_each
            buf = np.empty(BLOCK, np.uint8)
            for _ in range(rounds):
                j = int(rng.integers(blocks_each))
                versions[j] += 1
                dev.write_from(block_of(me, j) * BLOCK, block_record(me, j, versions[j]))
                k = int(rng.integers(blocks_each))
                dev.read_into(block_of(me, k) * BLOCK, buf)  # read your own write, whatever the others do
                assert (read_record(buf) == (versions[k], me, k)) if versions[k] else not buf.any()
            return versions

        versions = run_clients(work)
        buf = np.empty(BLOCK, np.uint8)
        for me, own in enumerate(versions):
            for j, v in enumerate(own):
                dev.read_into(block_of(me, j) * BLOCK, buf)
                assert (read_record(buf) == (v, me, j)) if v else not buf.any(), (me, j, v)
        assert sum(map(sum, versions)) == CLIENTS * rounds


def test_sixteen_threads_on_one_kv_store_lose_no_update(tmp_path):
    puts_each = 15
    with open_device({"capacity": 1 << 23, "block_size": BLOCK, "dram_bytes": 16 * BLOCK,
                      "backend": {"path": str(tmp_path / "kv.img")}}) as dev:
        store = KVStore(dev, hints=NullHints())
        try:
            tenants = [store.tenant(f"client-{me}") for me in range(CLIENTS)]
            shared = store.tenant("shared")

            def work(me):
                rng = np.random.default_rng(100 + me)
                mine, kept = tenants[me], {}
                for i in range(puts_each):
                    key = f"{me}/{i}".encode()
                    data = chunk_data(key, int(rng.choice([BLOCK // 2, BLOCK, 3 * BLOCK])))
                    owner = shared if i % 3 == 0 else mine  # a third into one tenant all clients share
                    assert owner.put_from(key, np.frombuffer(data, np.uint8)) is PutStatus.STORED
                    kept[key] = (owner, data)
                    if i % 5 == 4:  # remove one of your own: it must stay gone
                        gone = f"{me}/{i - 2}".encode()
                        assert kept.pop(gone)[0].remove(gone)
                    probe = list(kept)[int(rng.integers(len(kept)))]
                    owner, expected = kept[probe]
                    out = np.empty(len(expected), np.uint8)
                    assert owner.get_into(probe, out) == len(expected) and out.tobytes() == expected
                return kept

            kept = run_clients(work)
            removed = 0
            for me, own in enumerate(kept):
                for key, (owner, expected) in own.items():
                    out = np.empty(len(expected), np.uint8)
                    assert owner.get_into(key, out) == len(expected) and out.tobytes() == expected, key
                for i in range(puts_each):
                    key = f"{me}/{i}".encode()
                    if key not in own:
                        removed += 1
                        assert not tenants[me].contains(key) and not shared.contains(key), key
            assert removed == CLIENTS * (puts_each // 5)
            store.check()  # index and allocator agree after sixteen writers
        finally:
            store.close()


@pytest.mark.slow  # sixteen spawned host processes
def test_sixteen_host_processes_on_a_pooled_device_lose_no_update(tmp_path):
    """Host processes write their own blocks of one shared tenant with rising versions,
    read the others' and publish KV chunks through one directory: the last acknowledged
    version of every block and every published chunk is there at the end."""
    from host_runtime.directory import SharedMemoryDirectory
    from host_runtime.pooled_kv import PooledKV
    from pool_helpers import attach, host_mixed, in_process_service, keys
    from test_pool import run_hosts
    blocks_each, rounds = 4, 60  # a chunk every 20 rounds: 48 chunks fill the chunk partition's ring less than once
    service = in_process_service(tmp_path)
    directory = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=10_000)
    try:
        sock, key = service.socket_path, service.authkey
        results = run_hosts(*[(host_mixed, (sock, key, f"h{me}", "t", directory.path, me, CLIENTS, blocks_each,
                                            rounds)) for me in range(CLIENTS)], timeout=900)
        assert [r["bad"] for r in results] == [[]] * CLIENTS  # no torn, mixed or misplaced read anywhere
        reader = attach(service, "checker", ["t", "chunks"])
        t = reader.tenant("t")
        buf = np.empty(BLOCK, np.uint8)
        for r in results:
            for j, v in enumerate(r["versions"]):
                t.read_into((r["me"] * blocks_each + j) * BLOCK, buf)
                assert (read_record(buf) == (v, r["me"], j)) if v else not buf.any()
        assert sum(sum(r["versions"]) for r in results) == CLIENTS * rounds
        published = [keys(1, f"{me}/{r}".encode())[0] for me in range(CLIENTS) for r in range(0, rounds, 20)]
        kv = PooledKV(reader.tenant("chunks"), directory)
        ok, out = kv.get_many(published)
        assert ok.all() and all(bytes(o) == chunk_data(k, 512) for o, k in zip(out, published))
        reader.close()
    finally:
        directory.close()
        service.close()
