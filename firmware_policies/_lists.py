"""The former private name of `firmware_policies.lists` (slot lists and ghost lists), kept
so policies written against it still import."""
from firmware_policies.lists import *  # noqa: F401,F403
from firmware_policies.lists import BLOCK, EMPTY, HEAD, LEN, NEXT, OWNER, PREV, TAIL, Ghosts  # noqa: F401
