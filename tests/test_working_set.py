"""The working-set method (``method="working_set"``): coordinate descent with Anderson
extrapolation on a working set inside the certified DDSS loop, against scikit-learn,
celer and skglm; the solutions also for ``method="auto"``, which mixes it with the
prox-SVRG epoch."""
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso as SkLasso

import asyncopt
from asyncopt.data import load_libsvm
from asyncopt.kernels.working_set import (_extrapolate, _solve_spd, gram_lasso_cd,
                                          lasso_objective, lasso_orthant_newton,
                                          lasso_working_set_cd, lasso_working_set_solve,
                                          prox_newton_working_set,
                                          TRUST_MARGIN)
from asyncopt.losses import UNWEIGHTED
from asyncopt.penalties import L1
from asyncopt.problem import Problem
from asyncopt.solvers.ddss import solve_ddss
from asyncopt.solvers.pse import column_major
from asyncopt.solvers.working_set import violation_scores, working_set

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


def correlated_data(n=60, p=150, seed=0, density=0.3):
    """n << p, columns correlated through shared factors: the regime of text data."""
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((n, 8))
    X = factors @ rng.standard_normal((8, p)) + 0.5 * rng.standard_normal((n, p))
    X *= rng.random((n, p)) < density
    coef = np.zeros(p)
    coef[rng.choice(p, 6, replace=False)] = rng.standard_normal(6) * 3
    y = X @ coef + 0.1 * rng.standard_normal(n) + 1.5
    return X, y


def objective(X, y, coef, b, alpha):
    r = y - X @ coef - b
    return 0.5 * np.mean(r ** 2) + alpha * np.abs(coef).sum()


def sklearn_solution(X, y, alpha, fit_intercept):
    sk = SkLasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-14,
                 max_iter=1_000_000).fit(X, y)
    return sk.coef_, float(sk.intercept_)


@pytest.mark.parametrize("method", ["working_set", "auto"])
@pytest.mark.parametrize("layout", ["dense", "csr", "csc"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("ratio", [0.1, 0.01])
def test_reaches_sklearns_objective_and_its_gap_is_a_certificate(layout, fit_intercept,
                                                                  ratio, method):
    X, y = correlated_data(seed=int(ratio * 100) + fit_intercept)
    data = {"dense": X, "csr": sp.csr_matrix(X), "csc": sp.csc_matrix(X)}[layout]
    alpha = ratio * Problem(X, y, "squared", L1(X.shape[1]), 1.0,
                            fit_intercept).lam_max()
    est = asyncopt.Lasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-10,
                         method=method, max_epochs=1000).fit(data, y)
    coef, b = sklearn_solution(X, y, alpha, fit_intercept)
    ours = objective(X, y, est.coef_, est.intercept_, alpha)
    theirs = objective(X, y, coef, b, alpha)
    assert abs(ours - theirs) <= 1e-6 * theirs
    # the reported gap bounds the distance to the optimum (sklearn's within 1e-14)
    assert ours - theirs <= est.dual_gap_ + 1e-12 * theirs
    assert est.dual_gap_ <= 1e-10 * est.history_[0]["primal"]
    assert np.count_nonzero(est.coef_) > 0


def test_screening_keeps_every_feature_of_the_solution():
    """What the outer loop's gap-safe screening removed is zero in sklearn's solution
    to 1e-14, and the records' P never rises: the working-set step only lowers F."""
    X, y = correlated_data(n=80, p=400, seed=3)
    problem = Problem(sp.csr_matrix(X), y, "squared", L1(400), 1.0, True)
    problem = problem.with_lam(0.02 * problem.lam_max())
    result = solve_ddss(problem, tol=1e-10, inner="working_set", support_newton=False,
                        max_epochs=1000)
    assert result.converged
    assert result.active_features.shape[0] < 400        # screening removed some
    coef, _ = sklearn_solution(X, y, problem.lam, True)
    removed = np.setdiff1d(np.arange(400), result.active_features)
    np.testing.assert_array_equal(coef[removed], 0.0)
    primal = [record["primal"] for record in result.history]
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in
               zip(primal, primal[1:]))
    assert max(r["working_set"] or 0 for r in result.history) < 400


def test_epochs_and_extrapolations_never_raise_the_subproblems_objective():
    """lasso_working_set_cd run for 1, 2, ..., 40 epochs from one start (deterministic):
    F falls with every epoch count, extrapolations are kept, and the residual it keeps
    is y - A w - b exactly."""
    X, y = correlated_data(n=50, p=120, seed=5, density=0.6)
    indptr, rows, data = column_major(Problem(sp.csr_matrix(X), y, "squared", L1(120),
                                              1.0, True).full_active_set())
    # the problem's rows are shuffled: rebuild y and X in its order from the CSC
    csc = sp.csc_matrix((data, rows, indptr), shape=X.shape)
    order_y = Problem(sp.csr_matrix(X), y, "squared", L1(120), 1.0, True) \
        .full_active_set().y
    cols = np.arange(0, 120, 2, dtype=np.int64)
    sq = np.asarray(csc.multiply(csc).sum(axis=0)).ravel()[cols]
    n_lam = 0.05 * np.max(np.abs(csc.T @ (order_y - order_y.mean())))
    weights = np.ones(cols.shape[0])
    blocks = np.arange(cols.shape[0] + 1, dtype=np.int64)
    values, kept = [], 0
    for epochs in range(1, 41):
        w, r = np.zeros(cols.shape[0]), order_y - order_y.mean()
        b, done, _, kept = lasso_working_set_cd(indptr, rows, data, cols, w, r,
                                                float(order_y.mean()), order_y,
                                                UNWEIGHTED, n_lam, weights, False, 0.0, sq,
                                                blocks, True, 0.0, epochs, 5, 10)
        assert done == epochs
        np.testing.assert_allclose(r, order_y - csc[:, cols] @ w - b, atol=1e-10)
        values.append(lasso_objective(w, r, UNWEIGHTED, n_lam, weights, False, 0.0,
                                      blocks))
    assert all(later <= earlier + 1e-12 for earlier, later in zip(values, values[1:]))
    assert kept > 0


