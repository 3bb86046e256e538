"""The model layer of the L1 step: the quadratic model of P on S over the orthant of x,
its minimisers and the candidates along the chosen move.

With g = [-(A_S^T rho) / n + lam w sigma, -sum(rho) / n] and H = H_sum / n (``kernels``),
    q(d) = g^T d + d^T H d / 2,   d over S's coordinates and the intercept,
is P's model on the orthant sigma of x (exact for the squared loss). Two minimisers:
``orthant_newton_target`` (the Newton path from the Hessian itself, which fixes a
coordinate at zero once it reaches it) and ``hessian_free_direction`` (the projected
Newton direction by preconditioned CG from products with H). ``dense_move`` /
``support_move`` form both where |S| allows and keep the one whose full step models
lower; ``move_candidates`` spreads it over STEP_GRID and ``best_candidate`` picks the
candidate of smallest exact P (the group step's too). H and g are given; nothing here
reads the rows.

``positive`` (the positive L1 penalty, x >= 0; S's orthant is then +1 everywhere,
``policy.entering_coordinates``): no move changes a coordinate's sign, so that every
candidate stays in x >= 0 (the orthant path and the projected candidates stop at zero;
the sign flips of ``hessian_free_direction`` and the entering zeros of
``_with_violating_zeros`` with the sign -1 are left out)."""
import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from ..penalties import contiguous_block_norms
from .kernels import symmetric_from_lower, symmetric_submatrix, symmetric_times
from .policy import product_budget, settled_zeros, uses_hessian_free

CG_TOLERANCE = 1e-10     # CG stops at this relative residual
CG_PIECES = 20           # CG solves at most (after each, crossing ones fixed, others freed)
PRECONDITIONER_BLOCK = 50   # coordinates of S whose Hessian block CG's M^-1 inverts
STEP_GRID = 2.0 ** -np.arange(7)   # 1, 1/2, ..., 1/64
RIDGE = 1e-10            # relative ridge on the Hessian (exactly equal columns)
ZERO_ROUNDS = 2          # dense_move: solves again at most with the zeros that violate
ZERO_SLACK = 1e-6        # ... |s_j| > (1 + this) lam w_j at its end point (rounding)
LINE, PROJECTED = 0, 1   # how a move's vector makes candidates (``move_candidates``)


def orthant(values, signs=None):
    """The orthant sigma of the penalized coordinates of S: ``signs`` where given (a
    coordinate entering S at zero has the sign it enters with, ``support_point``), else
    the signs of their ``values``."""
    return np.sign(values) if signs is None else np.asarray(signs, np.float64)


def support_gradient(correlation_S, rho_sum, x_S, weights_S, lam, n, intercept, signs=None):
    """g = [-(A_S^T rho) / n + lam w sigma, -sum(rho) / n] (the intercept's entry only when
    it is fitted); sigma = ``orthant(x_S, signs)``."""
    sigma = orthant(x_S, signs)
    grad = -np.asarray(correlation_S, np.float64) / n + lam * weights_S * sigma
    return np.append(grad, -rho_sum / n) if intercept else grad


def orthant_newton_target(hessian, gradient, point, n_penalized, drop=None,
                          max_pieces=128):
    """The end of the orthant-constrained Newton path of the quadratic model
    q(d) = g^T d + d^T H d / 2 from ``point`` (its first ``n_penalized`` entries the
    non-zero coordinates, which may reach zero but not cross it; any further entry, the
    intercept, is free). ``drop`` (a mask, ``settled_zeros``) sets some coordinates to
    zero first; the path runs on the others. Returns (target, predicted change of the
    model, pieces).

    One Cholesky factorisation of M = H + ridge I serves every piece: with the
    coordinates fixed at zero so far as the columns E of the identity, Z = M^-1 E and
    S = E^T Z, the Newton direction on the others is d = -M^-1 g + Z S^-1 Z^T g (the
    bordered system M d + E l = -g, E^T d = 0), so each piece costs a solve with the
    factor and not a new factorisation."""
    hessian = np.asarray(hessian, np.float64)
    start = np.asarray(point, np.float64)
    gradient = np.asarray(gradient, np.float64)
    target = start.copy()
    if drop is not None and np.any(drop):
        drop = np.asarray(drop, dtype=bool)
        keep = np.flatnonzero(~drop)
        target[drop] = 0.0
        grad = gradient + hessian @ (target - start)
        target[keep], pieces = _orthant_path(hessian[np.ix_(keep, keep)], grad[keep],
                                             target[keep], int(np.sum(keep < n_penalized)),
                                             max_pieces)
    else:
        target, pieces = _orthant_path(hessian, gradient, start, n_penalized, max_pieces)
    change = target - start
    predicted = float(gradient @ change + 0.5 * change @ hessian @ change)
    if not predicted < 0.0:       # rounding on a direction of (almost) no curvature
        return start.copy(), 0.0, pieces
    return target, predicted, pieces


