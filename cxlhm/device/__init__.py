"""The emulated CXL-HM device (see cxlhm/device/core.py for how its parts fit)."""
from cxlhm.device.core import MAX_BATCH_BLOCKS, Device
from cxlhm.device.footprint import METADATA_BYTES_PER_SLOT
from cxlhm.device.errors import AccessOutOfRange, DeviceClosed, DeviceFull, MediaError, PoisonError
from cxlhm.device.interface import (DeviceCaps, HostDevice, IntegrityDevice, MailboxTarget, ModelClockDevice,
                                    StreamDevice)
from cxlhm.device.sidecar import METADATA_FORMAT, SidecarError, Sidecars, metadata_path
from cxlhm.device.stream.driver import STREAM_PASSES, StreamResult

__all__ = ["AccessOutOfRange", "Device", "DeviceCaps", "DeviceClosed", "DeviceFull", "HostDevice",
           "IntegrityDevice", "MailboxTarget", "ModelClockDevice", "StreamDevice",
           "MAX_BATCH_BLOCKS", "METADATA_BYTES_PER_SLOT", "METADATA_FORMAT", "MediaError", "PoisonError",
           "STREAM_PASSES", "SidecarError", "Sidecars", "StreamResult", "metadata_path"]
