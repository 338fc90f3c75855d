"""A busy or hostile host must not stall the other hosts of the pool through the
service's lock: a new tenant's zero-fill and the layout's writes run outside it. Each
test holds the slow step on an event (not a timer) and checks what the other hosts can
do meanwhile, then lets it go and checks the result."""
from __future__ import annotations

import errno
import json
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from cxlhm.pool.layout import Layout, LayoutError, LayoutSaver
from cxlhm.pool.tenants import Preparing, TenantTable, zero_fill
from host_runtime.pool_client import AttachRefused, PoolError
from pool_helpers import BLOCK, DEVICE, PARTITION, attach, in_process_service, wait_for

MAX_TENANTS = DEVICE["capacity"] // PARTITION


class Gate:
    """Holds the calls it wraps (those `holds(args)` picks) until `release`, counting calls."""

    def __init__(self, real, holds=lambda *a: True, then=None):
        self.real, self.holds, self.then = real, holds, then
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        if self.holds(*args):
            self.entered.set()
            assert self.release.wait(30), "the test never released the held call"
            if self.then is not None:
                raise self.then
        return self.real(*args)


def in_thread(fn, *args):
    out: list = []

    def run():
        try:
            out.append(fn(*args))
        except BaseException as exc:  # the test looks at it
            out.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def saved_layout(svc) -> dict:
    return json.loads((Path(svc.state_dir) / "pool.json").read_text())


@pytest.fixture
def svc(tmp_path):
    service = in_process_service(tmp_path)
    yield service
    service.close()


def test_a_new_tenants_zero_fill_stalls_no_other_host(svc, monkeypatch):
    a = attach(svc, "a", ["t1"])
    a.tenant("t1").store(0, b"before")
    gate = Gate(svc._tenants._fill, holds=lambda part: part.name == "t2")
    monkeypatch.setattr(svc._tenants, "_fill", gate)
    filler, b_out = in_thread(attach, svc, "b", ["t2"])
    assert gate.entered.wait(30)
    # while t2's partition is being filled: the other hosts' requests, attaches and the operator go on
    a.tenant("t1").store(BLOCK, b"during")
    assert a.tenant("t1").load(0, 6) == b"before" and a.tenant("t1").load(BLOCK, 6) == b"during"
    assert a.stats()["host"] == "a" and a.flush() >= 0
    assert set(svc.stats()["tenants"]) == {"t1"}
    c = attach(svc, "c", ["t1"])  # a new host name (a layout write) on a tenant that exists
    assert c.tenant("t1").load(0, 6) == b"before"
    e = attach(svc, "e", ["t3"])  # another new tenant is filled meanwhile, at the next free partition
    assert e.tenant("t3").id == 2
    # a second host asking for t2 waits for t2's fill alone
    waiter, d_out = in_thread(attach, svc, "d", ["t2"])
    assert wait_for(lambda: svc._tenants.preparing["t2"].waiters == 1)
    assert filler.is_alive() and waiter.is_alive() and not b_out and not d_out
    assert "t2" in svc.layout.reserved and "t2" not in svc.layout.tenants
    assert "t2" not in [t["name"] for t in saved_layout(svc)["tenants"]]
    gate.release.set()
    filler.join(30), waiter.join(30)
    b, d = b_out[0], d_out[0]
    assert b.tenant("t2").id == d.tenant("t2").id == 1 and gate.calls == 2  # t2 and t3 filled once each
    b.tenant("t2").store(0, b"t2 data")
    assert d.tenant("t2").load(0, 7) == b"t2 data"
    assert a.tenant("t1").load(0, 6) == b"before"  # t1 untouched by the fills beside it
    saved = {t["name"]: t["id"] for t in saved_layout(svc)["tenants"]}
    assert saved == {"t1": 0, "t2": 1, "t3": 2} and not svc.layout.reserved
    for h in (a, b, c, d, e):
        h.close()