def _orthant_path(hessian, gradient, start, n_penalized, max_pieces):
    """``orthant_newton_target`` without ``drop``: (end point, pieces)."""
    from scipy.linalg import LinAlgError, cho_factor, cho_solve
    k = start.shape[0]
    target = start.copy()
    grad = gradient.copy()
    if k == 0:
        return target, 0
    ridge = RIDGE * max(float(np.trace(hessian)) / k, 1e-300)
    factor = None
    for _ in range(4):
        try:
            factor = cho_factor(hessian + ridge * np.eye(k), lower=True,
                                check_finite=False)
            break
        except LinAlgError:
            ridge *= 1e3
    if factor is None:
        return start.copy(), 0
    fixed = []                       # coordinates stopped at zero, in order
    Z = np.zeros((k, 0))
    pieces = 0
    for pieces in range(1, max_pieces + 1):
        direction = -cho_solve(factor, grad, check_finite=False)
        if fixed:
            Zg = Z.T @ grad
            direction += Z @ np.linalg.solve(Z[fixed, :], Zg)
            direction[fixed] = 0.0
        descent = float(grad @ direction)
        if not descent < 0.0:
            break
        h_dir = hessian @ direction
        curvature = float(direction @ h_dir)
        t_model = -descent / curvature if curvature > 0.0 else np.inf
        shrinking = target[:n_penalized] * direction[:n_penalized] < 0.0
        t_zero, first = np.inf, -1
        if np.any(shrinking):
            where = np.flatnonzero(shrinking)
            ratios = -target[where] / direction[where]
            first = int(where[np.argmin(ratios)])
            t_zero = float(ratios.min())
        t = min(t_model, t_zero)
        if not (np.isfinite(t) and t * descent + 0.5 * t * t * curvature < 0.0):
            break
        target += t * direction
        grad += t * h_dir
        if t_zero <= t_model:
            target[first] = 0.0
            fixed.append(first)
            unit = np.zeros(k)
            unit[first] = 1.0
            Z = np.column_stack([Z, cho_solve(factor, unit, check_finite=False)])
        else:
            break
    return target, pieces


def _conjugate_gradient(apply, rhs, precondition, start, limit, tolerance=CG_TOLERANCE):
    """Preconditioned conjugate gradients for apply(d) = rhs from ``start``
    (``precondition(r)`` = M^-1 r): at most ``limit`` products, until the residual is
    below ``tolerance`` times the right-hand side's norm or a direction of no positive
    curvature. Returns (d, products)."""
    d = start.copy()
    residual = rhs - apply(d) if np.any(d) else rhs.copy()
    products = int(np.any(start))
    goal = tolerance * np.linalg.norm(rhs)
    z = precondition(residual)
    p = z.copy()
    rz = float(residual @ z)
    while products < limit and np.linalg.norm(residual) > goal:
        q = apply(p)
        products += 1
        curvature = float(p @ q)
        if not curvature > 0.0:
            break
        alpha = rz / curvature
        d += alpha * p
        residual -= alpha * q
        z = precondition(residual)
        rz, previous = float(residual @ z), rz
        p = z + (rz / previous) * p
    return d, products


def preconditioner_coordinates(ranking, intercept):
    """The coordinates of S (positions; the intercept's is |S|) whose block of the
    Hessian CG's preconditioner inverts exactly (``block_preconditioner``): the
    PRECONDITIONER_BLOCK coordinates with the largest ``ranking`` (the Hessian's diagonal
    over S; under MPI the server's squared column norms, the same for the squared loss)
    and the intercept when it is fitted. Sorted.

    Why a block: the scaled Hessian on a Lasso's support can have one eigenvalue far
    above the rest, the intercept's direction (the sum of the columns), with the most
    frequent features coupled to it and to each other, which the diagonal alone (Jacobi)
    does not capture; under MPI the block costs one reduction per step, about the bytes
    of one product (benchmarks/notes/newton.md)."""
    top = np.sort(np.argsort(-np.asarray(ranking), kind="stable")[:PRECONDITIONER_BLOCK])
    return np.append(top, ranking.shape[0]) if intercept else top


