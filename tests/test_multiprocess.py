"""Several host processes share one device's mailbox through its register block (a
shared-memory file), while this process's firmware thread serves them.

Each client process follows the cxl_pci sequence under an flock of the register file
(the cross-process stand-in for cxl_pci's mailbox mutex), so commands never
interleave. What the tests check: no command lost or duplicated (every hint entry a
client's command reported delivered reaches the device exactly once, in order per
session), no deadlock (every client finishes), right return codes (success, hint
batches started in the background, BUSY answered to hints that meet another
process's background batch and resent by the helper, INVALID_INPUT with the bad
entry's index), and that a client killed in the middle of a command (or giving up on
one) leaves a doorbell the next client waits out (busy_timeout) instead of a wedged
mailbox.
"""
import fcntl
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cxlhm.mailbox import Mailbox, Opcode, ReturnCode
from cxlhm.mailbox import payloads as P
from cxlhm.mailbox.hints import HintKind
from device_parts import open_parts
from host_runtime.mailbox import MailboxClient, MailboxCommandError, MailboxTimeout
from hintspy import route_hints_through
from test_reliability import record_figure

REPO = Path(__file__).resolve().parent.parent
KIB = 1024
BLOCK = 4 * KIB
CAPACITY = 1 << 22  # 1024 blocks

CLIENT = r"""
import json, sys, time
from host_runtime.mailbox import MailboxClient, MailboxCommandError
path, cid, rounds, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = MailboxClient(path, timeout=30, busy_timeout=30, background_timeout=60)
executed = [0]
_execute = c.execute
def counting_execute(*a, **kw):
    executed[0] += 1
    return _execute(*a, **kw)
c.execute = counting_execute
sent = {}          # session -> [kind, ...] in the order the client sent them
def note(session, kind, n=1):
    sent.setdefault(str(session), []).extend([kind] * n)
ok = {"identify": 0, "health": 0, "poison": 0, "hints": 0, "invalid": 0, "background": 0}
serial = None
for r in range(rounds):
    s = cid * 1_000_000 + r + 1
    ident = c.identify()
    assert ident["component_type"] == 3
    assert serial in (None, ident["serial"]); serial = ident["serial"]; ok["identify"] += 1
    assert c.health()["media_status"] == 0; ok["health"] += 1
    assert c.poison(0, 1 << 20)["records"] == []; ok["poison"] += 1
    # a resume over many blocks: started in the background (background_min_blocks is small)
    ranges = [((cid * 256 + (r * 7 + i) % 200) * block, block) for i in range(12)]
    receipt = c.hints.session_resume(s, ranges)
    note(s, 1, 12); ok["hints"] += 1; ok["background"] += receipt.background
    c.hints.next_prefix(s, [(cid * 256 * block, 2 * block)], deadline_ns=1_000_000); note(s, 2)
    c.hints.append(s, [((cid * 256 + 201) * block, block)]); note(s, 3)
    c.hints.session_pause(s, expected_pause_ns=5_000); note(s, 4)
    if r % 5 == 0:  # a batch with a bad entry: rejected whole, the index named
        try:
            c.hints.append(s, [(0, block), (1 << 40, block)])
            raise AssertionError("a hint outside the window was accepted")
        except MailboxCommandError as exc:
            assert exc.rc_name == "INVALID_INPUT" and exc.entry == 1, exc
            ok["invalid"] += 1
    c.hints.session_end(s); note(s, 5)
    ok["hints"] += 4
print(json.dumps({"sent": sent, "ok": ok, "busy_waits": c.busy_waits, "executed": executed[0]}))
"""


class HintLog:
    """Stands in for Device.hint in front of the real one: records every delivery."""

    def __init__(self, real, delay_s=0.0):
        self.real, self.delay_s = real, delay_s
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.entered = threading.Event()
        self.gate: threading.Event | None = None  # when set: each hint waits for it to open

    def __call__(self, kind, session, first_block, n_blocks, arg=0):
        self.entered.set()
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.gate is not None:
            self.gate.wait(60)
        with self.lock:
            self.calls.append((int(kind), int(session)))
        return self.real(kind, session, first_block, n_blocks, arg)


@pytest.fixture
def served(tmp_path):
    """A device and its mailbox served by this process's firmware thread; the hint
    deliveries recorded."""
    made = []

    def factory(policy="hymcache", delay_s=0.0, **mailbox_options):
        dev, device = open_parts({"capacity": CAPACITY, "block_size": BLOCK, "dram_bytes": 64 * BLOCK,
                                  "backend": {"path": str(tmp_path / f"mp{len(made)}.img")},
                                  "firmware": {"policy": policy}})
        log = HintLog(device.hint, delay_s)
        route_hints_through(device, log)
        mb = Mailbox(device, **{"background_min_blocks": 8, "background_step_blocks": 2, **mailbox_options}).start()
        MailboxClient(mb, timeout=60).identify()  # ready (kernels compiled) before clients arrive
        made.append((dev, mb))
        return dev, mb, log

    yield factory
    for dev, mb in made:
        mb.close()
        dev.close()


