"""Sparse linear algebra on CSR arrays (indptr, indices, data) used by every solver, and
the thread fan-out every threaded pass uses."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from ..losses import row_weight


def large_empty(size, dtype=np.float64):
    """An uninitialised array allocated by numpy, for a kernel to fill: numpy asks the
    kernel for huge pages on large arrays (where the system grants them on request) and
    an array a numba kernel allocates gets none, so a kernel writing a fresh array of
    many entries takes page faults several times over."""
    return np.empty(int(size), dtype=dtype)


@njit(cache=True, nogil=True)
def csr_margins_rows(indptr, indices, data, x, b, out, start, end):
    """out_i = a_i^T x + b for rows start <= i < end."""
    for i in range(start, end):
        acc = b
        for k in range(indptr[i], indptr[i + 1]):
            acc += data[k] * x[indices[k]]
        out[i] = acc


@njit(cache=True, nogil=True)
def csr_rmatvec_rows(indptr, indices, data, r, out, start, end):
    """out += sum_{start <= i < end} r_i a_i (A^T r restricted to those rows)."""
    for i in range(start, end):
        ri = r[i]
        if ri == 0.0:
            continue
        for k in range(indptr[i], indptr[i + 1]):
            out[indices[k]] += data[k] * ri


PARALLEL_MIN_ENTRIES = 1 << 18     # a pass over fewer entries stays on one thread


def pass_threads(indptr, n_threads):
    """The threads a pass over the rows ``indptr`` delimits runs on: ``n_threads``, or 1
    below PARALLEL_MIN_ENTRIES entries, where waking the pool's threads (~0.15 ms on a
    2-core VM) costs more than the half pass they take over."""
    return n_threads if indptr[-1] - indptr[0] >= PARALLEL_MIN_ENTRIES else 1


def row_ranges(n_rows, n_threads):
    """n_threads contiguous (start, end) row ranges covering range(n_rows)."""
    bounds = np.linspace(0, n_rows, n_threads + 1).astype(np.int64)
    return list(zip(bounds[:-1], bounds[1:]))


_POOL = None
_POOL_LOCK = threading.Lock()


def run_in_parallel(tasks):
    """Run the zero-argument callables ``tasks`` concurrently and return their results:
    the first on the calling thread, the others on a persistent pool of worker threads
    (created once and grown on demand, rather than a pool per call). Every task
    finishes before the first error, if any, is
    re-raised, so a failing task never leaves another one running."""
    global _POOL
    if len(tasks) <= 1:
        return [task() for task in tasks]
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < len(tasks) - 1:
            _POOL = ThreadPoolExecutor(max_workers=len(tasks) - 1,
                                       thread_name_prefix="asyncopt")
        pool = _POOL
    futures = [pool.submit(task) for task in tasks[1:]]
    results, errors = [None] * len(tasks), []
    try:
        results[0] = tasks[0]()
    except BaseException as error:  # noqa: BLE001 - re-raised once the others are done
        errors.append(error)
    for k, future in enumerate(futures, start=1):
        error = future.exception()
        if error is None:
            results[k] = future.result()
        else:
            errors.append(error)
    if errors:
        raise errors[0]
    return results


def _run_on_threads(kernel, ranges):
    run_in_parallel([lambda s=start, e=end: kernel(s, e) for start, end in ranges])


def csr_margins(indptr, indices, data, x, b, out, n_threads=1):
    """out_i = a_i^T x + b for every row i, rows split over n_threads threads
    (``pass_threads``)."""
    n = indptr.shape[0] - 1
    n_threads = pass_threads(indptr, n_threads)
    if n_threads <= 1:
        csr_margins_rows(indptr, indices, data, x, b, out, 0, n)
    else:
        _run_on_threads(lambda s, e: csr_margins_rows(indptr, indices, data, x, b, out, s, e),
                        row_ranges(n, n_threads))
    return out


def csr_rmatvec(indptr, indices, data, r, n_cols, n_threads=1):
    """A^T r (length n_cols); with n_threads > 1 (``pass_threads``) each thread sums its
    rows into its own vector and the partial sums are added."""
    n = indptr.shape[0] - 1
    n_threads = pass_threads(indptr, n_threads)
    if n_threads <= 1:
        out = np.zeros(n_cols)
        csr_rmatvec_rows(indptr, indices, data, r, out, 0, n)
        return out
    partial = np.zeros((n_threads, n_cols))
    run_in_parallel([lambda t=t, s=s, e=e: csr_rmatvec_rows(indptr, indices, data, r,
                                                            partial[t], s, e)
                     for t, (s, e) in enumerate(row_ranges(n, n_threads))])
    return partial.sum(axis=0)


@njit(cache=True)
def csr_column_stats(indptr, indices, data, n_cols, sample_weight):
    """(sum_i c_i a_ij^2, n_j, stored_j, sum_i c_i a_ij) per column: the weighted squared
    norms, the numbers of non-zeros, of stored entries (explicit zeros too) and the
    weighted sums (A^T c), then ||a_i||_2^2 per row (unweighted), in one pass; c_i =
    ``losses.row_weight`` of ``sample_weight`` (1 where it is empty)."""
    sq = np.zeros(n_cols)
    counts = np.zeros(n_cols, dtype=np.int64)
    stored = np.zeros(n_cols, dtype=np.int64)
    sums = np.zeros(n_cols)
    row_sq = np.zeros(indptr.shape[0] - 1)
    for i in range(indptr.shape[0] - 1):
        c = row_weight(sample_weight, i)
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            stored[j] += 1
            if data[k] != 0.0:
                square = data[k] * data[k]
                sq[j] += c * square
                counts[j] += 1
                sums[j] += c * data[k]
                row_sq[i] += square
    return sq, counts, stored, sums, row_sq


@njit(cache=True)
def csr_row_sq_norms(indptr, data):
    """||a_i||_2^2 per row."""
    n = indptr.shape[0] - 1
    out = np.zeros(n)
    for i in range(n):
        for k in range(indptr[i], indptr[i + 1]):
            out[i] += data[k] * data[k]
    return out


@njit(cache=True)
def csr_select(indptr, indices, data, column_map, row_order):
    """New CSR with rows in ``row_order`` and only the columns j with column_map[j] >= 0,
    renumbered to column_map[j]."""
    n = row_order.shape[0]
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    kept = 0
    for k in range(indptr[-1]):
        if column_map[indices[k]] >= 0:
            kept += 1
    new_indices = np.empty(kept, dtype=np.int32)
    new_data = np.empty(kept)
    pos = 0
    for r in range(n):
        i = row_order[r]
        for k in range(indptr[i], indptr[i + 1]):
            j = column_map[indices[k]]
            if j >= 0:
                new_indices[pos] = j
                new_data[pos] = data[k]
                pos += 1
        new_indptr[r + 1] = pos
    return new_indptr, new_indices, new_data


def csr_permute(indptr, indices, data, column_map, row_order):
    """``csr_select`` where column_map is a permutation (every column kept): row r of
    the new CSR is row row_order[r], column j renumbered column_map[j]. The rows are read
    in order and written where they go (a scatter: stores do not wait on their cache
    misses as the loads of a gather do)."""
    new_indptr = np.zeros(row_order.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.diff(indptr)[row_order], out=new_indptr[1:])
    new_indices = large_empty(new_indptr[-1], np.int32)
    new_data = large_empty(new_indptr[-1])
    _permute_into(indptr, indices, data, column_map, row_order, new_indptr, new_indices,
                  new_data)
    return new_indptr, new_indices, new_data


@njit(cache=True)
def _permute_into(indptr, indices, data, column_map, row_order, new_indptr, new_indices,
                  new_data):
    n = row_order.shape[0]
    start = np.empty(indptr.shape[0] - 1, dtype=np.int64)
    for r in range(n):
        start[row_order[r]] = new_indptr[r]
    for i in range(indptr.shape[0] - 1):
        pos = start[i]
        for k in range(indptr[i], indptr[i + 1]):
            new_indices[pos] = column_map[indices[k]]
            new_data[pos] = data[k]
            pos += 1


@njit(cache=True)
def csr_compact_columns_(indptr, indices, data, column_map):
    """In place: keep the columns with column_map[j] >= 0, renumbered; returns the new nnz
    (indices[:nnz], data[:nnz] then hold the compacted matrix; one pass, no allocation)."""
    pos = 0
    start = indptr[0]
    for i in range(indptr.shape[0] - 1):
        end = indptr[i + 1]
        for k in range(start, end):
            j = column_map[indices[k]]
            if j >= 0:
                indices[pos] = j
                data[pos] = data[k]
                pos += 1
        start = end
        indptr[i + 1] = pos
    return pos


@njit(cache=True)
def csr_stored_counts(indices, n_cols):
    """Stored entries per column, explicit zeros included (a loop, not numpy.bincount:
    see benchmarks/notes/problem.md)."""
    counts = np.zeros(n_cols, dtype=np.int64)
    for k in range(indices.shape[0]):
        counts[indices[k]] += 1
    return counts


@njit(cache=True)
def csr_columns(indptr, indices, data, column_map, n_out):
    """The columns j with column_map[j] >= 0 by column, as column column_map[j] of a
    CSC matrix of n_out columns: (indptr, row ids (int64), data), rows increasing within
    a column. One pass over the column ids, one over the kept entries; with
    column_map = arange(n_cols), the transpose."""
    col_indptr = np.zeros(n_out + 1, dtype=np.int64)
    for k in range(indptr[-1]):
        c = column_map[indices[k]]
        if c >= 0:
            col_indptr[c + 1] += 1
    for c in range(n_out):
        col_indptr[c + 1] += col_indptr[c]
    fill = col_indptr[:-1].copy()
    rows = np.empty(col_indptr[-1], dtype=np.int64)
    values = np.empty(col_indptr[-1])
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            c = column_map[indices[k]]
            if c >= 0:
                rows[fill[c]] = i
                values[fill[c]] = data[k]
                fill[c] += 1
    return col_indptr, rows, values


@njit(cache=True)
def csc_rows(indptr, rows, data, cols, n_rows):
    """The rows of the columns ``cols`` of a CSC matrix (indptr, rows, data), as CSR
    (indptr (int64), indices (int32): column q is cols[q], data), entries of a row in
    increasing q: the transpose of those columns alone, one pass over their entries
    and one over the rows."""
    row_indptr = np.zeros(n_rows + 1, dtype=np.int64)
    for q in range(cols.shape[0]):
        for k in range(indptr[cols[q]], indptr[cols[q] + 1]):
            row_indptr[rows[k] + 1] += 1
    for i in range(n_rows):
        row_indptr[i + 1] += row_indptr[i]
    fill = row_indptr[:-1].copy()
    indices = np.empty(row_indptr[-1], dtype=np.int32)
    values = np.empty(row_indptr[-1])
    for q in range(cols.shape[0]):
        for k in range(indptr[cols[q]], indptr[cols[q] + 1]):
            i = rows[k]
            indices[fill[i]] = q
            values[fill[i]] = data[k]
            fill[i] += 1
    return row_indptr, indices, values


def csr_transpose(indptr, indices, data, n_cols):
    """``csr_columns`` with column_map = arange(n_cols), every column kept: the CSC form
    (indptr, row ids (int64), data), its arrays allocated by numpy (``large_empty``)."""
    col_indptr = _column_counts(indptr, indices, n_cols)
    rows, values = large_empty(col_indptr[-1], np.int64), large_empty(col_indptr[-1])
    _transpose_into(indptr, indices, data, col_indptr, rows, values)
    return col_indptr, rows, values


@njit(cache=True)
def _column_counts(indptr, indices, n_cols):
    col_indptr = np.zeros(n_cols + 1, dtype=np.int64)
    for k in range(indptr[0], indptr[-1]):
        col_indptr[indices[k] + 1] += 1
    for c in range(n_cols):
        col_indptr[c + 1] += col_indptr[c]
    return col_indptr


@njit(cache=True)
def _transpose_into(indptr, indices, data, col_indptr, rows, values):
    fill = col_indptr[:-1].copy()
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            c = indices[k]
            rows[fill[c]] = i
            values[fill[c]] = data[k]
            fill[c] += 1


@njit(cache=True)
def csr_keep_columns(indptr, indices, data, keep, out_indptr, out_indices, out_data):
    """Write the rows restricted to the columns with keep[j] != 0 (uint8; column ids kept)
    into out_indptr (n + 1), out_indices and out_data (room for their count plus one);
    returns their count. Branch-free: every entry is written and the position advances
    by keep[j], with no test per entry."""
    pos = 0
    out_indptr[0] = 0
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            out_indices[pos] = j
            out_data[pos] = data[k]
            pos += keep[j]
        out_indptr[i + 1] = pos
    return pos
