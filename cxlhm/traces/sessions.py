"""Recover multi-turn sessions from a prefix-hash request trace.

Mooncake-style traces carry no session ids. A conversation's next turn re-sends the
earlier turn's context, so its hash-id chain starts with (most of) the earlier chain;
the earlier turn's last block is usually partial, so its hash differs and the match
stops one block short. We therefore attach each request to the most recent earlier
request sharing its longest common prefix, when that prefix has at least
`min_shared_blocks` blocks (one shared block is typically just a common system prompt).
A trie over all earlier chains makes this O(chain length) per request.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cxlhm.traces.mooncake import Request

MIN_SHARED_BLOCKS = 2


@dataclasses.dataclass(frozen=True)
class Turn:
    index: int           # position of the request in the trace
    session: int         # 1-based session id (0 means "no session" to the device)
    turn: int            # 0 for a session's first request
    parent: int          # trace index of the previous turn, or -1
    reused_blocks: int   # leading hash ids shared with an earlier request (the resumable prefix)


def recover_sessions(requests: list[Request], min_shared_blocks: int = MIN_SHARED_BLOCKS) -> list[Turn]:
    children: dict[tuple[int, int], int] = {}  # (trie node, hash id) -> child node
    latest: dict[int, int] = {}                # trie node -> latest request whose chain passes it
    turns: list[Turn] = []
    next_session = 1
    for index, req in enumerate(requests):
        ids = req.hash_ids.tolist()
        node, shared, parent = 0, 0, -1
        for h in ids:  # follow the longest prefix some earlier request had
            child = children.get((node, h))
            if child is None:
                break
            node, shared, parent = child, shared + 1, latest[child]
        if shared >= min_shared_blocks:
            session, turn = turns[parent].session, turns[parent].turn + 1
        else:
            session, turn, parent = next_session, 0, -1
            next_session += 1
        turns.append(Turn(index, session, turn, parent, shared))
        node = 0
        for h in ids:
            node = children.setdefault((node, h), len(children) + 1)
            latest[node] = index
    return turns


def summarize(turns: list[Turn]) -> dict:
    sizes = np.bincount(np.array([t.session for t in turns], np.int64))
    sizes = sizes[sizes > 0]
    return {
        "requests": len(turns),
        "sessions": int(sizes.size),
        "multi_turn_sessions": int((sizes > 1).sum()),
        "max_turns": int(sizes.max()) if sizes.size else 0,
        "requests_resuming": sum(1 for t in turns if t.parent >= 0),
        "reused_blocks": sum(t.reused_blocks for t in turns if t.parent >= 0),
    }
