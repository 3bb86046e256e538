"""The paper's baselines (ProxASAGA, ProxASVRG, PSE-Safe, PSE-Strong, DDSS-Naive) on the
serial and threads backends: same optima as the DDSS reference, PSE's screening safe or
repaired by its KKT check, the coordinate descent kernel monotone."""
import functools

import numpy as np
import pytest
import scipy.sparse as sp

from asyncopt import GroupLasso, Lasso, SparseLogisticRegression, lam_max
from asyncopt.kernels.cd import cd_epoch
from asyncopt.losses import UNWEIGHTED
from asyncopt.penalties import GroupL1
from asyncopt.problem import Problem
from asyncopt.solvers import solve_pse
from asyncopt.solvers.pse import column_major, coordinate_steps, kkt_violators, static_keep

MODELS = ["lasso", "logistic", "group", "group_logistic"]
CLASSES = {"lasso": Lasso, "group": GroupLasso, "logistic": SparseLogisticRegression,
           "group_logistic": SparseLogisticRegression}


def _data(seed, fmt, loss, n=300, p=120):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.2)
    w = np.r_[rng.standard_normal(min(10, p)), np.zeros(max(p - 10, 0))]
    y = X @ w + 0.1 * rng.standard_normal(n)
    if loss == "logistic":
        y = np.where(y > 0, 1, 0)
    return (sp.csr_matrix(X) if fmt == "csr" else X), y


def _setup(model, fmt, seed=3):
    """(X, y, estimator kwargs, the Problem to evaluate objectives on)."""
    loss = "logistic" if "logistic" in model else "squared"
    X, y = _data(seed, fmt, loss)
    groups = 4 if "group" in model else None
    penalty = None if groups is None else GroupL1(X.shape[1], groups)
    alpha = 0.05 * lam_max(X, y, loss=loss, penalty=penalty)
    kw = dict(alpha=alpha, random_state=0)
    if groups is not None:
        kw["groups"] = groups
    y_fit = y if loss == "squared" else np.where(y == 1, 1.0, -1.0)
    return X, y, kw, Problem(X, y_fit, loss, penalty, alpha, True)


def _objective(problem, est):
    return problem.objective(np.ravel(est.coef_), float(np.ravel(est.intercept_)[0]))


@functools.lru_cache(maxsize=None)
def _reference(model, fmt):
    """P* from serial DDSS at a 1e-11 relative gap."""
    X, y, kw, problem = _setup(model, fmt)
    return _objective(problem, CLASSES[model](tol=1e-11, max_epochs=10000, **kw).fit(X, y))


@pytest.mark.parametrize("model,fmt", [("lasso", "dense"), ("lasso", "csr"),
                                       ("logistic", "dense"), ("group", "csr"),
                                       ("group_logistic", "csr")])
@pytest.mark.parametrize("method", ["prox_asaga", "prox_asvrg", "pse_safe", "pse_strong"])
def test_every_baseline_on_threads_reaches_the_serial_objective(method, model, fmt):
    X, y, kw, problem = _setup(model, fmt)
    est = CLASSES[model](method=method, backend="threads", n_jobs=2, kernel="numba",
                         tol=1e-8, max_epochs=5000, **kw).fit(X, y)
    p_ref = _reference(model, fmt)
    assert abs(_objective(problem, est) - p_ref) <= 1e-6 * abs(p_ref)
    assert est.dual_gap_ <= 1e-8 * problem.null_objective()
    if method in ("prox_asaga", "prox_asvrg"):
        assert all(h["n_active"] == X.shape[1] for h in est.history_)   # never screens


@pytest.mark.parametrize("method", ["prox_asaga", "prox_asvrg", "pse_safe", "pse_strong"])
def test_baselines_on_the_serial_backend(method):
    X, y, kw, problem = _setup("group", "csr")
    est = GroupLasso(method=method, tol=1e-8, max_epochs=5000, **kw).fit(X, y)
    p_ref = _reference("group", "csr")
    assert abs(_objective(problem, est) - p_ref) <= 1e-6 * abs(p_ref)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("model", MODELS)
def test_ddss_naive_on_threads_keeps_pace_with_serial(model):
    """DDSS-Naive (no variance reduction, decaying step) converges sublinearly, so the
    threads run is measured in serial epochs: after 200 epochs it is at least as close to
    P* as the serial run after 140, i.e. asynchrony costs it at most 30% of its epochs
    (a kernel losing half its updates sits at the serial 100-epoch level, 1.1-1.8x above
    the 140-epoch one here). CI's 2 loaded cores put it 14% above serial-200 once, 15%
    below the serial-140 bound."""
    X, y, kw, problem = _setup(model, "csr")
    p_ref = _reference(model, "csr")
    cls = CLASSES[model]
    kw = dict(kw, method="ddss_naive", tol=1e-12)
    serial_140 = _objective(problem, cls(max_epochs=140, **kw).fit(X, y)) - p_ref
    serial_200 = _objective(problem, cls(max_epochs=200, **kw).fit(X, y)) - p_ref
    threads = _objective(problem, cls(backend="threads", n_jobs=2, kernel="numba",
                                      max_epochs=200, **kw).fit(X, y)) - p_ref
    assert 0 < serial_200 < serial_140 < 0.5 * (problem.null_objective() - p_ref)
    assert 0 < threads <= serial_140


