"""The parameter server's per-message vector work (solvers/mpi.py, DESIGN 4), one pass each.

A Dis-DDSS message touches a few thousand coordinates of an x that may have 100,000; done
with numpy (``local - base``, ``flatnonzero``, fancy indexing) a worker spent ~1 ms per
message on CTR 200,000 x 100,000 and the server ~0.2 ms, about half of the CPU of an
oversubscribed -n 9 epoch. These loops do the same in one pass without temporaries.
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def take_delta(local, base, index, values, offset):
    """The sparse delta local - base: its support into index[:k] and its values into
    values[offset:offset + k]; base takes the sent values (base[j] = local[j] there), so
    base stays "the server's x plus what this worker has sent". Returns k."""
    k = 0
    for j in range(local.shape[0]):
        d = local[j] - base[j]
        if d != 0.0:
            index[k] = j
            values[offset + k] = d
            base[j] = local[j]
            k += 1
    return k


@njit(cache=True, nogil=True)
def apply_reply(local, base, index, values, offset, full):
    """A reply's server values v (values[offset:]) on its coordinates (index, or every one
    when ``full``): local = v + (local - base), the steps taken since the send on top of
    the server's x (exactly v when nothing is pending), and base = v."""
    count = local.shape[0] if full else index.shape[0]
    for t in range(count):
        j = t if full else index[t]
        v = values[offset + t]
        local[j] = v + (local[j] - base[j])
        base[j] = v


@njit(cache=True, nogil=True)
def add_weighted_delta(x, changed_at, index, values, offset, weight, omega, version):
    """x[j] += weight omega[j] delta_j on a delta's coordinates (values[offset:]), each
    stamped changed_at[j] = version."""
    for t in range(index.shape[0]):
        j = index[t]
        x[j] += weight * omega[j] * values[offset + t]
        changed_at[j] = version


@njit(cache=True, nogil=True)
def changed_since(changed_at, seen):
    """The coordinates (int32, ascending) stamped after version ``seen``."""
    count = 0
    for j in range(changed_at.shape[0]):
        if changed_at[j] > seen:
            count += 1
    out = np.empty(count, dtype=np.int32)
    k = 0
    for j in range(changed_at.shape[0]):
        if changed_at[j] > seen:
            out[k] = j
            k += 1
    return out
