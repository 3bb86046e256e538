"""Dis-DDSS's server: the DDSS driver's backend on rank 0 (docs/design.md §3).

The server holds x on the active blocks, the column statistics and the history, and
drives: ``ddss.Driver`` runs on it, and each of the driver's calls below is one step of
the protocol every worker follows (``worker.run_worker``), in the same order:
  - ``certify``: [b, x] broadcast where the workers do not hold them (after a resume, a
    warm start or a rejected epoch), the intercept's refit and the certificate's sums
    (``protocol``), the dual scale and D;
  - every decision then goes out as one control word (``protocol.CONTROL``: the status,
    the blocks the screening removed, the squared loss's intercept shift, the epoch's
    steps), followed by the removed blocks' positions: ``command`` (stop, recertify,
    reject), ``newton_step`` (then ``newton.DistributedStep``), ``epoch`` (then the
    anchor and ``inner.serve_epoch``); ``compact`` only restricts the server's own
    statistics, the workers compact their shards on the next control word.
"""
import numpy as np

from ...comm.messages import ChangeLog, add_weighted_delta, changed_since
from ...losses import generalized_residual, loss_of_code
from ...newton.kernels import ReducedHessian
from ...penalties import per_feature
from ...problem import Certificate, dropped_share
from ...runtime import blas_threads_beside
from ..ddss import (EPOCH, NEWTON, REJECT, START_ERROR, START_FRESH, WORKING_SET,
                    l1_prox_svrg, prox_svrg_epochs)
from .inner import HEADER, MIN_MOVE_CAP, MOVE_CAP, adapt_damping_power, overshoot_weights, \
    serve_epoch
from .newton import DistributedStep
from .protocol import (CERTIFICATE_SUMS, CONTROL, close_channel, distributed_null_objective,
                       fold_intercept_shift, intercept_refit, send_anchor,
                       squared_conjugate_sum)
from .working_set import server_newton_step, server_step


