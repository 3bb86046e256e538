"""Coordinate descent on a working set of columns: the inner solvers of the working-set
method (``solvers.working_set``): for the squared loss, exact coordinate descent with
Anderson extrapolation (below) and, for L1, projected Newton steps on the orthant of the
non-zeros (``lasso_orthant_newton``); for other losses, proximal Newton steps
(``prox_newton_working_set``).

The subproblem is the Lasso (or group Lasso) restricted to the columns ``cols`` of a
CSC matrix (rows in the ActiveSet's order), in the scaling of docs/design.md §1
multiplied by n:

    F(w, b) = 1/2 ||r||_C^2 + n lam sum_g v_g ||w_g||_2,     r = y - A_ws w - b,

||r||_C^2 = sum_i c_i r_i^2 with the sample weights c_i (``sample_weight`` in the kernel
form, ``losses.row_weight``: all 1 where it is empty). Its Fenchel dual, with u = C r
scaled into the constraints ||A_g^T u|| <= n lam v_g (and c^T r = 0 with an intercept,
which a c-weighted centred r satisfies), is D(u) = 1/2 ||y||_C^2 - 1/2 ||y - C^-1 u||_C^2
(the rows with c_i = 0 drop out).

One epoch updates every block once in order (for one column, exact minimisation along
it, w_q <- ST(w_q + A_q^T C r / L_q, n lam v_q / L_q), L_q = ||A_q||_C^2 =
sum_i c_i a_iq^2) and then the intercept (b <- b + c^T r / sum c).

``positive`` (the L1 penalty with x >= 0, ``penalties.L1``): every ST is the one-sided
prox max(u - t, 0) (``penalties.prox_l1``), the dual constraints A_q^T u <= n lam v_q
(``penalties.dual_magnitude``), and the objectives +inf at a w with a negative entry, so
that an extrapolated point outside the constraint is never kept.

``l2`` (the elastic net, ``penalties.L1``; 0 for the group penalty): the penalty is
n lam sum_q v_q (|w_q| + l2 w_q^2 / 2), every prox ``penalties.prox_elastic_net`` (for one
column w_q <- ST(||A_q||_C^2 w_q + A_q^T C r, n lam v_q) / (||A_q||_C^2 + n lam l2 v_q)),
the dual constraints bound c_q = A_q^T u - n lam l2 v_q w_q, and D subtracts
n lam l2 sum_q v_q w_q^2 / (2 s^2) for the dual point u = C r / s (docs/design.md §1, the
L2 term as rows of the data, of weight 1). With l2 = 0 every value is the L1 one, bit
for bit.

Every ``anderson`` epochs the last iterates are extrapolated
(Anderson acceleration, as skglm's ``AndersonCD``; Bertrand and Massias, AISTATS 2021)
and the extrapolated point is kept only where it lowers F, so that no epoch and no
extrapolation raises the objective.
"""
import numpy as np
from numba import njit

from ..losses import (loss_conjugate, loss_derivative, loss_second_derivative, loss_value,
                      row_weight, weight_total)
from ..penalties import dual_magnitude, prox_elastic_net, weighted_square_sum


@njit(cache=True, inline="always")
def _column_dot(indptr, rows, data, c, r):
    acc = 0.0
    for k in range(indptr[c], indptr[c + 1]):
        acc += data[k] * r[rows[k]]
    return acc


@njit(cache=True, inline="always")
def _column_axpy(indptr, rows, data, c, alpha, out):
    """out += alpha A_c over column c's entries."""
    for k in range(indptr[c], indptr[c + 1]):
        out[rows[k]] += alpha * data[k]


@njit(cache=True, inline="always")
def _weighted_column_dot(indptr, rows, data, c, r, sample_weight):
    """A_c^T C r = sum_k a_kc c_k r_k over column c's entries (A_c^T r where
    ``sample_weight`` is empty: the unweighted loop, no weight read)."""
    if sample_weight.shape[0] == 0:
        return _column_dot(indptr, rows, data, c, r)
    acc = 0.0
    for k in range(indptr[c], indptr[c + 1]):
        acc += data[k] * sample_weight[rows[k]] * r[rows[k]]
    return acc


@njit(cache=True)
def _weighted_sq(r, sample_weight):
    """||r||_C^2 = sum_i c_i r_i^2 (||r||^2 where ``sample_weight`` is empty)."""
    if sample_weight.shape[0] == 0:
        return np.dot(r, r)
    acc = 0.0
    for i in range(r.shape[0]):
        acc += sample_weight[i] * r[i] * r[i]
    return acc


@njit(cache=True, inline="always")
def _assign(dst, src):
    """dst[:] = src in a loop (numba's slice assignment compiles its broadcasting
    errors' formatting: seconds of a first run)."""
    for i in range(dst.shape[0]):
        dst[i] = src[i]


@njit(cache=True)
def lasso_objective(w, r, sample_weight, n_lam, weights, positive, l2, blocks):
    """F(w, b) = 1/2 ||r||_C^2 + n lam sum_g v_g ||w_g||_2 at the residual r of (w, b);
    block g holds w[blocks[g]:blocks[g+1]] (singletons: the L1 norm, plus
    l2 sum_q v_q w_q^2 / 2 for the elastic net; with ``positive``, +inf where some
    w_q < 0)."""
    penalty = 0.0
    if blocks.shape[0] - 1 == w.shape[0]:        # singletons
        for q in range(w.shape[0]):
            if positive and w[q] < 0.0:
                return np.inf
            penalty += weights[q] * abs(w[q])
        if l2 > 0.0:
            penalty += 0.5 * l2 * weighted_square_sum(w, weights)
    else:
        for g in range(blocks.shape[0] - 1):
            sq = 0.0
            for q in range(blocks[g], blocks[g + 1]):
                sq += w[q] * w[q]
            penalty += weights[g] * np.sqrt(sq)
    return 0.5 * _weighted_sq(r, sample_weight) + n_lam * penalty


