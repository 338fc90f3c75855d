"""Content directory back ends by URL scheme, in the project's one registry type: the
built-ins (`shm`, `redis`) and whatever packages publish under the entry-point group
`cxlhm.content_directories` (a ContentDirectory subclass with a classmethod
`from_url(url)`; its conformance suite is host_runtime.testing.directory).

    open_directory("shm:///dev/shm/kv.dir")         # attach an embedded directory
    open_directory("redis://10.0.0.5:6379/0")       # a Redis server
"""
from __future__ import annotations

from urllib.parse import urlsplit

from cxlhm.registry import Registry
from host_runtime.directory.base import ContentDirectory


def _as_directory(obj):
    if not (isinstance(obj, type) and issubclass(obj, ContentDirectory) and callable(getattr(obj, "from_url", None))):
        raise TypeError(f"{obj!r} is not a ContentDirectory class with from_url(url)")
    return obj


DIRECTORIES: Registry = Registry(
    "content directory", "cxlhm.content_directories", check=_as_directory,
    builtins={"shm": "host_runtime.directory.shm:SharedMemoryDirectory",
              "redis": "host_runtime.directory.redis:RedisDirectory"})


def open_directory(url: str) -> ContentDirectory:
    scheme = urlsplit(url).scheme
    if not scheme:
        raise ValueError(f"directory {url!r}: expected a URL such as shm:///dev/shm/kv.dir or redis://host:6379/0")
    return DIRECTORIES.get(scheme).from_url(url)
