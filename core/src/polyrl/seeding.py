"""Seeds derived by hashing, so that streams for different steps and ranks never overlap.

Engines number their per-sample seeds consecutively from a base seed (vLLM gives request ``i``
seed ``base + i``). Bases that also advance by small steps (``seed + step``, ``seed + rank``)
would then hand step ``k+1`` the noise of step ``k`` shifted by one sample, so the same random
draws recur across steps and exploration collapses. Hashing spreads the bases over 31 bits.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A deterministic 31-bit seed from ``parts`` (e.g. ``derive_seed(run_seed, step, rank)``)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF
