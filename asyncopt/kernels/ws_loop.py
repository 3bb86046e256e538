"""The DDSS outer loop of one serial working-set solve of an L1 problem, compiled: what
``ddss.Driver`` runs with ``solvers.working_set.step`` between its certificates, for the
warm-started solves of a path (``solvers.path``), where the Python of a solve (its
set-up, certificates, screening and compactions, about a millisecond) costs more than
the solve's passes.

In the kernels' scaling (docs/design.md §1 times n): on the columns of the full set
(CSC, rows in its order), with the margins z = A w + b and the loss f of ``code``,

    F(w, b) = sum_i c_i f(z_i, y_i) + n lam sum_j v_j (|w_j| + l2 w_j^2 / 2),

every outer iteration

1. certifies (w, b): b refitted (``losses.intercept_newton``; the c-weighted mean of
   the residual for the squared loss), rho = -c f'(z) (``generalized_residual``),
   c_j = A_j^T rho - n lam l2 v_j w_j on the features not yet screened, the dual point
   rho / s with s = max(1, max_j |c_j| / (n lam v_j)) (one-sided with ``positive``),
   and G = F(w, b) - D(rho / s) (``mean_neg_conjugate``, the elastic net's term as
   ``Problem``'s), P = F / n and the gap G / n in P's scale;
2. stops where G <= ``target`` (the caller's tol n P(0));
3. screens: the gap-safe sphere test (``screening.gap_safe_keep``, radius
   ``gap_safe_radius`` with the loss's L_f, the elastic net's column norms
   ``augmented_column_norms``) removes features for the rest of the solve, a removed
   non-zero set to 0;
4. takes the working-set step: W the non-zeros and the zero features of largest
   violation max(|c_j| - n lam v_j, 0) (``solvers.working_set.violation_scores``), up to
   max(``first_size``, 2 nnz) features, solved to ``inner_fraction`` G: for the squared
   loss by ``lasso_working_set_solve`` (coordinate descent with Anderson extrapolation,
   orthant Newton steps), for others by ``prox_newton_working_set``.

This is the Driver's loop for this one case, with the same certificate, test, set and
inner solvers; it leaves out what a path's solves do not need: the best dual point of
earlier certificates, the support Newton step, the Newton directions from the Hessian
(``gram_newton_finish``), the choice of inner step (``auto`` picks the working set on a
warm start whose support is set), checkpoints and the live line.
"""
import numpy as np
from numba import njit

from ..losses import (generalized_residual, intercept_newton, mean_loss,
                      mean_neg_conjugate, weight_total)
from ..penalties import dual_magnitude, weighted_l1_value, weighted_square_sum
from ..screening import augmented_column_norms, gap_safe_keep, gap_safe_radius
from .linalg import csr_rmatvec_rows
from .working_set import (_column_axpy, _column_dot, lasso_working_set_solve,
                          prox_newton_working_set)


@njit(cache=True)
def _refit_intercept(code, quadratic, z, b, y, sample_weight, total):
    """Move b to its optimum for the margins z, z with it (in place), as
    ``problem.intercept_optimum``; returns it."""
    if not total > 0.0:
        return b
    if quadratic:                       # the c-weighted mean of y - (z - b)
        acc = 0.0
        for i in range(z.shape[0]):
            acc += (y[i] - (z[i] - b)) * (1.0 if sample_weight.shape[0] == 0
                                          else sample_weight[i])
        new_b = acc / total
    else:
        new_b = intercept_newton(code, z - b, y, sample_weight, b, total)
    shift = new_b - b
    for i in range(z.shape[0]):
        z[i] += shift
    return new_b


