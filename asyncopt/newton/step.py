"""The support Newton step on one process (serial and threads backends): the layers put
together. ``support_newton_step`` (L1) and ``group_support_newton_step`` (groups) prune x
(``prune_for_step``), pick S (``policy``), ask the rows for the Hessian sums and the trial
losses (``kernels.SupportRows``), solve the model (``model``, ``group_model``) and take
the candidate of smallest exact P when it lowers P. Under MPI ``solvers.mpi`` puts the
same layers together over the shards."""
import numpy as np

from .group_model import group_move, group_support_point, hessian_free_group_move
from .kernels import SupportRows, group_hessian_blocks, shard_slope
from .model import (STEP_GRID, best_candidate, dense_move, linear_candidates,
                    move_candidates, support_point, take_candidate)
from .policy import (HESSIAN_FREE_MAX_SUPPORT, entering_coordinates, entering_groups,
                     entering_limit, firm_support, group_uses_hessian_free,
                     pruned_coordinates)


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
    positive = active.penalty.positive
    pruned, saved, offset, cert = prune_for_step(active, cert, x)
    nonzeros = int(np.count_nonzero(x))
    entering = entering_coordinates(x, cert.correlation, n, lam, active.weights,
                                    entering_limit(nonzeros),
                                    active.column_sq_norms if problem.loss.quadratic
                                    else None, positive)
    support, point, signs = support_point(x, cert.intercept, intercept, entering)
    k = support.shape[0]
    weights = active.weights[support]
    rows = SupportRows(active, code, cert.z, support, intercept,
                       shard_slope(cert.correlation[support], cert.rho_sum, intercept),
                       cache, n_threads)
    kind, vector, _, signs = dense_move(rows.hessian_sums(), cert.correlation[support],
                                        cert.rho_sum, point, weights, lam, n, intercept,
                                        signs, positive)
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


def group_support_newton_step(active, cert, x, cache=None, n_threads=1):
    """The step on one process (serial and threads backends) for a group penalty:
    ``cert`` is the certificate at (x, cert.intercept) on ``active``; ``cache``: the run's
    HessianCache; ``n_threads``: the threads that form the Hessian. Moves x in place and
    returns (b, t), or returns None (x untouched) when no trial lowers P
    (``support_newton_step`` for L1)."""
    problem = active.problem
    n, lam, code = problem.n_samples, problem.lam, problem.loss.code
    intercept = problem.fit_intercept
    block_indptr = active.block_indptr
    pruned, saved, offset, cert = prune_for_step(active, cert, x, block_indptr)
    entering = entering_groups(x, cert.correlation, n, lam, active.weights, block_indptr,
                               HESSIAN_FREE_MAX_SUPPORT)
    support, point, starts, groups = group_support_point(x, cert.intercept, intercept,
                                                         block_indptr, entering)
    k = support.shape[0]
    index = -1
    if k:
        rho_sum = cert.rho_sum
        slope = shard_slope(cert.correlation[support], rho_sum, intercept)
        rows = SupportRows(active, code, cert.z, support, intercept, slope, cache,
                           n_threads)
        weights = active.weights[groups]
        if group_uses_hessian_free(k):
            target, _ = hessian_free_group_move(
                group_hessian_blocks(rows, starts), rows.hessian_times_from_rows, slope,
                point, starts, lam * weights, n, intercept)
        else:
            target = group_move(rows.hessian_sums(), slope, point, starts, lam * weights,
                                n, intercept)
        if target is not None:
            candidates = linear_candidates(point, target)
            index, _ = best_candidate(rows.trial_sums(point, candidates), n, lam, weights,
                                      point[:k], candidates[:, :k], offset, starts)
    if index < 0:
        x[pruned] = saved
        return None
    return take_candidate(x, cert.intercept, support, candidates[index], intercept), \
        float(STEP_GRID[index])
