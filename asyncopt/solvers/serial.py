"""The serial backend: one thread runs the inner loop kernels in order."""
import numpy as np

from ..kernels.cd import cd_epoch
from ..kernels.svrg import dense_svrg_epoch


class SerialInnerLoop:
    """Runs one inner epoch of sparse prox-SVRG (or its naive variant) on one thread."""

    name = "serial"

    def run(self, active, x, intercept, eta_intercept, z_snap, weighted_mu, mu_intercept,
            thresholds, eta, samples, variance_reduced, clock=None, staleness=None):
        """Update x and intercept (length-1 array) in place; returns the staleness
        (mean, max) of tau. Threads that run epochs together pass a shared ``clock``
        (int64[1]) and their own ``staleness`` (int64[2]) and get the tracked kernels."""
        tracked = clock is not None
        clock = np.zeros(1, dtype=np.int64) if clock is None else clock
        staleness = np.zeros(2, dtype=np.int64) if staleness is None else staleness
        args = (active.indptr, active.indices, active.data, active.y,
                active.problem.loss.code, x, intercept, eta_intercept, z_snap, weighted_mu,
                mu_intercept, thresholds, eta, samples, variance_reduced, clock, staleness)
        penalty = active.penalty
        penalty.svrg_kernel(tracked)(*args, *penalty.kernel_blocks(active))
        return float(staleness[0]) / max(len(samples), 1), int(staleness[1])

    def run_saga(self, active, x, intercept, eta_intercept, memory, average,
                 average_intercept, reweight, thresholds, eta, samples):
        """One epoch of sparse proximal SAGA (ProxASAGA baseline)."""
        args = (active.indptr, active.indices, active.data, active.y,
                active.problem.loss.code, x, intercept, eta_intercept, memory, average,
                average_intercept, reweight, thresholds, eta, samples)
        active.penalty.saga_kernel()(*args, *active.penalty.kernel_blocks(active))
        return 0.0, 0

    def run_dense(self, active, x, intercept, eta_intercept, z_snap, mu, mu_intercept,
                  thresholds, eta, samples):
        """One epoch of proximal SVRG with dense steps (ProxASVRG baseline)."""
        dense_svrg_epoch(active.indptr, active.indices, active.data, active.y,
                         active.problem.loss.code, x, intercept, eta_intercept, z_snap, mu,
                         mu_intercept, thresholds, eta, samples, active.block_indptr)
        return 0.0, 0

    def run_cd(self, columns, active, x, z, intercept, column_means, order, block_lipschitz,
               thresholds):
        """One pass of block coordinate descent over the blocks in ``order`` (PSE);
        ``columns`` = (indptr, rows, data) of the active data in CSC."""
        cd_epoch(*columns, active.y, active.problem.loss.code, x, z, intercept, column_means,
                 order, active.block_indptr, block_lipschitz, thresholds)
        return 0.0, 0
