"""serve-bench's per-implementation flags, generated from each registered workload's,
serving system's and topology's config dataclass (cxlhm_apps.serving.options): they
parse into the dataclass, a bad value or an unknown field names the flag and what is
accepted, a flag of an implementation that is not selected is refused, and an
implementation registered at test time (or published as an entry point) gets its flags
with no edit to the command."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from importlib.metadata import EntryPoint

import pytest
from hypothesis import given, settings, strategies as st

from cxlhm_apps import cli
from cxlhm_apps.commands import serve_bench
from cxlhm_apps.serving import configs, options, workloads as W
from cxlhm_apps.serving.comparison import Comparison
from cxlhm_apps.serving.scheduler import Engine
from cxlhm_apps.serving.testing import LinearGpu, small_agent_workload, SMALL
from cxlhm_apps.serving.tiers import NoTier
from cxlhm_apps.serving.topologies import TOPOLOGIES, replay


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cxlhm serve-bench")
    serve_bench.add_arguments(parser)
    return parser


def _serve_bench(monkeypatch, argv):
    """Run serve-bench's own run() up to the grid; return the Comparison it would run."""
    seen = {}

    def fake_run(self, **kw):
        seen["comparison"] = self
        return [], "table"
    monkeypatch.setattr(Comparison, "run", fake_run)
    assert serve_bench.run(_parser().parse_args([*argv, "--no-search", "--out", "/tmp/never-written"])) == 0
    return seen["comparison"]


def test_generated_flags_parse_into_the_config_dataclasses(monkeypatch):
    comparison = _serve_bench(monkeypatch, [
        "--workload", "coding-agent,qa", "--configs", "lmcache-local,ideal",
        "--coding-agent.turns", "{dist: lognormal, median: 40, sigma: 0.5}", "--coding-agent.sessions", "7",
        "--qa.users", "5", "--qa.qps", "1.5", "--lmcache-local.load_mode", "layerwise"])
    specs = {spec.kind: spec for spec, _ in comparison.specs()}
    agent = specs["coding-agent"].config
    assert isinstance(agent, W.CodingAgentConfig)
    assert agent.turns == W.Dist("lognormal", 40.0, 0.5) and agent.sessions == 7
    assert agent.tool_pause_s == W.CodingAgentConfig().tool_pause_s          # the rest keeps its defaults
    assert (specs["qa"].config.users, specs["qa"].config.qps) == (5, 1.5)
    system = configs.make_system("lmcache-local", comparison.params)
    assert isinstance(system, configs.LmcacheLocal) and system.load_mode == "layerwise"
    assert system.store_mode == "blocking"
    assert configs.make_system("ideal", comparison.params) == configs.make_system("ideal")


def test_the_help_lists_every_registered_implementations_flags_with_types_defaults_and_help():
    text = _parser().format_help()
    for name in W.names():
        for field, _, _ in options.option_fields(W.kind(name).config):
            assert f"--{name}.{field}" in text
    assert "--coding-agent.turns DIST" in text and "--qa.users INT" in text
    assert "--lmcache-local.load_mode {async,blocking,layerwise}" in text
    assert "concurrent users (LMCache's --num-users) (default 40)" in " ".join(text.split())
    # fields that are what a configuration is, not options, get no flag
    assert "--cxlhm-lru.policy" not in text and "--lmcache-local.meta" not in text and "--recompute." not in text


