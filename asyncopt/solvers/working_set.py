"""The working-set inner step of DDSS (``method="working_set"``).

Between two certificates of the outer loop (duality gap and gap-safe screening on every
active feature, ``ddss.Driver``), this step solves the problem restricted to a working
set W of blocks (features, for L1), to a fraction of the outer gap:

- scores: how far each block is from its optimality condition at the certificate, the
  distance of -grad_g = A_g^T rho / n to lam v_g d||x_g|| (skglm's ``dist_fix_point``
  scores): max(||grad_g|| - lam v_g, 0) at x_g = 0, ||grad_g + lam v_g x_g / ||x_g|| ||
  else (for the positive L1 penalty, max(-grad_j - lam v_j, 0) at x_j = 0);
- W: every non-zero block, then the zero blocks of largest positive score, up to
  max(FIRST_SIZE, 2 nnz) blocks (skglm's rule: the set grows geometrically while the
  support does); for the Lasso on more rows than MAX_GRAM at most MAX_GRAM features
  while the support fits, so that the set keeps the Gram matrix's route;
- the subproblem on W, until its own duality gap is at most INNER_FRACTION times the
  outer gap (celer's inner tolerance, Massias et al., ICML 2018): for the squared loss
  cyclic (block) coordinate descent with Anderson extrapolation, for the logistic loss
  (L1) proximal Newton steps (coordinate descent on the second-order model, then a line
  search), both in ``kernels.working_set``; for the L1 squared loss, after every
  ORTHANT_EVERY column passes that have not solved it and, at their rate, would not by
  the next ORTHANT_EVERY, one projected Newton step on the orthant of the set's
  non-zeros, its direction by conjugate gradients
  (``lasso_orthant_newton``: where coordinate descent's residual converges slowly, on
  sets with about as many columns as rows or nearly collinear columns, CG needs about
  the square root of its passes); for the Lasso, where a pass on the Gram
  matrix of [A_W, 1] is cheaper than one on the columns, the passes go on on it once
  the column passes have cost what forming it does (``gram_passes``, ``GramStore``),
  and for the logistic loss the Newton directions come from the Hessian on W once the
  column directions have cost what one such step does (``gram_newton_price``,
  ``gram_newton_steps``).

The features outside W stay at zero, so the outer certificate that follows is the full
problem's: nothing this step does changes what DDSS certifies.

The elastic net (``penalties.L1`` with l2 > 0): the certificate's correlation is c =
A^T rho - n mu w x, so the scores above are the distance of the smooth part's negative
gradient c / n to lam v ∂|x| as they stand; every kernel takes ``l2`` and puts the L2
term in its prox, objective and gap, and the Gram passes start from the residual's
A^T rho (``penalties.L1.loss_correlation``).
"""
import numpy as np

from ..kernels.linalg import (csc_rows, csr_columns, csr_margins, csr_rmatvec,
                               csr_transpose)
from ..kernels.working_set import (gram_lasso_cd, gram_start, lasso_working_set_solve,
                                   prox_newton_working_set)
from ..losses import generalized_residual, mean_loss, mean_neg_conjugate
from ..newton.kernels import HessianCache, SupportRows, shard_slope
from ..penalties import (block_positions, contiguous_block_norms, l1_dual_norms,
                         singleton_blocks, weighted_square_sum)
from .choice import WORK

FIRST_SIZE = 10          # skglm's p0
INNER_FRACTION = 0.3     # celer's and skglm's tol_in / gap
ANDERSON = 5             # iterates per extrapolation (skglm's K)
CHECK_EVERY = 10         # epochs between two gaps of the subproblem
MAX_INNER_EPOCHS = 10_000
MAX_NEWTON_STEPS = 50
MAX_CD_PASSES = 20       # skglm's max_cd_iter: passes of the Newton direction's CD
AHEAD = 4                # the column store holds sets this many times the current one
IN_CACHE = 1 << 20       # active entries whose columns (16 MB) a store forms at once
MAX_GRAM = 2048          # the Gram matrix's side (32 MB)
MAX_NEWTON_PASSES = 1000
ORTHANT_EVERY = 20       # column passes between two orthant Newton steps (squared loss)
ORTHANT_CG = 20          # CG iterations of one such step, each costing about a pass
HESSIAN_STEPS = 2        # Newton steps from the Hessian that end a set, about (quadratic)


