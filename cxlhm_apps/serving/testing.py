"""The conformance suites every serving workload and serving system passes, shipped so an
outside package can run them on its own implementation (as cxlhm.testing.policies does
for firmware policies):

    # tests/test_my_serving.py in the package that registers workload "chat" (entry-point
    # group cxlhm.serving_workloads) and system "tape" (cxlhm.serving_systems)
    from cxlhm_apps.serving.testing import ServingSystemConformance, WorkloadConformance

    class TestChat(WorkloadConformance):
        name = "chat"
        changes = {"users": 6}          # config overrides that keep the suite quick

    class TestTape(ServingSystemConformance):
        name = "tape"

`WorkloadConformance`: the registry entry has its metadata (a config dataclass whose
fields the YAML files and the generated flags can set, a positive reference speed,
--quick sizes and a scale field that are fields of it); the generator is deterministic
under its seed; every request is well formed (chunks of `chunk_tokens` but the last,
a chunk id always the same tokens at the same position, parents earlier in the same
session); the generated flags parse back into the config; and it runs through a short
comparison against two configurations.

`ServingSystemConformance`: the configuration has make_tier(ctx) returning a `Tier`, its
metadata (`configs.Meta`) and load/store modes are valid, its generated flags reach it,
and a short replay of a small agent workload is deterministic, accounts for every context
token, serves no more from its tier than an earlier request computed, gives sane metrics,
and runs in the colocated and disaggregated topologies.

`TopologyConformance`: the registered engine class takes the engine constructor's
arguments and its `topology` is its registered name (its options are looked up by it);
a replay through it of a small agent workload, with a configuration that stores and one
that does not, finishes every request, accounts for every context token, reports one
busy time per GPU and is deterministic; its `Options` (if any) are a dataclass whose
flags reach `self.options`; and a fail-fast replay stops with `SloMissed` once the SLO is
surely missed (the max-QPS search relies on it).

All three drive the serving model with `LinearGpu`, a GPU whose costs can be worked out by
hand, so they need no calibration data and run in seconds. They need pytest.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import typing

import numpy as np
import pytest

from cxlhm_apps.serving import configs, options, workloads as W
from cxlhm_apps.serving.comparison import Comparison
from cxlhm_apps.serving.metrics import summarize
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.tiers import Tier
from cxlhm_apps.serving.topologies import engine_for, replay

__all__ = ["LinearGpu", "WorkloadConformance", "ServingSystemConformance", "TopologyConformance",
           "small_agent_workload"]

ROLES = ("recompute", "store", "device", "pool", "bound", "multi")


class LinearGpu:
    """A GPU whose costs can be worked out by hand: a prefill iteration takes 10 ms + 0.1 ms
    per new token, a decode step 10 ms; KV is 1000 bytes per token; the host link moves
    `bandwidth` bytes/s with no latency; 32 layers. An iteration that mixes prefill chunks
    with decodes costs the prefill plus one decode step, or, with `mixed_decode_s`, the
    prefill plus that much per decode (vLLM V1's mixed batches)."""
    kv_bytes_per_token = 1000
    h2d_latency_s = 0.0
    layers = 32

    def __init__(self, bandwidth: float = 1e9, mixed_decode_s: float | None = None):
        self.h2d_bandwidth = bandwidth
        if mixed_decode_s is not None:
            self.mixed_decode_s = mixed_decode_s
            self.iteration_s = self._mixed_iteration_s  # the engine looks for iteration_s

    def prefill_s(self, news, cacheds):
        return 0.010 + 1e-4 * float(np.sum(news))

    def prefill_alone_s(self, news, cacheds):
        return 0.010 + 1e-4 * np.asarray(news, np.float64)

    def decode_steps_s(self, batch, context, steps):
        return np.full(steps, 0.010)

    def _mixed_iteration_s(self, news, cacheds, batch, context):
        return self.prefill_s(news, cacheds) + self.mixed_decode_s * batch


def small_agent_workload(sessions: int = 6) -> W.Workload:
    """A few short agent sessions arriving close together: reuse within sessions and
    across them (the shared prompt), with contexts that outgrow a small GPU pool."""
    return W.agent(W.AgentConfig(sessions=sessions, session_rate=2.0, system_prompt_tokens=1024,
                                 tool_description_tokens=1024, turns=W.Dist("uniform", 3, 6),
                                 tool_pause_s=W.Dist("constant", 0.5), max_context_tokens=8_000))


# A GPU pool of 12k tokens at LinearGpu's 1000 B/token (contexts reach 8k): reusable KV spills to the tier.
SMALL = ServingParams(gpu_kv_bytes=12_000_000, dram_bytes=64 << 20, max_batched_tokens=2048)


def _same_requests(a: W.Workload, b: W.Workload) -> bool:
    return len(a.requests) == len(b.requests) and all(
        np.array_equal(x.chunk_ids, y.chunk_ids) and np.array_equal(x.chunk_tokens, y.chunk_tokens)
        and (x.session, x.turn, x.output_tokens, x.arrival_ns, x.parent, x.after_parent_ns, x.last_turn)
        == (y.session, y.turn, y.output_tokens, y.arrival_ns, y.parent, y.after_parent_ns, y.last_turn)
        for x, y in zip(a.requests, b.requests))


class WorkloadConformance:
    """Subclass with `name` (a registered workload) and optionally `changes` (config
    overrides that keep it small: the suite builds it a few times)."""
    name: str = ""
    changes: dict = {}
    comparison_configs: tuple = ("recompute", "lmcache-local")

    @pytest.fixture(scope="class")
    @classmethod
    def entry(cls) -> W.WorkloadKind:
        assert cls.name, f"{cls.__name__} must set `name` to a registered workload"
        return W.kind(cls.name)

    @pytest.fixture(scope="class")
    @classmethod
    def config(cls, entry):
        return dataclasses.replace(entry.config(), **cls.changes)

    @pytest.fixture(scope="class")
    @classmethod
    def built(cls, entry, config) -> W.Workload:
        return entry.build(config)

    # -- metadata ----------------------------------------------------------------------
    def test_metadata_is_present(self, entry):
        assert isinstance(entry, W.WorkloadKind)
        assert dataclasses.is_dataclass(entry.config), "the config must be a dataclass (its fields are the options)"
        entry.config()  # every field has a default
        fields = {f.name: f for f in dataclasses.fields(entry.config)}
        assert entry.reference_speed > 0 and math.isfinite(entry.reference_speed)
        for field, value in entry.quick:
            assert field in fields, f"--quick sets {field!r}, which is not a field of {entry.config.__name__}"
        if entry.scale_field:
            assert entry.scale_field in fields and isinstance(getattr(entry.config(), entry.scale_field), int)
        assert self.name in W.names()

    def test_every_config_field_can_be_set_from_yaml_and_the_command_line(self, entry):
        hints = typing.get_type_hints(entry.config)
        for f in dataclasses.fields(entry.config):
            assert W.supported(hints[f.name]), \
                f"{entry.config.__name__}.{f.name}: type {hints[f.name]} cannot be read from YAML or a flag"

    def test_generated_flags_parse_back_into_the_config(self, entry):
        parser = argparse.ArgumentParser()
        flags = [f for f in options.add_option_flags(parser) if f.family == "workload" and f.name == self.name]
        assert {f.field for f in flags} == {name for name, _, _ in options.option_fields(entry.config)}
        argv = []
        for f in flags:
            if f.kind in (int, float, str) or typing.get_origin(f.kind) is typing.Literal:
                argv += [f.flag, str(f.default)]
            elif f.kind is bool:
                argv += [f.flag, "true" if f.default else "false"]
        given = options.from_args(parser.parse_args(argv))
        values = given.get(("workload", self.name), {})
        assert dataclasses.replace(entry.config(), **values) == entry.config()
        typed = [f for f in flags if f.kind is not str and typing.get_origin(f.kind) is not typing.Literal]
        if typed:  # a value of the wrong type is refused, naming the flag
            with pytest.raises(ValueError, match=typed[0].flag.replace(".", r"\.")):
                options.from_args(parser.parse_args([typed[0].flag, "[not, a, value, of, this, type]"]))

    def test_the_config_round_trips_through_a_yaml_file(self, entry, config, tmp_path_factory):
        import yaml
        path = tmp_path_factory.mktemp("workload") / f"{self.name}.yaml"
        data = {"kind": self.name}
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if isinstance(value, W.Dist):
                keys = W.DIST_KEYS[value.kind]
                value = {"dist": value.kind, **dict(zip(keys, (value.a, value.b)))}
            data[f.name] = value
        path.write_text(yaml.safe_dump(data))
        assert W.spec_from_yaml(path).config == config

    # -- the requests ------------------------------------------------------------------
    def test_deterministic_under_its_seed(self, entry, config, built):
        again = entry.build(dataclasses.replace(config))
        assert _same_requests(built, again)
        if "seed" in {f.name for f in dataclasses.fields(config)}:
            other = entry.build(dataclasses.replace(config, seed=config.seed + 1))
            assert not _same_requests(built, other), "another seed should give other requests"

    def test_requests_are_well_formed(self, built):
        assert isinstance(built, W.Workload) and built.requests, "a workload has requests"
        assert built.chunk_tokens >= 1
        seen: dict[int, tuple[int, int]] = {}  # chunk id -> (position, tokens)
        for i, r in enumerate(built.requests):
            where = f"request {i}"
            assert r.index == i, f"{where}: index {r.index}"
            assert r.session >= 1 and r.turn >= 0, where
            assert r.chunk_ids.ndim == 1 and r.chunk_ids.dtype == np.int64 and r.chunk_ids.size >= 1, where
            assert r.chunk_tokens.shape == r.chunk_ids.shape and r.chunk_tokens.dtype == np.int64, where
            assert (r.chunk_ids >= 0).all(), where
            assert (r.chunk_tokens >= 1).all() and (r.chunk_tokens <= built.chunk_tokens).all(), where
            assert (r.chunk_tokens[:-1] == built.chunk_tokens).all(), f"{where}: only the last chunk may be partial"
            assert r.output_tokens >= 1, where
            assert math.isfinite(r.arrival_ns) and r.arrival_ns >= 0, where
            if r.parent >= 0:
                parent = built.requests[r.parent]
                assert r.parent < i and parent.session == r.session, f"{where}: parent {r.parent}"
            if r.after_parent_ns is not None:
                assert r.parent >= 0 and r.after_parent_ns >= 0, f"{where}: a pause needs a parent"
            assert r.expected_pause_ns >= 0, where
            for pos, (cid, tokens) in enumerate(zip(r.chunk_ids.tolist(), r.chunk_tokens.tolist())):
                first = seen.setdefault(cid, (pos, tokens))
                assert first == (pos, tokens), (f"{where}: chunk id {cid} at position {pos} with {tokens} tokens, "
                                                 f"earlier at {first[0]} with {first[1]}: equal ids must be the "
                                                 f"same KV (the same prefix)")
        sessions = {r.session for r in built.requests}
        last = {r.session for r in built.requests if r.last_turn}
        assert sessions == last, "every session has a last turn"
        summary = built.summary()
        assert summary["requests"] == len(built.requests) and 0.0 <= summary["reusable_chunk_share"] < 1.0

    def test_a_faster_replay_scales_its_field(self, entry, config):
        spec = W.WorkloadSpec(self.name, config)
        faster = W.spec_at_speed(spec, 2.0)
        if entry.scale_field:
            assert getattr(faster.config, entry.scale_field) == max(1, round(getattr(config, entry.scale_field) * 2))
        else:
            assert faster == spec

    def test_runs_through_a_short_comparison(self, config, built):
        # a GPU pool for four of its largest requests (LinearGpu: 1000 bytes of KV per token)
        biggest = max(r.input_tokens + r.output_tokens for r in built.requests)
        params = SMALL.replace(gpu_kv_bytes=4 * biggest * LinearGpu.kv_bytes_per_token)
        comparison = Comparison([self.name], list(self.comparison_configs), params, [], ["colocated"], search=False,
                                sizes={self.name: {f.name: getattr(config, f.name)
                                                   for f in dataclasses.fields(config)}})
        tasks = comparison.tasks()
        assert [t.config for t in tasks] == list(self.comparison_configs)
        assert tasks[0].workload.config == config
        for task in tasks:  # each cell's reference replay, on the hand-worked GPU (no calibration data)
            w = W.build(W.spec_at_speed(task.workload, task.reference_speed))
            res = replay(w, task.config, task.params, task.reference_speed, task.topology, gpu=LinearGpu())
            s = summarize(res, SMALL.slo_ttft_s, SMALL.slo_percentile, SMALL.slo_tbt_ms)
            assert s["requests"] == len(w.requests)
            assert s["ttft_mean_s"] > 0 and math.isfinite(s["ttft_p99_s"])
            shares = s["hit_gpu"] + s["hit_dram"] + s["hit_ssd"] + s["hit_miss"]
            assert shares == pytest.approx(1.0) or shares == 0.0  # 0: nothing in it is reusable


class ServingSystemConformance:
    """Subclass with `name` (a registered configuration, or cxlhm:<policy>[+hints]);
    optionally `params` (the serving parameters of the replay), `sessions` and `topologies`."""
    name: str = ""
    params: ServingParams = SMALL
    sessions: int = 6
    topologies: tuple = ("colocated", "disagg")

    @pytest.fixture(scope="class")
    @classmethod
    def system(cls):
        assert cls.name, f"{cls.__name__} must set `name` to a registered configuration"
        return configs.make_system(cls.name)

    @pytest.fixture(scope="class")
    @classmethod
    def workload(cls) -> W.Workload:
        return small_agent_workload(cls.sessions)

    @pytest.fixture(scope="class")
    @classmethod
    def result(cls, workload):
        return replay(workload, cls.name, cls.params, 1.0, gpu=LinearGpu())

    def test_metadata_is_present(self, system):
        assert callable(getattr(system, "make_tier", None))
        meta = getattr(system, "meta", None)
        assert meta is None or isinstance(meta, configs.Meta), "metadata is a configs.Meta"
        meta = configs.meta(self.name)
        assert meta.role in ROLES, f"role {meta.role!r}: one of {', '.join(ROLES)}"
        assert isinstance(meta.order, int) and meta.baseline in ("",) + tuple(configs.baselines())
        load, store = configs.modes(system, ServingParams())
        assert load in (configs.ASYNC, configs.BLOCKING, configs.LAYERWISE)
        assert store in (configs.ASYNC, configs.BLOCKING)
        if meta.in_all:
            assert self.name in configs.all_names()

    def test_make_tier_gives_a_tier(self, system, workload):
        ctx = configs.TierContext(self.params, workload.max_chunk_id + 1, workload.chunk_tokens * 1000, 1, 1e9, 0.0)
        tier = system.make_tier(ctx)
        assert isinstance(tier, Tier)
        assert isinstance(tier.stats(), dict)
        assert not tier.has_many([0, 1, 2]).any(), "a fresh tier holds nothing"

    def test_options_reach_the_configuration(self, system):
        """Each option field set to another valid value (as its generated flag would) is the
        value of the configuration the replay builds."""
        cls = type(system) if dataclasses.is_dataclass(system) and not isinstance(system, type) else None
        if cls is None:
            pytest.skip("not a dataclass: no generated flags")
        for field, kind, _ in options.option_fields(cls):
            default = getattr(system, field)
            if typing.get_origin(kind) is typing.Literal:
                others = [c for c in typing.get_args(kind) if c != default]
                value = others[0] if others else default
            elif kind is bool:
                value = not default
            elif kind in (int, float):
                value = kind(default * 2 + 1)
            else:
                continue  # text and distributions: no generic other value that the configuration accepts
            params = ServingParams().with_options("system", self.name, **{field: value})
            try:
                built = configs.make_system(self.name, params)
            except ValueError:
                continue  # the configuration's own checks refused the value: they name it
            assert getattr(built, field) == value and getattr(configs.make_system(self.name), field) == default

    def test_a_replay_is_deterministic(self, workload, result):
        again = replay(workload, self.name, self.params, 1.0, gpu=LinearGpu())
        assert np.array_equal(result.first_token, again.first_token, equal_nan=True)
        assert np.array_equal(result.done, again.done, equal_nan=True)

    def test_every_request_finishes_and_every_token_is_accounted_for(self, workload, result):
        n = len(workload.requests)
        assert result.first_token.shape == (n,) and not np.isnan(result.first_token).any()
        assert (result.first_token >= result.arrival).all() and (result.done >= result.first_token).all()
        t = result.tokens
        total = sum(t[k] for k in ("new", "gpu", "dram", "ssd", "recomputed"))
        assert total.tolist() == [r.input_tokens for r in workload.requests]
        assert (np.concatenate(list(t.values())) >= 0).all()

    def test_the_tier_serves_only_what_was_computed_before(self, workload, result):
        """Tokens from the tier (DRAM, SSD) are KV an earlier request computed: at most the
        reusable tokens no GPU held."""
        ids_seen: set[int] = set()
        reusable = []
        for r in workload.requests:
            ids = r.chunk_ids.tolist()
            reusable.append(sum(int(tok) for cid, tok in zip(ids, r.chunk_tokens.tolist()) if cid in ids_seen))
            ids_seen.update(ids)
        t = result.tokens
        from_tier = t["dram"] + t["ssd"]
        assert (from_tier + t["gpu"] <= np.array(reusable)).all()

    def test_runs_in_each_topology(self, workload):
        for topology in self.topologies:
            res = replay(workload, self.name, self.params, 1.0, topology, gpu=LinearGpu())
            assert not np.isnan(res.done).any() and (res.done >= res.first_token).all(), topology
            assert len(res.gpu_busy_ns) == getattr(engine_for(topology), "n_gpus", 1), topology

    def test_metrics_are_sane(self, result):
        s = summarize(result, self.params.slo_ttft_s, self.params.slo_percentile, self.params.slo_tbt_ms)
        assert 0 < s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]
        for key in ("hit_gpu", "hit_dram", "hit_ssd", "hit_miss"):
            assert 0.0 <= s[key] <= 1.0, key
        assert s["hit_gpu"] + s["hit_dram"] + s["hit_ssd"] + s["hit_miss"] == pytest.approx(1.0)
        assert s["throughput_rps"] > 0 and s["tbt_mean_ms"] >= 0


