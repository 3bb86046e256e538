"""Synthetic CTR-like data: one-hot rows over a power-law feature distribution
(docs/design.md §7)."""
import numpy as np
import scipy.sparse as sp

_INT32_MAX = np.iinfo(np.int32).max
_MAX_REJECTION_ROUNDS = 40
_GUMBEL_BLOCK = 1 << 22


def zipf_probabilities(n_features, exponent):
    """p_j proportional to (j + 1) ** -exponent for feature ids j = 0 .. n_features - 1."""
    weights = np.arange(1, n_features + 1, dtype=np.float64) ** -float(exponent)
    return weights / weights.sum()


def _draw(rng, cdf, size):
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), cdf.shape[0] - 1)


def _duplicates(rows):
    dup = np.zeros(rows.shape, dtype=bool)
    dup[:, 1:] = rows[:, 1:] == rows[:, :-1]
    return dup


def _fill_by_gumbel(rng, rows, dup, log_p):
    """Replace the duplicate slots of each sorted row by a weighted sample without
    replacement from the features the row lacks (Gumbel top-k), then sort the rows."""
    n_rows, k = rows.shape
    n_features = log_p.shape[0]
    block = max(1, _GUMBEL_BLOCK // n_features)
    for lo in range(0, n_rows, block):
        sub, sub_dup = rows[lo:lo + block], dup[lo:lo + block]
        keys = log_p + rng.gumbel(size=(sub.shape[0], n_features))
        held_r, held_c = np.nonzero(~sub_dup)
        keys[held_r, sub[held_r, held_c]] = -np.inf
        order = np.argsort(-keys, axis=1, kind="stable")[:, :k]
        missing = sub_dup.sum(axis=1)
        sub[sub_dup] = order[np.arange(k)[None, :] < missing[:, None]]
        sub.sort(axis=1)
    return rows


def zipf_rows(n_samples, n_features, nnz_per_row, exponent, rng):
    """(n_samples, nnz_per_row) sorted feature ids, distinct within each row, each row a
    weighted sample without replacement from the Zipf distribution
    ``zipf_probabilities``."""
    p = zipf_probabilities(n_features, exponent)
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    index_dtype = np.int32 if n_features <= _INT32_MAX else np.int64
    rows = _draw(rng, cdf, n_samples * nnz_per_row).astype(index_dtype).reshape(
        n_samples, nnz_per_row)
    active = np.arange(n_samples)
    for _ in range(_MAX_REJECTION_ROUNDS):
        sub = rows[active]
        sub.sort(axis=1)
        dup = _duplicates(sub)
        has_dup = dup.any(axis=1)
        rows[active] = sub
        if not has_dup.any():
            return rows
        active, sub, dup = active[has_dup], sub[has_dup], dup[has_dup]
        sub[dup] = _draw(rng, cdf, int(dup.sum()))
        rows[active] = sub
    sub = rows[active]
    sub.sort(axis=1)
    rows[active] = _fill_by_gumbel(rng, sub, _duplicates(sub), np.log(p))
    return rows


def make_ctr(n_samples, n_features, nnz_per_row=30, zipf_exponent=1.1, n_informative=None,
             loss="squared", noise=0.1, normalize_rows=True, random_state=None):
    """Synthetic CTR-like regression or classification data ``(X, y, coef_true)``.

    Row i of X has exactly ``nnz_per_row`` distinct one-hot features, drawn without
    replacement with probability proportional to ``(j + 1) ** -zipf_exponent`` for feature
    id j: feature 0 is the most popular and popularity decays as a power law of the id.
    Values are 1, or ``1 / sqrt(nnz_per_row)`` (unit l2 rows) when ``normalize_rows``.
    X is a float64 ``csr_matrix`` with sorted indices (int32 index arrays where they fit).

    ``coef_true`` has ``n_informative`` non-zeros (default: 1 % of the features, at least
    1) at ids drawn uniformly among the ``5 * n_informative`` most popular features, values
    of random sign and magnitude in [0.5, 1.5], the whole vector then scaled so that the
    margins ``X @ coef_true`` have unit standard deviation.

    ``loss="squared"``: y = X @ coef_true + noise * N(0, 1).
    ``loss="logistic"``: y in {-1, +1} with P(y = +1) = 1 / (1 + exp(-x_i^T coef_true));
    ``noise`` is not used.

    The same ``random_state`` (int or numpy Generator state) gives the same data.
    """
    n_samples, n_features, nnz_per_row = int(n_samples), int(n_features), int(nnz_per_row)
    if n_samples < 1 or n_features < 1:
        raise ValueError(f"need n_samples >= 1 and n_features >= 1, got "
                         f"{n_samples} and {n_features}")
    if not 1 <= nnz_per_row <= n_features:
        raise ValueError(f"nnz_per_row must be in [1, n_features={n_features}], "
                         f"got {nnz_per_row}")
    if zipf_exponent < 0:
        raise ValueError(f"zipf_exponent must be >= 0, got {zipf_exponent}")
    if loss not in ("squared", "logistic"):
        raise ValueError(f"loss must be 'squared' or 'logistic', got {loss!r}")
    if n_informative is None:
        n_informative = max(1, round(0.01 * n_features))
    n_informative = int(n_informative)
    if not 1 <= n_informative <= n_features:
        raise ValueError(f"n_informative must be in [1, n_features={n_features}], "
                         f"got {n_informative}")
    rng = np.random.default_rng(random_state)

    rows = zipf_rows(n_samples, n_features, nnz_per_row, zipf_exponent, rng)
    nnz = n_samples * nnz_per_row
    pointer_dtype = np.int32 if nnz <= _INT32_MAX and n_features <= _INT32_MAX else np.int64
    value = 1.0 / np.sqrt(nnz_per_row) if normalize_rows else 1.0
    X = sp.csr_matrix(
        (np.full(nnz, value), rows.ravel().astype(pointer_dtype, copy=False),
         np.arange(0, nnz + 1, nnz_per_row, dtype=pointer_dtype)),
        shape=(n_samples, n_features))
    X.has_sorted_indices = True

    pool = min(n_features, 5 * n_informative)
    support = np.sort(rng.choice(pool, size=n_informative, replace=False))
    coef_true = np.zeros(n_features)
    coef_true[support] = rng.choice([-1.0, 1.0], size=n_informative) * rng.uniform(
        0.5, 1.5, size=n_informative)
    margins = X @ coef_true
    scale = margins.std()
    if scale > 0:
        coef_true /= scale
        margins /= scale

    if loss == "squared":
        y = margins + noise * rng.standard_normal(n_samples)
    else:
        p_plus = 0.5 * (1.0 + np.tanh(0.5 * margins))
        y = np.where(rng.random(n_samples) < p_plus, 1.0, -1.0)
    return X, y, coef_true