def preconditioner_size(support_size, intercept):
    """How many coordinates ``preconditioner_coordinates`` picks for |S| =
    ``support_size``: what every rank knows without being told."""
    return min(PRECONDITIONER_BLOCK, support_size) + int(bool(intercept))


def block_preconditioner(diagonal, ridge, free, block):
    """r -> M^-1 r over the ``free`` coordinates, M = (H + ridge I)_FF with every entry
    outside the diagonal and the block set to zero: ``block`` = (positions R, H_RR) (None:
    the diagonal alone, Jacobi). The block of R's free coordinates is factored once
    (Cholesky); where it is not positive definite the preconditioner is Jacobi."""
    inverse = 1.0 / (diagonal[free] + ridge)
    factor = None
    if block is not None:
        positions, matrix = block
        kept = free[positions]
        at = (np.cumsum(free) - 1)[positions[kept]]      # their places among the free
        if at.shape[0]:
            ridged = matrix[np.ix_(kept, kept)] + ridge * np.eye(at.shape[0])
            try:
                factor = cho_factor(ridged)
            except LinAlgError:
                factor = None

    def precondition(r):
        out = inverse * r
        if factor is not None:
            out[at] = cho_solve(factor, r[at])
        return out
    return precondition


def hessian_free_direction(hessian_times, diagonal, gradient, point, n_penalized, drop,
                           signs=None, block=None, penalty=None, positive=False):
    """The projected Newton direction from Hessian-vector products (truncated Newton with
    the projection of Bertsekas' two-metric method and OWL-QN's orthant): ``drop``'s
    coordinates move to zero (d_j = -x_j), the others solve (H_FF + ridge I) d_F = -(g + H
    d_fixed)_F by preconditioned CG (``block_preconditioner``: the diagonal and ``block`` =
    (positions, H on them), ``preconditioner_coordinates``); the penalized ones that the
    full step takes across zero are then fixed at zero too, and the rest solved again; once
    none crosses, the fixed ones whose model gradient points back into x's orthant are
    freed and solved again (at most CG_PIECES solves, each warm-started, and product_budget
    products in all): the freeing recovers what fixing every crossing coordinate at once
    loses against the Hessian's path, which fixes them one at a time.
    ``hessian_times(v)`` = H v, ``diagonal`` = diag(H) (H the scaled Hessian of
    ``orthant_newton_target``; the ridge is the same, RIDGE times the mean of the
    diagonal). ``signs``: the orthant of the first n_penalized coordinates (``orthant``):
    one that the step takes to the other side crosses.

    ``penalty`` (lam w over those coordinates, in the gradient's scale): where some
    non-zeros that the direction takes to zero have their model minimum along their own
    axis on the other side of zero (with s_j the smooth part of g_j: sigma_j s_j >
    lam w_j and |x_j| < (sigma_j s_j - lam w_j) / H_jj), the direction is solved again,
    warm-started, with them in the other orthant (sigma_j and the penalty's term in g_j
    flipped), and the one whose full projected step has the lower model value (the
    quadratic model plus the exact change of the penalty, a product each) is returned.
    The step can then take a coordinate through zero to its new sign (asynchronous
    epochs leave popular features on the wrong side of zero). Only coordinates that pass
    both tests flip: the axis test alone ignores the coupling, and flipping every
    coordinate that CG fixed at zero with its model gradient pointing to the other side
    flips right signs too (an intermediate solve may have fixed them). ``positive``: only
    coordinates of the orthant -1 may flip (none, where every sign is +1: x >= 0).

    Returns (d, Hessian products, the orthant over the first n_penalized coordinates at
    the end), d None when it is no descent direction. The candidates are the projections
    of point + t d onto that orthant (``projected_candidates``)."""
    dim = point.shape[0]
    sigma = np.zeros(dim)
    sigma[:n_penalized] = orthant(point[:n_penalized], signs)
    ridge = RIDGE * max(float(np.mean(diagonal)), 1e-300) if dim else 0.0
    budget = product_budget(dim)
    direction, products = _projected_newton(hessian_times, diagonal, ridge, gradient, point,
                                            sigma, n_penalized, drop, block, budget)
    flip = np.zeros(0, dtype=np.int64)
    if penalty is not None and direction is not None:
        penalty = np.asarray(penalty, np.float64)
        push = sigma[:n_penalized] * gradient[:n_penalized] - 2.0 * penalty
        flip = np.flatnonzero((push > 0.0) & (np.abs(point[:n_penalized]) * (
            diagonal[:n_penalized] + ridge) < push) & (
            point[:n_penalized] + direction[:n_penalized] == 0.0) & (
            (sigma[:n_penalized] < 0.0) | (not positive)))
    if flip.shape[0] and products < budget:
        flipped = sigma.copy()
        flipped[flip] = -flipped[flip]
        shifted = np.array(gradient, dtype=np.float64)
        shifted[flip] += 2.0 * penalty[flip] * flipped[flip]
        other, used = _projected_newton(hessian_times, diagonal, ridge, shifted, point,
                                        flipped, n_penalized, drop, block,
                                        budget - products, direction)
        products += used
        if other is not None:
            smooth = np.array(gradient, dtype=np.float64)
            smooth[:n_penalized] -= penalty * sigma[:n_penalized]

            def model(d, orthant_head):
                move = projected_candidates(point, d, n_penalized, orthant_head)[0] - point
                products_ = hessian_times(move)
                return float(smooth @ move + 0.5 * move @ products_ + penalty @ (
                    np.abs(point[:n_penalized] + move[:n_penalized]) -
                    np.abs(point[:n_penalized])))
            products += 2
            if model(other, flipped[:n_penalized]) < model(direction, sigma[:n_penalized]):
                direction, sigma = other, flipped
    if direction is None or not float(gradient @ direction) < 0.0:
        return None, products, sigma[:n_penalized]
    return direction, products, sigma[:n_penalized]


