"""The CXL mailbox: register block, every command's round trip, hint delivery to the
policy, background progress, the host-side protocol, and the CLI."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numba
import numpy as np
import pytest

from cxlhm import blocktable as btm
from cxlhm.blocktable import evictable
from cxlhm.mailbox import HintKind, Mailbox, Opcode, ReturnCode
from cxlhm.mailbox import payloads as P
from cxlhm.mailbox import registers as R
from cxlhm.mailbox.commands import COMMANDS
from cxlhm.mailbox.poison import PoisonList, PoisonRecord
from firmware_policies.base import Policy
from hintspy import route_hints_through
from host_runtime.mailbox import MailboxClient, MailboxCommandError, MailboxError, MailboxTimeout

KIB, MIB = 1024, 1 << 20
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def open_mailbox(make_device_parts):
    """(device handle, Mailbox, MailboxClient) factory; everything closed at teardown.
    The mailbox serves the device itself (`mb.device`: white-box tests read it)."""
    opened = []

    def factory(spy=None, mailbox_options=None, **device_overrides):
        dev, device = make_device_parts(**device_overrides)
        if spy is not None:
            route_hints_through(device, spy)
        mb = Mailbox(device, **(mailbox_options or {})).start()
        # generous: a device's first PIN may compile numba kernels (the "no hang" bound)
        client = MailboxClient(mb, timeout=30)
        opened.append((client, mb))
        return dev, mb, client

    yield factory
    for client, mb in opened:
        client.close()
        mb.close()


class HintSpy:
    """Stands in for the device's hints: records (kind, session, first, n, arg)."""

    def __init__(self, delay_s=0.0):
        self.calls, self.delay_s = [], delay_s

    def __call__(self, kind, session, first_block, n_blocks, arg=0):
        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls.append((kind, session, first_block, n_blocks, arg))


# ---------------------------------------------------------------- registers
def test_register_block_is_laid_out_like_a_type3_device(open_mailbox):
    _, mb, client = open_mailbox()
    client.identify()  # the firmware declares the mailbox ready once it runs
    regs = client.regs
    array = regs.read64(0)
    assert array & 0xFFFF == 0 and (array >> 32) & 0xFFFF == 3
    caps = {}
    for i in range(3):
        head = regs.read64(0x10 + 16 * i)
        caps[head & 0xFFFF] = (head >> 32, regs.read32(0x10 + 16 * i + 8))
    assert caps[R.CAP_DEVICE_STATUS] == (0x80, 8)
    assert caps[R.CAP_PRIMARY_MAILBOX] == (0x88, 0x20 + 2048)
    assert regs.read32(0x88) & 0x1F == 11 and regs.payload_size == 2048
    assert regs.mailbox_ready and regs.media_status == R.MEDIA_READY
    assert mb.path.startswith("/dev/shm/")


def test_another_process_maps_the_same_registers_and_sends_commands(open_mailbox):
    _, mb, client = open_mailbox()
    serial = client.identify()["serial"]
    before = mb.commands_serviced
    child = (
        "import json, sys\n"
        "from cxlhm.mailbox import registers as R\n"
        "from host_runtime.mailbox import MailboxClient\n"
        "c = MailboxClient(sys.argv[1])\n"
        "print(json.dumps({'mailbox_offset': c.regs.mailbox_offset, 'payload': c.payload_size,\n"
        "                  'ready': c.regs.mailbox_ready, 'serial': c.identify()['serial'],\n"
        "                  'cel': len(c.log('cel'))}))\n"
    )
    out = subprocess.run([sys.executable, "-c", child, mb.path], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"mailbox_offset": 0x88, "payload": 2048, "ready": True, "serial": serial, "cel": len(COMMANDS)}
    # the child's commands went through this process's firmware, and its last
    # status write is visible here
    assert mb.commands_serviced >= before + 3
    assert R.decode_status(client.regs.status)[0] == ReturnCode.SUCCESS
    assert R.decode_command(client.regs.command)[0] == Opcode.GET_LOG


