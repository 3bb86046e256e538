"""Block penalties Omega(x) = sum_g w_g ||x_g|| (docs/design.md §1).

Blocks partition the features and are given by two int arrays: ``indptr`` (n_blocks + 1)
and ``ids`` (the features of block g are ``ids[indptr[g]:indptr[g+1]]``), plus positive
weights ``w``. L1 is blocks of size one (|.|, dual norm |.|); the group penalty uses the
block l2 norm (self-dual) with default weight sqrt(|g|).

- prox of t w ||.|| on a block (block soft-thresholding):
      prox(u) = u * max(0, 1 - t w / ||u||)      (soft-thresholding for size-one blocks)
- block dual norm of u:   Omega^D(u) = max_g ||u_g|| / w_g

``L1(positive=True)`` adds the indicator of x >= 0 (scikit-learn's ``positive``): the
penalty is sum_j w_j x_j on x >= 0 and +inf elsewhere, its prox the one-sided
max(u - t w, 0), and its "dual norm" (the support function of its unit ball) the one-sided
max(0, max_j u_j / w_j): the dual constraint, the screening test and lam_max then bound
A_j^T theta from above only (docs/design.md §1).

``L1(l2=...)`` is the elastic net (scikit-learn's ``ElasticNet``): lam Omega(x) =
lam sum_j w_j (|x_j| + l2 x_j^2 / 2), the L2 strength mu = lam l2 carried as the ratio
l2 = mu / lam = (1 - l1_ratio) / l1_ratio (``elastic_net_strengths``), so that a path over
lam keeps l1_ratio fixed; the weights w_j multiply both parts, as glmnet's penalty
factors do. Its prox is the L1 prox shrunk, prox_l1(u, t w) / (1 + t w l2)
(``prox_elastic_net``); the L2 part is smooth and enters the dual through the correlation
c = A^T rho - n lam l2 w x (``constraint_correlation``): docs/design.md §1.
"""
import math
from numbers import Integral

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def prox_l1(u, threshold, positive):
    """prox of threshold |.| at u, sign(u) max(|u| - threshold, 0) (soft-thresholding, as
    max(u - threshold, 0) + min(u + threshold, 0): no branch on the sign of u); with
    ``positive`` the prox of threshold |.| plus the indicator of [0, inf),
    max(u - threshold, 0). Every L1 kernel's prox."""
    upper = max(u - threshold, 0.0)
    return upper if positive else upper + min(u + threshold, 0.0)


@njit(cache=True, inline="always")
def prox_elastic_net(u, threshold, positive, l2):
    """prox of threshold (|.| + l2 (.)^2 / 2) at u (plus the indicator of [0, inf) with
    ``positive``): prox_l1(u, threshold, positive) / (1 + threshold l2), from
    argmin_v (v - u)^2 / 2 + threshold |v| + threshold l2 v^2 / 2. With l2 = 0 it is
    prox_l1's value itself, bit for bit (no division). Every L1 kernel's prox: the
    threshold is the step times lam w_j (t lam d_j w_j in the prox-SVRG epoch, n lam w_j
    / L_j in coordinate descent), so the shrink is 1 / (1 + t mu d_j w_j), resp.
    L_j / (L_j + n mu w_j)."""
    v = prox_l1(u, threshold, positive)
    return v / (1.0 + threshold * l2) if l2 > 0.0 else v


@njit(cache=True, inline="always")
def dual_magnitude(u, positive):
    """What the L1 dual constraint bounds of a correlation u = A_j^T rho: |u|, or with
    ``positive`` (x_j >= 0) max(u, 0), the support function of {v : |v| <= 1, v >= 0}
    at u. The scalar form of ``l1_dual_norms`` for the kernels."""
    return max(u, 0.0) if positive else abs(u)


def l1_dual_norms(u, positive):
    """``dual_magnitude`` of every entry of u: |u|, or max(u, 0) with ``positive``."""
    u = np.asarray(u, np.float64)
    return np.maximum(u, 0.0) if positive else np.abs(u)


