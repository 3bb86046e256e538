"""PSE-Safe and PSE-Strong: parallel static screening, then asynchronous grouped
coordinate descent (the baselines of thesis section 5, docs/design.md §4).

1. One screening pass at x = 0 (intercept at its optimum):
   - "safe": the gap-safe sphere test at that point (screening.static_safe_sphere_keep);
   - "strong": the sequential strong rule from lam_max (screening.strong_rule_keep),
     which may discard blocks of the solution.
2. Epochs of block coordinate descent (kernels/cd.py) on the kept blocks, the blocks of an
   epoch in a fresh random order and split between the backend's threads, which share the
   margins lock-free; the squared loss's intercept is profiled out (moved with every
   update), the logistic one refitted between epochs; after every epoch the margins, the
   intercept and the duality gap of the screened problem are recomputed exactly.
3. PSE-Strong's KKT check, once the screened problem's gap is below tol: a discarded block g
   violates optimality if ||A_g^T rho|| > n lam w_g s (s the dual scaling of the screened
   problem). Violators are added back and the descent goes on; without violators the dual
   point is feasible for the whole problem, so the gap certifies the full problem.

Unlike DDSS the screening is never repeated, and a step costs a pass over a column.
"""
import time

import numpy as np

from ..kernels.linalg import csr_rmatvec, csr_transpose
from ..penalties import per_feature
from ..screening import screen_active_set, strong_rule_keep
from .ddss import SolverResult, history_record
from .methods import check_elastic_net
from .serial import SerialInnerLoop

RULES = ("safe", "strong")


def static_keep(rule, full, cert0):
    """Blocks of the full problem kept by the static ``rule`` at the certificate of
    x = 0."""
    if rule == "safe":
        return screen_active_set(full, cert0)
    prob = full.problem
    lam_max = float(np.max(cert0.block_correlation / full.weights, initial=0.0)) / \
        prob.n_samples
    return strong_rule_keep(cert0.block_correlation, prob.n_samples, prob.lam, lam_max,
                            full.weights)


def kkt_violators(full, keep, rho, dual_scale, n_threads=1):
    """Discarded blocks whose dual constraint ||A_g^T rho|| <= n lam w_g dual_scale
    fails (the penalty's ``dual_block_norms``: one-sided for the positive L1 penalty)."""
    prob = full.problem
    correlation = csr_rmatvec(full.indptr, full.indices, full.data, rho, full.n_features,
                              n_threads)
    block_corr = full.penalty.dual_block_norms(correlation)
    return ~keep & (block_corr > prob.n_samples * prob.lam * full.weights * dual_scale)


def column_major(active):
    """(indptr, rows, data) of the active data in CSC, rows in the ActiveSet's order."""
    return csr_transpose(active.indptr, active.indices, active.data, active.n_features)


def coordinate_steps(active, columns, centred_steps=True):
    """(column means m, L_g per block) of the coordinate descent: with the squared loss
    and an intercept the intercept is profiled out (kernels/cd.py), so m is the column's
    c-weighted mean sum_i c_i a_ij / W (W = sum_i c_i, c the sample weights, all 1
    without them) and L_g = ||C^(1/2) (A_g - 1 m_g^T)||_F^2 / n, from the weighted
    column norms as sum_i c_i a_ij^2 - W m_j^2; otherwise m = 0 and
    L_g = L_f ||C^(1/2) A_g||_F^2 / n.
    centred_steps=False keeps the uncentred L_g (an upper bound) with the profiled
    intercept: threads racing on z and b see stale values, and the centred norm of a
    column present in almost every row is so small that 1/L_g amplifies those errors
    until the iterates diverge.
    """
    prob = active.problem
    n = prob.n_samples
    sq_norms = active.column_sq_norms
    means = np.zeros(active.n_features)
    if prob.fit_intercept and prob.loss.quadratic:
        column_of = np.repeat(np.arange(active.n_features), np.diff(columns[0]))
        weights = active.sample_weight
        values = columns[2] * weights[columns[1]] if weights.shape[0] else columns[2]
        total = prob.weight_total
        means = np.bincount(column_of, values, active.n_features) / total
        if centred_steps:
            sq_norms = np.maximum(sq_norms - total * means ** 2, 0.0)
    block_sq = np.add.reduceat(sq_norms, active.block_indptr[:-1]) \
        if active.n_features else np.zeros(0)
    return means, prob.loss.lipschitz * block_sq / n


