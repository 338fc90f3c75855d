"""White-box tests of the device open it themselves and keep it: `open_parts(spec)` gives
the device (host_runtime.driver.device_for: a Device, or a WindowDevice) and a host
handle over it for the byte calls, so no test reaches through a handle for its device.

    with open_parts(cfg) as (dev, device):   # closed (the handle closes the device) at the end
        dev.store(0, b"x"); device.ssd ...
"""
from __future__ import annotations

from typing import NamedTuple

from cxlhm.config import DeviceConfig, load_config
from cxlhm.device import HostDevice
from host_runtime.driver import DeviceHandle, device_for


class DeviceParts(NamedTuple):
    handle: DeviceHandle
    device: HostDevice

    def __enter__(self) -> "DeviceParts":
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()


def open_parts(spec=None, **overrides) -> DeviceParts:
    """As host_runtime.open_device (a profile name, YAML path, dict or DeviceConfig), but
    the device is kept too: (handle, device)."""
    cfg = spec if isinstance(spec, DeviceConfig) else load_config(spec, overrides or None)
    device = device_for(cfg)
    return DeviceParts(DeviceHandle(device), device)
