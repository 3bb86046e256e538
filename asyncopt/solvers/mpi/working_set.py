"""The working-set step over the shards (Dis-DDSS with ``method="working_set"``).

Every rank runs ``distributed_working_set`` at the same point of the outer loop, after
the server's WORKING_SET control word. The server chooses the working set W from the
certificate (``solvers.working_set.working_set``: every non-zero and the zeros that
violate their optimality condition most) and broadcasts it; the workers reduce their
shares of the Gram matrix of B = [A_W, 1] (``reduce_support_hessian``: the squared
loss's Hessian, only the rows of the columns new to W once most of W was in the last
sum) and of B^T y; the server solves the subproblem on W by coordinate descent on the
Gram matrix with Anderson extrapolation (``kernels.working_set.gram_lasso_cd``) to
INNER_FRACTION of the outer gap.
The move reaches the workers with the next certificate's [b, x]: one reduction and two
broadcasts per step, whatever the number of passes. The squared loss with the L1
penalty only (``supports``).
"""
import numpy as np

from ...kernels.linalg import csr_rmatvec
from ...kernels.working_set import gram_lasso_cd
from ...newton.kernels import SupportRows
from ..working_set import (ANDERSON, CHECK_EVERY, INNER_FRACTION, MAX_INNER_EPOCHS,
                           violation_scores, working_set)
from .newton import reduce_support_hessian
from .protocol import server_vector


def supports(loss, penalty):
    """None where the distributed working-set step solves the problem, else the reason,
    one line."""
    if loss.quadratic and penalty.kernels == "l1":
        return None
    return ("method 'working_set' under mpirun solves the Lasso (squared loss, L1 "
            "penalty) only; use method 'ddss' for this problem")


class WorkerSums:
    """A worker's side of the step over its shard's rows, with A^T y over them by
    original feature id (of ``n_original``), formed at the first step: it depends on the
    rows alone."""

    def __init__(self, n_original):
        self.n_original = n_original
        self.y_correlation = None

    def send(self, wire, active, z, code, features, support, intercept, reduced):
        """Reduce this shard's Gram matrix of [A_W, 1] (margins ``z``, loss ``code``:
        the squared loss's Hessian does not depend on them) and [A_W^T y, sum y]."""
        if self.y_correlation is None:
            self.y_correlation = np.zeros(self.n_original)
            self.y_correlation[features] = csr_rmatvec(
                active.indptr, active.indices, active.data, active.y, active.n_features)
        ids = features[support]
        rows = SupportRows(active, code, z, support, intercept, None)
        reduce_support_hessian(wire, rows, reduced, ids, intercept,
                               support.shape[0] + int(intercept))
        y_corr = self.y_correlation[ids]
        wire.reduce(np.append(y_corr, np.sum(active.y)) if intercept else y_corr)


def server_step(wire, x, b, cert, sums, n, lam, penalty, features, intercept, reduced,
                outer_gap):
    """The server's side: W chosen and broadcast, the sums reduced, the subproblem
    solved. ``sums``: the certificate's [sum f, sum rho, sum rho^2, sum y rho] over all
    rows (rho = r = y - A x - b); ``penalty`` on the active features, ``features`` their
    original ids. Returns (x, b, passes, |W|), x updated in place."""
    weights = penalty.weights
    scores = violation_scores(x, cert.correlation, n, lam, weights, penalty.indptr)
    chosen = working_set(np.abs(x), scores)
    support = server_vector(wire, chosen.astype(np.float64)).astype(np.int64)
    dim = support.shape[0] + int(intercept)
    gram = reduce_support_hessian(wire, None, reduced, features[support], intercept, dim)
    y_corr = wire.reduce(np.zeros(dim), root_blank=True)
    corr = cert.correlation[support]
    if intercept:
        corr = np.append(corr, cert.rho_sum)
    w = x[support].copy()
    db, passes, _ = gram_lasso_cd(
        np.ascontiguousarray(gram), corr, w, n * lam, weights[support], intercept,
        float(sums[2]), float(sums[3]), y_corr, INNER_FRACTION * n * outer_gap,
        MAX_INNER_EPOCHS, CHECK_EVERY, ANDERSON)
    x[support] = w
    return x, b + db, int(passes), int(support.shape[0])


def worker_step(wire, sums, active, z, code, features, intercept, reduced):
    """A worker's side of the step (``WorkerSums`` ``sums``): W from the server, then its
    shares reduced."""
    support = server_vector(wire, None).astype(np.int64)
    sums.send(wire, active, z, code, features, support, intercept, reduced)
