"""splitmix64 (Steele, Lea & Flood 2014) for numba kernels: the state is a uint64 passed in
and returned, so a kernel's random numbers depend only on the seed it was given; and its
finalizer over numpy arrays (:func:`mix64`), a counter-based generator and a stable hash."""

from __future__ import annotations

import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(cache=True)
def next_u64(state):
    """``(next state, 64 random bits)``."""
    state = state + GOLDEN
    z = state
    z = (z ^ (z >> _S30)) * MIX1
    z = (z ^ (z >> _S27)) * MIX2
    return state, z ^ (z >> _S31)


def mix64(z) -> np.ndarray:
    """splitmix64's finalizer of ``z + golden`` over a uint64 array: every input bit moves every
    output bit, so consecutive counters or keys give independent-looking 64-bit values."""
    with np.errstate(over="ignore"):
        z = np.asarray(z, dtype=np.uint64) + GOLDEN
        z = (z ^ (z >> _S30)) * MIX1
        z = (z ^ (z >> _S27)) * MIX2
        return z ^ (z >> _S31)
