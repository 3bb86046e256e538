"""The serial backend: one thread runs the inner loop kernels in order."""
import numpy as np

from ..kernels.svrg import svrg_epoch_group, svrg_epoch_l1


class SerialInnerLoop:
    """Runs one inner epoch of sparse prox-SVRG (or its naive variant) on one thread."""

    name = "serial"

    def run(self, active, x, intercept, eta_intercept, z_snap, weighted_mu, mu_intercept,
            thresholds, eta, samples, variance_reduced):
        """Update x and intercept (length-1 array) in place; returns staleness (0, 0)."""
        args = (active.indptr, active.indices, active.data, active.y,
                active.problem.loss.code, x, intercept, eta_intercept, z_snap, weighted_mu,
                mu_intercept, thresholds, eta, samples, variance_reduced)
        if active.penalty.is_l1:
            svrg_epoch_l1(*args)
        else:
            n_blocks = active.block_indptr.shape[0] - 1
            svrg_epoch_group(*args, active.block_indptr, active.feature_block,
                             np.arange(active.n_features), np.zeros(active.n_features),
                             np.full(n_blocks, -1, dtype=np.int64))
        return 0.0, 0