@pytest.mark.parametrize("argv, flag, accepted", [
    (["--workload", "qa", "--qa.users", "many"], "--qa.users", "an integer"),
    (["--workload", "qa", "--qa.users", "-3"], "--qa.users", "an integer >= 0"),
    (["--workload", "qa", "--qa.qps", "0"], "--qa.qps", "qps must be > 0"),
    (["--workload", "agent", "--agent.turns", "{dist: normal, mean: 3}"], "--agent.turns", "lognormal"),
    (["--workload", "agent", "--agent.turns", "{dist: uniform, low: 5}"], "--agent.turns", "needs 'high'"),
    (["--workload", "agent", "--configs", "lmcache-local", "--lmcache-local.store_mode", "layerwise"],
     "--lmcache-local.store_mode", "one of async, blocking"),
    (["--workload", "qa", "--mooncake.requests", "10"], "--mooncake.requests", "add mooncake to --workload"),
    (["--workload", "qa", "--configs", "ideal", "--lmcache-local.load_mode", "async"], "--lmcache-local.load_mode",
     "add lmcache-local to --configs"),
])
def test_a_bad_value_is_one_error_naming_the_flag_and_what_it_takes(capsys, argv, flag, accepted):
    assert cli.main(["serve-bench", *argv, "--no-search", "--out", "/tmp/never-written"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cxlhm serve-bench: error: "), err
    assert flag in err[0] and accepted in err[0], err[0]


def test_an_unknown_field_names_what_the_implementation_takes(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve-bench", "--workload", "qa", "--qa.userz", "3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown option --qa.userz" in err and "--qa.users" in err and "--qa.rounds" in err
    with pytest.raises(SystemExit):
        cli.main(["serve-bench", "--nosuch.field", "3"])
    err = capsys.readouterr().err
    assert "no registered workload, serving system or topology with options is named 'nosuch'" in err
    assert "coding-agent" in err


def test_requests_and_sessions_apply_to_every_selected_workload_with_the_field(monkeypatch, capsys):
    comparison = _serve_bench(monkeypatch, ["--workload", "mooncake-synthetic,agent,qa", "--configs", "recompute",
                                            "--requests", "50", "--sessions", "4", "--agent.sessions", "9"])
    specs = {spec.kind: spec.config for spec, _ in comparison.specs()}
    assert specs["mooncake-synthetic"].requests == 50
    assert specs["agent"].sessions == 9          # its own flag wins over the shorthand
    assert cli.main(["serve-bench", "--workload", "qa", "--sessions", "3", "--out", "/tmp/never-written"]) == 2
    assert "--sessions: none of the selected workloads (qa) has a sessions field" in capsys.readouterr().err


def test_the_default_workloads_come_from_the_registry():
    assert _parser().parse_args([]).workload == ",".join(W.default_names())
    assert W.default_names() == [n for n in W.names() if W.kind(n).in_default] and W.default_names()


def test_the_disaggregated_hand_over_is_the_disagg_topologys_options(monkeypatch, capsys):
    from cxlhm_apps.serving.disagg import DisaggEngine, DisaggOptions
    assert "--disagg.handover {gpu,tier}" in _parser().format_help()
    comparison = _serve_bench(monkeypatch, ["--workload", "agent", "--configs", "recompute", "--topology", "both",
                                            "--disagg.handover", "tier", "--disagg.handover_latency_ns", "0"])
    assert "topology disagg: DisaggOptions(handover='tier'" in capsys.readouterr().out
    engine = DisaggEngine(small_agent_workload(2), "recompute", comparison.params, 1.0, LinearGpu())
    assert engine.options == DisaggOptions(handover="tier", handover_latency_ns=0.0) and not engine.direct
    assert cli.main(["serve-bench", "--disagg.handover", "tier", "--out", "/tmp/never-written"]) == 2
    assert "add disagg to --topology" in capsys.readouterr().err
    with pytest.raises(ValueError, match="handover: unknown serving parameter"):
        from cxlhm_apps.serving.params import params_from
        params_from((("handover", "tier"),))


# ---------------------------------------------------------------- registered at test time
@dataclasses.dataclass(frozen=True)
class EchoConfig:
    users: int = 2                                            # one session each
    pause: float = dataclasses.field(default=0.25, metadata={"help": "seconds between turns"})
    shape: typing.Literal["flat", "growing"] = "flat"         # how contexts grow
    note: str = dataclasses.field(default="", metadata={"cli": False})


def _echo(cfg: EchoConfig) -> W.Workload:
    import numpy as np
    reqs = []
    for u in range(cfg.users):
        for turn in range(2):
            n = 2 + (turn if cfg.shape == "growing" else 0)
            ids = np.arange(n, dtype=np.int64) + 100 * u
            reqs.append(W.Request(len(reqs), u + 1, turn, ids, np.full(n, 512, np.int64), 4, u * 1e9,
                                  -1 if turn == 0 else len(reqs) - 1, None if turn == 0 else cfg.pause * 1e9,
                                  turn == 1, 0))
    return W.Workload("echo", tuple(reqs), "test workload", open_loop=False)


@dataclasses.dataclass(frozen=True)
class Shelf:
    """A test configuration whose one option decides whether it keeps anything."""
    keep: bool = False                                        # keep the KV (in unbounded host DRAM)
    meta: configs.Meta = configs.fixed(configs.Meta(order=60, role="store"))

    def make_tier(self, ctx):
        if not self.keep:
            return NoTier()
        return configs.Ideal().make_tier(ctx)


class Lanes(Engine):
    """A test topology: the colocated engine with options of its own."""
    topology = "lanes"

    @dataclasses.dataclass(frozen=True)
    class Options:
        lanes: int = 1                                        # parallel lanes


@pytest.fixture
def registered():
    W.WORKLOADS.add("echo", W.WorkloadKind(_echo, EchoConfig, order=70))
    configs.SYSTEMS.add("shelf", Shelf())
    TOPOLOGIES.add("lanes", Lanes)
    W.build.cache_clear()
    yield
    W.WORKLOADS.unregister("echo")
    configs.SYSTEMS.unregister("shelf")
    TOPOLOGIES.unregister("lanes")
    W.build.cache_clear()


def test_an_implementation_registered_at_test_time_gets_its_flags(registered, monkeypatch):
    text = " ".join(_parser().format_help().split())
    assert "--echo.users INT one session each (default 2)" in text
    assert "--echo.pause NUM seconds between turns (default 0.25)" in text
    assert "--echo.shape {flat,growing} how contexts grow (default flat)" in text
    assert "--echo.note" not in text
    assert "--shelf.keep {true,false} keep the KV (in unbounded host DRAM) (default false)" in text
    assert "--lanes.lanes INT parallel lanes (default 1)" in text
    comparison = _serve_bench(monkeypatch, ["--workload", "echo", "--configs", "shelf", "--topology", "lanes",
                                            "--echo.users", "3", "--echo.shape", "growing", "--shelf.keep", "true",
                                            "--lanes.lanes", "4"])
    (spec, params), = comparison.specs()
    assert spec.config == EchoConfig(users=3, shape="growing")
    w = W.build(spec)
    engine = Lanes(w, "shelf", params, 1.0, LinearGpu())
    assert engine.options == Lanes.Options(lanes=4) and engine.system == Shelf(keep=True)
    assert Engine(w, "shelf", params, 1.0, LinearGpu()).options is None   # the colocated engine has none
    # a GPU pool of one request: each user's second turn finds its prefix only where Shelf kept it
    w = W.build(dataclasses.replace(spec, config=dataclasses.replace(spec.config, pause=1.5)))
    tiny = params.replace(gpu_kv_bytes=1_600_000)
    kept = replay(w, "shelf", tiny, 1.0, "lanes", gpu=LinearGpu())
    dropped = replay(w, "shelf", tiny.replace(options=()), 1.0, "lanes", gpu=LinearGpu())
    assert kept.tokens["dram"].sum() > 0 and dropped.tokens["dram"].sum() == 0


def test_a_name_two_families_share_is_qualified_by_its_family(registered):
    W.WORKLOADS.add("shelf", W.WorkloadKind(_echo, EchoConfig))
    try:
        flags = {f.flag for f in options.option_flags()}
        assert "--workload:shelf.users" in flags and "--system:shelf.keep" in flags
        assert "--shelf.users" not in flags and "--shelf.keep" not in flags
    finally:
        W.WORKLOADS.unregister("shelf")


OUTSIDE = '''
import dataclasses
from cxlhm_apps.serving.workloads import WorkloadKind

@dataclasses.dataclass(frozen=True)
class PingConfig:
    users: int = 2      # how many users ping
    rounds: int = 1

def ping(cfg):
    raise AssertionError("not built here")

KIND = WorkloadKind(ping, PingConfig)
'''


def test_an_entry_point_workload_gets_its_flags_with_no_edit_to_the_command(tmp_path, monkeypatch):
    (tmp_path / "outside_ping_flags.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="ping", value="outside_ping_flags:KIND", group="cxlhm.serving_workloads")
    monkeypatch.setattr(W.WORKLOADS, "entry_points", lambda: {"ping": ep})
    try:
        text = " ".join(_parser().format_help().split())
        assert "--ping.users INT how many users ping (default 2)" in text and "--ping.rounds INT" in text
        args = _parser().parse_args(["--workload", "ping", "--ping.rounds", "3"])
        assert options.from_args(args) == {("workload", "ping"): {"rounds": 3}}
    finally:
        W.WORKLOADS._cache.pop("ping", None)
        sys.modules.pop("outside_ping_flags", None)


# ---------------------------------------------------------------- values as text
@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["constant", "lognormal", "uniform", "exponential"]),
       a=st.floats(0.001, 1e6, allow_nan=False), b=st.floats(0.0, 1e6, allow_nan=False))
def test_a_distribution_written_as_yaml_reads_back_equal(kind, a, b):
    flag = next(f for f in options.option_flags() if f.flag == "--agent.turns")
    if kind == "uniform":
        a, b = min(a, b), max(a, b)
    keys = W.DIST_KEYS[kind]
    text = "{dist: %s, %s}" % (kind, ", ".join(f"{k}: {v!r}" for k, v in zip(keys, (a, b))))
    expected = W.Dist(kind, a, b if len(keys) > 1 else 0.0)
    assert options.convert(flag, text) == expected


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=12))
def test_any_text_for_an_integer_flag_is_a_value_or_an_error_naming_the_flag(text):
    flag = next(f for f in options.option_flags() if f.flag == "--qa.users")
    try:
        value = options.convert(flag, text)
    except ValueError as exc:
        assert str(exc).startswith("--qa.users: ") and "an integer" in str(exc)
    else:
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0


