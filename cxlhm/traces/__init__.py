"""Trace readers. Each reader checks its input line by line and raises TraceError
naming the file, the line (or record) and what was expected."""


class TraceError(ValueError):
    def __init__(self, path: str, where: str, message: str):
        self.path, self.where = path, where
        super().__init__(f"{path}:{where}: {message}")