def orthant_problem(n=60, p=30, seed=0, weighted=False):
    """A CSC problem of p columns (every column in W): (X, y, row weights c summing to
    n, its CSC, c in the kernels' form (empty where unweighted), ||A_q||_C^2)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.5)
    X[:, 1] = X[:, 0] + 0.01 * rng.standard_normal(n)      # nearly collinear pair
    y = X[:, :6] @ rng.standard_normal(6) + 0.1 * rng.standard_normal(n) + 0.7
    c = rng.uniform(0.5, 2.0, n) if weighted else np.ones(n)
    c *= n / c.sum()
    csc = sp.csc_matrix(X)
    return X, y, c, csc, (c if weighted else UNWEIGHTED), c @ (X * X)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("l2", [0.0, 0.5])
@pytest.mark.parametrize("positive", [False, True])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_an_orthant_newton_step_solves_the_problem_on_the_solutions_orthant(
        weighted, l2, positive, fit_intercept):
    """From a perturbed solution with its signs and zeros, one step with enough CG
    iterations lands on scikit-learn's Lasso / ElasticNet solution (F is quadratic on the
    orthant), keeping r = y - A w - b."""
    from sklearn.linear_model import ElasticNet as SkElasticNet
    X, y, c, csc, kernel_c, sq = orthant_problem(seed=7, weighted=weighted)
    n, p = X.shape
    alpha, l1_ratio = 0.05, 1.0 / (1.0 + l2)    # l2 = (1 - l1_ratio) / l1_ratio
    sk = SkElasticNet(alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept,
                      positive=positive, tol=1e-14, max_iter=1_000_000).fit(
        X, y, sample_weight=c)
    n_lam = n * alpha * l1_ratio
    rng = np.random.default_rng(1)
    w = sk.coef_ * (1.0 + 0.2 * rng.random(p))                # same signs and zeros
    b = float(sk.intercept_) + (0.3 if fit_intercept else 0.0)
    r = y - X @ w - b
    cols = np.arange(p, dtype=np.int64)
    assert 2 <= np.count_nonzero(w) < n
    b, iterations = lasso_orthant_newton(csc.indptr, csc.indices, csc.data, cols, w, r, b,
                                         kernel_c, n_lam, np.ones(p), positive, l2, sq,
                                         fit_intercept, 200)
    assert 0 < iterations <= 200
    np.testing.assert_allclose(w, sk.coef_, atol=1e-8)
    assert b == pytest.approx(float(sk.intercept_), abs=1e-8)
    np.testing.assert_allclose(r, y - X @ w - b, atol=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_orthant_newton_steps_never_raise_f_and_keep_zeros_zero(seed):
    """From arbitrary starts (random signs, half the coordinates zero) and a few CG
    iterations: F never rises, zeros stay zero, signs never flip, r stays exact."""
    X, y, c, csc, kernel_c, sq = orthant_problem(seed=seed, weighted=seed % 2 == 1)
    n, p = X.shape
    rng = np.random.default_rng(seed)
    positive = seed % 3 == 0
    l2 = 0.3 if seed % 2 == 0 else 0.0
    w = rng.standard_normal(p) * (rng.random(p) < 0.5)
    if positive:
        w = np.abs(w)
    b = 0.5
    r = y - X @ w - b
    cols = np.arange(p, dtype=np.int64)
    blocks = np.arange(p + 1, dtype=np.int64)
    weights = rng.uniform(0.5, 2.0, p)
    n_lam = 2.0
    for _ in range(5):
        before = lasso_objective(w, r, kernel_c, n_lam, weights, positive, l2, blocks)
        start = w.copy()
        b, _ = lasso_orthant_newton(csc.indptr, csc.indices, csc.data, cols, w, r, b,
                                    kernel_c, n_lam, weights, positive, l2, sq, True, 3)
        assert lasso_objective(w, r, kernel_c, n_lam, weights, positive, l2, blocks) \
            <= before
        assert np.all(w[start == 0] == 0) and np.all(w * start >= 0)
        np.testing.assert_allclose(r, y - X @ w - b, atol=1e-10)


@pytest.mark.parametrize("options", [{}, {"positive": True}, {"l1_ratio": 0.6},
                                     {"sample_weight": True}])
def test_orthant_newton_steps_after_every_pass_reach_sklearns_objective(options,
                                                                         monkeypatch):
    """The working-set step with orthant Newton steps offered after every column pass
    (where the solver offers one after ORTHANT_EVERY) still reaches scikit-learn's
    objective to 1e-6, with a certified gap."""
    from sklearn.linear_model import ElasticNet as SkElasticNet
    import asyncopt.solvers.working_set as ws_module
    monkeypatch.setattr(ws_module, "ORTHANT_EVERY", 1)
    calls = []

    def counted(*args):
        result = lasso_working_set_solve(*args)
        calls.append(result[3])         # the orthant steps' CG iterations
        return result
    monkeypatch.setattr(ws_module, "lasso_working_set_solve", counted)
    X, y = correlated_data(n=60, p=150, seed=11)
    options = dict(options)
    weights = np.random.default_rng(0).uniform(0.5, 2.0, 60) \
        if options.pop("sample_weight", False) else None
    l1_ratio = options.pop("l1_ratio", 1.0)
    alpha = 0.02 * Problem(X, y, "squared", L1(150), 1.0, True).lam_max()
    est = asyncopt.ElasticNet(alpha=alpha, l1_ratio=l1_ratio, tol=1e-10,
                              method="working_set", max_epochs=1000, **options).fit(
        sp.csr_matrix(X), y, sample_weight=weights)
    sk = SkElasticNet(alpha=alpha, l1_ratio=l1_ratio, tol=1e-14, max_iter=1_000_000,
                      **options).fit(X, y, sample_weight=weights)
    c = np.ones(60) if weights is None else weights * 60 / weights.sum()

    def value(coef, b):
        r = y - X @ coef - b
        return 0.5 * np.mean(c * r * r) + alpha * (
            l1_ratio * np.abs(coef).sum() + 0.5 * (1 - l1_ratio) * coef @ coef)
    ours, theirs = value(est.coef_, est.intercept_), value(sk.coef_, sk.intercept_)
    assert abs(ours - theirs) <= 1e-6 * theirs
    assert ours - theirs <= est.dual_gap_ + 1e-12 * theirs
    assert np.count_nonzero(est.coef_) > 0
    assert sum(calls) > 0


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("anderson", [0, 5])
def test_gram_coordinate_descent_reaches_sklearns_objective_with_a_true_gap(fit_intercept,
                                                                             anderson):
    """gram_lasso_cd (the server's solve under mpirun) from the Gram matrix of [A, 1]
    and the sums at a start (w0, b0) alone: the objective of scikit-learn's Lasso at
    tol 1e-12, each pass count's objective no higher than the one before (exact
    coordinate steps, extrapolations kept only where they lower it), and a returned gap
    that bounds P - P* at every pass count."""
    X, y = correlated_data(n=60, p=25, seed=3, density=1.0)
    n = X.shape[0]
    B = np.hstack([X, np.ones((n, 1))]) if fit_intercept else X
    lam = 0.05 * np.max(np.abs(X.T @ (y - y.mean() * fit_intercept))) / n
    ref = SkLasso(alpha=lam, tol=1e-12, max_iter=100_000,
                  fit_intercept=fit_intercept).fit(X, y)

    def objective(w, b):
        return 0.5 * np.sum((y - X @ w - b) ** 2) / n + lam * np.sum(np.abs(w))
    best = objective(ref.coef_, ref.intercept_)
    w0 = np.where(np.arange(25) % 3 == 0, 0.1, 0.0)       # a start away from zero
    b0 = 0.2 if fit_intercept else 0.0
    r = y - X @ w0 - b0
    values = []
    for passes in range(1, 30):
        w = w0.copy()
        db, done, gap = gram_lasso_cd(B.T @ B, B.T @ r, w, n * lam, np.ones(25), False,
                                      0.0, fit_intercept, r @ r, y @ r, B.T @ y, 0.0,
                                      passes, 1, anderson)
        assert done == passes
        values.append(objective(w, b0 + db))
        assert values[-1] - best <= gap / n + 1e-13
    assert all(later <= earlier + 1e-15 for earlier, later in zip(values, values[1:]))
    w = w0.copy()
    db, _, gap = gram_lasso_cd(B.T @ B, B.T @ r, w, n * lam, np.ones(25), False, 0.0,
                               fit_intercept, r @ r, y @ r, B.T @ y, 1e-12, 100_000, 10,
                               anderson)
    assert gap <= 1e-12
    assert abs(objective(w, b0 + db) - best) <= 1e-9 * best


def tall_correlated_data(n=3000, p=40, seed=0):
    """n >> p with correlated columns (a9a's degree-2 products): a working set's Gram
    matrix is cheaper a pass than its columns, and coordinate descent needs many."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 6)) @ rng.standard_normal((6, p)) + \
        0.3 * rng.standard_normal((n, p))
    y = X[:, :5] @ np.array([2.0, -1.0, 1.5, 0.5, -2.0]) + rng.standard_normal(n) + 1.0
    return X, y


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_the_gram_path_reaches_sklearns_objective_with_a_true_gap(layout, fit_intercept,
                                                                   monkeypatch):
    """On tall data the serial working-set step goes on on the Gram matrix of [A_W, 1]
    (``gram_finish``, checked to run); the fit reaches scikit-learn's objective and its
    gap bounds the distance to it."""
    from asyncopt.solvers import working_set as module
    calls = []
    finish = module.gram_finish
    monkeypatch.setattr(module, "gram_finish",
                        lambda *args: calls.append(1) or finish(*args))
    X, y = tall_correlated_data(seed=fit_intercept)
    data = sp.csr_matrix(X) if layout == "csr" else X
    alpha = 0.01 * Problem(X, y, "squared", L1(X.shape[1]), 1.0,
                           fit_intercept).lam_max()
    est = asyncopt.Lasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-10,
                         method="working_set", max_epochs=1000).fit(data, y)
    assert sum(calls) > 0
    coef, b = sklearn_solution(X, y, alpha, fit_intercept)
    ours = objective(X, y, est.coef_, est.intercept_, alpha)
    theirs = objective(X, y, coef, b, alpha)
    assert abs(ours - theirs) <= 1e-6 * theirs
    assert ours - theirs <= est.dual_gap_ + 1e-12 * theirs


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_going_on_on_the_gram_matrix_solves_the_columns_subproblem(fit_intercept):
    """``gram_finish`` from a point that column passes reached (its B^T r formed from
    the certificate's and the move since it) ends at the subproblem's solution that
    the column passes reach alone."""
    from asyncopt.kernels.working_set import lasso_working_set_cd
    from asyncopt.solvers.working_set import ColumnStore, GramStore, gram_finish
    X, y = tall_correlated_data(n=800, p=30, seed=5)
    prob = Problem(X, y, "squared", L1(30), 1.0, fit_intercept)
    prob = prob.with_lam(0.02 * prob.lam_max())
    active = prob.full_active_set()
    x0 = np.where(np.arange(30) % 4 == 0, 0.05, 0.0)
    cert = active.certificate(x0, 0.3 if fit_intercept else 0.0)
    ws = np.arange(30)
    store = ColumnStore(30)
    cols = store.columns(active, active.features[ws], lambda: active.features[ws])
    n_lam = prob.n_samples * prob.lam
    args = (store.indptr, store.rows, store.data, cols)

    def columns(w, r, b, epochs, tol):
        return lasso_working_set_cd(*args, w, r, b, active.y, UNWEIGHTED, n_lam,
                                    np.ones(30), False, 0.0,
                                    active.column_sq_norms, np.arange(31), fit_intercept,
                                    tol, epochs, 5, 10)
    w_ref, r_ref = x0.copy(), cert.rho.copy()
    b_ref = columns(w_ref, r_ref, float(cert.intercept), 100_000, 1e-13)[0]
    w, r = x0.copy(), cert.rho.copy()
    b = columns(w, r, float(cert.intercept), 10, 0.0)[0]
    assert np.max(np.abs(w - w_ref)) > 1e-4               # not yet solved
    b, _, _ = gram_finish(store, active, cert, ws, x0, w, r, b, 1e-13, 100_000,
                          GramStore(30), ws, 1)
    assert np.max(np.abs(w - w_ref)) <= 1e-7
    assert abs(b - b_ref) <= 1e-7