def test_exponent_form_numbers_are_numbers_in_flags_and_in_workload_files(tmp_path):
    """PyYAML alone reads 1e-3 as text (YAML 1.1 floats need a dot)."""
    args = _parser().parse_args(["--workload", "qa", "--qa.qps", "2e-1", "--qa.question_tokens",
                                 "{dist: lognormal, median: 6E1, sigma: 5e-1}"])
    assert options.from_args(args)[("workload", "qa")] == {"qps": 0.2, "question_tokens": W.Dist("lognormal", 60, 0.5)}
    (tmp_path / "q.yaml").write_text("kind: qa\nqps: 1e-1\nhistory_tokens: 2_000\n")
    spec = W.resolve(str(tmp_path / "q.yaml"))
    assert (spec.config.qps, spec.config.history_tokens) == (0.1, 2000)


def test_firmware_parameters_are_per_policy_and_checked_by_the_policy():
    from cxlhm_apps.serving.params import ServingParams, params_from
    p = params_from((("firmware_params", {"s3fifo": {}, "lru": {}}),))
    assert dict(p.firmware_params)["hymcache"] == dict(ServingParams().firmware_params)["hymcache"]  # kept
    assert params_from((("firmware_params", {"hymcache": {"fill_ns": 5}}),)).firmware_params == \
        (("hymcache", (("fill_ns", 5),)),)
    with pytest.raises(ValueError, match="firmware_params: policy 'hymcache' has no parameter 'fill'; accepted: "):
        params_from((("firmware_params", {"hymcache": {"fill": 5}}),))
    with pytest.raises(ValueError, match="unknown firmware policy 'nope'"):
        params_from((("firmware_params", {"nope": {}}),))


