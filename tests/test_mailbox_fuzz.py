"""Untrusted input: random opcodes, lengths, payloads and doorbell abuse thrown at the
mailbox. Every command must end with a spec return code, the firmware must never
crash or hang, and the bytes stored on the device must not change."""
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firmware_policies
from cxlhm.mailbox import Mailbox, Opcode, ReturnCode
from cxlhm.mailbox import payloads as P
from cxlhm.mailbox import registers as R
from cxlhm.mailbox.commands import COMMANDS
from host_runtime.driver import open_device
from host_runtime.mailbox import MailboxClient, MailboxCommandError

KIB = 1024
CAPACITY = 1 << 20
BLOCK = 4 * KIB
SPEC_CODES = {int(rc) for rc in ReturnCode}
HINT_OPCODES = sorted(P.HINT_ENTRY_FORMATS)
HANG_S = 30.0  # generous: a policy's first PIN or prefetch may compile numba kernels

# Values that sit on the edges the device must check: block and window boundaries,
# the int64/uint64 limits where conversions overflow.
EDGES = [0, 1, BLOCK - 1, BLOCK, CAPACITY - BLOCK, CAPACITY - 1, CAPACITY, CAPACITY + 1,
         2**63 - 1, 2**63, 2**64 - 1]
u64 = st.one_of(st.sampled_from(EDGES), st.integers(0, CAPACITY), st.integers(0, 2**64 - 1))


@st.composite
def hint_command(draw):
    """A hint batch: all valid (so hints really reach the policy and the background
    path runs), valid but for one entry, or wild; header fields mostly right, and
    sometimes a wrong version, flags, count or a truncated tail."""
    opcode = draw(st.sampled_from(HINT_OPCODES))
    fmt = P.HINT_ENTRY_FORMATS[opcode]
    mode = draw(st.sampled_from(["valid", "valid", "one bad", "wild"]))
    n = draw(st.integers(0 if mode != "one bad" else 1, 12))
    bad = draw(st.integers(0, n - 1)) if mode == "one bad" else -1
    entries = np.zeros(n, fmt)
    for i in range(n):
        if mode == "wild" or i == bad:
            for name in fmt.names:
                entries[name][i] = draw(u64)
        else:
            hpa = draw(st.integers(0, CAPACITY - 1))
            valid = {"session": draw(st.integers(1, 50)), "hpa": hpa, "length": draw(st.integers(1, CAPACITY - hpa)),
                     "deadline_ns": draw(st.integers(0, 10**9)), "expected_pause_ns": draw(st.integers(0, 10**9))}
            for name in fmt.names:
                entries[name][i] = valid[name]
    version = draw(st.sampled_from([P.HINT_FORMAT_VERSION] * 8 + [0, 2, 255]))
    flags = draw(st.sampled_from([0] * 8 + [1, 0x80]))
    reserved = draw(st.sampled_from([0] * 8 + [1]))
    count = (n + draw(st.sampled_from([0] * 8 + [1, -1, 1 << 20]))) % (1 << 32)
    payload = P.HINT_HEADER.pack(version, flags, reserved, count) + entries.tobytes()
    trim = draw(st.sampled_from([0] * 8 + [1, 7]))
    return ("command", opcode, payload[:len(payload) - trim], None)


@st.composite
def raw_command(draw):
    """Any opcode (known ones often), any bytes, and a length field that may lie."""
    opcode = draw(st.one_of(st.sampled_from(sorted(COMMANDS)), st.integers(0, 0xFFFF)))
    payload = draw(st.one_of(st.binary(max_size=64), st.binary(max_size=2048)))
    length = draw(st.one_of(st.none(), st.sampled_from([0, 1, 8, 16, 24, 2048, 2049]),
                            st.integers(0, R.PAYLOAD_LENGTH_MAX)))
    return ("command", opcode, payload, length)


@st.composite
def doorbell_abuse(draw):
    """Register writes a broken host might make: ring with garbage, clear the doorbell
    itself, rewrite the command or payload while the device works, ring twice."""
    steps = draw(st.lists(st.tuples(st.sampled_from(["ring", "clear", "command", "payload", "kick"]),
                                    st.integers(0, 2**64 - 1), st.binary(max_size=64)), min_size=1, max_size=6))
    return ("abuse", steps)