@njit(cache=True)
def _certify(code, quadratic, indptr, rows, data, row_data, kept, n_kept, kept_entries,
             w, z, b, y, sample_weight, total, n_lam, weights, positive, l2,
             fit_intercept, rho, raw, correlation, reuse):
    """Refit b (z moved with it), then rho and c_j (module docstring) into ``rho`` and
    ``correlation`` for the features kept[:n_kept] (``kept_entries`` entries in their
    columns); returns (b, F, D, s, whether ``raw`` holds A^T rho at (w, b) for every
    feature). A^T rho comes from a pass over the rows (``row_data``: the CSR arrays)
    into ``raw`` where the kept columns hold more than a quarter of the entries: a
    column's loop costs about four times a row's per entry (the columns are short), the
    rows are read in full. ``reuse``: ``raw`` already holds A^T rho at (w, b), b
    refitted (the last certificate of the path's previous alpha, at the same point):
    neither the refit nor the pass is repeated."""
    if fit_intercept and not reuse:
        b = _refit_intercept(code, quadratic, z, b, y, sample_weight, total)
    generalized_residual(code, z, y, sample_weight, rho)
    row_indptr, row_indices, row_values = row_data
    by_rows = reuse or 4 * kept_entries > row_indptr[-1]
    if by_rows and not reuse:
        raw[:] = 0.0
        csr_rmatvec_rows(row_indptr, row_indices, row_values, rho, raw, 0, rho.shape[0])
    dual_norm = 0.0
    for t in range(n_kept):
        j = kept[t]
        c = raw[j] if by_rows else _column_dot(indptr, rows, data, j, rho)
        if l2 > 0.0:
            c -= n_lam * l2 * weights[j] * w[j]
        correlation[j] = c
        if weights[j] > 0.0:
            dual_norm = max(dual_norm, dual_magnitude(c, positive) / weights[j])
    dual_scale = max(1.0, dual_norm / n_lam)
    n = z.shape[0]
    penalty = weighted_l1_value(w, weights)
    squares = weighted_square_sum(w, weights) if l2 > 0.0 else 0.0
    primal = n * mean_loss(code, z, y, sample_weight) + \
        n_lam * (penalty + 0.5 * l2 * squares)
    dual = n * mean_neg_conjugate(code, rho / dual_scale, y, sample_weight) - \
        0.5 * n_lam * l2 * squares / (dual_scale * dual_scale)
    return b, primal, dual, dual_scale, by_rows


@njit(cache=True)
def _screen(indptr, rows, data, kept, n_kept, w, z, correlation, dual_scale, radius,
            sq_norms, n, lipschitz, lam, weights, positive, l2):
    """Keep in kept[:n_kept] the features the gap-safe sphere cannot remove (a removed
    non-zero set to 0, z updated); returns (how many are kept, their columns'
    entries)."""
    m = 0
    entries = 0
    for t in range(n_kept):
        j = kept[t]
        norm = augmented_column_norms(np.sqrt(sq_norms[j]), n, lipschitz, lam, l2,
                                      weights[j])
        if gap_safe_keep(dual_magnitude(correlation[j], positive), dual_scale, radius,
                         norm, n, lam, weights[j]):
            kept[m] = j
            m += 1
            entries += indptr[j + 1] - indptr[j]
        elif w[j] != 0.0:
            _column_axpy(indptr, rows, data, j, -w[j], z)
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


@njit(cache=True)
def _inner_solve(code, quadratic, indptr, rows, data, cols, w, z, b, y, sample_weight,
                 n_lam, weights, positive, l2, sq_norms, lipschitz, fit_intercept, tol,
                 gap, anderson, check_every, orthant_every, orthant_cg, max_inner,
                 max_newton_steps, max_cd_passes):
    """The working-set subproblem on ``cols`` from (w[cols], b) at margins z, solved to
    its gap ``tol`` (module docstring, step 4); w and z updated in place; returns (b,
    inner passes or Newton steps)."""
    ws_w = w[cols]
    if quadratic:
        r = y - z                       # the residual the squared loss's solver keeps
        b, done, _, _ = lasso_working_set_solve(
            indptr, rows, data, cols, ws_w, r, b, y, sample_weight, n_lam, weights[cols],
            positive, l2, sq_norms[cols], np.arange(cols.shape[0] + 1), fit_intercept,
            tol, max_inner, anderson, check_every, orthant_every, orthant_cg, gap)
        for i in range(z.shape[0]):
            z[i] = y[i] - r[i]
    else:
        b, done, _, _ = prox_newton_working_set(
            indptr, rows, data, cols, ws_w, z, b, y, sample_weight, code, n_lam,
            weights[cols], positive, l2, sq_norms[cols], lipschitz, fit_intercept, tol,
            max_newton_steps, max_cd_passes)
    w[cols] = ws_w
    return b, done


