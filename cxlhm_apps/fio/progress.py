"""fio's eta line on stderr while jobs run:

    Jobs: 2 (f=2): [r(2)][42.0%][r=95.1MiB/s,w=0KiB/s][r=24.3k,w=0 IOPS][eta 00m:05s]

One line, rewritten in place about once a second; a final newline when done.
"""
from __future__ import annotations

import sys
import threading
import time

from cxlhm_apps.fio.stats import TextUnits, num2str


def _eta(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h:{seconds % 3600 // 60:02d}m:{seconds % 60:02d}s"
    return f"{seconds // 60:02d}m:{seconds % 60:02d}s"


def _rate_units(workers) -> tuple[bool, str]:
    """(binary prefixes, unit) of the line's rates, as fio's eta line picks them:
    binary if any job's kb_base is a power of two, bits if the last job's unit_base
    asks. Its rates keep 4 figures whatever significant_figures says."""
    units = [TextUnits.of_job(w.job) for w in workers if getattr(w, "job", None) is not None]
    if not units:
        return True, "B/s"
    return any(u.pow2 for u in units), ("bit/s" if units[-1].bits else "B/s")


def _rate_text(bytes_per_s: float, pow2: bool, unit: str) -> str:
    # fio counts the eta line's rates in whole KiB/s, so a trickle shows as 0KiB/s
    return num2str(int(bytes_per_s) // 1024, 4, 1024, pow2, unit)


class Progress:
    """`workers` expose .state ('r', 'w', 'm', 'V' or '_'), .progress_bytes[2],
    .progress_ios[2] and .fraction_done() (0-1, None if unknown); `eta_s()` estimates
    the remaining seconds of the whole run."""

    def __init__(self, workers, stream=sys.stderr, interval_s: float = 1.0):
        self.workers, self.stream, self.interval = workers, stream, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cxlhm-fio-eta", daemon=True)
        self._last = (time.monotonic(), [0, 0], [0, 0])
        self._printed = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._printed:
            self.stream.write("\n")
            self.stream.flush()

    def line(self) -> str:
        now = time.monotonic()
        t0, bytes0, ios0 = self._last
        active = [w for w in self.workers if w.state not in ("_", "E")]
        nbytes = [sum(w.progress_bytes[d] for w in self.workers) for d in (0, 1)]
        nios = [sum(w.progress_ios[d] for w in self.workers) for d in (0, 1)]
        dt = max(now - t0, 1e-3)
        bw = [(nbytes[d] - bytes0[d]) / dt for d in (0, 1)]
        iops = [(nios[d] - ios0[d]) / dt for d in (0, 1)]
        self._last = (now, nbytes, nios)
        states = "".join(w.state for w in self.workers)
        fractions = [f for f in (w.fraction_done() for w in self.workers) if f is not None]
        pct = 100.0 * sum(fractions) / len(fractions) if fractions else 0.0
        remaining = [w.eta_s() for w in self.workers if w.state not in ("_", "E")]
        eta = max([r for r in remaining if r is not None], default=0.0)
        pow2, unit = _rate_units(self.workers)
        bw_text = ",".join(f"{k}={_rate_text(v, pow2, unit)}" for k, v in zip("rw", bw))
        iops_text = ",".join(f"{k}={num2str(int(v), 4, 1, False)}" for k, v in zip("rw", iops))
        return (f"Jobs: {len(active)} (f={len(active)}): [{states}][{pct:.1f}%][{bw_text}][{iops_text} IOPS]"
                f"[eta {_eta(eta)}]")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            text = self.line()
            self.stream.write("\r" + text.ljust(79))
            self.stream.flush()
            self._printed = True