def _projected_newton(hessian_times, diagonal, ridge, gradient, point, sigma, n_penalized,
                      drop, block, budget, start=None):
    """The CG pieces of ``hessian_free_direction`` in the orthant ``sigma`` (gradient's
    penalty term in it), warm-started from the direction ``start`` when given (the
    second solve, with some signs flipped, costs about as much as the first from zero):
    (d, products)."""
    dim = point.shape[0]
    penalized = np.arange(dim) < n_penalized
    fixed = np.zeros(dim, dtype=bool) if drop is None else np.asarray(drop, bool).copy()
    direction = np.zeros(dim) if start is None else np.array(start, dtype=np.float64)
    direction[fixed] = -point[fixed]
    products = 0
    for _ in range(CG_PIECES):
        if products >= budget:
            break
        free = ~fixed
        if np.any(free):
            rhs = -gradient[free]
            if np.any(direction[fixed]):
                rhs -= hessian_times(np.where(fixed, direction, 0.0))[free]
                products += 1
            embed = np.zeros(dim)

            def apply(v):
                embed[free] = v
                return hessian_times(embed)[free] + ridge * v

            direction[free], used = _conjugate_gradient(
                apply, rhs, block_preconditioner(diagonal, ridge, free, block),
                direction[free], budget - products)
            products += used
            crossing = penalized & free & (sigma * (point + direction) < 0.0)
            if np.any(crossing):
                fixed |= crossing
                direction[crossing] = -point[crossing]
                continue
        # a coordinate fixed at zero whose model gradient points back into the orthant
        # (sigma_j (g + H d)_j < 0: |smooth part| above lam w_j, with x_j's sign) is freed
        residual = gradient + hessian_times(direction)
        products += 1
        release = fixed & (sigma * residual < 0.0)
        if not np.any(release):
            break
        fixed &= ~release
    return direction, products


def linear_candidates(point, target):
    """point + t (target - point) for every t of STEP_GRID, the first (t = 1) exactly
    ``target`` (its zeros exact)."""
    candidates = point + STEP_GRID[:, None] * (target - point)
    candidates[0] = target
    return candidates


def projected_candidates(point, direction, n_penalized, signs=None):
    """P(point + t d) for every t of STEP_GRID: the first ``n_penalized`` coordinates
    (non-zeros of x, and zeros entering with a sign) that would leave their orthant
    (``orthant(point, signs)``) stay at zero; further ones (the intercept) are free.
    A coordinate with d_j = -x_j lands on zero exactly at t = 1. One that starts outside
    its orthant (its sign changed in ``hessian_free_direction``) is not projected: it
    goes through zero to its new sign (where d_j ends it), so a short step moves it a
    little rather than setting it to zero."""
    candidates = point + STEP_GRID[:, None] * direction
    head = candidates[:, :n_penalized]
    sigma = orthant(point[:n_penalized], signs)
    head[(head * sigma < 0.0) & (point[:n_penalized] * sigma >= 0.0)] = 0.0
    return candidates