@njit(cache=True)
def lasso_dual_gap(indptr, rows, data, cols, w, r, y, sample_weight, n_lam, weights,
                   positive, l2, blocks):
    """F(w, b) - D(u) with u = C r min(1, n lam / max_g ||A_g^T C r||_2 / v_g) (singletons
    with ``positive``: max(A_q^T C r, 0) for ||A_q^T C r||; with ``l2``, of c_q =
    A_q^T C r - n lam l2 v_q w_q, and D less n lam l2 sum_q v_q w_q^2 / (2 s^2)): a
    certificate of the working-set subproblem (its dual point is feasible there)."""
    dual_norm = 0.0
    for g in range(blocks.shape[0] - 1):
        if weights[g] > 0.0:
            start, stop = blocks[g], blocks[g + 1]
            if stop - start == 1:
                dot = _weighted_column_dot(indptr, rows, data, cols[start], r,
                                           sample_weight)
                if l2 > 0.0:
                    dot -= n_lam * l2 * weights[g] * w[start]
                norm = dual_magnitude(dot, positive)
            else:
                sq = 0.0
                for q in range(start, stop):
                    dot = _weighted_column_dot(indptr, rows, data, cols[q], r,
                                               sample_weight)
                    sq += dot * dot
                norm = np.sqrt(sq)
            dual_norm = max(dual_norm, norm / weights[g])
    scale = 1.0 if dual_norm <= n_lam else n_lam / dual_norm
    dual = 0.0
    for i in range(r.shape[0]):
        d = y[i] - scale * r[i]
        dual += row_weight(sample_weight, i) * (y[i] * y[i] - d * d)
    if l2 > 0.0 and blocks.shape[0] - 1 == w.shape[0]:
        dual -= n_lam * l2 * weighted_square_sum(w, weights) * scale * scale
    return lasso_objective(w, r, sample_weight, n_lam, weights, positive, l2, blocks) - \
        0.5 * dual


@njit(cache=True)
def _lasso_epoch(indptr, rows, data, cols, w, r, sample_weight, total, n_lam, weights,
                 positive, l2, lipschitz, blocks, fit_intercept, scratch):
    """One pass over the blocks, then the intercept; returns the intercept's move. A
    block of one column is minimised exactly along it (lipschitz = ||A_q||_C^2; over
    w_q >= 0 with ``positive``; with its L2 term, ``prox_elastic_net``); a larger
    block takes the block prox-gradient step w_g <- BST(w_g + A_g^T C r / L_g,
    n lam v_g / L_g) with L_g = ||C^(1/2) A_g||_F^2 >= ||C^(1/2) A_g||_2^2, which
    minimises a majorizer of F tight at w, so no update raises F. The intercept moves to
    its optimum, by c^T r / ``total`` (total = sum c)."""
    for g in range(blocks.shape[0] - 1):
        start, stop = blocks[g], blocks[g + 1]
        if lipschitz[g] <= 0.0:
            continue
        threshold = n_lam * weights[g] / lipschitz[g]
        if stop - start == 1:
            c = cols[start]
            old = w[start]
            new = prox_elastic_net(old + _weighted_column_dot(indptr, rows, data, c, r,
                                                              sample_weight) / lipschitz[g],
                                   threshold, positive, l2)
            if new != old:
                delta = new - old
                w[start] = new
                _column_axpy(indptr, rows, data, c, -delta, r)
            continue
        sq = 0.0
        for q in range(start, stop):
            scratch[q - start] = w[q] + _weighted_column_dot(
                indptr, rows, data, cols[q], r, sample_weight) / lipschitz[g]
            sq += scratch[q - start] * scratch[q - start]
        norm = np.sqrt(sq)
        scale = 0.0 if norm <= threshold else 1.0 - threshold / norm
        for q in range(start, stop):
            delta = scale * scratch[q - start] - w[q]
            if delta != 0.0:
                w[q] += delta
                _column_axpy(indptr, rows, data, cols[q], -delta, r)
    shift = 0.0
    if fit_intercept and total > 0.0:
        if sample_weight.shape[0] == 0:
            shift = np.sum(r) / r.shape[0]
        else:
            shift = np.dot(sample_weight, r) / total
        r -= shift
    return shift


@njit(cache=True)
def _anderson_buffers(anderson, m, n):
    """Anderson's ring of ``anderson`` + 1 iterates (w of m, a vector of n that is affine
    in w and b, and b) and a trial point's w and vector."""
    keep = anderson + 1 if anderson > 0 else 1
    return (np.empty((keep, m)), np.empty((keep, n)), np.empty(keep), np.empty(m),
            np.empty(n))


@njit(cache=True, inline="always")
def _record_iterate(past_w, past_v, past_b, stored, w, v, b):
    """Store the iterate (w, v, b) at slot ``stored`` of Anderson's ring; returns (the
    next slot, whether the ring is full: then the next slot is 0 again). Loops, not
    slice assignments: numba's broadcasting compiles its error messages (a first run's
    seconds)."""
    for q in range(w.shape[0]):
        past_w[stored, q] = w[q]
    for i in range(v.shape[0]):
        past_v[stored, i] = v[i]
    past_b[stored] = b
    stored += 1
    if stored == past_w.shape[0]:
        return 0, True
    return stored, False