@njit(cache=True, nogil=True)
def working_set_ddss_solve(code, quadratic, lipschitz, indptr, rows, data, row_data,
                           kept, raw, fresh, y, sample_weight, sq_norms, weights, lam,
                           positive, l2, fit_intercept, w, z, b, target, max_outer,
                           screening, first_size, inner_fraction, anderson, check_every,
                           orthant_every, orthant_cg, max_inner, max_newton_steps,
                           max_cd_passes):
    """Solve the L1 (or elastic-net, ``l2``; ``positive``: w >= 0) problem of the loss
    ``code`` (L_f = ``lipschitz``; ``quadratic``: the Loss's fact, which picks the
    intercept's refit and the inner solver) at ``lam`` from (w, b) with margins
    z = A w + b, on the columns (indptr, rows, data) of every feature and the same
    data's rows (``row_data``: CSR indptr, indices, data; module docstring), until
    G <= ``target`` (F's scale: n times P's) or ``max_outer`` outer iterations;
    ``sq_norms`` = ||C^(1/2) A_j||^2, ``weights`` = v_j; the working-set step's
    constants as ``solvers.working_set``'s. w and z are updated in place, kept[:m]
    holds the m features the test kept (``kept``: p entries, written over); ``raw``
    (p) holds A^T rho at (w, b) for every feature where ``fresh`` (the previous solve
    returned True at this point: its last certificate's) and is written over; returns
    (b, F, D, outer iterations, inner passes or Newton steps, m, whether ``raw`` holds
    A^T rho at the returned point).
    Guarantees: the returned (F, D) are those of the returned (w, b), D that of a
    feasible dual point, so (F - D) / n certifies P(w, b) - P*."""
    n = y.shape[0]
    p = w.shape[0]
    n_lam = n * lam
    total = weight_total(sample_weight, n)
    for j in range(p):
        kept[j] = j
    n_kept = p
    kept_entries = indptr[p]
    correlation = np.zeros(p)
    rho = np.empty(n)
    outer = 0
    steps = 0
    while True:
        b, primal, dual, dual_scale, covers = _certify(
            code, quadratic, indptr, rows, data, row_data, kept, n_kept, kept_entries, w,
            z, b, y, sample_weight, total, n_lam, weights, positive, l2, fit_intercept,
            rho, raw,
            correlation, fresh and outer == 0)
        gap = primal - dual
        if gap <= target or outer >= max_outer:
            return b, primal, dual, outer, steps, n_kept, covers
        outer += 1
        if screening:
            radius = gap_safe_radius(n, lipschitz, gap / n, primal / n)
            n_kept, kept_entries = _screen(indptr, rows, data, kept, n_kept, w, z,
                                           correlation, dual_scale, radius, sq_norms, n,
                                           lipschitz, lam, weights, positive, l2)
        cols = _working_set(kept, n_kept, w, correlation, n_lam, weights, positive,
                            first_size)
        if cols.shape[0] == 0:          # only the intercept moves: the next refit
            continue
        b, done = _inner_solve(code, quadratic, indptr, rows, data, cols, w, z, b, y,
                               sample_weight, n_lam, weights, positive, l2, sq_norms,
                               lipschitz, fit_intercept, inner_fraction * gap, gap,
                               anderson, check_every, orthant_every, orthant_cg,
                               max_inner, max_newton_steps, max_cd_passes)
        steps += done
