"""Workloads: lists of requests with their KV chunks, sessions and arrival rules.

* `mooncake` - the Mooncake conversation trace (shared/traces): sessions recovered from
  the hash-id chains (cxlhm.traces.sessions), one chunk per 512-token hash id, arrivals
  at the trace's timestamps (open loop; the speed factor divides them).
* `agent` - synthetic agent sessions: a shared system prompt and tool descriptions,
  then model turns alternating with tool calls; each tool's output is appended, so the
  context grows every turn; the next turn arrives a sampled tool pause after the
  previous one finished (closed loop). New sessions arrive as a Poisson process.
* `qa` - LMCache's multi-round QA benchmark: users x rounds, a shared system prompt, a
  per-user history, questions and answers appended each round; requests are released at
  `qps` (round robin over users), and a user's next question waits for the answer.

A chunk is `chunk_tokens` (512) consecutive tokens of a context; equal chunk ids are the
same KV (the prefix-hash scheme: a chunk's id covers its tokens and everything before
it), so a chunk is reusable only as part of a prefix. The last chunk of a context is
usually partial; it gets its own id, which the next turn (whose chunk there is longer)
does not share - exactly what the trace's hash ids do.

Every parameter can be set in YAML (`--workload FILE.yaml`); errors name the line.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np

from cxlhm.registry import Registry
from cxlhm_apps.serving.yamlspec import Spec, SpecError, load_yaml, number
from cxlhm.traces.mooncake import BLOCK_TOKENS, DEFAULT_TRACE, read_requests
from cxlhm.traces.sessions import recover_sessions

S = 1_000_000_000  # ns per second


@dataclasses.dataclass(frozen=True)
class Request:
    index: int
    session: int                 # 1-based
    turn: int
    chunk_ids: np.ndarray        # int64: the context's chunks, in order
    chunk_tokens: np.ndarray     # int64: tokens in each chunk (the last may be partial)
    output_tokens: int
    arrival_ns: float            # release time at speed 1 (scaled by 1/speed in a replay)
    parent: int = -1             # the session's previous turn, -1 for the first
    after_parent_ns: float | None = None  # closed loop: arrive this long after the parent finished
    last_turn: bool = True
    expected_pause_ns: int = 0   # what the serving runtime expects before the next turn (0: unknown)

    @property
    def input_tokens(self) -> int:
        return int(self.chunk_tokens.sum())


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[Request, ...]
    description: str
    chunk_tokens: int = BLOCK_TOKENS
    open_loop: bool = True       # True: arrivals are fixed times; False: sessions run closed loop

    @property
    def max_chunk_id(self) -> int:
        return max(int(r.chunk_ids.max()) for r in self.requests if r.chunk_ids.size)

    def summary(self) -> dict:
        sessions = {r.session for r in self.requests}
        ids = np.concatenate([r.chunk_ids for r in self.requests])
        reusable = ids.size - np.unique(ids).size
        return {"requests": len(self.requests), "sessions": len(sessions),
                "mean_input_tokens": float(np.mean([r.input_tokens for r in self.requests])),
                "mean_output_tokens": float(np.mean([r.output_tokens for r in self.requests])),
                "reusable_chunk_share": reusable / max(1, ids.size)}


# ---------------------------------------------------------------- distributions
@dataclasses.dataclass(frozen=True)
class Dist:
    """A sampled parameter: constant, lognormal(median, sigma), uniform(low, high) or
    exponential(mean)."""
    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "constant":
            return self.a
        if self.kind == "lognormal":
            return float(math.exp(rng.normal(math.log(self.a), self.b)))
        if self.kind == "uniform":
            return float(rng.uniform(self.a, self.b))
        return float(rng.exponential(self.a))  # exponential

    def median(self) -> float:
        return {"constant": self.a, "lognormal": self.a, "uniform": (self.a + self.b) / 2,
                "exponential": self.a * math.log(2)}[self.kind]

    def tokens(self, rng: np.random.Generator) -> int:
        return max(1, int(round(self.sample(rng))))


# the YAML keys of each distribution, in Dist(kind, a, b) order
DIST_KEYS = {"constant": ("value",), "lognormal": ("median", "sigma"), "uniform": ("low", "high"),
              "exponential": ("mean",)}


def _parse_dist(spec: Spec, key: str, value) -> Dist:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Dist("constant", float(number(spec, key, value, minimum=0)))
    if not isinstance(value, Mapping) or "dist" not in value:
        raise spec.error(key, "must be a number or a mapping such as {dist: lognormal, median: 300, sigma: 0.8}; "
                              f"got {value!r}")
    kind = value["dist"]
    if kind not in DIST_KEYS:
        raise spec.error(f"{key}.dist", f"must be one of {', '.join(DIST_KEYS)}, got {kind!r}")
    need = DIST_KEYS[kind]
    for k in value:
        if k != "dist" and k not in need:
            raise spec.error(f"{key}.{k}", f"unknown key for a {kind} distribution; it takes {', '.join(need)}")
    args = []
    for k in need:
        if k not in value:
            raise spec.error(key, f"a {kind} distribution needs {k!r}")
        args.append(float(number(spec, f"{key}.{k}", value[k], minimum=0)))
    if kind == "lognormal" and args[0] <= 0:
        raise spec.error(f"{key}.median", "must be > 0")
    if kind == "uniform" and args[1] < args[0]:
        raise spec.error(f"{key}.high", f"must be >= low ({args[0]:g})")
    return Dist(kind, *args)


def parse_value(spec: Spec, key: str, value, kind):
    """`value` (as YAML gives it) checked against the field type `kind`; errors name the
    key (and the line, for a file). The types a config field may have: int, float, str,
    bool, Dist, int | None and typing.Literal[...] (its choices)."""
    if kind is Dist:
        return _parse_dist(spec, key, value)
    if kind is bool:
        if not isinstance(value, bool):
            raise spec.error(key, f"must be true or false, got {value!r}")
        return value
    if kind is int:
        return number(spec, key, value, minimum=0, integer=True)
    if kind is float:
        return float(number(spec, key, value, minimum=0))
    if kind is str:
        if not isinstance(value, str):
            raise spec.error(key, f"must be a string, got {value!r}")
        return value
    if kind == (int | None):
        return None if value is None else number(spec, key, value, minimum=1, integer=True)
    if typing.get_origin(kind) is typing.Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise spec.error(key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported config field type {kind}")


def supported(kind) -> bool:
    """Whether parse_value takes a field of type `kind`."""
    return kind in (Dist, bool, int, float, str) or kind == (int | None) or \
        typing.get_origin(kind) is typing.Literal


def parse_config(cls, spec: Spec, *, skip=()):
    """Fill dataclass `cls` from a YAML mapping, checking each value against the field's
    type; errors name the line and the key."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    spec.check_keys(set(fields) | set(skip), cls.__name__)
    hints = typing.get_type_hints(cls)
    values = {key: parse_value(spec, key, value, hints[key]) for key, value in spec.data.items() if key not in skip}
    try:
        return cls(**values)
    except ValueError as exc:
        raise spec.error("", str(exc)) from None


