"""The serial backend: one thread runs the inner loop kernels in order."""
from ..kernels.cd import cd_epoch
from ..kernels.svrg import dense_svrg_epoch
from ..kernels.workspace import Clock


class SerialInnerLoop:
    """Runs one inner epoch of sparse prox-SVRG (or its naive variant) on one thread.

    Every method updates x and intercept (length-1 array) in place for the rows in
    ``samples`` of the ActiveSet ``active`` and returns the staleness (mean, max) of tau.
    """

    name = "serial"

    def run(self, active, x, intercept, step, samples, clock=None):
        """One epoch of sparse prox-SVRG at the ``workspace.SvrgStep`` ``step``. Threads
        that run epochs together pass a ``workspace.Clock`` (shared steps, their own
        staleness) and get the tracked kernels."""
        tracked = clock is not None
        clock = Clock.fresh() if clock is None else clock
        active.penalty.svrg_kernel(tracked)(active.kernel_rows(), active.kernel_blocks(),
                                            step, x, intercept, samples, clock)
        return float(clock.staleness[0]) / max(len(samples), 1), int(clock.staleness[1])

    def run_saga(self, active, x, intercept, step, samples):
        """One epoch of sparse proximal SAGA (ProxASAGA baseline) at the
        ``workspace.SagaStep`` ``step``."""
        active.penalty.saga_kernel()(active.kernel_rows(), active.kernel_blocks(), step, x,
                                     intercept, samples)
        return 0.0, 0

    def run_dense(self, active, x, intercept, step, samples):
        """One epoch of proximal SVRG with dense steps (ProxASVRG baseline) at the
        ``workspace.SvrgStep`` ``step`` (its weighted_mu: mu, unweighted)."""
        dense_svrg_epoch(active.kernel_rows(), active.kernel_blocks(), step, x, intercept,
                         samples)
        return 0.0, 0

    def run_cd(self, columns, active, x, z, intercept, column_means, order, block_lipschitz,
               thresholds):
        """One pass of block coordinate descent over the blocks in ``order`` (PSE);
        ``columns`` = (indptr, rows, data) of the active data in CSC."""
        cd_epoch(*columns, active.y, active.problem.loss.code, active.sample_weight, x, z,
                 intercept, column_means, order, active.block_indptr, block_lipschitz,
                 thresholds, active.penalty.positive)
        return 0.0, 0
