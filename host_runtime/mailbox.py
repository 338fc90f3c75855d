"""Host side of the CXL mailbox: send commands the way Linux's cxl_pci does, and the
request-lifecycle hint helpers.

    client = MailboxClient(mailbox)            # in-process (a cxlhm.mailbox.Mailbox)
    client = MailboxClient("/dev/shm/cxlhm-….regs")   # any process on the machine
    client.identify(); client.health(); client.log("cel"); client.poison()
    client.hints.session_resume(7, [(0, 1 << 20)])
    client.hints.session_end(7)

Every command follows cxl_pci's sequence: check that the doorbell is clear (else
BUSY, like its -EBUSY), write the command register (opcode, input length), write
the input payload, set the doorbell, wait for the device to clear it (timeout:
2 s, cxl_pci's), read the return code from the status register, then the output
length from the command register, then the output payload. A return code other
than success / background-started raises MailboxCommandError naming the code.

Hint helpers batch their entries into as few commands as the payload area allows.
A batch the device runs in the background (a big SESSION_RESUME / NEXT_PREFIX)
returns at once; a later hint command that meets it is answered BUSY by the
device, and the helper waits for the background command and resends, so hints
stay in order. Pass ``wait=True`` to block until the background delivery ends.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np

from cxlhm.mailbox import payloads as P
from cxlhm.mailbox import registers as R
from cxlhm.mailbox.opcodes import Opcode
from cxlhm.mailbox.returncodes import ReturnCode

COMMAND_TIMEOUT_S = 2.0        # cxl_pci's mailbox timeout
READY_TIMEOUT_S = 60.0         # cxl_pci waits this long for "mailbox interface ready"
BACKGROUND_TIMEOUT_S = 60.0
LOCK_TIMEOUT_S = 10.0          # another host's command: its own timeouts end it well before this


class MailboxError(RuntimeError):
    """Anything that went wrong talking to the mailbox."""


class MailboxTimeout(MailboxError):
    pass


class MailboxCommandError(MailboxError):
    """The device answered with a return code other than success.

    `rc` (ReturnCode or int), `rc_name`, `opcode`, `ext_status` (vendor extended
    status) and, for rejected hint entries, `entry`: the index within the entries
    the helper was given."""

    def __init__(self, opcode: int, rc: int, ext_status: int = 0, entry: int | None = None, detail: str = ""):
        self.opcode, self.ext_status, self.entry = opcode, ext_status, entry
        self.rc = ReturnCode(rc) if rc in ReturnCode._value2member_map_ else rc
        self.rc_name = ReturnCode.name_of(rc)
        where = f", entry {entry}" if entry is not None else ""
        super().__init__(f"{Opcode.name_of(opcode)}: {self.rc_name} ({rc:#x}){where}" + (f": {detail}" if detail else ""))


@dataclasses.dataclass(frozen=True)
class Reply:
    rc: int
    output: bytes
    ext_status: int
    background_running: bool


@dataclasses.dataclass(frozen=True)
class HintReceipt:
    """What a hint helper did: mailbox commands sent, entries sent, and entries the
    device reported it did not follow (e.g. a PIN that would leave no DRAM for
    misses). Entries of a background batch count as declined only when waited for."""
    commands: int = 0
    entries: int = 0
    declined: int = 0
    background: bool = False  # a batch is (or was) delivered by a background command


@dataclasses.dataclass(frozen=True)
class BackgroundStatus:
    opcode: int
    percent: int
    rc: int
    ext_status: int
    running: bool


class MailboxClient:
    def __init__(self, target: Any, *, timeout: float = COMMAND_TIMEOUT_S, ready_timeout: float = READY_TIMEOUT_S,
                 background_timeout: float = BACKGROUND_TIMEOUT_S, busy_timeout: float = 0.0,
                 lock_timeout: float = LOCK_TIMEOUT_S):
        """`target`: a register-file path, or an in-process cxlhm.mailbox.Mailbox
        (then the client also nudges its firmware thread instead of being polled).

        `busy_timeout`: how long to wait for a doorbell that is still set when a command
        starts. The doorbell can only be set then if another host gave up on its command
        (timed out) or died in the middle of one (its flock went with it): the firmware
        still runs that command and clears the doorbell. 0 (the default) answers BUSY at
        once, as cxl_pci does (-EBUSY); hosts sharing the mailbox across processes pass a
        few seconds, and the sequence restarts once the doorbell is clear."""
        self._local = None if isinstance(target, (str, os.PathLike)) else target
        self.regs = R.RegisterFile.attach(target if self._local is None else target.path)
        self.payload_size = self.regs.payload_size
        self.timeout, self.ready_timeout, self.background_timeout = timeout, ready_timeout, background_timeout
        self.busy_timeout = busy_timeout
        self.lock_timeout = lock_timeout  # the longest wait for another process's command (its flock)
        self.busy_waits = 0  # commands that found the doorbell set and waited for it (busy_timeout > 0)
        self._lock = threading.Lock()
        self.hints = HintClient(self)

    # ------------------------------------------------------------ the cxl_pci sequence
    def execute(self, opcode: int, payload: bytes | bytearray | memoryview = b"", *, length: int | None = None) -> Reply:
        """Run one command and return what the device answered, whatever the return
        code. `length` overrides the input length written to the command register
        (for testing the device's checks); it defaults to len(payload)."""
        payload = bytes(payload)
        if len(payload) > self.payload_size:
            raise ValueError(f"{len(payload)}-byte payload does not fit the {self.payload_size}-byte payload area")
        if not 0 <= opcode <= 0xFFFF:
            raise ValueError(f"opcode must be 0..0xFFFF, got {opcode:#x}")
        length = len(payload) if length is None else length
        if not 0 <= length <= R.PAYLOAD_LENGTH_MAX:
            raise ValueError(f"length must fit the 21-bit field, got {length}")
        regs = self.regs
        with self._lock:
            self._check_open()
            self._lock_across_processes(opcode)  # one command at a time across processes
            try:
                self._wait_ready()
                if regs.doorbell:
                    self._wait_busy_doorbell(opcode)
                regs.command = R.encode_command(opcode, length)
                regs.write_payload(payload)
                seen = self._local.completions if self._local is not None else 0
                regs.set_doorbell()
                if self._local is not None:
                    self._local.kick()
                self._wait_doorbell_clear(opcode, seen)
                rc, background, ext = R.decode_status(regs.status)
                _, out_len = R.decode_command(regs.command)
                output = regs.read_payload(min(out_len, self.payload_size))
            finally:
                fcntl.flock(regs.fileno(), fcntl.LOCK_UN)
        return Reply(rc, output, ext, background)

    def send(self, opcode: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
        """Run one command; return its output payload or raise MailboxCommandError."""
        reply = self.execute(opcode, payload)
        if reply.rc not in (ReturnCode.SUCCESS, ReturnCode.BACKGROUND_STARTED):
            raise MailboxCommandError(opcode, reply.rc, reply.ext_status)
        return reply.output

    def _lock_across_processes(self, opcode: int) -> None:
        """flock the register file, waiting at most lock_timeout: a host that holds it
        longer is stuck (or stopped), and this host says so instead of hanging."""
        fd = self.regs.fileno()
        deadline = time.monotonic() + self.lock_timeout
        pause = 1e-4
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MailboxTimeout(f"{Opcode.name_of(opcode)}: another process has held the mailbox lock of "
                                         f"{self.regs.path} for over {self.lock_timeout} s (is it stopped?)") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.005)

    def _check_open(self) -> None:
        if self.regs.closed:
            raise MailboxError("this mailbox client is closed")

    def _wait_ready(self) -> None:
        if self.regs.mailbox_ready:
            return
        if self.regs.media_status == R.MEDIA_DISABLED or (self._local is not None and self._local.closed):
            raise MailboxError(f"the device behind {self.regs.path} has shut its mailbox down")
        deadline = time.monotonic() + self.ready_timeout
        pause = 1e-4
        while not self.regs.mailbox_ready:
            if time.monotonic() > deadline:
                raise MailboxTimeout(f"mailbox at {self.regs.path} not ready after {self.ready_timeout} s "
                                     "(is the device's firmware running?)")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _wait_busy_doorbell(self, opcode: int) -> None:
        """The doorbell is set before this command started (another host's abandoned
        command is still running): BUSY, or wait up to busy_timeout for it to clear."""
        if self.busy_timeout <= 0:
            raise MailboxCommandError(opcode, ReturnCode.BUSY, detail="doorbell still set: a previous command has not completed")
        self.busy_waits += 1
        deadline = time.monotonic() + self.busy_timeout
        pause = 1e-4
        while self.regs.doorbell:
            if time.monotonic() > deadline:
                raise MailboxCommandError(opcode, ReturnCode.BUSY,
                                          detail=f"doorbell still set after {self.busy_timeout} s: a previous command has not completed")
            if self._local is not None:
                self._local.kick()
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _wait_doorbell_clear(self, opcode: int, seen: int) -> None:
        deadline = time.monotonic() + self.timeout
        pause = 2e-5
        while self.regs.doorbell:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MailboxTimeout(f"{Opcode.name_of(opcode)}: the device did not clear the doorbell within {self.timeout} s")
            if self._local is not None and not self._local.closed:
                self._local.wait_for_completion(seen, min(left, 0.05))
            else:
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.002)

    # ------------------------------------------------------------ background commands
    def background_status(self) -> BackgroundStatus:
        _, running, _ = R.decode_status(self.regs.status)
        opcode, percent, rc, ext = R.decode_background(self.regs.background_status)
        return BackgroundStatus(opcode, percent, rc, ext, running)

    def wait_background(self, timeout: float | None = None) -> BackgroundStatus:
        """Poll until no background command runs; raise if the last one failed."""
        deadline = time.monotonic() + (self.background_timeout if timeout is None else timeout)
        pause = 1e-4
        while True:
            status = self.background_status()
            if not status.running:
                break
            if time.monotonic() > deadline:
                raise MailboxTimeout(f"background command {Opcode.name_of(status.opcode)} still at {status.percent}%")
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        if status.rc != ReturnCode.SUCCESS:
            raise MailboxCommandError(status.opcode, status.rc, status.ext_status, detail="background command failed")
        return status

    # ------------------------------------------------------------ standard commands
    def identify(self) -> dict:
        return P.decode_identify(self.send(Opcode.IDENTIFY))

    def identify_memory_device(self) -> dict:
        return P.decode_identify_memory_device(self.send(Opcode.IDENTIFY_MEMORY_DEVICE))

    def identify_hybrid(self) -> dict:
        return P.decode_identify_hybrid(self.send(Opcode.IDENTIFY_HYBRID))

    def health(self) -> dict:
        return P.decode_health(self.send(Opcode.GET_HEALTH_INFO))

    def supported_logs(self) -> list[dict]:
        return P.decode_supported_logs(self.send(Opcode.GET_SUPPORTED_LOGS))

    def log(self, uuid_or_name: str | uuid.UUID = "cel") -> Any:
        """A whole log, read in payload-sized pieces. The Command Effects Log ("cel")
        comes back decoded (a list of {opcode, name, effects}); other logs as bytes."""
        if isinstance(uuid_or_name, uuid.UUID):
            log_id = uuid_or_name
        elif uuid_or_name.lower() in P.LOG_NAMES:
            log_id = P.LOG_NAMES[uuid_or_name.lower()]
        else:
            try:
                log_id = uuid.UUID(uuid_or_name)
            except ValueError:
                raise ValueError(f"unknown log {uuid_or_name!r}: give one of {', '.join(P.LOG_NAMES)} or a log UUID") from None
        size = next((entry["size"] for entry in self.supported_logs() if entry["uuid"] == str(log_id)), None)
        if size is None:
            raise MailboxCommandError(Opcode.GET_LOG, ReturnCode.INVALID_LOG, detail=f"the device has no log {log_id}")
        data = bytearray()
        while len(data) < size:
            piece = min(self.payload_size, size - len(data))
            data += self.send(Opcode.GET_LOG, P.GET_LOG_IN.pack(log_id.bytes, len(data), piece))
        return P.decode_cel(bytes(data)) if log_id == P.CEL_UUID else bytes(data)

    def poison(self, dpa: int = 0, length: int | None = None) -> dict:
        """The poison records in [dpa, dpa + length) (default: the whole device)."""
        if length is None:
            length = self.identify_hybrid()["capacity"] - dpa
        units = -(-length // P.POISON_UNIT)
        return P.decode_poison_list(self.send(Opcode.GET_POISON_LIST, P.POISON_IN.pack(dpa, units)))

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        self.regs.close()

    def __enter__(self) -> "MailboxClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _u64_column(values: Any, n: int, name: str) -> np.ndarray:
    """Broadcast an int or a sequence to n unsigned 64-bit values, refusing negatives."""
    try:
        arr = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
        if arr.dtype == object:
            if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0 or v >= 1 << 64 for v in arr.reshape(-1)):
                raise ValueError
            arr = arr.astype(np.uint64)
        elif arr.dtype.kind not in "ui" or (arr.dtype.kind == "i" and (arr < 0).any()):
            raise ValueError
        return np.broadcast_to(arr.astype(np.uint64), (n,))
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"{name} must be non-negative integers below 2**64 (one, or one per entry), got {values!r}") from None


