"""The support Newton step: a second-order move on the non-zero coordinates of x, taken
between DDSS epochs when the gap stalls (L1 penalties; every backend).

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
end point lowers P by exactly -q; for the logistic loss it is a model. The step taken is
x + t (target - x) for the t of STEP_GRID with the smallest exact P (``trial_loss_sums``:
one pass over the margins per t), when that P is lower than P(x).

Any x is a valid iterate: the gap and the screening are computed at whatever x the step
leaves, so the step changes how fast DDSS converges, never what it certifies.
"""
import numpy as np
from numba import njit

from .losses import loss_second_derivative, loss_value

MAX_SUPPORT = 500        # |S| above which the step is not tried ((|S| + 1)^2 / 2 sums)
STEP_GRID = 2.0 ** -np.arange(7)   # 1, 1/2, ..., 1/64
TRIALS = np.append(STEP_GRID, 0.0)  # and x itself
STALL_RATIO = 0.5        # try the step after an epoch that cut the gap by less than 2x
RIDGE = 1e-10            # relative ridge on the Hessian (exactly equal columns)


@njit(cache=True)
def support_hessian_sums(indptr, indices, data, position, code, z, y, size, intercept):
    """sum_i f''(z_i) [a_iS, 1] [a_iS, 1]^T as a dense (size + intercept) square matrix:
    ``position[j]`` is feature j's index in S (-1 when j is not in S). One pass over the
    rows, (entries of the row in S)^2 work per row."""
    dim = size + 1 if intercept else size
    out = np.zeros((dim, dim))
    where = np.empty(size, dtype=np.int64)
    value = np.empty(size)
    for i in range(indptr.shape[0] - 1):
        weight = loss_second_derivative(code, z[i], y[i])
        m = 0
        for k in range(indptr[i], indptr[i + 1]):
            q = position[indices[k]]
            if q >= 0:
                where[m] = q
                value[m] = data[k]
                m += 1
        for a in range(m):
            va = weight * value[a]
            for c in range(m):
                out[where[a], where[c]] += va * value[c]
            if intercept:
                out[where[a], size] += va
                out[size, where[a]] += va
        if intercept:
            out[size, size] += weight
    return out


@njit(cache=True)
def trial_loss_sums(code, z, dz, y, steps):
    """sum_i f(z_i + t dz_i) for every t of ``steps``."""
    out = np.zeros(steps.shape[0])
    for s in range(steps.shape[0]):
        total = 0.0
        for i in range(z.shape[0]):
            total += loss_value(code, z[i] + steps[s] * dz[i], y[i])
        out[s] = total
    return out


def support_gradient(correlation_S, rho_sum, x_S, weights_S, lam, n, intercept):
    """g = [-(A_S^T rho) / n + lam w sigma, -sum(rho) / n] (the intercept's entry only when
    it is fitted)."""
    grad = -np.asarray(correlation_S, np.float64) / n + lam * weights_S * np.sign(x_S)
    return np.append(grad, -rho_sum / n) if intercept else grad


def orthant_newton_target(hessian, gradient, point, n_penalized, max_pieces=64):
    """The end of the orthant-constrained Newton path of the quadratic model
    q(d) = g^T d + d^T H d / 2 from ``point`` (its first ``n_penalized`` entries the
    non-zero coordinates, which may reach zero but not cross it; any further entry, the
    intercept, is free). Returns (target, predicted change of the model, pieces)."""
    hessian = np.asarray(hessian, np.float64)
    start = np.asarray(point, np.float64)
    target = start.copy()
    grad = np.asarray(gradient, np.float64).copy()
    free = np.ones(start.shape[0], dtype=bool)
    pieces = 0
    for pieces in range(1, max_pieces + 1):
        idx = np.flatnonzero(free)
        if idx.shape[0] == 0:
            break
        block = hessian[np.ix_(idx, idx)]
        ridge = RIDGE * max(float(np.trace(block)) / idx.shape[0], 1e-300)
        try:
            direction = np.linalg.solve(block + ridge * np.eye(idx.shape[0]), -grad[idx])
        except np.linalg.LinAlgError:
            break
        descent = float(grad[idx] @ direction)
        if not descent < 0.0:
            break
        curvature = float(direction @ block @ direction)
        t_model = -descent / curvature if curvature > 0.0 else np.inf
        penalized = idx < n_penalized
        shrinking = penalized & (target[idx] * direction < 0.0)
        t_zero, first = np.inf, -1
        if np.any(shrinking):
            ratios = -target[idx][shrinking] / direction[shrinking]
            first = int(np.argmin(ratios))
            t_zero = float(ratios[first])
            first = int(idx[shrinking][first])
        t = min(t_model, t_zero)
        if not (np.isfinite(t) and t * descent + 0.5 * t * t * curvature < 0.0):
            break
        target[idx] += t * direction
        grad += t * (hessian[:, idx] @ direction)
        if t_zero <= t_model:
            target[first] = 0.0
            free[first] = False
        else:
            break
    change = target - start
    predicted = float(np.asarray(gradient) @ change + 0.5 * change @ hessian @ change)
    if not predicted < 0.0:       # rounding on a direction of (almost) no curvature
        return start.copy(), 0.0, pieces
    return target, predicted, pieces


