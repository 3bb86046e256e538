"""The working-set step over the shards (Dis-DDSS's ``method="working_set"``, and
``method="auto"``'s choice beside the epochs).

Every rank runs its side (``server_step``, ``worker_step``) at the same point of the
outer loop, after the server's WORKING_SET control word. The server chooses the working
set W from the certificate (``bounded_working_set``: every non-zero and the zeros that
violate their optimality condition most, bounded) and broadcasts it; the workers reduce their
shares of the Gram matrix of B = [A_W, 1] (``reduce_support_hessian``: the squared
loss's Hessian, only the rows of the columns new to W once most of W was in the last
sum) and of B^T y; the server solves the subproblem on W by coordinate descent on the
Gram matrix with Anderson extrapolation (``kernels.working_set.gram_lasso_cd``) to
INNER_FRACTION of the outer gap.
The move reaches the workers with the next certificate's [b, x]: one reduction and two
broadcasts per step, whatever the number of passes. For the logistic loss, whose
Hessian moves with the margins, proximal Newton steps on W (``server_newton_step``):
per step the workers' Hessian, slope and loss sums, the server's direction, the
workers' losses along it. The L1 penalty only (``supports``). The elastic net's L2
term is the server's alone: the workers' sums are the loss's, and ``gram_lasso_cd`` /
``gram_newton_steps`` add the term from x (``l2``).
"""
import numpy as np

from ...kernels.linalg import csr_rmatvec
from ...kernels.working_set import gram_lasso_cd
from ...losses import generalized_residual, mean_loss
from ...newton.kernels import SupportRows, from_upper_triangle, shard_slope
from ..working_set import (ANDERSON, CHECK_EVERY, INNER_FRACTION, MAX_CD_PASSES,
                           MAX_INNER_EPOCHS, NEWTON_GRID, gram_newton_steps,
                           violation_scores, weighted_targets, working_set)
from ..choice import WORK
from .newton import reduce_support_hessian
from .protocol import server_vector

MAX_SIZE = 2048     # the Gram matrix's triangle: 2.1M numbers (17 MB) a worker


def supports(loss, penalty):
    """None where the distributed working-set step solves the problem, else the reason,
    one line."""
    if penalty.kernels == "l1":
        return None
    return ("method 'working_set' under mpirun solves the L1 penalty only; use method "
            "'ddss' for this problem")


class WorkerSums:
    """A worker's side of the step over its shard's rows, with A^T C y over them by
    original feature id (of ``n_original``; C the rows' sample weights, the identity
    without them), formed at the first step: it depends on the rows alone."""

    def __init__(self, n_original):
        self.n_original = n_original
        self.y_correlation = None

    def send(self, wire, active, z, code, features, support, intercept, reduced):
        """Reduce this shard's Gram matrix of C^(1/2) [A_W, 1] (margins ``z``, loss
        ``code``: the squared loss's Hessian does not depend on them) and
        [A_W^T C y, sum c y]."""
        weighted_y = weighted_targets(active)
        if self.y_correlation is None:
            self.y_correlation = np.zeros(self.n_original)
            self.y_correlation[features] = csr_rmatvec(
                active.indptr, active.indices, active.data, weighted_y, active.n_features)
        ids = features[support]
        rows = SupportRows(active, code, z, support, intercept, None)
        reduce_support_hessian(wire, rows, reduced, ids, intercept,
                               support.shape[0] + int(intercept))
        y_corr = self.y_correlation[ids]
        wire.reduce(np.append(y_corr, np.sum(weighted_y)) if intercept else y_corr)


def bounded_working_set(x, scores, last_size=None):
    """The serial step's working set (``solvers.working_set.working_set``), or where it
    holds more than MAX_SIZE blocks or twice ``last_size`` (None: no bound), that many
    blocks of largest score: after a prox-SVRG epoch x has many small non-zeros, and the
    Gram matrix costs |W|^2. The non-zeros left out stay as they are for the step (block
    coordinate descent over working sets: the outer certificate is the full problem's
    all the same)."""
    chosen = working_set(np.abs(x), scores)
    most = MAX_SIZE if last_size is None else min(MAX_SIZE, 2 * last_size)
    if chosen.shape[0] > most:
        chosen = np.sort(np.argsort(-scores, kind="stable")[:most])
    return chosen


