"""Dis-DDSS's workers: each holds its shard of the rows and executes (docs/design.md §3).

``run_worker`` is the worker's whole program, the mirror of ``server.ServerBackend``:
its share of every certificate, then the server's control word, then what it says.
"""
import numpy as np

from ...kernels.linalg import csr_rmatvec
from ...kernels.svrg import dense_svrg_epoch
from ...kernels.workspace import Clock, SagaStep, SvrgStep
from ...losses import generalized_residual, loss_of_code, mean_neg_conjugate
from ...newton.kernels import ReducedHessian
from ...penalties import per_feature
from ..ddss import (EPOCH, NEWTON, RECERTIFY, REJECT, START_ERROR, START_FRESH, STOP,
                    WORKING_SET, epoch_thresholds, prox_svrg_epochs)
from .inner import work_epoch
from .newton import DistributedStep
from .protocol import (CERTIFICATE_SUMS, CONTROL, certificate_sums, close_channel,
                       distributed_null_objective, fold_intercept_shift, intercept_refit,
                       receive_anchor)
from .working_set import WorkerSums, worker_newton_step, worker_step


class Shard:
    """A worker's state: its ActiveSet ``active`` (its rows on the active blocks), x and
    b (the server's after every epoch), the active ``blocks`` and their ``penalty``."""

    def __init__(self, active, penalty, n_features):
        self.active, self.full_penalty = active, penalty
        self.blocks = np.arange(penalty.n_blocks)
        self.penalty = penalty.restricted(self.blocks)
        self.x, self.b = np.zeros(n_features), 0.0

    def compact(self, dropped, status):
        """Drop the blocks at positions ``dropped``; the rows too unless the run stops."""
        keep = np.ones(self.penalty.n_blocks, dtype=bool)
        keep[dropped] = False
        feature_keep = per_feature(keep, self.penalty.indptr)
        self.blocks = self.blocks[keep]
        self.penalty = self.full_penalty.restricted(self.blocks)
        if status != STOP:
            self.active, _, _ = self.active.compact(keep, np.zeros(feature_keep.shape[0]))
            self.x = self.x[feature_keep]
        return feature_keep


def run_worker(wire, channel, shard, stats, loss_code, lam, fit_intercept, flags, rng,
               batch, checkpoint=None):
    """Follow the server until it says stop; returns the active blocks. ``stats``: the
    ``protocol.ShardStatistics``; ``flags``: (variance_reduced, saga, dense)."""
    n, code, y = stats.n, loss_code, shard.active.y
    weights = shard.active.sample_weight      # the kernel form: empty without weights
    quadratic = loss_of_code(code).quadratic
    folded = fit_intercept and quadratic
    kind = int(wire.bcast(np.zeros(1))[0])
    if kind == START_ERROR:
        close_channel(wire, channel)
        raise ValueError(f"the server could not read the checkpoint {checkpoint}")
    if kind != START_FRESH:       # the driver's P(0)
        distributed_null_objective(wire, y, n, code, fit_intercept, weights)
    in_sync = kind == START_FRESH
    if prox_svrg_epochs(*flags):
        shard.active.touch_view_buffers()     # on whatever core idles before the view
    epochs = EpochRunner(shard, stats, lam, flags, rng, batch)
    reduced = ReducedHessian() if quadratic else None
    working_sums = WorkerSums(shard.full_penalty.ids.shape[0])
    # sum c y and sum c over this shard (compactions keep the rows)
    y_sum = float(weights @ y) if weights.shape[0] else float(np.sum(y))
    shard_weight = float(np.sum(weights)) if weights.shape[0] else float(y.shape[0])
    while True:
        if not in_sync:
            state = wire.bcast(np.empty(1 + shard.x.shape[0]))
            shard.b, shard.x = float(state[0]), state[1:].copy()
            in_sync = True
        active, x = shard.active, shard.x
        z = active.margins(x, shard.b)
        if fit_intercept and not folded:
            shard.b = intercept_refit(wire, code, z, y, shard.b, stats.weight_total,
                                      weights)
        rho = generalized_residual(code, z, y, weights, np.empty_like(z))
        local = certificate_sums(active, code, x, shard.b, z, y, rho)
        wire.reduce(local, root_blank=True)
        if not quadratic:      # D at the dual scale the server broadcasts
            scale = float(wire.bcast(np.zeros(1))[0])
            wire.reduce(np.array([-mean_neg_conjugate(code, rho / scale, y, weights) *
                                  z.shape[0] if z.shape[0] else 0.0]))
        control = wire.bcast(np.zeros(CONTROL))
        status = int(control[0])
        if folded:
            shift = float(control[2])
            fold_intercept_shift(local, shift, shard_weight, y_sum, active.column_sums)
            shard.b += shift
            z += shift
            if weights.shape[0]:
                rho -= shift * weights
            else:
                rho -= shift
        correlation = local[CERTIFICATE_SUMS:]
        if control[1]:
            dropped = wire.bcast(np.empty(int(control[1]))).astype(np.int64)
            correlation = correlation[shard.compact(dropped, status)]
            epochs.reweighting = None
        if status == STOP:
            return shard.blocks
        if status == REJECT:
            in_sync = False
        elif status == NEWTON:
            shard.x, shard.b, _, _ = DistributedStep(
                wire, shard.active, shard.x, shard.b, z, code, lam, n, shard.penalty,
                fit_intercept, correlation, float(local[1]), None, 0.0, None, reduced,
                shard.full_penalty.active_features(shard.blocks)).run()
        elif status == EPOCH:
            epochs.run(wire, channel, control[3], control[4], z, rho)
        elif status == WORKING_SET:       # the move comes with the next certificate
            if quadratic:
                worker_step(wire, working_sums, shard.active, z, code,
                            shard.full_penalty.active_features(shard.blocks),
                            fit_intercept, reduced)
            else:
                worker_newton_step(wire, shard, z, code, fit_intercept, correlation,
                                   float(local[1]))
            in_sync = False
        else:
            assert status == RECERTIFY