def test_the_gram_store_forms_the_working_sets_gram_matrix_by_feature_id():
    """``GramStore.gram`` is [A_W, 1]^T [A_W, 1] for W on the active set, from what it
    kept (a set within the last span: no pass; a few new features: their rows), also
    after a compaction moved the features' positions; the kept span holds every
    still-active feature of the sets so far."""
    from asyncopt.solvers.working_set import GramStore
    X, y = tall_correlated_data(n=200, p=30, seed=2)
    prob = Problem(sp.csr_matrix(X), y, "squared", L1(30), 1.0, True)
    active = prob.full_active_set()
    grams = GramStore(30)

    def reference(active, ws):
        ids = active.features[ws]
        B = np.hstack([X[:, ids], np.ones((200, 1))])
        return B.T @ B

    z = np.zeros(200)
    for ws in (np.array([1, 4, 9]), np.array([1, 4, 9, 12]), np.array([4, 12]),
               np.arange(20)):
        span = grams.span(active, ws)
        assert np.all(np.isin(ws, span))
        gram = grams.gram(active, z, ws, span, 1)
        np.testing.assert_allclose(gram, reference(active, ws), rtol=1e-12, atol=1e-9)
    keep = np.ones(30, dtype=bool)
    keep[[0, 2, 3]] = False                 # positions shift after the compaction
    active, _, _ = active.compact(keep, np.zeros(30))
    ws = np.array([0, 5, 16])
    span = grams.span(active, ws)
    assert span.shape[0] == 17               # the kept 17 of the 20 still active
    np.testing.assert_allclose(grams.gram(active, z, ws, span, 1),
                               reference(active, ws), rtol=1e-12, atol=1e-9)