def test_close_marks_the_mailbox_not_ready_and_removes_its_file(make_device):
    dev = make_device()
    mb = Mailbox(dev).start()  # the handle is a MailboxTarget
    client = MailboxClient(mb)
    client.identify()
    path = mb.path
    mb.close()
    assert not Path(path).exists()
    assert not client.regs.mailbox_ready  # the host's mapping outlives the file
    with pytest.raises(MailboxError, match="shut its mailbox down"):
        client.identify()  # at once, not after the 60 s ready timeout
    client.close()


# ---------------------------------------------------------------- standard commands
def test_identify_reports_a_type3_component_with_a_stable_serial(open_mailbox, make_device):
    dev, mb, client = open_mailbox()
    ident = client.identify()
    assert ident["component_type"] == P.COMPONENT_TYPE_TYPE3
    assert ident["max_message_size"] == 2048
    mb.close()
    dev.close()
    again = Mailbox(make_device()).start()  # same image path: same device
    try:
        with MailboxClient(again) as c2:
            assert c2.identify()["serial"] == ident["serial"]
    finally:
        again.close()


def test_identify_memory_device_reports_capacity_in_256mib_units(open_mailbox):
    _, _, client = open_mailbox(capacity=1 << 30, block_size=64 * KIB, dram_bytes=MIB)
    memdev = client.identify_memory_device()
    assert memdev["total_capacity"] == 1 << 30 == memdev["persistent_only_capacity"]
    assert memdev["volatile_only_capacity"] == 0 and memdev["lsa_size"] == 0
    assert memdev["fw_revision"].startswith("cxlhm")
    hybrid = client.identify_hybrid()
    assert (hybrid["capacity"], hybrid["block_size"], hybrid["dram_bytes"], hybrid["policy"]) == (1 << 30, 64 * KIB, MIB, "lru")


def test_health_info(open_mailbox):
    _, _, client = open_mailbox()
    health = client.health()
    assert health["media_status"] == 0 and not health["maintenance_needed"]
    assert health["temperature"] is None and health["life_used_percent"] is None  # not implemented, per spec
    assert health["dirty_shutdowns"] == 0


def test_command_effects_log_lists_every_command_including_vendor_ones(open_mailbox):
    _, _, client = open_mailbox()
    (log,) = client.supported_logs()
    assert log["uuid"] == str(P.CEL_UUID) and log["size"] == 4 * len(COMMANDS)
    cel = {e["opcode"]: e for e in client.log("cel")}
    assert set(cel) == set(COMMANDS) >= {int(op) for op in Opcode}
    assert "background_operation" in cel[Opcode.HINT_NEXT_PREFIX]["effect_names"]
    assert cel[Opcode.HINT_SESSION_END]["effect_names"] == ["policy_change_immediate"]
    assert cel[Opcode.IDENTIFY]["effects"] == 0


def test_get_log_windows_and_its_input_checks(open_mailbox):
    _, _, client = open_mailbox()
    whole = client.send(Opcode.GET_LOG, P.GET_LOG_IN.pack(P.CEL_UUID.bytes, 0, 4 * len(COMMANDS)))
    assert client.send(Opcode.GET_LOG, P.GET_LOG_IN.pack(P.CEL_UUID.bytes, 4, 8)) == whole[4:12]
    for payload, rc in [(P.GET_LOG_IN.pack(b"\1" * 16, 0, 4), ReturnCode.INVALID_LOG),
                        (P.GET_LOG_IN.pack(P.CEL_UUID.bytes, 0, 4096), ReturnCode.INVALID_INPUT),
                        (P.GET_LOG_IN.pack(P.CEL_UUID.bytes, len(whole), 4), ReturnCode.INVALID_INPUT),
                        (P.GET_LOG_IN.pack(P.CEL_UUID.bytes, 0xFFFFFFFF, 0xFFFFFFFF), ReturnCode.INVALID_INPUT)]:
        assert client.execute(Opcode.GET_LOG, payload).rc == rc