class EpochRunner:
    """A worker's inner epochs: the kernel of the method over its shard's rows, in
    batches exchanged with the server (``inner.work_epoch``)."""

    def __init__(self, shard, stats, lam, flags, rng, batch):
        self.shard, self.stats, self.lam = shard, stats, lam
        self.variance_reduced, self.saga, self.dense = flags
        self.freezing = prox_svrg_epochs(*flags)
        self.rng, self.batch = rng, batch
        self.memory = None             # SAGA's gradient memory, one value per own row
        self.reweighting = None        # d per active block
        self.clock = Clock.fresh()

    def run(self, wire, channel, eta, eta_intercept, z_anchor, rho):
        """One epoch at the steps of the server's control word from the anchor's
        margins ``z_anchor``; ``rho`` at the certificate (SAGA's first memory)."""
        shard, stats = self.shard, self.stats
        active, pen = shard.active, shard.penalty
        if self.reweighting is None:
            self.reweighting = stats.n / np.maximum(stats.block_rows[shard.blocks], 1.0)
        thresholds = epoch_thresholds(eta, self.lam, self.reweighting, pen.weights,
                                      self.dense)
        p = shard.x.shape[0]
        if self.freezing:
            mu_intercept, weighted_mu, frozen = receive_anchor(wire, p, pen.group_indptr)
            thresholds = np.where(frozen, np.inf, thresholds)
        else:
            anchor = wire.bcast(np.empty(1 + p))
            mu_intercept, weighted_mu = float(anchor[0]), anchor[1:]
        blocks = active.kernel_blocks()
        movable = None      # the coordinates the epoch can move (None: all)
        if self.saga:
            run_batch = self._saga_batch(wire, eta_intercept, thresholds, eta, rho)
        else:
            step = SvrgStep(z_anchor, weighted_mu, mu_intercept, thresholds, eta,
                            eta_intercept, self.variance_reduced)
            if self.dense:
                rows = active.kernel_rows()

                def run_batch(local, intercept, samples):
                    dense_svrg_epoch(rows, blocks, step, local, intercept, samples)
            else:
                kernel, clock = active.penalty.svrg_kernel(), self.clock
                moving = active.unfrozen_features(thresholds)
                rows = active.without_frozen(thresholds, moving).kernel_rows()
                if not moving.all():      # x stays put elsewhere on every rank
                    movable = np.flatnonzero(moving)

                def run_batch(local, intercept, samples):
                    kernel(rows, blocks, step, local, intercept, samples, clock)
        shard.x, shard.b = work_epoch(channel, active.y.shape[0], shard.x, shard.b,
                                      run_batch, self.rng, self.batch, movable)

    def _saga_batch(self, wire, eta_intercept, thresholds, eta, rho):
        """ProxASAGA's batch: the average (1/n) A^T memory summed exactly over the
        shards each epoch, the memory staying on its worker."""
        active = self.shard.active
        if self.memory is None:
            self.memory = -rho
        memory = self.memory
        local_sum = np.zeros(1 + self.shard.x.shape[0])
        local_sum[0] = np.sum(memory)
        local_sum[1:] = csr_rmatvec(active.indptr, active.indices, active.data, memory,
                                    active.n_features)
        average_all = wire.allreduce(local_sum) / self.stats.n
        average, average_b = average_all[1:].copy(), average_all[:1].copy()
        step = SagaStep(memory, average, average_b,
                        per_feature(self.reweighting, active.block_indptr),
                        thresholds, eta, eta_intercept)
        kernel, rows, blocks = (active.penalty.saga_kernel(), active.kernel_rows(),
                                active.kernel_blocks())

        def run_batch(local, intercept, samples):
            kernel(rows, blocks, step, local, intercept, samples)
        return run_batch