@njit(cache=True)
def _solve_spd(gram, x):
    """Overwrite x with the solution of gram u = x for a small symmetric positive
    definite ``gram`` (Cholesky, in loops: numba's np.linalg.solve compiles LAPACK's
    bindings, seconds of a first run); returns False, x as it was, where a pivot is not
    positive (singular)."""
    k = gram.shape[0]
    low = np.zeros((k, k))
    for i in range(k):
        for j in range(i + 1):
            acc = gram[i, j]
            for t in range(j):
                acc -= low[i, t] * low[j, t]
            if i == j:
                if not acc > 0.0:
                    return False
                low[i, i] = np.sqrt(acc)
            else:
                low[i, j] = acc / low[j, j]
    for i in range(k):                      # L v = x
        for t in range(i):
            x[i] -= low[i, t] * x[t]
        x[i] /= low[i, i]
    for i in range(k - 1, -1, -1):          # L^T u = v
        for t in range(i + 1, k):
            x[i] -= low[t, i] * x[t]
        x[i] /= low[i, i]
    return True


@njit(cache=True)
def _extrapolate(past_w, past_r, past_b, out_w, out_r):
    """Anderson's combination c (sum 1) of the K + 1 stored iterates minimising the norm
    of the combined successive differences; writes it to out_w, out_r and returns its
    intercept, or NaN where the differences' Gram matrix is singular."""
    k_plus = past_w.shape[0]
    k = k_plus - 1
    m = past_w.shape[1]
    diffs = np.empty((k, m + 1))
    for t in range(k):
        for q in range(m):
            diffs[t, q] = past_w[t + 1, q] - past_w[t, q]
        diffs[t, m] = past_b[t + 1] - past_b[t]
    gram = np.empty((k, k))
    trace = 0.0
    for t in range(k):
        for u in range(t + 1):
            acc = 0.0
            for q in range(m + 1):
                acc += diffs[t, q] * diffs[u, q]
            gram[t, u] = acc
            gram[u, t] = acc
        trace += gram[t, t]
    ridge = 1e-10 * max(trace, 1e-300)
    for t in range(k):
        gram[t, t] += ridge
    c = np.ones(k)
    if not _solve_spd(gram, c):
        return np.nan
    total = np.sum(c)
    if not np.isfinite(total) or total == 0.0:
        return np.nan
    b = 0.0
    for q in range(out_w.shape[0]):
        out_w[q] = 0.0
    for i in range(out_r.shape[0]):
        out_r[i] = 0.0
    for t in range(k):
        ct = c[t] / total
        for q in range(out_w.shape[0]):
            out_w[q] += ct * past_w[t + 1, q]
        for i in range(out_r.shape[0]):
            out_r[i] += ct * past_r[t + 1, i]
        b += ct * past_b[t + 1]
    return b


@njit(cache=True, nogil=True)
def lasso_working_set_cd(indptr, rows, data, cols, w, r, b, y, sample_weight, n_lam,
                         weights, positive, l2, lipschitz, blocks, fit_intercept, tol,
                         max_epochs, anderson, check_every):
    """Epochs of coordinate descent on the working set ``cols`` from (w, b) with residual
    r = y - A_ws w - b (the working set holds every non-zero; ``sample_weight``: the rows'
    c_i in the kernel form, ``losses.row_weight``), w and r updated in place,
    until the subproblem's gap (``lasso_dual_gap``) is at most ``tol`` (checked every
    ``check_every`` epochs) or ``max_epochs`` passed. ``anderson``: iterates per
    extrapolation (0: none); ``blocks``: block g holds positions blocks[g]:blocks[g+1]
    of cols and w (singletons for L1), weights[g] = v_g, lipschitz[g] =
    ||C^(1/2) A_g||_F^2 (``_lasso_epoch``); ``positive``: L1 with w >= 0, ``l2``: the
    elastic net's L2 strength over lam (module docstring). Returns (b, epochs, gap,
    extrapolations kept)."""
    m = cols.shape[0]
    n = r.shape[0]
    largest = 1
    for g in range(blocks.shape[0] - 1):
        largest = max(largest, blocks[g + 1] - blocks[g])
    scratch = np.empty(largest)
    past_w, past_r, past_b, try_w, try_r = _anderson_buffers(anderson, m, n)
    total = weight_total(sample_weight, n)
    stored = 0
    accepted = 0
    gap = np.inf
    epoch = 0
    while epoch < max_epochs:
        b += _lasso_epoch(indptr, rows, data, cols, w, r, sample_weight, total, n_lam,
                          weights, positive, l2, lipschitz, blocks, fit_intercept,
                          scratch)
        epoch += 1
        if anderson > 0:
            stored, full = _record_iterate(past_w, past_r, past_b, stored, w, r, b)
            if full:
                try_b = _extrapolate(past_w, past_r, past_b, try_w, try_r)
                if np.isfinite(try_b) and \
                        lasso_objective(try_w, try_r, sample_weight, n_lam, weights,
                                        positive, l2, blocks) < \
                        lasso_objective(w, r, sample_weight, n_lam, weights, positive,
                                        l2, blocks):
                    _assign(w, try_w)
                    _assign(r, try_r)
                    b = try_b
                    accepted += 1
        if epoch % check_every == 0 or epoch == max_epochs:
            gap = lasso_dual_gap(indptr, rows, data, cols, w, r, y, sample_weight, n_lam,
                                 weights, positive, l2, blocks)
            if gap <= tol:
                break
    return b, epoch, gap, accepted