class TopologyConformance:
    """Subclass with `name` (a registered topology); optionally `configs` (the
    configurations replayed through it), `params` and `sessions`."""
    name: str = ""
    configs: tuple = ("recompute", "lmcache-local")
    params: ServingParams = SMALL
    sessions: int = 6

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls):
        assert cls.name, f"{cls.__name__} must set `name` to a registered topology"
        return engine_for(cls.name)

    @pytest.fixture(scope="class")
    @classmethod
    def workload(cls) -> W.Workload:
        return small_agent_workload(cls.sessions)

    def test_metadata_is_present(self, engine):
        assert isinstance(engine, type) and callable(getattr(engine, "run", None))
        assert engine.topology == self.name, "options and results are keyed by the registered name"
        assert int(getattr(engine, "n_gpus", 1)) >= 1
        config = getattr(engine, "Options", None)
        if config is not None:
            assert dataclasses.is_dataclass(config), "Options must be a dataclass (its fields are the flags)"
            config()  # every field has a default

    def test_options_reach_the_engine(self, engine, workload):
        config = getattr(engine, "Options", None)
        if config is None:
            pytest.skip("no Options: no generated flags")
        for field, kind, _ in options.option_fields(config):
            default = getattr(config(), field)
            if typing.get_origin(kind) is typing.Literal:
                value = next((c for c in typing.get_args(kind) if c != default), default)
            elif kind in (int, float):
                value = kind(default * 2 + 1)
            elif kind is bool:
                value = not default
            else:
                continue
            params = self.params.with_options("topology", self.name, **{field: value})
            assert getattr(engine(workload, self.configs[0], params, 1.0, LinearGpu()).options, field) == value

    def test_every_request_finishes_and_every_token_is_accounted_for(self, engine, workload):
        for config in self.configs:
            res = engine(workload, config, self.params, 1.0, LinearGpu()).run()
            assert not np.isnan(res.done).any(), config
            assert (res.first_token >= res.arrival).all() and (res.done >= res.first_token).all(), config
            total = sum(res.tokens[k] for k in ("new", "gpu", "dram", "ssd", "recomputed"))
            assert total.tolist() == [r.input_tokens for r in workload.requests], config
            assert len(res.gpu_busy_ns) == int(getattr(engine, "n_gpus", 1)) and all(b > 0 for b in res.gpu_busy_ns)
            s = summarize(res, self.params.slo_ttft_s, self.params.slo_percentile, self.params.slo_tbt_ms)
            assert s["hit_gpu"] + s["hit_dram"] + s["hit_ssd"] + s["hit_miss"] == pytest.approx(1.0)

    def test_a_replay_is_deterministic(self, workload):
        a, b = (replay(workload, self.configs[-1], self.params, 1.0, self.name, gpu=LinearGpu()) for _ in range(2))
        assert np.array_equal(a.first_token, b.first_token) and np.array_equal(a.done, b.done)

    def test_a_fail_fast_replay_stops_once_the_slo_is_surely_missed(self, workload):
        from cxlhm_apps.serving.scheduler import SloMissed
        hopeless = self.params.replace(slo_ttft_s=1e-6)   # no request can meet a microsecond TTFT
        with pytest.raises(SloMissed):
            replay(workload, self.configs[0], hopeless, 1.0, self.name, gpu=LinearGpu(), fail_fast=True)
        res = replay(workload, self.configs[0], hopeless, 1.0, self.name, gpu=LinearGpu())  # without: to the end
        assert not np.isnan(res.done).any()
