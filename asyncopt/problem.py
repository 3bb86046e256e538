"""The regularized problem, its dual and the duality gap (docs/design.md §1).

    P(x, b) = (1/n) sum_i c_i f_i(a_i^T x + b) + lam * Omega(x)
    rho_i   = -c_i f_i'(a_i^T x + b)               (generalized residual)
    theta   = rho / max(1, Omega^D(A^T rho) / (n lam))
    D(theta) = -(1/n) sum_i c_i f_i*(-theta_i / c_i)   G = P - D >= 0
    lam_max = Omega^D(A^T rho(0)) / n               (x = 0 is optimal iff lam >= lam_max)

c_i >= 0 are the sample weights (all 1 without them; the estimators rescale a user's
to sum to n, scikit-learn's convention); a row with c_i = 0 drops out of P and D.

Omega^D is the penalty's ``dual_norm``; for the positive L1 penalty (x >= 0) it is the
one-sided max(0, max_j u_j / w_j), so the dual constraint is A_j^T theta <= n lam w_j
and lam_max is 0 where no feature correlates positively with rho(0).

The elastic net (``penalties.L1`` with l2 > 0, mu = lam l2; docs/design.md §1): the L2
term is the squared loss of extra rows, so A^T rho becomes c = A^T rho - n mu w x in the
dual scale s = max(1, Omega^D(c) / (n lam)), theta = rho / s on the data rows, and
D(theta) = -(1/n) sum_i c_i f_i*(-theta_i / c_i) - mu sum_j w_j x_j^2 / (2 s^2) (the
extra rows have weight 1); lam_max is unchanged (the L2 term's gradient vanishes at
x = 0).

Before every dual computation the intercept b is set to its exact optimum for the current x,
so sum_i rho_i = 0 and theta is feasible for the intercept's constraint.

``ActiveSet`` is the problem restricted to the blocks that survived screening, with the data
compacted to those columns (features renumbered block by block, blocks contiguous); every
solver and backend works on it.
"""
import copy
import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit

from .kernels.linalg import (csc_rows, csr_column_stats, csr_compact_columns_,
                             csr_keep_columns, csr_margins, csr_permute, csr_rmatvec,
                             csr_row_sq_norms, csr_select, csr_stored_counts,
                             csr_transpose)
from .kernels.workspace import Blocks, Rows
from .losses import (LOGISTIC, UNWEIGHTED, generalized_residual, get_loss,
                     intercept_newton, kernel_weights, loss_of_code, mean_loss,
                     mean_neg_conjugate, weight_total)
from .penalties import L1, BlockPenalty, per_feature, singleton_blocks
from .runtime import IdlePageToucher


def refit_intercept(sums, b, n):
    """argmin_b (1/n) sum_i c_i f(z0_i + b, y_i) for a loss that is not quadratic, by
    Newton steps from b to |sum c f'| <= 1e-13 n (or 100 steps); ``sums(b)`` gives (sum
    c f', sum c f'') at the intercept b over all rows (``losses.intercept_sums``), ``n``
    their total weight sum c (the row count without weights): every shard's
    (Dis-DDSS's ``mpi.protocol.intercept_refit``, each call one reduction; one
    process's rows take the same steps compiled, ``losses.intercept_newton``). A Newton
    step is halved while |sum c f'| grows at the trial
    (the objective is convex in b, so a short enough step along -f' shrinks it), except
    once the step is below rounding of b (|step| <= 1e-6 (1 + |b|)), where the quadratic
    model is accurate; the sums at the accepted trial serve the next step, so a step that is not
    halved costs one call. The calls depend only on the sums, so ranks that share them
    call ``sums`` alike."""
    grad, hess = sums(b)
    for _ in range(100):
        if abs(grad) <= 1e-13 * n:
            break
        step = grad / max(hess, 1e-12 * n)
        for _ in range(60):
            trial = sums(b - step)
            if abs(step) <= 1e-6 * (1.0 + abs(b)) or abs(trial[0]) <= abs(grad):
                break
            step *= 0.5
        else:
            trial = sums(b - step)
        b -= step
        grad, hess = trial
    return b


def intercept_optimum(code, z0, y, b, sample_weight=UNWEIGHTED):
    """argmin_b (1/n) sum_i c_i f(z0_i + b, y_i) over these rows from b
    (``sample_weight``: the c_i in the kernel form, ``losses.row_weight``): the
    c-weighted mean of y - z0 for a quadratic loss, else ``losses.intercept_newton``
    (``refit_intercept``'s steps, compiled). Where
    every c_i is 0 no b is better than another: b is returned."""
    total = weight_total(sample_weight, z0.shape[0])
    if not total > 0.0:
        return float(b)
    if loss_of_code(code).quadratic:
        if sample_weight.shape[0]:
            return float(sample_weight @ (y - z0)) / total
        return float(np.mean(y - z0))
    return intercept_newton(code, z0, y, sample_weight, float(b), total)


@njit(cache=True)
def csr_block_row_counts(indptr, indices, feature_block, n_blocks):
    """n_g: the number of rows with a non-zero in block g."""
    counts = np.zeros(n_blocks, dtype=np.int64)
    stamp = np.full(n_blocks, -1, dtype=np.int64)
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            g = feature_block[indices[k]]
            if stamp[g] != i:
                stamp[g] = i
                counts[g] += 1
    return counts


