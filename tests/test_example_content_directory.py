"""The content-directory example of docs/extending.md (examples/extending/content_directory.py)
through the shipped conformance suite (host_runtime.testing.directory), registered the
way a test registers a directory it does not install (DIRECTORIES.register)."""
import itertools

import pytest

from host_runtime.directory.registry import DIRECTORIES, open_directory
from host_runtime.testing.directory import DirectoryConformance, fp, loc
from example_loader import example

_names = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def mem_registered():
    example("content_directory")  # the checkout's root on sys.path, so the registry can import it by name
    DIRECTORIES.register("mem", "examples.extending.content_directory:ProcessDirectory")
    yield
    DIRECTORIES.unregister("mem")


class TestProcessDirectory(DirectoryConformance):
    def make_directory(self):
        return open_directory(f"mem://conformance-{next(_names)}")

    def other_client(self, directory):
        return open_directory(directory.url)


def test_a_name_is_one_table_until_its_last_client_closes():
    first = open_directory("mem://shared")
    second = open_directory("mem://shared")
    other = open_directory("mem://other")
    first.publish(fp(1), loc(1))
    assert second.lookup(fp(1)) == loc(1) and other.lookup(fp(1)) is None
    first.close()
    assert second.lookup(fp(1)) == loc(1)  # still open by `second`
    second.close()
    other.close()
    with open_directory("mem://shared") as again:
        assert again.lookup(fp(1)) is None


@pytest.mark.parametrize("url", ["mem://", "mem://kv?size=3"])
def test_a_bad_url_says_what_is_accepted(url):
    with pytest.raises(ValueError, match="mem://"):
        open_directory(url)