def broadcast_working_set(wire, x, cert, n, lam, penalty, last_size):
    """The server's W (``bounded_working_set`` at the certificate's scores), positions
    on the active blocks, broadcast to the workers (``receive_working_set``)."""
    scores = violation_scores(x, cert.correlation, n, lam, penalty.weights,
                              penalty.indptr, penalty.positive)
    return server_vector(wire, bounded_working_set(x, scores, last_size).astype(
        np.float64)).astype(np.int64)


def receive_working_set(wire):
    """A worker's copy of the server's W (``broadcast_working_set``)."""
    return server_vector(wire, None).astype(np.int64)


def server_step(wire, x, b, cert, sums, n, lam, penalty, features, intercept, reduced,
                outer_gap, column_counts, n_workers, last_size=None):
    """The server's side: W chosen and broadcast, the sums reduced, the subproblem
    solved. ``sums``: the certificate's [sum c f, sum rho, sum rho^2 / c, sum y rho]
    over all rows (rho = C r, r = y - A x - b, c the sample weights); ``penalty`` on the
    active features, ``features`` their original ids, ``column_counts`` their entries
    over all shards; ``last_size``: the
    last set's size (``bounded_working_set``). Returns (x, b, passes,
    |W|, work: ``choice.WORK``'s units, every worker's scan of its rows and products
    sum_i m_i^2 (m_i: row i's entries in W, taken as even), and the server's passes,
    dim^2 each, once per worker, which waits for them), x updated in place."""
    weights = penalty.weights
    support = broadcast_working_set(wire, x, cert, n, lam, penalty, last_size)
    dim = support.shape[0] + int(intercept)
    gram = reduce_support_hessian(wire, None, reduced, features[support], intercept, dim)
    y_corr = wire.reduce(np.zeros(dim), root_blank=True)
    w = x[support].copy()
    corr = cert.correlation[support]
    if penalty.l2:      # B^T r: A^T rho, the L2 term taken out of the certificate's c
        corr = penalty.restricted(support).loss_correlation(corr, w, n * lam)
    if intercept:
        corr = np.append(corr, cert.rho_sum)
    db, passes, _ = gram_lasso_cd(
        np.ascontiguousarray(gram), corr, w, n * lam, weights[support], penalty.positive,
        penalty.l2, intercept, float(sums[2]), float(sums[3]), y_corr,
        INNER_FRACTION * n * outer_gap, MAX_INNER_EPOCHS, CHECK_EVERY, ANDERSON)
    x[support] = w
    entries = float(np.sum(column_counts[support]))
    work = WORK["read"] * (float(np.sum(column_counts)) + entries * entries / n) + \
        WORK["dense"] * float(passes) * dim * dim * n_workers
    return x, b + db, int(passes), int(support.shape[0]), work


def worker_step(wire, sums, active, z, code, features, intercept, reduced):
    """A worker's side of the step (``WorkerSums`` ``sums``): W from the server, then its
    shares reduced."""
    sums.send(wire, active, z, code, features, receive_working_set(wire), intercept,
              reduced)


