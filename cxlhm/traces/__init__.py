"""Trace readers. Each reader checks its input line by line and raises TraceError
naming the file, the line (or record) and what was expected."""


class TraceError(ValueError):
    def __init__(self, path: str, where: str, message: str):
        self.path, self.where = path, where
        super().__init__(f"{path}:{where}: {message}")


def check_trace_file(path: str) -> None:
    """A trace must be a regular file: a device (/dev/zero), a FIFO or a folder would be
    read forever or fail somewhere deep in a reader."""
    import os
    import stat
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TraceError(path, "0", f"cannot open trace: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(path, "0", "not a regular file; a trace is a file")


def text_lines(handle, path: str):
    """The lines of a trace opened in binary, decoded as UTF-8: a line that is not UTF-8
    raises TraceError naming it (a text-mode file would raise UnicodeDecodeError from
    somewhere in its read-ahead, with no line)."""
    for lineno, raw in enumerate(handle, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(path, str(lineno), f"not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                                                f"{exc.start + 1})") from None
