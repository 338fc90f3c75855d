"""Conformance suite for content directories (host_runtime.directory.ContentDirectory).

Subclass ``DirectoryConformance`` in a test module and provide

    def make_directory(self):            # a fresh, empty directory
    def other_client(self, directory):   # a second client of the same directory (another
                                         # connection / another mapping), as another host has

The suite checks the contract in host_runtime/directory/base.py: publish/lookup across
clients, sparse answers with gaps, replace, remove and conditional remove, batches,
bad input as one clear error, concurrent writers losing nothing, and a hypothesis
state machine against a dict.
"""
from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from host_runtime.directory import Location, LocationKind


def fp(i: int, salt: bytes = b"") -> bytes:
    """A fingerprint like the store's (a SHA-256 digest)."""
    return hashlib.sha256(salt + i.to_bytes(8, "little")).digest()


def loc(i: int, kind: LocationKind = LocationKind.POOL) -> Location:
    return Location(kind, host=i % 7, tenant=i % 3, offset=i * 4096, length=4096 + i % 5, generation=i % 11)


class DirectoryConformance:
    def make_directory(self):
        raise NotImplementedError

    def other_client(self, directory):
        raise NotImplementedError

    @pytest.fixture
    def directory(self):
        d = self.make_directory()
        try:
            yield d
        finally:
            d.close()

    @pytest.fixture
    def peer(self, directory):
        d = self.other_client(directory)
        try:
            yield d
        finally:
            d.close()

    # ------------------------------------------------------------ basics
    def test_published_entry_is_found_by_another_client(self, directory, peer):
        assert directory.publish(fp(1), loc(1))
        assert peer.lookup(fp(1)) == loc(1)
        assert peer.lookup(fp(2)) is None

    def test_sparse_lookup_answers_each_key_with_gaps(self, directory, peer):
        keys = [fp(i) for i in range(20)]
        present = [i for i in range(20) if i % 3 != 1]
        directory.publish_many([keys[i] for i in present], [loc(i) for i in present])
        hits = peer.lookup_sparse(keys)
        assert hits.hit.tolist() == [i % 3 != 1 for i in range(20)]
        assert hits.prefix_length() == 1
        for i in range(20):
            assert hits.location(i) == (loc(i) if i in present else None)
        arr = hits.locations()
        assert int(arr["offset"][5]) == loc(5).offset and int(arr["length"][4]) == 0

    def test_instance_locations_round_trip(self, directory):
        where = Location(LocationKind.INSTANCE, host=65535, tenant=2**32 - 1, offset=2**64 - 1,
                         length=2**32 - 1, generation=2**32 - 1)
        directory.publish(fp(9), where)
        assert directory.lookup(fp(9)) == where

    def test_republish_replaces(self, directory, peer):
        directory.publish(fp(1), loc(1))
        peer.publish(fp(1), loc(2))
        assert directory.lookup(fp(1)) == loc(2)

    def test_remove_and_conditional_remove(self, directory, peer):
        directory.publish_many([fp(1), fp(2)], [loc(1), loc(2)])
        assert not peer.remove(fp(1), expected=loc(3))  # points elsewhere now: kept
        assert directory.lookup(fp(1)) == loc(1)
        assert peer.remove(fp(1), expected=loc(1))
        assert directory.lookup(fp(1)) is None
        assert directory.remove(fp(2)) and not directory.remove(fp(2))
        directory.publish(fp(2), loc(5))  # a removed key can come back
        assert peer.lookup(fp(2)) == loc(5)

    def test_large_batch(self, directory, peer):
        n = 20000
        keys = [fp(i, b"batch") for i in range(n)]
        assert directory.publish_many(keys, [loc(i) for i in range(n)]) == n
        hits = peer.lookup_sparse(keys + [fp(-1 % 2**63, b"absent")])
        assert hits.n_hits == n and not hits.hit[-1]
        got = hits.locations()
        assert (got["offset"][:n] == np.arange(n, dtype=np.uint64) * 4096).all()
        assert peer.remove_many(keys[::2]) == n // 2
        assert directory.lookup_sparse(keys).n_hits == n - n // 2

    def test_key_array_input(self, directory):
        keys = np.array([fp(i) for i in range(10)], dtype="S32")
        directory.publish_many(keys, [loc(i) for i in range(10)])
        assert directory.lookup_sparse(keys).n_hits == 10
        assert directory.lookup_sparse([]).n_hits == 0

    def test_clear(self, directory, peer):
        directory.publish_many([fp(i) for i in range(50)], [loc(i) for i in range(50)])
        peer.clear()
        assert directory.lookup_sparse([fp(i) for i in range(50)]).n_hits == 0

    # ------------------------------------------------------------ bad input
    @pytest.mark.parametrize("bad", [b"short", "a string", 12345, None])
    def test_bad_fingerprint_is_one_clear_error(self, directory, bad):
        with pytest.raises((ValueError, TypeError), match="fingerprint"):
            directory.publish(bad, loc(1))
        with pytest.raises((ValueError, TypeError), match="fingerprint"):
            directory.lookup_sparse([fp(1), bad])

    @pytest.mark.parametrize("field,value", [("host", 1 << 16), ("tenant", -1), ("length", 1 << 32),
                                             ("generation", 1.5), ("kind", 9)])
    def test_out_of_range_location_is_refused(self, field, value):
        fields = dict(kind=LocationKind.POOL, host=0, tenant=0, offset=0, length=1, generation=0)
        fields[field] = value
        with pytest.raises(ValueError, match=field):
            Location(**fields)

    def test_mismatched_batch_lengths(self, directory):
        with pytest.raises(ValueError, match="2 fingerprints but 1"):
            directory.publish_many([fp(1), fp(2)], [loc(1)])
        with pytest.raises(TypeError, match="location 0"):
            directory.publish_many([fp(1)], [(1, 2, 3)])

    # ------------------------------------------------------------ concurrency
    def test_concurrent_writers_lose_nothing(self, directory):
        clients = [self.other_client(directory) for _ in range(4)]
        per = 2000

        def work(w, client):
            keys = [fp(i, bytes([w])) for i in range(per)]
            for start in range(0, per, 100):
                client.publish_many(keys[start:start + 100], [loc(i) for i in range(start, start + 100)])
                client.lookup_sparse(keys[:start + 100])

        threads = [threading.Thread(target=work, args=(w, c)) for w, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        for c in clients:
            c.close()
        for w in range(4):
            hits = directory.lookup_sparse([fp(i, bytes([w])) for i in range(per)])
            assert hits.n_hits == per
            assert [hits.location(i) for i in (0, per - 1)] == [loc(0), loc(per - 1)]

    # ------------------------------------------------------------ against a reference model
    def test_state_machine(self):
        suite = self

        class Model(RuleBasedStateMachine):
            def __init__(self):
                super().__init__()
                self.d = suite.make_directory()
                self.peer = suite.other_client(self.d)
                self.ref: dict[bytes, Location] = {}

            def teardown(self):
                self.peer.close()
                self.d.close()

            @rule(i=st.integers(0, 40), j=st.integers(0, 1000), via_peer=st.booleans())
            def publish(self, i, j, via_peer):
                (self.peer if via_peer else self.d).publish(fp(i), loc(j))
                self.ref[fp(i)] = loc(j)

            @rule(i=st.integers(0, 40), j=st.one_of(st.none(), st.integers(0, 1000)))
            def remove(self, i, j):
                expected = None if j is None else loc(j)
                want = fp(i) in self.ref and (expected is None or self.ref[fp(i)] == expected)
                assert self.d.remove(fp(i), expected) == want
                if want:
                    del self.ref[fp(i)]

            @rule(ids=st.lists(st.integers(0, 40), max_size=12))
            def lookup(self, ids):
                hits = self.peer.lookup_sparse([fp(i) for i in ids])
                assert [hits.location(n) for n in range(len(ids))] == [self.ref.get(fp(i)) for i in ids]

            @invariant()
            def all_found(self):
                keys = list(self.ref)
                if keys:
                    assert self.d.lookup_sparse(keys).n_hits == len(keys)

        run = settings(max_examples=25, stateful_step_count=30, deadline=None)(Model).TestCase
        run().runTest()