def test_the_working_set_holds_the_support_then_the_worst_violators():
    x = np.array([0.0, 1.0, 0.0, 0.0, -2.0, 0.0] + [0.0] * 14)
    correlation = np.zeros(20)
    correlation[[0, 2, 3, 7]] = [5.0, 9.0, 1.5, 30.0]   # -grad * n
    scores = violation_scores(x, correlation, 1.0, 1.0, np.ones(20), np.arange(21))
    assert scores[7] == 29.0 and scores[3] == 0.5 and scores[5] == 0.0
    assert scores[1] == 1.0 and scores[4] == 1.0     # |grad + lam sign(x)| at x != 0
    ws = working_set(np.abs(x), scores)              # max(10, 2 nnz) = 10 at most
    np.testing.assert_array_equal(ws, [0, 1, 2, 3, 4, 7])
    scores[10:] = 0.1
    assert working_set(np.abs(x), scores).shape[0] == 10


def logistic_objective(X, y, coef, b, alpha):
    return np.mean(np.logaddexp(0.0, -y * (X @ coef + b))) + alpha * np.abs(coef).sum()


def peer_logistic_objective(X, y, alpha, fit_intercept):
    """The L1 logistic objective at skglm's solution (celer's without intercept), both
    at tol 1e-12."""
    import celer
    import skglm
    if fit_intercept:
        peer = skglm.SparseLogisticRegression(alpha=alpha, tol=1e-12, max_iter=1000,
                                              fit_intercept=True).fit(X, y)
        coef, b = peer.coef_.ravel(), float(np.ravel(peer.intercept_)[0])
    else:
        peer = celer.LogisticRegression(C=1.0 / (X.shape[0] * alpha), tol=1e-12,
                                        fit_intercept=False).fit(X, y)
        coef, b = peer.coef_.ravel(), 0.0
    return logistic_objective(X, y, coef, b, alpha)


