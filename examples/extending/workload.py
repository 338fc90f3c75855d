"""A workload for `cxlhm serve-bench`: retrieval-augmented generation (RAG) over a fixed
corpus.

Each request is one turn of its own session: a shared system prompt, `docs_per_request`
documents retrieved from a corpus of `documents` (popularity Zipf(`zipf`), no document
twice in a request), then the user's question; requests arrive as a Poisson stream at
`qps` (open loop). A document always has the same length (drawn once per corpus from
`document_tokens`).

Chunk ids follow the prefix-hash scheme every serving workload uses (a chunk's id covers
its tokens and everything before it): a chunk is the same KV as an earlier one only when
the whole context up to its end is the same - the system prompt and the same documents
in the same order. So retrieval reuses KV only along a shared prefix of documents, as a
prefix cache (vLLM's, LMCache's) finds it; the question and the partial last chunk are
new every time.

A workload is a generator `fn(config) -> Workload` registered with its config dataclass
(`WorkloadKind`): the dataclass's fields are the keys of a `kind: rag` YAML file and
serve-bench's flags (`--rag.zipf 1.2`); the comments on them are the flags' help.
Register it under the entry-point group ``cxlhm.serving_workloads``:

    [project.entry-points."cxlhm.serving_workloads"]
    rag = "examples.extending.workload:KIND"

or, in a test, ``workloads.WORKLOADS.register("rag", "examples.extending.workload:KIND")``.
Then ``cxlhm serve-bench --workload rag --rag.requests 400 --configs lmcache-local,ideal``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cxlhm_apps.serving.workloads import Dist, Request, Workload, WorkloadKind

CHUNK = 512   # tokens per KV chunk (the trace's hash-block size, as every built-in workload)
S = 1e9       # ns per second


@dataclasses.dataclass(frozen=True)
class RagConfig:
    seed: int = 0                        # the generator's random seed
    requests: int = 2000                 # requests in the stream
    qps: float = 2.0                     # requests per second at speed 1 (Poisson arrivals)
    system_prompt_tokens: int = 1024     # shared by every request
    documents: int = 500                 # documents in the corpus
    docs_per_request: int = 4            # documents retrieved for each request
    zipf: float = 1.0                    # popularity skew of the documents (0: uniform)
    document_tokens: Dist = Dist("lognormal", 1200, 0.5)   # a document's length, drawn once per document
    question_tokens: Dist = Dist("lognormal", 60, 0.5)     # the user's question
    answer_tokens: Dist = Dist("lognormal", 200, 0.5)      # the model's answer

    def __post_init__(self):
        if self.requests < 1 or self.documents < 1:
            raise ValueError("requests and documents must be at least 1")
        if not 1 <= self.docs_per_request <= self.documents:
            raise ValueError(f"docs_per_request must be in [1, documents={self.documents}], "
                             f"got {self.docs_per_request}")
        if self.qps <= 0:
            raise ValueError("qps must be > 0")


def rag(cfg: RagConfig) -> Workload:
    rng = np.random.default_rng(cfg.seed)
    lengths = [cfg.document_tokens.tokens(rng) for _ in range(cfg.documents)]
    popularity = 1.0 / np.arange(1, cfg.documents + 1) ** cfg.zipf
    popularity /= popularity.sum()
    ids: dict[tuple, int] = {}   # (documents before the chunk's end, chunk index) -> chunk id
    fresh = iter(range(1 << 62))
    out = []
    arrival = 0.0
    for i in range(cfg.requests):
        arrival += rng.exponential(1.0 / cfg.qps) * S
        docs = rng.choice(cfg.documents, cfg.docs_per_request, replace=False, p=popularity).tolist()
        question = cfg.question_tokens.tokens(rng)
        # where each document ends in the context, after the system prompt
        ends = np.cumsum([cfg.system_prompt_tokens] + [lengths[d] for d in docs])
        total = int(ends[-1]) + question
        n = -(-total // CHUNK)
        tokens = np.full(n, CHUNK, np.int64)
        tokens[-1] = total - CHUNK * (n - 1)
        chunk_ids = np.empty(n, np.int64)
        for j in range(n):
            end = (j + 1) * CHUNK
            if end > ends[-1] or tokens[j] < CHUNK:
                chunk_ids[j] = next(fresh) + (1 << 40)   # reaches the question, or partial: new KV
                continue
            covered = int(np.searchsorted(ends, end, side="left"))   # documents the chunk reaches into
            chunk_ids[j] = ids.setdefault((tuple(docs[:covered]), j), len(ids))
        out.append(Request(i, i + 1, 0, chunk_ids, tokens, cfg.answer_tokens.tokens(rng), arrival))
    # renumber densely (the serving model sizes its tables by the largest id)
    _, dense = np.unique(np.concatenate([r.chunk_ids for r in out]), return_inverse=True)
    at = 0
    for k, r in enumerate(out):
        out[k] = dataclasses.replace(r, chunk_ids=dense[at:at + r.chunk_ids.size].astype(np.int64))
        at += r.chunk_ids.size
    return Workload("rag", tuple(out), f"RAG over {cfg.documents} documents (Zipf {cfg.zipf:g}), "
                                       f"{cfg.docs_per_request} a request, {cfg.qps:g} QPS x speed", open_loop=True)


# reference_speed: the TTFT columns' replay speed; quick: --quick's sizes; order: listings.
# An open stream of single-turn requests is the same list at every speed: no scale_field.
KIND = WorkloadKind(rag, RagConfig, reference_speed=1.0, quick=(("requests", 200),), order=60)