# ---------------------------------------------------------------- generators
@dataclasses.dataclass(frozen=True)
class WorkloadKind:
    """A registered workload: its generator, its config dataclass (the YAML keys and their
    types), and what the comparison needs to know about it.

    reference_speed  replay speed of the TTFT columns, where the max-QPS search starts
    quick            (field, value) pairs --quick applies (small sizes)
    scale_field      the config field a faster replay multiplies (an open stream of
                     closed-loop sessions: more sessions over the same window); "" for a
                     trace, which is the same requests at every speed
    order            position in listings
    in_default       run when serve-bench is given no --workload"""
    build: typing.Callable
    config: type
    reference_speed: float = 1.0
    quick: tuple = ()
    scale_field: str = ""
    order: int = 50
    in_default: bool = False


def _as_kind(obj) -> WorkloadKind:
    """A WorkloadKind, or a generator function with a `config` attribute (its dataclass)
    and optionally reference_speed / quick / scale_field attributes."""
    if isinstance(obj, WorkloadKind):
        return obj
    config = getattr(obj, "config", None)
    if not callable(obj) or not dataclasses.is_dataclass(config):
        raise TypeError(f"{obj!r} is neither a WorkloadKind nor a generator with a `config` dataclass attribute")
    return WorkloadKind(obj, config, float(getattr(obj, "reference_speed", 1.0)), tuple(getattr(obj, "quick", ())),
                        str(getattr(obj, "scale_field", "")), int(getattr(obj, "order", 50)))