def test_poison_list_is_empty_and_range_checked(open_mailbox):
    dev, _, client = open_mailbox()
    assert client.poison() == {"more_records": False, "overflow": False, "scan_in_progress": False,
                               "overflow_timestamp": None, "records": []}
    assert client.execute(Opcode.GET_POISON_LIST, P.POISON_IN.pack(dev.capacity, 1)).rc == ReturnCode.INVALID_PHYSICAL_ADDRESS
    assert client.execute(Opcode.GET_POISON_LIST, P.POISON_IN.pack(0, 2**64 - 1)).rc == ReturnCode.INVALID_PHYSICAL_ADDRESS
    assert client.execute(Opcode.GET_POISON_LIST, P.POISON_IN.pack(0, 0)).rc == ReturnCode.INVALID_INPUT


def test_poison_seam_reports_what_the_device_records(open_mailbox):
    dev, mb, client = open_mailbox()
    records = (PoisonRecord(4096, 64, P.POISON_SOURCE_INTERNAL), PoisonRecord(8192, 128), PoisonRecord(1 << 19, 64))
    mb.device.poison_records = lambda dpa, length, max_records: PoisonList(records, overflow_timestamp=123)
    found = client.poison(0, 16 * KIB)  # the third record lies outside the asked range
    assert found["records"] == [{"dpa": 4096, "length": 64, "source": P.POISON_SOURCE_INTERNAL},
                                {"dpa": 8192, "length": 128, "source": P.POISON_SOURCE_UNKNOWN}]
    assert found["overflow"] and found["overflow_timestamp"] == 123


# ---------------------------------------------------------------- malformed commands
def test_unknown_opcodes_and_wrong_lengths_get_spec_codes(open_mailbox):
    _, _, client = open_mailbox()
    assert client.execute(0x1234).rc == ReturnCode.UNSUPPORTED
    assert client.execute(0xC0FF, b"\0" * 8).rc == ReturnCode.UNSUPPORTED
    assert client.execute(Opcode.IDENTIFY, b"\0").rc == ReturnCode.INVALID_PAYLOAD_LENGTH
    assert client.execute(Opcode.GET_LOG, b"\0" * 10).rc == ReturnCode.INVALID_PAYLOAD_LENGTH
    # the length field claims more than the payload area holds
    assert client.execute(Opcode.HINT_SESSION_END, b"", length=R.PAYLOAD_LENGTH_MAX).rc == ReturnCode.INVALID_PAYLOAD_LENGTH
    one_end = P.encode_hint_batch(np.array([(1,)], P.SESSION_ENTRY))
    assert client.execute(Opcode.HINT_SESSION_END, one_end[:-1]).rc == ReturnCode.INVALID_PAYLOAD_LENGTH
    assert client.execute(Opcode.HINT_SESSION_END, one_end + b"\0" * 8).rc == ReturnCode.INVALID_PAYLOAD_LENGTH  # count says 1
    assert client.execute(Opcode.HINT_SESSION_END, b"\2" + one_end[1:]).rc == ReturnCode.INVALID_INPUT  # version 2
    with pytest.raises(MailboxCommandError) as err:
        client.send(0x1234)
    assert err.value.rc_name == "UNSUPPORTED" and err.value.rc == ReturnCode.UNSUPPORTED


# ---------------------------------------------------------------- hints reach the policy
def _recorder_policy() -> Policy:
    """A minimal policy whose compiled on_hint logs every hint it gets."""

    def make_state(n_slots, params):
        return (np.zeros((64, 5), np.int64), np.zeros(1, np.int64))

    @numba.njit(nogil=True)
    def nothing(ps, bt, slot, is_write, now):
        return

    @numba.njit(nogil=True)
    def victim(ps, bt, now):
        for slot in range(bt.block.shape[0]):
            if bt.block[slot] >= 0 and evictable(bt, slot):
                return slot
        return -1

    @numba.njit(nogil=True)
    def on_evict(ps, bt, slot, now):
        return

    @numba.njit(nogil=True)
    def on_hint(ps, bt, kind, session, first_block, n_blocks, arg, now):
        log, count = ps
        i = count[0]
        if i < log.shape[0]:
            log[i, 0], log[i, 1], log[i, 2], log[i, 3], log[i, 4] = kind, session, first_block, n_blocks, arg
        count[0] = i + 1

    return Policy(name="hint-recorder", description="test", make_state=make_state, on_hit=nothing,
                  on_insert=nothing, victim=victim, on_evict=on_evict, on_hint=on_hint)


