"""The serving examples of docs/extending.md - a serving system
(examples/extending/serving_system.py) and a workload (examples/extending/workload.py) -
registered by module name as an entry point would be, through the shipped conformance
suites, with their generated flags in `serve-bench --help` and doing what they say."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cxlhm_apps.cli import main as cli_main
from cxlhm_apps.serving import configs, workloads as W
from cxlhm_apps.serving.testing import SMALL, LinearGpu, ServingSystemConformance, WorkloadConformance, \
    small_agent_workload
from cxlhm_apps.serving.topologies import replay
from example_loader import example


@pytest.fixture(scope="module", autouse=True)
def examples_registered():
    example("serving_system"), example("workload")  # the checkout's root on sys.path: importable by name
    configs.SYSTEMS.register("lmcache-compressed", "examples.extending.serving_system:LmcacheCompressed")
    W.WORKLOADS.register("rag", "examples.extending.workload:KIND")
    W.build.cache_clear()
    yield
    configs.SYSTEMS.unregister("lmcache-compressed")
    W.WORKLOADS.unregister("rag")
    W.build.cache_clear()


class TestExampleCompressedStore(ServingSystemConformance):
    name = "lmcache-compressed"


class TestExampleRagWorkload(WorkloadConformance):
    name, changes = "rag", {"requests": 150, "documents": 60}


def test_registered_by_module_name_as_an_entry_point_would_be():
    assert isinstance(configs.make_system("lmcache-compressed"), example("serving_system").LmcacheCompressed)
    assert W.kind("rag") is example("workload").KIND
    assert "rag" in W.names() and "lmcache-compressed" not in configs.all_names()  # not in --configs all
    assert configs.ordered(["ideal", "lmcache-compressed", "lmcache-local"]) == \
        ["lmcache-local", "lmcache-compressed", "ideal"]                         # its metadata places it


def test_their_generated_flags_appear_in_serve_bench_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["serve-bench", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--lmcache-compressed.ratio NUM uncompressed : stored bytes of KV (1: no compression) (default 4.0)" in text
    assert "--lmcache-compressed.codec_gbps NUM" in text and "--lmcache-compressed.load_mode {async," in text
    assert "--lmcache-compressed.paper" not in text and "--lmcache-compressed.meta" not in text
    assert "--rag.zipf NUM popularity skew of the documents (0: uniform) (default 1.0)" in text
    assert "--rag.document_tokens DIST a document's length, drawn once per document (default lognormal" in text


def test_their_flags_are_checked_by_their_own_rules(capsys):
    argv = ["serve-bench", "--workload", "rag", "--configs", "lmcache-compressed", "--no-search",
            "--out", "/nonexistent"]
    assert cli_main([*argv, "--lmcache-compressed.ratio", "0.5"]) == 2
    assert "--lmcache-compressed.ratio: ratio must be >= 1" in capsys.readouterr().err
    assert cli_main([*argv, "--rag.docs_per_request", "9", "--rag.documents", "5"]) == 2
    err = capsys.readouterr().err
    assert "--rag.docs_per_request" in err and "must be in [1, documents=5]" in err


# ---------------------------------------------------------------- the system does what it says
def _ttft(res):
    return (res.first_token - res.arrival).tolist()


def test_ratio_one_with_a_fast_codec_is_lmcache_local_exactly():
    w = small_agent_workload(6)
    params = SMALL.with_options("system", "lmcache-compressed", ratio=1.0, codec_gbps=1e9)
    same = replay(w, "lmcache-compressed", params, 1.0, gpu=LinearGpu())
    local = replay(w, "lmcache-local", SMALL, 1.0, gpu=LinearGpu())
    assert _ttft(same) == _ttft(local) and same.tokens["dram"].tolist() == local.tokens["dram"].tolist()


def test_compression_holds_more_kv_in_the_same_dram_and_the_codec_bounds_the_speed():
    w = small_agent_workload(8)
    tight = SMALL.replace(dram_bytes=3_000_000)   # 3k tokens of KV at LinearGpu's 1000 B/token

    def run(**opts):
        return replay(w, "lmcache-compressed", tight.with_options("system", "lmcache-compressed", **opts), 1.0,
                      gpu=LinearGpu())
    plain, packed = run(ratio=1.0, codec_gbps=1e9), run(ratio=8.0, codec_gbps=1e9)
    assert packed.tokens["dram"].sum() > plain.tokens["dram"].sum()
    # a codec of 10 MB/s: loading is slower than recomputing, and the engine recomputes instead
    slow_codec = run(ratio=8.0, codec_gbps=0.01)
    assert slow_codec.recompute_choices > packed.recompute_choices
    assert slow_codec.tokens["dram"].sum() < packed.tokens["dram"].sum()
    assert np.mean(_ttft(slow_codec)) >= np.mean(_ttft(packed))


# ---------------------------------------------------------------- the workload does what it says
def test_rag_reuses_kv_only_along_a_shared_prefix_of_documents():
    cfg = example("workload").RagConfig(requests=300, documents=40, seed=3)
    w = W.kind("rag").build(cfg)
    shared_prompt = cfg.system_prompt_tokens // 512
    heads = {tuple(r.chunk_ids[:shared_prompt].tolist()) for r in w.requests}
    assert len(heads) == 1        # the system prompt's chunks: the same KV for every request
    # two requests share a chunk past the system prompt only if they share its whole prefix
    by_id = {}
    for r in w.requests:
        for j, cid in enumerate(r.chunk_ids.tolist()):
            by_id.setdefault(cid, []).append((r.index, j))
    for cid, places in by_id.items():
        (a, j), *rest = places
        for b, k in rest:
            assert k == j and w.requests[a].chunk_ids[:j + 1].tolist() == w.requests[b].chunk_ids[:j + 1].tolist()


def test_more_popular_documents_mean_more_reuse():
    shares = [W.kind("rag").build(example("workload").RagConfig(requests=300, documents=200, zipf=z))
              .summary()["reusable_chunk_share"] for z in (0.0, 1.0, 2.0)]
    assert shares[0] < shares[1] < shares[2]


def test_serve_bench_runs_the_examples_end_to_end(tmp_path, capsys):
    assert cli_main(["serve-bench", "--workload", "rag", "--configs", "lmcache-local,lmcache-compressed",
                     "--rag.requests", "80", "--lmcache-compressed.ratio", "8", "--no-search", "--budgets", "",
                     "--workers", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.txt").read_text()
    assert "== rag, colocated" in table and "lmcache-compressed" in table