@njit(cache=True)
def _columns_times(indptr, rows, data, cols, free, values, shift, out):
    """out = A_F values + shift (F = cols[free], ``shift`` added to every row)."""
    out[:] = shift
    for j in range(free.shape[0]):
        _column_axpy(indptr, rows, data, cols[free[j]], values[j], out)


@njit(cache=True)
def _hessian_times(indptr, rows, data, cols, free, p, sample_weight, n_lam, weights, l2,
                   fit_intercept, u, out):
    """out = H p for H = [A_F, 1]^T C [A_F, 1] + n lam l2 diag(v_F, 0) (the Hessian of F
    on the orthant of the free coordinates F = ``free``; the intercept's row last where
    fitted); ``u`` (n) is scratch."""
    k = free.shape[0]
    _columns_times(indptr, rows, data, cols, free, p, p[k] if fit_intercept else 0.0, u)
    if sample_weight.shape[0] != 0:
        u *= sample_weight
    for j in range(k):
        q = free[j]
        out[j] = _column_dot(indptr, rows, data, cols[q], u) + n_lam * l2 * weights[q] * p[j]
    if fit_intercept:
        out[k] = np.sum(u)


@njit(cache=True, nogil=True)
def lasso_orthant_newton(indptr, rows, data, cols, w, r, b, sample_weight, n_lam, weights,
                         positive, l2, sq_norms, fit_intercept, max_iterations):
    """One projected Newton step on the L1 subproblem F (module docstring; singleton
    blocks) over the orthant of w's non-zeros S, from (w, b). On that orthant F is
    smooth, 1/2 ||r||_C^2 + n lam sum_{q in S} v_q (s_q w_q + l2 w_q^2 / 2) with
    s = sign(w); its Newton direction d solves H d = -g (g its gradient in (w_S, b), H =
    [A_S, 1]^T C [A_S, 1] + n lam l2 diag(v_S, 0), ``_hessian_times``), here by at most
    ``max_iterations`` iterations of conjugate gradients preconditioned by diag(H), each
    about one pass over S's columns (``sq_norms[q]`` = ||A_q||_C^2, the CD kernel's
    ``lipschitz``, for the diagonal). The step is w(t) = the projection of w + t d onto
    the orthant (a coordinate that would cross zero stops at zero), b + t d_b, for the
    first t of 1, 1/2, ..., 1/2^9 with F(w(t), b + t d_b) < F(w, b); none where none
    lowers F. w and r = y - A w - b are updated in place; returns (b, CG iterations).
    Guarantees: F never rises; a zero of w stays zero; with ``positive`` w stays >= 0.
    Why: where the columns of S are nearly collinear or S has about as many columns as
    rows, coordinate descent's residual (the subproblem's dual point) converges slowly,
    and CG needs about the square root of its passes (Nocedal and Wright, Numerical
    Optimization, ch. 5; the orthant step is their projected search, ch. 16.7)."""
    n = r.shape[0]
    intercept = 1 if fit_intercept else 0
    iterations = 0
    u = np.empty(n)
    free = np.flatnonzero(w)
    k = free.shape[0]
    dim = k + intercept
    if dim == 0:
        return b, 0
    gradient = np.empty(dim)
    diagonal = np.empty(dim)
    for j in range(k):
        q = free[j]
        gradient[j] = -_weighted_column_dot(indptr, rows, data, cols[q], r,
                                            sample_weight) + \
            n_lam * weights[q] * (np.sign(w[q]) + l2 * w[q])
        diagonal[j] = sq_norms[q] + n_lam * l2 * weights[q]
    if fit_intercept:
        gradient[k] = -(np.sum(r) if sample_weight.shape[0] == 0
                        else np.dot(sample_weight, r))
        diagonal[k] = weight_total(sample_weight, n)
    for j in range(dim):
        if diagonal[j] <= 0.0:
            diagonal[j] = 1.0
    # conjugate gradients on H d = -gradient from d = 0
    d = np.zeros(dim)
    residual = -gradient
    z = residual / diagonal
    p = z.copy()
    rz = np.dot(residual, z)
    hp = np.empty(dim)
    stop = 1e-20 * np.dot(gradient, gradient)
    for _ in range(max_iterations):
        _hessian_times(indptr, rows, data, cols, free, p, sample_weight, n_lam,
                       weights, l2, fit_intercept, u, hp)
        iterations += 1
        curvature = np.dot(p, hp)
        if curvature <= 0.0:
            break
        step = rz / curvature
        d += step * p
        residual -= step * hp
        if np.dot(residual, residual) <= stop:
            break
        z = residual / diagonal
        rz_next = np.dot(residual, z)
        p = z + (rz_next / rz) * p
        rz = rz_next
    # the projected search: A_F d once, the crossing coordinates corrected per t
    ad = np.empty(n)
    _columns_times(indptr, rows, data, cols, free, d, d[k] if fit_intercept else 0.0, ad)
    singletons = np.arange(w.shape[0] + 1)
    before = lasso_objective(w, r, sample_weight, n_lam, weights, positive, l2, singletons)
    t = 1.0
    for _ in range(10):
        trial_r = r - t * ad
        trial_w = w.copy()
        for j in range(k):
            q = free[j]
            moved = w[q] + t * d[j]
            if moved * w[q] <= 0.0:          # crosses zero: stops there
                # undo the part of t d_j past zero
                _column_axpy(indptr, rows, data, cols[q], t * d[j] + w[q], trial_r)
                moved = 0.0
            trial_w[q] = moved
        if lasso_objective(trial_w, trial_r, sample_weight, n_lam, weights, positive, l2,
                           singletons) < before:
            w[:] = trial_w
            r[:] = trial_r
            if fit_intercept:
                b += t * d[k]
            break
        t *= 0.5
    return b, iterations


