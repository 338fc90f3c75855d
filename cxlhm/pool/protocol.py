"""The wire format between a host and the pool service (a Unix socket, one message per
request, framed and authenticated by multiprocessing.connection; no pickling: a host's
bytes are untrusted input and are decoded with fixed layouts only).

request: op u8, tenant u32, a u64, b u64, then the payload
reply:   status i32 (0 ok, else an error code below), v1 u64, v2 u64, then the payload
         (an error's payload is its message, UTF-8)
"""
from __future__ import annotations

import enum
import struct

REQUEST = struct.Struct("<BIQQ")
REPLY = struct.Struct("<iQQ")
CHUNK_HEADER = struct.Struct("<8s32sQQQ")  # magic, fingerprint (32 B), length, xxh3-64, reserved
CHUNK_MAGIC = b"CXLHMCHK"
MAX_MESSAGE = 4 << 20  # one request or reply: larger accesses are cut by the client (bounds a host's bytes in flight)


class Op(enum.IntEnum):
    READ = 1    # tenant, offset, length -> the bytes
    WRITE = 2   # tenant, offset, (payload) -> ok
    PUT = 3     # tenant, _, (payload: a whole chunk) -> v1 = offset, v2 = generation
    FLUSH = 4   # -> v1 = blocks written
    STATS = 5   # -> JSON


class Status(enum.IntEnum):
    OK = 0
    BAD_REQUEST = 1     # malformed, unknown op
    NOT_GRANTED = 2     # the host was not given this tenant
    OUT_OF_RANGE = 3    # outside the tenant's partition
    TOO_LARGE = 4       # a chunk larger than the partition
    DEVICE_ERROR = 5    # the device failed the access (media error, poison)
    SERVICE_GONE = 6    # (host side) the service this host attached to closed, died or restarted: attach again


class PoolError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def request(op: Op, tenant: int = 0, a: int = 0, b: int = 0, payload: bytes | memoryview = b"") -> bytes:
    return REQUEST.pack(op, tenant, a, b) + bytes(payload)


def reply(status: int = Status.OK, v1: int = 0, v2: int = 0, payload: bytes = b"") -> bytes:
    return REPLY.pack(int(status), v1, v2) + payload