def test_every_hint_command_reaches_the_compiled_policy_hook(open_mailbox, monkeypatch):
    from cxlhm import policies  # the registry the device looks policies up in
    recorder, real_get = _recorder_policy(), policies.get
    monkeypatch.setattr(policies, "get", lambda name: recorder if name == "hint-recorder" else real_get(name))
    dev, mb, client = open_mailbox(firmware={"policy": "hint-recorder"})  # 1 MiB window, 4 KiB blocks
    hints = client.hints
    hints.session_resume(7, [(0, 1), (4095, 2)])       # block 0; blocks 0-1
    hints.next_prefix(7, [(8 * KIB, 12 * KIB)], deadline_ns=10**6)  # blocks 2-4
    hints.append(7, [(MIB - 1, 1)])                    # last block
    hints.session_pause(7, expected_pause_ns=5 * 10**9)
    hints.session_end([7, 8])
    log, count = mb.device.ps
    K = HintKind
    assert count[0] == 7
    assert log[:7].tolist() == [
        [K.SESSION_RESUME, 7, 0, 1, 0], [K.SESSION_RESUME, 7, 0, 2, 0], [K.NEXT_PREFIX, 7, 2, 3, 10**6],
        [K.APPEND, 7, 255, 1, 0], [K.SESSION_PAUSE, 7, 0, 0, 5 * 10**9],
        [K.SESSION_END, 7, 0, 0, 0], [K.SESSION_END, 8, 0, 0, 0]]


def test_pin_and_unpin_reach_the_device_and_report_declined_entries(open_mailbox):
    dev, mb, client = open_mailbox()  # 4 DRAM slots of 4 KiB
    bt = mb.device.bt

    def pinned_blocks():
        return sorted(int(b) for b, f in zip(bt.block, bt.flags) if b >= 0 and f & btm.PINNED)

    receipt = client.hints.pin([(40 * KIB, 8 * KIB)])  # blocks 10-11
    assert (receipt.commands, receipt.entries, receipt.declined) == (1, 1, 0)
    assert pinned_blocks() == [10, 11]
    # a pin that would leave no slot for misses is declined, not an error
    assert client.hints.pin([(0, 8 * KIB)]).declined == 1
    assert pinned_blocks() == [10, 11]
    assert client.hints.unpin([(40 * KIB, 8 * KIB)]).declined == 0
    assert pinned_blocks() == []


def test_kind_specific_arguments_are_delivered_when_the_device_takes_them(open_mailbox):
    spy = HintSpy()
    _, _, client = open_mailbox(spy=spy)
    client.hints.next_prefix(3, [(0, 10)], deadline_ns=123_456)
    client.hints.session_pause([3, 4], expected_pause_ns=[7, 8])
    assert spy.calls == [(HintKind.NEXT_PREFIX, 3, 0, 1, 123_456),
                         (HintKind.SESSION_PAUSE, 3, 0, 0, 7), (HintKind.SESSION_PAUSE, 4, 0, 0, 8)]


@pytest.mark.parametrize("entry, why", [
    ((1, 1 << 20, 1), "starts at the end of the window"),
    ((1, (1 << 20) - 10, 11), "runs one byte past the end"),
    ((1, 2**64 - 1, 2), "wraps around 2**64"),
    ((1, 0, 2**64 - 1), "longer than the window"),
    ((1, 0, 0), "empty"),
    ((0, 0, 1), "session 0"),
    ((2**63, 0, 1), "session above 2**63-1"),
])
def test_bad_hint_entries_reject_the_whole_batch(open_mailbox, entry, why):
    spy = HintSpy()
    _, _, client = open_mailbox(spy=spy)
    good = (5, 0, 4096)
    entries = np.array([good, good, entry], P.SESSION_RANGE_ENTRY)
    reply = client.execute(Opcode.HINT_SESSION_RESUME, P.encode_hint_batch(entries))
    assert reply.rc == ReturnCode.INVALID_INPUT, why
    assert reply.ext_status == 3  # 1-based index of the bad entry
    assert spy.calls == []        # all or nothing
    with pytest.raises(MailboxCommandError) as err:
        client.hints.session_resume(entries["session"], np.stack([entries["hpa"], entries["length"]], 1))
    assert err.value.entry == 2 and err.value.rc_name == "INVALID_INPUT"


