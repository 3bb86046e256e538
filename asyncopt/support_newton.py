"""The support Newton step: a second-order move on the non-zero coordinates of x, taken
between DDSS epochs when the gap stalls (L1 penalties; every backend; group penalties:
``group_newton.py``, which shares the Hessian sums, candidates and StallWatch here).

Why: on data with nearly equal columns (a9a's polynomial features: x_i^2 = x_i for binary
x_i, and products that differ from a factor in a few rows) the Lasso moves weight from one
column of such a pair to the other along a direction of almost no curvature, pushed only by
the small difference of their correlations. First-order steps (prox-SVRG, coordinate
descent) move along it at constant speed: a9a degree 2, Lasso at 1e-2 lam_max, held its
gap at 1.2e-4 for 60 epochs while one coordinate of such a pair (features 60 and 4489,
1,568 and 1,566 rows) drifted to zero, then converged in 10. A Newton step sees the
missing curvature and lands the coordinate on zero at once.

The step (S the non-zero coordinates of x, sigma their signs, b the intercept when it is
fitted). On the orthant of x the objective is smooth:
    P(x_S, b) = (1/n) sum_i f(a_iS^T x_S + b) + lam sum_{j in S} w_j sigma_j x_j,
with gradient g = [-(A_S^T rho) / n + lam w sigma, -sum(rho) / n] and Hessian
    H = (1/n) [A_S, 1]^T diag(f''(z)) [A_S, 1]
(``support_hessian_sums`` forms the sum, one shard at a time). ``orthant_newton_target``
minimises the quadratic model q(d) = g^T d + d^T H d / 2 over the orthant of x: the
Newton direction on the free coordinates, followed up to the first coordinate that reaches
zero, which is then fixed at zero, and again (the path of active-set methods for
quadratic programs, Nocedal & Wright ch. 16.5). For the squared loss q is exact, so the
end point lowers P by exactly -q; for the logistic loss it is a model. The candidates are
x + t (target - x) for the t of STEP_GRID, or, where it models a lower value
(``dense_move``), the projections onto the orthant of x + t d for the projected Newton
direction d of ``hessian_free_direction`` on the same Hessian.

Under MPI across machines, where sending the Hessian would cost more bytes than products
with it (``uses_hessian_free``: its (|S| + 1)^2 / 2 numbers per worker outweigh
MIN_PRODUCTS products of 2 (|S| + 1) numbers once |S| > 398; on one node a product's
round costs more than the bytes: ``solvers.mpi.cg_products_from_shares``), the workers
keep their shares of it and the server finds the direction by CG on Hessian-vector
products instead
(``hessian_free_direction``: the coordinates it takes across zero fixed, those the model
wants back freed, and solved again), and the candidates are the projections of x + t d
onto the orthant (``projected_candidates``). CTR 200,000 x 100,000 at 1e-4 lam_max,
2 workers, |S| ~1,700: 1.5-5 MB a step against 23 MB. Either way the step taken is the
candidate with the smallest exact P (``SupportRows.trial_sums``: one pass over the rows for
all candidates), when that P is lower than P(x).

When (``StallWatch``): after an epoch that cut the gap by less than half, or that left
it more than TRY_EPOCHS epochs from the goal at its rate, once at most 5% of x's firm
support (its non-zeros that are not ``settled_zeros``) changed in it. Then it also ends
runs that converge anyway: in the tail of a run prox-SVRG's gap shrinks by a constant
factor per epoch while x's own dual point carries the noise of the last steps (under
MPI, of 8 workers' stale deltas), and one Newton step on the right support takes the
gap to 1e-12 (CTR 200,000 x 100,000: 17 epochs to 9 serially, 27-29 to 9-13 at mpirun
-n 9). A full step (t = 1) after which zeros of x violate the optimality condition is
followed at once by another that lets them in (``StallWatch.should_chain``); for the
squared loss it reuses the Hessian of the step before (``HessianCache``), and every step
judges its candidates by the exact quadratic expansion instead of a pass over the rows
per candidate (``SupportRows.trial_sums``).

Which coordinates: S is x's non-zeros plus the zeros of x that most violate the optimality
condition |A_j^T rho| <= n lam w_j (``entering_coordinates``; at most ENTERING_SHARE |S|),
which start at zero in the orthant of sign(A_j^T rho): a step on the non-zeros alone
cannot certify while a coordinate of the solution is zero in x. When x has more than
MAX_SUPPORT non-zeros, those outside its firm support are first set to zero
(``pruned_coordinates``) and the candidates are compared with P of the unpruned x.

Any x is a valid iterate: the gap and the screening are computed at whatever x the step
leaves, so the step changes how fast DDSS converges, never what it certifies.
"""
import numpy as np
from numba import njit
from scipy.linalg import LinAlgError, cho_factor, cho_solve
from scipy.linalg.blas import dsymv

from .kernels.linalg import row_ranges, run_in_parallel
from .losses import SQUARED, loss_second_derivative, loss_value, mean_loss
from .penalties import contiguous_block_norms

MAX_SUPPORT = 2000       # |S| above which the step is not tried
MIN_PRODUCTS = 100       # Hessian-vector products a step may take at least
CG_TOLERANCE = 1e-10     # CG stops at this relative residual
CG_PIECES = 20           # CG solves at most (after each, crossing ones fixed, others freed)
PRECONDITIONER_BLOCK = 50   # coordinates of S whose Hessian block CG's M^-1 inverts
STEP_GRID = 2.0 ** -np.arange(7)   # 1, 1/2, ..., 1/64
STALL_RATIO = 0.5        # try the step after an epoch that cut the gap by less than 2x
RIDGE = 1e-10            # relative ridge on the Hessian (exactly equal columns)
SUPPORT_CHURN = 0.2      # try only when at most this share of S changed in the epoch
PRUNED_CHURN = 0.05      # ... this share where the step prunes x to its firm support
TRY_EPOCHS = 2           # ... or when the gap's rate needs more epochs than this to the goal
DROP_MARGIN = 0.5        # non-zeros with |A_j^T rho| < n lam w_j / 2 go to zero at once
ENTERING_SHARE = 0.05    # zeros of x that violate the optimality condition, at most this
ENTERING_MIN = 10        # share of |S| (and at least this many), enter S with their sign
ENTERING_LEVEL = 0.9     # ... and zeros up to 10% below the condition's bound
POPULAR_SHARE = 0.1      # where the Hessian is summed, the zeros among this share of
                         # |S| largest columns too (``popular_zeros``)
CHAIN_STEPS = 2          # steps in a row at most after a full step (StallWatch.should_chain)
ZERO_ROUNDS = 2          # dense_move: solves again at most with the zeros that violate
ZERO_SLACK = 1e-6        # ... |s_j| > (1 + this) lam w_j at its end point (rounding)


@njit(cache=True, inline="always")
def _insert_sorted(where, value, first, end, q, v):
    """Insert (q, v) into where[first:end] (sorted) and value[first:end] at q's place,
    shifting the larger ones up by one (insertion sort's step)."""
    b = end - 1
    while b >= first and where[b] > q:
        where[b + 1] = where[b]
        value[b + 1] = value[b]
        b -= 1
    where[b + 1] = q
    value[b + 1] = v


@njit(cache=True, inline="always")
def _row_in_support(indptr, indices, data, position, i, where, value, first):
    """Row i's entries in S (``position[j]`` >= 0) written from ``first`` into ``where``
    (their positions in S) and ``value``, sorted by position (``_insert_sorted``, a
    no-op on rows stored in column order); returns where they end. What every kernel
    that forms Hessian sums on S reads of a row."""
    end = first
    for k in range(indptr[i], indptr[i + 1]):
        q = position[indices[k]]
        if q >= 0:
            _insert_sorted(where, value, first, end, q, data[k])
            end += 1
    return end