@pytest.mark.filterwarnings("ignore:'@' is faster")      # inside skglm's solver
@pytest.mark.parametrize("method", ["working_set", "auto"])
@pytest.mark.parametrize("layout", ["dense", "csr", "csc"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_l1_logistic_reaches_the_peers_objective(layout, fit_intercept, method):
    """Proximal Newton on the working set: celer's objective without intercept, skglm's
    with one (both at 1e-12), to 1e-6 relative; the reported gap bounds the distance."""
    X, t = correlated_data(n=80, p=150, seed=7 + fit_intercept)
    y = np.where(t > np.quantile(t, 0.4), 1.0, -1.0)
    data = {"dense": X, "csr": sp.csr_matrix(X), "csc": sp.csc_matrix(X)}[layout]
    alpha = 0.05 * Problem(X, y, "logistic", L1(150), 1.0, fit_intercept).lam_max()
    est = asyncopt.SparseLogisticRegression(alpha=alpha, fit_intercept=fit_intercept,
                                            tol=1e-10, method=method,
                                            max_epochs=1000).fit(data, y)
    theirs = peer_logistic_objective(X, y, alpha, fit_intercept)
    ours = logistic_objective(X, y, est.coef_.ravel(), float(np.ravel(est.intercept_)[0]),
                              alpha)
    assert abs(ours - theirs) <= 1e-6 * theirs
    assert ours - theirs <= est.dual_gap_ + 1e-9 * theirs
    assert np.count_nonzero(est.coef_) > 0


def test_prox_newton_steps_never_raise_the_subproblems_objective():
    """prox_newton_working_set run for 1, 2, ..., 12 steps from one start: n P falls with
    every step count, and the margins it keeps are A_ws w + b."""
    X, t = correlated_data(n=60, p=80, seed=11, density=0.6)
    y = np.where(t > np.median(t), 1.0, -1.0)
    active = Problem(sp.csr_matrix(X), y, "logistic", L1(80), 1.0, True).full_active_set()
    indptr, rows, data = column_major(active)
    csc = sp.csc_matrix((data, rows, indptr), shape=X.shape)
    cols = np.arange(0, 80, 2, dtype=np.int64)
    sq = np.asarray(csc.multiply(csc).sum(axis=0)).ravel()[cols]
    n_lam = 0.02 * np.max(np.abs(csc.T @ active.y)) / 2
    weights = np.ones(cols.shape[0])
    values = []
    for steps in range(1, 13):
        w, z = np.zeros(cols.shape[0]), np.zeros(60)
        b, done, _, _ = prox_newton_working_set(indptr, rows, data, cols, w, z, 0.0,
                                                active.y, UNWEIGHTED, 1, n_lam, weights,
                                                False, 0.0, sq,
                                                0.25, True, 0.0, steps, 20)
        np.testing.assert_allclose(z, csc[:, cols] @ w + b, atol=1e-10)
        values.append(np.sum(np.logaddexp(0.0, -active.y * z)) + n_lam * np.abs(w).sum())
    assert all(later <= earlier + 1e-12 for earlier, later in zip(values, values[1:]))
    assert values[-1] < values[0]


def test_prox_newton_steps_bring_back_a_coefficient_whose_rows_are_flat():
    """A feature in one row only, its coefficient so large that the row's margin is 800
    (f'' = 0 in floating point there: the quadratic model is flat along it). The first
    direction moves no margin by more than TRUST_MARGIN through one coordinate (the
    trust region), n P falls with every step count, and within 20 steps (the region
    doubling after each full step) the subproblem is solved: its n P is that of 200
    steps, and the coefficient is where that run leaves it."""
    X, t = correlated_data(n=60, p=80, seed=5, density=0.6)
    y = np.where(t > np.median(t), 1.0, -1.0)
    X[:, 3] = 0.0
    X[7, 3] = 2.0                        # feature 3: row 7 alone
    active = Problem(sp.csr_matrix(X), y, "logistic", L1(80), 1.0, True).full_active_set()
    indptr, rows, data = column_major(active)
    csc = sp.csc_matrix((data, rows, indptr), shape=X.shape)
    cols = np.arange(0, 80, 3, dtype=np.int64)              # holds column 3
    sq = np.asarray(csc.multiply(csc).sum(axis=0)).ravel()[cols]
    top = np.asarray(abs(csc).max(axis=0).todense()).ravel()[cols]
    n_lam = 0.02 * np.max(np.abs(csc.T @ active.y))
    weights = np.ones(cols.shape[0])
    flat = int(np.flatnonzero(cols == 3)[0])
    start = np.zeros(cols.shape[0])
    start[flat] = 400.0 * active.y[csc[:, 3].nonzero()[0][0]]     # margin 800 there

    def run(steps):
        w = start.copy()
        z = csc[:, cols] @ w
        b, _, _, _ = prox_newton_working_set(indptr, rows, data, cols, w, z, 0.0,
                                             active.y, UNWEIGHTED, 1, n_lam, weights,
                                             False, 0.0, sq, 0.25, True, 0.0, steps, 20)
        np.testing.assert_allclose(z, csc[:, cols] @ w + b, atol=1e-8)
        return w, b, np.sum(np.logaddexp(0.0, -active.y * z)) + n_lam * np.abs(w).sum()

    w1, b1, _ = run(1)
    assert np.all(np.abs(w1 - start) * top <= TRUST_MARGIN * (1.0 + 1e-12))
    assert abs(b1) <= TRUST_MARGIN * (1.0 + 1e-12)
    values = [run(steps) for steps in (1, 5, 20, 200)]
    assert all(later[2] <= earlier[2] for earlier, later in zip(values, values[1:]))
    assert values[2][2] <= values[3][2] * (1.0 + 1e-8)
    assert abs(values[2][0][flat] - values[3][0][flat]) <= 1e-6 * 400.0


@pytest.mark.filterwarnings("ignore:'@' is faster")      # inside skglm's solver
@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_l1_logistic_newton_steps_on_the_hessian_reach_the_peers_objective(
        layout, fit_intercept, monkeypatch):
    """On tall data the serial working-set step goes on with directions from the
    Hessian on W (``gram_newton_finish``, checked to run); the fit reaches skglm's
    objective (celer's without intercept) and its gap bounds the distance to it."""
    from asyncopt.solvers import working_set as module
    calls = []
    finish = module.gram_newton_finish
    monkeypatch.setattr(module, "gram_newton_finish",
                        lambda *args: calls.append(1) or finish(*args))
    X, t = tall_correlated_data(n=2000, p=40, seed=3 + fit_intercept)
    y = np.where(t > np.quantile(t, 0.4), 1.0, -1.0)
    data = sp.csr_matrix(X) if layout == "csr" else X
    alpha = 0.01 * Problem(X, y, "logistic", L1(40), 1.0, fit_intercept).lam_max()
    est = asyncopt.SparseLogisticRegression(alpha=alpha, fit_intercept=fit_intercept,
                                            tol=1e-10, method="working_set",
                                            max_epochs=1000).fit(data, y)
    assert sum(calls) > 0
    theirs = peer_logistic_objective(X, y, alpha, fit_intercept)
    ours = logistic_objective(X, y, est.coef_.ravel(), float(np.ravel(est.intercept_)[0]),
                              alpha)
    assert abs(ours - theirs) <= 1e-6 * theirs
    assert ours - theirs <= est.dual_gap_ + 1e-9 * theirs


def test_l1_logistic_sets_beyond_the_hessians_bound_stay_on_the_columns(monkeypatch):
    """Working sets of more than MAX_GRAM features take every Newton direction from the
    columns and reach the peer's objective."""
    from asyncopt.solvers import working_set as module
    calls = []
    monkeypatch.setattr(module, "MAX_GRAM", 4)
    monkeypatch.setattr(module, "gram_newton_finish", lambda *args: calls.append(1))
    X, t = tall_correlated_data(n=600, p=30, seed=4)
    y = np.where(t > np.median(t), 1.0, -1.0)
    alpha = 0.01 * Problem(X, y, "logistic", L1(30), 1.0, True).lam_max()
    est = asyncopt.SparseLogisticRegression(alpha=alpha, tol=1e-10, method="working_set",
                                            max_epochs=1000).fit(X, y)
    assert not calls
    theirs = peer_logistic_objective(X, y, alpha, True)
    ours = logistic_objective(X, y, est.coef_.ravel(), float(np.ravel(est.intercept_)[0]),
                              alpha)
    assert abs(ours - theirs) <= 1e-6 * theirs


def test_newton_steps_on_the_hessian_never_raise_the_subproblems_objective():
    """``gram_newton_finish`` run for 1, 2, ..., 8 steps from one start: n P on W falls
    with every step count, the margins it keeps are A_W w + b, and where it stops
    early the subproblem's gap is at most its tolerance."""
    from asyncopt.solvers.working_set import ColumnStore, WorkingRows, gram_newton_finish
    X, t = tall_correlated_data(n=500, p=30, seed=8)
    y = np.where(t > np.median(t), 1.0, -1.0)
    prob = Problem(X, y, "logistic", L1(30), 1.0, True)
    prob = prob.with_lam(0.02 * prob.lam_max())
    active = prob.full_active_set()
    ws = np.arange(0, 30, 2)
    n_lam = prob.n_samples * prob.lam
    values = []
    for steps in range(1, 9):
        w, z = np.zeros(ws.shape[0]), np.zeros(500)
        store = ColumnStore(30)
        rows = WorkingRows(store, store.columns(active, ws, lambda: ws), active)
        b, done, _ = gram_newton_finish(active, rows, z, ws, w, 0.0, 1e-9, steps, float(
            np.sum(active.column_counts[ws])), 1)
        move = np.zeros(30)
        move[ws] = w
        np.testing.assert_allclose(z, active.margins(move, b), atol=1e-10)
        values.append(np.sum(np.logaddexp(0.0, -active.y * z)) + n_lam * np.abs(w).sum())
        assert done <= steps
    assert all(later <= earlier + 1e-12 for earlier, later in zip(values, values[1:]))
    assert values[-1] < values[0]


def test_other_problems_are_refused_in_one_line():
    """The group logistic model: refused by "working_set", solved by "auto" with the
    prox-SVRG epoch alone (no record has a working set)."""
    X, y = correlated_data()
    labels = np.sign(y - np.median(y))
    with pytest.raises(ValueError, match="working_set"):
        asyncopt.SparseLogisticRegression(alpha=0.01, groups=5, method="working_set").fit(
            X, labels)
    est = asyncopt.SparseLogisticRegression(alpha=0.01, groups=5, method="auto",
                                            tol=1e-8, max_epochs=500).fit(X, labels)
    assert est.dual_gap_ <= 1e-8 * est.history_[0]["primal"]
    assert all(record["working_set"] is None for record in est.history_)


@pytest.mark.parametrize("method", ["working_set", "auto"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_group_lasso_reaches_celers_objective(fit_intercept, layout, method):
    """Block coordinate descent on a working set of groups: celer's GroupLasso objective
    (tol 1e-12) to 1e-6 relative, groups of 5; the reported gap bounds the distance."""
    import celer
    X, y = correlated_data(n=70, p=150, seed=13)
    if not fit_intercept:
        y = y - y.mean()
    data = sp.csr_matrix(X) if layout == "csr" else X
    groups = 5
    from asyncopt.penalties import GroupL1
    alpha = 0.1 * Problem(X, y, "squared", GroupL1(150, groups), 1.0,
                          fit_intercept).lam_max()
    est = asyncopt.GroupLasso(alpha=alpha, groups=groups, fit_intercept=fit_intercept,
                              tol=1e-10, method=method, max_epochs=2000).fit(data, y)
    peer = celer.GroupLasso(groups=groups, alpha=alpha, tol=1e-12, max_iter=1000,
                            fit_intercept=fit_intercept, weights=np.sqrt(np.full(30, 5.0)))
    peer.fit(X, y)

    def objective(coef, b):
        r = y - X @ coef - b
        norms = np.linalg.norm(coef.reshape(30, 5), axis=1)
        return 0.5 * np.mean(r ** 2) + alpha * np.sqrt(5.0) * norms.sum()
    theirs = objective(peer.coef_, float(peer.intercept_))
    ours = objective(est.coef_, est.intercept_)
    assert abs(ours - theirs) <= 1e-6 * theirs
    assert ours - theirs <= est.dual_gap_ + 1e-9 * theirs
    assert np.count_nonzero(est.coef_) > 0


@pytest.mark.skipif(not (REAL / "dexter.svm.xz").exists(), reason="no shared real data")
def test_dexter_matches_sklearn():
    """Real text data, n << p (300 x 7,751), at 0.01 lam_max."""
    X, y = load_libsvm(str(REAL / "dexter.svm.xz"))
    alpha = 0.01 * Problem(X, y, "squared", L1(X.shape[1]), 1.0, True).lam_max()
    est = asyncopt.Lasso(alpha=alpha, tol=1e-9, method="working_set").fit(X, y)
    coef, b = sklearn_solution(X, y, alpha, True)
    Xd = X.toarray()
    theirs = objective(Xd, y, coef, b, alpha)
    assert abs(objective(Xd, y, est.coef_, est.intercept_, alpha) - theirs) <= 1e-6 * theirs


@pytest.mark.parametrize("k", [1, 2, 5])
def test_solve_spd_equals_numpy_and_refuses_what_is_not_positive_definite(k):
    rng = np.random.default_rng(k)
    a = rng.standard_normal((k, k + 3))
    gram = a @ a.T
    x = rng.standard_normal(k)
    solved = x.copy()
    assert _solve_spd(gram, solved)
    np.testing.assert_allclose(solved, np.linalg.solve(gram, x), rtol=1e-10, atol=1e-12)
    indefinite = gram - (np.linalg.eigvalsh(gram)[-1] + 1.0) * np.eye(k)
    kept = x.copy()
    assert not _solve_spd(indefinite, kept)
    np.testing.assert_array_equal(kept, x)


def test_extrapolate_is_andersons_combination_of_the_iterates():
    """The combination c (sum 1) minimising ||sum_t c_t (u_{t+1} - u_t)|| over the
    iterates u = (w, b), applied to the last K iterates of w, of the paired vector and of
    b: against a least-squares solve of the same problem by numpy."""
    rng = np.random.default_rng(0)
    keep, m, n = 6, 4, 7
    past_w, past_r, past_b = rng.standard_normal((keep, m)), \
        rng.standard_normal((keep, n)), rng.standard_normal(keep)
    out_w, out_r = np.empty(m), np.empty(n)
    b = _extrapolate(past_w, past_r, past_b, out_w, out_r)
    diffs = np.diff(np.column_stack([past_w, past_b]), axis=0)       # K x (m + 1)
    gram = diffs @ diffs.T
    c = np.linalg.solve(gram + 1e-10 * np.trace(gram) * np.eye(keep - 1),
                        np.ones(keep - 1))
    c /= c.sum()
    np.testing.assert_allclose(out_w, c @ past_w[1:], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(out_r, c @ past_r[1:], rtol=1e-8, atol=1e-10)
    assert b == pytest.approx(float(c @ past_b[1:]), rel=1e-8, abs=1e-10)
    singular = np.repeat(past_w[:1], keep, axis=0)          # no movement: singular
    assert np.isnan(_extrapolate(singular, past_r, np.zeros(keep), out_w, out_r))


@pytest.mark.parametrize("in_cache", [0, 1 << 20])
@pytest.mark.parametrize("path", [False, True])
def test_working_rows_are_the_active_rows_on_the_working_set(path, in_cache, monkeypatch):
    """``WorkingRows`` (the Hessian steps' rows, from the column store, or from the
    full set's columns on a path): A_W as CSR with column q W's q-th feature, rows in
    the active set's order, and its margins A_W x + b; the store forming the set's
    columns alone or every active column (``IN_CACHE``)."""
    from asyncopt.solvers import working_set as module
    from asyncopt.solvers.working_set import ColumnStore, WorkingRows
    monkeypatch.setattr(module, "IN_CACHE", in_cache)
    X, t = tall_correlated_data(n=300, p=25, seed=11)
    y = np.where(t > np.median(t), 1.0, -1.0)
    prob = Problem(sp.csr_matrix(X * (np.abs(X) > 0.8)), y, "logistic", L1(25), 0.01, True)
    if path:
        prob.full_columns()
    active, _, _ = prob.full_active_set().compact(np.arange(25) % 3 != 0, np.zeros(25))
    ws = np.array([5, 1, 9, 12])
    store = ColumnStore(25)
    rows = WorkingRows(store, store.columns(active, active.features[ws], lambda: ws),
                       active)
    dense = sp.csr_matrix((active.data, active.indices, active.indptr),
                          shape=(300, active.n_features)).toarray()[:, ws]
    got = sp.csr_matrix((rows.data, rows.indices, rows.indptr), shape=(300, 4)).toarray()
    np.testing.assert_array_equal(got, dense)
    x = np.array([0.5, -1.0, 2.0, 0.25])
    np.testing.assert_allclose(rows.margins(x, 0.3), dense @ x + 0.3, rtol=0, atol=1e-14)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_a_column_store_of_the_sets_columns_alone_reaches_the_same_solution(loss,
                                                                           monkeypatch):
    """With the column store forming each set's columns (and the next sets') rather
    than every active column (``IN_CACHE`` 0: data too large for the cache), the
    working-set solves reach the same objective, to 1e-9 relative, as with every
    column formed at once."""
    from asyncopt.solvers import working_set as module
    X, t = correlated_data(n=80, p=150, seed=12)
    y = t if loss == "squared" else np.where(t > np.median(t), 1.0, -1.0)
    model = asyncopt.Lasso if loss == "squared" else asyncopt.SparseLogisticRegression
    alpha = 0.02 * Problem(X, y, loss, L1(150), 1.0, True).lam_max()
    objectives = []
    for in_cache in (1 << 20, 0):
        monkeypatch.setattr(module, "IN_CACHE", in_cache)
        est = model(alpha=alpha, tol=1e-10, method="working_set",
                    max_epochs=1000).fit(sp.csr_matrix(X), y)
        prob = Problem(X, y, loss, L1(150), alpha, True)
        objectives.append(prob.objective(est.coef_.ravel(),
                                         float(np.ravel(est.intercept_)[0])))
    assert abs(objectives[0] - objectives[1]) <= 1e-9 * objectives[0]


def test_lasso_working_sets_stay_within_the_gram_bound_while_the_support_does(
        monkeypatch):
    """With MAX_GRAM at 13 (12 features and the intercept): every Lasso working set
    taken from a support of at most 12 features holds at most 12 (its violators stop at
    the bound), and the fit still reaches scikit-learn's objective."""
    from asyncopt.solvers import working_set as module
    monkeypatch.setattr(module, "MAX_GRAM", 13)
    X, y = tall_correlated_data(n=800, p=40, seed=12)
    alpha = 0.002 * Problem(X, y, "squared", L1(40), 1.0, True).lam_max()
    est = asyncopt.Lasso(alpha=alpha, tol=1e-10, method="working_set",
                         max_epochs=1000).fit(X, y)
    records = est.history_
    sizes = [(before["coef_nnz"], record["working_set"])
             for before, record in zip(records, records[1:]) if record["working_set"]]
    assert all(size <= 12 for nnz, size in sizes if nnz <= 12)
    assert any(size == 12 for nnz, size in sizes if nnz <= 12)     # the bound binds
    coef, b = sklearn_solution(X, y, alpha, True)
    ours = objective(X, y, est.coef_, float(est.intercept_), alpha)
    assert abs(ours - objective(X, y, coef, b, alpha)) <= 1e-6 * ours