@njit(cache=True, nogil=True)
def lasso_working_set_solve(indptr, rows, data, cols, w, r, b, y, sample_weight, n_lam,
                            weights, positive, l2, lipschitz, blocks, fit_intercept, tol,
                            max_epochs, anderson, check_every, orthant_every, orthant_cg,
                            start_gap):
    """The squared loss's working-set subproblem (``lasso_working_set_cd``'s arguments)
    solved from (w, b) until its gap is at most ``tol`` or ``max_epochs`` passes: for L1
    (singleton ``blocks``), passes of ``lasso_working_set_cd`` ``orthant_every`` at a
    time, each run of them that has not solved it and, at its rate (the gap's ratio over
    it, from ``start_gap`` before the first), would not by the next, followed by one
    orthant Newton step (``lasso_orthant_newton``, ``orthant_cg`` CG iterations at most);
    for a group penalty, the passes alone. w and r updated in place; returns (b, passes,
    gap, CG iterations)."""
    singletons = blocks.shape[0] - 1 == w.shape[0]
    epochs, gap, newton, previous = 0, np.inf, 0, start_gap
    while True:
        cap = min(orthant_every, max_epochs - epochs) if singletons else max_epochs
        b, done, gap, _ = lasso_working_set_cd(
            indptr, rows, data, cols, w, r, b, y, sample_weight, n_lam, weights, positive,
            l2, lipschitz, blocks, fit_intercept, tol, cap, anderson, check_every)
        epochs += done
        if gap <= tol or epochs >= max_epochs or not singletons:
            break
        if gap * gap > tol * previous:
            b, its = lasso_orthant_newton(indptr, rows, data, cols, w, r, b, sample_weight,
                                          n_lam, weights, positive, l2, lipschitz,
                                          fit_intercept, orthant_cg)
            newton += its
        previous = gap
    return b, epochs, gap, newton


@njit(cache=True)
def working_set_gap(indptr, rows, data, cols, w, z, y, sample_weight, code, n_lam,
                    weights, positive, l2):
    """n (P - D) of the working-set subproblem at margins z = A_ws w + b: P from the
    weighted loss, D at the dual point rho = -c f'(z) scaled into the constraints
    (docs/design.md §1; one-sided with ``positive``; with ``l2``, the elastic net's
    correlation A_q^T rho - n lam l2 v_q w_q and L2 terms). With an intercept the dual
    point is feasible only where b is optimal; the value then serves as the inner
    stopping rule, the outer certificate being exact."""
    n = z.shape[0]
    rho = np.empty(n)
    loss = 0.0
    for i in range(n):
        c = row_weight(sample_weight, i)
        rho[i] = -c * loss_derivative(code, z[i], y[i])
        loss += c * loss_value(code, z[i], y[i])
    dual_norm = 0.0
    penalty = 0.0
    for q in range(cols.shape[0]):
        penalty += weights[q] * abs(w[q])
        if weights[q] > 0.0:
            dot = _column_dot(indptr, rows, data, cols[q], rho)
            if l2 > 0.0:
                dot -= n_lam * l2 * weights[q] * w[q]
            dual_norm = max(dual_norm, dual_magnitude(dot, positive) / weights[q])
    scale = max(1.0, dual_norm / n_lam)
    conjugate = 0.0
    for i in range(n):
        c = row_weight(sample_weight, i)
        if c > 0.0:
            conjugate += c * loss_conjugate(code, -rho[i] / (scale * c), y[i])
    if l2 > 0.0:
        sq = weighted_square_sum(w, weights)
        conjugate += 0.5 * n_lam * l2 * sq / (scale * scale)
        penalty += 0.5 * l2 * sq
    return loss + n_lam * penalty + conjugate


@njit(cache=True)
def _objective_along(z, xdelta, t, y, sample_weight, code, w, delta, n_lam, weights,
                     l2):
    """n P at (w + t delta, margins z + t xdelta) (with the L2 part for ``l2`` > 0)."""
    total = 0.0
    for i in range(z.shape[0]):
        total += row_weight(sample_weight, i) * loss_value(code, z[i] + t * xdelta[i],
                                                           y[i])
    penalty = 0.0
    for q in range(w.shape[0]):
        penalty += weights[q] * abs(w[q] + t * delta[q])
    if l2 > 0.0:
        sq = 0.0
        for q in range(w.shape[0]):
            moved = w[q] + t * delta[q]
            sq += weights[q] * moved * moved
        penalty += 0.5 * l2 * sq
    return total + n_lam * penalty


TRUST_MARGIN = 4.0         # the trust region's first radius, in margin units
DIRECTION_FORCING = 0.3    # skglm's EPS_TOL: the direction's passes' accuracy, relative
FLAT = 1e-300              # the least curvature a coordinate's model has


