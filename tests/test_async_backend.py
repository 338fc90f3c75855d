"""The AsyncBackend protocol (cxlhm.media.backend): the SSD back end satisfies it, and
the conformance suite's check fails on a back end that claims caps.async_io without
the calls the device makes on such a back end."""
import dataclasses

import pytest

from cxlhm.media.backend import AsyncBackend, BackendCaps, SplitPhaseRing
from cxlhm.media.memory import MemoryBackend
from cxlhm.media.ssd import SsdBackend
from cxlhm.testing.backends import BackendTests, missing_members, protocol_members


def test_the_protocol_names_what_the_device_calls_on_an_async_back_end():
    assert protocol_members(AsyncBackend) == ["async_room", "note_queued", "queue", "queue_depth", "queued",
                                              "reap", "shared_ring", "stream_ring"]
    assert protocol_members(SplitPhaseRing) == ["queue", "reap_all"]


def test_the_ssd_back_end_and_its_shared_ring_satisfy_it(tmp_path):
    backend = SsdBackend(str(tmp_path / "a.img"), 1 << 20, 8, source="test")
    try:
        assert backend.caps.async_io and isinstance(backend, AsyncBackend)
        assert isinstance(backend.shared_ring(2), SplitPhaseRing)
    finally:
        backend.close()


class _ClaimsAsyncIO(MemoryBackend):
    """A memory back end that says it keeps I/O in flight but has no split-phase calls."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.caps = dataclasses.replace(self.caps, async_io=True)


class _ClaimsAsyncSuite(BackendTests):  # not collected (no Test prefix): run by hand below
    def open_backend(self, path, capacity=None):
        return _ClaimsAsyncIO(path, capacity or self.capacity, 32, source="test")


def test_the_conformance_check_fails_on_a_back_end_that_claims_async_io_without_it(tmp_path):
    backend = _ClaimsAsyncIO(None, 1 << 20)
    try:
        assert not isinstance(backend, AsyncBackend)
        assert missing_members(backend, AsyncBackend) == ["async_room", "note_queued", "queue", "queued", "reap",
                                                          "shared_ring", "stream_ring"]
    finally:
        backend.close()
    with pytest.raises(AssertionError, match=r"claims caps.async_io but lacks \['async_room'"):
        _ClaimsAsyncSuite().test_a_back_end_claiming_async_io_is_an_async_backend(str(tmp_path / "b.img"))


def test_a_back_end_without_async_io_is_not_asked_for_it(tmp_path):
    backend = MemoryBackend(None, 1 << 20)
    try:
        assert backend.caps == BackendCaps(async_io=False, persistent=False, direct=False)
        assert not isinstance(backend, AsyncBackend)
    finally:
        backend.close()