def test_a_failed_fill_records_nothing_frees_its_partition_and_tells_every_waiter(svc, monkeypatch):
    a = attach(svc, "a", ["t1"])
    real = svc._tenants._fill
    gate = Gate(real, holds=lambda part: part.name == "t2", then=OSError(errno.EIO, "media error"))
    monkeypatch.setattr(svc._tenants, "_fill", gate)
    filler, b_out = in_thread(attach, svc, "b", ["t2"])
    assert gate.entered.wait(30)
    waiter, d_out = in_thread(attach, svc, "d", ["t2"])
    assert wait_for(lambda: svc._tenants.preparing["t2"].waiters == 1)
    gate.release.set()
    filler.join(30), waiter.join(30)
    for out in (b_out, d_out):  # the one that filled and the one that waited: both told why
        assert isinstance(out[0], AttachRefused), out
        assert "tenant 't2': preparing its partition failed" in str(out[0]) and "media error" in str(out[0])
    assert "t2" not in svc.layout.tenants and not svc.layout.reserved and not svc._tenants.preparing
    assert [t["name"] for t in saved_layout(svc)["tenants"]] == ["t1"]
    monkeypatch.setattr(svc._tenants, "_fill", real)
    # no space leaked: every other partition of the device can still be had, t2 again among them
    names = ["t2"] + [f"n{i}" for i in range(MAX_TENANTS - 2)]
    hosts = [attach(svc, f"h{i}", [name]) for i, name in enumerate(names)]
    assert sorted(h.tenants[n].id for h, n in zip(hosts, names)) == list(range(1, MAX_TENANTS))
    with pytest.raises(AttachRefused, match="all taken"):
        attach(svc, "full", ["one-more"])
    hosts[0].tenant("t2").store(0, b"works")
    assert hosts[0].tenant("t2").load(0, 5) == b"works"
    for h in hosts + [a]:
        h.close()


def test_a_close_during_a_fill_stops_it_and_records_nothing(tmp_path, monkeypatch):
    svc = in_process_service(tmp_path)
    gate = Gate(svc._tenants._fill)
    monkeypatch.setattr(svc._tenants, "_fill", gate)
    filler, out = in_thread(attach, svc, "b", ["t"])
    assert gate.entered.wait(30)
    closer, _ = in_thread(svc.close)
    assert wait_for(svc._stop.is_set)
    gate.release.set()  # the real fill starts now, and stops at once
    closer.join(60), filler.join(30)
    assert not closer.is_alive()
    assert isinstance(out[0], (PoolError, OSError, EOFError)), out  # refused, or hung up on by the closing service
    assert json.loads((tmp_path / "state" / "pool.json").read_text())["tenants"] == []