def elastic_net_strengths(alpha, l1_ratio):
    """(lam, l2) of scikit-learn's elastic net alpha l1_ratio ||w||_1 + alpha (1 -
    l1_ratio) / 2 ||w||^2 in this package's terms, lam (||w||_1 + l2 ||w||^2 / 2):
    lam = alpha l1_ratio and l2 = (1 - l1_ratio) / l1_ratio (0.0 at l1_ratio = 1, where
    lam is alpha itself: the Lasso). ValueError unless 0 < l1_ratio <= 1: at 0 (ridge)
    nothing is sparse, there is no L1 part to screen or threshold."""
    l1_ratio = check_l1_ratio(l1_ratio)
    return alpha * l1_ratio, (1.0 - l1_ratio) / l1_ratio


def check_l1_ratio(l1_ratio):
    """l1_ratio as a float in (0, 1]; ValueError (one line) otherwise."""
    try:
        value = float(l1_ratio)
    except (TypeError, ValueError):
        value = np.nan
    if isinstance(l1_ratio, (bool, np.bool_)) or not 0.0 < value <= 1.0:
        ridge = " (l1_ratio = 0 is ridge regression: no L1 part, nothing sparse to " \
            "screen)" if value == 0.0 else ""
        raise ValueError(f"l1_ratio must be in (0, 1], got {l1_ratio!r}{ridge}")
    return value


@njit(cache=True)
def block_soft_threshold_(x, ids, start, end, threshold):
    """In place on x[ids[start:end]]: x_g <- x_g max(0, 1 - threshold / ||x_g||_2)."""
    sq = 0.0
    for k in range(start, end):
        sq += x[ids[k]] * x[ids[k]]
    norm = math.sqrt(sq)
    scale = 0.0 if norm <= threshold else 1.0 - threshold / norm
    for k in range(start, end):
        x[ids[k]] *= scale


@njit(cache=True)
def block_norms(u, indptr, ids):
    """||u_g||_2 for every block g."""
    n_blocks = indptr.shape[0] - 1
    out = np.empty(n_blocks)
    for g in range(n_blocks):
        sq = 0.0
        for k in range(indptr[g], indptr[g + 1]):
            sq += u[ids[k]] * u[ids[k]]
        out[g] = math.sqrt(sq)
    return out


def contiguous_block_norms(u, indptr):
    """||u_g||_2 for blocks that are the contiguous ranges indptr[g]:indptr[g+1] (an
    ActiveSet's features, renumbered block by block, or the groups of a Newton step's S);
    entries of u past indptr[-1] are left out."""
    return block_norms(np.asarray(u, np.float64), np.asarray(indptr, np.int64),
                       np.arange(indptr[-1], dtype=np.int64))


@njit(cache=True)
def penalty_value(x, indptr, ids, weights):
    """Omega(x) = sum_g w_g ||x_g||_2.

    A plain loop, not np.dot: numba's np.dot calls OpenBLAS, whose threads then spin for a
    while after every call, taking a second core from the solver's own threads and from
    the other processes."""
    norms = block_norms(x, indptr, ids)
    total = 0.0
    for g in range(norms.shape[0]):
        total += weights[g] * norms[g]
    return total


@njit(cache=True)
def weighted_l1_value(x, weights):
    """sum_j w_j |x_j|: ``penalty_value`` for blocks of one coordinate each, without the
    block indirection and the square roots (a plain loop, as there)."""
    total = 0.0
    for j in range(x.shape[0]):
        total += weights[j] * abs(x[j])
    return total


@njit(cache=True)
def weighted_square_sum(x, weights):
    """sum_j w_j x_j^2 (a plain loop, as ``weighted_l1_value``): twice the elastic
    net's L2 part over lam l2, in every backend's P and D."""
    total = 0.0
    for j in range(x.shape[0]):
        total += weights[j] * x[j] * x[j]
    return total


@njit(cache=True)
def block_prox_(x, indptr, ids, thresholds):
    """In place: every block g gets prox of thresholds[g] * ||.||_2."""
    for g in range(indptr.shape[0] - 1):
        block_soft_threshold_(x, ids, indptr[g], indptr[g + 1], thresholds[g])