@njit(cache=True)
def _newton_direction(indptr, rows, data, cols, w, grad, hess, n_lam, weights, positive,
                      l2, fit_intercept, max_passes, margin, delta, xdelta):
    """Coordinate descent on the quadratic model of n P at w, in (delta, and the
    intercept's move db, returned; xdelta = A_ws delta + db):
        sum_i grad_i (A delta + db)_i + 1/2 sum_i hess_i (A delta + db)_i^2
        + n lam |w + delta|_v      (over w + delta >= 0 with ``positive``)
        (+ n lam l2 ||w + delta||_v^2 / 2, exact in the model, with ``l2``),
    over the trust region |delta_q| max_i |a_iq| <= ``margin`` (and |db| <= ``margin``):
    no coordinate moves a margin by more than ``margin``, over which the logistic
    loss's f'' changes by a factor e^margin at most (|f'''| <= f''), so that a
    coordinate whose rows the model sees as flat (f'' ~ 0 on separated rows, where the
    model's step is huge or, at f'' = 0, undefined) moves a bounded way and the line
    search keeps the step for the others. At most ``max_passes`` passes, stopping once
    a pass over every coordinate moves none by more than DIRECTION_FORCING times the
    first pass's largest move (in the model's metric): an inexact Newton direction,
    which the next directions complete. A coordinate a pass leaves at zero is skipped
    by the passes after it until they converge, then a pass over all follows
    (liblinear's shrinking). The passes keep u = A_ws delta apart from db, with
    h_q = sum_i hess_i a_iq and sum_i hess_i u_i, so the intercept's update costs O(1)
    and the columns' O(their entries). Returns (db, the entries and rows the passes
    read)."""
    m = cols.shape[0]
    n = xdelta.shape[0]
    delta[:] = 0.0
    xdelta[:] = 0.0                 # u = A_ws delta until the end
    lipschitz = np.empty(m)
    gradient = np.empty(m)
    hess_col = np.empty(m)
    radius = np.empty(m)
    for q in range(m):
        c = cols[q]
        acc, g, h, top = 0.0, 0.0, 0.0, 0.0
        for k in range(indptr[c], indptr[c + 1]):
            hk = hess[rows[k]] * data[k]
            acc += hk * data[k]
            h += hk
            g += grad[rows[k]] * data[k]
            top = max(top, abs(data[k]))
        # a curvature that underflowed to 0 still steps (to the region's edge)
        lipschitz[q], gradient[q], hess_col[q] = max(acc, FLAT), g, h
        radius[q] = margin / top if top > 0.0 else np.inf
    grad_b, hess_b = np.sum(grad), np.sum(hess)
    intercept = fit_intercept and hess_b > 0.0
    db = 0.0
    hess_u = 0.0                    # sum_i hess_i u_i
    first = 0.0
    live = np.ones(m, dtype=np.bool_)
    reads = 2 * n
    for sweep in range(max_passes):
        largest = 0.0
        every = True
        for q in range(m):
            if not live[q]:
                every = False
                continue
            c = cols[q]
            reads += indptr[c + 1] - indptr[c]
            model = gradient[q] + db * hess_col[q]
            for k in range(indptr[c], indptr[c + 1]):
                model += data[k] * hess[rows[k]] * xdelta[rows[k]]
            old = w[q] + delta[q]
            new = prox_elastic_net(old - model / lipschitz[q],
                                   n_lam * weights[q] / lipschitz[q], positive, l2)
            new = min(max(new, w[q] - radius[q]), w[q] + radius[q])
            step = new - old
            if step != 0.0:
                delta[q] = new - w[q]       # at new = 0, w + t delta = (1 - t) w >= 0
                hess_u += step * hess_col[q]
                reads += indptr[c + 1] - indptr[c]
                _column_axpy(indptr, rows, data, c, step, xdelta)
                largest = max(largest, abs(step) * np.sqrt(lipschitz[q]))
            elif new == 0.0:
                live[q] = False
        if intercept:
            step = min(max(-(grad_b + hess_u + db * hess_b) / hess_b, -margin - db),
                       margin - db)
            db += step
            largest = max(largest, abs(step) * np.sqrt(hess_b))
        if sweep == 0:
            first = largest
        if largest <= DIRECTION_FORCING * first:
            if every:
                break
            live[:] = True
    if db != 0.0:
        xdelta += db
    return db, reads


@njit(cache=True)
def _majorized_pass(indptr, rows, data, cols, w, z, b, y, sample_weight, code, n_lam,
                    weights, positive, l2, sq_norms, curvature, fit_intercept):
    """One pass of coordinate descent on the majorizer f'' <= ``curvature`` (the loss's
    Lipschitz constant): w_q <- ST(w_q - A_q^T C f'(z) / L_q, n lam v_q / L_q) (the
    one-sided prox with ``positive``, ``prox_elastic_net`` with ``l2``) with
    L_q = curvature ||A_q||_C^2 (``sq_norms``, sum_i c_i a_iq^2), then the intercept
    (curvature sum c); each update minimises an upper bound of n P that is tight at the
    current point, so none raises n P. Returns (b, whether anything moved)."""
    moved = False
    for q in range(cols.shape[0]):
        lipschitz = curvature * sq_norms[q]
        if lipschitz <= 0.0:
            continue
        c = cols[q]
        g = 0.0
        for k in range(indptr[c], indptr[c + 1]):
            g += data[k] * row_weight(sample_weight, rows[k]) * \
                loss_derivative(code, z[rows[k]], y[rows[k]])
        new = prox_elastic_net(w[q] - g / lipschitz, n_lam * weights[q] / lipschitz,
                               positive, l2)
        if new != w[q]:
            step = new - w[q]
            w[q] = new
            moved = True
            _column_axpy(indptr, rows, data, c, step, z)
    total = weight_total(sample_weight, z.shape[0])
    if fit_intercept and total > 0.0:
        g = 0.0
        for i in range(z.shape[0]):
            g += row_weight(sample_weight, i) * loss_derivative(code, z[i], y[i])
        step = -g / (curvature * total)
        if step != 0.0:
            b += step
            z += step
            moved = True
    return b, moved