def _spawn(path, cid, rounds):
    return subprocess.Popen([sys.executable, "-c", CLIENT, path, str(cid), str(rounds), str(BLOCK)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def test_client_processes_lose_no_command_and_keep_each_sessions_order(served):
    dev, mb, log = served()
    clients, rounds = 4, 6
    before = mb.commands_serviced
    start = time.monotonic()
    procs = [_spawn(mb.path, cid, rounds) for cid in range(clients)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)  # a deadlock shows here
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    elapsed = time.monotonic() - start
    mb_client = MailboxClient(mb, timeout=30)
    mb_client.wait_background()
    delivered: dict[int, list[int]] = {}
    with log.lock:
        for kind, session in log.calls:
            delivered.setdefault(session, []).append(kind)
    sent = {int(s): kinds for r in results for s, kinds in r["sent"].items()}
    assert set(delivered) == set(sent), "hints of a session went missing, or a session appeared from nowhere"
    for session, kinds in sent.items():
        assert delivered[session] == kinds, f"session {session}: sent {kinds}, the device saw {delivered[session]}"
    commands = sum(r["executed"] for r in results)
    assert mb.commands_serviced - before == commands  # every command rung was answered, once
    assert sum(r["ok"]["background"] for r in results) > 0  # the background path was taken
    assert sum(r["ok"]["invalid"] for r in results) == clients * len(range(0, rounds, 5))
    record_figure("concurrency", "mailbox_processes", "clients_no_lost_command", clients)
    record_figure("concurrency", "mailbox_processes", "commands", mb.commands_serviced - before)
    record_figure("concurrency", "mailbox_processes", "hint_entries_delivered_exactly_once",
                  sum(len(k) for k in sent.values()))
    print(f"\n{clients} client processes, {mb.commands_serviced - before} commands in {elapsed:.1f} s, "
          f"{sum(len(k) for k in sent.values())} hint entries delivered exactly once, busy waits "
          f"{sum(r['busy_waits'] for r in results)}")


def test_a_client_killed_in_the_middle_of_a_command_does_not_wedge_the_mailbox(served):
    dev, mb, log = served(policy="lru", delay_s=0.5)
    # the victim rings a slow hint (0.5 s in the firmware) and dies while it waits
    victim = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from host_runtime.mailbox import MailboxClient\n"
         "c = MailboxClient(sys.argv[1], timeout=60)\n"
         "c.hints.session_end(424242)\n", mb.path], cwd=REPO)
    assert log.entered.wait(60), "the victim's command never reached the firmware"
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    # its command is still running, the doorbell still set; the flock went with the victim
    regs = MailboxClient(mb.path).regs
    assert regs.doorbell
    strict = MailboxClient(mb.path)  # cxl_pci: -EBUSY at once
    with pytest.raises(MailboxCommandError) as err:
        strict.identify()
    assert err.value.rc_name == "BUSY"
    patient = MailboxClient(mb.path, busy_timeout=10)  # waits the abandoned command out, then runs
    assert patient.identify()["component_type"] == 3
    assert patient.busy_waits == 1
    assert (HintKind.SESSION_END, 424242) in log.calls  # the dead host's command still ran, once
    assert log.calls.count((HintKind.SESSION_END, 424242)) == 1
    for c in (strict, patient):
        c.close()
    regs.close()
    record_figure("concurrency", "mailbox_processes", "killed_mid_command_recovered", 1)


def _held_by_another_process(path) -> bool:
    """Whether some other process holds the register file's flock (a client mid-command)."""
    with open(path, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def test_a_client_that_gave_up_leaves_the_doorbell_to_the_next_one(served):
    dev, mb, log = served(policy="lru")
    log.gate = threading.Event()  # the quitter's hint stays in the firmware until the next client is in
    quitter = MailboxClient(mb.path, timeout=0.05)  # like cxl_pci after its 2 s timeout
    with pytest.raises(MailboxTimeout):
        quitter.hints.session_end(7)
    other = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, json; from host_runtime.mailbox import MailboxClient\n"
         "c = MailboxClient(sys.argv[1], timeout=30, busy_timeout=30)\n"
         "print(json.dumps([c.identify()['component_type'], c.busy_waits]))\n", mb.path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 120
    while not _held_by_another_process(mb.path) and other.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    log.gate.set()  # the next client holds the lock and found the doorbell still rung
    out, err = other.communicate(timeout=120)
    assert other.returncode == 0, err[-2000:]
    assert json.loads(out) == [3, 1]
    quitter.close()


def test_background_batches_of_one_process_make_another_resend_not_fail(served):
    """A hint that meets another process's background batch is answered BUSY; the
    helper waits for that batch and resends, so it is neither lost nor reordered."""
    dev, mb, log = served(policy="lru", delay_s=0.003, background_min_blocks=4, background_step_blocks=1)
    big = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from host_runtime.mailbox import MailboxClient\n"
         "c = MailboxClient(sys.argv[1], timeout=30, busy_timeout=30)\n"
         "for r in range(6):\n"
         "    c.hints.session_resume(900 + r, [(i * 4096, 4096) for i in range(40)])\n", mb.path], cwd=REPO)
    client = MailboxClient(mb.path, timeout=30, busy_timeout=30)
    busy_seen = sent = 0
    deadline = time.monotonic() + 120
    # raw commands for as long as the other process runs (its start-up takes seconds on a
    # loaded machine), so they meet its background batches whatever the machine's speed
    while big.poll() is None and time.monotonic() < deadline:
        reply = client.execute(Opcode.HINT_SESSION_END,
                               P.encode_hint_batch(np.array([(5000 + sent % 1000,)], P.SESSION_ENTRY)))
        busy_seen += reply.rc == ReturnCode.BUSY
        if sent < 40:
            client.hints.session_end(6000 + sent)  # the helper: never fails with BUSY
        sent += 1
        time.sleep(0.002)
    for i in range(sent, 40):
        client.hints.session_end(6000 + i)
    assert big.wait(120) == 0
    client.wait_background()
    ends = [s for k, s in log.calls if k == HintKind.SESSION_END]
    assert sorted(s for s in ends if s >= 6000) == list(range(6000, 6040))
    resumes = [s for k, s in log.calls if k == HintKind.SESSION_RESUME]
    assert all(resumes.count(900 + r) == 40 for r in range(6))
    assert busy_seen > 0  # the raw command did meet the other process's background batch
    client.close()
