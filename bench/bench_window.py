"""Load/store window bench, in one run on one back-end file:

 (a) cold reads through the window - every block faults once, is read from the SSD
     image and installed with one UFFDIO_COPY - sequential and random block order,
     4 KiB to 2 MiB blocks, vs a minimal C userfaultfd handler (bench/uffd_minimal.c:
     pread O_DIRECT + UFFDIO_COPY, nothing else) on the same file with the same reader.
     Fault-service rate (faults/s) and bandwidth. Target: window >= 0.8 x minimal.
     Also the window with eviction (device DRAM = 1/4 of the range read), for reference.
 (b) reading a prefetched range (window.prefetch, then read: no faults) vs reading
     ordinary resident memory with the same reader, alternating passes - with 4 KiB pages
     and with transparent huge pages where the kernel has them. The window collapses
     prefetched 2 MiB regions into huge pages (also shown: a window that keeps 4 KiB
     pages); the page size it ended up on is read from its page tables. Target: >= 0.9 x
     the better resident memory; the prefetch's install and collapse times are printed.
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

    def window(self, block: int, dram_blocks: int, options: WindowOptions | None = None, image: Path | None = None):
        return open_window({"capacity": FILE_SIZE, "block_size": block, "dram_bytes": max(2, dram_blocks) * block,
                            "backend": {"path": str(image or self.image)}, "firmware": {"policy": "lru"}}, options)

    def second_image(self) -> Path:
        image = self.image.with_name("window_4k.img")
        lay_out(image, FILE_SIZE)
        return image

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
        """Install a range with prefetch() - into a window that collapses prefetched 2 MiB
        regions into transparent huge pages (the default) and into one that keeps 4 KiB
        pages - then alternate full read passes over both, over ordinary resident memory
        with small pages, and over resident memory with transparent huge pages where this
        kernel gives them (same reader, same size): alternating passes share the
        machine's noise. Any fault fails the bench. The target compares the window with
        the best resident memory; the page-size columns say where the rest goes."""
        thp = _thp_available()
        rows = [f"{'block':>7} {'range':>8} | {'window GB/s':>11} {'its pages':>14} | {'window 4K':>9} | "
                f"{'resident 4K':>11} | {'resident THP':>12} | {'ratio':>5} (>= 0.9) | prefetch ms: install + collapse"]
        notes = []
        for block in (64 * KIB, 2 * MIB):
            n = (256 * MIB) // block
            nbytes = n * block
            order = np.arange(n, dtype=np.int64)
            windows = {}
            for huge in (True, False):  # sampler off: (c) prices it; one image per open device
                w = self.window(block, n, WindowOptions(sample_interval_ms=0, huge_pages=huge),
                                None if huge else self.second_image())
                view = w.ndarray(0, nbytes, np.uint8)
                start = time.perf_counter()
                w.prefetch(0, nbytes)
                installed = time.perf_counter() - start
                assert w.wait_idle(timeout=600)  # the collapse runs in the service thread after the install
                collapsed = time.perf_counter() - start - installed
                windows[huge] = (w, view, installed, collapsed, w.stats()["faults"])
            small, small_buf = _resident(nbytes, huge=False)
            huge_mem, huge_buf = _resident(nbytes, huge=True) if thp else (None, None)
            times = {"window": [], "window 4K": [], "resident 4K": [], "resident THP": []}
            for _ in range(passes):
                times["window"].append(nbytes / self.timed_read(windows[True][0].address(0), order, block))
                times["window 4K"].append(nbytes / self.timed_read(windows[False][0].address(0), order, block))
                times["resident 4K"].append(nbytes / self.timed_read(small.ctypes.data, order, block))
                if huge_mem is not None:
                    times["resident THP"].append(nbytes / self.timed_read(huge_mem.ctypes.data, order, block))
            w, _, installed, collapsed, faults = windows[True]
            huge_share = w.huge_page_bytes(0, nbytes) / nbytes
            why_not = w.huge_pages_unavailable()
            counters = w.stats()
            for win, view, _, _, before in windows.values():
                assert win.stats()["faults"] == before, "a prefetched block faulted"
                del view
                win.close()
            windows.clear()
            del small, huge_mem
            small_buf.close()
            if huge_buf is not None:
                huge_buf.close()
            med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
            best = max(med["resident 4K"], med["resident THP"]) if thp else med["resident 4K"]
            p = med["window"]
            pages = f"{huge_share:.0%} 2 MiB" if huge_share > 0 else "4 KiB"
            rows.append(f"{_size(block):>7} {_size(nbytes):>8} | {p / 1e9:>11.2f} {pages:>14} | "
                        f"{med['window 4K'] / 1e9:>9.2f} | {med['resident 4K'] / 1e9:>11.2f} | "
                        f"{med['resident THP'] / 1e9:>12.2f} | {p / best:>5.2f} {'ok' if p >= 0.9 * best else 'MISSED':>8} | "
                        f"{installed * 1e3:.0f} + {collapsed * 1e3:.0f}")
            same = med["resident THP"] if huge_share > 0.99 and thp else med["resident 4K"]
            notes.append(f"  {_size(block)}: window on {pages} pages vs resident memory on the same pages: "
                         f"{p / same:.2f}; 4 KiB vs 2 MiB pages costs resident memory "
                         f"{1 - med['resident 4K'] / med['resident THP']:.0%} and the window "
                         f"{1 - med['window 4K'] / p:.0%}; {counters['huge_collapses']} regions collapsed "
                         f"({counters['collapse_ns'] / max(1, counters['huge_collapses']) / 1e3:.0f} us each), "
                         f"{counters['collapse_failures']} failed" + (f"; no huge pages: {why_not}" if why_not else ""))
        rows += notes
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
