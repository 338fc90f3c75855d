"""host_runtime.driver.DeviceHandle offers the declared device interface itself
(cxlhm.device.interface), so callers never reach for the device behind it: every
member of HostDevice, StreamDevice, ModelClockDevice and IntegrityDevice is forwarded
(checked against a recording stand-in, so a member added to a protocol and not to the
handle fails here), the ones a device offers only by its caps are refused with a clear
error where caps say no, and hint sinks are given only when asked for by name (the
mailbox, and its thread, start only for via="mailbox")."""
from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from cxlhm.device import DeviceCaps, HostDevice, IntegrityDevice, ModelClockDevice, StreamDevice
from cxlhm.mailbox.hints import HintKind
from cxlhm.testing.backends import protocol_members
from hintspy import route_hints_through
from host_runtime.driver import DeviceCapabilityError, DeviceHandle, open_device
from host_runtime.hintsinks import DeviceHints, HintSink, NullHints, hints_for
from host_runtime.mailbox import HintClient

BLOCK = 4096
PROTOCOLS = (HostDevice, StreamDevice, ModelClockDevice, IntegrityDevice)
ALL_CAPS = DeviceCaps(streams_io=True, model_clock=True, moves_data=True, integrity=True, power_loss=True,
                      persistent=True)
# members that are data, not calls: the handle shows the device's own value
VALUES = {"cfg", "capacity", "block_size", "write_mode", "caps", "closed", "image_path",
          "unclean_shutdown_detected"}
# what each caps flag gates on the handle
GATED = {"streams_io": ["stream_io"], "model_clock": ["now_ns", "advance_to"],
         "integrity": ["block_checksums", "integrity_report"]}


class Recorder:
    """A device that records every call made on it and answers with a token naming it."""

    def __init__(self, caps: DeviceCaps = ALL_CAPS):
        self.cfg = SimpleNamespace(name="recorder")
        self.capacity, self.block_size = 1 << 20, BLOCK
        self.write_mode, self.caps, self.closed = "write-back", caps, False
        self.image_path, self.unclean_shutdown_detected = "/images/recorder.img", False
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return ("answer", name)
        return call


def _declared(name: str):
    for cls in (c for p in PROTOCOLS for c in p.__mro__):
        if name in vars(cls):
            return vars(cls)[name]
    raise KeyError(name)


def _methods() -> list[str]:
    return sorted({n for p in PROTOCOLS for n in protocol_members(p)} - VALUES)


def _bound(name: str, args: tuple, kwargs: dict) -> dict:
    """The call as the protocol's signature binds it, defaults filled in."""
    bound = inspect.signature(_declared(name)).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return dict(list(bound.arguments.items())[1:])


def test_every_declared_member_is_one_the_handle_offers():
    handle = DeviceHandle(Recorder())
    members = {n for p in PROTOCOLS for n in protocol_members(p)}
    assert members >= VALUES | {"access", "stream_io", "now_ns", "block_checksums", "thread_hits_misses"}
    assert [n for n in sorted(members) if not hasattr(handle, n)] == []
    for name in VALUES:
        assert getattr(handle, name) == getattr(handle._device, name), name  # the test's own stand-in


@pytest.mark.parametrize("name", _methods())
def test_each_declared_call_reaches_the_device_with_the_same_arguments(name):
    device = Recorder()
    handle = DeviceHandle(device)
    params = [p for p in inspect.signature(_declared(name)).parameters.values()
              if p.name != "self" and p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    args = tuple(f"{p.name}-value" for p in params)
    returns_nothing = inspect.signature(_declared(name)).return_annotation in (None, "None")
    assert getattr(handle, name)(*args) == (None if returns_nothing else ("answer", name))
    (called, got_args, got_kwargs), = device.calls
    assert called == name
    if name not in ("start_mailbox", "close"):  # (**options; close() takes none)
        assert _bound(name, got_args, got_kwargs) == _bound(name, args, {})


def test_the_handle_satisfies_the_protocols():
    handle = DeviceHandle(Recorder())
    assert all(isinstance(handle, p) for p in PROTOCOLS)


@pytest.mark.parametrize("cap", sorted(GATED))
def test_calls_a_device_offers_by_its_caps_are_refused_where_caps_say_no(cap):
    device = Recorder(caps=DeviceCaps(**{**ALL_CAPS.__dict__, cap: False}))
    handle = DeviceHandle(device)
    for name in GATED[cap]:
        n_args = len([p for p in inspect.signature(_declared(name)).parameters.values()
                      if p.name != "self" and p.default is inspect.Parameter.empty
                      and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)])
        with pytest.raises(DeviceCapabilityError, match=rf"{name}: .*caps\.{cap} is False"):
            getattr(handle, name)(*range(n_args))
    assert device.calls == []  # nothing reached the device
    assert issubclass(DeviceCapabilityError, ValueError)


