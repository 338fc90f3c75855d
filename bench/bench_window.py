"""Load/store window bench, in one run on one back-end file:

 (a) cold reads through the window - every block faults once, is read from the SSD
     image and installed with one UFFDIO_COPY - sequential and random block order,
     4 KiB to 2 MiB blocks, vs a minimal C userfaultfd handler (bench/uffd_minimal.c:
     pread O_DIRECT + UFFDIO_COPY, nothing else) on the same file with the same reader.
     Fault-service rate (faults/s) and bandwidth. Target: window >= 0.8 x minimal.
     Also the window with eviction (device DRAM = 1/4 of the range read), for reference.
 (b) reading a prefetched range (window.prefetch, then read: no faults) vs reading
     ordinary resident memory with the same reader, alternating passes - with 4 KiB pages
     and with transparent huge pages where the kernel has them. Target: >= 0.9 x the
     better one; the gap is split into page size (TLB reach) and the rest.
 (c) the recency sampler's cost: re-reading a resident hot set with the sampler off,
     at its defaults, and aggressive; parks/s, sampled faults/s, cost per park/restore.

    python bench/bench_window.py [--trials 3] [--quick]
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_dir, command, lay_out, machine  # noqa: E402

from cxlhm.window import WindowOptions, open_window, probe  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
FILE_SIZE = 512 * MIB
# blocks read per trial: about 0.2-0.6 s each on the 2-core development machine
SIZES = {4 * KIB: 4096, 64 * KIB: 2048, 256 * KIB: 512, 2 * MIB: 96}


def build_minimal() -> ctypes.CDLL:
    here = Path(__file__).resolve().parent
    out = bench_dir() / "uffd_minimal.so"
    src = here / "uffd_minimal.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", "-o", str(out), str(src)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.minimal_open.restype = ctypes.c_void_p
    lib.minimal_open.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
    lib.minimal_base.restype = ctypes.c_void_p
    lib.minimal_base.argtypes = [ctypes.c_void_p]
    lib.minimal_close.restype = ctypes.c_long
    lib.minimal_close.argtypes = [ctypes.c_void_p]
    lib.read_blocks.restype = ctypes.c_uint64
    lib.read_blocks.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64]
    return lib


class Bench:
    def __init__(self, image: Path, trials: int):
        self.image, self.trials = image, trials
        self.c = build_minimal()

    def timed_read(self, base: int, order: np.ndarray, block: int) -> float:
        start = time.perf_counter()
        self.c.read_blocks(base, order.ctypes.data, order.shape[0], block)  # ctypes drops the GIL
        return time.perf_counter() - start

    def window(self, block: int, dram_blocks: int, options: WindowOptions | None = None):
        return open_window({"capacity": FILE_SIZE, "block_size": block, "dram_bytes": max(2, dram_blocks) * block,
                            "backend": {"path": str(self.image)}, "firmware": {"policy": "lru"}}, options)

    # (a) ------------------------------------------------------------------
    def cold_window(self, block: int, order: np.ndarray, dram_blocks: int) -> tuple[float, float]:
        w = self.window(block, dram_blocks)
        view = w.ndarray(0, FILE_SIZE, np.uint8)  # keeps the range alive while C reads it
        seconds = self.timed_read(w.address(0), order, block)
        faults = w.stats()["fills"]
        del view
        w.close()
        assert faults >= order.shape[0], (faults, order.shape[0])
        return order.shape[0] / seconds, order.shape[0] * block / seconds

    def cold_minimal(self, block: int, order: np.ndarray) -> tuple[float, float]:
        fd = os.open(self.image, os.O_RDONLY | os.O_DIRECT)
        m = self.c.minimal_open(FILE_SIZE, block, fd)
        if not m:
            raise RuntimeError("minimal userfaultfd handler could not start")
        seconds = self.timed_read(self.c.minimal_base(m), order, block)
        faults = self.c.minimal_close(m)
        os.close(fd)
        assert faults == order.shape[0], (faults, order.shape[0])
        return order.shape[0] / seconds, order.shape[0] * block / seconds

    def cold_reads(self) -> list[str]:
        rows = [f"{'block':>7} {'order':>6} | {'window faults/s':>15} {'GB/s':>6} | {'minimal faults/s':>16} "
                f"{'GB/s':>6} | {'ratio':>5} (>= 0.8) | {'evicting: faults/s':>18}"]
        rng = np.random.default_rng(0)
        for block, n in SIZES.items():
            for name in ("seq", "random"):
                order = np.arange(n, dtype=np.int64)
                if name == "random":
                    order = rng.permutation(order)
                win, mini = [], []
                for _ in range(self.trials):  # alternate so both see the same machine noise
                    win.append(self.cold_window(block, order, n))
                    mini.append(self.cold_minimal(block, order))
                wr, wb = statistics.median(r for r, _ in win), statistics.median(b for _, b in win)
                mr, mb = statistics.median(r for r, _ in mini), statistics.median(b for _, b in mini)
                evicting, _ = self.cold_window(block, order, n // 4)
                ok = "ok" if wr >= 0.8 * mr else "MISSED"
                rows.append(f"{_size(block):>7} {name:>6} | {wr:>15,.0f} {wb / 1e9:>6.2f} | {mr:>16,.0f} "
                            f"{mb / 1e9:>6.2f} | {wr / mr:>5.2f} {ok:>8} | {evicting:>18,.0f}")
        return rows

    # (b) ------------------------------------------------------------------
    def prefetch_vs_resident(self, passes: int) -> list[str]:
        """Install a range with prefetch(), then alternate full read passes over it, over
        ordinary resident memory with small pages, and over resident memory with
        transparent huge pages where this kernel gives them (same reader, same size):
        alternating passes share the machine's noise. Any fault fails the bench. The
        target compares with the best resident memory; the split says how much of the
        gap is page size (TLB reach: UFFDIO_COPY installs 4 KiB pages) and how much is
        anything else."""
        thp = _thp_available()
        rows = [f"{'block':>7} {'range':>8} | {'prefetched GB/s':>15} | {'resident 4K GB/s':>16} | "
                f"{'resident THP GB/s':>17} | {'ratio':>5} (>= 0.9) | gap: page size / other"]
        for block in (64 * KIB, 2 * MIB):
            n = (256 * MIB) // block
            order = np.arange(n, dtype=np.int64)
            w = self.window(block, n, WindowOptions(sample_interval_ms=0))  # no sampled faults: (c) prices them
            view = w.ndarray(0, n * block, np.uint8)
            w.prefetch(0, n * block)
            faults = w.stats()["faults"]
            small, small_buf = _resident(n * block, huge=False)
            huge, huge_buf = _resident(n * block, huge=True) if thp else (None, None)
            pre, res, res_huge = [], [], []
            for _ in range(passes):
                pre.append(n * block / self.timed_read(w.address(0), order, block))
                res.append(n * block / self.timed_read(small.ctypes.data, order, block))
                if huge is not None:
                    res_huge.append(n * block / self.timed_read(huge.ctypes.data, order, block))
            assert w.stats()["faults"] == faults, "a prefetched block faulted"
            del view, small, huge
            small_buf.close()
            if huge_buf is not None:
                huge_buf.close()
            w.close()
            p, r = statistics.median(pre), statistics.median(res)
            rh = statistics.median(res_huge) if res_huge else float("nan")
            best = max(r, rh) if res_huge else r
            # time per byte: prefetched = best + (small - best) [page size] + (prefetched - small) [other]
            t_p, t_s, t_b = 1 / p, 1 / r, 1 / best
            gap = t_p - t_b
            page = (t_s - t_b) / gap if gap > 0 else 0.0
            split = f"{page:>5.0%} / {1 - page:>4.0%}" if gap > 0 else "  (none)"
            rows.append(f"{_size(block):>7} {_size(n * block):>8} | {p / 1e9:>15.2f} | {r / 1e9:>16.2f} | "
                        f"{rh / 1e9:>17.2f} | {p / best:>5.2f} {'ok' if p >= 0.9 * best else 'MISSED':>8} | {split}")
        if not thp:
            rows.append("  (transparent huge pages are off on this kernel: resident memory has 4 KiB pages too)")
        return rows

    # (c) ------------------------------------------------------------------
    def sampler_cost(self, seconds: float) -> list[str]:
        block, n = 64 * KIB, 1024  # a 64 MiB hot set, resident, re-read in a loop
        settings = {"off": WindowOptions(sample_interval_ms=0),
                    "default": WindowOptions(),
                    "aggressive": WindowOptions(sample_interval_ms=10, sample_fraction=1 / 8, sample_min_age_ms=20)}
        rows = [f"{'sampler':>10} | {'hot-set read GB/s':>17} | {'parks/s':>8} | {'sampled faults/s':>16} | "
                f"{'us/park':>7} | {'us/restore':>10}"]
        order = np.arange(n, dtype=np.int64)
        for name, options in settings.items():
            w = self.window(block, n, options)
            view = w.ndarray(0, n * block, np.uint8)
            w.prefetch(0, n * block)
            time.sleep(options.prefetch_grace_ms / 1000 if options.sample_interval_ms else 0)
            before, start, done = w.stats(), time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                self.timed_read(w.address(0), order, block)
                done += n * block
            elapsed = time.perf_counter() - start
            after = w.stats()
            parks = after["samples"] - before["samples"]
            sampled = after["sample_faults"] - before["sample_faults"]
            per_park = (after["sampler_ns"] - before["sampler_ns"]) / parks / 1e3 if parks else 0.0
            per_restore = (after["sample_restore_ns"] - before["sample_restore_ns"]) / sampled / 1e3 if sampled else 0.0
            rows.append(f"{name:>10} | {done / elapsed / 1e9:>17.2f} | {parks / elapsed:>8.0f} | "
                        f"{sampled / elapsed:>16.0f} | {per_park:>7.1f} | {per_restore:>10.1f}")
            del view
            w.close()
        return rows


def _thp_available() -> bool:
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def _resident(nbytes: int, *, huge: bool):
    """nbytes of ordinary memory, touched (resident); with huge, 2 MiB aligned and
    MADV_HUGEPAGE, so the kernel backs it with transparent huge pages where it can."""
    buf = mmap.mmap(-1, nbytes + (2 * MIB if huge else 0), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(buf, np.uint8)
    start = (-whole.ctypes.data) % (2 * MIB) if huge else 0
    if huge:
        buf.madvise(mmap.MADV_HUGEPAGE, start, nbytes)
    arr = whole[start:start + nbytes]
    arr[:] = 1
    return arr, buf


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one trial, short sampler runs (smoke test)")
    parser.add_argument("--sections", default="abc", help="which parts to run (default abc)")
    args = parser.parse_args()
    reason = probe()
    if reason:
        sys.exit(f"bench_window: {reason}")
    print(f"command: {command()}")
    print(f"machine: {machine()}")
    image = bench_dir() / "window.img"
    lay_out(image, FILE_SIZE)
    print(f"back end: {image} ({FILE_SIZE // MIB} MiB, random bytes, O_DIRECT)\n")
    bench = Bench(image, 1 if args.quick else args.trials)
    bench.window(64 * KIB, 2).close()  # compile (or load) the firmware before timing
    if "a" in args.sections:
        print("(a) cold reads: one fault per block, SSD read + UFFDIO_COPY (median of trials)")
        print("\n".join(bench.cold_reads()))
    if "b" in args.sections:
        print("\n(b) reading a prefetched range (zero faults) vs resident memory (same reader, median of alternating passes;"
          " the ratio is against the better resident)")
        print("\n".join(bench.prefetch_vs_resident(3 if args.quick else 15)))
    if "c" in args.sections:
        print("\n(c) recency sampler (64 KiB blocks, 64 MiB hot set re-read for "
              f"{0.5 if args.quick else 2.0:.1f} s)")
        print("\n".join(bench.sampler_cost(0.5 if args.quick else 2.0)))


if __name__ == "__main__":
    main()