def test_hint_helpers_batch_into_as_few_commands_as_fit(open_mailbox):
    spy = HintSpy()
    _, mb, client = open_mailbox(spy=spy, mailbox_options={"background_min_blocks": 10**9})
    per_command = (2048 - 8) // 24
    assert per_command == 85
    ranges = [(i * 4096, 4096) for i in range(200)]
    before = mb.commands_serviced
    assert client.hints.session_resume(9, ranges).commands == 3
    assert mb.commands_serviced - before == 3
    assert [c[2] for c in spy.calls] == list(range(200))  # in order, one hint per entry
    assert client.hints.session_end(range(1, 300)).commands == 2   # 255 sessions per command
    assert client.hints.pin([]).commands == 0


def test_hint_helpers_refuse_values_that_do_not_fit_the_format(open_mailbox):
    _, _, client = open_mailbox()
    for bad in ([(-1, 10)], [(0, 2**64)], [(0, 1.5)], [(1, 2, 3)]):
        with pytest.raises(ValueError):
            client.hints.pin(bad)
    with pytest.raises(ValueError):
        client.hints.session_end(-3)


# ---------------------------------------------------------------- background commands
def test_a_big_prefetch_runs_in_the_background_with_progress(open_mailbox):
    spy = HintSpy(delay_s=0.002)
    _, mb, client = open_mailbox(spy=spy, mailbox_options={"background_min_blocks": 16, "background_step_blocks": 2})
    entries = np.array([(4, i * 4096, 4096) for i in range(60)], P.SESSION_RANGE_ENTRY)
    reply = client.execute(Opcode.HINT_SESSION_RESUME, P.encode_hint_batch(entries))
    assert reply.rc == ReturnCode.BACKGROUND_STARTED and reply.background_running
    percents = []
    served_meanwhile = False
    while client.background_status().running:
        percents.append(client.background_status().percent)
        if not served_meanwhile:  # foreground commands are answered while it runs
            assert client.identify()["component_type"] == 3
            served_meanwhile = True
            # another hint command would overtake the prefetch: BUSY
            end = P.encode_hint_batch(np.array([(4,)], P.SESSION_ENTRY))
            busy = client.execute(Opcode.HINT_SESSION_END, end)
            assert busy.rc == ReturnCode.BUSY or not client.background_status().running
        time.sleep(0.003)
    final = client.background_status()
    assert (final.opcode, final.percent, final.rc) == (Opcode.HINT_SESSION_RESUME, 100, ReturnCode.SUCCESS)
    assert any(0 < p < 100 for p in percents) and percents == sorted(percents)
    assert len(spy.calls) == 60 and mb.background.completed == 1


def test_hint_helper_waits_out_a_running_background_command(open_mailbox):
    spy = HintSpy(delay_s=0.002)
    _, _, client = open_mailbox(spy=spy, mailbox_options={"background_min_blocks": 16, "background_step_blocks": 4})
    receipt = client.hints.next_prefix(4, [(i * 4096, 4096) for i in range(40)])  # returns while delivery runs
    assert receipt.background and receipt.commands == 1
    client.hints.session_end(4)  # BUSY from the device; the helper waits and resends
    kinds = [c[0] for c in spy.calls]
    assert kinds == [HintKind.NEXT_PREFIX] * 40 + [HintKind.SESSION_END]


