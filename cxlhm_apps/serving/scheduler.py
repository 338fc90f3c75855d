"""The serving event loop (colocated topology: one GPU does prefill and decode).

A small deterministic discrete-event loop, vidur-style: a heap of (time, sequence,
kind, payload) events, processed in time order (ties in push order), so the same
inputs give bit-identical results - and the CXL-HM device, which wants its accesses in
non-decreasing time, gets them in that order.

A request's life:
  arrive      the KV store learns the session resumed: SESSION_RESUME hint for the
              prefix it holds; the request queues (FIFO) for admission.
  admit       when the GPU's KV pool has room for its context + output (running
              requests pin theirs; cached prefixes are evicted LRU) and fewer than
              max_running requests run. The prefix is looked up - GPU first, then the
              tier - and the scheduler picks how much of it to load: every cut point k
              is costed as (estimated load of the tier's chunks before k) + (prefill of
              the tokens after k on top of the k cached ones), the cheapest wins, so a
              load that would be slower than recomputing (a slow or backlogged tier, a
              short chunk) is not done. The load starts now (asynchronously: the GPU keeps
              working on other requests).
  prefill     when loaded (or, for a blocking / layer-wise tier, when scheduled: the
              iteration then waits for the load), FIFO, in iterations formed by the
              engine's batching preset (batching.py: vLLM V1's token budget shared by
              prefill chunks and decodes, SGLang's prefill-first chunks, or whole
              prompts). The first token comes out of the iteration that computes the
              last chunk: TTFT. The request's new chunks are then stored to the tier
              (APPEND hints); a blocking store holds that iteration for the copy.
  decode      continuous batching: one step emits a token for every running request;
              steps with no prefill waiting are charged in blocks up to the next event.
  finish      the KV stays on the GPU as prefix cache; the store emits SESSION_PAUSE
              (with the expected pause when known), SESSION_END when the session is
              over (or, for chats, after session_timeout_s without a new turn); a
              closed-loop session's next turn is released.

This is the colocated topology; topologies.py maps topology names to engines (the
disaggregated one extends this class) and replays through them.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque

import numpy as np

from itertools import islice

from cxlhm_apps.serving.batching import plan_iteration
from cxlhm_apps.serving.configs import BLOCKING, LAYERWISE, TierContext, make_system, modes
from cxlhm_apps.serving.gpu import GpuModel
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.tiers import GpuKvPool, Tier
from cxlhm_apps.serving.workloads import Workload

ARRIVE, LOAD_DONE, GPU_FREE, HINT_NEXT, TIMEOUT, STORE_DONE, HANDOVER_DONE = range(7)
DECODE_BLOCK = 4096  # most decode steps charged in one go (bounds a numpy array)


class SloMissed(Exception):
    """A fail-fast replay (a max-QPS probe) stopped: so many requests already had a TTFT
    above the SLO that its percentile cannot meet it any more."""


class GpuInstance:
    """One GPU: its KV pool, the requests ready to prefill, the decode batch."""

    def __init__(self, index: int, pool_bytes: float):
        self.index = index
        self.pool = GpuKvPool(pool_bytes)
        self.waiting: deque[int] = deque()   # arrived, not admitted
        self.ready: deque[int] = deque()     # admitted and loaded, not prefilled
        self.decoding: list[tuple[int, int]] = []  # heap of (finish step, request)
        self.step = 0
        self.batch = 0
        self.context = 0.0                   # tokens of KV the decode batch reads per step
        self.running = 0
        self.busy = False
        self.busy_ns = 0.0
        self.prefill_ns = 0.0                # the part of busy_ns spent prefilling
        self.blocked_at = -1   # pool.releases when the head of `waiting` last failed to fit


@dataclasses.dataclass
class ReplayResult:
    """Per-request times (ns, NaN when not reached) and token accounting, plus the tier's
    and the GPUs' counters. metrics.py turns it into figures."""
    config: str
    workload: str
    speed: float
    topology: str
    arrival: np.ndarray
    first_token: np.ndarray
    done: np.ndarray
    output_tokens: np.ndarray
    tokens: dict          # where each request's context tokens came from (arrays)
    tier_stats: dict
    gpu_busy_ns: list
    load_ns: np.ndarray
    recompute_choices: int
    dram_bytes: int
    gpu_prefill_ns: list = dataclasses.field(default_factory=list)