def strong_rule_trap(loss, n=60, seed=0):
    """Data on which the strong rule at lam = 0.6 lam_max discards a feature of the
    solution: feature 1 is orthogonal to the residual at x = 0 (correlation 0) but six
    times feature 0, which enters first, so its correlation grows six times faster than
    lam falls (the strong rule assumes at most once)."""
    rng = np.random.default_rng(seed)
    t = rng.standard_normal(n)
    y = t - t.mean() if loss == "squared" else np.where(t > 0, 1.0, -1.0)
    target = y - y.mean()
    a0 = target + 0.8 * rng.standard_normal(n)
    X = np.c_[a0, 6.0 * a0 + rng.standard_normal(n), rng.standard_normal((n, 8))]
    X -= X.mean(0)
    X[:, 1] -= (X[:, 1] @ target) / (target @ target) * target
    return X, y


@pytest.mark.parametrize("backend", ["serial", "threads"])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_pse_strong_repairs_what_the_strong_rule_discards(loss, backend):
    X, y = strong_rule_trap(loss)
    problem = Problem(X, y, loss, None, 1.0, True)
    problem = problem.with_lam(0.6 * problem.lam_max())
    cls = Lasso if loss == "squared" else SparseLogisticRegression
    ref = cls(alpha=problem.lam, tol=1e-12, max_epochs=20000).fit(X, y)
    support = np.flatnonzero(ref.coef_.ravel())
    full = problem.full_active_set()
    keep = static_keep("strong", full, full.certificate(np.zeros(X.shape[1]), 0.0))
    discarded = np.setdiff1d(support, full.features[keep])
    assert discarded.size > 0                      # the trap works: the rule is wrong here

    est = cls(alpha=problem.lam, tol=1e-10, max_epochs=20000, method="pse_strong",
              backend=backend, n_jobs=2, kernel="numba").fit(X, y)
    assert est.history_[-1]["kkt_readded"] >= discarded.size
    assert np.all(est.coef_.ravel()[discarded] != 0)
    cert = problem.certificate(est.coef_.ravel(), float(np.ravel(est.intercept_)[0]))
    # KKT on every feature, screened or not: |a_j^T rho| / n <= lam (up to the gap)
    assert np.max(np.abs(cert.correlation)) / problem.n_samples <= problem.lam * (1 + 1e-4)
    assert cert.gap <= 1e-9 * problem.null_objective()
    assert est.objective_ == pytest.approx(ref.objective_, rel=1e-8)


def test_kkt_violators_are_exactly_the_discarded_support():
    X, y = strong_rule_trap("squared")
    problem = Problem(X, y, "squared", None, 1.0, True)
    problem = problem.with_lam(0.6 * problem.lam_max())
    full = problem.full_active_set()
    keep = static_keep("strong", full, full.certificate(np.zeros(X.shape[1]), 0.0))
    active, x, _ = full.compact(keep, np.zeros(full.n_features))
    restricted = solve_pse(Problem(X[:, full.features[keep]], y, "squared", None,
                                   problem.lam, True), "safe", tol=1e-12, max_epochs=5000)
    cert = active.certificate(restricted.coef, restricted.intercept)
    violators = kkt_violators(full, keep, cert.rho, cert.dual_scale)
    assert np.array_equal(full.features[violators], [1])


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("groups", [None, 3])
def test_pse_safe_static_screen_never_removes_the_support(loss, groups):
    """The static sphere at x = 0 keeps every block of a high-accuracy solution's support,
    and (non-vacuous) removes blocks for lam close to lam_max."""
    removed = 0
    for seed in range(12):
        X, y = _data(100 + seed, "csr", loss, n=120, p=60)
        yy = y if loss == "squared" else np.where(y == 1, 1.0, -1.0)
        penalty = None if groups is None else GroupL1(X.shape[1], groups)
        problem = Problem(X, yy, loss, penalty, 1.0, True)
        problem = problem.with_lam((0.3 + 0.05 * seed) * problem.lam_max())
        full = problem.full_active_set()
        keep = static_keep("safe", full, full.certificate(np.zeros(X.shape[1]), 0.0))
        ref = solve_pse(problem, "strong", tol=1e-12, max_epochs=50000)
        assert ref.converged
        support_blocks = np.unique(problem.penalty.feature_blocks()[np.flatnonzero(ref.coef)])
        assert np.all(keep[support_blocks])
        removed += int((~keep).sum())
        pse = solve_pse(problem, "safe", tol=1e-10, max_epochs=50000)
        assert pse.primal == pytest.approx(ref.primal, rel=1e-8)
    assert removed > 0


