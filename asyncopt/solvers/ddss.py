"""DDSS: the outer loop of thesis Algorithm 4, written once for every backend.

docs/design.md §1-3.

``Driver`` runs it against a backend: ``local.LocalBackend`` (serial and threads: one
process holds the data) or ``mpi.server.ServerBackend`` (Dis-DDSS: rank 0 drives, the
workers of ``mpi.worker`` hold the row shards and execute). Outer iteration s:

  1. certify (``Backend.certify``): margins z = A x + b, the intercept refitted to its
     optimum, rho, A^T rho (full gradient mu = -A^T rho / n; the elastic net's certificate
     holds c = A^T rho - n mu w x, docs/design.md §1), the dual point theta, P and D;
     G = P - the largest D of any dual point so far (``BestDual``);
  2. where the last epoch cut G by less than half (``StallWatch``), the second-order
     step on the support and a new certificate, chained while a full step leaves
     violating zeros; where the epoch is rejected (``reject_worse_epochs``: P rose above
     P + G at its start, so above P* + 2 G), no step;
  3. record the iteration (``history_record``: one record per outer iteration, one
     schema for every backend), then stop (G <= tol * P(0), the epoch or time limit,
     the callback), or go back to the rejected epoch's start with half the move;
  4. gap-safe screening with the spheres around theta and around the best dual point,
     the data compacted once the removed blocks repay it (``worth_compacting``) and
     certified again where x lost a non-zero;
  5. one inner epoch (``Backend.epoch``): sparse prox-SVRG from the anchor (x, z, mu)
     with step eta = step_scale / (3 L_max) (DDSS; thesis eq. 3-6, 3-8), plain sparse
     stochastic prox steps with eta / (1 + s) (DDSS-Naive), or a baseline's epoch
     (ProxASAGA, ProxASVRG); under prox-SVRG the zeros of x optimal at the anchor stay
     frozen for the epoch (``freeze_optimal_zeros``).
Every certificate is computed at whatever x the steps leave, so the steps change how fast
DDSS converges, never what it certifies.
"""
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..kernels.workspace import SvrgStep
from ..runtime import check_switch
from ..penalties import contiguous_block_norms, l1_dual_norms, per_feature
from ..screening import BestDual, screen_blocks
from ..newton.policy import StallWatch, firm_support, prunes_for_step, violating_zeros
from .checkpoint import load_checkpoint, save_checkpoint
from .choice import (InnerChoice, certificate_work, newton_pays, newton_work,
                     svrg_work)


SAMPLINGS = ("chunked", "uniform")
INNER_STEPS = ("svrg", "working_set", "auto")
COMPACT_NNZ_SHARE = 0.05
COMPACT_FEATURE_SHARE = 0.5
# what the driver tells a backend to do next (``Backend.command``)
STOP, EPOCH, RECERTIFY, REJECT, NEWTON, WORKING_SET = 0, 1, 2, 3, 4, 5
# where a run starts: x = 0, coef_init, a checkpoint, or nowhere (it could not be read)
START_FRESH, START_WARM, START_RESUME, START_ERROR = 0, 1, 2, 3
# the record's keys beyond ``history_record``'s that a backend may fill (``record()``),
# with their values where it has no such thing
BACKEND_RECORD_DEFAULTS = {"messages": 0, "message_bytes": 0, "transport": None,
                           "batch": None, "move_cap": None, "damping_power": None}


def worth_compacting(nnz_share, feature_share):
    """Whether screening out blocks that hold these shares of the stored non-zeros and of
    the features repays a compaction (a pass over the data): at least COMPACT_NNZ_SHARE
    of the non-zeros or COMPACT_FEATURE_SHARE of the features."""
    return nnz_share >= COMPACT_NNZ_SHARE or feature_share >= COMPACT_FEATURE_SHARE