fuzz_input = st.one_of(hint_command(), raw_command(), doorbell_abuse())


def _wait_doorbell_clear(regs) -> None:
    deadline = time.monotonic() + HANG_S
    while regs.doorbell:
        assert time.monotonic() < deadline, "the firmware never cleared the doorbell (hang)"
        time.sleep(0.0002)


class MailboxFuzz:
    """A device holding 1 MiB of known bytes (most of it on the SSD behind 16 KiB of
    DRAM), its mailbox and a client; `check(case)` throws one case at it,
    `check_after()` checks what must hold once the fuzzing stops."""

    def __init__(self, policy: str, folder):
        self.dev = open_device({"capacity": CAPACITY, "block_size": BLOCK, "dram_bytes": 4 * BLOCK,
                                "backend": {"path": str(folder / "ssd.img")}, "firmware": {"policy": policy}})
        # small thresholds so the background path is exercised too
        self.mailbox = Mailbox(self.dev, background_min_blocks=8, background_step_blocks=2).start()
        self.client = MailboxClient(self.mailbox, timeout=HANG_S, background_timeout=HANG_S)
        self.stored = np.random.default_rng(5).integers(0, 256, CAPACITY, np.uint8)
        self.dev.write_from(0, self.stored)

    def __enter__(self) -> "MailboxFuzz":
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.mailbox.close()
        self.dev.close()

    def check(self, case) -> None:
        client, regs, mailbox = self.client, self.client.regs, self.mailbox
        if case[0] == "command":
            _, opcode, payload, length = case
            reply = client.execute(opcode, payload, length=length)
            assert reply.rc in SPEC_CODES
            assert len(reply.output) <= client.payload_size
            if reply.rc not in (ReturnCode.SUCCESS, ReturnCode.BACKGROUND_STARTED):
                assert reply.output == b""
            if opcode not in COMMANDS:
                assert reply.rc in (ReturnCode.UNSUPPORTED, ReturnCode.BUSY)
        else:
            for what, value, data in case[1]:
                if what == "ring":
                    regs.command = value
                    regs.set_doorbell()
                elif what == "clear":
                    regs.clear_doorbell()
                elif what == "command":
                    regs.command = value
                elif what == "payload":
                    regs.write_payload(data)
                else:
                    mailbox.kick()
            mailbox.kick()
            _wait_doorbell_clear(regs)
        assert R.decode_status(regs.status)[0] in SPEC_CODES
        assert R.decode_background(regs.background_status)[2] in SPEC_CODES

    def check_after(self) -> None:
        client, dev = self.client, self.dev
        _wait_doorbell_clear(client.regs)
        try:
            client.wait_background()
        except MailboxCommandError as exc:  # a background batch may end in an error code
            assert int(exc.rc) in SPEC_CODES
        assert self.mailbox._threads[0].is_alive(), "the firmware thread died"
        for _ in range(3):  # a last abused command may still answer BUSY once
            reply = client.execute(Opcode.IDENTIFY)
            if reply.rc == ReturnCode.SUCCESS:
                break
        assert reply.rc == ReturnCode.SUCCESS
        back = np.empty(CAPACITY, np.uint8)
        dev.read_into(0, back)
        assert np.array_equal(back, self.stored), "a mailbox command changed stored bytes"
        dev.write_from(0, self.stored[:BLOCK][::-1].copy())  # and the device still takes writes
        assert dev.load(0, BLOCK) == self.stored[:BLOCK][::-1].tobytes()


def _run_fuzz(policy: str, tmp_path, max_examples: int) -> None:
    with MailboxFuzz(policy, tmp_path) as world:
        @settings(max_examples=max_examples, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(fuzz_input)
        def throw(case):
            world.check(case)

        throw()
        world.check_after()


def test_fuzz_mailbox_lru(tmp_path):
    _run_fuzz("lru", tmp_path, max_examples=250)


@pytest.mark.parametrize("policy", [p for p in firmware_policies.available()
                                    if not getattr(firmware_policies.get(p), "needs_future", False)])
@pytest.mark.slow
def test_fuzz_mailbox_every_policy(policy, tmp_path):
    _run_fuzz(policy, tmp_path, max_examples=1500)