def test_a_wall_clock_device_streams_and_has_no_model_clock(tmp_path):
    with open_device({"capacity": 1 << 20, "block_size": BLOCK, "dram_bytes": 4 * BLOCK,
                      "backend": {"path": str(tmp_path / "w.img")}}) as dev:
        assert isinstance(dev, HostDevice) and dev.caps.streams_io and not dev.caps.model_clock
        buf = np.full(2 * BLOCK, 7, np.uint8)
        addrs = buf.ctypes.data + np.arange(2, dtype=np.int64) * BLOCK
        result = dev.stream_io(np.array([0, 5 * BLOCK], np.int64), np.full(2, BLOCK, np.int64), addrs, 2,
                               writes=np.ones(2, np.uint8))
        assert result.count == 2 and dev.load(5 * BLOCK, 3) == b"\x07" * 3
        with pytest.raises(DeviceCapabilityError, match="now_ns: .*caps.model_clock is False.*wall clock"):
            dev.now_ns()
        with pytest.raises(DeviceCapabilityError, match="caps.model_clock"):
            dev.advance_to(1e9)


def test_a_model_clock_device_tells_its_time_and_does_not_stream(tmp_path):
    with open_device({"capacity": 1 << 20, "block_size": BLOCK, "dram_bytes": 4 * BLOCK, "clock": "model",
                      "data": "none", "firmware": {"background": "manual"}}) as dev:
        assert dev.caps.model_clock and not dev.caps.streams_io
        start = dev.now_ns()
        latency = dev.access_one(0, BLOCK, 0, False)
        assert latency > 0 and dev.now_ns() >= start + latency * 0.99
        dev.advance_to(dev.now_ns() + 5e6)
        assert dev.now_ns() >= start + 5e6
        with pytest.raises(DeviceCapabilityError, match="stream_io: .*caps.streams_io is False"):
            dev.stream_io(np.zeros(1, np.int64), np.full(1, BLOCK, np.int64), np.zeros(1, np.int64), 1)


# ---------------------------------------------------------------- hint sinks, only on request
def _mailbox_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cxlhm-mailbox")]


def test_a_handle_whose_mailbox_hints_are_never_asked_for_starts_no_mailbox(make_device):
    before = _mailbox_threads()
    dev = make_device()
    dev.store(0, b"x" * 100)
    assert isinstance(dev.hint_sink("direct"), DeviceHints) and isinstance(dev.hint_sink("none"), NullHints)
    assert isinstance(hints_for(dev, "none"), NullHints) and isinstance(hints_for(dev, "direct"), DeviceHints)
    assert not hasattr(dev, "hints")  # nothing to probe: a sink is asked for by name
    assert "mailbox" not in dev.__dict__ and _mailbox_threads() == before
    sink = dev.hint_sink("mailbox")  # asked for: now it starts
    assert isinstance(sink, HintClient) and isinstance(sink, HintSink)
    assert len(_mailbox_threads()) == len(before) + 1
    dev.close()
    assert _mailbox_threads() == before  # and goes with the handle


def test_a_sink_is_named_or_refused():
    handle = DeviceHandle(Recorder())
    with pytest.raises(ValueError, match="via must be 'mailbox', 'direct' or 'none', got 'mail'"):
        handle.hint_sink("mail")
    with pytest.raises(ValueError, match="one of mailbox, direct, none"):
        hints_for(handle, "mail")
    with pytest.raises(TypeError, match="gives no hint sinks"):
        hints_for(object())
    assert isinstance(hints_for(object(), "none"), NullHints)  # dropping hints needs no handle


@pytest.mark.parametrize("via", ["direct", "mailbox"])
def test_both_sinks_deliver_the_hints_to_the_device(make_device_parts, via):
    dev, device = make_device_parts()
    seen = []
    route_hints_through(device, lambda kind, session, first, n, arg=0, **_: seen.append(
        (int(kind), int(session), int(first), int(n), int(arg))) or True)
    sink = dev.hint_sink(via)
    sink.session_resume(7, [(BLOCK + 10, 2 * BLOCK)])  # bytes of blocks 1-3
    sink.session_pause([7], expected_pause_ns=5_000)
    sink.session_end([7])
    if via == "mailbox":
        dev.mailbox.wait_background()
    assert seen == [(HintKind.SESSION_RESUME, 7, 1, 3, 0), (HintKind.SESSION_PAUSE, 7, 0, 0, 5_000),
                    (HintKind.SESSION_END, 7, 0, 0, 0)]