def test_a_workload_files_kind_takes_the_flags_over_its_own_values(tmp_path, monkeypatch):
    path = tmp_path / "few.yaml"
    path.write_text("kind: qa\nusers: 4\nrounds: 3\n")
    comparison = _serve_bench(monkeypatch, ["--workload", str(path), "--configs", "recompute", "--qa.users", "6"])
    (spec, _), = comparison.specs()
    assert (spec.kind, spec.config.users, spec.config.rounds) == ("qa", 6, 3)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    sessions: int = 3       # closed-loop sessions
    requests: int = 9       # requests in all


def test_the_bench_gives_requests_and_sessions_to_the_workloads_whose_config_has_them():
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import bench_serving
    finally:
        sys.path.pop(0)
    sizes = bench_serving.workload_sizes
    assert sizes("mooncake,agent,qa", requests=50, sessions=4) == {"mooncake": {"requests": 50},
                                                                   "agent": {"sessions": 4}}
    assert sizes("mooncake-synthetic,coding-agent", requests=None, sessions=7) == {"coding-agent": {"sessions": 7}}
    W.WORKLOADS.add("loop", W.WorkloadKind(_echo, LoopConfig))   # registered here: no edit to the bench
    try:
        assert sizes("loop,qa", requests=5, sessions=2) == {"loop": {"requests": 5, "sessions": 2}}
    finally:
        W.WORKLOADS.unregister("loop")
    with pytest.raises(SystemExit, match="--sessions: none of the workloads \\(qa\\) has a sessions field"):
        sizes("qa", sessions=2)
