"""Sparse linear algebra on CSR arrays (indptr, indices, data) used by every solver."""
import numpy as np
from numba import njit


@njit(cache=True)
def csr_margins(indptr, indices, data, x, b, out):
    """out_i = a_i^T x + b for every row i."""
    for i in range(indptr.shape[0] - 1):
        acc = b
        for k in range(indptr[i], indptr[i + 1]):
            acc += data[k] * x[indices[k]]
        out[i] = acc
    return out


@njit(cache=True)
def csr_rmatvec(indptr, indices, data, r, n_cols):
    """A^T r (length n_cols) by scattering the rows."""
    out = np.zeros(n_cols)
    for i in range(indptr.shape[0] - 1):
        ri = r[i]
        if ri == 0.0:
            continue
        for k in range(indptr[i], indptr[i + 1]):
            out[indices[k]] += data[k] * ri
    return out


@njit(cache=True)
def csr_column_stats(indptr, indices, data, n_cols):
    """(||a_j||_2^2, n_j) per column: squared norms and numbers of stored non-zeros."""
    sq = np.zeros(n_cols)
    counts = np.zeros(n_cols, dtype=np.int64)
    for k in range(indptr[-1]):
        if data[k] != 0.0:
            j = indices[k]
            sq[j] += data[k] * data[k]
            counts[j] += 1
    return sq, counts


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
