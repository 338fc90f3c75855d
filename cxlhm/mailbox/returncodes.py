"""Mailbox return codes (CXL r3.1 §8.2.8.4.5.1) and the exception handlers raise to answer one.

The numbers are the spec's, so a host written against the spec reads our status
register without a translation table. Codes this device never produces are listed
anyway: the host decodes whatever it finds in the register, including after abuse.
"""
from __future__ import annotations

from enum import IntEnum


class ReturnCode(IntEnum):
    SUCCESS = 0x00
    BACKGROUND_STARTED = 0x01
    INVALID_INPUT = 0x02
    UNSUPPORTED = 0x03
    INTERNAL_ERROR = 0x04
    RETRY_REQUIRED = 0x05
    BUSY = 0x06
    MEDIA_DISABLED = 0x07
    FW_TRANSFER_IN_PROGRESS = 0x08
    FW_TRANSFER_OUT_OF_ORDER = 0x09
    FW_VERIFICATION_FAILED = 0x0A
    INVALID_SLOT = 0x0B
    ACTIVATION_FAILED_ROLLED_BACK = 0x0C
    ACTIVATION_FAILED_COLD_RESET = 0x0D
    INVALID_HANDLE = 0x0E
    INVALID_PHYSICAL_ADDRESS = 0x0F
    INJECT_POISON_LIMIT_REACHED = 0x10
    PERMANENT_MEDIA_FAILURE = 0x11
    ABORTED = 0x12
    INVALID_SECURITY_STATE = 0x13
    INCORRECT_PASSPHRASE = 0x14
    UNSUPPORTED_MAILBOX = 0x15
    INVALID_PAYLOAD_LENGTH = 0x16
    INVALID_LOG = 0x17
    INTERRUPTED = 0x18
    UNSUPPORTED_FEATURE_VERSION = 0x19
    UNSUPPORTED_FEATURE_SELECTION = 0x1A
    FEATURE_TRANSFER_IN_PROGRESS = 0x1B
    FEATURE_TRANSFER_OUT_OF_ORDER = 0x1C
    RESOURCES_EXHAUSTED = 0x1D
    INVALID_EXTENT_LIST = 0x1E
    TRANSFER_OUT_OF_ORDER = 0x1F
    REQUEST_ABORT_NOT_SUPPORTED = 0x20

    @classmethod
    def name_of(cls, value: int) -> str:
        """The code's name, or RESERVED_0xNN for a number the spec does not define."""
        try:
            return cls(value).name
        except ValueError:
            return f"RESERVED_{value:#06x}"


class CommandFailed(Exception):
    """Raised by a command handler to end the command with `rc`.

    `ext_status` goes to the vendor-specific extended status field [63:48] of the
    mailbox status register; hint commands put the index of the first rejected
    batch entry there so the host can say which entry was wrong.
    """

    def __init__(self, rc: ReturnCode, message: str = "", ext_status: int = 0):
        self.rc = ReturnCode(rc)
        self.ext_status = ext_status & 0xFFFF
        super().__init__(message or self.rc.name)
