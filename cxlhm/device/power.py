"""Power-loss emulation: cut the back end's power at a chosen write (a torn write; see
cxlhm/media/faults.py) or now, drop device DRAM, and leave the image as a real device
would leave it - so that reopening it is an unclean start, every block read back as
the bytes last written to it or as poison."""
from __future__ import annotations

from cxlhm.media.faults import FaultInjector, FaultPlan


class PowerLoss:
    """Device part: power cuts (mixed into Device, which it reads the state of)."""

    def _init_power(self) -> None:
        self.power_lost = False  # the power went: nothing more reaches the back end or the integrity log
        self._released = False  # the device let go of its memory and back end after the cut
        if isinstance(self.ssd, FaultInjector):  # a cut configured by backend.faults
            self.ssd.on_power_loss.append(self._on_power_cut)

    def _on_power_cut(self) -> None:
        """At an injected cut (maybe inside an access holding the lock): record nothing
        more, and refuse later accesses - the device has no power. The access in flight
        finishes; what it wrote is lost or poison after the reopen."""
        self.media.checksums.freeze()
        self.power_lost = True
        self.closed = True

    def arm_power_loss(self, at_write: int | None = None, *, pages: int = -1, torn_bytes: int = -1,
                       action: str = "freeze") -> int:
        """Cut the back end's power while its `at_write`-th write op from now (default:
        the next) is in flight: that write lands only partly, later ones not at all
        (cxlhm/media/faults.py). Wraps the back end in a FaultInjector first if it has
        none. Returns the absolute write number of the cut."""
        with self._lock:
            if self.ssd is None:
                raise ValueError("a device without data (data: none) has no SSD to lose power")
            if self.ssd.fd < 0:
                raise ValueError("this back end has no image file (an anonymous memory image): a torn write "
                                 "has nowhere to land")
            if not isinstance(self.ssd, FaultInjector):
                self.settle_behind()  # (an injector's back end has no split-phase I/O: none starts after)
                self.media.ssd = FaultInjector(self.ssd, FaultPlan(seed=self.cfg.seed))
                self.ssd.on_power_loss.append(self._on_power_cut)
            return self.ssd.arm_power_loss(at_write, pages=pages, torn_bytes=torn_bytes, action=action)

    def simulate_power_loss(self) -> None:
        """The power goes now (or went, at an injected cut): nothing more reaches the
        back end or the integrity log, device DRAM is dropped, and the device is closed
        without close()'s flush and clean-shutdown mark."""
        if isinstance(self.ssd, FaultInjector):
            self.ssd.cut_power()  # runs _on_power_cut
        else:
            self._on_power_cut()
        if self.mailbox is not None:
            self.mailbox.close()
        self._stop_background_thread()
        with self._lock:
            if self._released:
                return
            while self._inflight:
                self._idle.wait()
            self._released = True
            self._idle.notify_all()
            self.media.checksums.close()
            if self.ssd is not None:
                self.ssd.close()
            self.dram.close()