class ServerBackend:
    """The driver's backend on rank 0 of ``wire`` (``ddss.Driver`` documents the
    interface). ``stats``: the shards' ``protocol.ShardStatistics``; ``penalty`` over
    all ``n_features`` features; ``batch``: local steps per message; ``flags``: the
    method's (variance_reduced, saga, dense)."""

    def __init__(self, wire, channel, stats, penalty, n_features, loss_code, lam,
                 fit_intercept, batch, flags):
        self.wire, self.channel, self.stats = wire, channel, stats
        self.full_penalty, self.n_original, self.code = penalty, n_features, loss_code
        self.lam, self.fit_intercept, self.batch = lam, fit_intercept, batch
        self.variance_reduced, self.saga, self.dense = flags
        self.loss = loss_of_code(loss_code)
        self.n_samples, self.lipschitz = stats.n, self.loss.lipschitz
        self.folded = fit_intercept and self.loss.quadratic
        self.n_workers = wire.comm.Get_size() - 1
        self.blocks = np.arange(penalty.n_blocks)
        self.penalty = penalty.restricted(self.blocks)
        self.column_sq, self.column_sums = stats.column_sq, stats.column_sums
        self.column_counts = stats.column_counts
        # max_i c_i ||a_i||^2 + max_i c_i s^2 (``problem.weighted_row_bound``)
        self.max_row_sq_norm = stats.max_row_sq + stats.max_weight * stats.intercept_sq
        self.intercept_scale_sq = stats.intercept_sq
        self.blas_limit = blas_threads_beside(wire.local_ranks)
        self.newton_max_support = penalty.newton_max_support
        self.l1_epochs = l1_prox_svrg(penalty, *flags)
        self.freezing = prox_svrg_epochs(*flags)
        self.reduced = ReducedHessian() if self.loss.quadratic else None
        self.move_cap, self.damping_power, self.calm = MOVE_CAP, 1.0, 0
        self.messages, self.message_bytes = 0, 0
        self.in_sync = True       # whether the workers hold the server's x and b
        self.last_working_set = None      # the size of the last working set
        self.dropped, self.shift, self.epoch_gap = np.zeros(0, dtype=np.int64), 0.0, None
        self._norms = self._reweighting = None

    weights = property(lambda self: self.penalty.weights)
    nnz = property(lambda self: int(np.sum(self.column_counts)))   # over every shard
    block_indptr = property(lambda self: self.penalty.indptr)
    n_features = property(lambda self: self.penalty.ids.shape[0])

    def announce(self, kind):
        """Broadcast where the run starts; the workers hold x only for a fresh start.
        On START_ERROR the channel is closed (the driver raises the reading error)."""
        self.wire.bcast(np.array([float(kind)]))
        self.in_sync = kind == START_FRESH
        if kind == START_ERROR:
            close_channel(self.wire, self.channel)

    def null_objective(self):
        return distributed_null_objective(self.wire, None, self.n_samples, self.code,
                                          self.fit_intercept)

    def certify(self, x, b):
        """The certificate at (x, b) from the workers' sums; ``rho_sum`` and the
        correlation are over all rows (z and rho stay on the workers). The elastic
        net's L2 term is the server's, which holds x: the correlation becomes
        c = A^T rho - n mu w x, P adds mu ||x||_w^2 / 2 and D subtracts
        mu ||x||_w^2 / (2 s^2) (docs/design.md §1); the workers' sums are the loss's."""
        wire, n, code = self.wire, self.n_samples, self.code
        if not self.in_sync:
            wire.bcast(np.concatenate(([b], x)))
            self.in_sync = True
        if self.fit_intercept and not self.folded:
            b = intercept_refit(wire, code, np.zeros(0), np.zeros(0), b,
                                self.stats.weight_total)
        total = wire.reduce(np.empty(CERTIFICATE_SUMS + x.shape[0]), root_blank=True)
        correlation = total[CERTIFICATE_SUMS:]
        self.shift = 0.0
        if self.folded:           # the workers shift theirs on the control word
            weight = self.stats.weight_total
            self.shift = float(total[1]) / weight
            fold_intercept_shift(total, self.shift, weight, self.stats.y_total,
                                 self.column_sums)
            b += self.shift
        penalty = self.penalty
        correlation = penalty.constraint_correlation(correlation, x, n * self.lam)
        block_corr = penalty.dual_block_norms(correlation)
        dual_norm = float(np.max(block_corr / penalty.weights, initial=0.0))
        scale = max(1.0, dual_norm / (n * self.lam))
        if self.loss.quadratic:
            conjugate = squared_conjugate_sum(total[2], total[3], scale)
        else:
            wire.bcast(np.array([scale]))
            conjugate = wire.reduce(np.zeros(1))[0]
        self.total = total
        dual = -conjugate / n
        if penalty.l2:
            dual -= self.lam * penalty.l2_value(x) / (scale * scale)
        cert = Certificate(None, b, None, correlation, block_corr, scale,
                           total[0] / n + self.lam * penalty.value(x), dual,
                           rho_sum=float(total[1]))
        if self.epoch_gap is not None:
            self.damping_power, self.calm = adapt_damping_power(
                self.damping_power, self.calm, cert.gap > self.epoch_gap)
            self.epoch_gap = None
        return cert

    def command(self, status, eta=0.0, eta_intercept=0.0):
        """The control word, then the removed blocks' positions (if any)."""
        control = np.array([float(status), float(self.dropped.shape[0]), self.shift, eta,
                            eta_intercept])
        assert control.shape[0] == CONTROL
        self.wire.bcast(control)
        if self.dropped.shape[0]:
            self.wire.bcast(self.dropped.astype(np.float64))
        self.dropped, self.shift = np.zeros(0, dtype=np.int64), 0.0
        if status == REJECT:      # x goes back to the snapshot
            self.in_sync = False

    def block_column_norms(self):
        if self._norms is None:
            self._norms = np.sqrt(np.add.reduceat(self.column_sq, self.penalty.indptr[:-1])) \
                if self.n_features else np.zeros(0)
        return self._norms

    def reweighting(self):
        """d_g = n / n_g per active block (eq. 3-6)."""
        if self._reweighting is None:
            self._reweighting = self.n_samples / np.maximum(self.stats.block_rows[self.blocks],
                                                            1.0)
        return self._reweighting

    def dropped_share(self, keep):
        return dropped_share(self.column_counts, self.penalty.indptr, keep)

    def compact(self, keep, x):
        """The server's statistics on the kept blocks; the positions removed go to the
        workers with the next control word."""
        feature_keep = per_feature(keep, self.penalty.indptr)
        self.dropped = np.flatnonzero(~keep)
        self.column_sq = self.column_sq[feature_keep]
        if self.folded:
            self.column_sums = self.column_sums[feature_keep]
        self.column_counts = self.column_counts[feature_keep]
        self.blocks = self.blocks[keep]
        self.penalty = self.full_penalty.restricted(self.blocks)
        self._norms = self._reweighting = None
        return x[feature_keep], bool(np.any(x[~feature_keep] != 0))

    def reject(self):
        """Halve the move cap down to MIN_MOVE_CAP; below it the driver halves eta."""
        if self.move_cap > MIN_MOVE_CAP:
            self.move_cap /= 2
            return True
        return False

    def newton_step(self, x, b, cert, firm):
        self.command(NEWTON)
        return DistributedStep(
            self.wire, None, x, b, np.zeros(0), self.code, self.lam, self.n_samples,
            self.penalty, self.fit_intercept, cert.correlation, cert.rho_sum, firm,
            float(self.total[0]), self.column_sq, self.reduced,
            self.full_penalty.active_features(self.blocks)).run()

    def working_set_step(self, x, cert, gap):
        """The working-set step over the shards (``working_set.server_step``); the
        workers receive the move with the next certificate. Returns (x, b, passes,
        |W|, its work)."""
        self.command(WORKING_SET)
        if self.loss.quadratic:
            result = server_step(
                self.wire, x, cert.intercept, cert, self.total, self.n_samples, self.lam,
                self.penalty, self.features(), self.fit_intercept, self.reduced, gap,
                self.column_counts, self.n_workers, self.last_working_set)
        else:
            result = server_newton_step(
                self.wire, x, cert.intercept, cert, self.n_samples, self.lam,
                self.penalty, self.fit_intercept, gap, self.column_counts,
                self.column_sq, self.lipschitz, self.n_workers, self.last_working_set,
                self.stats.weight_total)
        self.last_working_set = result[3]
        self.in_sync = False
        return result

    def epoch(self, x, b, cert, plan, dispatched):
        """The epoch's control word and anchor, then the deltas served until every
        worker is through its shard."""
        wire = self.wire
        self.command(EPOCH, plan.eta, plan.eta_intercept)
        if self.freezing:
            send_anchor(wire, plan, self.penalty.indptr)
        else:
            wire.bcast(np.concatenate(([plan.mu_intercept], plan.weighted_mu)))
        dispatched()
        if self.saga:      # the workers' exact sum of their gradient memories
            wire.allreduce(np.zeros(1 + x.shape[0]))
        self.epoch_gap = cert.gap
        per_batch = self.lipschitz * self.batch
        l = self.n_workers
        x, b, steps, staleness, self.messages, self.message_bytes = serve_epoch(
            self.channel, x, b, l,
            overshoot_weights(plan.eta * per_batch * self.column_sq / self.n_samples, l,
                              self.move_cap),
            float(overshoot_weights(plan.eta_intercept * per_batch, l, self.move_cap)),
            self.damping_power, self.penalty.weights > 0 if self.l1_epochs else None,
            self.penalty.positive)
        return x, b, steps, staleness

    def record(self):
        return {"bytes_sent": self.wire.sent,
                "bytes_recv": self.wire.received, "messages": self.messages,
                "message_bytes": self.message_bytes, "transport": self.channel.name,
                "batch": self.batch, "move_cap": self.move_cap,
                "damping_power": self.damping_power}

    def expand(self, x):
        coef = np.zeros(self.n_original)
        coef[self.features()] = x
        return coef

    def features(self):
        return self.full_penalty.active_features(self.blocks)