@pytest.mark.parametrize("code", [0, 1])
@pytest.mark.parametrize("groups", [None, 4])
def test_coordinate_descent_epoch_never_increases_the_objective(code, groups):
    """Serial block CD with step 1/L_g (L_g >= the block's Lipschitz constant) is a
    descent method: every epoch lowers P."""
    loss = "logistic" if code else "squared"
    X, y = _data(9, "csr", loss)
    yy = y if loss == "squared" else np.where(y == 1, 1.0, -1.0)
    penalty = None if groups is None else GroupL1(X.shape[1], groups)
    problem = Problem(X, yy, loss, penalty, 0.02 * lam_max(X, y, loss=loss, penalty=penalty),
                      False)
    active = problem.full_active_set()
    columns = column_major(active)
    lipschitz = problem.loss.lipschitz * np.add.reduceat(
        active.column_sq_norms, active.block_indptr[:-1]) / problem.n_samples
    x = np.random.default_rng(0).standard_normal(active.n_features)
    z = active.margins(x, 0.0)
    values = [problem.objective(active.expand(x))]
    for epoch in range(5):
        order = np.random.default_rng(epoch).permutation(len(active.blocks))
        cd_epoch(*columns, active.y, code, UNWEIGHTED, x, z, np.zeros(1),
                 np.zeros(active.n_features), order, active.block_indptr, lipschitz,
                 problem.lam * active.weights, False)
        np.testing.assert_allclose(z, active.margins(x, 0.0), atol=1e-10)
        values.append(problem.objective(active.expand(x)))
    assert np.all(np.diff(values) < 0)


def test_profiled_intercept_coordinate_descent_is_exact_and_monotone():
    """With the squared loss and an intercept, CD on the centred columns keeps
    b = mean(y - A x) (the intercept's optimum) after every update and lowers
    min_b P(x, b) every epoch."""
    X, y = _data(9, "csr", "squared")
    X = X + sp.csr_matrix((np.full(X.shape[0], 3.0), (np.arange(X.shape[0]),
                                                       np.zeros(X.shape[0], int))),
                          shape=X.shape)       # a column with a large mean
    problem = Problem(X, y + 5.0, "squared", None, 0.02 * lam_max(X, y), True)
    active = problem.full_active_set()
    columns = column_major(active)
    means, lipschitz = coordinate_steps(active, columns)
    np.testing.assert_allclose(means, np.asarray(X.mean(axis=0)).ravel()[active.features])
    x = np.zeros(active.n_features)
    z = active.margins(x, 0.0)
    intercept = np.array([np.mean(active.y)])
    values = [problem.objective(active.expand(x), intercept[0])]
    for epoch in range(5):
        order = np.random.default_rng(epoch).permutation(len(active.blocks))
        cd_epoch(*columns, active.y, 0, UNWEIGHTED, x, z, intercept, means, order,
                 active.block_indptr, lipschitz, problem.lam * active.weights, False)
        assert intercept[0] == pytest.approx(np.mean(active.y - z), abs=1e-10)
        values.append(problem.objective(active.expand(x), intercept[0]))
    assert np.all(np.diff(values) < 0)


def test_lasso_coordinate_step_is_the_exact_coordinate_minimizer():
    """For the squared loss and L1 one CD update solves min over x_j exactly."""
    X, y = _data(4, "csr", "squared", n=50, p=6)
    problem = Problem(X, y, "squared", None, 0.05, False)
    active = problem.full_active_set()
    x = np.random.default_rng(1).standard_normal(6)
    z = active.margins(x, 0.0)
    lipschitz = active.column_sq_norms / problem.n_samples
    before = x.copy()
    cd_epoch(*column_major(active), active.y, 0, UNWEIGHTED, x, z, np.zeros(1), np.zeros(6),
             np.array([2]), active.block_indptr, lipschitz, np.full(6, problem.lam), False)
    grid = x[2] + np.linspace(-1e-3, 1e-3, 201)
    values = [problem.objective(active.expand(np.r_[x[:2], v, x[3:]])) for v in grid]
    assert np.argmin(values) == 100
    np.testing.assert_array_equal(np.delete(x, 2), np.delete(before, 2))


def test_pse_above_lam_max_returns_zero_and_refuses_checkpoints(tmp_path):
    X, y = _data(5, "csr", "squared")
    top = lam_max(X, y)
    for method in ("pse_safe", "pse_strong"):
        est = Lasso(alpha=1.01 * top, method=method).fit(X, y)
        assert not np.any(est.coef_) and est.active_set_.size == 0
        with pytest.raises(ValueError, match="does not write checkpoints"):
            Lasso(alpha=0.1 * top, method=method,
                  checkpoint=str(tmp_path / "c.npz")).fit(X, y)
