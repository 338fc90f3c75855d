"""Fuzzing the shim adapters' entry points (tests/fuzz_shim.py: the calls drawn and what
each must do); `make fuzz` runs the same target at volume (tests/fuzz_volume.py)."""
import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_shim as fs
from fuzzkit import Tally

shim_tally = Tally("shim_adapters")


@pytest.fixture(scope="module")
def shim_world(tmp_path_factory):
    world = fs.open_shim_world(tmp_path_factory.mktemp("shimfuzz"))
    yield world
    fs.close_shim_world(world)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(fs.OPS)
def test_fuzz_shim_adapter_entry_points(shim_world, ops):
    fs.check_shim_ops(shim_world, ops, shim_tally)


def test_int_keys_of_129_bits_are_refused_with_a_value_error():
    from host_runtime import kvkeys
    with pytest.raises(ValueError):
        kvkeys.normalize_key(2**128)


def test_zz_record_shim_cases():
    shim_tally.record()