def test_second_background_command_is_busy(open_mailbox):
    spy = HintSpy(delay_s=0.01)  # 30 entries: 0.3 s of delivery, far longer than one round trip
    _, _, client = open_mailbox(spy=spy, mailbox_options={"background_min_blocks": 1, "background_step_blocks": 1})
    batch = P.encode_hint_batch(np.array([(4, i * 4096, 4096) for i in range(30)], P.SESSION_RANGE_ENTRY))
    assert client.execute(Opcode.HINT_SESSION_RESUME, batch).rc == ReturnCode.BACKGROUND_STARTED
    assert client.execute(Opcode.HINT_SESSION_RESUME, batch).rc == ReturnCode.BUSY
    client.wait_background()
    assert len(spy.calls) == 30


# ---------------------------------------------------------------- host protocol
def test_host_refuses_to_ring_a_doorbell_that_is_still_set(make_device):
    dev = make_device()
    mb = Mailbox(dev)  # firmware not started: nobody clears the doorbell
    mb.regs.memdev_status = R.encode_memdev_status(media=R.MEDIA_READY, mailbox_ready=True)
    client = MailboxClient(mb, timeout=0.05)
    try:
        with pytest.raises(MailboxTimeout):
            client.identify()
        assert client.regs.doorbell  # left set, as cxl_pci leaves it
        with pytest.raises(MailboxCommandError) as err:
            client.identify()
        assert err.value.rc_name == "BUSY"
    finally:
        client.close()
        mb.close()


def test_host_waits_for_mailbox_ready(make_device):
    dev = make_device()
    mb = Mailbox(dev)
    client = MailboxClient(mb, ready_timeout=0.05)
    try:
        with pytest.raises(MailboxTimeout, match="not ready"):
            client.identify()
        mb.start()
        client.ready_timeout = 30
        assert client.identify()["component_type"] == 3
    finally:
        client.close()
        mb.close()


def test_command_register_rewritten_while_busy_is_answered_busy(open_mailbox):
    release, entered = threading.Event(), threading.Event()

    def blocking_hint(kind, session, first_block, n_blocks, arg=0):
        entered.set()
        release.wait(5)

    _, _, client = open_mailbox(spy=blocking_hint)
    replies = []
    sender = threading.Thread(target=lambda: replies.append(
        client.execute(Opcode.HINT_SESSION_END, P.encode_hint_batch(np.array([(1,)], P.SESSION_ENTRY)))))
    sender.start()
    assert entered.wait(5)
    raw = MailboxClient(client.regs.path).regs  # a second, misbehaving host
    raw.command = R.encode_command(Opcode.IDENTIFY, 0)  # does not wait for the doorbell
    raw.set_doorbell()
    release.set()
    sender.join(5)
    assert replies[0].rc == ReturnCode.BUSY
    assert client.identify()["component_type"] == 3  # and the mailbox keeps working
    raw.close()


def test_closed_device_answers_media_disabled_for_media_commands(open_mailbox):
    dev, mb, client = open_mailbox()
    dev.close()
    with pytest.raises(MailboxCommandError) as err:
        client.hints.session_end(1)
    assert err.value.rc_name == "MEDIA_DISABLED"
    assert client.identify()["component_type"] == 3
    assert client.health()["media_status"] == 1  # not ready
    deadline = time.monotonic() + 5
    while client.regs.media_status != R.MEDIA_DISABLED and time.monotonic() < deadline:
        time.sleep(0.001)
    assert client.regs.media_status == R.MEDIA_DISABLED


# ---------------------------------------------------------------- CLI and docs
def test_cli_prints_json(capsys, tmp_path):
    from cxlhm_apps.cli import main
    base = ["--set", "capacity=1GiB", "--set", "dram_bytes=1MiB", "--set", f"backend.path={tmp_path / 'img'}"]
    assert main(["mailbox", "identify", *base]) == 0
    ident = json.loads(capsys.readouterr().out)
    assert ident["total_capacity"] == 1 << 30 and ident["component_type"] == "type3"
    assert main(["mailbox", "health", *base]) == 0
    assert json.loads(capsys.readouterr().out)["health"]["media_normal"] is True
    assert main(["mailbox", "log", *base]) == 0
    names = {e["name"] for e in json.loads(capsys.readouterr().out)["entries"]}
    assert {"HINT_SESSION_RESUME", "GET_POISON_LIST"} <= names
    assert main(["mailbox", "poison", *base]) == 0
    assert json.loads(capsys.readouterr().out)["poison"]["nr_records"] == 0