def load_server_kernels(penalty, loss_code):
    """Load the numba kernels the server runs in every Dis-DDSS solve (from numba's cache,
    or compiled where it is cold), on tiny inputs of the solve's types. A process's first
    kernel also builds numba's typing and target contexts, time that the server
    otherwise spends inside the first certificate while every worker waits
    for its decision; a caller with idle time on the server calls this there (the command
    line, while the workers parse their byte ranges)."""
    empty = np.zeros(0)
    generalized_residual(loss_code, empty, empty, empty, np.empty(0))
    penalty.value(np.zeros(penalty.ids.shape[0]))
    x, omega = np.zeros(1), np.ones(1)
    index, values = np.zeros(1, dtype=np.int32), np.zeros(HEADER + 1)
    changed_at, before_run = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    run_source = np.zeros(1, dtype=np.int32)
    for orthant in (None, np.ones(1, dtype=bool)) if penalty.keeps_orthant else (None,):
        add_weighted_delta(x, changed_at, index, values, HEADER, 1.0, omega, 1, 1,
                           run_source, before_run, orthant, penalty.positive)
    log = ChangeLog(1, 1)
    log.add(index)
    log.owed(1, changed_at, 0, run_source, before_run)
    changed_since(changed_at, 0, 1, run_source, before_run)   # a log longer than x