def best_candidate(loss_sums, n, lam, weights_S, start_S, candidates_S, offset=0.0,
                   starts=None):
    """(index, P(candidate) - P(x)) of the candidate with the smallest exact P, index -1
    (change 0) when none lowers P. ``loss_sums``: ``kernels.SupportRows.trial_sums``
    summed over the shards (the candidates', then the point's). Only S's penalty
    changes: lam sum w |candidate_S|, or for groups (``starts``: group k of S holds its
    coordinates starts[k]:starts[k+1], ``weights_S`` per group) lam sum w_k
    ||candidate_k||. ``offset``: P(x) - P(point) when the point is not x itself
    (``policy.pruned_coordinates``), so that a candidate is taken only below P(x)."""
    def penalty(v):
        size = np.abs(v) if starts is None else contiguous_block_norms(v, starts)
        return lam * float(weights_S @ size)
    current = loss_sums[-1] / n + penalty(start_S) + offset
    best, best_change = -1, 0.0
    for s in range(candidates_S.shape[0]):
        change = loss_sums[s] / n + penalty(candidates_S[s]) - current
        if change < best_change:
            best, best_change = s, change
    return best, best_change


def support_point(x, b, intercept, entering=None):
    """(S, the point [x_S, b], the orthant sigma over S): S the non-zeros of x, plus the
    coordinates of ``entering`` (``policy.entering_coordinates``' code), which start at
    zero with their entering sign; b only when the intercept is fitted."""
    support = np.flatnonzero(x)
    if entering is not None and entering.shape[0]:
        joining = (np.abs(entering) - 1.0).astype(np.int64)
        support = np.union1d(support, joining)
        signs = np.sign(x[support])
        signs[np.searchsorted(support, joining)] = np.sign(entering)
    else:
        signs = np.sign(x[support])
    return support, (np.append(x[support], b) if intercept else x[support].copy()), signs


def dense_move(hessian_sum, correlation_S, rho_sum, point, weights_S, lam, n, intercept,
               signs=None, positive=False):
    """The move from the summed Hessian (``support_move`` with its products, diagonal
    and preconditioner block, and the orthant path where |S| allows it; ``hessian_sum``
    is read from its lower triangle, ``kernels.lower_from_upper_triangle``): (kind,
    vector, predicted change of the model, the orthant of S its candidates keep), kind
    None when no move predicts a decrease.
    Two moves are formed and the one whose full step (t = 1) has the lower model value
    (the loss's quadratic model plus the exact change of the penalty) is kept:
      - LINE: the end of the orthant Newton path (``orthant_newton_target``, settled zeros
        dropped first), vector = that target;
      - PROJECTED: ``hessian_free_direction`` with exact products on the same Hessian and
        nothing dropped, vector = the direction, which may change the sign of some
        coordinates (the orthant returned).
    The path fixes crossing coordinates one piece at a time and gives up at 128 pieces;
    the drop can cost more than the path gains, where the projected direction still
    finds the move. Coordinates entering S at zero (``signs``) move only in the
    projected direction; the path keeps them at zero. ``positive``: no sign changes
    (module docstring).

    Above 398 coordinates (``uses_hessian_free``) the path is not formed: each of its
    pieces factors an |S|-square system, and there the projected direction wins anyway
    (benchmarks/notes/newton.md)."""
    k = correlation_S.shape[0]
    diagonal = np.diag(hessian_sum).copy()
    positions = preconditioner_coordinates(diagonal[:k], intercept)
    return support_move(lambda v: symmetric_times(hessian_sum, v), diagonal,
                        (positions, symmetric_submatrix(hessian_sum, positions)),
                        correlation_S, rho_sum, point, weights_S, lam, n, intercept, signs,
                        None if uses_hessian_free(k) else
                        symmetric_from_lower(hessian_sum.copy()), positive)


