"""Messages on the pool's Unix socket: a u32 length, then that many bytes; file
descriptors ride on a message's first byte (SCM_RIGHTS).

A receiver names the largest message it accepts and reads a body in pieces as it
arrives, so a peer that announces a large message and stalls holds only the bytes it
actually sent; a socket timeout (set by the caller) bounds every wait, and a `deadline`
(time.monotonic()) bounds the whole message: a peer dripping one byte just inside each
wait is cut off there too.
"""
from __future__ import annotations

import os
import socket
import struct
import time

FRAME = struct.Struct("<I")
PIECE = 1 << 20


class WireError(EOFError):
    """The peer closed, stalled past the deadline, or broke the framing."""


def send(sock: socket.socket, data: bytes | memoryview, fds: list[int] = ()) -> None:
    head = FRAME.pack(len(data))
    if fds:
        socket.send_fds(sock, [head], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(head + bytes(data) if len(data) < 65536 else head)
        if len(data) >= 65536:
            sock.sendall(data)


def _exactly(sock: socket.socket, n: int, what: str, deadline: float | None = None) -> bytearray:
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(f"the peer did not finish {what} by its deadline")
            sock.settimeout(left)
        try:
            got = sock.recv(min(PIECE, n - len(out)))
        except socket.timeout:
            raise WireError(f"the peer stalled in the middle of {what}") from None
        except OSError as exc:
            raise WireError(f"{what}: {exc.strerror or exc}") from None
        if not got:
            raise WireError(f"the peer closed the connection ({what})")
        out += got
    return out


def recv(sock: socket.socket, max_bytes: int, deadline: float | None = None) -> bytearray:
    """One message; with `deadline`, the socket's timeout is set to the time left
    before each read (the caller restores it if it wants another)."""
    (n,) = FRAME.unpack(_exactly(sock, FRAME.size, "a message's length", deadline))
    if n > max_bytes:
        raise WireError(f"a {n}-byte message; at most {max_bytes} accepted")
    return _exactly(sock, n, f"a {n}-byte message", deadline)


def recv_with_fds(sock: socket.socket, max_bytes: int, max_fds: int) -> tuple[bytearray, list[int]]:
    try:
        head, fds, _, _ = socket.recv_fds(sock, FRAME.size, max_fds)
    except socket.timeout:
        raise WireError("the peer stalled before its reply") from None
    except OSError as exc:
        raise WireError(f"a reply with descriptors: {exc.strerror or exc}") from None
    if not head:
        for fd in fds:
            os.close(fd)
        raise WireError("the peer closed the connection")
    head = bytearray(head)
    if len(head) < FRAME.size:
        head += _exactly(sock, FRAME.size - len(head), "a message's length")
    (n,) = FRAME.unpack(head)
    if n > max_bytes:
        raise WireError(f"a {n}-byte message; at most {max_bytes} accepted")
    return _exactly(sock, n, f"a {n}-byte message"), list(fds)
