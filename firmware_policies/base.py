"""What a firmware policy is: parameters, state, and compiled hooks (the hook signatures
and contracts are in `cxlhm.policies`, where the core finds them; re-exported here so a
policy module imports its building blocks from the policies package)."""
from cxlhm.policies import (JOB_FLUSH, JOB_PREFETCH, NO_NEXT_USE, Param, Policy, PolicyParamError, no_background, no_hint,
                            no_upcoming)

__all__ = ["JOB_FLUSH", "JOB_PREFETCH", "NO_NEXT_USE", "Param", "Policy", "PolicyParamError", "no_background",
           "no_hint", "no_upcoming"]
