"""The firmware side of the mailbox: a thread that services the doorbell.

Why a thread (and not a synchronous call from the host): the registers live in a
shared-memory file, and a host in another process can only talk to the device
the way a driver talks to a card — write registers and wait. So the firmware
polls the doorbell like a device's microcontroller would, with a short poll
interval after activity and a longer one when idle (at most `idle_poll_s`).
In-process hosts also `kick()` the thread after ringing, which stands in for
the doorbell write trap of real hardware and removes the polling latency.

Servicing one command:
  1. snapshot the command register and the input payload (the host may scribble
     on the registers afterwards; the firmware never rereads them);
  2. dispatch through the command table (commands.py): unknown opcode ->
     UNSUPPORTED, wrong length -> INVALID_PAYLOAD_LENGTH, handler exceptions ->
     their return code, anything unexpected -> INTERNAL_ERROR (logged);
  3. if the command register changed while the command ran, the host wrote a
     new command without waiting for the doorbell to clear: answer BUSY;
  4. write the output payload, the output length (command register [36:16]) and
     the status register, and clear the doorbell last.
Between commands the thread advances the running background operation one step.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref

from cxlhm.mailbox import registers as R
from cxlhm.mailbox.background import BackgroundRunner, BackgroundStarted
from cxlhm.mailbox.commands import COMMANDS
from cxlhm.mailbox.context import CommandContext
from cxlhm.mailbox.returncodes import CommandFailed, ReturnCode

log = logging.getLogger("cxlhm.mailbox")

ACTIVE_POLL_S = 0.0002


def _shutdown(stop: threading.Event, wake: threading.Event, threads: list, regs: R.RegisterFile) -> None:
    stop.set()
    wake.set()
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join()
    if not regs.closed:
        regs.memdev_status = R.encode_memdev_status(media=R.MEDIA_DISABLED, mailbox_ready=False)
        regs.close()


class Mailbox:
    """The device's primary mailbox. ``Mailbox(device).start()``; ``close()`` when done.

    `path`: where the register file goes (default: a fresh file under /dev/shm,
    removed on close; a given path is left in place). Hosts connect with
    ``host_runtime.mailbox.MailboxClient(mailbox)`` in-process or
    ``MailboxClient(mailbox.path)`` from anywhere on the machine.
    """

    def __init__(self, device, path: str | os.PathLike | None = None, *,
                 payload_size_log2: int = R.DEFAULT_PAYLOAD_LOG2,
                 background_min_blocks: int = 1024, background_step_blocks: int = 256,
                 idle_poll_s: float = 0.005):
        self.device = device
        self.regs = R.RegisterFile.create(path, payload_size_log2)
        self.path = self.regs.path
        self.payload_size = self.regs.payload_size
        self.background = BackgroundRunner(self.regs)
        self.context = CommandContext(
            device=device, payload_size=self.payload_size, background=self.background,
            commands=COMMANDS,
            background_min_blocks=max(0, background_min_blocks),
            background_step_blocks=max(1, background_step_blocks))
        self.idle_poll_s = idle_poll_s
        self.commands_serviced = 0
        self.registers_restored = 0  # times a host had written what the device owns (or truncated the file)
        self.last_error: str | None = None  # why the last failed command failed (for debugging)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._completed = threading.Condition()
        self._threads: list[threading.Thread] = []  # a box, so the finalizer sees the thread started later
        # Runs on close() or at interpreter exit, whichever comes first; it must not
        # hold `self`, only what it stops and releases.
        self._shutdown = weakref.finalize(self, _shutdown, self._stop, self._wake, self._threads, self.regs)

    # ------------------------------------------------------------ lifetime
    def start(self) -> "Mailbox":
        if not self._threads and not self.regs.closed:
            thread = threading.Thread(target=self._run, name=f"cxlhm-mailbox-{os.path.basename(self.path)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def close(self) -> None:
        """Stop the firmware thread, mark the mailbox not ready, release the file."""
        self._shutdown()

    @property
    def closed(self) -> bool:
        return self.regs.closed

    def __enter__(self) -> "Mailbox":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ in-process doorbell
    def kick(self) -> None:
        """Tell the firmware the doorbell was just rung (saves the poll latency)."""
        self._wake.set()

    @property
    def completions(self) -> int:
        return self.commands_serviced

    def wait_for_completion(self, seen: int, timeout: float) -> bool:
        """Block until more than `seen` commands have completed, or `timeout` passes."""
        with self._completed:
            return self._completed.wait_for(lambda: self.commands_serviced > seen, timeout)

    # ------------------------------------------------------------ the firmware thread
    def _media_status(self) -> int:
        return R.MEDIA_READY if self.context.media_ready else R.MEDIA_DISABLED

    def _run(self) -> None:
        self._warm_up()
        regs = self.regs
        regs.memdev_status = R.encode_memdev_status(media=self._media_status(), mailbox_ready=True)
        poll = ACTIVE_POLL_S
        while not self._stop.is_set():
            media = self._media_status()
            # The device owns its size, capability registers and status: a host that
            # truncated the file or wrote them gets them back before anything is read.
            if regs.reassert(R.encode_memdev_status(media=media, mailbox_ready=True)):
                self.registers_restored += 1
            if regs.doorbell:
                self._service_one()
                poll = ACTIVE_POLL_S
            elif self.background.running:
                self.background.step()
                poll = ACTIVE_POLL_S
            else:
                self._wake.wait(poll)
                self._wake.clear()
                poll = min(poll * 2, self.idle_poll_s)

    def _warm_up(self) -> None:
        """Compile what hint commands run before declaring the mailbox ready, so the
        first hint is not answered after a numba compile longer than a host timeout."""
        try:
            self.device.warm_up()
        except Exception:  # only a latency optimisation; the first hint compiles anyway
            log.warning("device warm-up failed; first commands may be slow", exc_info=True)

    def _service_one(self) -> None:
        regs = self.regs
        raw_command = regs.command
        opcode, length = R.decode_command(raw_command)
        payload = regs.read_payload(length)
        rc, out, ext = self._execute(opcode, length, payload)
        if regs.command != raw_command:
            rc, out, ext = ReturnCode.BUSY, b"", 0
            self.last_error = "the command register changed while the command ran (doorbell rung while busy)"
            raw_command = regs.command
            opcode = raw_command & 0xFFFF
        if out:
            regs.write_payload(out)
        regs.command = R.encode_command(opcode, len(out))
        regs.status = R.encode_status(rc, background=self.background.running, ext=ext)
        # counted before the doorbell clears: a host that saw it clear finds the command
        # counted (it polls the doorbell; the count only paces its waits)
        with self._completed:
            self.commands_serviced += 1
        regs.clear_doorbell()
        with self._completed:
            self._completed.notify_all()

    def _execute(self, opcode: int, length: int, payload: bytes) -> tuple[ReturnCode, bytes, int]:
        command = COMMANDS.get(opcode)
        try:
            if command is None:
                raise CommandFailed(ReturnCode.UNSUPPORTED, f"opcode {opcode:#06x} is not supported")
            if length > self.payload_size or (command.input_size is not None and length != command.input_size):
                raise CommandFailed(ReturnCode.INVALID_PAYLOAD_LENGTH,
                                    f"{command.name}: input length {length}, expected "
                                    f"{command.input_size if command.input_size is not None else f'<= {self.payload_size}'}")
            if command.needs_media and not self.context.media_ready:
                raise CommandFailed(ReturnCode.MEDIA_DISABLED, f"{command.name}: the device is closed")
            result = command.handler(self.context, payload)
        except CommandFailed as exc:
            self.last_error = str(exc)
            return exc.rc, b"", exc.ext_status
        except Exception as exc:  # a handler bug must not take the firmware down
            log.exception("mailbox command %#06x failed", opcode)
            self.last_error = f"internal error: {exc!r}"
            return ReturnCode.INTERNAL_ERROR, b"", 0
        if isinstance(result, BackgroundStarted):
            return ReturnCode.BACKGROUND_STARTED, b"", 0
        out = bytes(result)
        if len(out) > self.payload_size:
            log.error("mailbox command %#06x produced %d bytes for a %d-byte payload", opcode, len(out), self.payload_size)
            self.last_error = "internal error: output larger than the payload area"
            return ReturnCode.INTERNAL_ERROR, b"", 0
        return ReturnCode.SUCCESS, out, 0
