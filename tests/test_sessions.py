import numpy as np

from cxlhm.traces.mooncake import Request
from cxlhm.traces.sessions import recover_sessions, summarize


def req(*ids):
    return Request(0, 512 * len(ids), 1, np.array(ids, np.int64))


def test_turns_chain_through_the_longest_shared_prefix():
    trace = [
        req(0, 1, 2, 3),        # session 1, turn 0
        req(0, 9, 8),           # shares only the system-prompt block: a new session
        req(0, 1, 2, 5, 6),     # extends request 0 minus its (partial) last block: turn 1
        req(0, 1, 2, 5, 6, 7),  # extends request 2: turn 2
        req(0, 9, 8, 4),        # extends request 1
        req(),                  # an empty chain is its own session
    ]
    turns = recover_sessions(trace)
    assert [(t.session, t.turn, t.parent, t.reused_blocks) for t in turns] == [
        (1, 0, -1, 0), (2, 0, -1, 1), (1, 1, 0, 3), (1, 2, 2, 5), (2, 1, 1, 3), (3, 0, -1, 0)]
    assert summarize(turns) == {"requests": 6, "sessions": 3, "multi_turn_sessions": 2, "max_turns": 3,
                                "requests_resuming": 3, "reused_blocks": 11}


def test_min_shared_blocks_threshold():
    trace = [req(0, 1), req(0, 1, 2)]
    assert recover_sessions(trace, min_shared_blocks=3)[1].parent == -1
    assert recover_sessions(trace, min_shared_blocks=2)[1].parent == 0
