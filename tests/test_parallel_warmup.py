"""A first `cxlhm run` compiles the configurations still to come in child processes while
it compiles its own; a warm cache starts nothing."""
from __future__ import annotations

from cxlhm import jit
from cxlhm_apps.parallel_warmup import ParallelWarmup


def test_a_cold_compile_starts_the_next_configurations_alongside(tmp_path, capsys):
    started = []
    before = jit.compiling_notice

    def child(label):
        started.append(label)
        return ["policies", "lru"]  # a cheap real command stands in for the warm-up replay

    with ParallelWarmup(["lru", "s3fifo", "hymcache+hints"], child, spare_cores=1) as warm:
        warm.wait_for("lru")
        jit.compiling_notice("the lru firmware", tmp_path)  # nothing cached: a compile starts here
        assert started == ["s3fifo"]  # one spare core: one child
        child_proc = warm.children["s3fifo"]
        jit.compiling_notice("the lru firmware", tmp_path)  # announced again: nothing more
        assert started == ["s3fifo"]
        warm.wait_for("s3fifo")
        assert child_proc.returncode == 0 and not warm.children
    assert jit.compiling_notice is before  # put back
    assert "compiling s3fifo alongside, in 1 more process" in capsys.readouterr().err


def test_a_warm_cache_starts_nothing(tmp_path):
    (tmp_path / "index.nbi").write_bytes(b"")
    started = []
    with ParallelWarmup(["lru", "hymcache+hints"], lambda label: started.append(label) or ["policies"],
                        spare_cores=1) as warm:
        warm.wait_for("lru")
        jit.compiling_notice("the lru firmware", tmp_path)
        warm.wait_for("hymcache+hints")
    assert started == []


def test_one_configuration_or_one_core_changes_nothing(tmp_path):
    original = jit.compiling_notice
    with ParallelWarmup(["lru"], lambda label: ["policies"], spare_cores=4):
        assert jit.compiling_notice is original
    with ParallelWarmup(["lru", "fifo"], lambda label: ["policies"], spare_cores=0):
        assert jit.compiling_notice is original
