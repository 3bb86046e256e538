"""The working-set inner step of DDSS (``method="working_set"``).

Between two certificates of the outer loop (duality gap and gap-safe screening on every
active feature, ``ddss.Driver``), this step solves the problem restricted to a working
set W of blocks (features, for L1), to a fraction of the outer gap:

- scores: how far each block is from its optimality condition at the certificate, the
  distance of -grad_g = A_g^T rho / n to lam v_g d||x_g|| (skglm's ``dist_fix_point``
  scores): max(||grad_g|| - lam v_g, 0) at x_g = 0, ||grad_g + lam v_g x_g / ||x_g|| ||
  else;
- W: every non-zero block, then the zero blocks of largest positive score, up to
  max(FIRST_SIZE, 2 nnz) blocks (skglm's rule: the set grows geometrically while the
  support does);
- the subproblem on W, until its own duality gap is at most INNER_FRACTION times the
  outer gap (celer's inner tolerance, Massias et al., ICML 2018): for the squared loss
  cyclic (block) coordinate descent with Anderson extrapolation, for the logistic loss
  (L1) proximal Newton steps (coordinate descent on the second-order model, then a line
  search), both in ``kernels.working_set``.

The features outside W stay at zero, so the outer certificate that follows is the full
problem's: nothing this step does changes what DDSS certifies.
"""
import numpy as np

from ..kernels.linalg import csr_columns
from ..kernels.working_set import lasso_working_set_cd, prox_newton_working_set
from ..penalties import block_positions, contiguous_block_norms
from .choice import WORK

FIRST_SIZE = 10          # skglm's p0
INNER_FRACTION = 0.3     # celer's and skglm's tol_in / gap
ANDERSON = 5             # iterates per extrapolation (skglm's K)
CHECK_EVERY = 10         # epochs between two gaps of the subproblem
MAX_INNER_EPOCHS = 10_000
MAX_NEWTON_STEPS = 50
MAX_CD_PASSES = 20       # skglm's max_cd_iter: passes of the Newton direction's CD
AHEAD = 4                # the column store holds sets this many times the current one


def supports(problem):
    """Whether the working-set step solves ``problem`` (the L1 penalty with any loss,
    the group penalty with the squared loss); None if so, else the reason, one line."""
    if problem.penalty.kernels == "l1" or problem.loss.quadratic:
        return None
    return ("method 'working_set' solves the group penalty with the squared loss only; "
            "use method='ddss' for this problem")


def violation_scores(x, correlation, n, lam, weights, block_indptr):
    """Per block, the distance of -grad_g (grad = -A^T rho / n) to lam v_g d||x_g||:
    max(||grad_g|| - lam v_g, 0) at x_g = 0, ||grad_g + lam v_g x_g / ||x_g|| || else
    (singleton blocks: |grad_j| and sign(x_j))."""
    grad = correlation / -n
    thresholds = lam * weights
    if block_indptr.shape[0] - 1 == x.shape[0]:            # singletons: L1
        return np.where(x == 0.0, np.maximum(np.abs(grad) - thresholds, 0.0),
                        np.abs(grad + thresholds * np.sign(x)))
    sizes = np.diff(block_indptr)
    x_norms = contiguous_block_norms(x, block_indptr)
    direction = x / np.repeat(np.where(x_norms > 0.0, x_norms, 1.0), sizes)
    moved = contiguous_block_norms(grad + np.repeat(thresholds, sizes) * direction,
                                   block_indptr)
    return np.where(x_norms == 0.0,
                    np.maximum(contiguous_block_norms(grad, block_indptr) - thresholds,
                               0.0), moved)


def working_set(x_norms, scores, size=None):
    """The working set's blocks: every non-zero block (``x_norms`` > 0), then the zero
    blocks of largest positive score, ``size`` (default max(FIRST_SIZE, 2 nnz)) in all
    at most; sorted."""
    support = np.flatnonzero(x_norms)
    if size is None:
        size = max(FIRST_SIZE, 2 * support.shape[0])
    size = min(x_norms.shape[0], size)
    candidates = np.flatnonzero((x_norms == 0.0) & (scores > 0.0))
    room = size - support.shape[0]
    if candidates.shape[0] > room:
        best = np.argpartition(-scores[candidates], room - 1)[:room] if room > 0 else []
        candidates = candidates[best]
    return np.sort(np.concatenate([support, candidates]))


