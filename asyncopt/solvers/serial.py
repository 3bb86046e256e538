"""The serial backend: one thread runs the inner loop kernels in order."""
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
            svrg_epoch_group(*args, active.block_indptr, active.feature_block)
        return 0.0, 0
