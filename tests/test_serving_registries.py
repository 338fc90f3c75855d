"""Workloads and serving systems are selected through their registries (entry points
included), with the metadata reports and sweeps need; and what a serve-bench user sees:
the table's ratio columns, its alignment, the +hints warning, the notes and the plots."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from importlib.metadata import EntryPoint

import numpy as np
import pytest

from cxlhm_apps.commands import serve_bench
from cxlhm_apps.serving import configs, workloads as W
from cxlhm_apps.serving.comparison import Comparison
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.report import format_table, hit_ratio_figure, max_qps_figure, search_notes

OUTSIDE_WORKLOAD = '''
import dataclasses
import numpy as np
from cxlhm_apps.serving.workloads import Request, Workload, WorkloadKind

@dataclasses.dataclass(frozen=True)
class PingConfig:
    users: int = 2
    tokens: int = 700

def ping(cfg):
    reqs = tuple(Request(i, i + 1, 0, np.array([100 + 2 * i, 101 + 2 * i]), np.array([512, cfg.tokens - 512]),
                         2, i * 1e9) for i in range(cfg.users))
    return Workload("ping", reqs, "outside", open_loop=True)

KIND = WorkloadKind(ping, PingConfig, reference_speed=0.5, quick=(("users", 1),), scale_field="users")
'''


@pytest.fixture
def outside_workload(tmp_path, monkeypatch):
    (tmp_path / "outside_ping.py").write_text(OUTSIDE_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="ping", value="outside_ping:KIND", group="cxlhm.serving_workloads")
    monkeypatch.setattr(W.WORKLOADS, "entry_points", lambda: {"ping": ep})
    W.build.cache_clear()
    yield
    W.WORKLOADS._cache.pop("ping", None)
    W.build.cache_clear()
    sys.modules.pop("outside_ping", None)


def test_an_entry_point_workload_is_selected_by_name(outside_workload, tmp_path):
    spec = W.resolve("ping", users=3)
    assert spec.kind == "ping" and spec.config.users == 3
    w = W.build(spec)
    assert len(w.requests) == 3 and w.requests[0].input_tokens == 700
    assert W.spec_at_speed(spec, 2.0).config.users == 6          # its own scale field
    assert W.reference_speed("ping") == 0.5 and W.quick_sizes()["ping"] == {"users": 1}
    assert "ping" in W.names()
    (tmp_path / "p.yaml").write_text("kind: ping\nusers: 4\ntokens: 900\n")
    from_file = W.resolve(str(tmp_path / "p.yaml"))
    assert (from_file.kind, from_file.config.users, from_file.config.tokens) == ("ping", 4, 900)
    comp = Comparison(["ping"], ["recompute"], ServingParams(), [], ["colocated"], quick=True)
    (task,) = comp.tasks()
    assert task.reference_speed == 0.5 and task.workload.config.users == 1


def test_an_unknown_workload_lists_the_registered_ones(tmp_path):
    with pytest.raises(Exception, match="mooncake.*agent|agent.*mooncake"):
        W.resolve("pong")
    (tmp_path / "bad.yaml").write_text("kind: pong\n")
    with pytest.raises(Exception, match="bad.yaml:1.*kind.*must be one of"):
        W.resolve(str(tmp_path / "bad.yaml"))


def test_a_generator_with_a_config_attribute_is_accepted_too():
    def gen(cfg):
        return None
    gen.config = W.QaConfig
    kind = W._as_kind(gen)
    assert kind.config is W.QaConfig and kind.reference_speed == 1.0
    with pytest.raises(TypeError, match="config"):
        W._as_kind(lambda cfg: None)


def test_system_metadata_drives_order_baselines_and_all():
    assert configs.all_names() == ["recompute", "lmcache-local", "cxlhm-lru", "cxlhm-hymcache", "mooncake-dram",
                                   "ideal"]
    assert configs.baselines() == {"lmc": "lmcache-local", "moon": "mooncake-dram"}
    assert not configs.meta("ideal").dram and configs.meta("cxlhm:sieve+hints").slow


def test_an_outside_system_takes_its_place_from_its_metadata():
    @dataclasses.dataclass(frozen=True)
    class Tape:
        meta: configs.Meta = configs.Meta(order=35, role="store", in_all=True)

        def make_tier(self, ctx):
            from cxlhm_apps.serving.tiers import NoTier
            return NoTier()
    configs.SYSTEMS.add("tape", Tape)
    try:
        assert configs.all_names().index("tape") == configs.all_names().index("mooncake-dram") - 1
        assert configs.ordered(["ideal", "tape", "recompute"]) == ["recompute", "tape", "ideal"]
    finally:
        configs.SYSTEMS.unregister("tape")


# ---------------------------------------------------------------- the table a user sees
def _reference(**changes):
    ref = {"ttft_mean_s": 0.5, "ttft_p50_s": 0.4, "ttft_p90_s": 0.9, "ttft_p99_s": 1.2, "tbt_mean_ms": 20.0,
           "hit_gpu": 0.5, "hit_dram": 0.0, "hit_ssd": 0.4, "hit_miss": 0.1, "prefetch_accuracy": 0.0,
           "prefetch_coverage": 0.0, "prefetch_late_share": 0.0, "ssd_written_per_reused": 1.0, "speed": 1.0,
           "offered_rps": 1.0, "slo_percentile": 90, "store_skipped_share": 0.0}
    ref.update(changes)
    return ref


def _cell(config, qps, **ref):
    return {"config": config, "workload": "agent", "topology": "colocated", "dram_gib": 64.0, "max_qps": qps,
            "search_step": 1.19, "reference": _reference(**ref)}


def test_ratio_columns_print_a_dash_when_the_baseline_did_not_run():
    table = format_table([_cell("cxlhm:sieve", 1.5), _cell("cxlhm:sieve+hints", 1.6)], 64.0)
    header, *rows = [line for line in table.splitlines() if line and not line.startswith("==")]
    assert "inf" not in table
    assert header.split()[8:13] == ["maxQPS", "x", "lmc", "x", "moon"]
    for row in rows:
        cells = row.split()  # config, TTFT mean, p50, p90, p99, TBT, maxQPS, x lmc, x moon, ...
        assert cells[6] in ("1.500", "1.600") and cells[7] == "-" and cells[8] == "-"
    with_base = format_table([_cell("lmcache-local", 1.0), _cell("cxlhm:sieve", 1.5)], 64.0)
    assert " 1.50 " in with_base and "inf" not in with_base


def test_long_configuration_names_keep_the_table_aligned():
    table = format_table([_cell("lmcache-local", 1.0), _cell("cxlhm:sieve+hints", 1.6), _cell("ideal", 2.0)], 64.0)
    lines = [line for line in table.splitlines() if line and not line.startswith("==")]
    assert len({len(line) for line in lines}) == 1
    header = lines[0]
    # every value ends under its column's name
    ends = [header.index("maxQPS") + len("maxQPS")] * len(lines)
    assert all(line[e - 5:e].strip() for line, e in zip(lines, ends))


def test_a_note_explains_device_policies_that_look_alike():
    cells = [_cell("lmcache-local", 1.0), _cell("cxlhm:lru", 1.81, store_skipped_share=0.12),
             _cell("cxlhm:sieve", 1.83, store_skipped_share=0.10)]
    notes = "\n".join(search_notes(cells, 64.0))
    assert "device DRAM served no reusable token" in notes and "write path" in notes
    assert "cxlhm:lru 12%" in notes and "cxlhm:sieve 10%" in notes
    cells[2]["reference"]["hit_dram"] = 0.3
    assert "device DRAM served no reusable token" not in "\n".join(search_notes(cells, 64.0))


def test_hints_on_a_policy_without_on_hint_warn(monkeypatch, capsys):
    monkeypatch.setattr(Comparison, "run", lambda self, **kw: ([], "table"))
    parser = argparse.ArgumentParser()
    serve_bench.add_arguments(parser)
    args = parser.parse_args(["--configs", "cxlhm:sieve+hints,cxlhm-hymcache", "--workload", "qa", "--no-search",
                              "--out", "/tmp/never-written"])
    assert serve_bench.run(args) == 0
    err = capsys.readouterr().err
    assert "cxlhm:sieve+hints" not in err or "warning" in err
    assert "sieve+hints: sieve has no on_hint hook" in err
    assert "hymcache" not in err


# ---------------------------------------------------------------- the plots a user sees
def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _main(n=6):
    rng = np.random.default_rng(0)
    out = {}
    for k in range(n):
        g, d = rng.random() * 0.5, rng.random() * 0.3
        out[f"config-{k}" if k % 2 else f"cxlhm:policy{k}+hints"] = {
            "max_qps": 1 + k * 0.1, "search_step": 1.19,
            "reference": _reference(hit_gpu=g, hit_dram=d, hit_ssd=(1 - g - d) / 2, hit_miss=(1 - g - d) / 2)}
    return out


def test_the_hit_ratio_legend_covers_no_bar():
    import matplotlib
    matplotlib.use("Agg")
    fig = hit_ratio_figure(_main(), "agent", "colocated")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    bars = [p.get_window_extent() for p in ax.patches]
    assert bars and not any(_overlaps(legend, b) for b in bars)


def test_max_qps_labels_clear_the_whiskers():
    import matplotlib
    matplotlib.use("Agg")
    fig = max_qps_figure(_main(), "agent", "colocated", 64.0)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t.get_window_extent() for t in ax.texts]
    from matplotlib.transforms import Bbox
    (errorbar,) = [c for c in ax.containers if getattr(c, "lines", None)]
    _, caps, (stems,) = errorbar.lines
    px = fig.dpi / 72  # pixels per point
    whiskers = []
    for seg in stems.get_segments():  # each whisker's vertical line
        (x0, y0), (x1, y1) = ax.transData.transform(seg)
        whiskers.append(Bbox([[min(x0, x1) - px, min(y0, y1)], [max(x0, x1) + px, max(y0, y1)]]))
    for cap in caps:  # each cap: a horizontal marker as wide as its size, as thick as its line
        half_w, half_h = cap.get_markersize() / 2 * px, max(1.0, cap.get_markeredgewidth()) / 2 * px
        for x, y in ax.transData.transform(cap.get_xydata()):
            whiskers.append(Bbox([[x - half_w, y - half_h], [x + half_w, y + half_h]]))
    assert len(labels) == 6 and len(whiskers) >= 12
    assert not any(_overlaps(lab, w) for lab in labels for w in whiskers)
    assert all(lab.y1 <= ax.get_window_extent().y1 for lab in labels)  # inside the axes


# ---------------------------------------------------------------- the workloads from public sources
def test_the_coding_agent_matches_its_public_characterisation():
    """vLLM x Mooncake blog (Codex / SWE-bench Pro): median 33 turns, ~80K context by turn
    30, input:output 131:1, 94.2% prefix-cache hits; contexts to 128k."""
    w = W.build(W.default_spec("coding-agent"))
    turns = np.bincount([r.session for r in w.requests])[1:]
    ctx = np.array([r.input_tokens for r in w.requests])
    out = np.array([r.output_tokens for r in w.requests])
    assert 28 <= np.median(turns) <= 38
    assert 70_000 <= np.median([r.input_tokens for r in w.requests if r.turn == 29]) <= 95_000
    assert 110 <= ctx.sum() / out.sum() <= 160
    assert ctx.max() > 100_000 and ctx.max() < 131_072
    assert 0.90 <= w.summary()["reusable_chunk_share"] <= 0.98
    pauses = [r.after_parent_ns / 1e9 for r in w.requests if r.parent >= 0]
    assert 15 <= np.median(pauses) <= 25 and np.percentile(pauses, 10) >= 8


def test_the_mooncake_synthetic_trace_is_the_published_one():
    """Mooncake FAST'25 Table 2, synthetic: 3,993 requests, mean input 15,325, output 149."""
    w = W.build(W.default_spec("mooncake-synthetic"))
    s = w.summary()
    assert s["requests"] == 3993
    assert s["mean_input_tokens"] == pytest.approx(15325, abs=1)
    assert s["mean_output_tokens"] == pytest.approx(149, abs=1)
    assert 0.60 <= s["reusable_chunk_share"] <= 0.70   # the paper: 66% cache ratio
    assert W.reference_speed("mooncake-synthetic") == 0.1