class BlockPenalty:
    """Omega(x) = sum_g w_g ||x_g||_2 over blocks that partition the features.

    The penalty is the solvers' unit of dispatch: it names its own inner-loop kernels
    (``svrg_kernel``, ``saga_kernel``, ``native_kernel``, each taking the arguments of
    ``kernels.workspace``), its second-order step (``newton_step``, at most
    ``newton_max_support`` coordinates), two facts of its blocks
    (``keeps_orthant``, ``rows_are_column_counts``), its constraint (``positive``:
    x >= 0) and its smooth part (``l2``: the elastic net's L2 strength over lam), so
    that a new penalty is one class here and its kernels."""

    is_l1 = False
    keeps_orthant = False     # see L1
    rows_are_column_counts = False
    positive = False          # see L1; the kernels read it from ``workspace.Blocks``
    l2 = 0.0                  # see L1; the kernels read it from ``workspace.Blocks``
    kernels = "group"         # the kernels' suffix in kernels/svrg.py and kernels/native.py

    def __init__(self, indptr, ids, weights):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.weights = np.ascontiguousarray(weights, dtype=np.float64)

    @property
    def n_blocks(self):
        return self.indptr.shape[0] - 1

    @property
    def group_indptr(self):
        """The blocks' feature ranges for a group penalty, None for L1 (single coordinates):
        what the functions that treat blocks and coordinates apart take (the frozen zeros,
        the support Newton step)."""
        return None if self.is_l1 else self.indptr

    def value(self, x):
        return penalty_value(np.asarray(x, np.float64), self.indptr, self.ids, self.weights)

    def block_norms(self, u):
        """||u_g||_2 for every block."""
        return block_norms(np.asarray(u, np.float64), self.indptr, self.ids)

    def dual_block_norms(self, u):
        """Per block, what the dual constraint bounds by n lam w_g of u = A_g^T rho:
        ||u_g||_2 (|u_j| for L1, max(u_j, 0) for L1 with ``positive``). A certificate's
        ``block_correlation``, and with it the dual point, screening and lam_max."""
        return self.block_norms(u)

    def dual_norm(self, u):
        """Omega^D(u) = max_g ``dual_block_norms(u)``_g / w_g (0 where every one is 0)."""
        return float(np.max(self.dual_block_norms(u) / self.weights, initial=0.0))

    def constraint_correlation(self, correlation, x, n_lam):
        """What the dual constraint bounds, from A^T rho (``correlation``) at x:
        c = A^T rho - n lam l2 w x, the negative gradient of n times the smooth part,
        loss and L2 term (docs/design.md §1, the elastic net); ``correlation`` itself
        (the same array) where l2 = 0, else a new array."""
        if not self.l2:
            return correlation
        return correlation - (n_lam * self.l2) * self._feature_weights() * x

    def loss_correlation(self, correlation, x, n_lam):
        """A^T rho back from the constraint's c = ``correlation`` at x, the loss's part
        alone (c + n lam l2 w x): what a step that treats the L2 term apart needs (the
        prox-SVRG anchor, the working sets' Gram passes); ``correlation`` itself where
        l2 = 0."""
        if not self.l2:
            return correlation
        return correlation + (n_lam * self.l2) * self._feature_weights() * x

    def l2_value(self, x):
        """The L2 part of Omega, l2 sum_j w_j x_j^2 / 2 (0.0 without one). D subtracts
        lam ``l2_value(x)`` / s^2 (docs/design.md §1)."""
        if not self.l2:
            return 0.0
        return 0.5 * self.l2 * weighted_square_sum(np.asarray(x, np.float64),
                                                   self._feature_weights())

    def _feature_weights(self):
        """w per feature (the blocks' weights repeated over their features,
        ``per_feature``: the weights themselves for singleton blocks)."""
        return per_feature(self.weights, self.indptr)

    def prox(self, x, step):
        """prox_{step * Omega}(x) (a new array)."""
        out = np.array(x, dtype=np.float64, copy=True)
        block_prox_(out, self.indptr, self.ids, step * self.weights)
        return out

    def projection(self, x):
        """x on the penalty's domain, where Omega(x) is finite: x itself (the positive L1
        penalty: max(x, 0)). A solve's starting point (``coef_init``, a checkpoint)
        goes through it."""
        return x

    def feature_blocks(self):
        """block index of every feature."""
        out = np.empty(self.ids.shape[0], dtype=np.int64)
        out[self.ids] = np.repeat(np.arange(self.n_blocks), np.diff(self.indptr))
        return out

    def restricted(self, blocks):
        """The penalty on the given blocks, features renumbered 0.. block by block."""
        sizes = np.diff(self.indptr)[blocks]
        indptr = np.concatenate(([0], np.cumsum(sizes)))
        return type(self)._from_blocks(indptr, np.arange(indptr[-1]), self.weights[blocks])

    @classmethod
    def _from_blocks(cls, indptr, ids, weights):
        obj = cls.__new__(cls)
        BlockPenalty.__init__(obj, indptr, ids, weights)
        return obj

    def active_features(self, blocks):
        """original feature ids of the given blocks, in block order (matches
        ``restricted``)."""
        return self.ids[block_positions(self.indptr, blocks)]

    def svrg_kernel(self, tracked=False):
        """The sparse prox-SVRG epoch of these blocks (``kernels.svrg``; ``tracked``: the
        threads' variant that counts staleness on a shared clock; with an L2 part, the
        elastic net's kernel, whose prox has the shrink)."""
        from .kernels import svrg
        return getattr(svrg, f"svrg_epoch_{self.kernels}" + ("_elastic" if self.l2 else "")
                       + ("_tracked" if tracked else ""))

    def saga_kernel(self):
        """The sparse proximal SAGA epoch of these blocks (ProxASAGA)."""
        from .kernels import svrg
        return getattr(svrg, f"saga_epoch_{self.kernels}")

    def native_kernel(self):
        """The C/OpenMP epoch of these blocks (``kernels.native``)."""
        from .kernels import native
        return getattr(native, f"native_epoch_{self.kernels}")

    def newton_step(self):
        """The single-process second-order step on the support (``newton.step``)."""
        from .newton.step import group_support_newton_step
        return group_support_newton_step

    @property
    def newton_max_support(self):
        """The most coordinates the step is tried on (``StallWatch``)."""
        from .newton.policy import HESSIAN_FREE_MAX_SUPPORT
        return HESSIAN_FREE_MAX_SUPPORT