def test_zero_fill_stops_when_told():
    class Device:
        writes = flushes = 0

        def write_from(self, *_):
            self.writes += 1

        def flush(self):
            self.flushes += 1
    dev, stop = Device(), threading.Event()
    part = Layout(1 << 21, BLOCK, PARTITION, None).reserve("t")
    zero_fill(dev, part, PARTITION, PARTITION // 4, stop)
    assert (dev.writes, dev.flushes) == (4, 1)
    stop.set()
    with pytest.raises(OSError, match="closing"):
        zero_fill(dev, part, PARTITION, PARTITION // 4, stop)
    assert (dev.writes, dev.flushes) == (4, 1)


def test_a_layout_write_stalls_no_other_host_and_writes_coalesce(svc, monkeypatch):
    a = attach(svc, "a", ["t"])
    gate = Gate(svc.layout.write)
    monkeypatch.setattr(svc.layout, "write", gate)
    first, first_out = in_thread(attach, svc, "new-0", ["t"])  # a new host name: its id must be saved
    assert gate.entered.wait(30)
    # while pool.json is being written: requests, stats and attaches of names already saved go on
    a.tenant("t").store(0, b"during a write")
    assert a.tenant("t").load(0, 14) == b"during a write" and a.stats()["host"] == "a"
    assert "a" in [h["host"] for h in svc.stats()["hosts"]]
    again = attach(svc, "a", ["t"])
    assert again.tenant("t").load(0, 14) == b"during a write"
    # hosts cycling through new names queue behind the write, not the lock; one write serves them all
    queued = [in_thread(attach, svc, f"new-{i}", ["t"]) for i in range(1, 6)]
    assert wait_for(lambda: all(f"new-{i}" in svc.layout.hosts for i in range(1, 6)))
    assert not first_out and not any(out for _, out in queued) and gate.calls == 1
    gate.release.set()
    first.join(30)
    for t, _ in queued:
        t.join(30)
    hosts = [first_out[0]] + [out[0] for _, out in queued]
    assert [h.name for h in hosts] == [f"new-{i}" for i in range(6)]
    assert gate.calls == 2, gate.calls  # the held write, then one for the five that waited
    saved = saved_layout(svc)["hosts"]
    assert {f"new-{i}" for i in range(6)} <= set(saved)
    assert {h.name: h.host_id for h in hosts} == {n: saved[n] for n in saved if n.startswith("new-")}
    assert not list(Path(svc.state_dir).glob("*.tmp"))
    for h in hosts + [a, again]:
        h.close()


def test_a_flush_saves_the_cursors_even_with_nothing_new_recorded(svc):
    a = attach(svc, "a", ["t"])
    offset, _ = a.tenant("t").put_chunk(b"x" * 100)
    a.flush()
    cursor = [t["cursor"] for t in saved_layout(svc)["tenants"] if t["name"] == "t"]
    assert cursor == [offset + BLOCK]
    a.close()


# ---------------------------------------------------------------- the table against a model
class TenantTableMachine(RuleBasedStateMachine):
    """New tenants claimed, filled or failed, in any order, against a model of which
    partitions are taken: a failed one gives its partition back, nothing is recorded
    before its fill succeeded, and a reload sees exactly the recorded tenants."""

    jobs = Bundle("jobs")

    def __init__(self):
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "pool.json"
        self.layout = Layout(MAX_TENANTS * PARTITION, BLOCK, PARTITION, self.path)
        self.lock = threading.Lock()
        self.table = TenantTable(self.layout, self.lock, lambda part: None, lambda part: ("tenant", part.name))
        self.saver = LayoutSaver(self.layout, self.lock)
        self.recorded: dict[str, int] = {}   # the model: name -> partition id
        self.in_progress: dict[str, int] = {}
        self.count = 0

    def teardown(self):
        self.dir.cleanup()

    @rule(target=jobs)
    def claim_a_new_tenant(self):
        name = f"t{self.count}"
        self.count += 1
        taken = set(self.recorded.values()) | set(self.in_progress.values())
        if len(taken) == MAX_TENANTS:
            with pytest.raises(LayoutError, match="all taken"):
                self.table.claim(name)
            return multiple()  # (no job)
        job, mine = self.table.claim(name)
        assert mine and isinstance(job, Preparing)
        assert job.partition.id == min(set(range(MAX_TENANTS)) - taken)  # the lowest free partition
        assert job.partition.base == job.partition.id * PARTITION
        self.in_progress[name] = job.partition.id
        return job

    @rule(job=consumes(jobs))
    def fill_succeeds(self, job):
        self.table.complete(job, ("tenant", job.partition.name))
        self.recorded[job.partition.name] = self.in_progress.pop(job.partition.name)
        assert job.wait() == ("tenant", job.partition.name)

    @rule(job=consumes(jobs))
    def fill_fails(self, job):
        self.table.abandon(job, OSError("media error"))
        del self.in_progress[job.partition.name]
        with pytest.raises(LayoutError, match="preparing its partition failed"):
            job.wait()

    @rule(data=st.data())
    def ask_again(self, data):
        names = sorted(self.recorded) + sorted(self.in_progress)
        if not names:
            return
        name = data.draw(st.sampled_from(names))
        found, mine = self.table.claim(name)
        assert not mine
        if name in self.recorded:
            assert found == ("tenant", name)
        else:
            assert isinstance(found, Preparing) and found.partition.id == self.in_progress[name]
            with self.lock:
                found.waiters -= 1

    @rule()
    def save_and_reload(self):
        self.saver.save()
        again = Layout(MAX_TENANTS * PARTITION, BLOCK, PARTITION, self.path)
        assert {n: t.id for n, t in again.tenants.items()} == self.recorded

    @invariant()
    def tables_match_the_model(self):
        assert {n: t.id for n, t in self.layout.tenants.items()} == self.recorded
        assert {n: t.id for n, t in self.layout.reserved.items()} == self.in_progress
        assert set(self.table.preparing) == set(self.in_progress)


TestTenantTable = TenantTableMachine.TestCase
TestTenantTable.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_host_names_recorded_are_bounded_by_max_host_names(tmp_path):
    """Any holder of an open pool's key names itself: one cycling through new names is
    refused past `max_host_names` (the refusal names it), names used before still attach."""
    svc = in_process_service(tmp_path, max_host_names=3)
    try:
        hosts = [attach(svc, f"n{i}", ["t"]) for i in range(3)]
        with pytest.raises(AttachRefused, match="recorded 3 host names, its max_host_names"):
            attach(svc, "n3", ["t"])
        hosts[0].close()
        again = attach(svc, "n0", ["t"])
        again.tenant("t").store(0, b"ok")
        assert set(saved_layout(svc)["hosts"]) == {"n0", "n1", "n2"}
        for h in hosts[1:] + [again]:
            h.close()
    finally:
        svc.close()
    with pytest.raises(LayoutError, match="max_host_names must be 1..65535"):
        Layout(1 << 21, BLOCK, PARTITION, None, max_host_names=0x10000)