def dropped_share(column_counts, block_indptr, keep_blocks):
    """(share of the stored non-zeros, share of the features) in the blocks that
    ``keep_blocks`` drops; ``column_counts``: the stored non-zeros of each active feature,
    ``block_indptr``: the blocks' feature ranges."""
    dropped = ~per_feature(keep_blocks, block_indptr)
    nnz_share = column_counts[dropped].sum() / max(column_counts.sum(), 1)
    return float(nnz_share), float(dropped.mean()) if dropped.size else 0.0


def weighted_row_bound(row_sq_norms, sample_weight, intercept_sq):
    """max_i ||a_i||^2 + s^2 (``intercept_sq``), or with sample weights c (the kernel
    form) max_i c_i ||a_i||^2 + max_i c_i s^2, a bound on max_i c_i (||a_i||^2 + s^2): the
    largest curvature of a row's loss c_i f_i over L_f, what the step of the inner loop
    is set by (``ddss.step_size``)."""
    if not sample_weight.shape[0]:
        return float(row_sq_norms.max(initial=0.0)) + intercept_sq
    return float((sample_weight * row_sq_norms).max(initial=0.0)) + \
        float(sample_weight.max(initial=0.0)) * intercept_sq


UNFROZEN_SHARE = 0.7   # ActiveSet.without_frozen: a view only below this share of entries
VIEW_SLACK = 1.25      # ... kept while it holds at most this many times the entries needed
TOUCH_WAIT = 0.05      # s the first view waits for ActiveSet.touch_view_buffers' thread


@dataclass(frozen=True)
class RowsView:
    """The rows of an ActiveSet restricted to some of its columns (ids unchanged):
    ``columns`` (bool per feature) says which, ``entries`` is how many non-zeros those
    columns hold (the ActiveSet's column_counts; what ``without_frozen`` compares)."""

    columns: np.ndarray
    entries: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray

    @staticmethod
    def new_buffers(active, count=0):
        """(indptr, indices, data) with room for ``count`` entries and any view
        ``without_frozen`` makes (UNFROZEN_SHARE of the stored entries)."""
        room = max(count, int(np.ceil(UNFROZEN_SHARE * active.indptr[-1]))) + 1
        return (np.empty(active.indptr.shape[0], dtype=np.int64),
                np.empty(room, dtype=active.indices.dtype), np.empty(room))

    @classmethod
    def of(cls, active, columns, buffers=None):
        """(the view of ``active`` on ``columns``, the buffers it lies in): ``buffers``,
        the (indptr, indices, data) of an earlier view, are written over when they have
        room (fresh arrays cost the first touch of their pages), else new ones are made,
        with room for any view ``without_frozen`` makes (UNFROZEN_SHARE of the stored
        entries), since the next epoch's view is often larger than the first (columns
        enter the moving set); a page is touched only where a view writes."""
        count = int(active.stored_column_counts[columns].sum())
        if buffers is None or buffers[1].shape[0] < count + 1:
            buffers = cls.new_buffers(active, count)
        indptr, indices, data = buffers
        csr_keep_columns(active.indptr, active.indices, active.data,
                         columns.astype(np.uint8), indptr, indices, data)
        return cls(columns, int(active.column_counts[columns].sum()), indptr,
                   indices[:count], data[:count]), buffers

    def covers(self, x):
        """Whether every non-zero of x lies in these columns."""
        return not np.any((x != 0.0) & ~self.columns)


