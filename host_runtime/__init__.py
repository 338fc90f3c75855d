"""Host side of cxlhm: the driver (open a device, load/store, read_into/write_from,
mailbox and hints), the KV store, and the engine shims built on it (host_runtime/shim)."""
from host_runtime.driver import DeviceHandle, open_device

__all__ = ["DeviceHandle", "open_device"]