def singleton_blocks(indptr):
    """Whether the contiguous blocks of ``indptr`` (their ranges, none empty) are one
    feature each: the L1 penalty's."""
    return indptr.shape[0] - 1 == indptr[-1]


def per_feature(values, indptr):
    """Per-block ``values`` repeated over each block's features (``indptr``: contiguous
    blocks' ranges, none empty); ``values`` itself, not a copy, for singleton blocks (one
    block per feature)."""
    if singleton_blocks(indptr):
        return values
    return np.repeat(values, np.diff(indptr))


def block_positions(indptr, blocks):
    """The positions indptr[g]:indptr[g+1] of every block g of ``blocks``, in that order,
    as one int64 array."""
    blocks = np.asarray(blocks, dtype=np.int64)
    starts = indptr[blocks]
    sizes = indptr[blocks + 1] - starts
    offsets = np.cumsum(sizes) - sizes
    return (np.repeat(starts - offsets, sizes) + np.arange(sizes.sum())).astype(np.int64)


def _check_weights(weights, n_blocks, what):
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (n_blocks,):
        raise ValueError(f"{what} weights must have shape ({n_blocks},), got {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError(f"{what} weights must be finite and > 0")
    return weights


class L1(BlockPenalty):
    """Omega(x) = sum_j w_j |x_j| (plain L1 when weights is None); with ``positive``,
    plus the indicator of x >= 0: sum_j w_j x_j on x >= 0, +inf elsewhere.

    ``keeps_orthant``: the prox of one coordinate never crosses zero in a step, so
    Dis-DDSS's server keeps summed deltas on x's orthant; ``rows_are_column_counts``:
    a block's rows are its column's stored entries. ``positive``: the prox is
    max(u - t w_j, 0) (``prox_l1``) and the dual constraint one-sided,
    A_j^T theta <= n lam w_j (``dual_block_norms``: max(u_j, 0)).

    ``l2`` >= 0 (the elastic net): Omega(x) = sum_j w_j (|x_j| + l2 x_j^2 / 2), so that
    lam Omega adds mu ||x||_w^2 / 2 with mu = lam l2 (``elastic_net_strengths``); the
    prox is ``prox_elastic_net``, and ``value`` includes the L2 part. The dual
    constraint bounds c = A^T rho - n mu w x (``constraint_correlation``), with the same
    ``dual_block_norms``; l2 = 0 is the plain (weighted) L1 penalty, bit for bit."""

    is_l1 = True
    keeps_orthant = True
    rows_are_column_counts = True
    kernels = "l1"
    newton_max_support = None      # StallWatch's default (newton.policy.MAX_SUPPORT)

    def __init__(self, n_features, weights=None, positive=False, l2=0.0):
        weights = np.ones(n_features) if weights is None else \
            _check_weights(weights, n_features, "L1")
        ar = np.arange(n_features + 1)
        super().__init__(ar, ar[:-1], weights)
        self.positive = bool(positive)
        l2 = float(l2)
        if not (np.isfinite(l2) and l2 >= 0.0):
            raise ValueError(f"the L2 strength l2 must be finite and >= 0, got {l2}")
        self.l2 = l2

    # blocks of one coordinate, in feature order (here and in every ``restricted``):
    # the block norms are |u_j|, with no block indirection (Dis-DDSS's server takes them
    # over every feature each epoch)
    def value(self, x):
        x = np.asarray(x, np.float64)
        if self.positive and x.shape[0] and x.min() < 0.0:
            return np.inf
        value = weighted_l1_value(x, self.weights)
        return value + self.l2_value(x) if self.l2 else value

    def block_norms(self, u):
        return np.abs(np.asarray(u, np.float64))

    def dual_block_norms(self, u):
        return l1_dual_norms(u, self.positive)

    def prox(self, x, step):
        out = super().prox(x, step)
        out = np.maximum(out, 0.0) if self.positive else out
        return out / (1.0 + step * self.l2 * self.weights) if self.l2 else out

    def projection(self, x):
        return np.maximum(x, 0.0) if self.positive else x

    # block g is coordinate ids[g]: the blocks' positions are the blocks themselves
    # (BlockPenalty's versions form them for blocks of any size, with a pass over the
    # blocks)
    def restricted(self, blocks):
        blocks = np.asarray(blocks, dtype=np.int64)
        indptr = np.arange(blocks.shape[0] + 1)
        out = type(self)._from_blocks(indptr, indptr[:-1], self.weights[blocks])
        out.positive, out.l2 = self.positive, self.l2
        return out

    def active_features(self, blocks):
        return self.ids[np.asarray(blocks, dtype=np.int64)]

    def feature_blocks(self):
        out = np.empty(self.ids.shape[0], dtype=np.int64)
        out[self.ids] = np.arange(self.ids.shape[0])
        return out

    def newton_step(self):
        from .newton.step import support_newton_step
        return support_newton_step


class GroupL1(BlockPenalty):
    """Omega(x) = sum_g w_g ||x_g||_2, default w_g = sqrt(|g|) (group Lasso).

    ``groups`` is an int (consecutive groups of that size; the last may be smaller) or a
    list of index arrays that partition range(n_features).
    """

    def __init__(self, n_features, groups, weights=None):
        indptr, ids = make_groups(n_features, groups)
        sizes = np.diff(indptr)
        weights = np.sqrt(sizes) if weights is None else \
            _check_weights(weights, len(sizes), "group")
        super().__init__(indptr, ids, weights)


def make_groups(n_features, groups):
    """(indptr, ids) of a partition of range(n_features) given as a size or index arrays."""
    if isinstance(groups, Integral):
        if groups < 1:
            raise ValueError(f"group size must be >= 1, got {groups}")
        indptr = np.append(np.arange(0, n_features, groups), n_features)
        return indptr.astype(np.int64), np.arange(n_features, dtype=np.int64)
    groups = [np.asarray(g).ravel() for g in groups]
    if len(groups) == 0:
        raise ValueError("groups is empty")
    for k, g in enumerate(groups):
        if g.size == 0:
            raise ValueError(f"group {k} is empty")
        if not np.issubdtype(g.dtype, np.integer):
            raise ValueError(f"group {k} must hold integer feature indices")
        if g.min() < 0 or g.max() >= n_features:
            bad = g[(g < 0) | (g >= n_features)][0]
            raise ValueError(
                f"group {k} has feature index {bad} out of range [0, {n_features})")
    ids = np.concatenate(groups).astype(np.int64)
    counts = np.bincount(ids, minlength=n_features)
    if np.any(counts > 1):
        raise ValueError(f"feature {int(np.argmax(counts > 1))} belongs to more than one group")
    if np.any(counts == 0):
        raise ValueError(f"feature {int(np.argmax(counts == 0))} belongs to no group: "
                         "groups must partition the features")
    indptr = np.concatenate(([0], np.cumsum([g.size for g in groups]))).astype(np.int64)
    return indptr, ids