@njit(cache=True, nogil=True)
def support_hessian_triangle(indptr, indices, data, position, code, z, y, size, intercept):
    """The upper triangle, column by column (``upper_triangle``'s order), of sum_i
    f''(z_i) [a_iS, 1] [a_iS, 1]^T for S of (size + intercept) coordinates:
    ``position[j]`` is feature j's index in S (-1 when j is not in S). What a Dis-DDSS
    worker reduces of its Hessian share; ``support_hessian_sums`` unpacks it.

    One pass over the rows; each row's S-entries are sorted by position (insertion, a
    no-op on rows stored in column order) and their products (sum_i m_i^2 / 2 for m_i
    entries of row i in S) summed into the packed triangle by offset. Column by column,
    the products among the first coordinates of S lie together at the start (those of
    the first 256 in 257 kB) where row by row they spread over the first rows' whole
    length; where S lists the frequent features first (CTR's ids are their frequency
    ranks) most products fall there: a worker's 200,000 rows of CTR 200,000 x 100,000,
    S = x's non-zeros at the step, |S| = 1,217 / 1,931 (1e-3 / 1e-4 lam_max): 45-47 /
    71-73 ms against 61-65 / 103 ms row by row (the 2-core VM, 2026-11-26). Accumulating
    column a over the rows holding feature a was slower still (a random access to a row's
    data per column)."""
    dim = size + 1 if intercept else size
    flat = np.zeros(dim * (dim + 1) // 2)
    where = np.empty(size, dtype=np.int64)
    value = np.empty(size)
    last = size * (size + 1) // 2       # where the intercept's column starts
    for i in range(indptr.shape[0] - 1):
        weight = loss_second_derivative(code, z[i], y[i])
        m = _row_in_support(indptr, indices, data, position, i, where, value, 0)
        for c in range(m):
            column = where[c] * (where[c] + 1) // 2     # entry (q, c), q <= c
            vc = weight * value[c]
            for a in range(c + 1):
                flat[column + where[a]] += vc * value[a]
            if intercept:
                flat[last + where[c]] += vc
        if intercept:
            flat[last + size] += weight
    return flat


def support_hessian_sums(indptr, indices, data, position, code, z, y, size, intercept,
                         n_threads=1):
    """sum_i f''(z_i) [a_iS, 1] [a_iS, 1]^T as a dense (size + intercept) square matrix
    (``support_hessian_triangle`` unpacked; on ``n_threads`` threads:
    ``parallel_hessian_triangle``)."""
    return from_upper_triangle(parallel_hessian_triangle(
        indptr, indices, data, position, code, z, y, size, intercept, n_threads),
        size + 1 if intercept else size)


@njit(cache=True)
def support_hessian_rows(indptr, indices, data, position, code, z, y, size, intercept,
                         fresh):
    """The rows of ``support_hessian_sums`` of the coordinates of S at the positions
    ``fresh`` (distinct), as a len(fresh) x (size + intercept) matrix: one pass over the
    rows, sum_i m_i f_i products for m_i entries of row i in S of which f_i are fresh.
    What a step on S' forms when it has the sum on S and S' \\ S is small
    (``HessianCache``, ``ReducedHessian``; ``place_rows`` puts them in)."""
    dim = size + 1 if intercept else size
    out = np.zeros((fresh.shape[0], dim))
    flat = out.reshape(fresh.shape[0] * dim)
    fresh_row = np.full(size, -1, dtype=np.int64)
    for r in range(fresh.shape[0]):
        fresh_row[fresh[r]] = r
    where = np.empty(size, dtype=np.int64)
    value = np.empty(size)
    for i in range(indptr.shape[0] - 1):
        m = _row_in_support(indptr, indices, data, position, i, where, value, 0)
        touched = False
        for a in range(m):
            touched = touched or fresh_row[where[a]] >= 0
        if not touched:
            continue
        weight = loss_second_derivative(code, z[i], y[i])
        for a in range(m):
            r = fresh_row[where[a]]
            if r >= 0:
                va = weight * value[a]
                row = r * dim
                for c in range(m):
                    flat[row + where[c]] += va * value[c]
                if intercept:
                    flat[row + size] += va
    return out


def place_rows(matrix, positions, rows):
    """A symmetric matrix's rows and columns at ``positions`` set to ``rows`` (their
    ``support_hessian_rows``), in place; returns the matrix."""
    matrix[positions] = rows
    matrix[:, positions] = rows.T
    return matrix


PARALLEL_HESSIAN_BYTES = 2 ** 28   # the threads' partial Hessians take at most this


def parallel_hessian_triangle(indptr, indices, data, position, code, z, y, size,
                              intercept, n_threads=1):
    """``support_hessian_triangle`` on ``n_threads`` threads: each forms the sum over its
    contiguous block of the rows (``kernels.linalg.row_ranges``, as the threads'
    certificate passes split them), and the blocks' triangles are added. The threads'
    partial triangles take at most PARALLEL_HESSIAN_BYTES together (fewer threads for a
    larger S)."""
    n = indptr.shape[0] - 1
    dim = size + 1 if intercept else size
    threads = int(max(1, min(n_threads, n,
                             PARALLEL_HESSIAN_BYTES // max(4 * dim * (dim + 1), 1))))
    if threads == 1:
        return support_hessian_triangle(indptr, indices, data, position, code, z, y, size,
                                        intercept)
    parts = run_in_parallel([
        lambda lo=lo, hi=hi: support_hessian_triangle(
            indptr[lo:hi + 1], indices, data, position, code, z[lo:hi], y[lo:hi], size,
            intercept)
        for lo, hi in row_ranges(n, threads)])
    return np.sum(parts, axis=0)


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


def settled_zeros(correlation_S, n, lam, weights_S, intercept):
    """Mask of the coordinates of S (and False for the intercept) whose |A_j^T rho| is
    below (1 - DROP_MARGIN) n lam w_j: at a solution every non-zero has it equal to
    n lam w_j, and these are the small non-zeros that asynchronous steps leave behind
    (Dis-DDSS on CTR 200,000 x 100,000, 2 workers, near a gap of 1e-4: 150 of 1,160
    non-zeros below 0.99, 103 of them below 0.5; the path stopped after its 64 pieces,
    each taking one of them to zero, with no gain). A margin of 0.01 was too eager on a9a
    degree 2 (3,000 rows): non-zeros still on their way (a nearly equal pair) were
    dropped, no trial lowered P, and DDSS took 149 epochs against 22 with 0.5."""
    drop = np.abs(correlation_S) < (1.0 - DROP_MARGIN) * n * lam * weights_S
    return np.append(drop, False) if intercept else drop


def firm_support(x, correlation, n, lam, weights, block_indptr=None):
    """Mask of the non-zeros of x that are not ``settled_zeros``: |A_j^T rho| at least
    (1 - DROP_MARGIN) n lam w_j. ``StallWatch`` counts the changes of this set from one
    epoch to the next: asynchronous steps keep flipping small non-zeros (Dis-DDSS on CTR
    200,000 x 100,000 at 1e-4 lam_max, 2 workers: 639-10,334 changes of x's non-zero
    pattern per epoch at epochs 8-10, against 82-547 of this set), and the step drops
    those anyway. For a group penalty (``block_indptr``: its groups' feature ranges,
    ``weights`` per group), per feature: whether its group is non-zero with ||A_g^T rho||
    at least (1 - DROP_MARGIN) n lam w_g."""
    if block_indptr is None:
        return (x != 0) & ~settled_zeros(correlation, n, lam, weights, False)
    firm = (contiguous_block_norms(x, block_indptr) > 0.0) & \
        (contiguous_block_norms(correlation, block_indptr) >=
         (1.0 - DROP_MARGIN) * n * lam * np.asarray(weights, np.float64))
    return np.repeat(firm, np.diff(block_indptr))


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


@njit(cache=True)
def candidate_loss_sums(indptr, indices, data, position, code, z, y, moves, size,
                        intercept):
    """sum_i f(z_i + [a_iS, 1]^T m) for every row m of ``moves`` (the candidates' moves
    from the point, entry ``size`` the intercept's; ``position`` as in
    ``support_hessian_sums``)."""
    out = np.zeros(moves.shape[0])
    for i in range(indptr.shape[0] - 1):
        for s in range(moves.shape[0]):
            dz = moves[s, size] if intercept else 0.0
            for k in range(indptr[i], indptr[i + 1]):
                q = position[indices[k]]
                if q >= 0:
                    dz += data[k] * moves[s, q]
            out[s] += loss_value(code, z[i] + dz, y[i])
    return out


@njit(cache=True)
def restricted_rows(indptr, indices, data, position, code, z, y):
    """The rows restricted to S, each entry's column replaced by its position in S
    (``position[j]``, -1 outside S) and sorted by it within the row (insertion, a no-op
    on rows stored in column order), with each row's f''(z_i): (indptr, positions,
    data, weights). What products with the Hessian from the rows read."""
    n = indptr.shape[0] - 1
    count = 0
    for k in range(indptr[n]):
        if position[indices[k]] >= 0:
            count += 1
    out_indptr = np.empty(n + 1, dtype=np.int64)
    positions = np.empty(count, dtype=np.int32)
    values = np.empty(count)
    weights = np.empty(n)
    at = 0
    out_indptr[0] = 0
    for i in range(n):
        at = _row_in_support(indptr, indices, data, position, i, positions, values, at)
        out_indptr[i + 1] = at
        weights[i] = loss_second_derivative(code, z[i], y[i])
    return out_indptr, positions, values, weights


@njit(cache=True)
def restricted_hessian_times(indptr, positions, data, weights, v, size, intercept):
    """sum_i f''(z_i) [a_iS, 1] [a_iS, 1]^T v in one pass over the ``restricted_rows``
    (each row's margin along v, then its share of the product), without the Hessian."""
    out = np.zeros(v.shape[0])
    for i in range(indptr.shape[0] - 1):
        along = v[size] if intercept else 0.0
        for k in range(indptr[i], indptr[i + 1]):
            along += data[k] * v[positions[k]]
        along *= weights[i]
        if along != 0.0:
            for k in range(indptr[i], indptr[i + 1]):
                out[positions[k]] += data[k] * along
            if intercept:
                out[size] += along
    return out


@njit(cache=True)
def restricted_curvatures(indptr, positions, data, weights, moves, size, intercept):
    """sum_i f''(z_i) ([a_iS, 1]^T m)^2 for every row m of ``moves``, from the
    ``restricted_rows``: m^T H m without the Hessian."""
    out = np.zeros(moves.shape[0])
    for i in range(indptr.shape[0] - 1):
        for s in range(moves.shape[0]):
            along = moves[s, size] if intercept else 0.0
            for k in range(indptr[i], indptr[i + 1]):
                along += data[k] * moves[s, positions[k]]
            out[s] += weights[i] * along * along
    return out


def shard_slope(correlation_S, rho_sum, intercept):
    """sum_i f'(z_i) [a_iS, 1] over a shard's rows from its certificate's sums: -[A_S^T
    rho, sum rho] (rho = -f'(z)); the intercept's entry only when it is fitted."""
    slope = -np.asarray(correlation_S, np.float64)
    return np.append(slope, -rho_sum) if intercept else slope


def symmetric_times(matrix, v):
    """matrix @ v for a symmetric float64 matrix, read from its lower triangle (BLAS dsymv
    on the upper triangle of the transposed view, which is Fortran-ordered: no copy): half
    the memory a general product reads, and all that ``lower_from_upper_triangle`` fills
    in. |S| = 1,250: 0.15 ms against 0.25 ms; eight processes at once on 2 cores (the
    workers of mpirun -n 9 answering one CG product) 0.4-0.85 ms against 1.6-2.4 ms."""
    return dsymv(1.0, np.asfortranarray(matrix.T), np.asarray(v, np.float64), lower=0)


def symmetric_submatrix(lower, positions):
    """The symmetric matrix's block on ``positions`` (any order) from its lower
    triangle (``lower``: a square matrix whose entries above the diagonal are not read)."""
    block = lower[np.ix_(positions, positions)]
    return np.where(positions[:, None] >= positions[None, :], block, block.T)


def symmetric_from_lower(matrix):
    """``matrix`` with its entries above the diagonal set from those below, in place."""
    for j in range(matrix.shape[0] - 1):
        matrix[j, j + 1:] = matrix[j + 1:, j]
    return matrix


@njit(cache=True)
def copy_submatrix(source, source_at, target_at, out):
    """out[target_at[a], target_at[c]] = source[source_at[a], source_at[c]] for every a, c
    (``np.ix_`` on both sides): the kept part of a cached Hessian, |S| = 1,060 in 0.6 ms
    against 5.5 ms with ``np.ix_``."""
    for a in range(source_at.shape[0]):
        source_row, target_row = source[source_at[a]], out[target_at[a]]
        for c in range(source_at.shape[0]):
            target_row[target_at[c]] = source_row[source_at[c]]


def reusable_positions(kept_ids, kept_intercept, ids, intercept, share):
    """Where each feature id of ``ids`` (a step's S') stands in ``kept_ids`` (the S of
    a kept Hessian; -1 where it is new), or None when nothing is kept, the intercept
    differs, S' is empty or more than ``share`` of it is new: what ``HessianCache`` and
    ``ReducedHessian`` reuse a kept Hessian by."""
    if kept_ids is None or kept_intercept != bool(intercept) or not ids.shape[0]:
        return None
    where = np.full(int(max(ids.max(), kept_ids.max(initial=0))) + 1, -1, dtype=np.int64)
    where[kept_ids] = np.arange(kept_ids.shape[0])
    old = where[ids]
    if np.count_nonzero(old < 0) > share * ids.shape[0]:
        return None
    return old


def kept_entries(kept, old):
    """The square matrix on S' holding a kept Hessian's entries where both coordinates
    were kept (``old``: each one's position in ``kept``, -1 where new, as
    ``reusable_positions`` gives, the intercept's appended) and zeros in the new ones'
    rows and columns, which ``HessianCache`` forms and ``ReducedHessian`` is sent."""
    known = np.flatnonzero(old >= 0)
    out = np.zeros((old.shape[0], old.shape[0]))
    copy_submatrix(kept, old[known], known, out)
    return out


class HessianCache:
    """The Hessian sum of one shard's last step, by original feature id, for the squared
    loss, where it depends on the rows alone (f'' = 1): H_S = sum_i [a_iS, 1] [a_iS, 1]^T.
    A later step on S' takes the entries on S' and S from it and forms only the rows and
    columns of the coordinates new to S' (``support_hessian_rows``). Serial DDSS keeps one
    (Dis-DDSS workers reduce only the new rows instead: ``ReducedHessian``). Dis-DDSS on
    CTR 200,000 x 100,000 at 1e-3 lam_max when its workers kept one: a step's S differed
    from the previous one's by a few coordinates, and forming H_S took 0.20 s of a 0.45 s
    step on each of 2 workers."""

    REUSE_SHARE = 0.5     # form anew when more than this share of S' is new

    def __init__(self):
        self.ids, self.intercept, self.hessian = None, None, None

    def keep(self, ids, intercept, hessian):
        self.ids, self.intercept, self.hessian = np.asarray(ids), bool(intercept), hessian

    def extended(self, ids, intercept, args):
        """H on ``ids`` from the kept one plus the new coordinates' rows and columns
        (``args``: those of ``support_hessian_sums`` for S'), or None when nothing is kept,
        the intercept differs or too much of S' is new."""
        old = reusable_positions(self.ids, self.intercept, ids, intercept, self.REUSE_SHARE)
        if old is None:
            return None
        fresh = np.flatnonzero(old < 0)
        hessian = kept_entries(self.hessian, np.append(old, self.ids.shape[0]) if intercept
                               else old)
        return place_rows(hessian, fresh, support_hessian_rows(*args, fresh))


class ReducedHessian:
    """The Hessian sum a Dis-DDSS step last reduced from the workers' shares, by original
    feature id, for the squared loss, where it depends on the rows alone (f'' = 1), so a
    later step on S' finds the entries on S' and S unchanged: every rank keeps S's ids,
    the server the sum. When at most REUSE_SHARE of S' is new (``fresh``: the same
    answer on every rank), each worker reduces only its share's rows of the new
    coordinates N, |N| (|S'| + 1) numbers where the upper triangle is (|S'| + 1)(|S'| +
    2) / 2, and the server fills in the rest from the kept sum (``assemble``). Dis-DDSS
    on CTR 200,000 x 100,000 at 1e-3 lam_max: a step that certified no gap left 1-2 of
    the solution's coordinates at zero in 3 runs of 4 (``StallWatch.should_chain``), and
    the chained step on the same S plus those reduced the whole 4.2 MB share from every
    worker again."""

    REUSE_SHARE = HessianCache.REUSE_SHARE

    def __init__(self):
        self.ids, self.intercept, self.hessian = None, None, None

    def fresh(self, ids, intercept):
        """(the positions in S' of its coordinates new since the kept sum, the kept sum's
        positions of the others by their position in S', -1 at the new ones, the
        intercept's last), or None when the whole upper triangle is to be reduced."""
        old = reusable_positions(self.ids, self.intercept, np.asarray(ids, dtype=np.int64),
                                 intercept, self.REUSE_SHARE)
        if old is None:
            return None
        fresh = np.flatnonzero(old < 0)
        if intercept:
            old = np.append(old, self.ids.shape[0])
        return fresh, old

    def assemble(self, plan, rows):
        """The server's sum on S' from ``plan`` (``fresh``'s) and ``rows``, the summed
        shares' rows of the new coordinates (|N| x (|S'| + 1), flat). The kept sum may
        hold only its lower triangle (``lower_from_upper_triangle``): it is completed
        first, as S' need not list the kept coordinates in the same order."""
        fresh, old = plan
        return place_rows(kept_entries(symmetric_from_lower(self.hessian), old), fresh,
                          rows.reshape(fresh.shape[0], old.shape[0]))

    def keep(self, ids, intercept, hessian=None):
        """After a step's reduction on S' = ``ids``: the server passes the sum."""
        self.ids = np.asarray(ids, dtype=np.int64)
        self.intercept, self.hessian = bool(intercept), hessian


class SupportRows:
    """What a step needs from one shard's rows (an ActiveSet: all rows on one process, a
    worker's under MPI) at the margins z, for S = ``support``: the sum of its Hessian on S
    (formed once: at most MAX_SUPPORT + 1 rows), products with it, and the losses at
    candidate points. Vectors over S carry the intercept last when it is fitted.
    ``slope``: sum_i f'(z_i) [a_iS, 1] over these rows (``shard_slope``); ``cache``: a
    HessianCache of this shard's previous step (squared loss); ``n_threads``: the threads
    that form the Hessian (``parallel_hessian_triangle``)."""

    def __init__(self, active, code, z, support, intercept, slope, cache=None, n_threads=1):
        self.active, self.code, self.z, self.slope = active, code, z, slope
        self.n_threads = n_threads
        self.position = np.full(active.n_features, -1, dtype=np.int64)
        self.position[support] = np.arange(support.shape[0])
        self.size, self.intercept = support.shape[0], bool(intercept)
        self.cache = cache if code == SQUARED else None
        self.ids = None if self.cache is None else active.features[support]
        self._hessian = None
        self._restricted = None

    def _kernel_args(self):
        active = self.active
        return (active.indptr, active.indices, active.data, self.position, self.code,
                self.z, active.y, self.size, self.intercept)

    def hessian_sums(self):
        """sum_i f''(z_i) [a_iS, 1] [a_iS, 1]^T (``support_hessian_sums``), formed on the
        first call; with a cache, what it holds of it is reused
        (``HessianCache.extended``)."""
        if self._hessian is None:
            args = self._kernel_args()
            self._hessian = None if self.cache is None else \
                self.cache.extended(self.ids, self.intercept, args)
            if self._hessian is None:
                self._hessian = support_hessian_sums(*args, self.n_threads)
            if self.cache is not None:
                self.cache.keep(self.ids, self.intercept, self._hessian)
        return self._hessian

    def hessian_triangle(self):
        """The Hessian sum's ``upper_triangle``, formed packed from the rows (the square
        matrix is neither formed nor kept): what a Dis-DDSS worker reduces."""
        return parallel_hessian_triangle(*self._kernel_args(), self.n_threads)

    def hessian_rows(self, fresh):
        """The Hessian sum's rows at the positions ``fresh`` (``support_hessian_rows``),
        from the rows: what a Dis-DDSS worker reduces for ``ReducedHessian``."""
        return support_hessian_rows(*self._kernel_args(), np.asarray(fresh, np.int64))

    def hessian_times(self, v):
        """The Hessian sum times v. A worker forms its share once and answers each of the
        server's CG products with a dense product: CTR 200,000 x 100,000, |S| = 1,700, a
        worker's 100,000 rows, 0.15 s to form and ~1.8 ms a product, against 9-10 ms a
        product from the rows (a pass over them)."""
        return symmetric_times(self.hessian_sums(), v)

    def restricted(self):
        """These rows restricted to S with their f'' (``restricted_rows``), formed on the
        first call: what products from the rows read."""
        if self._restricted is None:
            active = self.active
            self._restricted = restricted_rows(active.indptr, active.indices, active.data,
                                               self.position, self.code, self.z,
                                               active.y)
        return self._restricted

    def hessian_times_from_rows(self, v):
        """The Hessian sum times v in a pass over the rows restricted to S, with no
        Hessian formed (``restricted_hessian_times``): for supports whose Hessian would
        be too large to form. CTR 200,000 x 100,000, groups of 5, |S| ~3,600, a worker's
        100,000 rows: 2.3 million entries in S, restricted in 20-25 ms, then ~4 ms a
        product (int32 positions; 4.9 ms with int64), where the dense share would be
        ~100 MB."""
        return restricted_hessian_times(*self.restricted(), np.asarray(v, np.float64),
                                        self.size, self.intercept)

    def hessian_diagonal(self):
        """The diagonal of the Hessian sum (CG's preconditioner)."""
        return np.diag(self.hessian_sums()).copy()

    def hessian_block(self, positions):
        """The Hessian sum's upper triangle on ``positions`` (``upper_triangle``), the
        block of CG's preconditioner (``preconditioner_coordinates``)."""
        return upper_triangle(self.hessian_sums()[np.ix_(positions, positions)])

    def trial_sums(self, point, candidates):
        """The loss sums at every candidate, then at ``point`` itself (the last entry).

        Squared loss: ``quadratic_trial_sums`` with the Hessian sum the step has formed,
        so no pass over the rows at all: CTR 200,000 x 100,000, |S| ~1,100, 2 workers,
        0.10 s a step with ``candidate_loss_sums``; where the step formed no Hessian (its
        products came from the rows), m^T H m from the rows restricted to S
        (``restricted_curvatures``). Logistic loss: ``candidate_loss_sums``."""
        active = self.active
        moves = trial_moves(point, candidates)
        if self.code != SQUARED:
            return candidate_loss_sums(active.indptr, active.indices, active.data,
                                       self.position, self.code, self.z, active.y, moves,
                                       self.size, self.intercept)
        at_point = mean_loss(self.code, self.z, active.y) * self.z.shape[0]
        if self._hessian is None and self._restricted is not None:
            curvatures = restricted_curvatures(*self._restricted, moves, self.size,
                                               self.intercept)
            return quadratic_model_sums(at_point, self.slope, moves, curvatures)
        return quadratic_trial_sums(at_point, self.slope, self.hessian_sums(), moves)


def trial_moves(point, candidates):
    """The moves m = candidate - point, one row each, then a zero row (the point's own):
    what ``SupportRows.trial_sums`` and ``quadratic_trial_sums`` sum the losses at."""
    return np.vstack([candidates - point, np.zeros((1, point.shape[0]))])


def quadratic_trial_sums(loss_sum, slope, hessian, moves):
    """sum_i f(z_i + [a_iS, 1]^T m) = sum_i f(z_i) + g^T m + m^T H m / 2 for each row m
    of ``moves`` (``trial_moves``): exact for the squared loss (f'' = 1), ``loss_sum`` =
    sum_i f(z_i), g = ``slope`` (``shard_slope``) and H = ``hessian`` the sums over the
    same rows, read from its lower triangle (``symmetric_times``). Dis-DDSS's server
    takes them from the reduced sums (no round of the workers' trial losses)."""
    return quadratic_model_sums(loss_sum, slope, moves, np.array(
        [move @ symmetric_times(hessian, move) for move in moves]))


def quadratic_model_sums(loss_sum, slope, moves, curvatures):
    """``quadratic_trial_sums`` from the curvatures m^T H m of the rows m of ``moves``,
    however they were summed."""
    return loss_sum + moves @ slope + 0.5 * curvatures


def upper_triangle(matrix):
    """The upper triangle of a square matrix, column by column: entry (i, j), i <= j,
    at j (j + 1) / 2 + i (LAPACK's packed "U" order; what a worker reduces of its
    Hessian share, ``support_hessian_triangle``); ``from_upper_triangle`` inverts it for
    a symmetric one. A slice copy per column."""
    dim = matrix.shape[0]
    out = np.empty(dim * (dim + 1) // 2, dtype=matrix.dtype)
    for j in range(dim):
        out[j * (j + 1) // 2:(j + 1) * (j + 2) // 2] = matrix[:j + 1, j]
    return out


def lower_from_upper_triangle(values, dim, out=None):
    """The lower triangle of the symmetric dim x dim matrix whose ``upper_triangle`` is
    ``values`` (into ``out`` when given), the entries above the diagonal left unwritten:
    column j's piece of the packed triangle is row j's first j + 1 entries, one
    contiguous copy each, where ``from_upper_triangle`` also writes each column across
    the rows: |S| = 1,218 / 1,900, into mapped memory, 0.65 / 1.45 ms against 1.86 /
    3.75 ms, and about 78% of the pages at 1,500. What the Dis-DDSS server's step reads
    of its summed Hessian (``dense_move``, ``symmetric_times``)."""
    matrix = np.empty((dim, dim)) if out is None else out
    for j in range(dim):
        matrix[j, :j + 1] = values[j * (j + 1) // 2:(j + 1) * (j + 2) // 2]
    return matrix


def from_upper_triangle(values, dim, out=None):
    """The symmetric dim x dim matrix whose ``upper_triangle`` is ``values`` (into
    ``out`` when given): each column's piece copied into the column and the row (|S| =
    1,070: 1.1-1.4 ms against 4.4-8 ms with ``np.triu_indices`` and a transposed sum, 41
    ms on the server of mpirun -n 3 on 2 cores)."""
    matrix = np.empty((dim, dim)) if out is None else out
    for j in range(dim):
        piece = values[j * (j + 1) // 2:(j + 1) * (j + 2) // 2]
        matrix[j, :j + 1] = piece
        matrix[:j + 1, j] = piece
    return matrix


def uses_hessian_free(support_size):
    """Whether the step finds its direction with Hessian-vector products alone
    (``hessian_free_direction``), not also from the Hessian's orthant path
    (``orthant_newton_target``), and under MPI across machines with products the workers
    answer (``solvers.mpi.cg_products_from_shares``): by bytes. The Hessian is
    (|S| + 1)(|S| + 2) / 2 numbers from every worker, a product 2 (|S| + 1) (v out, H v
    back), so products win once |S| + 2 > 4 MIN_PRODUCTS (and ``product_budget`` then
    allows the products that cost as much as the Hessian). On one process the Hessian is
    formed anyway: no bytes to save."""
    return support_size + 2 > 4 * MIN_PRODUCTS


def product_budget(dim):
    """Hessian-vector products one step may take: as many as cost the bytes of the
    Hessian's upper triangle under MPI ((dim + 1) / 4 products of 2 dim numbers for
    dim (dim + 1) / 2 numbers), at least MIN_PRODUCTS. CG needs ~30-60 products a
    solve on CTR's supports of 1,700, ~300 on a9a degree 2's nearly equal columns
    (where ``uses_hessian_free`` keeps the Hessian under MPI: |S| ~ 50-200)."""
    return max(MIN_PRODUCTS, (dim + 1) // 4)


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

    With the diagonal alone (Jacobi), the scaled Hessian of CTR 200,000 x 100,000 on the
    Lasso's support has one eigenvalue far above the rest, the intercept's direction
    (the sum of the columns: 10.1 at 1e-3 lam_max, 18.9 at 1e-4, the others within
    0.01-1.2), and its most frequent features are coupled with it and with each other.
    CG to CG_TOLERANCE took 21 products at 1e-3 (|S| = 1,010) and 27 at 1e-4 (1,692);
    inverting the block of the intercept and the 10 / 50 / 100 / 400 most frequent
    features, 14 / 12 / 12 / 11 and 17 / 14 / 14 / 13. Whole steps (every piece of
    ``hessian_free_direction``, at the states of serial runs, seeds 0-2): 20-74 products
    at 1e-3 and 61-140 at 1e-4 with the diagonal, 12-46 and 32-73 with the block of 50
    (35-50% fewer; 20 / 100 / 200 coordinates: within 10% of 50), the same direction.
    Under MPI the block costs one reduction of 1,326 numbers per step, about one product.
    a9a degree 3 (serial, 1e-2 lam_max): supports of 48-51 (L1 logistic), 72-101 products
    with the diagonal, 2-9 with the block, which then holds all of S; supports of 89-263
    (both losses) spend the budget of 100 either way (nearly equal columns)."""
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
                           signs=None, block=None, penalty=None):
    """The projected Newton direction from Hessian-vector products (truncated Newton with
    the projection of Bertsekas' two-metric method and OWL-QN's orthant): ``drop``'s
    coordinates move to zero (d_j = -x_j), the others solve (H_FF + ridge I) d_F = -(g + H
    d_fixed)_F by preconditioned CG (``block_preconditioner``: the diagonal and ``block`` =
    (positions, H on them), ``preconditioner_coordinates``); the penalized ones that the
    full step takes across zero are then fixed at zero too, and the rest solved again; once
    none crosses, the fixed ones whose model gradient points back into x's orthant are
    freed and solved again (at most CG_PIECES solves, each warm-started, and product_budget
    products in all). Fixing every crossing coordinate at once, without the freeing, left
    CTR 200,000 x 100,000 (1e-4 lam_max, 2 workers) at a gap of 1.1e-4 after the step,
    where the Hessian's path, which fixes them one at a time, reached 1e-12; with it the
    step reaches 1e-12 too. On a9a degree 2 (logistic) 6 solves ended 7% short of the
    path's model decrease, 20 at the path's end point. ``hessian_times(v)`` = H v,
    ``diagonal`` = diag(H) (H the scaled Hessian of ``orthant_newton_target``; the ridge is
    the same, RIDGE times the mean of the diagonal). ``signs``: the orthant of the first
    n_penalized coordinates (``orthant``): one that the step takes to the other side
    crosses.

    ``penalty`` (lam w over those coordinates, in the gradient's scale): where some
    non-zeros that the direction takes to zero have their model minimum along their own
    axis on the other side of zero (with s_j the smooth part of g_j: sigma_j s_j >
    lam w_j and |x_j| < (sigma_j s_j - lam w_j) / H_jj), the direction is solved again,
    warm-started, with them in the other orthant (sigma_j and the penalty's term in g_j
    flipped), and the one whose full projected step has the lower model value (the
    quadratic model plus the exact change of the penalty, a product each) is returned. The step can then take a coordinate through zero to its
    new sign. Dis-DDSS on CTR 200,000 x 100,000 at 1e-3 lam_max, 2 workers: the
    asynchronous epochs left 5 popular features (ids 2-40) with the wrong sign, and the
    step within x's orthant ended at a gap of 1.5e-2 with 1,005 of the solution's 1,010
    non-zeros; a second step, an epoch later, certified. Neither rule alone holds: the
    axis test ignores the coupling (a Lasso solution with its largest coefficient zeroed
    flips a coordinate that keeps its sign once that one is back), and flipping the
    coordinates that CG fixed at zero and whose model gradient then points to the other
    side turned 15 right signs on CTR (an intermediate solve had fixed them).

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
            point[:n_penalized] + direction[:n_penalized] == 0.0))
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
    penalty term in it), warm-started from the direction ``start`` when given: (d,
    products). The second solve, with some signs flipped, took 72-146 products from zero
    (CTR 200,000 x 100,000, |S| 1,055-1,847, the first 81-147)."""
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
    (change 0) when none lowers P. ``loss_sums``: ``SupportRows.trial_sums`` summed over
    the shards (the candidates', then the point's). Only S's penalty changes:
    lam sum w |candidate_S|, or for groups (``starts``: group k of S holds its coordinates
    starts[k]:starts[k+1], ``weights_S`` per group) lam sum w_k ||candidate_k||.
    ``offset``: P(x) - P(point) when the point is not x itself (``pruned_coordinates``),
    so that a candidate is taken only below P(x)."""
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


def entering_limit(support_size):
    """How many zeros of x may enter S with ``entering_coordinates``: ENTERING_SHARE of
    |S|, at least ENTERING_MIN, and no more than MAX_SUPPORT - |S|."""
    return int(max(0, min(max(ENTERING_MIN, np.ceil(ENTERING_SHARE * support_size)),
                          MAX_SUPPORT - support_size)))


def violating_zeros(x, correlation, n, lam, weights, block_indptr=None, level=1.0):
    """(the zeros j of x with |A_j^T rho| > level n lam w_j, the ratio |A_j^T rho| /
    (n lam w_j) of every coordinate); for a group penalty (``block_indptr``, ``weights``
    per group), the zero groups g with ||A_g^T rho|| > level n lam w_g and the ratio of
    every group. level 1: the zeros that violate the optimality condition."""
    if block_indptr is None:
        magnitude, zero = np.abs(correlation), x == 0
    else:
        magnitude = contiguous_block_norms(correlation, block_indptr)
        zero = contiguous_block_norms(x, block_indptr) == 0.0
    ratio = magnitude / (n * lam * np.asarray(weights, np.float64))
    return np.flatnonzero(zero & (ratio > level)), ratio


def entering_coordinates(x, correlation, n, lam, weights, limit, column_sq=None):
    """The zeros of x that violate the optimality condition |A_j^T rho| <= n lam w_j, or
    come within 10% of violating it (ENTERING_LEVEL), the ``limit`` largest by
    |A_j^T rho| / (n lam w_j), each with the sign it would enter with, sign(A_j^T rho):
    coded as (j + 1) sign (float64, by j) so that one broadcast carries both. A step on
    the non-zeros of x alone cannot certify while such a coordinate is missing: Dis-DDSS
    on CTR 200,000 x 100,000 at 1e-4 lam_max, 2 workers, steps at epochs 6-8 ended with
    1,683-1,691 non-zeros of the solution's 1,692 and gaps of 2e-3 to 2e-2, and needed a
    second step after more epochs. Those close below: at 1e-3 lam_max, steps ended at
    5.6e-4 without feature 22 (its |A_j^T rho| 0.979-0.9993 of the bound, its value in
    the solution -3.6e-5) and a second step certified, in 4 of 8 runs on 1 and 2
    workers with a level of 0.99, in none of 8 with 0.9.

    Given ``column_sq`` (||A_:j||^2; the squared loss where the step sums the Hessian),
    the ``popular_zeros`` enter too, whatever their |A_j^T rho|, with the sign of A_j^T
    rho (+1 at 0). Most stay at zero: the projected direction holds a zero whose
    gradient points out of its orthant, and the move's second solve
    (``_with_violating_zeros``) lets in those that violate at its end, which it can tell
    only for coordinates of S. On CTR 200,000 x 100,000 at 1e-3 lam_max, 2 workers, the
    step at the third epoch left 1-3 of the most frequent features at zero (at 0.07-0.88
    of the bound before it, non-zero in the solution) and a chained step followed in 5
    of 8 runs; with them, in none of 8 (solve 0.249 -> 0.209 s, median of 8 paired).
    S stays within MAX_SUPPORT: the largest columns' zeros first.
    The logistic loss keeps without: on a9a degree 3 (Dis-DDSS, 3 seeds) its first step
    then failed in 2 runs and the solves took 0.85x as long."""
    violating, ratio = violating_zeros(x, correlation, n, lam, weights,
                                       level=ENTERING_LEVEL)
    if violating.shape[0] > limit:
        violating = np.sort(violating[np.argpartition(-ratio[violating], limit - 1)[:limit]]) \
            if limit > 0 else violating[:0]
    if column_sq is not None:
        room = MAX_SUPPORT - int(np.count_nonzero(x)) - violating.shape[0]
        violating = np.union1d(violating, popular_zeros(x, column_sq, max(room, 0)))
    return (violating + 1.0) * np.where(correlation[violating] < 0.0, -1.0, 1.0)


def popular_zeros(x, column_sq, most=None):
    """The zeros of x among the POPULAR_SHARE |x's non-zeros| columns of the largest
    norm (``column_sq``: ||A_:j||^2), at most ``most`` of them (the largest columns'),
    sorted: the features that asynchronous epochs can leave at zero while the solution
    has them (``entering_coordinates``)."""
    count = min(int(np.ceil(POPULAR_SHARE * np.count_nonzero(x))), x.shape[0])
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    column_sq = np.asarray(column_sq)
    largest = np.argpartition(-column_sq, count - 1)[:count]
    zeros = largest[x[largest] == 0.0]
    if most is not None and zeros.shape[0] > most:
        zeros = zeros[np.argsort(-column_sq[zeros], kind="stable")[:most]]
    return np.sort(zeros)



def support_point(x, b, intercept, entering=None):
    """(S, the point [x_S, b], the orthant sigma over S): S the non-zeros of x, plus the
    coordinates of ``entering`` (``entering_coordinates``' code), which start at zero
    with their entering sign; b only when the intercept is fitted."""
    support = np.flatnonzero(x)
    if entering is not None and entering.shape[0]:
        joining = (np.abs(entering) - 1.0).astype(np.int64)
        support = np.union1d(support, joining)
        signs = np.sign(x[support])
        signs[np.searchsorted(support, joining)] = np.sign(entering)
    else:
        signs = np.sign(x[support])
    return support, (np.append(x[support], b) if intercept else x[support].copy()), signs


LINE, PROJECTED = 0, 1   # how a move's vector makes candidates (``move_candidates``)


def dense_move(hessian_sum, correlation_S, rho_sum, point, weights_S, lam, n, intercept,
               signs=None):
    """The move from the summed Hessian (``support_move`` with its products, diagonal
    and preconditioner block, and the orthant path where |S| allows it; ``hessian_sum``
    is read from its lower triangle, ``lower_from_upper_triangle``): (kind,
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
    the drop can cost more than the path gains. Serial DDSS on CTR 200,000 x 100,000 at
    1e-4 lam_max (no screening): at epochs 5-8 (|S| 2,873 -> 1,734, of which ~1,692 in
    the solution) the dropped coordinates raised the model by 3e-8 to 8e-2, more than
    the whole path's gain, so the path predicted nothing and no step was taken; the
    projected direction (60-110 products) took P - P* from 1e-7 to 1e-16 at epoch 7 and
    certified a gap of 1e-11. Coordinates entering S at zero (``signs``) move only in
    the projected direction; the path keeps them at zero.

    Above 398 coordinates (``uses_hessian_free``) the path is not formed: each of its
    pieces factors an |S|-square system (5 factorisations and 104 solves, 0.3-1.5 s at
    |S| = 1,030), and on CTR 200,000 x 100,000 (serial, seeds 0-1, 1e-3 and 1e-4
    lam_max) the projected direction won every time, with the same certified gap, in
    1.05-1.78 s a solve against 2.14-2.66 s."""
    k = correlation_S.shape[0]
    diagonal = np.diag(hessian_sum).copy()
    positions = preconditioner_coordinates(diagonal[:k], intercept)
    return support_move(lambda v: symmetric_times(hessian_sum, v), diagonal,
                        (positions, symmetric_submatrix(hessian_sum, positions)),
                        correlation_S, rho_sum, point, weights_S, lam, n, intercept, signs,
                        None if uses_hessian_free(k) else
                        symmetric_from_lower(hessian_sum.copy()))


def support_move(hessian_times, diagonal_sum, block_sum, correlation_S, rho_sum, point,
                 weights_S, lam, n, intercept, signs=None, hessian_sum=None):
    """``dense_move`` from the Hessian sum as products: ``hessian_times(v)`` = H_sum v
    (unscaled: summed over the rows, or over the workers' shares), ``diagonal_sum`` its
    diagonal, ``block_sum`` = (positions, H_sum on them), CG's preconditioner block
    (``preconditioner_coordinates``); ``hessian_sum`` the matrix itself where it is
    formed (the orthant path needs it; None: the projected direction only). Under MPI
    across machines the products are the workers' (``solvers.mpi``), so that the step
    is the same maths with or without the summed Hessian on the server; each model
    value of a candidate is one product."""
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
                                                  signs, block, lam * weights_S)
    if direction is not None:
        projected = model(projected_candidates(point, direction, k, ending)[0])
        if projected < best[2]:
            best = (PROJECTED, direction, projected, ending)
    for _ in range(ZERO_ROUNDS if best[0] is not None else 0):
        end = best[1] if best[0] == LINE else \
            projected_candidates(point, best[1], k, best[3])[0]
        further = _with_violating_zeros(times, diagonal, block, smooth, point, end,
                                        lam * weights_S, k)
        value = np.inf if further is None else model(further)
        if not value < best[2]:
            break
        best = (LINE, further, value,
                np.where(further[:k] != 0.0, np.sign(further[:k]), orthant_S))
    return best


def _with_violating_zeros(hessian_times, diagonal, block, smooth, point, end, penalty, k):
    """The end point of a second projected Newton solve from ``end`` (a move's full
    step) in which the zeros of ``end`` that violate the model's optimality condition,
    |s_j| > lam w_j with s = ``smooth`` + H (end - point) the smooth part of the model's
    gradient there, enter S's orthant with the sign -sign(s_j), the other zeros staying
    at zero; None when no zero violates. The orthant of a step's start has a coordinate
    that the asynchronous epochs left on the wrong side of zero (a popular feature
    whose solution value is small): the move takes it to zero and, where the flip of
    ``hessian_free_direction`` does not fire, leaves it there, and the step cannot
    certify. Dis-DDSS on CTR 200,000 x 100,000 at 1e-3 lam_max, 2 workers: 4 runs of 10
    (features 3, 5 and 7: x_j -0.0026 with A_j^T rho 2.5 n lam) then took a chained step
    (another certificate, the Hessian again and a second solve, 35-55 ms of a 0.26-0.31
    s solve at -n 3, 90 ms at -n 9); the Hessian on S is all this solve needs."""
    slope = smooth + hessian_times(end - point)
    at_zero = end[:k] == 0.0
    entering = at_zero & (np.abs(slope[:k]) > (1.0 + ZERO_SLACK) * penalty)
    if not np.any(entering):
        return None
    signs = np.sign(end[:k])
    signs[entering] = -np.sign(slope[:k][entering])
    gradient = slope.copy()
    gradient[:k] += penalty * signs
    drop = np.zeros(end.shape[0], dtype=bool)
    drop[:k] = at_zero & ~entering
    direction, _, ending = hessian_free_direction(hessian_times, diagonal, gradient, end, k,
                                                  drop, signs, block, penalty)
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


class StallWatch:
    """When to try the step: after an epoch that cut the certified gap by less than
    1 / STALL_RATIO (or, given the goal, that left it more than TRY_EPOCHS epochs from
    it), that changed at most SUPPORT_CHURN |S| of x's firm support S (``firm_support``;
    the backends count the changes and pass |S|), or PRUNED_CHURN |S| where the step
    would first prune x (``prunes_for_step``), with 1 <= |S| <= ``max_support`` (default
    MAX_SUPPORT; the group step: group_newton.HESSIAN_FREE_MAX_SUPPORT). After a try
    that did not cut the gap to STALL_RATIO times what it was, the next try waits 2, 4,
    8... epochs (each try costs a pass over the data and a Hessian over S or up to
    ``product_budget`` products with it, under MPI sums from every worker).

    SUPPORT_CHURN is 0.2 since 2026-11-26 (0.05 before): the step now comes while x
    still sheds its last extra non-zeros, 10-15% of its firm support an epoch, and
    certifies from there. Dis-DDSS on CTR 200,000 x 100,000 (2-core VM, seeds 1-6,
    median paired ratios of the solve against 0.05): at 1e-3 lam_max the step at the
    third epoch instead of the fifth, -n 2 / 3 / 9 1.15 / 1.10 / 1.13; at 1e-4 lam_max
    -n 3 0.95 (one epoch earlier, on a larger S). At -n 3 half the early steps leave 1-3
    of the solution's coordinates at zero and a chained step follows. Serial DDSS (seeds
    0-2): CTR 1e-3 5 -> 3 epochs, 1e-4 7-8 -> 7; a9a degree 3 (1e-2 lam_max) Lasso 11-12
    -> 8, logistic 9 -> 7-9; degree 2 Lasso 7 -> 6, logistic 8-9 -> 7, the seconds'
    ranges overlapping or lower (benchmarks/README.md, "The Newton step at 20% support
    churn").

    It also serves asynchronous runs whose support shrinks slowly: Dis-DDSS with 8
    workers on 16 cores (CTR at 1e-3 lam_max) kept 1,300-1,550 non-zeros (the solution
    has 1,010) for 6-9 epochs, 90-140 of them changing each epoch, while the gap crawled
    from 0.11 to 0.07; at 0.05 the step came at epochs 4-11 and then certified 1e-11 at
    once. Until this change a patience rule served them (a try after 4 such epochs in a
    row with up to 10% changes: median solve 0.37 -> 0.26 s on 16 cores).

    Where the step prunes x the limit stays at 0.05: Dis-DDSS with 2 workers on CTR at
    1e-4 lam_max tried at 2,268 non-zeros with 12% of the firm support changing and left
    the gap where it was (0.24 s); earlier, with 450-750 changes an epoch on 2,200-4,600
    non-zeros, a try failed in 4 runs of 4 and the bytes of a run rose from 64-69 MB to
    95-99 MB (above 0.3 of Dis-ProxASVRG's).

    Serial DDSS to 1e-6, two seeds each (2-core AMD EPYC), with SUPPORT_CHURN 0.02 / 0.05
    / 0.1: a9a degree 3 Lasso 35-38 / 23-24 / 18 epochs, logistic 18-26 / 17-20 / 14-16;
    CTR 200,000 x 100,000 at 1e-4 lam_max 9-11 / 9-11 / 9 and 13 (a failed try at epoch
    8). Without the churn rule the step was tried on CTR while the support still moved by
    thousands (|S| ~4,000, 2-4 s a try)."""

    def __init__(self, max_support=None):
        self.max_support = MAX_SUPPORT if max_support is None else int(max_support)
        self.previous_gap = None
        self.wait_until = 0
        self.backoff = 1
        self.chained = 0

    def should_try(self, epoch, gap, support_size, support_changes, goal=None,
                   pruned=False):
        """``support_changes``: coordinates that entered or left x's firm support in the
        last epoch (None when unknown). ``goal``: the gap the run stops at; with it an
        epoch also counts as slow when, at its rate, more than TRY_EPOCHS epochs would
        still be needed to reach the goal (Dis-DDSS on CTR 200,000 x 100,000 at 1e-4
        lam_max, 2 workers: the firm support settled at epoch 12, the gap then fell 3-5x
        an epoch from 7e-3, and the step waited for the first stall at epoch 14).
        ``pruned``: whether the step would prune x (``pruned_coordinates``: more than
        MAX_SUPPORT non-zeros, or a group penalty)."""
        stalled = False
        if self.previous_gap is not None and gap > 0.0:
            rate = gap / self.previous_gap
            stalled = rate > STALL_RATIO
            if goal is not None and 0.0 < goal < gap and not stalled:
                stalled = np.log(gap / goal) > TRY_EPOCHS * -np.log(rate)
        self.previous_gap = gap
        settled = support_changes is not None and \
            support_changes <= (PRUNED_CHURN if pruned else SUPPORT_CHURN) * support_size
        return stalled and settled and 1 <= support_size <= self.max_support and \
            epoch >= self.wait_until

    def should_chain(self, t, violating):
        """After a step, whether to take another at once, before any epoch: when the step
        was full (t = 1: it landed on the model's minimum over S's orthant, for the
        squared loss that of P) and zeros of x now ``violating`` the optimality
        condition keep the gap up, the next step lets them enter; at most CHAIN_STEPS in
        a row. Dis-DDSS on CTR 200,000 x 100,000 at 1e-3 lam_max: 3 of 4 runs' first
        steps took t = 1 and left 1-2 of the solution's 1,010 coordinates at zero (x on
        S optimal to 2e-10, gaps 3e-4 to 8e-3); the second step, 1-2 epochs later,
        certified 1e-13."""
        if t == 1.0 and violating and self.chained < CHAIN_STEPS:
            self.chained += 1
            return True
        self.chained = 0
        return False

    def tried(self, epoch, gap_before, gap_after):
        if gap_after <= STALL_RATIO * gap_before:
            self.backoff = 1
        else:
            self.backoff *= 2
            self.wait_until = epoch + self.backoff
        self.previous_gap = gap_after


def pruned_coordinates(x, firm, always=False):
    """The non-zeros of x outside its firm support (``firm_support``), to be set to zero
    before the step, when x has more than MAX_SUPPORT non-zeros (else none): StallWatch
    judges |S| by the firm support, and asynchronous steps can leave thousands of small
    non-zeros behind it (Dis-DDSS on CTR 200,000 x 100,000 at 1e-4 lam_max, 2 workers on
    a busy machine: 4,000-5,000 non-zeros, a firm support that did not change for 10
    epochs, and no step for 27 epochs). The step then starts from the pruned x and its
    candidates are compared with P of the unpruned one. ``always``: whatever the count
    (the group step, whose model needs the Hessian on every coordinate of S, where the L1
    step drops its settled zeros inside the model: Dis-DDSS on a9a degree 2, groups of 5,
    took its step with 1,319-1,535 non-zeros of x for a firm support of ~330, and reduced
    7-10 MB of Hessian from each worker)."""
    if not prunes_for_step(x, always):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((x != 0) & ~firm)


def prunes_for_step(x, always=False):
    """Whether a step from x sets the non-zeros outside its firm support to zero first
    (``pruned_coordinates``): x has more than MAX_SUPPORT non-zeros, or ``always``."""
    return bool(always) or int(np.count_nonzero(x)) > MAX_SUPPORT


def prune_for_step(active, cert, x, block_indptr=None):
    """The start of a step on one process: x with ``pruned_coordinates`` set to zero (in
    place; ``block_indptr`` for a group penalty's firm support, pruned whatever its
    size). Returns (pruned, their values, P(x) - P(pruned x), the certificate at the
    pruned x)."""
    problem = active.problem
    pruned = pruned_coordinates(x, firm_support(x, cert.correlation, problem.n_samples,
                                                problem.lam, active.weights, block_indptr),
                                always=block_indptr is not None)
    saved, offset = x[pruned].copy(), 0.0
    if pruned.shape[0]:
        x[pruned] = 0.0
        unpruned, cert = cert, active.certificate(x, cert.intercept)
        offset = unpruned.primal - cert.primal
    return pruned, saved, offset, cert


def support_newton_step(active, cert, x, cache=None, n_threads=1):
    """The step on one process (serial and threads backends): ``cert`` is the certificate
    at (x, cert.intercept) on ``active`` (an ActiveSet with an L1 penalty); ``cache``: the
    run's HessianCache; ``n_threads``: the threads that form the Hessian. Moves x in
    place and returns (b, t), or returns None (x untouched) when no trial lowers P."""
    problem = active.problem
    n, lam, code = problem.n_samples, problem.lam, problem.loss.code
    intercept = problem.fit_intercept
    pruned, saved, offset, cert = prune_for_step(active, cert, x)
    nonzeros = int(np.count_nonzero(x))
    entering = entering_coordinates(x, cert.correlation, n, lam, active.weights,
                                    entering_limit(nonzeros),
                                    active.column_sq_norms if code == SQUARED else None)
    support, point, signs = support_point(x, cert.intercept, intercept, entering)
    k = support.shape[0]
    weights = active.weights[support]
    rows = SupportRows(active, code, cert.z, support, intercept,
                       shard_slope(cert.correlation[support], float(np.sum(cert.rho)),
                                   intercept), cache, n_threads)
    kind, vector, _, signs = dense_move(rows.hessian_sums(), cert.correlation[support],
                                        float(np.sum(cert.rho)), point, weights, lam, n,
                                        intercept, signs)
    index = -1
    if kind is not None:
        candidates = move_candidates(kind, vector, point, k, signs)
        index, _ = best_candidate(rows.trial_sums(point, candidates), n, lam, weights,
                                  point[:k], candidates[:, :k], offset)
    if index < 0:
        x[pruned] = saved
        return None
    return take_candidate(x, cert.intercept, support, candidates[index], intercept), \
        float(STEP_GRID[index])