# Built-ins below; an installed package adds one under the entry-point group
# cxlhm.serving_workloads (a WorkloadKind, or a generator with a `config` dataclass).
WORKLOADS: Registry = Registry("workload", "cxlhm.serving_workloads", check=_as_kind)


def workload(name: str, config: type, **meta):
    """Register the decorated generator as workload `name` (meta: WorkloadKind's fields)."""
    def add(fn):
        WORKLOADS.add(name, WorkloadKind(fn, config, **meta))
        return fn
    return add


def kind(name: str) -> WorkloadKind:
    """The registered workload `name` (ValueError listing the known ones, or naming a
    broken entry point)."""
    from cxlhm.registry import RegistryError
    try:
        return WORKLOADS.get(name)
    except RegistryError as exc:
        raise ValueError(f"{exc}, or a YAML file") from None


def names() -> list[str]:
    """Registered workloads, in their order."""
    loaded, _ = WORKLOADS.load_all()
    return sorted(loaded, key=lambda n: (loaded[n].order, n))


def default_names() -> list[str]:
    """What serve-bench runs without --workload: the registered workloads marked in_default."""
    loaded, _ = WORKLOADS.load_all()
    return [n for n in names() if loaded[n].in_default]


def reference_speed(name: str) -> float:
    try:
        return kind(name).reference_speed
    except ValueError:
        return 1.0


def quick_sizes() -> dict[str, dict]:
    """--quick's sizes of every registered workload."""
    loaded, _ = WORKLOADS.load_all()
    return {n: dict(k.quick) for n, k in loaded.items() if k.quick}