class ColumnStore:
    """The working sets' columns of the active data (CSC, rows in the ActiveSet's
    order), formed for the first set and formed again, for every column stored before
    and still active plus the new ones, when a set holds a column it lacks.
    ``columns(active, features, ahead)`` -> the column numbers of ``features`` (original
    ids); a store formed anew also holds ``ahead()``'s features (the sets to come);
    ``work``: the entries read and copied so far (``choice.WORK``), ``taken()`` returns
    it and starts it again."""

    def __init__(self, n_original):
        self.column_of = np.full(n_original, -1, dtype=np.int64)
        self.stored = np.zeros(0, dtype=np.int64)       # original ids, by column
        self.work = 0.0

    def columns(self, active, features, ahead):
        cols = self.column_of[features]
        if cols.shape[0] and cols.min() < 0:
            self._form(active, np.union1d(features, ahead()))
            cols = self.column_of[features]
        return cols

    def _form(self, active, features):
        position = np.full(self.column_of.shape[0], -1, dtype=np.int64)
        position[active.features] = np.arange(active.n_features)
        keep = np.union1d(self.stored[position[self.stored] >= 0], features)
        column_map = np.full(active.n_features, -1, dtype=np.int64)
        column_map[position[keep]] = np.arange(keep.shape[0])
        self.indptr, self.rows, self.data = csr_columns(
            active.indptr, active.indices, active.data, column_map, keep.shape[0])
        self.column_of[self.stored] = -1
        self.column_of[keep] = np.arange(keep.shape[0])
        self.stored = keep
        self.work += WORK["read"] * active.nnz + WORK["transpose"] * self.rows.shape[0]

    def taken(self):
        work, self.work = self.work, 0.0
        return work


def step(store, active, x, cert, outer_gap):
    """The working-set step from x at its certificate ``cert`` (on ``active``) ->
    (x, b, inner epochs or Newton steps, working-set size, work: the entries read,
    ``choice.WORK``-weighted); x is updated in place. Squared loss: coordinate descent
    with Anderson extrapolation; other losses: proximal Newton steps."""
    prob = active.problem
    n = prob.n_samples
    block_indptr = active.block_indptr
    scores = violation_scores(x, cert.correlation, n, prob.lam, active.weights,
                              block_indptr)
    singletons = block_indptr.shape[0] - 1 == x.shape[0]
    x_norms = np.abs(x) if singletons else contiguous_block_norms(x, block_indptr)
    chosen = working_set(x_norms, scores)
    if singletons:
        ws, pointer = chosen, np.arange(chosen.shape[0] + 1, dtype=np.int64)
        lipschitz = active.column_sq_norms[ws]
    else:
        ws = block_positions(block_indptr, chosen)
        pointer = np.concatenate([[0], np.cumsum(np.diff(block_indptr)[chosen])]) \
            .astype(np.int64)
        lipschitz = np.add.reduceat(active.column_sq_norms[ws], pointer[:-1]) \
            if ws.shape[0] else np.zeros(0)
    w = x[ws].copy()

    def ahead():        # the blocks of the next two sets if the support grows as fast
        blocks = working_set(x_norms, scores, AHEAD * chosen.shape[0])
        return active.features[blocks if singletons else
                               block_positions(block_indptr, blocks)]
    cols = store.columns(active, active.features[ws], ahead)
    tol = INNER_FRACTION * n * outer_gap
    if prob.loss.quadratic:
        r = cert.rho.copy()                      # y - A x - b for the squared loss
        b, epochs, _, _ = lasso_working_set_cd(
            store.indptr, store.rows, store.data, cols, w, r, float(cert.intercept),
            active.y, n * prob.lam, active.weights[chosen], lipschitz, pointer,
            prob.fit_intercept, tol, MAX_INNER_EPOCHS, ANDERSON, CHECK_EVERY)
        nnz = float(np.sum(store.indptr[cols + 1] - store.indptr[cols]))
        reads = epochs * (2.0 * nnz + 2.0 * n) + \
            (epochs // CHECK_EVERY + 1) * (nnz + 2.0 * n) + \
            (epochs // (ANDERSON + 1)) * 4.0 * (ANDERSON + 1) * (w.shape[0] + n)
    else:
        b, epochs, _, reads = prox_newton_working_set(
            store.indptr, store.rows, store.data, cols, w, cert.z.copy(),
            float(cert.intercept), active.y, prob.loss.code, n * prob.lam,
            active.weights[chosen], active.column_sq_norms[ws], prob.loss.lipschitz,
            prob.fit_intercept, tol, MAX_NEWTON_STEPS, MAX_CD_PASSES)
    x[ws] = w
    return x, float(b), int(epochs), int(ws.shape[0]), \
        WORK["read"] * float(reads) + store.taken()
