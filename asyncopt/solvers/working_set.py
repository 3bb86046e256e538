"""The working-set inner step of DDSS (``method="working_set"``, L1 penalties).

Between two certificates of the outer loop (duality gap and gap-safe screening on every
active feature, ``ddss.Driver``), this step solves the problem restricted to a working
set W of features, to a fraction of the outer gap:

- scores: how far each feature is from its optimality condition at the certificate,
  the distance of -grad_j = A_j^T rho / n to lam v_j d|x_j| (skglm's ``dist_fix_point``
  scores): max(|grad_j| - lam v_j, 0) at x_j = 0, |grad_j + lam v_j sign(x_j)| else;
- W: every non-zero of x, then the zeros of largest positive score, up to
  max(FIRST_SIZE, 2 nnz(x)) features (skglm's rule: the set grows geometrically while
  the support does);
- the subproblem on W, until its own duality gap is at most INNER_FRACTION times the
  outer gap (celer's inner tolerance, Massias et al., ICML 2018): for the squared loss
  cyclic coordinate descent with Anderson extrapolation, for the others proximal Newton
  steps (coordinate descent on the second-order model, then a line search), both in
  ``kernels.working_set``.

The features outside W stay at zero, so the outer certificate that follows is the full
problem's: nothing this step does changes what DDSS certifies.
"""
import numpy as np

from ..kernels.working_set import lasso_working_set_cd, prox_newton_working_set

FIRST_SIZE = 10          # skglm's p0
INNER_FRACTION = 0.3     # celer's and skglm's tol_in / gap
ANDERSON = 5             # iterates per extrapolation (skglm's K)
CHECK_EVERY = 10         # epochs between two gaps of the subproblem
MAX_INNER_EPOCHS = 10_000
MAX_NEWTON_STEPS = 50
MAX_CD_PASSES = 20       # skglm's max_cd_iter: passes of the Newton direction's CD


def supports(problem):
    """Whether the working-set step solves ``problem`` (the L1 penalty, any loss); None
    if so, else the reason, one line."""
    if problem.penalty.kernels == "l1":
        return None
    return ("method 'working_set' solves L1-penalized problems; use method='ddss' for "
            "the group penalty")


def violation_scores(x, correlation, n, lam, weights):
    """Per feature, the distance of -grad_j (grad = -A^T rho / n) to lam v_j d|x_j|."""
    grad = correlation / -n
    thresholds = lam * weights
    return np.where(x == 0.0, np.maximum(np.abs(grad) - thresholds, 0.0),
                    np.abs(grad + thresholds * np.sign(x)))


def working_set(x, scores):
    """The working set's positions: every non-zero of x, then the zeros of largest
    positive score, max(FIRST_SIZE, 2 nnz(x)) in all at most; sorted."""
    support = np.flatnonzero(x)
    size = min(x.shape[0], max(FIRST_SIZE, 2 * support.shape[0]))
    candidates = np.flatnonzero((x == 0.0) & (scores > 0.0))
    room = size - support.shape[0]
    if candidates.shape[0] > room:
        best = np.argpartition(-scores[candidates], room - 1)[:room] if room > 0 else []
        candidates = candidates[best]
    return np.sort(np.concatenate([support, candidates]))


class ColumnStore:
    """The active data by column (CSC, rows in the ActiveSet's order), made once from
    the set the first step sees and kept while screening removes columns:
    ``columns(features)`` maps original feature ids to its column numbers."""

    def __init__(self, active, n_original):
        from .pse import column_major
        self.indptr, self.rows, self.data = column_major(active)
        self.column_of = np.full(n_original, -1, dtype=np.int64)
        self.column_of[active.features] = np.arange(active.n_features)

    def columns(self, features):
        return self.column_of[features]


def step(store, active, x, cert, outer_gap):
    """The working-set step from x at its certificate ``cert`` (on ``active``) ->
    (x, b, inner epochs or Newton steps, working-set size); x is updated in place.
    Squared loss: coordinate descent with Anderson extrapolation; other losses:
    proximal Newton steps."""
    prob = active.problem
    n = prob.n_samples
    scores = violation_scores(x, cert.correlation, n, prob.lam, active.weights)
    ws = working_set(x, scores)
    w = x[ws].copy()
    cols = store.columns(active.features[ws])
    tol = INNER_FRACTION * n * outer_gap
    if prob.loss.quadratic:
        r = cert.rho.copy()                      # y - A x - b for the squared loss
        b, epochs, _, _ = lasso_working_set_cd(
            store.indptr, store.rows, store.data, cols, w, r, float(cert.intercept),
            active.y, n * prob.lam, active.weights[ws], active.column_sq_norms[ws],
            prob.fit_intercept, tol, MAX_INNER_EPOCHS, ANDERSON, CHECK_EVERY)
    else:
        b, epochs, _ = prox_newton_working_set(
            store.indptr, store.rows, store.data, cols, w, cert.z.copy(),
            float(cert.intercept), active.y, prob.loss.code, n * prob.lam,
            active.weights[ws], active.column_sq_norms[ws], prob.loss.lipschitz,
            prob.fit_intercept, tol, MAX_NEWTON_STEPS, MAX_CD_PASSES)
    x[ws] = w
    return x, float(b), int(epochs), int(ws.shape[0])