def freeze_optimal_zeros(x, eta, weighted_mu, thresholds, block_indptr=None,
                         positive=False):
    """An epoch's thresholds with the zeros of x that satisfy their optimality condition at
    the epoch's anchor frozen (prox-SVRG): where x_j = 0 and eta |d_j mu_j| <= eta lam d_j
    w_j (|A_j^T rho| <= n lam w_j, so x_j = 0 is optimal given the other coordinates;
    with ``positive``, x >= 0, the one-sided eta max(-d_j mu_j, 0) <= eta lam d_j w_j), the
    threshold becomes +inf and x_j stays zero for the epoch; for blocks (``block_indptr``,
    group Lasso), where x_g = 0 and ||A_g^T rho||_2 <= n lam w_g. Without the noise of the
    steps such a coordinate would not move; with it, it leaves zero and costs later epochs
    (and bytes under MPI) to come back. A coordinate the solution needs violates the
    condition at some anchor and is free from that epoch on; the certificate is computed
    on every coordinate, so what DDSS certifies does not change (celer's working sets and
    the strong rule with a KKT check, here for one epoch at a time). Returns new
    thresholds (the input is kept)."""
    return np.where(optimal_zeros(x, eta, weighted_mu, thresholds, block_indptr, positive),
                    np.inf, thresholds)


def optimal_zeros(x, eta, weighted_mu, thresholds, block_indptr=None, positive=False):
    """The blocks ``freeze_optimal_zeros`` freezes: x_g = 0 and eta ||d_g mu_g||_2 <= the
    block's threshold. ``block_indptr``: contiguous blocks (the ActiveSet's), None for
    one coordinate each (L1: x_j = 0 and eta |d_j mu_j| <= the threshold, with
    ``positive`` eta max(-d_j mu_j, 0), since -d_j mu_j = d_j A_j^T rho / n)."""
    if block_indptr is None:
        return (x == 0.0) & (eta * l1_dual_norms(-weighted_mu, positive) <= thresholds)
    moving = np.add.reduceat(x != 0.0, block_indptr[:-1]) if x.shape[0] else \
        np.zeros(0, dtype=int)
    mu_norms = contiguous_block_norms(weighted_mu, block_indptr)
    return (moving == 0) & (eta * mu_norms <= thresholds)


def prox_svrg_epochs(variance_reduced, saga, dense):
    """Whether the epochs are DDSS's prox-SVRG (not the baselines): their thresholds then
    go through ``freeze_optimal_zeros``."""
    return variance_reduced and not (saga or dense)


def l1_prox_svrg(penalty, variance_reduced, saga, dense):
    """Whether the epochs are DDSS's prox-SVRG with a penalty whose prox keeps x's
    orthant (L1's ``keeps_orthant``): under MPI the server then projects summed deltas
    onto it (``mpi.inner.serve_epoch``)."""
    return prox_svrg_epochs(variance_reduced, saga, dense) and penalty.keeps_orthant