def check_finite_data(X, y):
    """X as CSR float64 and y as float64, with clear errors for bad input."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        values = X.data
    else:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-dimensional, got shape {X.shape}")
        values = X
        X = sp.csr_matrix(X)
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-dimensional, got shape {y.shape}")
    n, p = X.shape
    if n == 0 or p == 0:
        raise ValueError(f"empty data: X has shape {X.shape}")
    if y.shape[0] != n:
        raise ValueError(f"X has {n} rows but y has {y.shape[0]} entries")
    if not np.all(np.isfinite(values)):
        raise ValueError("X contains NaN or infinity")
    if not np.all(np.isfinite(y)):
        raise ValueError("y contains NaN or infinity")
    X.sum_duplicates()
    return X, y


def check_sample_weight(sample_weight, n_samples):
    """``sample_weight`` (None, or n_samples finite numbers >= 0) as None or a float64
    array; ValueError naming the fault otherwise. Weights that are all zero pass here
    (a shard of rows may hold no weight); ``rescaled_sample_weight`` refuses them."""
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight)
    if weights.dtype.kind not in "biuf":
        raise ValueError(f"sample_weight must hold numbers, got dtype {weights.dtype}")
    weights = np.full(n_samples, float(weights)) if weights.ndim == 0 else \
        np.array(weights, dtype=np.float64)
    if weights.ndim != 1:
        raise ValueError(f"sample_weight must be 1-dimensional, got shape {weights.shape}")
    if weights.shape[0] != n_samples:
        raise ValueError(f"sample_weight has {weights.shape[0]} entries but X has "
                         f"{n_samples} rows")
    if not np.all(np.isfinite(weights)):
        bad = int(np.flatnonzero(~np.isfinite(weights))[0])
        raise ValueError(f"sample_weight contains NaN or infinity (row {bad})")
    if np.any(weights < 0):
        bad = int(np.flatnonzero(weights < 0)[0])
        raise ValueError(f"sample_weight must be >= 0, got {weights[bad]:g} at row {bad}")
    return weights


def rescaled_sample_weight(sample_weight, n_samples):
    """scikit-learn's convention for ``sample_weight`` (its Lasso and ElasticNet): the
    weights rescaled to sum to n_samples, c = w n / sum w, so that
    P = (1/n) sum_i c_i f_i + lam Omega = (1 / sum w) sum_i w_i f_i + lam Omega. None
    for None, and for weights that are all equal (the unweighted problem, solved
    without the weights' work); ValueError for those ``check_sample_weight`` refuses
    and for weights that are all zero."""
    weights = check_sample_weight(sample_weight, n_samples)
    if weights is None:
        return None
    largest = float(np.max(weights, initial=0.0))
    if not largest > 0.0:
        raise ValueError("sample_weight is zero for every row: nothing to fit")
    if np.all(weights == weights[0]):
        return None
    weights = weights / largest           # a sum that cannot overflow
    return weights * (n_samples / float(np.sum(weights)))


def check_lam(lam):
    lam = float(lam)
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(f"the regularization alpha must be finite and > 0, got {lam}")
    return lam


@dataclass
class Certificate:
    """What one dual pass computes at (x, b): margins z (with b), refitted intercept b,
    generalized residual rho, ``correlation`` = A^T rho on the active set (for the
    elastic net the constraint's c = A^T rho - n mu w x: ``penalties.L1``), the
    penalty's ``dual_block_norms`` of it, the dual scaling, P, D and G."""

    z: np.ndarray
    intercept: float
    rho: np.ndarray
    correlation: np.ndarray
    block_correlation: np.ndarray
    dual_scale: float
    primal: float
    dual: float
    rho_sum: float = None     # sum rho, from rho where not given (the MPI server's)

    def __post_init__(self):
        if self.rho_sum is None:
            self.rho_sum = float(np.sum(self.rho))

    def restricted(self, keep_blocks, feature_keep):
        """This certificate after a compaction to ``keep_blocks`` (``feature_keep`` per
        feature) that removed only zeros of x: the margins, rho, P and D are unchanged,
        A^T rho and the block norms are restricted."""
        return dataclasses.replace(self, correlation=self.correlation[feature_keep],
                                   block_correlation=self.block_correlation[keep_blocks])

    @property
    def gap(self):
        return max(self.primal - self.dual, 0.0)

    @property
    def theta(self):
        return self.rho / self.dual_scale


class ActiveSet:
    """The problem restricted to some blocks, data compacted to their columns.

    Features are renumbered block by block (block g holds features
    ``block_indptr[g]:block_indptr[g+1]``); ``features`` maps them back to the original ids.
    Rows are stored in a fixed shuffled order (``y`` and ``sample_weight`` follow it), so
    that a run of consecutive rows is a random subset: the inner loop reads rows in
    chunks. An ActiveSet made by ``compact`` owns its arrays and is compacted in place
    again.

    ``sample_weight`` is the rows' weights c_i in the kernel form (``losses.row_weight``:
    an empty array where the problem has none), what every kernel takes beside y; the
    column statistics are weighted by it: ``column_sq_norms`` = sum_i c_i a_ij^2 (the
    curvature of coordinate j, and the norm the gap-safe test needs,
    ``block_column_norms``), ``column_sums`` = A^T c.
    """

    def __init__(self, problem, blocks, indptr, indices, data, column_sq_norms,
                 column_counts, block_row_counts, y, owns_data, column_sums=None,
                 row_sq_norms=None, stored_column_counts=None, sample_weight=UNWEIGHTED):
        # the cached properties' values where the caller has them (the full set's come
        # from its column statistics' pass)
        for name, value in (("column_sums", column_sums), ("_row_sq_norms", row_sq_norms),
                            ("stored_column_counts", stored_column_counts)):
            if value is not None:
                self.__dict__[name] = value
        self.problem = problem
        self.blocks = blocks
        self.y = y
        self.sample_weight = sample_weight
        self.owns_data = owns_data
        self.indptr, self.indices, self.data = indptr, indices, data
        self.penalty = problem.penalty.restricted(blocks)
        self.features = problem.penalty.active_features(blocks)
        self.column_sq_norms = column_sq_norms
        self.column_counts = column_counts
        self.block_row_counts = block_row_counts
        self.block_indptr = self.penalty.indptr
        self.feature_block = per_feature(np.arange(len(blocks)), self.block_indptr)
        self.weights = self.penalty.weights
        self._rows_view = None     # the last RowsView of ``without_frozen``
        self._view_buffers = None  # the arrays it lies in (RowsView.of)
        self._touching = None      # touch_view_buffers' IdlePageToucher
        self._zero_correlation = None   # (loss code, b, A^T rho at x = 0 and b)

    def kernel_rows(self):
        """The rows as the epoch kernels take them (``workspace.Rows``)."""
        return Rows(self.indptr, self.indices, self.data, self.y, self.problem.loss.code,
                    self.sample_weight)

    def kernel_blocks(self):
        """The blocks as the epoch kernels take them (``workspace.Blocks``)."""
        return Blocks(self.block_indptr, self.feature_block, self.penalty.positive,
                      self.penalty.l2)

    def touch_view_buffers(self):
        """Make the epoch views' buffers (``RowsView.new_buffers``) and map their pages
        now, on a thread that runs only on a core nothing else wants (``IdlePageToucher``),
        so that the first view writes into mapped memory. A Dis-DDSS worker calls it as
        its solve starts.

        ``without_frozen`` waits for the thread at most TOUCH_WAIT seconds, then stops it
        and makes buffers of its own: a machine busy with other work may starve the thread
        indefinitely.

        Where the problem gave up X (``Problem`` overwrite_X) its arrays, already
        mapped, are the buffers instead, and no thread starts."""
        if not self._claim_spare_buffers():
            self._touching = IdlePageToucher(lambda: RowsView.new_buffers(self))

    def _claim_spare_buffers(self):
        """Take the problem's spare view buffers (X's arrays, ``Problem`` overwrite_X)
        where this set has none yet and no other set took them; whether it holds some
        now."""
        if self._view_buffers is None and self.problem._spare_view_buffers:
            self._view_buffers = self.problem._spare_view_buffers.pop()
        return self._view_buffers is not None

    @property
    def n_features(self):
        return self.features.shape[0]

    @property
    def nnz(self):
        return int(self.indptr[-1])

    def block_column_norms(self):
        """||C^(1/2) A_g|| (C = diag(c), ||A_g|| without weights): the column norm
        sqrt(sum_i c_i a_ij^2) for L1, the Frobenius norm (a spectral-norm bound) for a
        group: what the gap-safe test multiplies its radius by (``screening``). Formed
        once per set; the caller does not write to it."""
        return self._block_column_norms

    @functools.cached_property
    def _block_column_norms(self):
        if not self.n_features:
            return np.zeros(0)
        indptr = self.block_indptr
        return np.sqrt(self.column_sq_norms if singleton_blocks(indptr) else
                       np.add.reduceat(self.column_sq_norms, indptr[:-1]))

    def reweighting(self):
        """d_g = n / n_g per block (eq. 3-6); blocks touching no row get d_g = n."""
        return self.problem.n_samples / np.maximum(self.block_row_counts, 1)

    @functools.cached_property
    def intercept_scale_sq(self):
        """s^2 of the intercept's column in the inner loop (kernels/svrg.py): the mean
        square of the stored entries (1 when there are none), 0 without intercept."""
        if not self.problem.fit_intercept:
            return 0.0
        row_sq = self._row_sq_norms
        return float(row_sq.sum() / self.nnz) if self.nnz else 1.0

    @functools.cached_property
    def max_row_sq_norm(self):
        """max_i ||a_i||^2 on the active columns plus s^2 for the intercept's column;
        with sample weights the bound max_i c_i ||a_i||^2 + max_i c_i s^2 on
        max_i c_i (||a_i||^2 + s^2), the largest row curvature over L_f (the step's
        L_max, ``ddss.step_size``)."""
        return weighted_row_bound(self._row_sq_norms, self.sample_weight,
                                  self.intercept_scale_sq)

    @functools.cached_property
    def column_sums(self):
        """A^T c over these rows (A^T 1 without sample weights): what A^T rho loses
        when every margin rises by one, rho_i = c_i (y_i - z_i) for the squared loss
        (the intercept's refit folded into the certificate, ``fold_intercept_shift`` of
        solvers/mpi.py)."""
        weights = self.sample_weight if self.sample_weight.shape[0] else \
            np.ones(self.y.shape[0])
        return csr_rmatvec(self.indptr, self.indices, self.data, weights, self.n_features)

    def residual_correlation(self, code, b):
        """A^T rho at x = 0 with intercept ``b`` (rho_i = -f'(b, y_i), loss ``code``):
        lam_max's pass (``solvers.mpi.distributed_lam_max``); remembered for
        ``correlation_at_zero``."""
        rho = generalized_residual(code, np.full(self.y.shape[0], float(b)), self.y,
                                   self.sample_weight, np.empty(self.y.shape[0]))
        correlation = csr_rmatvec(self.indptr, self.indices, self.data, rho,
                                  self.n_features)
        self._remember_at_zero(code, b, correlation)
        return correlation

    def _remember_at_zero(self, code, b, correlation):
        """``correlation_at_zero``'s memo of A^T rho at x = 0 and ``b``: a copy, which a
        caller's changes to ``correlation`` do not reach."""
        self._zero_correlation = (code, float(b), correlation.copy())

    def residual_correlation_at(self, x, code, b, rho, n_threads=1):
        """A^T rho at (x, b), ``rho`` its residuals, on ``n_threads`` threads; at x = 0
        from ``correlation_at_zero`` where it knows it, else remembered for it: lam_max,
        P(0) (the relative gap's scale) and a solve's first certificate are one point,
        one pass over the rows where they were three."""
        at_zero = not np.any(x)
        correlation = self.correlation_at_zero(code, b) if at_zero else None
        if correlation is None:
            correlation = csr_rmatvec(self.indptr, self.indices, self.data, rho,
                                      self.n_features, n_threads)
            if at_zero:
                self._remember_at_zero(code, b, correlation)
        return correlation

    def correlation_at_zero(self, code, b):
        """A^T rho at x = 0 with intercept ``b`` from the one remembered at b' (by
        ``residual_correlation`` or ``residual_correlation_at``), with no pass over the
        rows, or None: for the squared loss at any b (rho = c (y - b): A^T rho =
        A^T rho' + (b' - b) A^T c), else at b' only. It spares a solve's first
        certificate at x = 0 a repeat of lam_max's pass."""
        if self._zero_correlation is None or self._zero_correlation[0] != code:
            return None
        _, known, correlation = self._zero_correlation
        if known == float(b):
            return correlation.copy()
        if not loss_of_code(code).quadratic:
            return None
        return correlation + (known - float(b)) * self.column_sums

    @functools.cached_property
    def stored_column_counts(self):
        """Stored entries per column, explicit zeros included (column_counts leaves
        them out)."""
        return csr_stored_counts(self.indices, self.n_features)

    @functools.cached_property
    def _row_sq_norms(self):
        return csr_row_sq_norms(self.indptr, self.data)

    def margins(self, x, b, n_threads=1):
        """z = A x + b. When the last ``without_frozen`` view covers x's non-zeros (after
        an inner epoch on it, x is zero on its other columns) the pass reads that view's
        entries only: the terms it leaves out are 0 * a_ij; at x = 0 (a solve's first
        certificate) there is no pass: z = b."""
        if not np.any(x):
            return np.full(self.y.shape[0], float(b))
        view = self._rows_view
        rows = (view.indptr, view.indices, view.data) if view is not None and \
            view.covers(x) else (self.indptr, self.indices, self.data)
        return csr_margins(*rows, x, b, np.empty(self.y.shape[0]), n_threads)

    def unfrozen_features(self, thresholds):
        """Per feature, whether its block moves this epoch: ``thresholds`` per block, +inf
        where the block is frozen at zero (``ddss.freeze_optimal_zeros``)."""
        return per_feature(np.isfinite(thresholds), self.block_indptr)

    def without_frozen(self, thresholds, moving=None):
        """This set for one inner epoch, its rows restricted to the columns of the
        blocks not frozen at zero (``thresholds`` per block; +inf: frozen for the epoch,
        ``ddss.freeze_optimal_zeros``), or this set itself when those columns hold more
        than UNFROZEN_SHARE of the non-zeros. The epoch kernels skip a frozen block and
        its x is 0, so they take the same steps on either, bit for bit, and read only
        the entries they use.

        The view (a RowsView, a pass over the rows to form) is kept and serves later
        epochs while its columns cover the unfrozen ones and hold at most VIEW_SLACK
        times their non-zeros; ``margins`` uses it too. For the inner loop only: the
        returned set's other attributes are this set's. ``moving``: the caller's
        ``unfrozen_features(thresholds)``, where it has them."""
        if moving is None:
            moving = self.unfrozen_features(thresholds)
        needed = int(self.column_counts[moving].sum())
        if needed > UNFROZEN_SHARE * int(self.column_counts.sum()):
            return self
        if self._touching is not None:
            buffers = self._touching.take(TOUCH_WAIT)
            if buffers is not None:
                self._view_buffers = buffers
            self._touching = None
        self._claim_spare_buffers()
        view = self._rows_view
        if view is None or np.any(moving & ~view.columns) or \
                view.entries > VIEW_SLACK * needed:
            self._rows_view = None       # its arrays are about to be written over
            view, self._view_buffers = RowsView.of(self, moving, self._view_buffers)
            self._rows_view = view
        restricted = copy.copy(self)
        restricted.indptr, restricted.indices, restricted.data = \
            view.indptr, view.indices, view.data
        return restricted

    def certificate(self, x, b, z=None, n_threads=1):
        """Refit the intercept, then compute the dual point, P, D and the gap
        (docs/design.md §1; with the elastic net's L2 term in the correlation, P and D).
        ``z`` may pass precomputed margins a_i^T x + b; the passes over the data are split
        over n_threads threads. At x = 0, A^T rho is remembered
        (``residual_correlation_at``)."""
        prob = self.problem
        code = prob.loss.code
        y = self.y
        z = self.margins(x, b, n_threads) if z is None else z.copy()
        weights = self.sample_weight
        if prob.fit_intercept:
            new_b = intercept_optimum(code, z - b, y, b, weights)
            z += new_b - b
            b = new_b
        rho = generalized_residual(code, z, y, weights, np.empty_like(z))
        n_lam = prob.n_samples * prob.lam
        penalty = self.penalty
        correlation = penalty.constraint_correlation(
            self.residual_correlation_at(x, code, b, rho, n_threads), x, n_lam)
        block_corr = penalty.dual_block_norms(correlation)
        dual_norm = float(np.max(block_corr / self.weights, initial=0.0))
        scale = max(1.0, dual_norm / n_lam)
        primal = mean_loss(code, z, y, weights) + prob.lam * penalty.value(x)
        dual = mean_neg_conjugate(code, rho / scale, y, weights)
        if penalty.l2:
            dual -= prob.lam * penalty.l2_value(x) / (scale * scale)
        return Certificate(z, b, rho, correlation, block_corr, scale, primal, dual)

    def dropped_share(self, keep_blocks):
        """(share of the stored non-zeros, share of the features) in the blocks that
        ``keep_blocks`` drops."""
        return dropped_share(self.column_counts, self.block_indptr, keep_blocks)

    def compact(self, keep_blocks, x):
        """(ActiveSet on the kept blocks, x restricted to them, whether a dropped
        coordinate was non-zero). When this set owns its arrays they are reused in place
        and this set must not be used afterwards."""
        kept_blocks = np.flatnonzero(keep_blocks)
        # the kept features' positions (the blocks' for singletons): indexing by them
        # reads the kept entries alone
        kept = np.flatnonzero(per_feature(keep_blocks, self.block_indptr)) \
            if kept_blocks.shape[0] else kept_blocks
        columns = None if self.owns_data else self.problem.full_columns(build=False)
        full_kept = None if columns is None else columns.position[self.features[kept]]
        if full_kept is not None and 2 * columns.entries(full_kept) < self.nnz:
            # new arrays of the kept columns' rows from the full set's columns: their
            # entries alone are read
            indptr, indices, data = csc_rows(columns.indptr, columns.rows, columns.data,
                                              full_kept, self.y.shape[0])
        else:
            column_map = np.full(self.n_features, -1, dtype=np.int64)
            column_map[kept] = np.arange(kept.shape[0])
            if self.owns_data:
                indptr, indices, data = self.indptr, self.indices, self.data
                nnz = csr_compact_columns_(indptr, indices, data, column_map)
                indices, data = indices[:nnz], data[:nnz]
            else:   # new arrays of the kept entries alone, not a copy of all compacted
                indptr, indices, data = csr_select(self.indptr, self.indices, self.data,
                                                   column_map, np.arange(self.y.shape[0]))
        sums = self.__dict__.get("column_sums")     # formed already: restricted
        new = ActiveSet(self.problem, self.blocks[kept_blocks], indptr, indices,
                        data, self.column_sq_norms[kept], self.column_counts[kept],
                        self.block_row_counts[kept_blocks], self.y, True,
                        None if sums is None else sums[kept],
                        sample_weight=self.sample_weight)
        norms = self.__dict__.get("_block_column_norms")
        if norms is not None:
            new._block_column_norms = norms[kept_blocks]
        x_kept = x[kept]
        return new, x_kept, np.count_nonzero(x_kept) < np.count_nonzero(x)

    def expand(self, x):
        """x on the active set -> vector over all original features (zeros elsewhere)."""
        out = np.zeros(self.problem.n_features)
        out[self.features] = x
        return out


class FullColumns:
    """The full active set's data by column (CSC; rows in its shuffled order, so that
    every ActiveSet compacted from it shares them): ``indptr``, ``rows``, ``data``,
    column q its feature q; ``position[j]``: the column of original feature j."""

    def __init__(self, full):
        self.indptr, self.rows, self.data = csr_transpose(
            full.indptr, full.indices, full.data, full.n_features)
        self.position = np.full(full.problem.n_features, -1, dtype=np.int64)
        self.position[full.features] = np.arange(full.n_features)

    def entries(self, cols):
        """The stored entries of the columns ``cols``."""
        return int(np.sum(self.indptr[cols + 1] - self.indptr[cols]))


class Problem:
    """The regularized problem on CSR data: objective, dual point, duality gap, lam_max.

        P(x, b) = (1/n) sum_i c_i f(a_i^T x + b, y_i) + lam Omega(x),
        Omega(x) = sum_g w_g ||x_g||,

    problem (3-1) of the thesis (Xidong Wu, PhD thesis, 2024, chapter 3), in the scaling of
    docs/design.md §1: the Lasso is the squared loss f(z, y) = (y - z)^2 / 2 with
    lam = alpha, and c_i the sample weights (1 without them).
    From any x, with b refitted and rho_i = -c_i f'(a_i^T x + b, y_i), the dual point is
    theta = rho / max(1, Omega^D(A^T rho) / (n lam)) (eq. 3-2) and the dual objective
    D(theta) = -(1/n) sum_i c_i f*(-theta_i / c_i) (eq. 3-4), so G = P - D >= 0
    certifies x.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        The data A; kept as CSR float64.
    y : array-like of shape (n_samples,)
        Targets; labels in {-1, +1} for the logistic loss.
    loss : {"squared", "logistic"} or Loss, default="squared"
        The per-sample loss f.
    penalty : BlockPenalty, default=None
        The block penalty Omega (``asyncopt.penalties``: L1, weighted L1, the elastic
        net's ``L1(l2=...)``, group); None: L1.
    lam : float, default=1.0
        The regularization strength lam > 0.
    fit_intercept : bool, default=True
        Whether P has an unpenalized intercept b (refitted exactly before every dual
        computation, so that sum_i rho_i = 0 and theta is feasible).
    sample_weight : array-like of shape (n_samples,), default=None
        Weights c_i >= 0 of the rows, taken as given: P = (1/n) sum_i c_i f_i + lam Omega
        (docs/design.md §1). None: every c_i = 1, with none of the weights' work. The
        estimators pass scikit-learn's convention, the user's weights rescaled to sum to
        n (``rescaled_sample_weight``); a row with c_i = 0 drops out of P and of the
        dual. ValueError for a wrong length, a negative or a non-finite weight.
    overwrite_X : bool, default=False
        The caller hands X over, no one else using its arrays (a shard read from a file,
        rows copied out of a larger matrix): once the full active set is built (in
        shuffled copies of the rows), X's index and value arrays (if writeable, int32
        indices) become the buffers of its epoch views (``ActiveSet.without_frozen``) and
        X is dropped, so no separate view buffers are allocated.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix or None
        The data (None once dropped under ``overwrite_X``).
    y : ndarray of shape (n_samples,)
        The targets, float64.
    loss : Loss
        The loss object (value, derivative, conjugate, L_f).
    penalty : BlockPenalty
        The penalty.
    lam : float
        The regularization strength.
    fit_intercept : bool
        Whether an intercept is fitted.
    sample_weight : ndarray of shape (n_samples,) or None
        The rows' weights c_i, float64 (None: all 1).
    weight_total : float
        sum_i c_i (n without weights).
    overwrite_X : bool
        Whether X was handed over.
    n_samples : int
        Number of rows n.
    n_features : int
        Number of features p.

    See Also
    --------
    lam_max : The smallest lam for which x = 0 is optimal.

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import Problem
    >>> X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> y = np.array([1.0, -1.0, 0.5])
    >>> problem = Problem(X, y, lam=0.1)
    >>> bool(problem.objective(np.zeros(2)) >= problem.null_objective())
    True
    """

    def __init__(self, X, y, loss="squared", penalty=None, lam=1.0, fit_intercept=True,
                 overwrite_X=False, sample_weight=None):
        self.X, self.y = check_finite_data(X, y)
        self.loss = get_loss(loss)
        if self.loss.code == LOGISTIC and not np.all(np.abs(self.y) == 1.0):
            raise ValueError("the logistic loss needs labels in {-1, +1}")
        self.n_samples, self.n_features = self.X.shape
        self.penalty = L1(self.n_features) if penalty is None else penalty
        if not isinstance(self.penalty, BlockPenalty):
            raise ValueError(f"penalty must be a BlockPenalty, got {type(penalty).__name__}")
        if self.penalty.ids.shape[0] != self.n_features:
            raise ValueError(f"the penalty covers {self.penalty.ids.shape[0]} features but "
                             f"X has {self.n_features}")
        self.fit_intercept = bool(fit_intercept)
        self.sample_weight = check_sample_weight(sample_weight, self.n_samples)
        self.weight_total = float(self.n_samples) if self.sample_weight is None else \
            float(np.sum(self.sample_weight))
        self.lam = check_lam(lam)
        self.overwrite_X = bool(overwrite_X)
        self._full = None
        self._columns = None
        self._null_objective = None
        # X's arrays as view buffers once X is dropped (overwrite_X): a list that
        # with_lam copies share, so that one active set alone takes them
        self._spare_view_buffers = []

    def full_active_set(self, own=False):
        """Return the ActiveSet of all blocks, its rows shuffled once (cached).

        The shuffle is fixed so that every solve of the problem reads the rows in the same
        order, and a run of consecutive rows is a random subset.

        Parameters
        ----------
        own : bool, default=False
            The caller consumes the set: where none is cached (and X is kept), a set of
            its own, not cached, that owns its arrays, so that its first compaction
            works in place instead of copying every kept entry; a later call builds
            the set again.

        Returns
        -------
        ActiveSet
            The problem on every block, data compacted block by block.
        """
        if own and self._full is None and not self.overwrite_X:
            owned = self.full_active_set()
            self._full = None
            owned.owns_data = True
            return owned
        if self._full is None:
            pen = self.penalty
            column_map = np.empty(self.n_features, dtype=np.int64)
            column_map[pen.ids] = np.arange(self.n_features)
            row_order = np.random.default_rng(0).permutation(self.n_samples)
            X = self.X
            indptr, indices, data = csr_permute(
                X.indptr.astype(np.int64), X.indices, X.data, column_map, row_order)
            weights = UNWEIGHTED if self.sample_weight is None else \
                self.sample_weight[row_order]
            sq, column_counts, stored, sums, row_sq = csr_column_stats(
                indptr, indices, data, self.n_features, weights)
            if pen.n_blocks == self.n_features:     # singletons: rows = stored entries
                counts = stored.copy()
            else:
                feature_block = per_feature(np.arange(pen.n_blocks), pen.indptr)
                counts = csr_block_row_counts(indptr, indices, feature_block, pen.n_blocks)
            self._full = ActiveSet(self, np.arange(pen.n_blocks), indptr, indices, data,
                                   sq, column_counts, counts, self.y[row_order], False,
                                   column_sums=sums, row_sq_norms=row_sq,
                                   stored_column_counts=stored, sample_weight=weights)
            if self.overwrite_X:
                if X.indices.dtype == indices.dtype and X.indices.flags.writeable and \
                        X.data.flags.writeable:
                    self._spare_view_buffers.append(
                        (np.empty(indptr.shape[0], dtype=indptr.dtype), X.indices, X.data))
                self.X = None
        return self._full

    def full_columns(self, build=True):
        """Return the full active set's columns, formed once and then shared.

        A path solves many lams on one set of rows: with these columns each solve's
        working sets and compactions read the columns they keep instead of every row
        (``ActiveSet.compact``, ``solvers.working_set.ColumnStore``). The
        :meth:`with_lam` copies made after the first call share them.

        Parameters
        ----------
        build : bool, default=True
            Form them (a transpose of every row) where they are not formed yet.

        Returns
        -------
        FullColumns or None
            The columns; None where not formed and ``build`` is False.
        """
        if self._columns is None and build:
            self._columns = FullColumns(self.full_active_set())
        return self._columns

    def with_lam(self, lam):
        """Return the same data, loss and penalty at another lam.

        The copy shares the cached data, the full set's column norms and P(0) (which do
        not depend on lam), not the epoch views.

        Parameters
        ----------
        lam : float
            The new regularization strength, > 0.

        Returns
        -------
        Problem
            A shallow copy with ``lam`` replaced.
        """
        self.null_objective()
        if self._full is not None:
            self._full.block_column_norms()     # formed here, shared by the copies
        other = copy.copy(self)
        other.lam = check_lam(lam)
        if self._full is not None:
            other._full = copy.copy(self._full)
            other._full.problem = other
            # its own epoch views: those of this set are written over in place
            other._full._rows_view = other._full._view_buffers = None
        return other

    def zero_certificate(self):
        """Return the certificate at x = 0 with the optimal intercept.

        Returns
        -------
        Certificate
            Margins, refitted intercept, rho, A^T rho, the dual scaling, P, D and G at
            x = 0.
        """
        active = self.full_active_set()
        return active.certificate(np.zeros(active.n_features), 0.0)

    def null_objective(self):
        """Return P(0) with the optimal intercept, the scale of the relative tolerance.

        It does not depend on lam, so it is computed once and shared with :meth:`with_lam`
        copies.

        Returns
        -------
        float
            min_b P(0, b).
        """
        if self._null_objective is None:
            self._null_objective = self.zero_certificate().primal
        return self._null_objective

    def lam_max(self):
        """Return the smallest lam for which x = 0 is optimal.

            lam_max = Omega^D(A^T rho(0)) / n,   Omega^D(u) = max_g ||u_g||_* / w_g,

        rho(0) the (weighted) generalized residual at x = 0 with the intercept fitted
        (docs/design.md §1); Omega^D is the penalty's ``dual_norm``, one-sided,
        max(0, max_j u_j / w_j), for the positive L1 penalty.

        Returns
        -------
        float
            lam_max (0 when y is constant or A is zero, and for the positive L1 penalty
            where no column has A_j^T rho(0) > 0: then x = 0 is optimal at every lam).
        """
        cert = self.zero_certificate()
        return float(np.max(cert.block_correlation / self.full_active_set().weights,
                            initial=0.0)) / self.n_samples

    def objective(self, coef, intercept=0.0):
        """Return the primal objective P(x, b) at a full-length coefficient vector.

        The intercept is taken as given (no refit).

        Parameters
        ----------
        coef : array-like of shape (n_features,)
            The coefficients x.
        intercept : float, default=0.0
            The intercept b.

        Returns
        -------
        float
            P(x, b) = (1/n) sum_i c_i f(a_i^T x + b, y_i) + lam Omega(x).
        """
        coef = np.asarray(coef, dtype=np.float64)
        if self.X is None:      # dropped (overwrite_X): the full set's shuffled rows
            active = self.full_active_set()
            rows, y = (active.indptr, active.indices, active.data), active.y
            coef_rows, weights = coef[active.features], active.sample_weight
        else:
            rows, y, coef_rows = (self.X.indptr, self.X.indices, self.X.data), self.y, coef
            weights = kernel_weights(self.sample_weight)
        z = csr_margins(*rows, coef_rows, float(intercept), np.empty(self.n_samples))
        return mean_loss(self.loss.code, z, y, weights) + \
            self.lam * self.penalty.value(coef)

    def certificate(self, coef, intercept=0.0):
        """Return the certificate of a full-length coefficient vector on the whole problem.

        The intercept is refitted first; the dual point is eq. 3-2's, scaled into the
        constraints (docs/design.md §1).

        Parameters
        ----------
        coef : array-like of shape (n_features,)
            The coefficients x.
        intercept : float, default=0.0
            The intercept to start the refit from.

        Returns
        -------
        Certificate
            Margins, refitted intercept, rho, A^T rho, the dual scaling, P, D and the gap G.
        """
        active = self.full_active_set()
        return active.certificate(np.asarray(coef, np.float64)[active.features],
                                  float(intercept))


def encode_binary_labels(y):
    """(labels mapped to -1/+1, the two original classes sorted); ValueError unless y holds
    exactly two classes (messages as scikit-learn's classifiers word them). Two finite
    integral numbers, scikit-learn's "binary", are encoded without importing it (each rank
    of mpirun -n K asyncopt-logreg encodes the labels)."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-dimensional, got shape {y.shape}")
    if y.dtype.kind in "iuf":
        classes = np.unique(y)
        if classes.shape[0] == 2 and np.all(np.isfinite(classes)) and \
                np.all(classes == np.round(classes)):
            return np.where(y == classes[1], 1.0, -1.0), classes
    from sklearn.utils.multiclass import type_of_target

    kind = type_of_target(y, input_name="y", raise_unknown=True)
    if kind not in ("binary", "multiclass"):
        raise ValueError(f"Unknown label type: {kind}: logistic regression needs labels "
                         "with exactly two values")
    classes = np.unique(y)
    if classes.shape[0] < 2:
        raise ValueError(f"logistic regression needs 2 classes in the labels, got 1 class: "
                         f"{classes.tolist()}")
    if classes.shape[0] > 2:
        raise ValueError(f"Only binary classification is supported. The labels have "
                         f"{classes.shape[0]} values: {classes[:5].tolist()}")
    return np.where(y == classes[1], 1.0, -1.0), classes


def lam_max(X, y, loss="squared", fit_intercept=True, penalty=None, sample_weight=None):
    """Return the smallest alpha (lam) for which the all-zero coefficient vector is optimal.

        lam_max = Omega^D(X^T rho(0)) / n,

    rho(0) the generalized residual -f'(b*) at w = 0 with the intercept b* fitted (for the
    Lasso with an intercept: ``max_j |x_j^T (y - mean(y))| / n``). For alpha >= lam_max the
    solution is w = 0 (docs/design.md §1).

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        The data.
    y : array-like of shape (n_samples,)
        Targets; for the logistic loss any two label values (mapped to -1/+1).
    loss : {"squared", "logistic"} or Loss, default="squared"
        The per-sample loss.
    fit_intercept : bool, default=True
        Whether the problem has an unpenalized intercept.
    penalty : BlockPenalty, default=None
        The block penalty; None: L1. ``L1(n_features, positive=True)`` gives the
        one-sided lam_max of a model with coefficients >= 0,
        ``max(0, max_j x_j^T rho(0) / w_j) / n``.
    sample_weight : array-like of shape (n_samples,), default=None
        Weights of the rows, rescaled to sum to n as the estimators do
        (``rescaled_sample_weight``); rho(0) is then the weighted residual
        c_i (y_i - b*) with b* the weighted mean (squared loss).

    Returns
    -------
    float
        lam_max.

    See Also
    --------
    lasso_path : Uses lam_max as the start of its default grid.

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import lam_max
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> y = np.array([1.0, 0.0, 2.0])
    >>> round(lam_max(X, y), 6)
    0.333333
    """
    loss = get_loss(loss)
    if loss.code == LOGISTIC:
        y = encode_binary_labels(y)[0]
    weights = rescaled_sample_weight(sample_weight, np.shape(X)[0])
    return Problem(X, y, loss, penalty, 1.0, fit_intercept,
                   sample_weight=weights).lam_max()
