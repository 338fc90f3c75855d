"""The timing model behind `clock: model`: CXL link, device DRAM, controller, NAND
channels and dies, and the SSD write buffer, as busy-until timelines charged by
numba-compiled, GIL-free kernels (kernels.py); the `timing:` config keys (params.py);
closed-loop drivers (closed_loop.py); latency records (recorder.py); calibration
against a real back end (calibration.py). docs/timing.md has the formulas."""
from cxlhm.timing.kernels import (
    charge_access, charge_background_read, charge_background_write, charge_flush, durable_ns,
)
from cxlhm.timing.model import TimingModel
from cxlhm.timing.params import KEYS, TimingParams, parse_timing
from cxlhm.timing.recorder import FIO_PERCENTILES, LatencyRecorder, record

__all__ = [
    "TimingModel", "TimingParams", "KEYS", "parse_timing",
    "charge_access", "charge_background_read", "charge_background_write", "charge_flush", "durable_ns",
    "LatencyRecorder", "record", "FIO_PERCENTILES",
]