def supports(problem):
    """Whether the working-set step solves ``problem`` (the L1 penalty with any loss,
    the group penalty with the squared loss); None if so, else the reason, one line."""
    if problem.penalty.kernels == "l1" or problem.loss.quadratic:
        return None
    return ("method 'working_set' solves the group penalty with the squared loss only; "
            "use method='ddss' for this problem")


def violation_scores(x, correlation, n, lam, weights, block_indptr, positive=False):
    """Per block, the distance of -grad_g (grad = -``correlation`` / n, the certificate's
    A^T rho, less n mu w x for the elastic net: the smooth part's gradient) to
    lam v_g d||x_g||:
    max(||grad_g|| - lam v_g, 0) at x_g = 0, ||grad_g + lam v_g x_g / ||x_g|| || else
    (singleton blocks: |grad_j| and sign(x_j); with ``positive``, x_j >= 0, the
    one-sided max(-grad_j - lam v_j, 0) at x_j = 0)."""
    grad = correlation / -n
    thresholds = lam * weights
    if singleton_blocks(block_indptr):
        return np.where(x == 0.0,
                        np.maximum(l1_dual_norms(-grad, positive) - thresholds, 0.0),
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
    and still active plus the new ones, when a set holds a column it lacks; where the
    active data has at most IN_CACHE entries, every active column at once (a
    transpose whose arrays stay in the cache costs about what a formation of a few
    columns does, a pass over the rows, and none is formed again).
    Where the problem has its full set's columns (``Problem.full_columns``: a path),
    those are the store, and nothing is formed.
    ``columns(active, features, ahead)`` -> the column numbers of ``features`` (original
    ids); a store formed anew also holds ``ahead()``'s features (the sets to come);
    ``work``: the entries read and copied so far (``choice.WORK``), ``taken()`` returns
    it and starts it again."""

    def __init__(self, n_original):
        self.column_of = np.full(n_original, -1, dtype=np.int64)
        self.stored = np.zeros(0, dtype=np.int64)       # original ids, by column
        self.work = 0.0

    def columns(self, active, features, ahead):
        full = active.problem.full_columns(build=False)
        if full is not None:        # a path's: every column is stored
            self.indptr, self.rows, self.data = full.indptr, full.rows, full.data
            return full.position[features]
        cols = self.column_of[features]
        if cols.shape[0] and cols.min() < 0:
            in_cache = active.nnz <= IN_CACHE
            if in_cache:                    # every active column: the transpose
                keep = active.features
                self.indptr, self.rows, self.data = csr_transpose(
                    active.indptr, active.indices, active.data, active.n_features)
            else:
                keep = self._form(active, np.union1d(features, ahead()))
            self.column_of[self.stored] = -1
            self.column_of[keep] = np.arange(keep.shape[0])
            self.stored = keep
            # a copied entry's cost: a read where the store stays in the cache
            copied = WORK["read" if in_cache else "transpose"]
            self.work += WORK["read"] * active.nnz + copied * self.rows.shape[0]
            cols = self.column_of[features]
        return cols

    def _form(self, active, features):
        """Form the active columns of ``features`` (original ids) and of those stored
        before (a pass over the rows); returns their ids, by column."""
        position = np.full(self.column_of.shape[0], -1, dtype=np.int64)
        position[active.features] = np.arange(active.n_features)
        keep = np.union1d(self.stored[position[self.stored] >= 0], features)
        column_map = np.full(active.n_features, -1, dtype=np.int64)
        column_map[position[keep]] = np.arange(keep.shape[0])
        self.indptr, self.rows, self.data = csr_columns(
            active.indptr, active.indices, active.data, column_map, keep.shape[0])
        return keep

    def taken(self):
        work, self.work = self.work, 0.0
        return work


class GramStore:
    """The Gram matrices of the squared loss's working sets, B = C^(1/2) [A_W, 1] (L1; C
    the sample weights, the identity without them), formed
    from the rows (``SupportRows``) for the union S of the sets so far that are still
    active, at most MAX_GRAM features (else for W alone), kept by original id
    (``cache``, a ``HessianCache``, the support Newton step's: each reuses what the
    other formed): a set within S costs no pass over the rows, one that adds a few
    features a pass and their rows. Also A^T y by original id, for the active set."""

    def __init__(self, n_original, cache=None):
        self.cache = HessianCache() if cache is None else cache
        self.y_correlation = np.zeros(n_original)
        self.y_of = None                 # the ActiveSet y_correlation holds

    def span(self, active, ws):
        """The positions (on ``active``) of the features the next Gram matrix holds:
        the kept ones still active and W's, sorted; W's alone where more than
        MAX_GRAM."""
        kept = self.cache.ids
        if kept is None:
            return ws
        held = np.zeros(active.n_features + 1, dtype=bool)
        position = np.minimum(np.searchsorted(active.features, kept), active.n_features)
        held[position[active.features[np.minimum(position, active.n_features - 1)] ==
                      kept]] = True
        held[-1] = False
        held[ws] = True
        span = np.flatnonzero(held)
        return span if span.shape[0] <= MAX_GRAM else ws

    def price(self, active, span):
        """The products that forming the Gram matrix on ``span`` costs: sum_i m_i^2
        for m_i entries of row i in it, taken as even (entries^2 / n), or where the
        kept one holds most of it, a pass over the rows and the new columns' products,
        sum_i m_i f_i (f_i of row i's entries new), nothing where none is new."""
        n, counts = active.problem.n_samples, active.column_counts[span]
        entries = float(np.sum(counts))
        old = self.cache.reusable(active.features[span], active.problem.fit_intercept)
        if old is None:
            return entries * entries / n
        fresh = float(np.sum(counts[old < 0]))
        return float(active.nnz) + entries * fresh / n if fresh else 0.0

    def gram(self, active, z, ws, span, n_threads):
        """B^T B for W (the intercept last where it is fitted), from the one on
        ``span`` (``SupportRows.hessian_sums`` at the margins z, whose values the
        squared loss's Hessian does not depend on)."""
        intercept = active.problem.fit_intercept
        full = SupportRows(active, active.problem.loss.code, z, span, intercept, None,
                           self.cache, n_threads).hessian_sums()
        where = np.searchsorted(span, ws)
        if intercept:
            where = np.append(where, span.shape[0])
        return np.ascontiguousarray(full[np.ix_(where, where)])

    def y_correlation_on(self, active, ws):
        """A_W^T C y (and sum c y last with an intercept; C = diag(c), the sample
        weights, the identity without them)."""
        weighted_y = weighted_targets(active)
        if self.y_of is not active:
            self.y_correlation[active.features] = csr_rmatvec(
                active.indptr, active.indices, active.data, weighted_y, active.n_features)
            self.y_of = active
        y_corr = self.y_correlation[active.features[ws]]
        return np.append(y_corr, float(np.sum(weighted_y))) \
            if active.problem.fit_intercept else y_corr


def weighted_targets(active):
    """c_i y_i over the rows of ``active`` (y itself without sample weights): what B^T y
    of the weighted least squares reads (``GramStore``, ``mpi.working_set.WorkerSums``)."""
    weights = active.sample_weight
    return active.y * weights if weights.shape[0] else active.y


def step(store, active, x, cert, outer_gap, grams=None, n_threads=1):
    """The working-set step from x at its certificate ``cert`` (on ``active``) ->
    (x, b, inner epochs or Newton steps, working-set size, work: the entries read,
    ``choice.WORK``-weighted); x is updated in place. Squared loss: coordinate descent
    with Anderson extrapolation, on the columns and, for L1 once ``gram_passes`` passes
    have not solved the subproblem, on the Gram matrix of [A_W, 1] (``grams``: the
    run's ``GramStore``, ``n_threads`` form it); other losses: proximal Newton
    steps. With the positive L1 penalty every solver keeps x >= 0; with the elastic net
    (``l2``) each has the L2 term (module docstring). For the L1 squared loss, after
    every ORTHANT_EVERY column passes that have not solved the subproblem and, at their
    rate (the gap's ratio over them), would not by the next ORTHANT_EVERY, one orthant
    Newton step (``lasso_orthant_newton``, ORTHANT_CG CG iterations at most: its passes
    at most those of the coordinate descent between two steps)."""
    prob = active.problem
    n = prob.n_samples
    block_indptr = active.block_indptr
    positive, l2 = active.penalty.positive, active.penalty.l2
    scores = violation_scores(x, cert.correlation, n, prob.lam, active.weights,
                              block_indptr, positive)
    singletons = singleton_blocks(block_indptr)
    x_norms = np.abs(x) if singletons else contiguous_block_norms(x, block_indptr)
    support = int(np.count_nonzero(x_norms))
    # where the Gram matrix could serve (squared loss, L1; a pass on it, dim^2, below
    # one on the columns, up to n dim, needs dim < n) and the support fits in it, the
    # set's violators stop at its bound rather than push the set past it
    bound = MAX_GRAM - int(prob.fit_intercept)       # the intercept's row
    gram_bound = prob.loss.quadratic and singletons and grams is not None and \
        support <= bound < n
    chosen = working_set(x_norms, scores, min(max(FIRST_SIZE, 2 * support), bound)
                         if gram_bound else None)
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
    tol = INNER_FRACTION * n * outer_gap
    counts = active.column_counts[ws]
    entries = float(np.sum(counts))
    dim = ws.shape[0] + int(prob.fit_intercept)
    rent, span = MAX_INNER_EPOCHS, None
    saving = gram_saving(entries, n, dim)
    if prob.loss.quadratic and singletons and grams is not None and saving > 0.0:
        span = grams.span(active, ws)
        rent = gram_passes(WORK["gram"] + grams.price(active, span), saving)
    work = 0.0
    if rent == 0:
        r, b, epochs, gap = active.y - cert.z, float(cert.intercept), 0, np.inf
    else:
        def ahead():    # the blocks of the next two sets if the support grows as fast
            blocks = working_set(x_norms, scores, AHEAD * chosen.shape[0])
            return active.features[blocks if singletons else
                                   block_positions(block_indptr, blocks)]
        cols = store.columns(active, active.features[ws], ahead)
        work += store.taken()
    if rent > 0 and prob.loss.quadratic:
        r = active.y - cert.z                    # y - A x - b (rho = C r)
        # the subproblem's gap at the start is about n times the outer one
        b, epochs, gap, newton = lasso_working_set_solve(
            store.indptr, store.rows, store.data, cols, w, r, float(cert.intercept),
            active.y, active.sample_weight, n * prob.lam, active.weights[chosen], positive,
            l2, lipschitz, pointer, prob.fit_intercept, tol, rent, ANDERSON, CHECK_EVERY,
            ORTHANT_EVERY, ORTHANT_CG, n * outer_gap)
        # a CG iteration reads S's entries twice, as a pass W's
        work += WORK["read"] * ((epochs + newton) * (2.0 * entries + 2.0 * n) +
                                (epochs // CHECK_EVERY + 1) * (entries + 2.0 * n) +
                                (epochs // (ANDERSON + 1)) * 4.0 * (ANDERSON + 1) *
                                (w.shape[0] + n))
    elif not prob.loss.quadratic:
        z = cert.z.copy()
        b, epochs, gap = float(cert.intercept), 0, np.inf
        price = HESSIAN_STEPS * gram_newton_price(entries, n, dim)
        spent, hessian = 0.0, False
        while epochs < MAX_NEWTON_STEPS and gap > tol:
            # as many column steps as cost the rest of the price at their cost so far
            each = spent / epochs if epochs else MAX_CD_PASSES * 2.0 * entries
            budget = int(min((price - spent) / max(each, 1.0), MAX_NEWTON_STEPS - epochs))
            if budget <= 0:             # the rest from the Hessian
                hessian = True
                break
            b, steps, gap, reads = prox_newton_working_set(
                store.indptr, store.rows, store.data, cols, w, z, b, active.y,
                active.sample_weight, prob.loss.code, n * prob.lam, active.weights[chosen],
                positive, l2, active.column_sq_norms[ws], prob.loss.lipschitz,
                prob.fit_intercept, tol, budget, MAX_CD_PASSES)
            epochs += steps
            spent += float(reads)
            if steps < budget:          # solved, or no step lowered n P
                break
        work += WORK["read"] * spent
        if hessian:
            b, steps, newton_work = gram_newton_finish(
                active, WorkingRows(store, cols, active), z, ws, w, b, tol,
                MAX_NEWTON_STEPS - epochs, entries, n_threads)
            epochs += steps
            work += newton_work
        gap = 0.0
    if span is not None and gap > tol:
        b, passes, gram_work = gram_finish(store, active, cert, ws, x[ws], w, r, b, tol,
                                           MAX_INNER_EPOCHS - epochs, grams, span, n_threads)
        epochs += passes
        work += gram_work
    x[ws] = w
    return x, float(b), int(epochs), int(ws.shape[0]), work


def gram_saving(entries, n, dim):
    """What a pass of coordinate descent on the Gram matrix of [A_W, 1] (dim^2) saves
    against one on W's columns (2 entries + 2 n: their entries read and the residual
    updated; ``WORK``-weighted); 0 where the matrix would have more than MAX_GRAM rows."""
    return 0.0 if dim > MAX_GRAM else \
        WORK["read"] * (2.0 * entries + 2.0 * n) - WORK["dense"] * float(dim) * dim


def gram_newton_price(entries, n, dim):
    """What a proximal Newton step with its direction from the Hessian on W costs
    (``gram_newton_finish``): its fixed cost (its Python), forming the Hessian
    (entries^2 / n for W's ``entries`` stored entries), ``newton_passes`` passes on it
    (dim^2 each) and three passes over
    W's rows (the Hessian's, the move's, A_W^T rho's: ``WorkingRows``); inf where it
    would have more than MAX_GRAM rows. A direction from the Hessian solves the model
    far more exactly, so that from a working set's start about HESSIAN_STEPS such steps
    end it, where the columns' directions (MAX_CD_PASSES passes at most) may need many
    (tall data, correlated columns): the working-set step takes directions from the
    columns until they have cost HESSIAN_STEPS of these steps (none where one column
    step would cost more), then from the Hessian, so that, whatever the number of
    column steps a set needs, it costs at most about twice the cheaper of the two ways
    (ski rental)."""
    if dim > MAX_GRAM:
        return np.inf
    return WORK["gram"] + WORK["read"] * (3.0 * (entries + n) + entries * entries / n) + \
        WORK["dense"] * newton_passes(entries, n, dim) * float(dim) * dim


def gram_newton_finish(active, rows, z, ws, w, b, tol, max_steps, entries, n_threads):
    """``gram_newton_steps`` on W from (w, b) at the margins z (both updated in place),
    at most ``max_steps`` steps, its sums over ``rows`` (W's ``WorkingRows``); returns
    (b, steps, work)."""
    prob = active.problem
    n, intercept = prob.n_samples, prob.fit_intercept
    dim = ws.shape[0] + int(intercept)
    weights, positive = active.weights[ws], active.penalty.positive
    l2 = active.penalty.l2
    sums = LocalNewtonSums(rows, z, np.arange(ws.shape[0]), weights, n * prob.lam,
                           positive, n_threads, l2)
    bound = prob.loss.lipschitz * (np.append(active.column_sq_norms[ws], prob.weight_total)
                                   if intercept else active.column_sq_norms[ws])
    passes = newton_passes(entries, n, dim)
    b, steps = gram_newton_steps(sums, w, b, n * prob.lam, weights, positive, bound,
                                 intercept, tol, passes, max_steps, l2)
    return b, steps, WORK["gram"] * steps + WORK["read"] * sums.reads + \
        WORK["dense"] * steps * passes * dim * dim


def newton_passes(entries, n, dim):
    """The passes of coordinate descent on the Hessian for a Newton direction: as many
    as cost what forming it does (entries^2 / n products against dim^2 dense entries a
    pass, ``WORK``-weighted), between MAX_CD_PASSES and MAX_NEWTON_PASSES."""
    return int(min(max(WORK["read"] * entries * entries / n /
                       (WORK["dense"] * float(dim) * dim), MAX_CD_PASSES),
                   MAX_NEWTON_PASSES))


def gram_passes(price, saving):
    """The passes of column coordinate descent after which the working-set step goes on
    on the Gram matrix (``gram_finish``): as many as its formation (``price``, from
    ``GramStore.price``) costs in passes' ``saving`` (``gram_saving``, > 0), rounded
    down to a multiple of CHECK_EVERY (0: the Gram matrix at once). Passing over the
    columns until they have cost what the matrix does, then forming it, costs at most
    twice the cheaper of the two whatever the number of passes (ski rental)."""
    return int(min(price / saving, MAX_INNER_EPOCHS) // CHECK_EVERY) * CHECK_EVERY


def gram_finish(store, active, cert, ws, w0, w, r, b, tol, max_passes, grams, span,
                n_threads):
    """The squared loss's subproblem on W from (w, b) with residual r = y - A_W w - b,
    solved by coordinate descent on the Gram matrix of B = C^(1/2) [A_W, 1] (C the sample
    weights; the residual C^(1/2) r, so that B^T C^(1/2) r is [A_W^T rho, sum rho])
    (``kernels.working_set.gram_lasso_cd``, which Dis-DDSS's server runs): B^T B from
    ``grams`` (``GramStore.gram`` on ``span``), B^T r from the certificate's A^T rho and
    the move since it (from w0 and the certificate's intercept), B^T C^(1/2) y. w is
    updated in place; returns (b, passes, work). (The elastic net's certificate holds
    c = A^T rho - n mu w x: its A^T rho comes back by ``loss_correlation`` at w0.)"""
    prob = active.problem
    n, intercept = prob.n_samples, prob.fit_intercept
    price = grams.price(active, span)
    gram = grams.gram(active, cert.z, ws, span, n_threads)
    penalty = active.penalty
    corr = cert.correlation[ws]
    if penalty.l2:      # the elastic net's c: A^T rho back
        corr = penalty.restricted(ws).loss_correlation(corr, w0, n * prob.lam)
    if intercept:
        corr = np.append(corr, cert.rho_sum)
    corr, sq_residual, y_residual = gram_start(gram, corr, w0, w, b - float(cert.intercept),
                                               r, active.y, active.sample_weight, intercept)
    db, passes, _ = gram_lasso_cd(
        gram, corr, w, n * prob.lam, active.weights[ws], penalty.positive, penalty.l2,
        intercept, sq_residual, y_residual, grams.y_correlation_on(active, ws), tol,
        max_passes, CHECK_EVERY, ANDERSON)
    dim = gram.shape[0]
    return b + db, passes, WORK["gram"] + WORK["read"] * price + \
        WORK["dense"] * passes * dim * dim


NEWTON_GRID = 2.0 ** -np.arange(10)     # the line search's steps, 1 down to 1/512


def penalty_sum(weights, w, l2=0.0):
    """sum_q v_q (|w_q| + l2 w_q^2 / 2): the working set's penalty over n lam (the L1
    norm alone, bit for bit, where l2 = 0)."""
    value = float(np.sum(weights * np.abs(w)))
    return value + 0.5 * l2 * weighted_square_sum(w, weights) if l2 else value


def gram_newton_steps(sums, w, b, n_lam, weights, positive, bound, intercept, tol, passes,
                      max_steps=MAX_NEWTON_STEPS, l2=0.0):
    """Proximal Newton steps on W for a loss whose Hessian depends on the margins (L1
    logistic), from the Hessian on W: what Dis-DDSS's server runs from the workers'
    shares (``mpi.working_set.server_newton_step``) and the serial step once the
    column directions have cost what one of these steps does (``gram_newton_price``). Each step,
    unless ``sums.solved(w, tol)`` (the subproblem's gap at most tol, where the sums
    have it):
      - ``sums.hessian_and_slope()``: H = sum_i f''(z_i) [a_iW, 1] [a_iW, 1]^T and
        g = sum_i f'(z_i) [a_iW, 1] at the current point;
      - the direction d minimising g^T d + d^T H d / 2 + n lam |w + d|_v (over
        w + d >= 0 with ``positive``, so that every step keeps w >= 0; plus the elastic
        net's n lam l2 ||w + d||_v^2 / 2 with ``l2``, ``penalty_sum``) by ``passes``
        passes of coordinate descent on H (``gram_lasso_cd``); the steps stop where its
        model decrease Delta = g^T d + n lam (|w + d|_v - |w|_v) is not negative, or,
        where the sums do not know the gap (``sums.knows_gap`` False), above -tol after
        the first step (the model's decrease on W can be below tol while the outer gap
        is not, and the first step then still moves, so that the next set sees the
        violators that hold the gap up);
      - ``sums.losses(go, d)``: sum_i f at t = 1, 1/2, ..., 1/2^9 along d, then at t = 0
        (None where not ``go``); the largest t with n P(t) <= n P(0) + 1e-4 t Delta
        taken; where none is (f'' ~ 0 on separated rows makes H nearly singular and d
        huge: the model misleads), ``sums.again()`` and a direction with H +
        diag(``bound``) (the coordinates' curvature bound, L_f ||a_j||^2 and L_f n: a
        majorizer), then no step if that fails too;
      - ``sums.take(index, d)``: the step t = NEWTON_GRID[index] (index -1: none, the
        steps stop);
    at most ``max_steps`` steps. w is updated in place; returns (b, steps)."""
    k = w.shape[0]
    dim = k + int(intercept)
    steps = 0
    for steps in range(1, max_steps + 1):
        if sums.solved(w, tol):
            steps -= 1
            break
        hessian, slope = sums.hessian_and_slope()
        penalty_now = penalty_sum(weights, w, l2)
        chosen = -1
        for attempt in range(2):
            if attempt:
                hessian[np.diag_indices(dim)] += bound
            target = w.copy()
            d_b, _, _ = gram_lasso_cd(hessian, -slope, target, n_lam, weights, positive,
                                      l2, intercept, 0.0, 0.0, np.zeros(dim), -np.inf,
                                      passes, passes, ANDERSON)
            direction = np.append(target - w, d_b) if intercept else target - w
            decrease = float(slope @ direction) + n_lam * (
                penalty_sum(weights, target, l2) - penalty_now)
            go = decrease < (0.0 if steps == 1 or sums.knows_gap else -tol)
            losses = sums.losses(go, direction)
            if not go:
                break
            before = losses[-1] + n_lam * penalty_now
            for index, t in enumerate(NEWTON_GRID):
                after = losses[index] + n_lam * penalty_sum(weights, w + t * direction[:k],
                                                            l2)
                if after <= before + 1e-4 * t * decrease:
                    chosen = index
                    break
            if chosen >= 0 or attempt:
                break
            sums.again()
        if not go:
            break
        sums.take(chosen, direction)
        if chosen < 0:
            break
        t = NEWTON_GRID[chosen]
        w += t * direction[:k]
        if intercept:
            b += t * direction[k]
    return b, steps


class LazyLosses:
    """n f's sum at z + t u for t = NEWTON_GRID[index] (index -1: t = 0), formed when
    first read: the line search reads the steps in order and stops at the first it
    takes (the loss costs an exp and a log a row)."""

    def __init__(self, sums):
        self.sums, self.values = sums, {-1: sums.loss_now()}

    def __getitem__(self, index):
        if index not in self.values:
            sums = self.sums
            t = 0.0 if index == -1 else NEWTON_GRID[index]
            sums.reads += sums.z.shape[0]
            self.values[index] = sums.z.shape[0] * mean_loss(
                sums.code, sums.z + t * sums.dz, sums.active.y, sums.active.sample_weight)
        return self.values[index]


class WorkingRows:
    """The active rows restricted to W's columns (``ColumnStore`` columns ``cols``), as
    CSR with column q W's q-th (``csc_rows``): what the Newton steps from the Hessian
    on W read, W's entries alone where the ActiveSet's rows hold every active feature's.
    It answers what ``LocalNewtonSums`` and ``SupportRows`` ask of an ActiveSet (the
    rows' ``sample_weight`` too, the active set's)."""

    def __init__(self, store, cols, active):
        self.problem, self.y = active.problem, active.y
        self.sample_weight = active.sample_weight
        self.indptr, self.indices, self.data = csc_rows(store.indptr, store.rows,
                                                        store.data, cols, active.y.shape[0])
        self.column_counts = store.indptr[cols + 1] - store.indptr[cols]
        self.n_features = cols.shape[0]
        self.nnz = int(self.indptr[-1])

    def margins(self, x, b, n_threads=1):
        """z = A_W x + b."""
        return csr_margins(self.indptr, self.indices, self.data, x, b,
                           np.empty(self.y.shape[0]), n_threads)


class LocalNewtonSums:
    """``gram_newton_steps``' sums over the rows of this process's ActiveSet from the
    margins z at (w, b) on W (updated in place): z follows the steps (z += t (A_W d_w +
    d_b)), rho = -c f'(z) (c the rows' sample weights) and A^T rho are formed again
    after each (a pass over the rows each), the line search's losses from
    u = A_W d_w + d_b (a pass; ``LazyLosses``), and ``solved`` is the subproblem's gap
    (``kernels.working_set.working_set_gap``'s, from them; its dual constraint
    one-sided with ``positive``; with the elastic net's ``l2``, c = A_W^T rho -
    n lam l2 v w and the L2 terms). ``reads``: the entries read so far."""

    def __init__(self, active, z, ws, weights, n_lam, positive=False, n_threads=1, l2=0.0):
        self.active, self.ws, self.n_threads = active, ws, n_threads
        self.weights, self.n_lam, self.positive = weights, n_lam, positive
        self.l2 = l2
        self.code = active.problem.loss.code
        self.intercept = active.problem.fit_intercept
        self.z = z
        self.rows = None
        self.reads = 0.0
        self._loss = None
        self._residual()

    def loss_now(self):
        """n f's sum at z, sum_i c_i f(z_i) (c the rows' sample weights), formed once
        per point."""
        if self._loss is None:
            self.reads += self.z.shape[0]
            self._loss = self.z.shape[0] * mean_loss(self.code, self.z, self.active.y,
                                                     self.active.sample_weight)
        return self._loss

    knows_gap = True

    def _residual(self):
        active = self.active
        self.rho = generalized_residual(self.code, self.z, active.y, active.sample_weight,
                                        np.empty_like(self.z))
        self.correlation = csr_rmatvec(active.indptr, active.indices, active.data,
                                       self.rho, active.n_features,
                                       self.n_threads)[self.ws]
        self.reads += 2.0 * active.nnz

    def solved(self, w, tol):
        y, n, weights = self.active.y, self.z.shape[0], self.active.sample_weight
        live = self.weights > 0.0
        correlation = self.correlation
        if self.l2:
            correlation = correlation - self.n_lam * self.l2 * self.weights * w
        dual_norm = float(np.max(l1_dual_norms(correlation[live], self.positive) /
                                 self.weights[live])) if np.any(live) else 0.0
        scale = max(1.0, dual_norm / self.n_lam)
        gap = self.loss_now() - \
            n * mean_neg_conjugate(self.code, self.rho / scale, y, weights) + \
            self.n_lam * penalty_sum(self.weights, w, self.l2)
        if self.l2:
            gap += 0.5 * self.n_lam * self.l2 * weighted_square_sum(w, self.weights) / \
                (scale * scale)
        return gap <= tol

    def hessian_and_slope(self):
        slope = shard_slope(self.correlation, float(np.sum(self.rho)), self.intercept)
        self.rows = SupportRows(self.active, self.code, self.z, self.ws, self.intercept,
                                slope, None, self.n_threads)
        entries = float(np.sum(self.active.column_counts[self.ws]))
        self.reads += self.active.nnz + entries * entries / self.active.problem.n_samples
        return self.rows.hessian_sums(), slope

    def losses(self, go, direction):
        if not go:
            return None
        active, k = self.active, self.ws.shape[0]
        move = np.zeros(active.n_features)
        move[self.ws] = direction[:k]
        self.dz = active.margins(move, direction[k] if self.intercept else 0.0,
                                 self.n_threads)
        self.reads += active.nnz
        self.values = LazyLosses(self)
        return self.values

    def again(self):
        """Nothing to tell: the next direction is formed here."""

    def take(self, index, direction):
        if index < 0:
            return
        self.z += NEWTON_GRID[index] * self.dz
        self._loss = self.values.values[index]
        self._residual()
