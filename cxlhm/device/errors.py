"""What the device raises to its host."""
from __future__ import annotations

from cxlhm.integrity import PoisonError


class AccessOutOfRange(IndexError):
    """An access falls (partly) outside the HDM window."""


class MediaError(OSError):
    """The back end failed an I/O the device could not hide."""


class DeviceFull(RuntimeError):
    """Every DRAM slot is pinned or busy, so a missing block has nowhere to go."""


class DeviceClosed(RuntimeError):
    pass


def check_extent(hpa: int, n: int, capacity: int) -> None:
    """Raise AccessOutOfRange unless [hpa, hpa+n) lies inside a window of `capacity` bytes."""
    if hpa < 0 or n < 0 or hpa > capacity - n:
        raise AccessOutOfRange(f"access [{hpa:#x}, +{n}) is outside the HDM window [0, {capacity:#x})")


__all__ = ["AccessOutOfRange", "DeviceClosed", "DeviceFull", "MediaError", "PoisonError", "check_extent"]
