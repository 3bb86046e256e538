"""The DDSS backend of one process (serial, and threads through ``ThreadsInnerLoop``).

The whole data set is one ``ActiveSet``; the certificate, the compaction and the
second-order step run here, the inner epoch on the inner loop's thread or threads.
``ddss.Driver`` documents the interface.
"""
import numpy as np

from ..kernels.linalg import csr_rmatvec
from ..kernels.workspace import SagaStep
from ..newton.kernels import HessianCache
from ..penalties import per_feature
from ..runtime import blas_threads_beside
from .ddss import epoch_rows
from .serial import SerialInnerLoop
from .working_set import ColumnStore, GramStore, step


def blas_limit(inner_loop):
    """The BLAS threads a solve of this process may use beside ``inner_loop``'s (None:
    the serial loop): ``blas_threads_beside`` its threads, one for a serial solve (one
    core: BLAS's threads would only spin on the others)."""
    return blas_threads_beside(getattr(inner_loop, "n_jobs", 1)) or 1


class LocalBackend:
    """The problem's data in this process.

    inner_loop: SerialInnerLoop (default) or ThreadsInnerLoop; rng, sampling: the epochs'
    rows (``ddss.epoch_rows``); n_steps: steps per epoch (None: n, one pass); saga /
    dense: the baselines' epochs (ProxASAGA keeps each row's gradient memory here)."""

    def __init__(self, problem, inner_loop, rng, sampling, n_steps=None, saga=False,
                 dense=False):
        self.problem = problem
        self.inner_loop = SerialInnerLoop() if inner_loop is None else inner_loop
        self.n_threads = getattr(self.inner_loop, "n_jobs", 1)
        self.rng, self.sampling = rng, sampling
        self.n_samples, self.lam = problem.n_samples, problem.lam
        self.n_steps = self.n_samples if n_steps is None else int(n_steps)
        self.lipschitz = problem.loss.lipschitz
        self.fit_intercept = problem.fit_intercept
        self.n_original = problem.n_features
        self.saga, self.dense, self.memory = saga, dense, None
        self.active = problem.full_active_set(own=True)
        self.blas_limit = blas_limit(self.inner_loop)
        self.newton_max_support = problem.penalty.newton_max_support
        self._newton = problem.penalty.newton_step()
        self.hessian_cache = HessianCache()
        self.columns = None        # the working-set step's ColumnStore

    # the active set's facts the driver reads
    n_features = property(lambda self: self.active.n_features)
    nnz = property(lambda self: self.active.nnz)
    penalty = property(lambda self: self.active.penalty)
    weights = property(lambda self: self.active.weights)
    block_indptr = property(lambda self: self.active.block_indptr)
    max_row_sq_norm = property(lambda self: self.active.max_row_sq_norm)
    intercept_scale_sq = property(lambda self: self.active.intercept_scale_sq)

    def announce(self, kind):
        """Nothing to tell: the data is here."""

    def null_objective(self):
        return self.problem.null_objective()

    def certify(self, x, b):
        return self.active.certificate(x, b, n_threads=self.n_threads)

    def block_column_norms(self):
        return self.active.block_column_norms()

    def reweighting(self):
        return self.active.reweighting()

    def dropped_share(self, keep):
        return self.active.dropped_share(keep)

    def compact(self, keep, x):
        self.active, x, dropped_nonzero = self.active.compact(keep, x)
        return x, dropped_nonzero

    def command(self, status):
        """Nothing to tell: the next step runs here."""

    def reject(self):
        return False

    def newton_step(self, x, b, cert, firm):
        moved = self._newton(self.active, cert, x, self.hessian_cache, self.n_threads)
        return None if moved is None else (x, moved[0], moved[1], 0)

    def epoch(self, x, b, cert, plan, dispatched):
        """One inner epoch on the inner loop, x and b updated in place."""
        dispatched()
        active, loop = self.active, self.inner_loop
        intercept = np.array([b])
        samples = epoch_rows(self.rng, self.n_samples, self.n_steps, self.sampling)
        if self.dense:
            staleness = loop.run_dense(active, x, intercept, plan.svrg_step(cert.z),
                                       samples)
        elif self.saga:
            staleness = self._saga_epoch(x, intercept, cert, plan, samples)
        else:
            staleness = loop.run(active.without_frozen(plan.thresholds), x, intercept,
                                 plan.svrg_step(cert.z), samples)
        return x, float(intercept[0]), self.n_steps, staleness

    def _saga_epoch(self, x, intercept, cert, plan, samples):
        """ProxASAGA: the average (1/n) A^T memory summed exactly each epoch (racing
        threads lose some of the kernel's increments of it; the loss must not
        accumulate)."""
        active = self.active
        if self.memory is None:
            self.memory = -cert.rho
        average = csr_rmatvec(active.indptr, active.indices, active.data, self.memory,
                              active.n_features, self.n_threads) / self.n_samples
        step = SagaStep(self.memory, average, np.array([float(np.mean(self.memory))]),
                        per_feature(plan.reweighting, active.block_indptr),
                        plan.thresholds, plan.eta, plan.eta_intercept)
        return self.inner_loop.run_saga(active, x, intercept, step, samples)

    def working_set_step(self, x, cert, gap):
        """The working-set step (``working_set.step``) to a fraction of ``gap``;
        the working sets' columns are kept between calls (``ColumnStore``)."""
        if self.columns is None:
            self.columns = ColumnStore(self.n_original)
            self.grams = GramStore(self.n_original, self.hessian_cache)
        return step(self.columns, self.active, x, cert, gap, self.grams, self.n_threads)

    def record(self):
        """Nothing beyond the driver's record: no bytes, no messages."""
        return {}

    def expand(self, x):
        return self.active.expand(x)

    def features(self):
        return self.active.features
