"""The DDSS outer loop of one serial working-set solve of the L1 squared loss, compiled:
what ``ddss.Driver`` runs with ``solvers.working_set.step`` between its certificates,
for the warm-started solves of a path (``solvers.path``), where the Python of a solve
(its set-up, certificates, screening and compactions, about a millisecond) costs more
than the solve's passes.

In the kernels' scaling (``kernels.working_set``, docs/design.md §1 times n): on the
columns of the full set (CSC, rows in its order), with the residual r = y - A w - b,

    F(w, b) = 1/2 ||r||_C^2 + n lam sum_j v_j (|w_j| + l2 w_j^2 / 2),

every outer iteration

1. certifies (w, b): b refitted (r centred with the weights c), c_j = A_j^T C r -
   n lam l2 v_j w_j on the features not yet screened, the dual point u = C r / s with
   s = max(1, max_j |c_j| / (n lam v_j)) (one-sided with ``positive``), and
   G = F(w, b) - D(u) (``lasso_dual``), P = F / n and the gap G / n in P's scale;
2. stops where G <= ``target`` (the caller's tol n P(0));
3. screens: the gap-safe sphere test (``screening.gap_safe_keep``, radius
   ``gap_safe_radius``, the elastic net's column norms ``augmented_column_norms``)
   removes features for the rest of the solve, a removed non-zero set to 0;
4. takes the working-set step: W the non-zeros and the zero features of largest
   violation max(|c_j| - n lam v_j, 0) (``solvers.working_set.violation_scores``), up to
   max(``first_size``, 2 nnz) features, solved to ``inner_fraction`` G by
   ``lasso_working_set_solve`` (coordinate descent with Anderson extrapolation, orthant
   Newton steps).

This is the Driver's loop for this one case, with the same certificate, test, set and
inner solver; it leaves out what a path's solves do not need: the best dual point of
earlier certificates, the support Newton step and the choice of inner step (``auto``
picks the working set on a warm start whose support is set), checkpoints and the live
line.
"""
import numpy as np
from numba import njit

from ..losses import weight_total
from ..penalties import dual_magnitude
from ..screening import augmented_column_norms, gap_safe_keep, gap_safe_radius
from .linalg import csr_rmatvec_rows
from .working_set import (_column_axpy, _weighted_column_dot, lasso_dual, lasso_objective,
                          lasso_working_set_solve)


@njit(cache=True)
def _certify(indptr, rows, data, row_data, kept, n_kept, kept_entries, w, r, b, y,
             sample_weight, total, n_lam, weights, positive, l2, fit_intercept, singletons,
             correlation):
    """Refit b (r centred), then c_j (module docstring) into ``correlation`` for the
    features kept[:n_kept] (``kept_entries`` entries in their columns); returns (b, F, D,
    s). A^T C r comes from a pass over the rows (``row_data``: the CSR arrays) where the
    kept columns hold more than a quarter of the entries: a column's loop costs about
    four times a row's per entry (the columns are short), the rows are read in full."""
    if fit_intercept and total > 0.0:
        if sample_weight.shape[0] == 0:
            shift = np.sum(r) / r.shape[0]
        else:
            shift = np.dot(sample_weight, r) / total
        for i in range(r.shape[0]):
            r[i] -= shift
        b += shift
    row_indptr, row_indices, row_values = row_data
    by_rows = 4 * kept_entries > row_indptr[-1]
    if by_rows:
        correlation[:] = 0.0
        rho = r if sample_weight.shape[0] == 0 else sample_weight * r
        csr_rmatvec_rows(row_indptr, row_indices, row_values, rho, correlation, 0,
                         r.shape[0])
    dual_norm = 0.0
    for t in range(n_kept):
        j = kept[t]
        c = correlation[j] if by_rows else \
            _weighted_column_dot(indptr, rows, data, j, r, sample_weight)
        if l2 > 0.0:
            c -= n_lam * l2 * weights[j] * w[j]
        correlation[j] = c
        if weights[j] > 0.0:
            dual_norm = max(dual_norm, dual_magnitude(c, positive) / weights[j])
    dual_scale = max(1.0, dual_norm / n_lam)
    primal = lasso_objective(w, r, sample_weight, n_lam, weights, positive, l2, singletons)
    dual = lasso_dual(r, y, sample_weight, 1.0 / dual_scale, n_lam, l2, w, weights)
    return b, primal, dual, dual_scale


