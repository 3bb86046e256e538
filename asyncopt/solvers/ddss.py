"""DDSS: the outer loop of thesis Algorithm 4, shared by every backend (DESIGN 1-2).

Outer iteration s:
  1. margins z = A x + b on the active set, intercept refitted to its optimum;
  2. generalized residual rho, A^T rho (full gradient mu = -A^T rho / n), dual point theta,
     P and D; the gap G = P - the largest D of any dual point so far (``BestDual``); stop
     when G <= tol * P(0); after an epoch that cut G by less than half, the support
     Newton step (``support_newton.py``; ``group_newton.py`` for group penalties) and a
     new certificate;
  3. gap-safe screening (the spheres around theta and around the best point); the data
     is compacted to the surviving columns once the blocks the tests remove hold
     COMPACT_NNZ_SHARE of the stored non-zeros or COMPACT_FEATURE_SHARE of the features
     (a compaction costs a pass over the data; removing a sliver of rare columns does
     not repay it), and once more after the last iteration;
  4. one inner epoch (about n steps) of sparse prox-SVRG from the snapshot (x, z, mu)
     with step eta = 1 / (3 L_max) (DDSS), or plain sparse stochastic prox steps with
     the decaying step eta / (1 + s) (DDSS-Naive); with an L1 penalty the zeros of x
     that are optimal at the snapshot stay frozen for the epoch (``freeze_optimal_zeros``).
"""
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..cores import blas_threads, blas_threads_beside
from ..kernels.linalg import csr_rmatvec
from ..penalties import contiguous_block_norms
from ..screening import BestDual, screen_active_set
from ..group_newton import HESSIAN_FREE_MAX_SUPPORT, group_support_newton_step
from ..support_newton import (HessianCache, StallWatch, firm_support, prunes_for_step,
                              support_newton_step, violating_zeros)
from .checkpoint import load_checkpoint, save_checkpoint
from .serial import SerialInnerLoop


SAMPLINGS = ("chunked", "uniform")
COMPACT_NNZ_SHARE = 0.05
COMPACT_FEATURE_SHARE = 0.5


def worth_compacting(nnz_share, feature_share):
    """Whether screening out blocks that hold these shares of the stored non-zeros and of
    the features repays a compaction (a pass over the data): at least COMPACT_NNZ_SHARE
    of the non-zeros or COMPACT_FEATURE_SHARE of the features."""
    return nnz_share >= COMPACT_NNZ_SHARE or feature_share >= COMPACT_FEATURE_SHARE


def freeze_optimal_zeros(x, eta, weighted_mu, thresholds, block_indptr=None):
    """An epoch's thresholds with the zeros of x that satisfy their optimality condition at
    the epoch's anchor frozen (prox-SVRG): where x_j = 0 and eta |d_j mu_j| <= eta lam d_j
    w_j (|A_j^T rho| <= n lam w_j, so x_j = 0 is optimal given the other coordinates), the
    threshold becomes +inf and x_j stays zero for the epoch; for blocks (``block_indptr``,
    group Lasso), where x_g = 0 and ||A_g^T rho||_2 <= n lam w_g. Without the noise of the
    steps, (f'(a_i^T x + b) - f'(z~_i)) a_ij, such a coordinate would not move; with it, it
    leaves zero and costs later epochs, and bytes under MPI, to come back. A coordinate the
    solution needs violates the condition at some anchor and is free from that epoch on;
    the certificate is computed on every coordinate, so what DDSS certifies does not change
    (the working sets of celer and of the strong rule with a KKT check; here for one epoch
    at a time). Returns new thresholds (the input is kept).

    The solvers apply it in every prox-SVRG epoch. With an L1 penalty:
      - CTR 200,000 x 100,000, Dis-DDSS on 2 workers (-n 3), seeds 3-7, same machine:
        at 1e-4 lam_max x has 38,000 non-zeros after the first epoch instead of 80,000,
        and a run moves 59-76 MB (median 71) instead of 82-92 (87); at 1e-3, 27-43 MB
        (33) instead of 40-51 (43);
      - a9a degree 2 (3,000 rows), serial, 1e-2 lam_max to 1e-9: Lasso 11-13 epochs
        instead of 18-21; L1 logistic regression 9-16 instead of 15-22 (seeds 0-8), and
        on the whole a9a degree 3 to 1e-6, 10-12 instead of 20-22 (seeds 6-8).
    The logistic loss ran without it until the support Newton steps were chained
    (``StallWatch.should_chain``): a step after which a frozen coordinate turned out
    missing was then followed by 2, 4, 8... epochs of backoff, and the same 3,000 rows
    took 11-85 epochs. The group Lasso (groups of 4-5: CTR 20,000 x 10,000 at 5e-3 and
    200,000 x 100,000 at 1e-3 lam_max, a9a degree 2 at 1e-2, both losses; serial, seeds
    0-2) took the same epochs with it as without: the block prox's larger threshold
    keeps zero blocks at zero through the noise. It is kept for one rule on every
    penalty, and under MPI the anchor leaves the frozen blocks out
    (``mpi._anchor_without_optimal_zeros``)."""
    return np.where(optimal_zeros(x, eta, weighted_mu, thresholds, block_indptr), np.inf,
                    thresholds)