def _ranges(ranges: Any) -> tuple[np.ndarray, np.ndarray]:
    """(hpa, length) columns from pairs or an (n, 2) array."""
    if isinstance(ranges, np.ndarray):
        arr = ranges
    else:
        arr = list(ranges)
        if not arr:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    try:
        arr = np.asarray(arr, dtype=object if not isinstance(arr, np.ndarray) else None)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError
    except (ValueError, TypeError):
        raise ValueError("ranges must be (hpa, length) pairs or an (n, 2) array") from None
    return _u64_column(arr[:, 0], arr.shape[0], "range hpa"), _u64_column(arr[:, 1], arr.shape[0], "range length")


class HintClient:
    """The vendor hint commands, batched. Every helper returns a HintReceipt.
    Ranges are HPA byte ranges: (hpa, length) pairs (or an (n, 2) array)."""

    def __init__(self, client: MailboxClient):
        self._client = client

    def session_resume(self, session: int, ranges: Iterable, *, wait: bool = False) -> HintReceipt:
        hpa, length = _ranges(ranges)
        return self._send(Opcode.HINT_SESSION_RESUME, session=_u64_column(session, hpa.shape[0], "session"),
                          hpa=hpa, length=length, wait=wait)

    def next_prefix(self, session: int, ranges: Iterable, deadline_ns: int = 0, *, wait: bool = False) -> HintReceipt:
        hpa, length = _ranges(ranges)
        n = hpa.shape[0]
        return self._send(Opcode.HINT_NEXT_PREFIX, session=_u64_column(session, n, "session"), hpa=hpa, length=length,
                          deadline_ns=_u64_column(deadline_ns, n, "deadline_ns"), wait=wait)

    def append(self, session: int, ranges: Iterable) -> HintReceipt:
        hpa, length = _ranges(ranges)
        return self._send(Opcode.HINT_APPEND, session=_u64_column(session, hpa.shape[0], "session"), hpa=hpa, length=length)

    def session_pause(self, sessions: int | Iterable[int], expected_pause_ns: int = 0) -> HintReceipt:
        s = np.atleast_1d(np.asarray(sessions, dtype=object))
        return self._send(Opcode.HINT_SESSION_PAUSE, session=_u64_column(s, s.shape[0], "session"),
                          expected_pause_ns=_u64_column(expected_pause_ns, s.shape[0], "expected_pause_ns"))

    def session_end(self, sessions: int | Iterable[int]) -> HintReceipt:
        s = np.atleast_1d(np.asarray(sessions, dtype=object))
        return self._send(Opcode.HINT_SESSION_END, session=_u64_column(s, s.shape[0], "session"))

    def pin(self, ranges: Iterable) -> HintReceipt:
        hpa, length = _ranges(ranges)
        return self._send(Opcode.HINT_PIN, hpa=hpa, length=length)

    def unpin(self, ranges: Iterable) -> HintReceipt:
        hpa, length = _ranges(ranges)
        return self._send(Opcode.HINT_UNPIN, hpa=hpa, length=length)

    # ------------------------------------------------------------ batching
    def _send(self, opcode: Opcode, *, wait: bool = False, **columns: np.ndarray) -> HintReceipt:
        fmt = P.HINT_ENTRY_FORMATS[opcode]
        n = next(iter(columns.values())).shape[0]
        entries = np.zeros(n, fmt)
        for name, values in columns.items():
            entries[name] = values
        per_command = P.max_hint_entries(opcode, self._client.payload_size)
        commands = declined = 0
        background = False
        for start in range(0, n, per_command):
            chunk_declined, chunk_background = self._send_one(opcode, entries[start:start + per_command], start, wait)
            commands += 1
            declined += chunk_declined
            background |= chunk_background
        return HintReceipt(commands, n, declined, background)

    def _send_one(self, opcode: Opcode, entries: np.ndarray, first_index: int, wait: bool) -> tuple[int, bool]:
        """Send one batch; returns (declined entries, ran in the background)."""
        client = self._client
        payload = P.encode_hint_batch(entries)
        deadline = time.monotonic() + client.background_timeout
        while True:
            reply = client.execute(opcode, payload)
            # BUSY: an earlier batch (maybe another host's) is still being delivered in the
            # background; wait for it and resend, so hints arrive in order. The batch may
            # have ended between the device's answer and the host reading it (the status
            # register's background bit already dropped): resend at once. (The only other
            # cause, a host rewriting the command register while ours ran, also calls for
            # a resend; hints are advisory, so a rare duplicate is harmless.)
            if reply.rc == ReturnCode.BUSY and time.monotonic() < deadline:
                if client.background_status().running:
                    try:
                        client.wait_background(max(0.0, deadline - time.monotonic()))
                    except MailboxCommandError:
                        pass  # someone else's batch failed: that is its host's business, not ours
                else:
                    time.sleep(0.0005)
                continue
            break
        if reply.rc == ReturnCode.BACKGROUND_STARTED:
            return (client.wait_background().ext_status if wait else 0), True
        if reply.rc != ReturnCode.SUCCESS:
            entry = first_index + reply.ext_status - 1 if reply.rc == ReturnCode.INVALID_INPUT and reply.ext_status else None
            raise MailboxCommandError(opcode, reply.rc, reply.ext_status, entry=entry)
        return P.decode_hint_result(reply.output)[1], False