def epoch_rows(rng, n_samples, n_steps, sampling="chunked", chunk=32):
    """Row indices visited by one inner epoch.

    "uniform": i.i.d. uniform rows (the textbook sampling of Algorithm 4).
    "chunked": random reshuffling at the granularity of ``chunk`` consecutive rows: chunks
    in a fresh random order, rows in order inside a chunk, every row once per pass. The
    ActiveSet stores rows in a fixed random order, so a chunk is a random subset, while
    its rows are read near-sequentially (cache-friendly, unlike random access).
    """
    if sampling == "uniform":
        return rng.integers(0, n_samples, n_steps)
    n_chunks = -(-n_samples // chunk)
    passes = []
    for _ in range(-(-n_steps // n_samples)):
        rows = (rng.permutation(n_chunks)[:, None] * chunk + np.arange(chunk)).ravel()
        passes.append(rows[rows < n_samples])
    return np.concatenate(passes)[:n_steps]


def step_size(step_scale, lipschitz, max_row_sq_norm):
    """eta = step_scale / (3 L_max), L_max = L_f max_i (||a_i||^2 + s^2) (``s^2``: the
    intercept's column, ``max_row_sq_norm`` includes it; with sample weights c the bound
    max_i c_i ||a_i||^2 + max_i c_i s^2, ``problem.weighted_row_bound``); thesis
    Algorithm 4's step."""
    return step_scale / (3.0 * lipschitz * max(max_row_sq_norm, 1e-300))


def epoch_thresholds(eta, lam, reweighting, weights, dense=False):
    """The prox thresholds per block, eta lam d_g w_g (eq. 3-6; ProxASVRG's dense steps
    are not reweighted: d_g = 1)."""
    return eta * lam * (1.0 if dense else reweighting) * weights


@dataclass
class EpochPlan:
    """What one inner epoch runs with, formed once by the driver for every backend.

    eta, eta_intercept (eta s^2): the steps; mu_intercept, weighted_mu: the anchor's
    gradient -sum(rho) / n and -d A^T rho / n (DDSS; -A^T rho / n for ProxASVRG; zeros
    for DDSS-Naive and SAGA), zero where frozen; thresholds: per block, +inf where frozen;
    frozen: the blocks ``freeze_optimal_zeros`` froze (None when the epochs do not
    freeze); reweighting: d_g per block; variance_reduced: prox-SVRG's steps (else
    DDSS-Naive's plain stochastic ones)."""

    eta: float
    eta_intercept: float
    mu_intercept: float
    weighted_mu: np.ndarray
    thresholds: np.ndarray
    frozen: np.ndarray
    reweighting: np.ndarray
    variance_reduced: bool = True

    def svrg_step(self, z_snap):
        """The prox-SVRG kernels' step (``workspace.SvrgStep``) from the anchor's margins
        ``z_snap``."""
        return SvrgStep(z_snap, self.weighted_mu, self.mu_intercept, self.thresholds,
                        self.eta, self.eta_intercept, self.variance_reduced)


def epoch_plan(cert, x, eta, eta_intercept, lam, n, reweighting, weights, block_indptr,
               group_indptr, variance_reduced, saga, dense, positive=False,
               correlation=None):
    """The EpochPlan at the certificate ``cert`` (``cert.rho_sum`` = sum rho) and x, for
    the method's flags (``positive``: the penalty's, whose zeros' optimality is
    one-sided, ``optimal_zeros``). ``correlation``: A^T rho, the loss's part alone
    (default ``cert.correlation``, which it is without an L2 term; the elastic net's
    certificate holds c = A^T rho - n mu w x, and its L2 term is the prox's, not the
    anchor gradient's: ``penalties.L1.loss_correlation``)."""
    p = x.shape[0]
    thresholds = epoch_thresholds(eta, lam, reweighting, weights, dense)
    if variance_reduced and not saga:
        weighted_mu = (cert.correlation if correlation is None else correlation) / -n
        if not dense:
            weighted_mu *= per_feature(reweighting, block_indptr)
        mu_intercept = -cert.rho_sum / n
    else:
        weighted_mu, mu_intercept = np.zeros(p), 0.0
    frozen = None
    if prox_svrg_epochs(variance_reduced, saga, dense):
        frozen = optimal_zeros(x, eta, weighted_mu, thresholds, group_indptr, positive)
        thresholds = np.where(frozen, np.inf, thresholds)
        weighted_mu[per_feature(frozen, block_indptr)] = 0.0
    return EpochPlan(eta, eta_intercept, mu_intercept, weighted_mu, thresholds, frozen,
                     reweighting, variance_reduced)


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
    point. ``active`` has ``n_features``, ``nnz`` (None where unknown) and the original
    feature count ``problem.n_features`` or ``n_original``."""
    dual = cert.dual if best is None else best.dual
    gap = max(cert.primal - dual, 0.0)
    original = getattr(active, "n_original", None)
    return {"epoch": epoch, "time": elapsed, "primal": cert.primal, "dual": dual,
            "dual_at_x": cert.dual,
            "gap": gap, "rel_gap": gap / reference if reference > 0 else 0.0,
            "n_active": x.shape[0],
            "n_features": active.problem.n_features if original is None else original,
            "active_nnz": active.nnz, "coef_nnz": int(np.count_nonzero(x)),
            "inner_steps": inner_steps, "bytes_sent": 0,
            "bytes_recv": 0, "staleness_mean": staleness_mean,
            "staleness_max": staleness_max}


def starting_point(checkpoint, coef_init, intercept_init, n_features, lam, l2=0.0):
    """Where a run starts: (START_*, coef or None, intercept, history). A warm start
    (``coef_init``) takes precedence over the checkpoint; a checkpoint with records
    resumes its run (ValueError where it is not a checkpoint of this problem, lam and
    L2 strength ``l2``)."""
    if coef_init is not None:
        return START_WARM, np.asarray(coef_init, dtype=np.float64), float(intercept_init), []
    if checkpoint is not None and os.path.exists(checkpoint):
        coef, b, _, history = load_checkpoint(checkpoint, n_features, lam, l2)
        if history:
            return START_RESUME, coef, b, history
    return START_FRESH, None, 0.0, []


@dataclass
class Settings:
    """The outer loop's options (``solve_ddss`` documents each). ``reject_worse_epochs``
    and ``checkpoint_interval`` are where backends differ by design: Dis-DDSS's summed
    stale deltas can overshoot, so its epochs are checked, and its server checkpoints
    every outer iteration (interval 0)."""

    tol: float = 1e-4
    max_epochs: int = 200
    screening: bool = True
    variance_reduced: bool = True
    saga: bool = False
    dense: bool = False
    support_newton: bool = True
    step_scale: float = 1.0
    callback: object = None
    max_time: float = None
    checkpoint: str = None
    checkpoint_interval: float = 60.0
    reject_worse_epochs: bool = False
    verbose: int = 0
    label: str = "ddss"
    inner: str = "svrg"
    choice: object = None


@dataclass
class Snapshot:
    """x, b, P and x's own gap where an epoch started."""

    x: np.ndarray
    b: float
    primal: float
    gap: float


class Driver:
    """The DDSS outer loop over a backend; ``run()`` returns the SolverResult.

    A backend provides: ``n_samples``, ``lam``, ``lipschitz``, ``n_original`` (features
    of the problem), ``n_features``, ``nnz`` (stored entries of the active set, None
    where unknown), ``penalty`` (on the active blocks), ``weights``, ``block_indptr``,
    ``max_row_sq_norm``, ``intercept_scale_sq``, ``blas_limit``, ``newton_max_support``;
    and
      - ``announce(kind)``: where the run starts (START_*), before the first certificate;
      - ``null_objective()``: P(0), the scale of the relative gap;
      - ``certify(x, b)``: the Certificate at (x, b) (b refitted, ``rho_sum`` = sum rho);
      - ``block_column_norms()``, ``reweighting()``, ``dropped_share(keep)``;
      - ``compact(keep, x)``: (x on the kept blocks, whether a dropped one was non-zero);
      - ``command(status)``: what comes next (STOP, RECERTIFY, REJECT) where no step
        follows;
      - ``epoch(x, b, cert, plan, dispatched)``: one inner epoch from (x, b) ->
        (x, b, steps, (mean tau, max tau)); ``dispatched()`` is called once the epoch's
        work is handed out (the checkpoint is written meanwhile);
      - ``working_set_step(x, cert, gap)``: the working-set step (``inner=
        "working_set"`` or ``"auto"``; in this process, or solved on the MPI server
        from the workers' shares) -> (x, b, inner epochs, its size, its work as
        ``choice.InnerChoice`` counts it);
      - ``newton_step(x, b, cert, firm)``: the second-order step on the support ->
        (x, b, t, products) or None (no trial lowered P; x as it was);
      - ``reject()``: after a rejected epoch, whether the backend cut its own move (else
        the driver halves the step);
      - ``record()``: its values of ``history_record``'s bytes and of
        BACKEND_RECORD_DEFAULTS' keys (the others keep their defaults);
      - ``expand(x)``, ``features()``: x over all features, the active ones' ids.
    """

    def __init__(self, backend, settings, coef_init=None, intercept_init=0.0):
        self.backend, self.settings = backend, settings
        self.coef_init, self.intercept_init = coef_init, intercept_init
        self.best = BestDual()
        self.watch = None
        # the support Newton step models the loss alone: not with the elastic net's L2
        # term (``penalty.l2``; docs/design.md §2b)
        if settings.support_newton and not settings.saga and not backend.penalty.l2:
            self.watch = StallWatch(backend.newton_max_support)
        self.history, self.epochs, self.first_epoch, self.steps = [], 0, 0, 0
        self.staleness, self.step_factor, self.snapshot = (0.0, 0), 1.0, None
        self.firm_before, self.firm_at = None, (None, None)
        self.working_set_size = None      # features of the last working-set step
        self.final_keep = None            # the last screening's features, uncompacted
        self.choice = None if settings.inner != "auto" else \
            InnerChoice() if settings.choice is None else settings.choice
        self.pending = None               # (kind, gap before) of the step to credit
        self.work = 0.0                   # the last step's work (``choice``)
        self.phases = {"certificate_s": 0.0, "inner_s": 0.0, "newton_s": 0.0,
                       "newton_step": 0.0, "newton_products": 0}

    def run(self):
        """Solve; returns the SolverResult (coefficients over every feature)."""
        from ..progress import ProgressLine
        from ..runtime import blas_threads
        s, backend = self.settings, self.backend
        self.start = time.perf_counter()
        self.last_saved = self.start
        x, b = self._begin()
        with ProgressLine(s.verbose, label=s.label) as progress, \
                blas_threads(backend.blas_limit):
            try:
                x, b, cert, converged = self._loop(x, b, progress)
            except BaseException:
                if s.checkpoint is not None and self.history:  # a valid iterate: keep it
                    try:
                        self._save(self.live[0], self.live[1])
                    except Exception:     # the error to report is the one that stopped
                        pass
                raise
        if s.checkpoint is not None:
            self._save(x, cert.intercept)
        features = backend.features() if self.final_keep is None else \
            backend.features()[self.final_keep]
        return SolverResult(backend.expand(x), float(cert.intercept), self.epochs,
                            cert.primal, self.best.dual, self.best.gap(cert.primal),
                            features.copy(), converged, self.history)

    def _begin(self):
        """x and b where the run starts, told to the backend (a warm start's or a
        checkpoint's x through the penalty's ``projection``: x >= 0 for the positive L1
        penalty); the history of a resumed run and P(0) (``reference``; None until the
        first certificate of a fresh run)."""
        s, backend = self.settings, self.backend
        try:
            kind, coef, b, history = starting_point(s.checkpoint, self.coef_init,
                                                    self.intercept_init,
                                                    backend.n_original, backend.lam,
                                                    backend.penalty.l2)
        except ValueError:
            backend.announce(START_ERROR)
            raise
        backend.announce(kind)
        self.reference = None if kind == START_FRESH else backend.null_objective()
        x = np.zeros(backend.n_features) if coef is None else \
            backend.penalty.projection(coef[backend.features()])
        if kind == START_RESUME:
            self.history = history
            self.first_epoch = history[-1]["epoch"] + 1
            self.time_offset = history[-1]["time"]
            self.steps = history[-1]["inner_steps"]
        else:
            self.time_offset = 0.0
        return x, (b if backend.fit_intercept else 0.0)

    def _certify(self, x, b):
        began = time.perf_counter()
        cert = self.backend.certify(x, b)
        self.phases["certificate_s"] += time.perf_counter() - began
        if self.choice is not None:
            self.work += certificate_work(self.backend.nnz, self.backend.n_samples)
        self.best.offer_certificate(cert)
        if self.reference is None:      # P at x = 0 with its optimal intercept is P(0)
            self.reference = cert.primal
        return cert

    def _loop(self, x, b, progress):
        """Certify, step on the support, record, decide, run an epoch, until a stop;
        returns (x, b, the last certificate, converged)."""
        backend = self.backend
        cert = self._certify(x, b)
        while True:
            self.live = (x, cert.intercept)
            rejected = self._rejected(cert)
            firm, churn = self._firm(x, cert)
            if not rejected:
                x, cert = self._newton_steps(x, cert, firm, churn)
            self._credit(cert)
            self._record(x, cert, churn, progress)
            if self._stops(cert):
                x, cert = self._screen_and_compact(x, cert, final=True)
                backend.command(STOP)
                return x, cert.intercept, cert, \
                    bool(self.best.gap(cert.primal) <= self.settings.tol * self.reference)
            self._save_if_due(x, cert.intercept)
            if rejected:
                self._save_if_due(x, cert.intercept, after_decision=True)
                x, b = self._reject()
                cert = self._certify(x, b)
                continue
            x, cert = self._screen_and_compact(x, cert)
            x, b = self._epoch(x, cert)
            cert = self._certify(x, b)

    def _rejected(self, cert):
        """Whether the last epoch is rejected (``reject_worse_epochs``): P rose above
        P + G at its start, so above P* + 2 G."""
        snapshot = self.snapshot
        return self.settings.reject_worse_epochs and snapshot is not None and \
            not cert.primal <= snapshot.primal + snapshot.gap

    def _reject(self):
        """x and b back at the rejected epoch's start, the move (the backend's cap, or
        else the step) halved for the rest of the run."""
        if not self.backend.reject():
            self.step_factor /= 2
        x, b = self.snapshot.x.copy(), self.snapshot.b
        self.epochs += 1
        self.snapshot = None
        self.backend.command(REJECT)
        return x, b

    def _firm(self, x, cert):
        """(x's firm support at the certificate, the changes since the last epoch's
        start), both None without the watch."""
        if self.watch is None:
            return None, None
        backend = self.backend
        firm = firm_support(x, cert.correlation, backend.n_samples, backend.lam,
                            backend.weights, backend.penalty.group_indptr)
        churn = None if self.firm_before is None else \
            int(np.count_nonzero(self.firm_before != firm))
        self.firm_before = None
        self.firm_at = (cert, firm)
        return firm, churn

    def _newton_steps(self, x, cert, firm, churn):
        """The second-order step where the watch sees a stall, chained while a full step
        leaves violating zeros (``StallWatch``); returns (x, its certificate)."""
        watch, backend, best = self.watch, self.backend, self.best
        goal = self.settings.tol * self.reference
        groups = backend.penalty.group_indptr
        if watch is None or not best.gap(cert.primal) > goal:
            return x, cert
        support = int(np.count_nonzero(firm))
        if not watch.should_try(self.epochs, best.gap(cert.primal), support, churn, goal,
                                prunes_for_step(x, groups is not None)):
            return x, cert
        if self.choice is not None and not newton_pays(support, backend.nnz,
                                                       backend.n_samples):
            return x, cert
        while True:
            gap_before = best.gap(cert.primal)
            began = time.perf_counter()
            moved = backend.newton_step(x, cert.intercept, cert, firm)
            self.phases["newton_s"] += time.perf_counter() - began
            if self.choice is not None:
                self.work += newton_work(int(np.count_nonzero(firm)))
            if moved is not None:
                x, b, self.phases["newton_step"], products = moved
                self.phases["newton_products"] += products
                cert = self._certify(x, b)
            watch.tried(self.epochs, gap_before, best.gap(cert.primal))
            if moved is None or best.gap(cert.primal) <= goal:
                return x, cert
            violating, _ = violating_zeros(x, cert.correlation, backend.n_samples,
                                           backend.lam, backend.weights, groups,
                                           positive=backend.penalty.positive)
            if not watch.should_chain(moved[2], violating.shape[0]):
                return x, cert
            firm, _ = self._firm(x, cert)

    def _record(self, x, cert, churn, progress):
        """Append the iteration's record (``history_record`` and the backend's and the
        driver's counters)."""
        self.now = time.perf_counter() - self.start
        record = history_record(self.first_epoch + self.epochs,
                                self.time_offset + self.now, cert, self.reference,
                                self.backend, x, self.steps, *self.staleness, self.best)
        record.update(BACKEND_RECORD_DEFAULTS, **self.backend.record(),
                      intercept=cert.intercept,
                      step_factor=self.step_factor, support_changes=churn,
                      working_set=self.working_set_size, **self.phases)
        self.phases = dict.fromkeys(self.phases, 0.0)
        self.phases["newton_products"] = 0
        self.history.append(record)
        progress.update(record)
        self.record = record

    def _stops(self, cert):
        """Whether the run stops at this record: G <= tol * P(0), the epoch or time
        limit, or the callback."""
        s = self.settings
        return self.best.gap(cert.primal) <= s.tol * self.reference or \
            self.epochs >= s.max_epochs or \
            (s.callback is not None and s.callback(self.record)) or \
            (s.max_time is not None and self.now >= s.max_time)

    def _screen(self, cert, final=False):
        """The blocks both gap-safe spheres keep (``screen_blocks``), or None where
        nothing is removed or (unless ``final``) a compaction would not repay itself."""
        backend = self.backend
        keep = screen_blocks(cert, self.best, backend.block_column_norms(),
                             backend.n_samples, backend.lipschitz, backend.lam,
                             backend.weights, backend.penalty.l2)
        if keep.all() or not (final or worth_compacting(*backend.dropped_share(keep))):
            return None
        return keep

    def _screen_and_compact(self, x, cert, final=False):
        """Screening, then the compaction where it repays itself; returns (x, the
        certificate) on the active set. ``final`` (the run stops): the last record and
        the result's active features follow the blocks kept, and the data are compacted
        only where x is non-zero on a block removed (x loses it and is certified
        again)."""
        keep = self._screen(cert, final) if self.settings.screening else None
        if keep is None:
            return x, cert
        feature_keep = per_feature(keep, self.backend.block_indptr)
        if final and not np.any(x[~feature_keep]):
            self.final_keep = feature_keep
            nnz = self.backend.nnz
            self.history[-1].update(
                n_active=int(np.count_nonzero(feature_keep)),
                active_nnz=None if nnz is None else
                nnz - int(round(self.backend.dropped_share(keep)[0] * nnz)))
            return x, cert
        x, dropped_nonzero = self.backend.compact(keep, x)
        self.best.restrict(keep)
        if dropped_nonzero:        # certified again where x lost a non-zero
            self.backend.command(RECERTIFY)
            cert = self._certify(x, cert.intercept)
        else:
            cert = cert.restricted(keep, feature_keep)
        if final:
            self.history[-1].update(n_active=x.shape[0], active_nnz=self.backend.nnz)
        return x, cert

    def _epoch(self, x, cert):
        """One inner epoch from the certificate's anchor, or the working-set step
        (``inner="working_set"``, or ``"auto"``'s choice); returns (x, b)."""
        s, backend = self.settings, self.backend
        kind = s.inner
        if self.choice is not None:
            kind = self.choice.next(svrg=backend.n_features <= backend.n_samples)
            self.pending = (kind, self.best.gap(cert.primal))
        if kind == "working_set":
            return self._working_set_step(x, cert)
        self.working_set_size = None
        eta = step_size(s.step_scale * self.step_factor, backend.lipschitz,
                        backend.max_row_sq_norm)
        if not s.variance_reduced:
            eta /= 1.0 + self.epochs
        penalty = backend.penalty
        plan = epoch_plan(cert, x, eta, eta * backend.intercept_scale_sq, backend.lam,
                          backend.n_samples, backend.reweighting(), backend.weights,
                          backend.block_indptr, penalty.group_indptr,
                          s.variance_reduced, s.saga, s.dense, penalty.positive,
                          penalty.loss_correlation(cert.correlation, x,
                                                   backend.n_samples * backend.lam))
        if s.reject_worse_epochs:
            self.snapshot = Snapshot(x.copy(), cert.intercept, cert.primal, cert.gap)
        if self.watch is not None:      # again only where a step or a compaction moved x
            self.firm_before = self.firm_at[1] if self.firm_at[0] is cert else \
                firm_support(x, cert.correlation, backend.n_samples, backend.lam,
                             backend.weights, backend.penalty.group_indptr)
        self.live = (x, cert.intercept)
        began = time.perf_counter()
        x, b, steps, self.staleness = backend.epoch(
            x, cert.intercept, cert, plan,
            lambda: self._save_if_due(x, cert.intercept, after_decision=True))
        self.phases["inner_s"] += time.perf_counter() - began
        self.steps += steps
        if self.choice is not None:
            self.work = svrg_work(steps, backend.nnz, backend.n_samples)
        self.epochs += 1
        if not np.all(np.isfinite(x)) or not np.isfinite(b):
            raise FloatingPointError(
                "the iterates diverged (non-finite coefficients); try a smaller step_scale")
        return x, b

    def _working_set_step(self, x, cert):
        """The working-set subproblem solved to a fraction of the outer gap
        (``working_set``); returns (x, b)."""
        self.live = (x, cert.intercept)
        self.snapshot = None           # no epoch to reject
        began = time.perf_counter()
        x, b, epochs, self.working_set_size, self.work = self.backend.working_set_step(
            x, cert, self.best.gap(cert.primal))
        self.phases["inner_s"] += time.perf_counter() - began
        self.steps += epochs * self.working_set_size
        self.epochs += 1
        return x, b

    def _credit(self, cert):
        """``inner="auto"``: the last step's fall of the gap, to the record (the support
        Newton steps the watch took after it included), and its work with the
        certificates' since, told to the choice."""
        if self.pending is None:
            return
        kind, before = self.pending
        self.pending = None
        self.choice.credit(kind, before, self.best.gap(cert.primal), self.work)

    def _save_if_due(self, x, b, after_decision=False):
        """Write the checkpoint once checkpoint_interval seconds have passed since the
        last; a checkpoint written every iteration (interval 0) waits for the epoch's
        work to be handed out (``after_decision``)."""
        s = self.settings
        if s.checkpoint is None or (s.checkpoint_interval == 0) != after_decision:
            return
        now = time.perf_counter()
        if now - self.last_saved >= s.checkpoint_interval:
            self._save(x, b)
            self.last_saved = now

    def _save(self, x, b):
        save_checkpoint(self.settings.checkpoint, coef=self.backend.expand(x), intercept=b,
                        lam=self.backend.lam, history=self.history,
                        l2=self.backend.penalty.l2)


def solve_ddss(problem, *, tol=1e-4, max_epochs=200, screening=True, variance_reduced=True,
               coef_init=None, intercept_init=0.0, step_scale=1.0, inner_steps=None,
               sampling="chunked", random_state=None, verbose=0, inner_loop=None,
               label="ddss", callback=None, max_time=None, checkpoint=None,
               checkpoint_interval=60.0, saga=False, dense=False, support_newton=True,
               inner="svrg", inner_choice=None):
    """Solve ``problem`` (a Problem) with DDSS in this process (serial, or threads with a
    ``ThreadsInnerLoop``); returns a SolverResult.

    tol is relative: stop at G <= tol * P(0). step_scale multiplies eta = 1/(3 L_max).
    inner_steps defaults to n (one pass over the rows per outer iteration).
    sampling: "chunked" (default) or "uniform", see ``epoch_rows``.
    callback(record) is called with every history record; returning True stops the run.
    max_time: stop (not converged) once this many seconds have passed.
    checkpoint: a .npz path written every checkpoint_interval seconds, at the end and
    when the run is interrupted (an exception, SystemExit from a signal handler); if it
    exists when the solve starts (and no coef_init is given), the solve resumes from it.
    saga: run the ProxASAGA baseline instead (gradient memory kept across epochs, the
    outer loop only monitors the gap; needs screening=False).
    dense: run the ProxASVRG baseline instead (dense variance-reduced steps over every
    active coordinate, no reweighting, no sparse prox).
    support_newton: take the second-order step on the support (``newton.step``,
    for group penalties its group step) when the watch sees a stall (the baselines
    run without it).
    inner: what runs between two certificates: "svrg" (the prox-SVRG epoch, or the
    baselines'), "working_set" (``working_set``: the problem on a working set of
    blocks; ``working_set.supports`` says which problems) or "auto" (per outer
    iteration the one of the two that has cut the gap fastest per unit of work,
    ``choice.InnerChoice``; "svrg" where the working set does not solve the problem).
    inner_choice: the InnerChoice that "auto" goes on with (a path's solves share one,
    so that what the steps did at one lam guides the next; ``lasso_path``), None for a
    new one.
    """
    from .local import LocalBackend
    from .methods import check_elastic_net
    from .working_set import supports

    check_switch()
    if saga or dense:
        check_elastic_net("prox_asaga" if saga else "prox_asvrg", problem.penalty)
    if saga and screening:
        raise ValueError("the SAGA baseline runs without screening (screening=False)")
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}: expected one of {SAMPLINGS}")
    if inner not in INNER_STEPS:
        raise ValueError(f"unknown inner step {inner!r}: expected one of {INNER_STEPS}")
    refusal = supports(problem) if inner != "svrg" else None
    if refusal is not None and inner == "auto":
        inner = "svrg"
    elif refusal is not None:
        raise ValueError(refusal)
    backend = LocalBackend(problem, inner_loop, np.random.default_rng(random_state),
                           sampling, inner_steps, saga=saga, dense=dense)
    settings = Settings(tol=tol, max_epochs=max_epochs, screening=screening,
                        variance_reduced=variance_reduced, saga=saga, dense=dense,
                        support_newton=support_newton, step_scale=step_scale,
                        callback=callback, max_time=max_time, checkpoint=checkpoint,
                        checkpoint_interval=checkpoint_interval, verbose=verbose,
                        label=label, inner=inner, choice=inner_choice)
    return Driver(backend, settings, coef_init, intercept_init).run()