def optimal_zeros(x, eta, weighted_mu, thresholds, block_indptr=None):
    """The blocks ``freeze_optimal_zeros`` freezes: x_g = 0 and eta ||d_g mu_g||_2 <= the
    block's threshold. ``block_indptr``: contiguous blocks (the ActiveSet's), None for
    one coordinate each (L1: x_j = 0 and eta |d_j mu_j| <= the threshold)."""
    if block_indptr is None:
        return (x == 0.0) & (eta * np.abs(weighted_mu) <= thresholds)
    moving = np.add.reduceat(x != 0.0, block_indptr[:-1]) if x.shape[0] else \
        np.zeros(0, dtype=int)
    mu_norms = contiguous_block_norms(weighted_mu, block_indptr)
    return (moving == 0) & (eta * mu_norms <= thresholds)


def prox_svrg_epochs(variance_reduced, saga, dense):
    """Whether the epochs are DDSS's prox-SVRG (not the baselines): their thresholds then
    go through ``freeze_optimal_zeros``."""
    return variance_reduced and not (saga or dense)


def l1_prox_svrg(penalty, variance_reduced, saga, dense):
    """Whether the epochs are DDSS's prox-SVRG with an L1 penalty: under MPI the server
    then projects summed deltas onto x's orthant (``mpi._serve_inner``)."""
    return prox_svrg_epochs(variance_reduced, saga, dense) and penalty.is_l1