def test_cli_talks_to_a_running_device_through_its_register_file(open_mailbox, capsys):
    from cxlhm_apps.cli import main
    _, mb, _ = open_mailbox()
    assert main(["mailbox", "identify", "--regs", mb.path]) == 0
    assert json.loads(capsys.readouterr().out)["hybrid"]["capacity"] == 1 << 20
    assert main(["mailbox", "log", "not-a-log", "--regs", mb.path]) == 2  # a CLI error: one line, exit 2


def test_docs_cover_every_opcode_and_entry_format():
    doc = (REPO / "docs" / "mailbox.md").read_text()
    for op in Opcode:
        assert op.name in doc and f"{op.value:04X}h" in doc, op.name
    for code in ReturnCode:
        if code <= 0x17:
            assert code.name in doc, code.name
    for fmt in P.HINT_ENTRY_FORMATS.values():
        for field in fmt.names:
            assert field in doc


# ---------------------------------------------------------------- a hostile or careless host
def _wait_for(predicate, what):
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_a_host_clearing_the_ready_bit_does_not_disable_the_mailbox(open_mailbox):
    _, mb, client = open_mailbox()
    client.identify()
    client.regs.memdev_status = 0  # a host wrote the device-owned status register
    assert client.identify()["component_type"] == P.COMPONENT_TYPE_TYPE3  # waits the bit back, not 60 s
    assert mb.registers_restored >= 1


def test_capability_registers_written_by_a_host_are_put_back(open_mailbox):
    _, mb, client = open_mailbox()
    client.identify()
    header = client.regs.read_bytes(0, 0x80)
    caps = client.regs.read32(client.regs.mailbox_offset)
    client.regs.write_bytes(0, bytes(0x80))
    client.regs.write32(client.regs.mailbox_offset, 0x1F)
    _wait_for(lambda: client.regs.read_bytes(0, 0x80) == header and client.regs.read32(client.regs.mailbox_offset) == caps,
              "the capability registers were not re-asserted")
    fresh = MailboxClient(mb.path)  # a new client discovers the mailbox again
    assert fresh.identify()["max_message_size"] == 2048
    fresh.close()


def test_a_truncated_register_file_does_not_kill_the_device(open_mailbox):
    _, mb, client = open_mailbox()
    client.identify()
    size = os.path.getsize(mb.path)
    os.truncate(mb.path, 0)  # another process ftruncate()s the file (SIGBUS on the next touch)
    _wait_for(lambda: os.path.getsize(mb.path) == size, "the device did not restore its register file")
    assert client.identify()["component_type"] == P.COMPONENT_TYPE_TYPE3


def test_a_held_mailbox_lock_is_a_clear_error_not_a_hang(open_mailbox):
    import fcntl
    _, mb, client = open_mailbox()
    client.identify()
    other = os.open(mb.path, os.O_RDWR)  # another process holds the lock (stopped mid-command)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        waiting = MailboxClient(mb.path, lock_timeout=0.2)
        with pytest.raises(MailboxTimeout, match="held the mailbox lock"):
            waiting.identify()
        waiting.close()
    finally:
        os.close(other)
    assert client.identify()


def test_a_stale_register_file_is_refused_at_once_and_reclaimed_at_the_next_start(make_device, tmp_path):
    import subprocess
    import sys
    from cxlhm.mailbox import registers as R
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has exited
    folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    stale = os.path.join(folder, f"cxlhm-{pid}-stale.regs")
    R.RegisterFile.create(stale).close()  # what a killed device process leaves behind
    started = time.monotonic()
    with pytest.raises(R.StaleRegisterFile, match=f"process {pid} is gone"):
        MailboxClient(stale)
    assert time.monotonic() - started < 5  # refused at once, not after the ready timeout
    mb = Mailbox(make_device()).start()  # the next start reclaims it
    assert not os.path.exists(stale)
    mb.close()
    assert not os.path.exists(mb.path)  # and removes its own at close