class Engine:
    """The colocated topology; disagg.DisaggEngine overrides the hand-over points.

    A topology with options sets `Options` to a config dataclass: serve-bench generates
    `--<topology>.<field>` flags from it and the engine reads the values as self.options."""
    topology = "colocated"
    Options: type | None = None
    n_gpus = 1

    def __init__(self, workload: Workload, config: str, params: ServingParams = ServingParams(),
                 speed: float = 1.0, gpu: GpuModel | None = None, fail_fast: bool = False):
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.w, self.params, self.speed, self.config = workload, params, speed, config
        self.reqs = workload.requests
        self.gpu = gpu or params.gpu_cost_model()
        self.bpt = self.gpu.kv_bytes_per_token
        n_chunks = workload.max_chunk_id + 1
        ctx = TierContext(params, n_chunks, workload.chunk_tokens * self.bpt, self.n_gpus,
                          self.gpu.h2d_bandwidth, self.gpu.h2d_latency_s * 1e9)
        self.system = make_system(config, params)
        # this topology's generated options (Options: its config dataclass), None without one
        opts = type(self).Options
        self.options = dataclasses.replace(opts(), **params.options_for("topology", self.topology)) \
            if opts is not None else None
        self.tier: Tier = self.system.make_tier(ctx)
        self.batching = params.batching_preset()
        self.budget = params.token_budget
        self.max_running = params.running_limit
        self.load_mode, self.store_mode = modes(self.system, params)
        self.layers = int(getattr(self.gpu, "layers", 32))
        self.gpus = [GpuInstance(i, params.kv_pool_bytes) for i in range(self.n_gpus)]
        n = len(self.reqs)
        self.arrival = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        self.load_ns = np.zeros(n)
        self.tokens = {k: np.zeros(n) for k in ("gpu", "dram", "ssd", "recomputed", "new")}
        self.left = np.zeros(n)       # new tokens still to prefill
        self.done_new = np.zeros(n)   # new tokens prefilled by earlier chunks
        self.pending: dict[int, tuple] = {}  # blocking / layer-wise loads, issued when first scheduled
        self.store_ns = 0.0           # GPU time held by blocking stores
        self.stall_ns = 0.0           # GPU time held waiting for blocking / layer-wise loads
        self.computed = np.zeros(n_chunks, bool)   # chunks some earlier request computed
        self.plan: dict[int, tuple] = {}  # request -> (ids, bytes, private, new, cached, loaded ids)
        self.children: dict[int, list[int]] = {}
        for r in self.reqs:
            if r.parent >= 0:
                self.children.setdefault(r.parent, []).append(r.index)
        self.session_epoch: dict[int, int] = {}
        self.recompute_choices = 0
        self.stored_bytes = self.skipped_store_bytes = 0.0
        self.events: list = []
        self.seq = 0
        # fail_fast: the p-th percentile of n TTFTs (linear interpolation) is at least the
        # value of rank k = floor(p/100 (n-1)); once n - k requests were late, it is late.
        self.late = 0
        self.late_limit = n - math.floor(params.slo_percentile / 100 * (n - 1)) if fail_fast else None
        biggest = max((r.input_tokens + r.output_tokens) * self.bpt for r in self.reqs)
        if biggest > params.kv_pool_bytes:
            raise ValueError(f"a request needs {biggest / 2**30:.1f} GiB of KV, more than the GPU KV pool "
                             f"({params.kv_pool_bytes / 2**30:.1f} GiB)")

    # ------------------------------------------------------------ events
    def push(self, t: float, kind: int, payload) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        self.seq += 1

    def run(self) -> ReplayResult:
        for r in self.reqs:
            if r.after_parent_ns is None or r.parent < 0:
                self.push(r.arrival_ns / self.speed, ARRIVE, r.index)
        handlers = {ARRIVE: self.on_arrive, LOAD_DONE: self.on_load_done, GPU_FREE: self.on_gpu_free,
                    HINT_NEXT: self.on_hint_next, TIMEOUT: self.on_timeout, STORE_DONE: self.on_store_done,
                    HANDOVER_DONE: self.on_handover_done}
        try:
            while self.events:
                t, _, kind, payload = heapq.heappop(self.events)
                handlers[kind](t, payload)
            unfinished = int(np.isnan(self.done).sum())
            if unfinished:
                raise RuntimeError(f"{unfinished} requests never finished (scheduler stalled)")
            stats = self.tier.stats()
            stats["store_skipped_share"] = self.skipped_store_bytes / max(1.0, self.stored_bytes +
                                                                          self.skipped_store_bytes)
        finally:
            self.tier.close()
        return ReplayResult(self.config, self.w.name, self.speed, self.topology, self.arrival, self.first_token,
                            self.done, np.array([r.output_tokens for r in self.reqs], float), self.tokens, stats,
                            [g.busy_ns for g in self.gpus], self.load_ns, self.recompute_choices,
                            self.params.dram_bytes, [g.prefill_ns for g in self.gpus])

    # ------------------------------------------------------------ arrival and admission
    def on_arrive(self, now: float, i: int) -> None:
        r = self.reqs[i]
        self.arrival[i] = now
        self.session_epoch[r.session] = self.session_epoch.get(r.session, 0) + 1  # cancels a pending timeout
        inst = self.prefill_gpu(i)
        if r.parent >= 0 and self.tier.stores:
            ids, nbytes = self._planned_loads(r, inst.pool, now)
            self.tier.hint_resume(now, r.session, ids, nbytes)
        inst.waiting.append(i)
        self.try_admit(inst, now)
        self.kick(inst, now)

    def prefill_gpu(self, i: int) -> GpuInstance:
        return self.gpus[0]

    def _lookup(self, r, pool):
        """Per chunk: on the GPU, in the tier; and the reusable prefix length."""
        ids = r.chunk_ids.tolist()
        on_gpu = pool.has_many(ids)
        in_tier = self.tier.has_many(ids) if self.tier.stores else np.zeros(len(ids), bool)
        usable = on_gpu | in_tier
        prefix = len(ids) if usable.all() else int(np.argmin(usable))
        return on_gpu, in_tier, prefix

    def _planned_loads(self, r, pool, now):
        """What this request would load if admitted now (the resume hint names exactly
        that: a hint for chunks the scheduler then recomputes would only waste device DRAM)."""
        on_gpu, in_tier, prefix = self._lookup(r, pool)
        nbytes = r.chunk_tokens.astype(np.float64) * self.bpt
        k, *_ = self.choose_cut(r, on_gpu[:prefix], in_tier[:prefix], nbytes[:prefix], now, count=False)
        load = np.flatnonzero(in_tier[:k] & ~on_gpu[:k])
        return r.chunk_ids[load].tolist(), nbytes[load].tolist()

    def try_admit(self, inst: GpuInstance, now: float) -> None:
        """Admit waiting requests in FIFO order while they fit. (Never starts GPU work:
        handlers call kick() once their bookkeeping is complete.)"""
        self.admit_waiting(inst, now, self.admit)

    def admit_waiting(self, inst: GpuInstance, now: float, admit) -> None:
        """The FIFO admission loop, with `admit(inst, i, now) -> bool` deciding each head."""
        if inst.blocked_at == inst.pool.releases:
            return  # the head did not fit, and nothing was freed since
        while inst.waiting and inst.running < self.max_running:
            if not admit(inst, inst.waiting[0], now):
                inst.blocked_at = inst.pool.releases
                break
            inst.waiting.popleft()
            inst.running += 1

    def admit(self, inst: GpuInstance, i: int, now: float) -> bool:
        r = self.reqs[i]
        ids, toks = r.chunk_ids, r.chunk_tokens
        nbytes = toks.astype(np.float64) * self.bpt
        pool = inst.pool
        on_gpu, in_tier, prefix = self._lookup(r, pool)
        k, new, cached = self.choose_cut(r, on_gpu[:prefix], in_tier[:prefix], nbytes[:prefix], now)
        if not pool.reserve(ids, nbytes, self.private_bytes(r)):
            return False
        load = np.flatnonzero(in_tier[:k] & ~on_gpu[:k])
        self.plan[i] = (ids, nbytes, self.private_bytes(r), new, cached, ids[load])
        seen = self.computed[ids]
        gpu_tok = float(toks[:k][on_gpu[:k]].sum())
        load_tok = float(toks[load].sum())
        self.tokens["gpu"][i] = gpu_tok
        self.tokens["recomputed"][i] = float(toks[k:][seen[k:]].sum())
        self.tokens["new"][i] = float(toks[k:][~seen[k:]].sum())
        self.left[i] = new
        self.done_new[i] = 0.0
        if load.size and self.load_mode in (BLOCKING, LAYERWISE):
            # read when the request is scheduled; pinned until then (LMCache's lookup pins
            # what it found until the retrieve, so eviction cannot take it meanwhile)
            self.tier.pin(ids[load])
            self.pending[i] = (ids[load], nbytes[load], load_tok)
            inst.ready.append(i)
        elif load.size:
            done = self.issue_load(inst, i, now, ids[load], nbytes[load], load_tok)
            self.push(done, LOAD_DONE, i)
        else:
            inst.ready.append(i)
        return True

    def issue_load(self, inst: GpuInstance, i: int, now: float, ids, nbytes, load_tok: float) -> float:
        res = self.tier.load(now, self.reqs[i].session, ids, nbytes, inst.index)
        share = res.dram_chunks / max(1e-12, res.dram_chunks + res.ssd_chunks)
        self.tokens["dram"][i] = load_tok * share
        self.tokens["ssd"][i] = load_tok * (1 - share)
        self.load_ns[i] = res.done_ns - now
        return res.done_ns

    def private_bytes(self, r) -> float:
        """KV the request adds while decoding (not part of any stored chunk)."""
        return float(r.output_tokens * self.bpt)

    def choose_cut(self, r, on_gpu, in_tier, nbytes, now, count=True):
        """How many prefix chunks to reuse: min over k of load estimate + prefill time.
        Returns (k, new tokens, cached tokens)."""
        total = r.input_tokens
        toks = r.chunk_tokens[: on_gpu.size].astype(np.float64)
        cum_tok = np.concatenate([[0.0], np.cumsum(toks)])
        needs_load = in_tier & ~on_gpu
        cum_load = np.concatenate([[0.0], np.cumsum(nbytes * needs_load)])
        est = np.zeros(cum_load.size)
        if needs_load.any():
            positive = cum_load > 0
            est[positive] = self.tier.estimate_load_ns(now, cum_load[positive], 0)
        new = np.maximum(1.0, total - cum_tok)  # at least the last token is computed
        compute = self.gpu.prefill_alone_s(new, total - new) * 1e9
        if self.load_mode == LAYERWISE:
            cost = np.maximum(est, compute) + np.minimum(est, compute) / self.layers
        else:
            cost = est + compute
        k = int(np.argmin(cost))
        if count and k < on_gpu.size and needs_load.any() and cum_load[-1] > cum_load[k]:
            self.recompute_choices += 1
        return k, float(new[k]), float(total - new[k])

    def on_load_done(self, now: float, i: int) -> None:
        inst = self.prefill_gpu(i)
        inst.pool.materialize(self.plan[i][5])  # the loaded chunks are usable now
        inst.ready.append(i)
        self.kick(inst, now)

    # ------------------------------------------------------------ the GPU
    def kick(self, inst: GpuInstance, now: float) -> None:
        """Give an idle GPU its next iteration: what the batching preset schedules from
        the ready prefills (with the decodes, where it mixes them), else decode steps."""
        if inst.busy:
            return
        if inst.ready:
            waiting, total = [], 0.0
            for i in inst.ready:  # enough of the queue to fill the budget
                waiting.append(float(self.left[i]))
                total += waiting[-1]
                if total >= self.budget:
                    break
            chunks, decodes = plan_iteration(self.batching, self.budget, waiting, inst.batch)
            if chunks:
                sched = list(islice(inst.ready, len(chunks)))
                self._busy(inst, now, self.iteration_ns(inst, now, sched, chunks, decodes),
                           ("prefill", (sched, chunks, decodes)))
                return
        if inst.batch:
            finish_step = inst.decoding[0][0]
            steps = min(DECODE_BLOCK, finish_step - inst.step)
            durations = self.gpu.decode_steps_s(inst.batch, inst.context, steps) * 1e9
            ends = now + np.cumsum(durations)
            horizon = self.events[0][0] if self.events else math.inf
            starts = ends - durations
            k = max(1, int(np.searchsorted(starts, horizon, side="left")))
            self._busy(inst, now, float(ends[k - 1] - now), ("decode", (k, inst.batch)))

    def iteration_ns(self, inst: GpuInstance, now: float, sched: list, chunks: list, decodes: int) -> float:
        """How long the iteration holds the GPU: its compute, plus the loads it waits for
        (blocking: before it; layer-wise: pipelined per layer) and the blocking stores of
        the prefills it completes (the copy of their new KV out of HBM)."""
        cacheds = [self.plan[i][4] + self.done_new[i] for i in sched]
        if decodes:
            iteration = getattr(self.gpu, "iteration_s", None)
            compute = (iteration(chunks, cacheds, decodes, inst.context) if iteration else
                       self.gpu.prefill_s(chunks, cacheds) + float(self.gpu.decode_steps_s(decodes, inst.context, 1)[0]))
        else:
            compute = self.gpu.prefill_s(chunks, cacheds)
        duration = compute * 1e9
        loaded = now
        for i in sched:
            if i in self.pending:
                ids, nbytes, load_tok = self.pending.pop(i)
                loaded = max(loaded, self.issue_load(inst, i, now, ids, nbytes, load_tok))
                self.tier.unpin(ids)
                inst.pool.materialize(ids)
        if loaded > now:
            wait = loaded - now
            if self.load_mode == LAYERWISE:
                stalled = max(wait, duration) + min(wait, duration) / self.layers
            else:
                stalled = wait + duration
            self.stall_ns += stalled - duration
            duration = stalled
        if self.store_mode == BLOCKING and self.tier.stores and getattr(self.tier, "blocking_stores", True):
            end = now + duration
            for i, take in zip(sched, chunks):
                if take >= self.left[i] - 1e-9:
                    end = max(end, self.store(inst, i, now + duration))
            self.store_ns += end - now - duration
            duration = end - now
        return duration

    def _busy(self, inst, now, duration, work) -> None:
        inst.busy = True
        inst.busy_ns += duration
        if work[0] == "prefill":
            inst.prefill_ns += duration
        self.push(now + duration, GPU_FREE, (inst.index, work))

    def on_gpu_free(self, now: float, payload) -> None:
        index, (kind, work) = payload
        inst = self.gpus[index]
        inst.busy = False
        if kind == "prefill":
            sched, chunks, decodes = work
            if decodes:
                self.advance_decodes(inst, 1, decodes, now)
            for i, take in zip(sched, chunks):
                self.left[i] -= take
                self.done_new[i] += take
            while inst.ready and self.left[inst.ready[0]] <= 1e-9 and inst.ready[0] in sched:
                self.prefilled(inst, inst.ready.popleft(), now)
        else:
            steps, batch = work
            self.advance_decodes(inst, steps, batch, now)
        self.try_admit(inst, now)
        self.kick(inst, now)

    def advance_decodes(self, inst: GpuInstance, steps: int, batch: int, now: float) -> None:
        inst.step += steps
        inst.context += batch * steps
        while inst.decoding and inst.decoding[0][0] <= inst.step:
            _, i = heapq.heappop(inst.decoding)
            self.leave_decode(inst, i)
            self.finish(inst, i, now)

    def first_token_at(self, i: int, now: float) -> None:
        self.first_token[i] = now
        if self.late_limit is not None and now - self.arrival[i] > self.params.slo_ttft_s * 1e9:
            self.late += 1
            if self.late >= self.late_limit:
                raise SloMissed(f"{self.late} of {len(self.reqs)} requests over the TTFT SLO")

    def prefilled(self, inst: GpuInstance, i: int, now: float) -> None:
        self.record_prefill(inst, i, now)
        self.store(inst, i, now)
        self.join_decode(inst, i, now)

    def record_prefill(self, inst: GpuInstance, i: int, now: float) -> None:
        """Request i's prefill is done: its first token is out, its chunks are in the GPU pool."""
        ids = self.plan[i][0]
        self.first_token_at(i, now)
        inst.pool.materialize(ids)
        self.computed[ids] = True

    def store(self, inst: GpuInstance, i: int, now: float) -> float:
        """LMCache-style: every chunk of the context the tier lacks is stored after prefill."""
        r = self.reqs[i]
        ids, nbytes, *_ = self.plan[i]
        if not self.tier.stores:
            return now
        missing = ~self.tier.has_many(ids.tolist())
        if not missing.any():
            return now
        if self.tier.write_backlog_ns(now, inst.index) > self.params.max_store_backlog_s * 1e9:
            self.skipped_store_bytes += float(nbytes[missing].sum())  # the KV can be recomputed
            return now
        self.stored_bytes += float(nbytes[missing].sum())
        return self.tier.store(now, r.session, ids[missing], nbytes[missing], inst.index)

    def join_decode(self, inst: GpuInstance, i: int, now: float) -> None:
        r = self.reqs[i]
        steps = r.output_tokens - 1  # the prefill produced the first token
        if steps <= 0:
            self.finish(inst, i, now)
            return
        heapq.heappush(inst.decoding, (inst.step + steps, i))
        inst.batch += 1
        inst.context += r.input_tokens + 1

    def leave_decode(self, inst: GpuInstance, i: int) -> None:
        r = self.reqs[i]
        inst.batch -= 1
        inst.context -= r.input_tokens + r.output_tokens

    # ------------------------------------------------------------ completion and hints
    def finish(self, inst: GpuInstance, i: int, now: float) -> None:
        r = self.reqs[i]
        self.done[i] = now
        ids, _, private, *_ = self.plan.pop(i)
        inst.pool.release(ids, private)
        inst.running -= 1
        self.session_hints(r, now)
        for child in self.children.get(i, ()):
            c = self.reqs[child]
            if c.after_parent_ns is not None:  # closed loop: released by this turn's end
                self.push(max(now + c.after_parent_ns, c.arrival_ns / self.speed), ARRIVE, child)
        self.try_admit(inst, now)

    def session_hints(self, r, now: float) -> None:
        if not self.tier.stores:
            return
        if r.last_turn and not self.w.open_loop:  # the application says the session is over
            self.tier.hint_end(now, r.session)
            return
        self.tier.hint_pause(now, r.session, r.expected_pause_ns)
        if self.w.open_loop:  # a chat: over when idle for session_timeout_s
            epoch = self.session_epoch.get(r.session, 0)
            self.push(now + self.params.session_timeout_s * 1e9, TIMEOUT, (r.session, epoch))
        elif r.expected_pause_ns > 0:
            for child in self.children.get(r.index, ()):
                lead = self.params.prefetch_lead_s * 1e9
                at = now + max(0.0, r.expected_pause_ns - lead)
                self.push(at, HINT_NEXT, (child, now + r.expected_pause_ns))

    def on_hint_next(self, now: float, payload) -> None:
        child, expected_at = payload
        if not np.isnan(self.arrival[child]):
            return  # the turn is already here (the resume hint went out on arrival)
        r = self.reqs[child]
        ids, nbytes = self._planned_loads(r, self.prefill_gpu(child).pool, now)
        self.tier.hint_resume(now, r.session, ids, nbytes, deadline_ns=max(1.0, expected_at - now))

    def on_timeout(self, now: float, payload) -> None:
        session, epoch = payload
        if self.session_epoch.get(session, 0) == epoch:
            self.tier.hint_end(now, session)

    def on_store_done(self, now: float, payload) -> None:  # disaggregation only
        raise NotImplementedError

    def on_handover_done(self, now: float, payload) -> None:  # disaggregation only
        raise NotImplementedError

