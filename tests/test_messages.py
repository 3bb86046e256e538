"""The parameter server's message kernels (comm/messages.py) against the numpy
expressions they replace."""
import numpy as np

import pytest

from asyncopt.comm.messages import (ChangeLog, add_weighted_delta, apply_reply,
                                       bitmap_words, changed_since, decode_index,
                                       encode_index, take_delta, unpack_bitmap)

HEADER = 4


def _vectors(seed=0, p=500):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(p)
    local = base.copy()
    moved = rng.choice(p, 60, replace=False)
    local[moved] += rng.standard_normal(60)
    return rng, local, base


def test_take_delta_is_the_sparse_difference_and_base_catches_up():
    _, local, base = _vectors()
    expected = local - base
    support = np.flatnonzero(expected)
    index = np.full(local.shape[0], -1, dtype=np.int32)
    values = np.full(HEADER + local.shape[0], np.nan)
    count = take_delta(local, base, index, values, HEADER)
    assert count == support.shape[0] == 60
    np.testing.assert_array_equal(index[:count], support)
    np.testing.assert_array_equal(values[HEADER:HEADER + count], expected[support])
    np.testing.assert_array_equal(base, local)
    assert np.isnan(values[:HEADER]).all()           # the header is left to the caller
    assert take_delta(local, base, index, values, HEADER) == 0


def test_take_delta_over_the_movable_coordinates_reads_only_them():
    """With ``movable`` (the unfrozen blocks' coordinates) the delta is the same as from
    the whole x when nothing else differs, and a difference outside them is neither sent
    nor caught up (the caller vouches that there is none)."""
    _, local, base = _vectors()
    support = np.flatnonzero(local - base)
    movable = np.union1d(support, [0, 7, local.shape[0] - 1])
    want_local, want_base = local.copy(), base.copy()
    index, values = np.empty(local.shape[0], np.int32), np.empty(HEADER + local.shape[0])
    want = take_delta(want_local, want_base, index, values, HEADER)
    want_index, want_values = index[:want].copy(), values[HEADER:HEADER + want].copy()
    got = take_delta(local, base, index, values, HEADER, movable)
    assert got == want == support.shape[0]
    np.testing.assert_array_equal(index[:got], want_index)
    np.testing.assert_array_equal(values[HEADER:HEADER + got], want_values)
    np.testing.assert_array_equal(base, want_base)
    outside = np.setdiff1d(np.arange(local.shape[0]), movable)[:3]
    local[outside] += 1.0
    assert take_delta(local, base, index, values, HEADER, movable) == 0
    np.testing.assert_array_equal(base[outside], want_base[outside])


def test_apply_reply_keeps_pending_steps_on_the_server_values():
    rng, local, base = _vectors(1)
    pending = local - base
    for full in (False, True):
        loc, bas = local.copy(), base.copy()
        index = (np.arange(loc.shape[0]) if full else
                 np.sort(rng.choice(loc.shape[0], 80, replace=False))).astype(np.int32)
        server = rng.standard_normal(index.shape[0])
        reply = np.concatenate((np.zeros(HEADER), server))
        apply_reply(loc, bas, index[:0] if full else index, reply, HEADER, full)
        want_local, want_base = local.copy(), base.copy()
        want_local[index] = server + pending[index]
        want_base[index] = server
        np.testing.assert_allclose(loc, want_local, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(bas, want_base)
        # where nothing is pending the worker holds the server's value exactly
        still = index[pending[index] == 0]
        np.testing.assert_array_equal(loc[still], server[np.isin(index, still)])


def test_server_adds_weighted_deltas_and_lists_what_changed_since_a_version():
    rng = np.random.default_rng(2)
    p = 300
    x = rng.standard_normal(p)
    omega = rng.uniform(0.2, 1.0, p)
    changed_at = np.zeros(p, dtype=np.int64)
    want = x.copy()
    for version, size in ((1, 40), (2, 25), (3, 50)):
        index = np.sort(rng.choice(p, size, replace=False)).astype(np.int32)
        delta = rng.standard_normal(size)
        values = np.concatenate((np.zeros(HEADER), delta))
        add_weighted_delta(x, changed_at, index, values, HEADER, 0.5, omega, version)
        want[index] += 0.5 * omega[index] * delta
        np.testing.assert_allclose(x, want, rtol=0, atol=1e-15)
        assert (changed_at[index] == version).all()
    for seen in range(4):
        fresh = changed_since(changed_at, seen)
        assert fresh.dtype == np.int32
        np.testing.assert_array_equal(fresh, np.flatnonzero(changed_at > seen))


def test_a_delta_across_zero_stops_at_zero_where_the_orthant_is_kept():
    """With ``orthant``, a marked coordinate that the weighted delta takes to the other
    side of zero lands on zero, and is no longer counted as the worker's exact sum (its
    reply must carry it); unmarked ones, and moves that stay on their side or start at
    zero, add as before."""
    x = np.array([1.0, 1.0, -2.0, 0.0, 1.0, 3.0])
    orthant = np.array([True, True, True, True, False, True])
    delta = np.array([-3.0, -0.5, 5.0, -1.0, -3.0, -3.0])
    index = np.arange(6, dtype=np.int32)
    values = np.concatenate((np.zeros(HEADER), delta))
    changed_at = np.zeros(6, dtype=np.int64)
    run_source = np.zeros(6, dtype=np.int32)
    before_run = np.zeros(6, dtype=np.int64)
    add_weighted_delta(x, changed_at, index, values, HEADER, 1.0, np.ones(6), 1, 2,
                       run_source, before_run, orthant)
    np.testing.assert_array_equal(x, [0.0, 0.5, 0.0, -1.0, -2.0, 0.0])
    # the last lands exactly on zero: no crossing, the worker's own sum
    np.testing.assert_array_equal(run_source, [0, 2, 0, 2, 2, 2])
    np.testing.assert_array_equal(changed_at, np.ones(6))
    # without orthant everything adds
    y = np.array([1.0, 1.0])
    add_weighted_delta(y, np.zeros(2, dtype=np.int64), np.arange(2, dtype=np.int32),
                       np.concatenate((np.zeros(HEADER), [-1.0, -3.0])), HEADER, 1.0,
                       np.ones(2), 1)
    np.testing.assert_array_equal(y, [0.0, -2.0])


@pytest.mark.parametrize("p", [1, 31, 32, 33, 500, 1024])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.2, 0.9, 1.0])
def test_index_travels_as_indices_or_bitmap_whichever_is_shorter(p, density):
    rng = np.random.default_rng(int(1000 * density) + p)
    support = np.flatnonzero(rng.random(p) < density).astype(np.int32)
    k, words = support.shape[0], bitmap_words(p)
    assert words == int(np.ceil(p / 32))
    buffer = np.full(p, -7, dtype=np.int32)          # the channel's index slot
    buffer[:k] = support
    sent = encode_index(buffer, k, np.empty(words, dtype=np.uint32))
    assert sent == min(k, words)                      # int32 on the wire
    wire = buffer[:sent].copy()
    if k > words:      # the bitmap: bit j % 32 of word j // 32, nothing beyond p
        bits = np.unpackbits(wire.view(np.uint8), bitorder="little")
        np.testing.assert_array_equal(np.flatnonzero(bits), support)
    out = np.full(p, -1, dtype=np.int32)
    np.testing.assert_array_equal(decode_index(wire, k, p, out), support)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 1000])
