"""Feature crosses: products of 2 or 3 distinct co-occurring features of a sparse matrix."""
import numpy as np
import scipy.sparse as sp
from numba import njit

_INT32_MAX = np.iinfo(np.int32).max


@njit(cache=True)
def _cross_counts(indptr, degree):
    """Number of degree-`degree` products in each row."""
    n_rows = indptr.shape[0] - 1
    counts = np.empty(n_rows, dtype=np.int64)
    for i in range(n_rows):
        m = indptr[i + 1] - indptr[i]
        if degree == 2:
            counts[i] = m * (m - 1) // 2
        else:
            counts[i] = m * (m - 1) * (m - 2) // 6
    return counts


@njit(cache=True)
def _cross_keys(indptr, indices, data, n_features, degree, row_start, keys, values):
    """Keys j*d + k (j < k) or (j*d + k)*d + l (j < k < l) and value products of every
    row's products, rows in order and each row's keys increasing."""
    d = np.int64(n_features)
    for i in range(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        pos = row_start[i]
        for a in range(lo, hi):
            ka = np.int64(indices[a])
            for b in range(a + 1, hi):
                kb = ka * d + indices[b]
                vab = data[a] * data[b]
                if degree == 2:
                    keys[pos] = kb
                    values[pos] = vab
                    pos += 1
                else:
                    for c in range(b + 1, hi):
                        keys[pos] = kb * d + indices[c]
                        values[pos] = vab * data[c]
                        pos += 1


@njit(cache=True)
def _assemble(n_rows, blocks_indptr, blocks_cols, blocks_vals, out_indptr, out_cols, out_vals):
    """Concatenate, row by row, the blocks (original, pairs, triples) of column ids."""
    n_blocks = len(blocks_indptr)
    pos = 0
    out_indptr[0] = 0
    for i in range(n_rows):
        for t in range(n_blocks):
            ptr = blocks_indptr[t]
            cols = blocks_cols[t]
            vals = blocks_vals[t]
            for q in range(ptr[i], ptr[i + 1]):
                out_cols[pos] = cols[q]
                out_vals[pos] = vals[q]
                pos += 1
        out_indptr[i + 1] = pos


def _compact_keys(keys, key_space):
    """(sorted distinct keys, column id of each key) with ids 0.. in key order."""
    if key_space <= max(1 << 24, 4 * keys.shape[0]):
        seen = np.zeros(key_space, dtype=bool)
        seen[keys] = True
        distinct = np.flatnonzero(seen)
        ids = np.cumsum(seen, dtype=np.int64) - 1
        return distinct, ids[keys]
    distinct, inverse = np.unique(keys, return_inverse=True)
    return distinct, inverse.ravel()


def _decode(distinct, n_features, degree):
    out = np.empty((distinct.shape[0], degree), dtype=np.int64)
    rest = distinct.copy()
    for t in range(degree - 1, -1, -1):
        out[:, t] = rest % n_features
        rest //= n_features
    return out


def feature_crosses(X, degree=2, include_original=True, return_index=False):
    """X with product features: every product of 2 (and, for degree 3, of 3) distinct
    features that are stored non-zeros together in at least one row.

    Meant for binary (0/1) X, where a product is the AND of the features; other values are
    multiplied. Columns, all as a float64 ``csr_matrix`` with sorted indices:

    - the original features 0 .. d-1 (unless ``include_original=False``), all of them;
    - the pairs (j, k), j < k, that co-occur somewhere, in lexicographic order;
    - for degree 3, then the co-occurring triples (j, k, l), j < k < l, lexicographically.

    ``return_index=True`` also returns ``index``, an int64 array of shape
    ``(n_columns, degree)``: row c lists the original features whose product is column c,
    padded with -1 (``[j, -1, -1]`` for an original feature in degree 3).

    degree=1 returns the (canonicalised) original features.
    """
    if degree not in (1, 2, 3):
        raise ValueError(f"degree must be 1, 2 or 3, got {degree}")
    if not sp.issparse(X):
        raise TypeError(f"feature_crosses needs a scipy.sparse matrix, got {type(X).__name__}")
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.sum_duplicates()
    X.eliminate_zeros()
    X.sort_indices()
    n_rows, n_features = X.shape
    if n_features > 0 and degree * np.log2(max(n_features, 2)) >= 63:
        raise ValueError(f"n_features={n_features} too large for degree-{degree} crosses")
    indptr = X.indptr.astype(np.int64)
    indices = X.indices.astype(np.int64)

    blocks = []
    index_parts = []
    n_columns = 0
    if include_original:
        blocks.append((indptr, indices, X.data))
        original = np.full((n_features, degree), -1, dtype=np.int64)
        original[:, 0] = np.arange(n_features)
        index_parts.append(original)
        n_columns = n_features
    for k in range(2, degree + 1):
        counts = _cross_counts(indptr, k)
        row_start = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(counts, out=row_start[1:])
        keys = np.empty(row_start[-1], dtype=np.int64)
        values = np.empty(row_start[-1], dtype=np.float64)
        _cross_keys(indptr, indices, X.data, n_features, k, row_start, keys, values)
        distinct, ids = _compact_keys(keys, n_features ** k)
        blocks.append((row_start, ids + n_columns, values))
        part = np.full((distinct.shape[0], degree), -1, dtype=np.int64)
        part[:, :k] = _decode(distinct, n_features, k)
        index_parts.append(part)
        n_columns += distinct.shape[0]

    nnz = sum(b[1].shape[0] for b in blocks)
    index_dtype = np.int32 if max(nnz, n_columns) <= _INT32_MAX else np.int64
    out_indptr = np.empty(n_rows + 1, dtype=index_dtype)
    out_cols = np.empty(nnz, dtype=index_dtype)
    out_vals = np.empty(nnz, dtype=np.float64)
    if blocks:
        _assemble(n_rows, tuple(b[0] for b in blocks), tuple(b[1] for b in blocks),
                  tuple(b[2] for b in blocks), out_indptr, out_cols, out_vals)
    else:
        out_indptr[:] = 0
    Z = sp.csr_matrix((out_vals, out_cols, out_indptr), shape=(n_rows, n_columns))
    Z.has_sorted_indices = True
    if return_index:
        index = (np.concatenate(index_parts) if index_parts
                 else np.empty((0, degree), dtype=np.int64))
        return Z, index
    return Z