@njit(cache=True)
def _screen(indptr, rows, data, kept, n_kept, w, r, correlation, dual_scale, radius,
            sq_norms, n, lam, weights, positive, l2):
    """Keep in kept[:n_kept] the features the gap-safe sphere cannot remove (a removed
    non-zero set to 0, r updated); returns (how many are kept, their columns' entries)."""
    m = 0
    entries = 0
    for t in range(n_kept):
        j = kept[t]
        norm = augmented_column_norms(np.sqrt(sq_norms[j]), n, 1.0, lam, l2, weights[j])
        if gap_safe_keep(dual_magnitude(correlation[j], positive), dual_scale, radius,
                         norm, n, lam, weights[j]):
            kept[m] = j
            m += 1
            entries += indptr[j + 1] - indptr[j]
        elif w[j] != 0.0:
            _column_axpy(indptr, rows, data, j, w[j], r)
            w[j] = 0.0
    return m, entries


@njit(cache=True)
def _working_set(kept, n_kept, w, correlation, n_lam, weights, positive, first_size):
    """The non-zeros of w among kept[:n_kept] and the zero features of largest positive
    violation, max(first_size, 2 nnz) in all at most; sorted."""
    support = 0
    n_candidates = 0
    candidates = np.empty(n_kept, dtype=np.int64)
    scores = np.empty(n_kept)
    for t in range(n_kept):
        j = kept[t]
        if w[j] != 0.0:
            support += 1
        else:
            score = dual_magnitude(correlation[j], positive) - n_lam * weights[j]
            if score > 0.0:
                candidates[n_candidates] = j
                scores[n_candidates] = score
                n_candidates += 1
    room = max(first_size, 2 * support) - support
    chosen = candidates[:n_candidates]
    if n_candidates > room:
        chosen = chosen[np.argsort(-scores[:n_candidates])[:room]]
    ws = np.empty(support + chosen.shape[0], dtype=np.int64)
    m = 0
    for t in range(n_kept):
        if w[kept[t]] != 0.0:
            ws[m] = kept[t]
            m += 1
    ws[m:] = chosen
    return np.sort(ws)


@njit(cache=True, nogil=True)
def lasso_ddss_solve(indptr, rows, data, row_data, kept, y, sample_weight, sq_norms,
                     weights, lam, positive, l2, fit_intercept, w, r, b, target, max_outer,
                     screening, first_size, inner_fraction, anderson, check_every,
                     orthant_every, orthant_cg, max_inner):
    """Solve the L1 (or elastic-net, ``l2``; ``positive``: w >= 0) squared loss at ``lam``
    from (w, b) with r = y - A w - b, on the columns (indptr, rows, data) of every
    feature and the same data's rows (``row_data``: CSR indptr, indices, data; module
    docstring), until G <= ``target`` (F's scale: n times P's) or
    ``max_outer`` outer iterations; ``sq_norms`` = ||C^(1/2) A_j||^2, ``weights`` = v_j;
    the working-set step's constants as ``solvers.working_set``'s. w and r are updated
    in place, kept[:m] holds the m features the test kept (``kept``: p entries, written
    over); returns (b, F, D, outer iterations, inner passes, m).
    Guarantees: the returned (F, D) are those of the returned (w, b), D that of a
    feasible dual point, so (F - D) / n certifies P(w, b) - P*."""
    n = y.shape[0]
    p = w.shape[0]
    n_lam = n * lam
    total = weight_total(sample_weight, n)
    singletons = np.arange(p + 1)
    for j in range(p):
        kept[j] = j
    n_kept = p
    kept_entries = indptr[p]
    correlation = np.zeros(p)
    outer = 0
    passes = 0
    while True:
        b, primal, dual, dual_scale = _certify(
            indptr, rows, data, row_data, kept, n_kept, kept_entries, w, r, b, y,
            sample_weight, total, n_lam, weights, positive, l2, fit_intercept, singletons,
            correlation)
        gap = primal - dual
        if gap <= target or outer >= max_outer:
            return b, primal, dual, outer, passes, n_kept
        outer += 1
        if screening:
            radius = gap_safe_radius(n, 1.0, gap / n, primal / n)
            n_kept, kept_entries = _screen(indptr, rows, data, kept, n_kept, w, r,
                                           correlation, dual_scale, radius, sq_norms, n,
                                           lam, weights, positive, l2)
        cols = _working_set(kept, n_kept, w, correlation, n_lam, weights, positive,
                            first_size)
        if cols.shape[0] == 0:          # only the intercept moves: the next refit
            continue
        ws_w = w[cols]
        b, done, _, _ = lasso_working_set_solve(
            indptr, rows, data, cols, ws_w, r, b, y, sample_weight, n_lam, weights[cols],
            positive, l2, sq_norms[cols], np.arange(cols.shape[0] + 1), fit_intercept,
            inner_fraction * gap, max_inner, anderson, check_every, orthant_every,
            orthant_cg, gap)
        passes += done
        w[cols] = ws_w
