"""The map's reading of a ladder of probes (bench/serving/servingmap.py): the max QPS under
any SLO pair from one set of replays, and the three claims' ratios per scenario."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "serving"))
import servingmap as M  # noqa: E402


def _p(speed, ttft, tbt, rps):
    return {"speed": speed, "ttft": ttft, "tbt": tbt, "rps": rps}


LADDER = [_p(0.5, 0.4, 30.0, 1.0), _p(1.0, 0.8, 40.0, 2.0), _p(2.0, 3.2, 90.0, 4.0), _p(4.0, math.inf, math.inf, math.nan)]


def test_max_qps_interpolates_where_the_ladder_crosses_the_slo():
    # TTFT 0.8 -> 3.2 between rps 2 and 4: a 1.6 s SLO sits halfway in log space -> sqrt(8)
    assert M.max_qps(LADDER, 1.6, 1000.0) == pytest.approx(math.sqrt(8.0))
    # both bounds met at the 2nd probe and missed at the 3rd: the tighter one (TBT 60 ms) decides
    f_tbt = math.log(60 / 40) / math.log(90 / 40)
    assert M.max_qps(LADDER, 1.6, 60.0) == pytest.approx(math.exp(math.log(2) * (1 - f_tbt) + math.log(4) * f_tbt))


def test_max_qps_edges():
    assert M.max_qps(LADDER, 10.0, 1000.0) == 4.0      # the stopped probe: no interpolation past it
    assert M.max_qps(LADDER, 0.3, 1000.0) == 0.0       # not even the slowest probe meets it
    assert M.max_qps(LADDER, 0.4, 30.0) == 1.0         # met exactly at the first probe only
    assert M.max_qps([], 1.0, 100.0) == 0.0


def test_ratios_pair_each_scenario_with_its_baselines():
    sc = M.Scenario(sessions=4)
    base = dict(vars(sc))
    ladders = {"lmcache-local": [_p(1, 0.5, 30, 1.0), _p(2, 9, 30, 1.5)],
               "cxlhm-hymcache": [_p(1, 0.5, 30, 3.0), _p(2, 0.6, 30, 3.3)],
               "mooncake-dram": [_p(1, 0.5, 30, 4.0), _p(2, 0.5, 30, 4.4)],
               "ideal": [_p(1, 0.5, 30, 4.0), _p(2, 0.5, 30, 4.5)]}
    results = [{"scenario": base, "config": c, "probes": p} for c, p in ladders.items()]
    rows = M.ratios(results, [1.0], [100.0])
    (row,) = rows
    assert row["cxlhm-hymcache/lmcache-local"] == pytest.approx(3.3 / math.exp(math.log(1.0) + math.log(1.5) * math.log(2) / math.log(18)))
    assert row["cxlhm-hymcache/mooncake-dram"] == pytest.approx(3.3 / 4.4)
    assert "hymcache / lmcache-local" in "\n".join(M.summary_of_claims(rows))


def test_the_heatmap_is_drawn_with_its_contours(tmp_path):
    rows = []
    for k, share in enumerate((1 / 16, 1 / 4, 1.0)):
        sc = M.Scenario(dram_share=share)
        for t in (1.0, 2.0, 5.0):
            r = {"scenario": sc.label(), **vars(sc), "ttft_slo": t, "tbt_slo": 100.0}
            for num, den, *_ in M.CLAIMS:
                r[f"{num}/{den}"] = 0.5 + k + t / 2
            rows.append(r)
    M.draw(rows, tmp_path / "map.png", [1.0, 2.0, 5.0], [100.0], "test")
    assert (tmp_path / "map.png").stat().st_size > 10_000
