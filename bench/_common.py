"""Helpers shared by the benches: where to put back-end files, how to describe the machine,
and how to time alternating trials on a noisy shared machine."""
from __future__ import annotations

import mmap
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def bench_dir() -> Path:
    """A disk-backed folder for back-end images (O_DIRECT needs a real file system)."""
    folder = Path(os.environ.get("CXLHM_BENCH_DIR", Path(__file__).resolve().parent.parent / "out" / "bench"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def lay_out(path: Path, size: int, chunk: int = 64 << 20) -> None:
    """Fill the file with random bytes so reads really touch the disk (sparse holes do not)."""
    if path.exists() and path.stat().st_size == size and path.stat().st_blocks * 512 >= size:
        return
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for _ in range(0, size, chunk):
            f.write(rng.integers(0, 256, chunk, dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())


def resident_buffer(nbytes: int) -> np.ndarray:
    """A page-aligned (O_DIRECT-ready), resident byte buffer on transparent huge pages
    where the kernel allows: the device's DRAM arena uses them, and so must the
    baselines that read into host memory (on a virtio disk an O_DIRECT read into
    scattered 4 KiB pages is much slower than into a huge page)."""
    arena = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        arena.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass
    buf = np.frombuffer(arena, np.uint8)
    buf[:] = 1
    return buf


def machine() -> str:
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"kernel {platform.release()}, Python {platform.python_version()}")


def command() -> str:
    return "python " + " ".join(sys.argv)


def alternate_trials(trials: int, **runs) -> dict[str, list[float]]:
    """Run each named callable `trials` times, interleaved so all see the same machine
    noise: a, b, c in even trials, c, b, a in odd ones (a disk whose speed drifts within a
    trial favours whoever runs last: the order cancels that out over pairs of trials).
    Returns {name: the figure of each trial}."""
    results: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for trial in range(trials):
        for name in (names if trial % 2 == 0 else names[::-1]):
            results[name].append(runs[name]())
    return results


def alternate(trials: int, **runs):
    """alternate_trials, reduced to {name: median of its trials' figures}."""
    return {name: statistics.median(values) for name, values in alternate_trials(trials, **runs).items()}


def paired_ratio(nums: list[float], dens: list[float]) -> float:
    """The median of each trial's ratio: the machine's drift between trials cancels."""
    return statistics.median(a / b for a, b in zip(nums, dens))


def rate(n: int, fn) -> float:
    """Items per second for running fn() that processes n items."""
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def without_sidecars(path) -> str:
    """`path`, its device sidecars (checksums, integrity log, metadata) removed: a bench
    lays out its image and opens a device on it with its own geometry each time, so the
    device starts over on the image's bytes rather than refusing records made for another
    block size."""
    for sidecar in Path(path).parent.glob(Path(path).name + ".cxlhm.*"):
        sidecar.unlink()
    return str(path)


def reach(case: str, ratio: float, target: float, bound: float, bound_is: str, rest: str,
          of_bound: float | None = None) -> str:
    """The verdict on a case below its target. `bound`: the most a device built as this one
    is could reach on this machine, measured in the same run as the case (`bound_is` says
    how: the same I/O with only the device's unavoidable work added). A target beyond the
    bound cannot be reached here; one within it can, and `rest` says what keeps the
    device from it. `of_bound`: the device's figure over the bound's where the bench pairs
    them run by run (else ratio / bound)."""
    of_bound = ratio / bound if of_bound is None else of_bound
    if ratio >= target:
        return f"{case}: {ratio:.2f}x, target {target:.2f}x met"
    head = f"{case}: {ratio:.2f}x against a target of {target:.2f}x; bound here {bound:.2f}x ({bound_is})"
    if of_bound >= 1:  # the parts timed apart overstate the bound's cost this run: it settles nothing
        return (f"{head} - the device passed it ({of_bound:.2f} of it), so this run's parts do not say what "
                f"is left; {rest}")
    if bound < target:
        return (f"{head} - the target is beyond it, not reachable on this machine in this run; the device "
                f"reached {of_bound:.2f} of the bound ({rest})")
    return f"{head} - within reach: the device reached {of_bound:.2f} of it; the rest: {rest}"