class _ChunkIds:
    """Dense chunk ids: shared-prefix chunks first, then fresh ids per session chunk."""

    def __init__(self, first_free: int):
        self.next = first_free
        self.full: dict[tuple[int, int], int] = {}

    def context(self, session: int, shared_tokens: int, total_tokens: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        n = -(-total_tokens // chunk)
        ids = np.empty(n, np.int64)
        tokens = np.full(n, chunk, np.int64)
        tokens[-1] = total_tokens - chunk * (n - 1)
        for j in range(n):
            end = min(total_tokens, (j + 1) * chunk)
            if end <= shared_tokens and tokens[j] == chunk:
                ids[j] = j  # entirely inside the shared prompt: the same KV for every session
            elif tokens[j] == chunk:
                ids[j] = self.full.setdefault((session, j), self._fresh())
            else:
                ids[j] = self._fresh()  # a partial chunk: the next turn's chunk here is longer
        return ids, tokens

    def _fresh(self) -> int:
        self.next += 1
        return self.next - 1


@dataclasses.dataclass(frozen=True)
class MooncakeConfig:
    trace: str = str(DEFAULT_TRACE)   # the trace file (Mooncake's JSONL, plain or .xz)
    requests: int | None = None       # the first N requests of the trace (None: all)
    # The published trace's timestamps are quantised to ~3 s (about ten requests share
    # each); replayed as they are, every group is a burst and TTFT measures the burst.
    # 1: spread each group evenly over the gap to the next timestamp (at most 3 s).
    spread_groups: int = 1


# At speed 1 the trace offers ~3.4 req/s, far beyond one H200 (the paper serves it with a
# cluster); 0.15 is ~0.5 req/s.
@workload("mooncake", MooncakeConfig, reference_speed=0.15, quick=(("requests", 400),), order=0, in_default=True)
def mooncake(cfg: MooncakeConfig) -> Workload:
    reqs = read_requests(cfg.trace, limit=cfg.requests)
    turns = recover_sessions(reqs)
    has_child = {t.parent for t in turns if t.parent >= 0}
    arrivals = _spread(np.array([r.timestamp_ms for r in reqs], np.float64)) if cfg.spread_groups else \
        np.array([r.timestamp_ms for r in reqs], np.float64)
    out = []
    for req, turn, at_ms in zip(reqs, turns, arrivals):
        n = req.hash_ids.size
        tokens = np.full(n, BLOCK_TOKENS, np.int64)
        if n:
            tokens[-1] = max(1, req.input_length - BLOCK_TOKENS * (n - 1))
        out.append(Request(turn.index, turn.session, turn.turn, req.hash_ids.astype(np.int64), tokens,
                           max(1, req.output_length), float(at_ms) * 1e6, turn.parent, None,
                           turn.index not in has_child, 0))
    return Workload("mooncake", tuple(out), f"Mooncake conversation trace {Path(cfg.trace).name}, "
                                            f"{len(out)} requests, timestamps x 1/speed", open_loop=True)


SYNTHETIC_TRACE = str(Path(__file__).resolve().parent / "data" / "mooncake_synthetic_trace.jsonl.xz")


@dataclasses.dataclass(frozen=True)
class MooncakeSyntheticConfig(MooncakeConfig):
    """Mooncake FAST'25's synthetic trace (FAST25-release/traces/synthetic_trace.jsonl of
    github.com/kvcache-ai/Mooncake, Apache-2.0, bundled xz-compressed): ShareGPT, L-Eval
    and LooGLE requests mixed 1:1:1, Poisson arrivals; 3,993 requests, mean input 15,325
    and output 149 tokens, 64% of its 512-token blocks seen before (the paper's Table 2:
    15,325 / 149 / 66% cache ratio / 3,993). Its timestamps are Poisson already."""
    trace: str = SYNTHETIC_TRACE
    spread_groups: int = 0


@workload("mooncake-synthetic", MooncakeSyntheticConfig, reference_speed=0.1, quick=(("requests", 400),), order=5)
def mooncake_synthetic(cfg: MooncakeSyntheticConfig) -> Workload:
    w = mooncake(cfg)
    return dataclasses.replace(w, name="mooncake-synthetic",
                               description=w.description.replace("Mooncake conversation trace", "Mooncake synthetic trace"))


def _spread(ts_ms: np.ndarray, max_gap_ms: float = 3000.0) -> np.ndarray:
    """Requests sharing a timestamp, spread evenly (in trace order) over the gap to the
    next distinct timestamp (at most max_gap_ms); order is kept."""
    out = ts_ms.copy()
    if ts_ms.size and np.any(np.diff(ts_ms) < 0):
        return out  # not in time order: groups are not contiguous, leave the trace as it is
    values, starts, counts = np.unique(ts_ms, return_index=True, return_counts=True)
    for g, (t, first, k) in enumerate(zip(values, starts, counts)):
        gap = min(max_gap_ms, values[g + 1] - t) if g + 1 < values.size else max_gap_ms
        out[first:first + k] = t + np.arange(k) * gap / k
    return out


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Defaults sketch a coding/tool-using agent (SWE-agent-like trajectories: tens of
    model turns, tool outputs of ~1-2k tokens appended each turn, tools that take
    seconds to minutes). They are a priori choices, not fitted to any result."""
    seed: int = 0                           # the generator's random seed
    sessions: int = 300                     # agent sessions (scaled by the replay speed)
    session_rate: float = 0.1               # new sessions per second at speed 1 (Poisson)
    system_prompt_tokens: int = 2048        # shared by every session
    tool_description_tokens: int = 4096     # shared by every session (tool schemas)
    task_prompt_tokens: Dist = Dist("lognormal", 500, 0.6)   # the user's task, first turn only
    turns: Dist = Dist("uniform", 5, 30)    # model turns per session
    model_output_tokens: Dist = Dist("lognormal", 200, 0.6)  # reasoning + the tool call
    tool_output_tokens: Dist = Dist("lognormal", 1000, 1.0)  # appended to the context
    tool_pause_s: Dist = Dist("lognormal", 8.0, 1.0)         # tool latency between turns
    max_context_tokens: int = 100_000       # a session ends when its context reaches this

    def __post_init__(self):
        if self.sessions < 1:
            raise ValueError("sessions must be at least 1")
        if self.session_rate <= 0:
            raise ValueError("session_rate must be > 0")


@workload("agent", AgentConfig, quick=(("sessions", 30),), scale_field="sessions", order=10, in_default=True)
def agent(cfg: AgentConfig) -> Workload:
    rng = np.random.default_rng(cfg.seed)
    shared = cfg.system_prompt_tokens + cfg.tool_description_tokens
    ids = _ChunkIds(shared // BLOCK_TOKENS)
    expected_pause = int(cfg.tool_pause_s.median() * S)
    out: list[Request] = []
    start = 0.0
    for session in range(1, cfg.sessions + 1):
        start += rng.exponential(1.0 / cfg.session_rate) * S
        turns = max(1, int(round(cfg.turns.sample(rng))))
        context = shared + cfg.task_prompt_tokens.tokens(rng)
        parent = -1
        for turn in range(turns):
            output = cfg.model_output_tokens.tokens(rng)
            chunk_ids, chunk_tokens = ids.context(session, shared, context, BLOCK_TOKENS)
            last = turn == turns - 1 or context + output >= cfg.max_context_tokens
            pause = cfg.tool_pause_s.sample(rng) * S
            out.append(Request(len(out), session, turn, chunk_ids, chunk_tokens, output,
                               start if parent < 0 else 0.0, parent, None if parent < 0 else prev_pause,
                               last, 0 if last else expected_pause))
            if last:
                break
            parent, prev_pause = len(out) - 1, pause
            context = min(cfg.max_context_tokens - 1, context + output + cfg.tool_output_tokens.tokens(rng))
    return Workload("agent", tuple(out), f"synthetic agent sessions (seed {cfg.seed}): {cfg.sessions} sessions at "
                                         f"{cfg.session_rate:g}/s x speed, {shared} shared prompt tokens",
                    open_loop=False)


@dataclasses.dataclass(frozen=True)
class CodingAgentConfig(AgentConfig):
    """A long-context coding agent (Codex / Claude Code-like), from public traces:

    * turns: median 33 model turns per session - 610 Codex/GPT-5.4 traces on SWE-bench
      Pro (vLLM blog, "Serving Agentic Workloads at Scale with vLLM x Mooncake",
      2026-05-06: median 33 turns, ~80K tokens of context by turn 30, the longest beyond
      180K, "a few hundred to a few thousand" new tokens a turn, input:output 131:1,
      94.2% prefix-cache hit rate); the SyFI Trace Atlas (tracelab.cs.washington.edu:
      357,161 Claude Code / Codex agent steps, 96% of input tokens served from cache,
      2.34B appended over 357k steps, ~6.5k per step on average, a long tail).
    * tool output: lognormal, median 1,500 tokens (sigma 0.7, mean ~1.9k): the
      few-thousand-token deltas above; with the model's output, ~2.3k tokens a turn
      reach ~85K by turn 30 (the traces: ~80K).
    * model output: lognormal, median 330 tokens (sigma 0.7, mean ~420): tool calls and
      short reasoning, sized for the traces' input:output ratio (131:1; generated: ~144:1).
    * tool pause: lognormal, median 20 s (sigma 0.6; ~9-43 s for the middle 80%): the
      10-60 s of builds, test runs and searches; assumed (neither source tabulates it).
    * shared prefix: an 8k system prompt + 8k tool schemas every session shares (assumed).
    * contexts stop at 131,072 tokens (a 128k window; the session ends there).
    * sessions: many concurrent ones - at 0.05 new sessions/s, each ~15-20 minutes long,
      about 50 live at speed 1."""
    sessions: int = 200
    session_rate: float = 0.05
    system_prompt_tokens: int = 8192
    tool_description_tokens: int = 8192
    task_prompt_tokens: Dist = Dist("lognormal", 800, 0.6)
    turns: Dist = Dist("lognormal", 33, 0.6)
    model_output_tokens: Dist = Dist("lognormal", 330, 0.7)
    tool_output_tokens: Dist = Dist("lognormal", 1500, 0.7)
    tool_pause_s: Dist = Dist("lognormal", 20.0, 0.6)
    max_context_tokens: int = 131_072


@workload("coding-agent", CodingAgentConfig, quick=(("sessions", 12),), scale_field="sessions", order=20)
def coding_agent(cfg: CodingAgentConfig) -> Workload:
    w = agent(cfg)
    return dataclasses.replace(w, name="coding-agent", description=w.description.replace(
        "synthetic agent sessions", "long-context coding-agent sessions"))


@dataclasses.dataclass(frozen=True)
class QaConfig:
    """Defaults after LMCache's benchmarks/multi-round-qa (its README's example run)."""
    seed: int = 0                         # the generator's random seed
    users: int = 40                       # concurrent users (LMCache's --num-users)
    rounds: int = 10                      # questions per user (--num-rounds)
    qps: float = 0.5                      # requests released per second at speed 1
    shared_prompt_tokens: int = 1000      # system prompt every user shares (--shared-system-prompt)
    history_tokens: int = 20000           # each user's own long context (--user-history-prompt)
    question_tokens: Dist = Dist("lognormal", 60, 0.5)  # tokens of each question
    answer_tokens: int = 100              # tokens of each answer (--answer-len)

    def __post_init__(self):
        if self.users < 1 or self.rounds < 1:
            raise ValueError("users and rounds must be at least 1")
        if self.qps <= 0:
            raise ValueError("qps must be > 0")


@workload("qa", QaConfig, quick=(("users", 12), ("rounds", 6)), order=40)
def qa(cfg: QaConfig) -> Workload:
    rng = np.random.default_rng(cfg.seed)
    ids = _ChunkIds(cfg.shared_prompt_tokens // BLOCK_TOKENS)
    context = [cfg.shared_prompt_tokens + cfg.history_tokens] * cfg.users
    last_request = [-1] * cfg.users
    out: list[Request] = []
    for i in range(cfg.users * cfg.rounds):
        user, rnd = i % cfg.users, i // cfg.users
        context[user] += cfg.question_tokens.tokens(rng)
        chunk_ids, chunk_tokens = ids.context(user + 1, cfg.shared_prompt_tokens, context[user], BLOCK_TOKENS)
        parent = last_request[user]
        out.append(Request(i, user + 1, rnd, chunk_ids, chunk_tokens, cfg.answer_tokens, i / cfg.qps * S,
                           parent, None if parent < 0 else 0.0, rnd == cfg.rounds - 1, 0))
        last_request[user] = i
        context[user] += cfg.answer_tokens
    return Workload("qa", tuple(out), f"multi-round QA (LMCache style): {cfg.users} users x {cfg.rounds} rounds "
                                      f"at {cfg.qps:g} QPS x speed", open_loop=False)


# ---------------------------------------------------------------- specs and files
@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What to build: a generator name and its config (hashable, so built once per process)."""
    kind: str
    config: object
    serving: tuple = ()      # (key, value) overrides of the serving parameters from the file
    source: str = ""
    reuse_keep: float = 1.0  # share of sessions that keep their reuse (keep_reuse; 1: all)

    @property
    def label(self) -> str:
        return Path(self.source).stem if self.source else self.kind


def default_spec(name: str, **changes) -> WorkloadSpec:
    return WorkloadSpec(name, dataclasses.replace(kind(name).config(), **changes))


def spec_from_yaml(path: str | Path, serving_keys=()) -> WorkloadSpec:
    """A workload file: `kind: agent|qa|mooncake`, the generator's parameters, and an
    optional `serving:` mapping (validated by the caller against `serving_keys`)."""
    spec = load_yaml(path)
    name = spec.data.get("kind")
    if not isinstance(name, str) or name not in WORKLOADS:
        raise spec.error("kind", f"must be one of {', '.join(WORKLOADS.names())}, got {name!r}")
    try:
        entry = WORKLOADS.get(name)
    except Exception as exc:  # a broken outside package: named, at the file's line
        raise spec.error("kind", str(exc)) from None
    cfg = parse_config(entry.config, spec, skip=("kind", "serving"))
    serving = spec.section("serving")
    if serving_keys:
        from cxlhm_apps.serving.params import params_from  # values checked here, while lines are known
        serving.check_keys(serving_keys, "serving")
        params_from(tuple(serving.data.items()), spec=spec)
    return WorkloadSpec(name, cfg, tuple(sorted(serving.data.items())), str(path))


def resolve(name_or_path: str, **changes) -> WorkloadSpec:
    if name_or_path in WORKLOADS:
        try:
            return default_spec(name_or_path, **changes)
        except ValueError as exc:
            raise SpecError(name_or_path, 0, "", str(exc)) from None
    if name_or_path.endswith((".yaml", ".yml")):
        from cxlhm_apps.serving.params import SERVING_KEYS
        spec = spec_from_yaml(name_or_path, SERVING_KEYS)
        return dataclasses.replace(spec, config=dataclasses.replace(spec.config, **changes)) if changes else spec
    raise SpecError(name_or_path, 0, "", f"unknown workload; use {', '.join(WORKLOADS.names())} or a YAML file")


def spec_at_speed(spec: WorkloadSpec, speed: float) -> WorkloadSpec:
    """What a replay at `speed` runs. A trace (and the QA benchmark, whose users are its
    fixed concurrency, as in LMCache's) is the same request list at every speed. The
    agent generator is an open stream of sessions, each running closed loop: a faster
    replay must bring *more* sessions over the same arrival window (sessions / rate).
    With a fixed set, a fast replay starts every session at once and the throughput is
    capped by the sessions' own tool pauses - the population, not the system, would set
    "max QPS". So: round(sessions x speed) sessions, at
    least one; the first ones are the same sessions at every speed (one RNG stream)."""
    field = kind(spec.kind).scale_field
    if field and speed != 1.0:
        scaled = max(1, round(getattr(spec.config, field) * speed))
        return dataclasses.replace(spec, config=dataclasses.replace(spec.config, **{field: scaled}))
    return spec


@lru_cache(maxsize=8)
def build(spec: WorkloadSpec) -> Workload:
    """The workload's requests (cached per process: sweeps build each one once)."""
    return keep_reuse(kind(spec.kind).build(spec.config), spec.reuse_keep)


def keep_reuse(w: Workload, keep: float, seed: int = 0) -> Workload:
    """The same requests - lengths, outputs, arrivals, sessions - with the reuse of a share
    1 - `keep` of the sessions (drawn with `seed`) taken away: every turn of such a session
    gets chunk ids no other request has, so nothing of its context was computed before,
    its own earlier turns and shared prompts included. Varies the reusable share alone."""
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"reuse_keep must be in [0, 1], got {keep!r}")
    if keep == 1.0:
        return w
    sessions = sorted({r.session for r in w.requests})
    draws = np.random.default_rng(seed).random(len(sessions))  # the first sessions draw the same at any count
    dropped = {s for s, u in zip(sessions, draws) if u >= keep}
    next_id = w.max_chunk_id + 1
    out = []
    for r in w.requests:
        if r.session in dropped:
            r = dataclasses.replace(r, chunk_ids=np.arange(next_id, next_id + r.chunk_ids.size, dtype=np.int64))
            next_id += r.chunk_ids.size
        out.append(r)
    return dataclasses.replace(w, requests=tuple(out),
                               description=f"{w.description}; reuse kept by {keep:.0%} of sessions")