def epoch_rows(rng, n_samples, n_steps, sampling="chunked", chunk=32):
    """Row indices visited by one inner epoch.

    "uniform": i.i.d. uniform rows (the textbook sampling of Algorithm 4).
    "chunked": random reshuffling at the granularity of ``chunk`` consecutive rows: chunks
    in a fresh random order, rows in order inside a chunk, every row once per pass. The
    ActiveSet stores rows in a fixed random order, so a chunk is a random subset, while
    reading rows near-sequentially makes an epoch about 3x faster than random access.
    """
    if sampling == "uniform":
        return rng.integers(0, n_samples, n_steps)
    n_chunks = -(-n_samples // chunk)
    passes = []
    for _ in range(-(-n_steps // n_samples)):
        rows = (rng.permutation(n_chunks)[:, None] * chunk + np.arange(chunk)).ravel()
        passes.append(rows[rows < n_samples])
    return np.concatenate(passes)[:n_steps]


@dataclass
class SolverResult:
    """What a solve returns; ``history`` holds one record per outer iteration."""

    coef: np.ndarray
    intercept: float
    n_iter: int
    primal: float
    dual: float
    gap: float
    active_features: np.ndarray
    converged: bool
    history: list = field(default_factory=list)


def history_record(epoch, elapsed, cert, reference, active, x, inner_steps, staleness_mean=0.0,
                   staleness_max=0, best=None):
    """One history record: the outer iteration's certificate, active set, non-zeros of x
    (on the active set; ``coef_nnz``) and counters; with a ``BestDual`` (offered this
    certificate), D and G are the best point's and ``dual_at_x`` is D at x's own dual
    point."""
    dual = cert.dual if best is None else best.dual
    gap = max(cert.primal - dual, 0.0)
    return {"epoch": epoch, "time": elapsed, "primal": cert.primal, "dual": dual,
            "dual_at_x": cert.dual,
            "gap": gap, "rel_gap": gap / reference if reference > 0 else 0.0,
            "n_active": active.n_features, "n_features": active.problem.n_features,
            "active_nnz": active.nnz, "coef_nnz": int(np.count_nonzero(x)),
            "inner_steps": inner_steps, "bytes_sent": 0,
            "bytes_recv": 0, "staleness_mean": staleness_mean,
            "staleness_max": staleness_max}


def solve_ddss(problem, *, tol=1e-4, max_epochs=200, screening=True, variance_reduced=True,
               coef_init=None, intercept_init=0.0, step_scale=1.0, inner_steps=None,
               sampling="chunked", random_state=None, verbose=0, inner_loop=None,
               label="ddss", callback=None, max_time=None, checkpoint=None,
               checkpoint_interval=60.0, saga=False, dense=False, support_newton=True):
    """Solve ``problem`` (a Problem) with DDSS; returns a SolverResult.

    tol is relative: stop at G <= tol * P(0). step_scale multiplies eta = 1/(3 L_max).
    inner_steps defaults to n (one pass over the rows per outer iteration).
    sampling: "chunked" (default) or "uniform", see ``epoch_rows``.
    callback(record) is called with every history record; returning True stops the run.
    max_time: stop (not converged) once this many seconds have passed.
    checkpoint: a .npz path written every checkpoint_interval seconds and at the end; if
    it exists when the solve starts (and no coef_init is given), the solve resumes from it.
    saga: run the ProxASAGA baseline instead (gradient memory kept across epochs, the
    outer loop only monitors the gap; needs screening=False).
    dense: run the ProxASVRG baseline instead (dense variance-reduced steps over every
    active coordinate, no reweighting, no sparse prox).
    support_newton: take the support Newton step (``support_newton.py``, for group
    penalties ``group_newton.py``) after an epoch that cut the gap by less than half (the
    baselines run without it).
    """
    from ..progress import ProgressLine

    if saga and screening:
        raise ValueError("the SAGA baseline runs without screening (screening=False)")
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}: expected one of {SAMPLINGS}")
    start = time.perf_counter()
    rng = np.random.default_rng(random_state)
    inner_loop = SerialInnerLoop() if inner_loop is None else inner_loop
    n = problem.n_samples
    lam = problem.lam
    lipschitz = problem.loss.lipschitz
    active = problem.full_active_set()
    history, first_epoch, time_offset, total_steps = [], 0, 0.0, 0
    if checkpoint is not None and coef_init is None and os.path.exists(checkpoint):
        coef_init, intercept_init, _, history = load_checkpoint(
            checkpoint, problem.n_features, problem.lam)
        if history:
            first_epoch = history[-1]["epoch"] + 1
            time_offset = history[-1]["time"]
            total_steps = history[-1]["inner_steps"]
    x = np.zeros(active.n_features) if coef_init is None else \
        np.array(coef_init, dtype=np.float64)[active.features]
    intercept = np.array([float(intercept_init) if problem.fit_intercept else 0.0])
    reference = problem.null_objective()
    n_steps = n if inner_steps is None else int(inner_steps)
    last_saved = start

    def save():
        save_checkpoint(checkpoint, coef=active.expand(x), intercept=intercept[0],
                        lam=lam, history=history)
    converged = False
    n_threads = getattr(inner_loop, "n_jobs", 1)
    cert = active.certificate(x, intercept[0], n_threads=n_threads)
    best = BestDual()       # G = P(x) - the largest D seen: stop and screen on it
    epoch = 0
    staleness_mean, staleness_max = 0.0, 0
    if saga:
        memory = -cert.rho
    watch = None if not support_newton or saga else \
        StallWatch(None if problem.penalty.is_l1 else HESSIAN_FREE_MAX_SUPPORT)
    newton_step = support_newton_step if problem.penalty.is_l1 else \
        group_support_newton_step
    hessian_cache = HessianCache()
    firm_before = None     # x's firm support (``firm_support``) before the last epoch
    # one BLAS thread per core each of the inner loop's threads has (``cores.blas_threads``)
    with ProgressLine(verbose, label=label) as progress, \
            blas_threads(blas_threads_beside(n_threads)):
        while True:
            intercept[0] = cert.intercept
            best.offer_certificate(cert)
            newton_t = 0.0
            gap = best.gap(cert.primal)
            groups = active.penalty.group_indptr
            firm = None if watch is None else firm_support(x, cert.correlation, n, lam,
                                                           active.weights, groups)
            firm_cert = cert       # the certificate firm was read from
            churn = None if firm_before is None else int(np.count_nonzero(firm_before != firm))
            if watch is not None and gap > tol * reference and \
                    watch.should_try(epoch, gap, int(np.count_nonzero(firm)), churn,
                                     tol * reference,
                                     prunes_for_step(x, groups is not None)):
                while True:
                    gap_before = best.gap(cert.primal)
                    moved = newton_step(active, cert, x, hessian_cache, n_threads)
                    if moved is not None:
                        cert = active.certificate(x, moved[0], n_threads=n_threads)
                        intercept[0] = cert.intercept
                        best.offer_certificate(cert)
                        newton_t = moved[1]
                    watch.tried(epoch, gap_before, best.gap(cert.primal))
                    if moved is None or best.gap(cert.primal) <= tol * reference or \
                            not watch.should_chain(moved[1], violating_zeros(
                                x, cert.correlation, n, lam, active.weights,
                                groups)[0].shape[0]):
                        break
            now = time.perf_counter()
            record = history_record(first_epoch + epoch, time_offset + now - start, cert,
                                    reference, active, x, total_steps, staleness_mean,
                                    staleness_max, best)
            record["newton_step"] = newton_t
            record["support_changes"] = churn
            history.append(record)
            progress.update(record)
            if best.gap(cert.primal) <= tol * reference:
                converged = True
                break
            if epoch >= max_epochs or (callback is not None and callback(record)) or \
                    (max_time is not None and now - start >= max_time):
                break
            if checkpoint is not None and now - last_saved >= checkpoint_interval:
                save()
                last_saved = now
            if screening:
                keep = screen_active_set(active, cert, best)
                if worth_compacting(*active.dropped_share(keep)):
                    active, x, dropped_nonzero = active.compact(keep, x)
                    best.restrict(keep)
                    cert = active.certificate(x, intercept[0],
                                              None if dropped_nonzero else cert.z,
                                              n_threads=n_threads)
                    best.offer_certificate(cert)
            eta0 = step_scale / (3.0 * lipschitz * max(active.max_row_sq_norm, 1e-300))
            eta = eta0 if variance_reduced else eta0 / (1.0 + epoch)
            block_reweight = active.reweighting()
            if variance_reduced:
                reweight = np.repeat(block_reweight, np.diff(active.block_indptr))
                weighted_mu = -reweight * cert.correlation / n
                mu_intercept = -float(np.sum(cert.rho)) / n
            else:
                weighted_mu = np.zeros(active.n_features)
                mu_intercept = 0.0
            thresholds = eta * lam * block_reweight * active.weights
            if prox_svrg_epochs(variance_reduced, saga, dense):
                thresholds = freeze_optimal_zeros(
                    x, eta, weighted_mu, thresholds,
                    active.penalty.group_indptr)
            samples = epoch_rows(rng, n, n_steps, sampling)
            if watch is not None:    # again only if a step or a compaction moved x
                firm_before = firm if cert is firm_cert else firm_support(
                    x, cert.correlation, n, lam, active.weights,
                    active.penalty.group_indptr)
            eta_intercept = eta * active.intercept_scale_sq
            if dense:
                staleness_mean, staleness_max = inner_loop.run_dense(
                    active, x, intercept, eta_intercept, cert.z, -cert.correlation / n,
                    mu_intercept, eta * lam * active.weights, eta, samples)
            elif saga:
                # exact (1/n) A^T memory each epoch: racing threads lose some of the
                # kernel's increments of the average, and the loss must not accumulate
                average = csr_rmatvec(active.indptr, active.indices, active.data, memory,
                                      active.n_features, n_threads) / n
                average_intercept = np.array([float(np.mean(memory))])
                staleness_mean, staleness_max = inner_loop.run_saga(
                    active, x, intercept, eta_intercept, memory, average, average_intercept,
                    np.repeat(block_reweight, np.diff(active.block_indptr)), thresholds,
                    eta, samples)
            else:
                staleness_mean, staleness_max = inner_loop.run(
                    active.without_frozen(thresholds), x, intercept, eta_intercept, cert.z,
                    weighted_mu, mu_intercept, thresholds, eta, samples, variance_reduced)
            total_steps += n_steps
            epoch += 1
            if not np.all(np.isfinite(x)) or not np.isfinite(intercept[0]):
                raise FloatingPointError(
                    "the iterates diverged (non-finite coefficients); try a smaller step_scale")
            cert = active.certificate(x, intercept[0], n_threads=n_threads)
    if screening:
        keep = screen_active_set(active, cert, best)
        if not np.all(keep):
            active, x, dropped_nonzero = active.compact(keep, x)
            best.restrict(keep)
            # the last record's certificate screened these: its active set is this one
            history[-1].update(n_active=active.n_features, active_nnz=active.nnz)
            if dropped_nonzero:
                cert = active.certificate(x, cert.intercept, n_threads=n_threads)
                best.offer_certificate(cert)
                converged = best.gap(cert.primal) <= tol * reference
    if checkpoint is not None:
        save()
    coef = active.expand(x)
    return SolverResult(coef, float(cert.intercept), epoch, cert.primal, best.dual,
                        best.gap(cert.primal), active.features.copy(), converged, history)