def support_move(hessian_times, diagonal_sum, block_sum, correlation_S, rho_sum, point,
                 weights_S, lam, n, intercept, signs=None, hessian_sum=None,
                 positive=False):
    """``dense_move`` from the Hessian sum as products: ``hessian_times(v)`` = H_sum v
    (unscaled: summed over the rows, or over the workers' shares), ``diagonal_sum`` its
    diagonal, ``block_sum`` = (positions, H_sum on them), CG's preconditioner block
    (``preconditioner_coordinates``); ``hessian_sum`` the matrix itself where it is
    formed (the orthant path needs it; None: the projected direction only). Under MPI
    across machines the products are the workers' (``solvers.mpi``), so that the step
    is the same maths with or without the summed Hessian on the server; each model
    value of a candidate is one product. ``positive``: no sign changes (module
    docstring)."""
    k = correlation_S.shape[0]

    def times(v):
        return hessian_times(v) / n

    diagonal = diagonal_sum / n
    block = (block_sum[0], block_sum[1] / n)
    gradient = support_gradient(correlation_S, rho_sum, point[:k], weights_S, lam, n,
                                intercept, signs)
    kept_zero = settled_zeros(correlation_S, n, lam, weights_S, intercept)
    kept_zero[:k] |= point[:k] == 0.0

    smooth = gradient.copy()
    smooth[:k] -= lam * weights_S * orthant(point[:k], signs)

    def model(candidate):
        move = candidate - point
        return float(smooth @ move + 0.5 * move @ times(move) + lam * weights_S @ (
            np.abs(candidate[:k]) - np.abs(point[:k])))

    orthant_S = orthant(point[:k], signs)
    best = (None, None, 0.0, orthant_S)
    if hessian_sum is not None and not uses_hessian_free(k):
        target, predicted, _ = orthant_newton_target(hessian_sum / n, gradient, point, k,
                                                     kept_zero)
        if predicted < 0.0:
            best = (LINE, target, model(target), orthant_S)
    direction, _, ending = hessian_free_direction(times, diagonal, gradient, point, k, None,
                                                  signs, block, lam * weights_S, positive)
    if direction is not None:
        projected = model(projected_candidates(point, direction, k, ending)[0])
        if projected < best[2]:
            best = (PROJECTED, direction, projected, ending)
    for _ in range(ZERO_ROUNDS if best[0] is not None else 0):
        end = best[1] if best[0] == LINE else \
            projected_candidates(point, best[1], k, best[3])[0]
        further = _with_violating_zeros(times, diagonal, block, smooth, point, end,
                                        lam * weights_S, k, positive)
        value = np.inf if further is None else model(further)
        if not value < best[2]:
            break
        best = (LINE, further, value,
                np.where(further[:k] != 0.0, np.sign(further[:k]), orthant_S))
    return best


def _with_violating_zeros(hessian_times, diagonal, block, smooth, point, end, penalty, k,
                          positive=False):
    """The end point of a second projected Newton solve from ``end`` (a move's full
    step) in which the zeros of ``end`` that violate the model's optimality condition,
    |s_j| > lam w_j with s = ``smooth`` + H (end - point) the smooth part of the model's
    gradient there, enter S's orthant with the sign -sign(s_j), the other zeros staying
    at zero; None when no zero violates. The orthant of a step's start has a coordinate
    that the asynchronous epochs left on the wrong side of zero (a popular feature
    whose solution value is small): the move takes it to zero and, where the flip of
    ``hessian_free_direction`` does not fire, leaves it there, and the step cannot
    certify without a chained step (another certificate, the Hessian again and a second
    solve), where the Hessian on S is all this solve needs. ``positive``: only the zeros
    that enter with the sign +1 (s_j < 0)."""
    slope = smooth + hessian_times(end - point)
    at_zero = end[:k] == 0.0
    violation = -slope[:k] if positive else np.abs(slope[:k])
    entering = at_zero & (violation > (1.0 + ZERO_SLACK) * penalty)
    if not np.any(entering):
        return None
    signs = np.sign(end[:k])
    signs[entering] = -np.sign(slope[:k][entering])
    gradient = slope.copy()
    gradient[:k] += penalty * signs
    drop = np.zeros(end.shape[0], dtype=bool)
    drop[:k] = at_zero & ~entering
    direction, _, ending = hessian_free_direction(hessian_times, diagonal, gradient, end, k,
                                                  drop, signs, block, penalty, positive)
    if direction is None:
        return None
    return projected_candidates(end, direction, k, ending)[0]


def move_candidates(kind, vector, point, n_penalized, signs=None):
    """The candidates of a move (``dense_move``, ``support_move``)."""
    if kind == LINE:
        return linear_candidates(point, vector)
    return projected_candidates(point, vector, n_penalized, signs)


def take_candidate(x, b, support, candidate, intercept):
    """x_S (in place) and b (returned) at ``candidate``."""
    x[support] = candidate[:support.shape[0]]
    return float(candidate[-1]) if intercept else b
