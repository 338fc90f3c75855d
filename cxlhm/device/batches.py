"""Cutting a host access into firmware passes: each pass plans at most a fixed number
of device blocks (the scratch arrays are sized for it), so a long access is split at
block boundaries into groups that fit."""
import numpy as np


def split_batches(ext_hpa: np.ndarray, ext_len: np.ndarray, block_size: int, limit: int):
    """Yield (hpas, lens, user_offset) groups touching at most `limit` blocks each,
    cutting extents at block boundaries where needed."""
    group_h: list[int] = []
    group_l: list[int] = []
    used = 0
    group_start = pos = 0
    for h, n in zip(ext_hpa.tolist(), ext_len.tolist()):
        while n > 0:
            # bytes of this extent that fit in the blocks left in the group
            fits = (block_size - h % block_size) + (limit - used - 1) * block_size
            take = min(n, fits)
            group_h.append(h)
            group_l.append(take)
            used += (h + take - 1) // block_size - h // block_size + 1
            h, n, pos = h + take, n - take, pos + take
            if used >= limit:
                yield np.array(group_h, np.int64), np.array(group_l, np.int64), group_start
                group_h, group_l, used, group_start = [], [], 0, pos
    if group_h:
        yield np.array(group_h, np.int64), np.array(group_l, np.int64), group_start
