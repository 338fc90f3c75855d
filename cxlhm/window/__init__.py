"""The load/store window: the HDM range as plain memory that numpy, torch and C code read
and write, served by a native userfaultfd fault-service thread driven by the compiled
firmware (docs/window.md).

Modules: `window` (the mapping, views, prefetch, stats, lifecycle), `firmware_cfuncs`
(the firmware's kernels behind one C-callable function), `persistence` (the image's
metadata, checksums and integrity log: the crash guarantee), `availability` (can this
process use userfaultfd, and the fix if not), `options` (granule, batching, sampler
knobs), `device_facade` (the Device interface over a window, for `open_device`).
"""
from cxlhm.window.availability import WindowUnavailable, probe
from cxlhm.window.device_facade import WindowDevice
from cxlhm.window.options import WindowOptions
from cxlhm.window.window import Window, open_window

__all__ = ["Window", "WindowDevice", "WindowOptions", "WindowUnavailable", "open_window", "probe"]