@njit(cache=True, nogil=True)
def prox_newton_working_set(indptr, rows, data, cols, w, z, b, y, sample_weight, code,
                            n_lam, weights, positive, l2, sq_norms, curvature,
                            fit_intercept, tol, max_steps, max_passes):
    """Proximal Newton steps on the working set ``cols`` from (w, b) at margins
    z = A_ws w + b (the working set holds every non-zero), w and z updated in place, on
    n P = sum_i c_i f(z_i) + n lam |w|_v (``sample_weight``: the c_i in the kernel form):
    the direction minimises the loss's second-order model plus the penalty by
    coordinate descent (``_newton_direction``, over a trust region of radius
    TRUST_MARGIN in the margins, doubled after each full step t = 1 and set back after
    a shorter one, as a trust-region method's), then a backtracking line search halves
    the step until n P falls (so no step raises it), and where no step does, one pass
    of ``_majorized_pass`` (sq_norms[q] = ||A_q||_C^2, ``curvature`` >= f''); until the
    subproblem's gap (``working_set_gap``) is at most ``tol`` or ``max_steps`` steps.
    skglm's ``ProxNewton`` and liblinear's newGLMNET are this method. ``positive``:
    w >= 0 throughout (each direction keeps w + delta >= 0, so every step between w and
    w + delta does); ``l2``: the elastic net's L2 part, in every prox, objective and
    gap (module docstring). Returns (b, steps, gap, reads): reads counts the entries of
    the columns and the rows each pass read (the work ``solvers.choice`` charges)."""
    n = z.shape[0]
    m = cols.shape[0]
    nnz = 0
    for q in range(m):
        nnz += indptr[cols[q] + 1] - indptr[cols[q]]
    grad, hess = np.empty(n), np.empty(n)
    delta, xdelta = np.empty(m), np.empty(n)
    gap = np.inf
    steps = 0
    reads = 0
    margin = TRUST_MARGIN
    while steps < max_steps:
        gap = working_set_gap(indptr, rows, data, cols, w, z, y, sample_weight, code,
                              n_lam, weights, positive, l2)
        reads += nnz + 3 * n
        if gap <= tol:
            break
        for i in range(n):
            c = row_weight(sample_weight, i)
            grad[i] = c * loss_derivative(code, z[i], y[i])
            hess[i] = c * loss_second_derivative(code, z[i], y[i])
        db, passes_read = _newton_direction(indptr, rows, data, cols, w, grad, hess,
                                            n_lam, weights, positive, l2, fit_intercept,
                                            max_passes, margin, delta, xdelta)
        reads += 2 * n + nnz + passes_read
        before = _objective_along(z, xdelta, 0.0, y, sample_weight, code, w, delta, n_lam,
                                  weights, l2)
        t = 1.0
        moved = False
        for _ in range(30):
            reads += n
            if _objective_along(z, xdelta, t, y, sample_weight, code, w, delta, n_lam,
                                weights, l2) < before:
                moved = True
                break
            t *= 0.5
        steps += 1
        margin = 2.0 * margin if t == 1.0 else TRUST_MARGIN
        if not moved:       # the model misleads (f'' ~ 0 on separated rows): majorize
            reads += 2 * nnz + n
            b, moved = _majorized_pass(indptr, rows, data, cols, w, z, b, y,
                                       sample_weight, code, n_lam, weights, positive,
                                       l2, sq_norms, curvature, fit_intercept)
            if not moved:
                break
            continue
        for q in range(m):
            w[q] += t * delta[q]
        for i in range(n):
            z[i] += t * xdelta[i]
        b += t * db
    return b, steps, gap, reads


@njit(cache=True)
def _gram_objective(w, start, db, g, corr, sq_residual, n_lam, weights, positive, l2,
                    fit_intercept):
    """F at (w, b + db) from the Gram sums (``gram_lasso_cd``): d = (w - start, db),
    ||r'||^2 = ||r||^2 - d^T corr - d^T g; +inf where ``positive`` and some w_q < 0;
    the L2 part n lam l2 sum_q v_q w_q^2 / 2 with ``l2``."""
    m = w.shape[0]
    sq = sq_residual
    penalty = 0.0
    for q in range(m):
        if positive and w[q] < 0.0:
            return np.inf
        d = w[q] - start[q]
        sq -= d * (corr[q] + g[q])
        penalty += weights[q] * abs(w[q])
    if fit_intercept:
        sq -= db * (corr[m] + g[m])
    if l2 > 0.0:
        penalty += 0.5 * l2 * weighted_square_sum(w, weights)
    return 0.5 * sq + n_lam * penalty


@njit(cache=True, inline="always")
def _subtract_row(g, step, gram, q):
    """g -= step * gram[q] (row q, the column too: gram is symmetric)."""
    for a in range(g.shape[0]):
        g[a] -= step * gram[q, a]


@njit(cache=True)
def _gram_residual_correlation(gram, corr, w, start, db, fit_intercept, g):
    """g = corr - gram d at d = (w - start, db), into g: formed anew after an
    extrapolation, whose combination of the stored g's carries their rounding times the
    combination's coefficients."""
    m = w.shape[0]
    _assign(g, corr)
    for q in range(m):
        if w[q] != start[q]:
            _subtract_row(g, w[q] - start[q], gram, q)
    if fit_intercept and db != 0.0:
        _subtract_row(g, db, gram, m)