def best_step(loss_sums, n, lam, weights_S, start_S, target_S):
    """(t, P(x + t (target - x)) - P(x)) for the trial t of STEP_GRID with the smallest
    exact P; ``loss_sums`` are ``trial_loss_sums`` over TRIALS (STEP_GRID, then 0: the
    loss at x itself). Only S's penalty changes: lam sum w |x_S + t (target_S - x_S)|."""
    current = loss_sums[-1] / n + lam * float(weights_S @ np.abs(start_S))
    best_t, best_change = 0.0, 0.0
    for s, t in enumerate(STEP_GRID):
        moved = start_S + t * (target_S - start_S)
        change = loss_sums[s] / n + lam * float(weights_S @ np.abs(moved)) - current
        if change < best_change:
            best_t, best_change = float(t), change
    return best_t, best_change


def stepped(start, target, t):
    """x + t (target - x), with target's zeros exact at t = 1 (the same arithmetic on
    every rank)."""
    return target.copy() if t == 1.0 else start + t * (target - start)


class StallWatch:
    """When to try the step: after an epoch that cut the certified gap by less than
    1 / STALL_RATIO, with 1 <= |S| <= MAX_SUPPORT. After a try that did not cut the gap
    to STALL_RATIO times what it was, the next try waits 2, 4, 8... epochs (each try costs
    a Hessian over S: a pass over the data, and under MPI (|S| + 1)^2 / 2 numbers from
    every worker)."""

    def __init__(self):
        self.previous_gap = None
        self.wait_until = 0
        self.backoff = 1

    def should_try(self, epoch, gap, support_size):
        stalled = self.previous_gap is not None and gap > STALL_RATIO * self.previous_gap
        self.previous_gap = gap
        return stalled and 1 <= support_size <= MAX_SUPPORT and epoch >= self.wait_until

    def tried(self, epoch, gap_before, gap_after):
        if gap_after <= STALL_RATIO * gap_before:
            self.backoff = 1
        else:
            self.backoff *= 2
            self.wait_until = epoch + self.backoff
        self.previous_gap = gap_after


def support_newton_step(active, cert, x):
    """The step on one process (serial and threads backends): ``cert`` is the certificate
    at (x, cert.intercept) on ``active`` (an ActiveSet with an L1 penalty). Returns
    (x, b, t) after the step, or None when no trial lowers P."""
    from .kernels.linalg import csr_margins
    problem = active.problem
    n, lam, code = problem.n_samples, problem.lam, problem.loss.code
    intercept = problem.fit_intercept
    support = np.flatnonzero(x)
    position = np.full(active.n_features, -1, dtype=np.int64)
    position[support] = np.arange(support.shape[0])
    hessian = support_hessian_sums(active.indptr, active.indices, active.data, position,
                                   code, cert.z, active.y, support.shape[0], intercept) / n
    weights = active.weights[support]
    start = x[support]
    gradient = support_gradient(cert.correlation[support], float(np.sum(cert.rho)), start,
                                weights, lam, n, intercept)
    point = np.append(start, cert.intercept) if intercept else start
    target, predicted, _ = orthant_newton_target(hessian, gradient, point, support.shape[0])
    if not predicted < 0.0:
        return None
    change = np.zeros(active.n_features)
    change[support] = target[:support.shape[0]] - start
    dz = csr_margins(active.indptr, active.indices, active.data, change,
                     float(target[-1] - point[-1]) if intercept else 0.0,
                     np.empty(active.y.shape[0]))
    sums = trial_loss_sums(code, cert.z, dz, active.y, TRIALS)
    t, _ = best_step(sums, n, lam, weights, start, target[:support.shape[0]])
    if t == 0.0:
        return None
    moved = stepped(point, target, t)
    new_x = x.copy()
    new_x[support] = moved[:support.shape[0]]
    return new_x, (float(moved[-1]) if intercept else cert.intercept), t
