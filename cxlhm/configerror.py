"""The error every configuration check raises. Its own module so the parts that check
their own settings (back ends, policies) raise it without importing the config loader,
which looks them up by name."""


class ConfigError(ValueError):
    """A configuration value is wrong. `key` is dotted (``backend.path``), `source` a file or "overrides"."""

    def __init__(self, source: str, key: str, message: str):
        self.source, self.key, self.message = source, key, message
        super().__init__(f"{source}: {key}: {message}")

    def __reduce__(self):  # survives the trip out of a worker process (its args are not __init__'s)
        return type(self), (self.source, self.key, self.message)
