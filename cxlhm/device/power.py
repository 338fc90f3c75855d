"""Power-loss emulation: cut the back end's power at a chosen write (a torn write; see
cxlhm/media/faults.py) or now, drop device DRAM, and leave the image as a real device
would leave it - so that reopening it is an unclean start, every block read back as
the bytes last written to it or as poison.

`PowerLoss` owns the cut: it sets the device state's `power_lost` (with `closed`: the
device refuses every later access) and, once the threads that were inside the device
are out, lets go of device DRAM and the back end. The device stops its mailbox and
firmware threads between the cut and the release (`Device.simulate_power_loss`).
"""
from __future__ import annotations

from cxlhm.device.behind import WriteBehind
from cxlhm.device.state import DeviceState
from cxlhm.media.faults import FaultInjector, FaultPlan


class PowerLoss:
    """Device part: power cuts, injected at a write or now."""

    def __init__(self, state: DeviceState, behind: WriteBehind):
        self.state, self.behind = state, behind
        self._released = False  # the device let go of its memory and back end after the cut
        if isinstance(state.media.ssd, FaultInjector):  # a cut configured by backend.faults
            state.media.ssd.on_power_loss.append(self._on_power_cut)

    def _on_power_cut(self) -> None:
        """At an injected cut (maybe inside an access holding the lock): record nothing
        more, and refuse later accesses - the device has no power. The access in flight
        finishes; what it wrote is lost or poison after the reopen."""
        self.state.media.checksums.freeze()
        self.state.power_lost = True
        self.state.closed = True

    def arm(self, at_write: int | None = None, *, pages: int = -1, torn_bytes: int = -1,
            action: str = "freeze") -> int:
        """Cut the back end's power while its `at_write`-th write op from now (default:
        the next) is in flight: that write lands only partly, later ones not at all
        (cxlhm/media/faults.py). Wraps the back end in a FaultInjector first if it has
        none. Returns the absolute write number of the cut."""
        media = self.state.media
        with self.state.lock:
            if media.ssd is None:
                raise ValueError("a device without data (data: none) has no SSD to lose power")
            if media.ssd.fd < 0:
                raise ValueError("this back end has no image file (an anonymous memory image): a torn write "
                                 "has nowhere to land")
            if not isinstance(media.ssd, FaultInjector):
                self.behind.settle()  # (an injector's back end has no split-phase I/O: none starts after)
                media.ssd = FaultInjector(media.ssd, FaultPlan(seed=self.state.cfg.seed))
                media.ssd.on_power_loss.append(self._on_power_cut)
            return media.ssd.arm_power_loss(at_write, pages=pages, torn_bytes=torn_bytes, action=action)

    def cut(self) -> None:
        """The power goes now (or went, at an injected cut): nothing more reaches the
        back end or the integrity log."""
        if isinstance(self.state.media.ssd, FaultInjector):
            self.state.media.ssd.cut_power()  # runs _on_power_cut
        else:
            self._on_power_cut()

    def release(self) -> None:
        """After the cut, once the accesses in flight are out: drop device DRAM and let go
        of the back end and the integrity log, without close()'s flush and clean-shutdown
        mark."""
        state = self.state
        with state.lock:
            if self._released:
                return
            while state.inflight:
                state.idle.wait()
            self._released = True
            state.idle.notify_all()
            state.media.checksums.close()
            if state.media.ssd is not None:
                state.media.ssd.close()
            state.dram.close()