def solve_pse(problem, rule="safe", *, tol=1e-4, max_epochs=200, coef_init=None,
              intercept_init=0.0, random_state=None, verbose=0, inner_loop=None, label=None,
              callback=None, max_time=None):
    """Solve ``problem`` with PSE-Safe (rule="safe") or PSE-Strong (rule="strong");
    returns a SolverResult whose history has the records of solve_ddss plus
    ``kkt_readded`` (blocks the KKT check added back so far).

    tol is relative: stop at G <= tol * P(0). An epoch updates every kept block once.
    """
    from ..progress import ProgressLine

    if rule not in RULES:
        raise ValueError(f"unknown PSE rule {rule!r}: expected one of {RULES}")
    check_elastic_net(label or f"pse_{rule}", problem.penalty)
    start = time.perf_counter()
    rng = np.random.default_rng(random_state)
    inner_loop = SerialInnerLoop() if inner_loop is None else inner_loop
    n_threads = getattr(inner_loop, "n_jobs", 1)
    label = label or f"pse_{rule}"
    full = problem.full_active_set()
    b = float(intercept_init) if problem.fit_intercept else 0.0
    cert0 = full.certificate(np.zeros(full.n_features), b, n_threads=n_threads)
    keep = static_keep(rule, full, cert0)
    x_full = np.zeros(full.n_features) if coef_init is None else \
        full.penalty.projection(np.array(coef_init, dtype=np.float64)[full.features])
    active, x, _ = full.compact(keep, x_full)
    columns = column_major(active)
    means, block_lipschitz = coordinate_steps(active, columns)
    reference = problem.null_objective()
    history, readded, epoch, converged = [], 0, 0, False
    cert = active.certificate(x, cert0.intercept, n_threads=n_threads)
    with ProgressLine(verbose, label=label) as progress:
        while True:
            now = time.perf_counter()
            record = history_record(epoch, now - start, cert, reference, active, x,
                                    epoch * active.n_features)
            record["kkt_readded"] = readded
            history.append(record)
            progress.update(record)
            if cert.gap <= tol * reference:
                violators = kkt_violators(full, keep, cert.rho, cert.dual_scale,
                                          n_threads) if rule == "strong" else None
                if violators is None or not violators.any():
                    converged = True
                    break
                readded += int(violators.sum())
                x_full = np.zeros(full.n_features)
                x_full[per_feature(keep, full.block_indptr)] = x
                keep = keep | violators
                active, x, _ = full.compact(keep, x_full)
                columns = column_major(active)
                means, block_lipschitz = coordinate_steps(active, columns)
                cert = active.certificate(x, cert.intercept, n_threads=n_threads)
                continue
            if epoch >= max_epochs or (callback is not None and callback(record)) or \
                    (max_time is not None and now - start >= max_time):
                break
            intercept = np.array([cert.intercept])
            inner_loop.run_cd(columns, active, x, cert.z - cert.intercept, intercept, means,
                              rng.permutation(len(active.blocks)), block_lipschitz,
                              problem.lam * active.weights)
            epoch += 1
            if not np.all(np.isfinite(x)):
                raise FloatingPointError("the iterates diverged (non-finite coefficients)")
            cert = active.certificate(x, cert.intercept, n_threads=n_threads)
    return SolverResult(active.expand(x), float(cert.intercept), epoch, cert.primal,
                        cert.dual, cert.gap, active.features.copy(), converged, history)