@njit(cache=True)
def gram_start(gram, corr, w0, w, db, r, y, sample_weight, fit_intercept):
    """What ``gram_lasso_cd`` starts from at (w, b + db) with residual r, given B^T r0
    = ``corr`` at (w0, b): (B^T r = corr - gram d at d = (w - w0, db), ||r||_C^2,
    y^T C r), with no BLAS call (whose idle threads would spin beside the kernels).
    With sample weights c (the kernel form, ``losses.row_weight``) B = C^(1/2) [A_W, 1]
    and the residual C^(1/2) r: gram_lasso_cd's sums are those of the weighted least
    squares."""
    g = np.empty(corr.shape[0])
    _gram_residual_correlation(gram, corr, w, w0, db, fit_intercept, g)
    sq, yr = 0.0, 0.0
    for i in range(r.shape[0]):
        c = row_weight(sample_weight, i)
        sq += c * r[i] * r[i]
        yr += c * y[i] * r[i]
    return g, sq, yr


@njit(cache=True)
def gram_lasso_cd(gram, corr, w, n_lam, weights, positive, l2, fit_intercept,
                  sq_residual, y_residual, y_corr, tol, max_passes, check_every, anderson):
    """Coordinate descent on the L1 subproblem F(w + d_w, b + d_b) (module docstring) from
    the Gram matrix of B = [A_ws, 1] alone, what the working-set step under MPI has on
    the server: ``gram`` = B^T B (the intercept's row and column last where it is
    fitted), ``corr`` = B^T r at the start, ``sq_residual`` = ||r||^2, ``y_residual`` =
    y^T r and ``y_corr`` = B^T y. With g = B^T r' = corr - gram d at r' = r - B d,
        ||r'||^2 = ||r||^2 - d^T corr - d^T g,   y^T r' = y^T r - d^T y_corr,
    so F and D(u) = y^T u - ||u||^2 / 2 at u = r' / max(1, max_q |g_q| / (n lam v_q))
    cost O(|ws|) and a coordinate's exact step, w_q <- ST(w_q + g_q / G_qq,
    n lam v_q / G_qq), O(|ws|) more to update g. A pass updates every column in order,
    then the intercept (d_b += g_b / n). Every ``anderson`` passes (0: never) the last
    iterates are extrapolated (g is affine in them, so it extrapolates alike) and the
    point kept only where it lowers F (its g then formed anew from the Gram matrix).
    Passes run until the gap F - D, checked every ``check_every`` passes, is at most
    ``tol`` or ``max_passes`` passed. ``positive``: w >= 0 (the one-sided prox and dual
    constraint), ``l2``: the elastic net's L2 part (the prox's shrink, the constraint's
    c_q = g_q - n lam l2 v_q w_q, D's L2 term; module docstring). B^T r (``corr``, g)
    is the residual's alone: the L2 term is not in it. w is updated in place; returns
    (d_b, passes, gap)."""
    m = w.shape[0]
    dim = gram.shape[0]
    start = w.copy()
    g = corr.copy()
    db = 0.0
    past_w, past_g, past_b, try_w, try_g = _anderson_buffers(anderson, m, dim)
    stored = 0
    gap = np.inf
    passes = 0
    while passes < max_passes:
        for q in range(m):
            h = gram[q, q]
            if h <= 0.0:
                continue
            old = w[q]
            new = prox_elastic_net(old + g[q] / h, n_lam * weights[q] / h, positive, l2)
            step = new - old
            if step != 0.0:
                w[q] = new
                _subtract_row(g, step, gram, q)
        if fit_intercept and gram[m, m] > 0.0:
            step = g[m] / gram[m, m]
            db += step
            _subtract_row(g, step, gram, m)
        passes += 1
        if anderson > 0:
            stored, full = _record_iterate(past_w, past_g, past_b, stored, w, g, db)
            if full:
                try_b = _extrapolate(past_w, past_g, past_b, try_w, try_g)
                if np.isfinite(try_b) and \
                        _gram_objective(try_w, start, try_b, try_g, corr, sq_residual,
                                        n_lam, weights, positive, l2, fit_intercept) < \
                        _gram_objective(w, start, db, g, corr, sq_residual, n_lam,
                                        weights, positive, l2, fit_intercept):
                    _assign(w, try_w)
                    db = try_b
                    _gram_residual_correlation(gram, corr, w, start, db, fit_intercept, g)
                    if fit_intercept and gram[m, m] > 0.0:    # 1^T r' = 0 again
                        step = g[m] / gram[m, m]
                        db += step
                        _subtract_row(g, step, gram, m)
        if passes % check_every == 0 or passes == max_passes:
            sq = 2.0 * _gram_objective(w, start, db, g, corr, sq_residual, 0.0, weights,
                                       positive, 0.0, fit_intercept)
            dual_norm = 0.0
            penalty = 0.0
            for q in range(m):
                penalty += weights[q] * abs(w[q])
                if weights[q] > 0.0:
                    c = g[q] - n_lam * l2 * weights[q] * w[q] if l2 > 0.0 else g[q]
                    dual_norm = max(dual_norm, dual_magnitude(c, positive) / weights[q])
            scale = max(1.0, dual_norm / n_lam)
            yu = y_residual
            for q in range(m):
                yu -= (w[q] - start[q]) * y_corr[q]
            if fit_intercept:
                yu -= db * y_corr[m]
            yu /= scale
            gap = 0.5 * sq + n_lam * penalty - (yu - 0.5 * sq / (scale * scale))
            if l2 > 0.0:
                w_sq = weighted_square_sum(w, weights)
                gap += 0.5 * n_lam * l2 * w_sq * (1.0 + 1.0 / (scale * scale))
            if gap <= tol:
                break
    return db, passes, gap
