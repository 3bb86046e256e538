"""The parameter server's per-message vector work (solvers/mpi/), one pass each.

docs/design.md §3.

A Dis-DDSS message touches a few thousand coordinates of an x that may have 100,000. These
loops do what numpy would (``local - base``, ``flatnonzero``, fancy indexing) in one pass
without temporaries, whose cost per message adds up over an epoch's many messages.

The coordinates of a message travel as int32 indices (4 B each) or, once there are more
of them than ``bitmap_words(n)``, as a bitmap over all n coordinates packed into int32
words (n / 8 bytes; ``pack_bitmap`` / ``unpack_bitmap``); the receiver tells the two apart
by length, since a bitmap is shorter than the values it indexes. A coordinate takes 12 B
sparse (index and value), 8 B plus n / 8 bytes for the whole message as a bitmap.
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def take_delta(local, base, index, values, offset, movable=None):
    """The sparse delta d = local - base: its support into index[:k] and its values into
    values[offset:offset + k]; base and local both become base + d there, the sum the
    server forms when it adds d with weight 1 (base + (local - base) may differ from
    local in the last bit), so base stays "the server's x plus what this worker has sent"
    bit for bit and the server need not echo this worker's own coordinates
    (``add_weighted_delta``). Returns k.

    ``movable``: the only coordinates that can differ (ascending; None: any), those of
    the blocks the epoch did not freeze: the scan reads them alone, not the whole x."""
    k = 0
    count = local.shape[0] if movable is None else movable.shape[0]
    for t in range(count):
        j = t if movable is None else movable[t]
        d = local[j] - base[j]
        if d != 0.0:
            index[k] = j
            values[offset + k] = d
            base[j] += d
            local[j] = base[j]
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
def add_weighted_delta(x, changed_at, index, values, offset, weight, omega, version,
                       source=0, run_source=None, before_run=None, orthant=None,
                       positive=False):
    """x[j] += weight omega[j] delta_j on a delta's coordinates (values[offset:]), each
    stamped changed_at[j] = version. With ``orthant`` (bool per coordinate), a marked
    coordinate that this takes across zero lands on zero instead: the sum is projected
    onto x's orthant (solvers/mpi.py, ``_serve_inner``). With ``positive`` (x >= 0, the
    positive L1 penalty), every coordinate that this takes below zero lands on zero.

    With ``run_source`` / ``before_run`` (per coordinate, int32 / int64) the server also
    tracks, for every coordinate, the run of changes that ``source`` made with weight
    exactly 1 (added exactly as the worker added them to its own copy, ``take_delta``):
    run_source[j] is that worker (0: the last change was another's or weighted) and
    before_run[j] the version of the last change before the run. ``changed_since`` then
    leaves out of a worker's reply the coordinates only it changed, exactly."""
    for t in range(index.shape[0]):
        j = index[t]
        scale = weight * omega[j]
        before = x[j]
        x[j] += scale * values[offset + t]
        projected = False
        if orthant is not None:
            if orthant[j] and before * x[j] < 0.0:
                x[j] = 0.0
                projected = True
        if positive and x[j] < 0.0:
            x[j] = 0.0
            projected = True
        if run_source is not None:
            exact = scale == 1.0 and not projected
            if not (exact and run_source[j] == source):
                before_run[j] = changed_at[j]
                run_source[j] = source if exact else 0
        changed_at[j] = version


@njit(cache=True, nogil=True)
def changed_since(changed_at, seen, worker=0, run_source=None, before_run=None):
    """The coordinates (int32, ascending) stamped after version ``seen``, except, with
    ``run_source`` / ``before_run`` (``add_weighted_delta``), those that only ``worker``
    changed since then, each with weight exactly 1: its copy holds them already."""
    count = 0
    for j in range(changed_at.shape[0]):
        if _owed(changed_at, seen, worker, run_source, before_run, j):
            count += 1
    out = np.empty(count, dtype=np.int32)
    k = 0
    for j in range(changed_at.shape[0]):
        if _owed(changed_at, seen, worker, run_source, before_run, j):
            out[k] = j
            k += 1
    return out


# de Bruijn sequence 0x077CB531's table: the index of a word's lowest set bit in one
# multiply and one lookup (``_lowest_bit``)
_DE_BRUIJN = np.array([0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8, 31, 27,
                       13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9], dtype=np.int64)


@njit(cache=True, inline="always")
def _lowest_bit(low):
    """b for a uint32 ``low`` that is exactly 2^b."""
    return _DE_BRUIJN[((np.uint64(low) * np.uint64(0x077CB531)) & np.uint64(0xFFFFFFFF))
                      >> np.uint64(27)]


@njit(cache=True, inline="always")
def _append_bits(word, base, out, k):
    """The set bits b of the uint32 ``word``, ascending, as base + b into out[k:] (one
    step per set bit, ``_lowest_bit``); returns the new k."""
    while word:
        low = word & (~word + np.uint32(1))
        out[k] = base + _lowest_bit(low)
        k += 1
        word ^= low
    return k


@njit(cache=True, nogil=True)
def changed_in_log(log, start, stop, changed_at, seen, worker, run_source, before_run,
                   judged, owed):
    """``changed_since`` from the log of the deltas added since version ``seen``: log[start:
    stop] holds their coordinates in arrival order, repeats included. Each coordinate is
    judged once (its bit in ``judged``) and the owed ones are set in ``owed`` (both
    uint32 bitmaps over x, all zero on entry and left so), whose words read in order give
    them ascending (int32) with no sort. Work in proportion to stop - start plus the
    span of words touched, instead of the whole x."""
    count = 0
    first, last = judged.shape[0], -1
    for t in range(start, stop):
        j = log[t]
        w = j >> 5
        bit = np.uint32(1) << np.uint32(j & 31)
        if judged[w] & bit:
            continue
        judged[w] |= bit
        first, last = min(first, w), max(last, w)
        if _owed(changed_at, seen, worker, run_source, before_run, j):
            owed[w] |= bit
            count += 1
    out = np.empty(count, dtype=np.int32)
    k = 0
    for w in range(first, last + 1):
        judged[w] = 0
        k = _append_bits(owed[w], w << 5, out, k)
        owed[w] = 0
    return out


class ChangeLog:
    """The coordinates of the deltas the server added in one inner loop, in arrival order,
    so that a reply lists what changed since the worker's previous one
    (``changed_in_log``) from the deltas added since, not by a scan of all p coordinates
    (``changed_since``), which it still uses when those deltas hold more than p entries.
    A reply from the log costs work in proportion to the deltas since the worker's
    previous one, usually far fewer than p.

    Entries older than every worker's previous reply are dropped when the log is full."""

    def __init__(self, n, n_workers):
        self.n = n
        self.entries = np.empty(max(1024, 2 * n), dtype=np.int32)
        self.size = 0
        self.since = np.zeros(n_workers + 1, dtype=np.int64)   # each worker's log start
        self.judged = np.zeros(bitmap_words(n), dtype=np.uint32)
        self.owed_bits = np.zeros(bitmap_words(n), dtype=np.uint32)

    def add(self, index):
        """Log a delta's coordinates."""
        k = index.shape[0]
        if self.size + k > self.entries.shape[0]:
            start = int(np.min(self.since[1:]))
            self.entries[:self.size - start] = self.entries[start:self.size]
            self.size -= start
            self.since[1:] -= start
            if self.size + k > self.entries.shape[0]:
                grown = np.empty(2 * (self.size + k), dtype=np.int32)
                grown[:self.size] = self.entries[:self.size]
                self.entries = grown
        self.entries[self.size:self.size + k] = index
        self.size += k

    def owed(self, worker, changed_at, seen, run_source, before_run):
        """The coordinates of ``worker``'s reply (``changed_since``'s), from here on
        counted from this reply."""
        start, self.since[worker] = int(self.since[worker]), self.size
        if self.size - start > self.n:
            return changed_since(changed_at, seen, worker, run_source, before_run)
        return changed_in_log(self.entries, start, self.size, changed_at, seen, worker,
                              run_source, before_run, self.judged, self.owed_bits)


@njit(cache=True, inline="always")
def _owed(changed_at, seen, worker, run_source, before_run, j):
    """Whether coordinate j goes into ``worker``'s reply (``changed_since``)."""
    if changed_at[j] <= seen:
        return False
    if run_source is None:
        return True
    return not (run_source[j] == worker and before_run[j] <= seen)


def bitmap_words(n):
    """int32 words of a bitmap over n coordinates."""
    return (int(n) + 31) // 32


@njit(cache=True, nogil=True)
def pack_bitmap(index, words):
    """Set bit j % 32 of words[j // 32] for every j of ``index`` (ascending), the other
    bits cleared: ``words`` (uint32) is the bitmap of the index set."""
    words[:] = 0
    for t in range(index.shape[0]):
        j = index[t]
        words[j >> 5] |= np.uint32(1) << np.uint32(j & 31)


@njit(cache=True, nogil=True)
def unpack_bitmap(words, n, index):
    """The set bits of ``words`` (uint32) among the first n, ascending, into index[:k];
    returns k."""
    k = 0
    for w in range(min(words.shape[0], (n + 31) // 32)):
        word = words[w]
        left = n - (w << 5)
        if left < 32:                       # the bits of the last word from n on
            word &= (np.uint32(1) << np.uint32(left)) - np.uint32(1)
        k = _append_bits(word, w << 5, index, k)
    return k


def index_length(count, scratch):
    """int32 that ``count`` coordinates take on the wire: their indices, or the words of
    their bitmap (``scratch``: uint32, ``bitmap_words(n)`` long for the message's n
    coordinates) when those are fewer."""
    return min(count, scratch.shape[0])


def write_index(index, out, scratch):
    """The wire form of ``index`` (int32, ascending) into ``out`` (``index_length`` long):
    the indices themselves, or their bitmap (packed in ``scratch`` first, so ``out`` may
    overlap ``index``)."""
    if out.shape[0] < index.shape[0]:
        pack_bitmap(index, scratch)
        out[:] = scratch.view(np.int32)
    else:
        out[:] = index


def encode_index(buffer, count, scratch):
    """A message's coordinates for the wire, in place: the ``count`` int32 indices at the
    start of ``buffer`` stay as they are, or their bitmap is written over them
    (``write_index``). Returns how many int32 of ``buffer`` to send."""
    length = index_length(count, scratch)
    if length < count:
        write_index(buffer[:count], buffer[:length], scratch)
    return length


def decode_index(received, count, n, out):
    """The coordinates of a message whose values number ``count``: ``received`` itself
    when it holds that many indices, else the bitmap it is, unpacked into ``out`` (int32,
    at least n) and returned as a prefix of it."""
    if received.shape[0] == count:
        return received
    k = unpack_bitmap(received.view(np.uint32), n, out)
    if k != count:
        raise ValueError(f"a message's bitmap holds {k} coordinates for {count} values")
    return out[:k]