def server_newton_step(wire, x, b, cert, n, lam, penalty, intercept, outer_gap,
                       column_counts, column_sq, lipschitz, n_workers, last_size=None,
                       weight_total=None):
    """The server's side for a loss whose Hessian depends on the margins (L1 logistic):
    proximal Newton steps on W (``bounded_working_set``) from the workers' shares of
    the Hessian, the slope and the losses (``working_set.gram_newton_steps``, with
    ``ServerNewtonSums``: the direction and the step broadcast as flags, 0: stop, -2:
    again with the curvature bound, -1: no step), MAX_CD_PASSES passes a direction.
    ``column_sq``: sum_i c_i a_ij^2 over the active features, ``weight_total``: sum_i c_i
    (None: n, no sample weights), ``lipschitz``: L_f. Returns (x, b, steps, |W|, work)
    as ``server_step``."""
    weights = penalty.weights
    support = broadcast_working_set(wire, x, cert, n, lam, penalty, last_size)
    k = support.shape[0]
    dim = k + int(intercept)
    bound = lipschitz * (np.append(column_sq[support],
                                   n if weight_total is None else weight_total)
                         if intercept else column_sq[support])
    w = x[support].copy()
    b, steps = gram_newton_steps(ServerNewtonSums(wire, dim), w, b, n * lam,
                                 weights[support], penalty.positive, bound, intercept,
                                 INNER_FRACTION * n * outer_gap, MAX_CD_PASSES,
                                 l2=penalty.l2)
    x[support] = w
    entries = float(np.sum(column_counts[support]))
    work = steps * (WORK["read"] * (4.0 * float(np.sum(column_counts)) +
                                    entries * entries / n) +
                    WORK["dense"] * float(MAX_CD_PASSES) * dim * dim * n_workers)
    return x, b, steps, k, work


class ServerNewtonSums:
    """``working_set.gram_newton_steps``' sums on the server: the workers' shares
    reduced, the direction and the step broadcast (``worker_newton_step`` answers);
    the subproblem's gap is not known here."""

    knows_gap = False

    def __init__(self, wire, dim):
        self.wire, self.dim = wire, dim

    def solved(self, w, tol):
        return False

    def hessian_and_slope(self):
        dim = self.dim
        sums = self.wire.reduce(np.empty(dim * (dim + 1) // 2 + dim + 1), root_blank=True)
        return from_upper_triangle(sums[:-dim - 1], dim), sums[-dim - 1:-1]

    def losses(self, go, direction):
        self.wire.bcast(np.append(1.0 if go else 0.0, direction))
        if not go:
            return None
        return self.wire.reduce(np.empty(NEWTON_GRID.shape[0] + 1), root_blank=True)

    def again(self):
        self.wire.bcast(np.array([-2.0]))         # again, with the curvature bound

    def take(self, index, direction):
        self.wire.bcast(np.array([float(index)]))


def worker_newton_step(wire, shard, z, code, intercept, correlation, rho_sum):
    """A worker's side of ``server_newton_step``, from the margins ``z`` at its x and b
    (``shard``'s, updated in place as the steps are taken); ``correlation`` and
    ``rho_sum``: its certificate's A^T rho and sum rho at z, the first step's slope."""
    active = shard.active
    support = receive_working_set(wire)
    k = support.shape[0]
    dim = k + int(intercept)
    slope = shard_slope(correlation[support], rho_sum, intercept)
    while True:
        rows = SupportRows(active, code, z, support, intercept, None)
        wire.reduce(np.concatenate((rows.hessian_triangle(), slope,
                                    [mean_loss(code, z, active.y, active.sample_weight) *
                                     z.shape[0]])))
        point = np.append(shard.x[support], shard.b) if intercept else \
            shard.x[support].copy()
        chosen = -2
        while chosen == -2:               # -2: a direction again, at the same point
            message = wire.bcast(np.empty(1 + dim))
            if message[0] == 0.0:
                return
            direction = message[1:]
            wire.reduce(rows.trial_sums(point, point + NEWTON_GRID[:, None] * direction))
            chosen = int(wire.bcast(np.empty(1))[0])
        if chosen < 0:
            return
        t = NEWTON_GRID[chosen]
        shard.x[support] += t * direction[:k]
        if intercept:
            shard.b += t * direction[k]
        z = active.margins(shard.x, shard.b)
        rho = generalized_residual(code, z, active.y, active.sample_weight,
                                   np.empty_like(z))
        slope = shard_slope(csr_rmatvec(active.indptr, active.indices, active.data, rho,
                                        active.n_features)[support], np.sum(rho),
                            intercept)
