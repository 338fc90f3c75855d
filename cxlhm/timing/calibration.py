"""Calibration: measure a real back end the way fio would, and fit the NAND parameters
of the timing model so that the model reproduces what was measured.

Measured (all O_DIRECT through io_uring, closed loop, `SsdBackend.run_closed_loop`):
  - 4 KiB random reads at QD 1, 2, 4, 8, 16, 32, 64: IOPS and mean completion latency
  - 1 MiB sequential reads at QD 16: bandwidth
  - the layout pass (1 MiB sequential writes, QD 16) that first writes the region,
    because reads of never-written (sparse) file regions never reach the disk

Fitted (the rest of the profile stays): total dies (channels x dies per channel), tR,
the FTL/command overhead (a latency that holds no die, which shapes how fast IOPS
grow with QD), the channel rate (sequential bandwidth) and the page size (large
enough that the dies do not cap sequential reads). The model side of every figure is
the same closed loop, run on the model clock by `closed_loop_reads`.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import mmap
import os
import platform
import stat
import time
from pathlib import Path

import numpy as np

from cxlhm.config import ConfigError
from cxlhm.media.ssd import IO_FIELDS, SsdBackend
from cxlhm.timing.closed_loop import closed_loop_reads
from cxlhm.timing.model import TimingModel
from cxlhm.timing.params import TimingParams

RANDOM_BS = 4096
SEQ_BS = 1 << 20
SEQ_QD = 16
LAYOUT_QD = 16
QDS = (1, 2, 4, 8, 16, 32, 64)
HEADLINE_QDS = (1, 8, 32)  # the fit is held to these (and to sequential bandwidth)
_CHUNK_OPS = 1 << 16


@dataclasses.dataclass
class Figures:
    """What calibration compares: IOPS per QD (4 KiB random reads), mean QD1 latency (ns),
    1 MiB sequential read bandwidth (bytes/s)."""
    iops: dict[int, float]
    qd1_latency_ns: float
    seq_read_bw: float


@dataclasses.dataclass
class Measurement(Figures):
    path: str = ""
    size: int = 0
    runtime_s: float = 0.0
    layout_write_bw: float | None = None  # bytes/s, None when the region was already laid out
    machine: str = ""
    when: str = ""


# ---------------------------------------------------------------- measuring
def describe_machine(path: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} ({cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}; {path} on {_mount_of(path)})"


def _mount_of(path: str) -> str:
    """'DEVICE (FSTYPE)' of the mount holding `path`."""
    target = os.path.realpath(path)
    best, answer = "", "unknown file system"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, answer = mnt, f"{dev} ({fstype})"
    except OSError:
        pass
    return answer


def _needs_layout(fd: int, size: int) -> bool:
    """True if part of [0, size) was never written (a hole reads as zeros without I/O)."""
    st = os.fstat(fd)
    if stat.S_ISBLK(st.st_mode):
        return False  # a block device has no holes, and must not be written
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < size
    except OSError:
        return st.st_blocks * 512 < size


def _refuse_to_clobber(path: str, size: int, overwrite: bool) -> None:
    """Laying out writes the region: never over a file that already holds data unless asked."""
    try:
        st = os.stat(path)
    except OSError:
        return  # a new file
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or overwrite:
        return
    with open(path, "rb") as f:
        try:
            sparse = st.st_size < size or os.lseek(f.fileno(), 0, os.SEEK_HOLE) < size
        except OSError:
            sparse = st.st_blocks * 512 < size
    if sparse:
        raise ConfigError("--backend", "backend.path",
                          f"{path} already holds data but its first {size} bytes are not all written; calibration "
                          "must write (lay out) the region first: pass --overwrite to allow it, or use a new file")


class _Buffers:
    """One page-aligned anonymous mapping (a valid O_DIRECT buffer)."""

    def __init__(self, nbytes: int):
        self._map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, np.uint8)
        self.address = self.array.ctypes.data

    def close(self) -> None:
        self.array = None
        self._map.close()


def _ops(offsets: np.ndarray, nbytes: int, buf_addr: int, n_bufs: int, write: bool) -> np.ndarray:
    ops = np.zeros((offsets.shape[0], IO_FIELDS), np.int64)
    ops[:, 0] = buf_addr + (np.arange(offsets.shape[0]) % n_bufs) * nbytes
    ops[:, 1] = nbytes
    ops[:, 2] = offsets
    ops[:, 3] = int(write)
    return ops


def _run_for(ssd: SsdBackend, make_ops, qd: int, runtime_s: float) -> tuple[int, float, float]:
    """Closed loop at `qd` for `runtime_s` (or until make_ops runs dry): (ops, seconds, mean latency ns)."""
    done, lat_sum = 0, 0.0
    start = time.monotonic_ns()
    deadline = start + int(runtime_s * 1e9)
    while True:
        now = time.monotonic_ns()
        if now >= deadline and done:  # at least one I/O per point, however short the runtime or slow the disk
            break
        ops = make_ops(done)
        if ops is None:
            break
        res, lat = ssd.run_closed_loop(ops, qd, deadline if done else max(deadline, now + 10_000_000))
        bad = np.flatnonzero(res != ops[:res.shape[0], 1])
        if bad.size:
            r = int(res[bad[0]])
            raise OSError(-r if r < 0 else 5, f"calibration I/O at offset {ops[bad[0], 2]} failed: "
                          f"{os.strerror(-r) if r < 0 else 'short transfer'}")
        done += res.shape[0]
        lat_sum += float(lat.sum())
    elapsed = (time.monotonic_ns() - start) / 1e9
    return done, elapsed, lat_sum / max(done, 1)


def measure(path: str, size: int, runtime_s: float, *, qds=QDS, seed: int = 0, overwrite: bool = False,
            progress=None) -> Measurement:
    """Lay out `path` if needed, then measure. `runtime_s` is per measurement point.
    `progress(label)` is called before each step."""
    step = progress or (lambda label: None)
    if size < 16 * SEQ_BS or size % SEQ_BS:
        raise ConfigError("--size", "size", f"must be a multiple of 1 MiB and at least 16 MiB, got {size}")
    _refuse_to_clobber(path, size, overwrite)
    ssd = SsdBackend(path, size, max(max(qds), LAYOUT_QD, SEQ_QD), source="--backend")
    buffers = _Buffers(max(max(qds) * RANDOM_BS, SEQ_QD * SEQ_BS))
    try:
        layout_bw = None
        if _needs_layout(ssd.fd, size):
            step("layout: 1 MiB writes")
            rng = np.random.default_rng(seed)
            buffers.array[:] = rng.integers(0, 256, buffers.array.shape[0], dtype=np.uint8)  # no zero pages
            offsets = np.arange(size // SEQ_BS, dtype=np.int64) * SEQ_BS
            ops = _ops(offsets, SEQ_BS, buffers.address, SEQ_QD, True)
            t0 = time.monotonic_ns()
            res, _ = ssd.run_closed_loop(ops, LAYOUT_QD)
            if (res != SEQ_BS).any():
                raise OSError(5, f"layout write to {path} failed")
            ssd.sync()
            layout_bw = size / ((time.monotonic_ns() - t0) / 1e9)

        rng = np.random.default_rng(seed + 1)
        iops, qd1_latency = {}, 0.0
        for qd in qds:
            step(f"4 KiB random read, QD{qd}")

            def random_ops(_done, qd=qd):
                offsets = rng.integers(0, size // RANDOM_BS, _CHUNK_OPS, dtype=np.int64) * RANDOM_BS
                return _ops(offsets, RANDOM_BS, buffers.address, max(qds), False)
            n, secs, mean_lat = _run_for(ssd, random_ops, qd, runtime_s)
            iops[qd] = n / secs
            if qd == 1:
                qd1_latency = mean_lat

        step(f"1 MiB sequential read, QD{SEQ_QD}")
        blocks = size // SEQ_BS

        def seq_ops(done):
            offsets = ((done + np.arange(_CHUNK_OPS // 16, dtype=np.int64)) % blocks) * SEQ_BS
            return _ops(offsets, SEQ_BS, buffers.address, SEQ_QD, False)
        n, secs, _ = _run_for(ssd, seq_ops, SEQ_QD, runtime_s)
        seq_bw = n * SEQ_BS / secs
    finally:
        buffers.close()
        ssd.close()
    return Measurement(iops=iops, qd1_latency_ns=qd1_latency, seq_read_bw=seq_bw, path=path, size=size,
                       runtime_s=runtime_s, layout_write_bw=layout_bw, machine=describe_machine(path),
                       when=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


# ---------------------------------------------------------------- the model side
def model_figures(settings: TimingParams, size: int, qds=QDS, *, seed: int = 0, ops_per_qd: int = 4000,
                  seq_ops: int = 400) -> Figures:
    """The calibration workloads on the model clock: the same closed loops, every read a
    device-DRAM miss whose fill is exactly the extent read (as a raw SSD read is)."""
    model = TimingModel(settings, RANDOM_BS)
    rng = np.random.default_rng(seed)
    iops, qd1_latency = {}, 0.0
    for qd in qds:
        n = max(ops_per_qd, 40 * qd)
        offsets = rng.integers(0, size // RANDOM_BS, n, dtype=np.int64) * RANDOM_BS
        lat = np.zeros(n)
        model.reset()
        makespan = closed_loop_reads(model.params, model.state, offsets, np.full(n, RANDOM_BS, np.int64),
                                     np.ones(n, np.bool_), qd, lat)
        iops[qd] = n / makespan * 1e9
        if qd == 1:
            qd1_latency = float(lat.mean())
    n = max(seq_ops, 8 * SEQ_QD)
    offsets = (np.arange(n, dtype=np.int64) % (size // SEQ_BS)) * SEQ_BS
    model.reset()
    makespan = closed_loop_reads(model.params, model.state, offsets, np.full(n, SEQ_BS, np.int64),
                                 np.ones(n, np.bool_), SEQ_QD, np.zeros(n))
    return Figures(iops=iops, qd1_latency_ns=qd1_latency, seq_read_bw=n * SEQ_BS / makespan * 1e9)


# ---------------------------------------------------------------- fitting
_DIE_COUNTS = tuple(range(1, 17)) + (20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
_TR_SHARES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97)


def _channel_choices(dies: int) -> list[int]:
    return [c for c in (1, 2, 3, 4, 5, 6, 7, 8, 16) if dies % c == 0]


def _candidate(base: TimingParams, measured: Figures, dies: int, channels: int, tr_share: float,
               seq_scale: float = 1.0) -> TimingParams | None:
    """Parameters with `dies` dies on `channels` channels whose QD1 time matches the
    measured one, `tr_share` of the NAND-side latency spent in tR (holding a die) and
    the rest in the FTL/command overhead (holding nothing), channels fast enough for
    `seq_scale` x the measured sequential bandwidth, pages big enough that the dies
    do not cap it."""
    rate = seq_scale * measured.seq_read_bw / channels
    target = 1e9 / measured.iops[min(measured.iops)]  # QD1 completion-to-completion time
    probe = base.replace(nand_channels=channels, nand_dies_per_channel=dies // channels, nand_channel_rate=rate,
                         ssd_command_latency=0.0, nand_read_latency=0.0)
    nand_part = target - TimingModel(probe, RANDOM_BS).miss_read_latency_ns(RANDOM_BS)
    if nand_part <= 2.0:
        return None
    t_read = max(1.0, tr_share * nand_part)
    page = RANDOM_BS
    while dies * page / t_read * 1e9 < 1.25 * measured.seq_read_bw and page < 1 << 20:
        page *= 2
    return _rounded(probe.replace(nand_read_latency=t_read, ssd_command_latency=max(1.0, nand_part - t_read),
                                  nand_page_size=page,
                                  write_buffer_bytes=max(base.write_buffer_bytes, 2 * dies * page)))


def _rounded(p: TimingParams) -> TimingParams:
    """What the YAML fragment can say: whole ns, channel rate to 4 significant digits."""
    return p.replace(nand_read_latency=float(max(1, round(p.nand_read_latency))),
                     ssd_command_latency=float(max(1, round(p.ssd_command_latency))),
                     nand_channel_rate=float(f"{p.nand_channel_rate:.4g}"))


def _errors(model: Figures, measured: Figures) -> dict:
    errs = {q: abs(math.log(model.iops[q] / measured.iops[q])) for q in measured.iops if q in model.iops}
    errs["seq"] = abs(math.log(model.seq_read_bw / measured.seq_read_bw))
    return errs


def _score(model: Figures, measured: Figures) -> float:
    """Worst |log(model / measured)| over the headline points (QD 1, 8, 32 and the
    sequential bandwidth), plus a little of the mean over all points as a tie-break.
    Real back ends (virtualised ones especially) batch more as QD grows, a curve that
    independent dies cannot follow everywhere; the headline points are what the model
    is held to (bench/bench_timing.py)."""
    errs = _errors(model, measured)
    headline = [e for k, e in errs.items() if k in HEADLINE_QDS or k == "seq"]
    return max(headline) + 0.1 * sum(errs.values()) / len(errs)


def fit(measured: Figures, base: TimingParams, size: int, *, progress=None) -> TimingParams:
    """NAND parameters (on top of `base`) whose model figures match `measured`:
    a grid over dies x tR share, then channels and shares around the best, then the
    channel rate until sequential bandwidth matches."""
    step = progress or (lambda label: None)
    qds = [q for q in measured.iops if q in HEADLINE_QDS] or list(measured.iops)

    def score(cand: TimingParams, ops: int = 1500) -> float:
        return _score(model_figures(cand, size, qds, ops_per_qd=ops, seq_ops=64), measured)

    step("fit: dies x tR")
    coarse = []
    for dies in _DIE_COUNTS:
        channels = max(_channel_choices(dies))
        for share in _TR_SHARES:
            cand = _candidate(base, measured, dies, channels, share)
            if cand is not None:
                coarse.append((score(cand), dies, share))
    if not coarse:
        raise ValueError("the measured QD1 latency is below the model's fixed overheads; nothing to fit")
    coarse.sort()
    step("fit: channels, refine")
    fine = []
    for _, dies, share in coarse[:5]:
        for channels in _channel_choices(dies):
            for s in (share - 0.1, share - 0.05, share, share + 0.05, share + 0.1):
                cand = _candidate(base, measured, dies, channels, min(0.99, max(0.05, s)))
                if cand is not None:
                    fine.append((score(cand, 3000), dies, channels, min(0.99, max(0.05, s))))
    fine.sort()
    step("fit: channel rate")
    _, dies, channels, share = fine[0]
    seq_scale = 1.0
    cand = _candidate(base, measured, dies, channels, share)
    for _ in range(4):  # secant steps: the model's sequential bandwidth onto the measured one
        got = model_figures(cand, size, qds=(1,), ops_per_qd=10).seq_read_bw
        if abs(got / measured.seq_read_bw - 1) < 0.003:
            break
        seq_scale *= measured.seq_read_bw / got
        cand = _candidate(base, measured, dies, channels, share, seq_scale) or cand
    return cand