def test_unpack_bitmap_gives_the_set_bits_below_n_ascending(n):
    """Every set bit j < n of random words, in order, as np.unpackbits reads them; bits
    from n on (in the last word, or in words beyond the bitmap's) are not coordinates."""
    rng = np.random.default_rng(n)
    for _ in range(10):
        words = rng.integers(0, 2 ** 32, bitmap_words(n) + 2, dtype=np.uint64)
        words = words.astype(np.uint32)
        words[rng.random(words.shape[0]) < 0.3] = 0
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        want = np.flatnonzero(bits[:n])
        out = np.full(32 * words.shape[0], -1, dtype=np.int32)
        k = unpack_bitmap(words, n, out)
        np.testing.assert_array_equal(out[:k], want)


def test_a_bitmap_that_disagrees_with_its_values_is_an_error():
    words = np.zeros(bitmap_words(100), dtype=np.uint32)
    words[0] = 0b1011
    with pytest.raises(ValueError, match="3 coordinates for 5 values"):
        decode_index(words.view(np.int32), 5, 100, np.empty(100, dtype=np.int32))


def test_take_delta_leaves_base_and_local_at_the_servers_sum():
    rng = np.random.default_rng(5)
    base = rng.standard_normal(200) * 1e3
    local = rng.standard_normal(200) * 1e-3
    want = base + (local - base)                            # what the server forms
    assert np.any(want != local)                            # the sums that round
    index = np.empty(200, dtype=np.int32)
    values = np.empty(HEADER + 200)
    take_delta(local, base, index, values, HEADER)
    np.testing.assert_array_equal(base, want)
    np.testing.assert_array_equal(local, want)


def test_replies_leave_out_what_only_the_worker_itself_changed_exactly():
    """Random deltas of workers 1-3, some weighted (omega < 1 or damped): each reply holds
    exactly the coordinates that changed since the worker's last reply by anything other
    than its own deltas added with weight 1 (brute force over the log of changes), by a
    scan of x (changed_since) and from the server's ChangeLog alike."""
    rng = np.random.default_rng(6)
    p, workers = 60, 3
    x = np.zeros(p)
    omega = np.where(rng.random(p) < 0.2, 0.5, 1.0)
    changed_at = np.zeros(p, dtype=np.int64)
    run_source = np.zeros(p, dtype=np.int32)
    before_run = np.zeros(p, dtype=np.int64)
    seen = np.zeros(workers + 1, dtype=np.int64)
    log = []                                  # (version, worker, coordinate, exact)
    changes = ChangeLog(p, workers)          # the server's, from a small log: it compacts,
    changes.entries = np.empty(30, dtype=np.int32)    # grows, and scans after long gaps
    for version in range(1, 80):
        worker = int(rng.integers(1, workers + 1))
        damping = 1.0 if rng.random() < 0.8 else 0.5
        index = np.sort(rng.choice(p, 12, replace=False)).astype(np.int32)
        values = np.concatenate((np.zeros(HEADER), rng.standard_normal(12)))
        add_weighted_delta(x, changed_at, index, values, HEADER, damping, omega, version,
                           worker, run_source, before_run)
        log += [(version, worker, j, damping * omega[j] == 1.0) for j in index]
        changes.add(index)
        fresh = changed_since(changed_at, seen[worker], worker, run_source, before_run)
        want = sorted({j for v, w, j, exact in log if v > seen[worker]} -
                      {j for j in range(p) if all(w == worker and exact for v, w, k, exact
                                                  in log if k == j and v > seen[worker])})
        np.testing.assert_array_equal(fresh, want)
        logged = changes.owed(worker, changed_at, seen[worker], run_source, before_run)
        assert logged.dtype == np.int32
        np.testing.assert_array_equal(logged, want)
        # the log's bitmaps are all zero between replies (changed_in_log's contract)
        assert not changes.judged.any() and not changes.owed_bits.any()
        seen[worker] = version
