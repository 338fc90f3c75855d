"""The error every configuration check raises. Its own module so the parts that check
their own settings (back ends, policies) raise it without importing the config loader,
which looks them up by name."""


class ConfigError(ValueError):
    """A configuration value is wrong. `key` is dotted (``backend.path``), `source` a file or "overrides"."""

    def __init__(self, source: str, key: str, message: str):
        self.source, self.key = source, key
        super().__init__(f"{source}: {key}: {message}")
