"""``positive=True``: the L1 penalty plus the constraint x >= 0 (scikit-learn's
``Lasso(positive=True)``; issue 48).

The maths checked, against references that do not share the library's code: the prox
max(u - t w, 0), the one-sided dual constraint A_j^T theta <= n lam w_j (so the gap is a
true certificate), the one-sided lam_max, the one-sided gap-safe test (safe on 120 random
problems), and every front end: the estimators on every method and on threads, the CV
estimators, lasso_path, the command lines, and mpirun.
"""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp
import scipy.special
from hypothesis import given
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso as SkLasso

from asyncopt import (GroupLasso, Lasso, LassoCV, Problem, SparseLogisticRegression,
                      SparseLogisticRegressionCV, lam_max, lasso_path)
from asyncopt.kernels import native
from asyncopt.kernels.svrg import svrg_epoch_l1_tracked
from asyncopt.kernels.workspace import Blocks, Clock, Rows, SvrgStep
from asyncopt.penalties import L1, prox_l1
from asyncopt.screening import BestDual, screen_active_set
from asyncopt.solvers import solve_ddss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
SHARDS = os.path.join(os.path.dirname(__file__), "mpi", "solve_shards.py")
RATIOS = (0.5, 0.05, 0.005)          # alpha / (one-sided) lam_max
METHODS = ("auto", "ddss", "working_set")


def mixed_data(seed, n=100, p=40, fmt="dense", loss="squared"):
    """(X, y) whose ground truth has coefficients of both signs, so that the constraint
    binds: the unconstrained solutions have negative coefficients."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    if fmt == "csr":
        X = X * (rng.random((n, p)) < 0.4)
    w = np.zeros(p)
    w[:8] = [2.0, -3.0, 1.5, -1.0, 0.7, -2.5, 1.0, -0.5]
    score = X @ w + 0.3 + 0.1 * rng.standard_normal(n)
    y = np.where(score > 0, 1.0, -1.0) if loss == "logistic" else score
    return (sp.csr_matrix(X) if fmt == "csr" else X), y


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def lasso_objective(X, y, alpha, coef, intercept):
    """(1/2n) ||y - X w - b||^2 + alpha sum_j w_j, +inf where some w_j < 0."""
    if np.any(coef < 0):
        return np.inf
    r = y - dense(X) @ coef - intercept
    return 0.5 * float(r @ r) / y.shape[0] + alpha * float(np.sum(coef))


def logistic_objective(X, y, alpha, coef, intercept):
    """mean log(1 + exp(-y (X w + b))) + alpha sum_j w_j, +inf where some w_j < 0."""
    if np.any(coef < 0):
        return np.inf
    z = dense(X) @ coef + intercept
    return float(np.mean(np.logaddexp(0.0, -y * z))) + alpha * float(np.sum(coef))


def one_sided_lam_max(X, y, fit_intercept):
    """max(0, max_j X_j^T (y - ybar)) / n, the Lasso's one-sided lam_max."""
    r = y - (y.mean() if fit_intercept else 0.0)
    return max(0.0, float(np.max(dense(X).T @ r))) / y.shape[0]


def independent_certificate(ref, X, y, loss, lam, fit_intercept, x, weights=None):
    """(P, D, intercept, rho) at x from NumPy alone (docs/design.md §1, one-sided):
    b refitted, rho = -f'(X x + b), theta = rho / max(1, max_j X_j^T rho / (n lam w_j)),
    D = -(1/n) sum_i f*(-theta_i)."""
    A = dense(X)
    n, p = A.shape
    weights = np.ones(p) if weights is None else weights
    z0 = A @ x
    b = ref.optimal_intercept(loss, z0, y) if fit_intercept else 0.0
    rho = -ref.loss_derivatives(loss, z0 + b, y)
    scale = max(1.0, float(np.max(A.T @ rho / weights)) / (n * lam))
    theta = rho / scale
    primal = np.inf if np.any(x < 0) else \
        float(np.mean(ref.loss_values(loss, z0 + b, y)) + lam * weights @ x)
    return primal, ref.dual(loss, y, theta), b, rho


# -- the prox and the kernels ---------------------------------------------------------

@given(u=st.floats(-1e3, 1e3), t=st.floats(0.0, 1e3))
def test_prox_l1_minimises_its_objective_on_the_half_line(u, t):
    """prox_l1(u, t, True) = argmin_{v >= 0} (v - u)^2 / 2 + t v = max(u - t, 0), and
    prox_l1(u, t, False) the soft threshold sign(u) max(|u| - t, 0)."""
    v = prox_l1(u, t, True)
    assert v == max(u - t, 0.0)
    grid = v + np.linspace(-1.0, 1.0, 201)
    grid = grid[grid >= 0.0]
    values = 0.5 * (grid - u) ** 2 + t * grid
    assert 0.5 * (v - u) ** 2 + t * v <= values.min() + 1e-9 * (1.0 + abs(u) ** 2)
    assert prox_l1(u, t, False) == pytest.approx(math.copysign(max(abs(u) - t, 0.0), u),
                                                 abs=1e-12)


def _epoch_arguments(positive, seed=0, n=60, p=20, l2=0.0):
    """(rows, blocks, step, samples) of a prox-SVRG epoch on a random sparse problem,
    the blocks' ``positive`` and ``l2`` as given."""
    rng = np.random.default_rng(seed)
    A = sp.random(n, p, density=0.3, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal)
    y = rng.standard_normal(n)
    z_snap = np.zeros(n)
    weighted_mu = A.T @ (z_snap - y) / n * 3.0
    rows = Rows(A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data, y, 0)
    blocks = Blocks(np.arange(p + 1, dtype=np.int64), np.arange(p, dtype=np.int64),
                    positive, l2)
    step = SvrgStep(z_snap, weighted_mu, float(np.mean(-y)), np.full(p, 1e-3), 0.05, 0.02)
    return rows, blocks, step, rng.permutation(np.repeat(np.arange(n), 3)).astype(np.int64)


def test_the_epoch_kernels_keep_x_nonnegative_and_the_native_one_is_bit_identical():
    """A prox-SVRG epoch from x >= 0 with steps that push coordinates below zero: with
    ``Blocks.positive`` every coordinate stays >= 0 (without it some go negative), and
    the C kernel on one thread gives the numba kernel's x bit for bit."""
    for positive in (False, True):
        rows, blocks, step, samples = _epoch_arguments(positive)
        x, b = np.full(20, 0.01), np.zeros(1)
        svrg_epoch_l1_tracked(rows, blocks, step, x, b, samples, Clock.fresh())
        assert (x.min() >= 0.0) == positive
        if native.available():
            x_c, b_c = np.full(20, 0.01), np.zeros(1)
            native.native_epoch_l1(rows, blocks, step, x_c, b_c, samples, Clock.fresh())
            np.testing.assert_array_equal(x_c, x)
            assert b_c[0] == b[0]


def test_the_server_clips_summed_deltas_at_zero():
    """Dis-DDSS's server adds the workers' deltas; with ``positive`` a sum below zero
    lands on zero, from any start (a coordinate at zero, one at 0.5)."""
    from asyncopt.comm.messages import add_weighted_delta
    from asyncopt.solvers.mpi.inner import HEADER
    for positive in (False, True):
        x = np.array([0.0, 0.5, 0.5])
        values = np.concatenate((np.zeros(HEADER), [-0.3, -0.2, -0.9]))
        add_weighted_delta(x, np.zeros(3, dtype=np.int64), np.arange(3, dtype=np.int32),
                           values, HEADER, 1.0, np.ones(3), 1, 0, None, None, None,
                           positive)
        np.testing.assert_allclose(x, [0.0, 0.3, 0.0] if positive else [-0.3, 0.3, -0.4])


def test_the_penalty_value_prox_and_dual_norm_are_one_sided():
    pen = L1(4, [1.0, 2.0, 1.0, 0.5], positive=True)
    assert pen.value(np.array([1.0, 0.0, 2.0, 4.0])) == 5.0
    assert pen.value(np.array([1.0, -1e-300, 0.0, 0.0])) == np.inf
    np.testing.assert_array_equal(pen.prox(np.array([3.0, -3.0, 0.5, 1.0]), 1.0),
                                  [2.0, 0.0, 0.0, 0.5])
    u = np.array([-5.0, 1.0, 0.5, -0.1])
    assert pen.dual_norm(u) == 0.5                         # max(0, max_j u_j / w_j)
    assert pen.dual_norm(-np.abs(u)) == 0.0
    assert L1(4, [1.0, 2.0, 1.0, 0.5]).dual_norm(u) == 5.0  # two-sided: max |u_j| / w_j
    assert pen.restricted(np.array([1, 3])).positive
    np.testing.assert_array_equal(pen.projection(u), [0.0, 1.0, 0.5, 0.0])


# -- the Lasso against scikit-learn ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_lasso_reaches_sklearns_positive_objective(fmt, fit_intercept):
    """Every method (auto, ddss, working_set) at alpha = 0.5, 0.05, 0.005 lam_max:
    scikit-learn's Lasso(positive=True) objective to 1e-6, coef >= 0, a converged gap;
    and the constraint binds (the unconstrained Lasso has negative coefficients and a
    lower objective)."""
    X, y = mixed_data(1, fmt=fmt)
    top = lam_max(X, y, fit_intercept=fit_intercept, penalty=L1(X.shape[1], positive=True))
    assert top == pytest.approx(one_sided_lam_max(X, y, fit_intercept), rel=1e-12)
    for ratio in RATIOS:
        alpha = ratio * top
        sk = SkLasso(alpha=alpha, positive=True, fit_intercept=fit_intercept, tol=1e-14,
                     max_iter=1_000_000).fit(dense(X), y)
        best = lasso_objective(X, y, alpha, sk.coef_, sk.intercept_)
        for method in METHODS:
            model = Lasso(alpha=alpha, positive=True, fit_intercept=fit_intercept,
                          method=method, tol=1e-10, max_epochs=5000,
                          random_state=0).fit(X, y)
            where = f"{method} alpha={ratio} lam_max"
            assert model.coef_.min() >= 0.0, where
            assert np.count_nonzero(model.coef_) > 0, where
            value = lasso_objective(X, y, alpha, model.coef_, model.intercept_)
            assert abs(value - best) <= 1e-6 * best, where
            assert model.dual_gap_ <= 1e-10 * model.history_[0]["primal"], where
        free = Lasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-10).fit(X, y)
        assert free.coef_.min() < 0.0
        assert 0.5 * np.mean((y - dense(X) @ free.coef_ - free.intercept_) ** 2) + \
            alpha * np.abs(free.coef_).sum() < best * (1 - 1e-6)


@pytest.mark.parametrize("kernel", ["numba", "native"])
def test_lasso_on_two_threads_reaches_sklearns_positive_objective(kernel):
    if kernel == "native" and not native.available():
        pytest.skip(f"native kernel not built: {native.LOAD_ERROR}")
    X, y = mixed_data(2, n=300, p=30, fmt="csr")
    alpha = 0.02 * one_sided_lam_max(X, y, True)
    sk = SkLasso(alpha=alpha, positive=True, tol=1e-14, max_iter=1_000_000).fit(dense(X),
                                                                                 y)
    best = lasso_objective(X, y, alpha, sk.coef_, sk.intercept_)
    for method in ("ddss", "auto"):
        model = Lasso(alpha=alpha, positive=True, backend="threads", n_jobs=2,
                      kernel=kernel, method=method, tol=1e-10, max_epochs=5000,
                      random_state=0).fit(X, y)
        assert model.coef_.min() >= 0.0
        assert abs(lasso_objective(X, y, alpha, model.coef_, model.intercept_) - best) \
            <= 1e-6 * best, method


@pytest.mark.parametrize("method", ["ddss_naive", "prox_asaga", "prox_asvrg", "pse_safe",
                                    "pse_strong"])
def test_the_other_methods_keep_coef_nonnegative(method):
    """The baselines and DDSS-Naive run the same prox: coef >= 0, and the PSE methods
    (block coordinate descent to the gap) reach scikit-learn's objective."""
    X, y = mixed_data(3, n=120, p=25)
    alpha = 0.05 * one_sided_lam_max(X, y, True)
    sk = SkLasso(alpha=alpha, positive=True, tol=1e-14, max_iter=1_000_000).fit(X, y)
    best = lasso_objective(X, y, alpha, sk.coef_, sk.intercept_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = Lasso(alpha=alpha, positive=True, method=method, tol=1e-9,
                      max_epochs=300, random_state=0).fit(X, y)
    assert model.coef_.min() >= 0.0
    value = lasso_objective(X, y, alpha, model.coef_, model.intercept_)
    assert value - best <= (1e-6 if method.startswith("pse") else 1e-2) * best


def test_a_warm_start_from_negative_coefficients_is_projected():
    """A fit with positive=False leaves negative coefficients; switched to positive=True
    with warm_start, the next fit starts from max(coef, 0) and reaches the optimum."""
    X, y = mixed_data(4)
    alpha = 0.05 * one_sided_lam_max(X, y, True)
    model = Lasso(alpha=alpha, warm_start=True, tol=1e-10).fit(X, y)
    assert model.coef_.min() < 0.0
    model.set_params(positive=True).fit(X, y)
    sk = SkLasso(alpha=alpha, positive=True, tol=1e-14, max_iter=1_000_000).fit(X, y)
    assert model.coef_.min() >= 0.0
    assert lasso_objective(X, y, alpha, model.coef_, model.intercept_) == pytest.approx(
        lasso_objective(X, y, alpha, sk.coef_, sk.intercept_), rel=1e-6)


# -- L1 logistic regression against L-BFGS-B -------------------------------------------

def lbfgsb_logistic(X, y, alpha, fit_intercept):
    """min over w >= 0 (b free) of mean log(1 + exp(-y (X w + b))) + alpha sum_j w_j,
    smooth on the constraint set, by scipy's L-BFGS-B with bounds: (w, b, objective)."""
    A = dense(X)
    n, p = A.shape

    def fun(v):
        w, b = v[:p], (v[p] if fit_intercept else 0.0)
        z = A @ w + b
        value = np.mean(np.logaddexp(0.0, -y * z)) + alpha * np.sum(w)
        g = -y * scipy.special.expit(-y * z) / n
        grad = np.append(A.T @ g + alpha, np.sum(g)) if fit_intercept else A.T @ g + alpha
        return value, grad

    bounds = [(0.0, None)] * p + ([(None, None)] if fit_intercept else [])
    res = scipy.optimize.minimize(fun, np.zeros(p + int(fit_intercept)), jac=True,
                                  method="L-BFGS-B", bounds=bounds,
                                  options={"maxiter": 100_000, "ftol": 1e-16,
                                           "gtol": 1e-13, "maxcor": 50})
    w, b = res.x[:p], (res.x[p] if fit_intercept else 0.0)
    return w, b, logistic_objective(X, y, alpha, w, b)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_reaches_the_bounded_lbfgs_objective(fmt, fit_intercept):
    """SparseLogisticRegression(positive=True) on every method at two alphas: the
    objective of L-BFGS-B with bounds [0, inf) to 1e-6, coef >= 0; and the constraint
    binds (the unconstrained model has negative coefficients)."""
    X, y = mixed_data(5, n=150, p=20, fmt=fmt, loss="logistic")
    problem = Problem(X, y, "logistic", L1(20, positive=True), 1.0, fit_intercept)
    top = problem.lam_max()
    for ratio in (0.3, 0.03):
        alpha = ratio * top
        _, _, best = lbfgsb_logistic(X, y, alpha, fit_intercept)
        for method in METHODS:
            model = SparseLogisticRegression(alpha=alpha, positive=True, method=method,
                                             fit_intercept=fit_intercept, tol=1e-10,
                                             max_epochs=5000, random_state=0).fit(X, y)
            coef = model.coef_.ravel()
            assert coef.min() >= 0.0 and np.count_nonzero(coef) > 0
            value = logistic_objective(X, y, alpha, coef, model.intercept_[0])
            assert abs(value - best) <= 1e-6 * best, (method, ratio)
        free = SparseLogisticRegression(alpha=alpha, fit_intercept=fit_intercept,
                                        tol=1e-8).fit(X, y)
        assert free.coef_.min() < 0.0


# -- the certificate ------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_gap_is_a_true_certificate(loss, ref):
    """Runs stopped early (a loose tol, a few outer iterations) on every method: at every
    record the best dual D is at most P* (weak duality needs a feasible, one-sided dual
    point), and the reported gap bounds P(coef) - P*; P* from a solve certified at
    1e-13 P(0) by the independent NumPy certificate."""
    X, y = mixed_data(6, n=120, p=30, loss=loss)
    problem = Problem(X, y, loss, L1(30, positive=True), 1.0, True)
    problem = problem.with_lam(0.02 * problem.lam_max())
    exact = solve_ddss(problem, tol=1e-13, max_epochs=20000, random_state=0)
    p_star, d_star, _, _ = independent_certificate(ref, X, y, loss, problem.lam, True,
                                                   exact.coef)
    p0 = problem.null_objective()
    assert p_star - d_star <= 1e-12 * p0
    objective = lasso_objective if loss == "squared" else logistic_objective
    checked = 0
    for method in METHODS:
        for tol, max_epochs in ((1e-2, 100), (1e-4, 100), (1e-13, 1), (1e-13, 3)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                est = Lasso if loss == "squared" else SparseLogisticRegression
                model = est(alpha=problem.lam, positive=True, method=method, tol=tol,
                            max_epochs=max_epochs, random_state=0).fit(X, y)
            coef = np.ravel(model.coef_)
            value = objective(X, y, problem.lam, coef, float(np.ravel(model.intercept_)[0]))
            assert value - p_star <= model.dual_gap_ + 1e-12 * p0, (method, tol, max_epochs)
            assert all(record["dual"] <= p_star + 1e-12 * p0 for record in model.history_)
            checked += model.dual_gap_ > 1e-9 * p0
    assert checked >= 3           # not vacuous: some runs stopped with a sizeable gap


# -- lam_max --------------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_solution_is_zero_from_the_one_sided_lam_max_on(loss, ref):
    """At lam >= lam_max (one-sided) the solution is 0; at 0.99 lam_max it is not. The
    one-sided lam_max is below the two-sided one here (a feature correlates negatively
    the most)."""
    X, y = mixed_data(7, loss=loss)
    X = np.column_stack([X, -3.0 * (y - y.mean())])      # the most, negatively
    p = X.shape[1]
    top = lam_max(X, y, loss=loss, penalty=L1(p, positive=True))
    assert 0 < top < 0.5 * lam_max(X, y, loss=loss)
    _, _, _, rho = independent_certificate(ref, X, y, loss, 1.0, True, np.zeros(p))
    assert top == pytest.approx(float(np.max(X.T @ rho)) / X.shape[0], rel=1e-9)
    est = Lasso if loss == "squared" else SparseLogisticRegression
    for factor in (1.0, 1.5):
        model = est(alpha=factor * top, positive=True, tol=1e-10).fit(X, y)
        assert not np.any(model.coef_)
    model = est(alpha=0.99 * top, positive=True, tol=1e-12, max_epochs=5000).fit(X, y)
    assert np.ravel(model.coef_).max() > 0.0 and np.ravel(model.coef_).min() >= 0.0


def test_a_zero_lam_max_leaves_zero_at_every_alpha():
    """Where every column correlates negatively with the centred target the one-sided
    lam_max is 0: x = 0 is optimal at any alpha, the fit returns it with a zero gap,
    lasso_path's default grid has nothing to fit and LassoCV's grid leaves w = 0."""
    rng = np.random.default_rng(8)
    X = rng.random((80, 6))
    y = -X.sum(axis=1) + 0.01 * rng.standard_normal(80)
    assert np.max(X.T @ (y - y.mean())) < 0
    assert lam_max(X, y, penalty=L1(6, positive=True)) == 0.0
    assert lam_max(X, y) > 0.0
    model = Lasso(alpha=1e-6, positive=True).fit(X, y)
    assert not np.any(model.coef_) and model.dual_gap_ <= 1e-12
    assert Lasso(alpha=1e-6).fit(X, y).coef_.min() < 0
    with pytest.raises(ValueError, match="correlates positively"):
        lasso_path(X, y, positive=True)
    assert not np.any(LassoCV(alphas=3, cv=2, positive=True).fit(X, y).coef_)


# -- screening ------------------------------------------------------------------------

REF_TOL = 1e-12
SHAPES = [(60, 20), (40, 90), (80, 35), (30, 120), (50, 50)]


def _screening_problem(make_data, seed, loss):
    rng = np.random.default_rng(seed)
    n, p = SHAPES[seed % len(SHAPES)]
    fmt = ("dense", "csr", "csc")[(seed // len(SHAPES)) % 3]
    fit_intercept = bool(seed % 2)
    X, y = make_data.random_data(seed, n, p, loss, fmt=fmt, density=0.35,
                                 n_informative=int(rng.integers(2, 8)))
    weights = rng.uniform(0.5, 2.0, p) if rng.random() < 0.5 else np.ones(p)
    base = Problem(X, y, loss, L1(p, weights, positive=True), 1.0, fit_intercept)
    top = base.lam_max()
    if top <= 0.0:
        return None
    ratio = float(rng.uniform(0.05, 0.9))
    desc = f"seed={seed} loss={loss} shape={n}x{p} fmt={fmt} lam/lam_max={ratio:.3f}"
    return base.with_lam(ratio * top), X, y, weights, desc


def unsafe_check(problem, active, nonzero, desc):
    """check(keep, where): an AssertionError naming ``where`` and ``desc`` where the mask
    ``keep`` over ``active``'s features removes a feature that is ``nonzero`` in the
    reference."""
    def check(keep, where):
        removed_features = np.zeros(problem.n_features, bool)
        removed_features[active.features[~keep]] = True
        wrong = np.flatnonzero(removed_features & nonzero)
        assert wrong.size == 0, f"UNSAFE at {where}: {wrong.tolist()}: {desc}"
    return check


def screening_points(problem, x_ref, rng, seed):
    """The points the safety tests screen at: x = 0, x after 1 and 3 epochs of DDSS
    without screening (``random_state=seed``), and x_ref plus Gaussian noise (from
    ``rng``) of 1e-7, 1e-4 and 1e-2 times its largest magnitude (at least 1e-3)."""
    points = [np.zeros(problem.n_features)]
    for epochs in (1, 3):
        points.append(solve_ddss(problem, screening=False, tol=1e-30, max_epochs=epochs,
                                 random_state=seed).coef)
    scale = max(np.abs(x_ref).max(), 1e-3)
    return points + [x_ref + sigma * scale * rng.standard_normal(x_ref.shape)
                     for sigma in (1e-7, 1e-4, 1e-2)]


def screened_run(problem, nonzero, seed, desc):
    """A converged DDSS run with screening (``random_state=seed``): no feature it
    removes is ``nonzero`` in the reference, and every one is exactly zero in its
    coef; returns (the result, the mask of the features it kept)."""
    result = solve_ddss(problem, tol=1e-9, max_epochs=20000, random_state=seed)
    assert result.converged, desc
    kept = np.zeros(problem.n_features, bool)
    kept[result.active_features] = True
    wrong = np.flatnonzero(~kept & nonzero)
    assert wrong.size == 0, f"UNSAFE inside DDSS: {wrong.tolist()}: {desc}"
    assert np.all(result.coef[~kept] == 0.0), desc
    return result, kept


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_one_sided_gap_safe_test_is_safe(loss, ref, make_data):
    """60 random problems per loss (120 in all): every feature that the one-sided test
    removes, at x = 0, after 1 and 3 epochs, at noisy versions of the reference
    (projected on x >= 0) around their own and the best dual point, and inside full
    DDSS runs, is zero in a reference solution whose gap, computed independently, is at
    most 2e-12 P(0). Not vacuous: the runs remove most features that are zero at the
    optimum, and the one-sided test removes features (negatively correlated) that the
    two-sided |A_j^T theta| test keeps."""
    removed, zero_total, one_sided_only, problems = 0, 0, 0, 0
    for k in range(60):
        made = _screening_problem(make_data, 5000 + 100 * (loss == "logistic") + k, loss)
        if made is None:
            continue
        problem, X, y, weights, desc = made
        problems += 1
        p0 = problem.null_objective()
        exact = solve_ddss(problem, screening=False, tol=REF_TOL, max_epochs=30000,
                           random_state=0)
        p_star, d_star, _, _ = independent_certificate(
            ref, X, y, loss, problem.lam, problem.fit_intercept, exact.coef, weights)
        assert p_star - d_star <= 2 * REF_TOL * p0, desc
        x_ref = exact.coef
        nonzero = x_ref > 1e-6 * max(x_ref.max(), 1e-300)
        zero_total += int(np.sum(x_ref == 0))
        active = problem.full_active_set()
        order = np.argsort(active.features)
        column_norms = np.sqrt(np.asarray(sp.csc_matrix(X).multiply(sp.csc_matrix(X))
                                          .sum(axis=0)).ravel())
        check = unsafe_check(problem, active, nonzero, desc)
        points = screening_points(problem, x_ref, np.random.default_rng(k), k)
        best = BestDual()
        for where, x in enumerate(points):
            cert = problem.certificate(np.maximum(x, 0.0), 0.0)
            keep = screen_active_set(active, cert)
            check(keep, f"point {where}")
            keep_best = screen_active_set(active, cert, best)
            check(keep_best, f"point {where}, best dual point")
            best.offer_certificate(cert)
            # the two-sided test |A_j^T theta| + r ||a_j|| < n lam w_j at the same point
            radius = math.sqrt(2 * problem.n_samples * problem.loss.lipschitz *
                               (cert.gap + 1e-11 * abs(cert.primal)))
            two_sided = np.abs(cert.correlation[order] / cert.dual_scale) + \
                radius * column_norms >= problem.n_samples * problem.lam * weights
            one_sided_only += int(np.sum(~keep[order] & two_sided))
        result, kept = screened_run(problem, nonzero, k, desc)
        assert result.coef.min() >= 0.0, desc
        removed += int(np.sum(~kept))
    assert problems >= 55
    assert removed >= 0.8 * zero_total, (removed, zero_total)
    assert one_sided_only > 0


# -- the other front ends -------------------------------------------------------------

def test_the_group_penalty_has_no_positive_option():
    X, y = mixed_data(9, loss="logistic")
    with pytest.raises(ValueError, match="group penalty"):
        SparseLogisticRegression(groups=4, positive=True).fit(X, y)
    with pytest.raises(ValueError, match="group penalty"):
        lasso_path(X, y, groups=4, positive=True)
    assert "positive" not in GroupLasso().get_params()
    assert Lasso().get_params()["positive"] is False


def test_lasso_path_and_the_cv_estimators_pass_positive_on():
    """lasso_path(positive=True) from the one-sided alpha_max; LassoCV and
    SparseLogisticRegressionCV grid from it and refit positive models."""
    X, y = mixed_data(10)
    alphas, coefs, gaps = lasso_path(X, y, positive=True, n_alphas=8, tol=1e-8)
    assert alphas[0] == pytest.approx(one_sided_lam_max(X, y, True), rel=1e-12)
    assert coefs.min() >= 0.0 and not np.any(coefs[:, 0]) and np.any(coefs[:, -1])
    cv = LassoCV(alphas=8, cv=3, positive=True).fit(X, y)
    assert cv.alphas_[0] == pytest.approx(alphas[0], rel=1e-12)
    assert cv.best_estimator_.positive and cv.coef_.min() >= 0.0 and np.any(cv.coef_)
    X, y = mixed_data(11, loss="logistic")
    cv = SparseLogisticRegressionCV(alphas=5, cv=3, positive=True).fit(X, y)
    assert cv.coef_.min() >= 0.0 and np.any(cv.coef_)
    assert LassoCV(alphas=8, cv=3).fit(*mixed_data(10)).coef_.min() < 0.0


def _write_libsvm(path, loss, n=200, p=15, seed=12):
    X, y = mixed_data(seed, n=n, p=p, fmt="csr", loss=loss)
    X = X.toarray()
    with open(path, "w") as f:
        for i in range(n):
            feats = " ".join(f"{j + 1}:{X[i, j]:.10g}" for j in np.flatnonzero(X[i]))
            f.write(f"{y[i]:.10g} {feats}\n")
    return path


def _env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                PYTHONWARNINGS="ignore")


@pytest.mark.parametrize("prog", ["asyncopt-lasso", "asyncopt-logreg"])
def test_the_command_line_fits_a_model_without_negative_coefficients(prog, tmp_path):
    """``asyncopt-lasso DATA --positive`` (the installed script) and asyncopt-logreg's
    model files have no negative coefficient; without --positive they have some."""
    loss = "squared" if prog == "asyncopt-lasso" else "logistic"
    data = _write_libsvm(tmp_path / "d.svm", loss)
    script = os.path.join(os.path.dirname(sys.executable), prog)
    coefs = {}
    for flag in ("--positive", None):
        model = tmp_path / f"model{flag or ''}.npz"
        argv = [script, str(data), "--quiet", "--backend", "serial", "--alpha-ratio",
                "0.02", "--output", str(model)] + ([flag] if flag else [])
        proc = subprocess.run(argv, env=_env(), capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert ("coef >= 0" in proc.stdout) == (flag is not None)
        assert "NOT reached" not in proc.stdout
        coefs[flag] = np.load(model)["coef"]
    assert coefs["--positive"].min() >= 0.0 and np.any(coefs["--positive"])
    assert coefs[None].min() < 0.0


# -- mpirun ---------------------------------------------------------------------------

def shards_result(tmp_path, loss, method, option):
    """``mpirun -n 3`` (1 server + 2 workers) of tests/mpi/solve_shards.py with the L1
    penalty and ``option``: its JSON result; the run converged, has non-zeros and
    reaches the serial run's objective to 1e-6."""
    out = tmp_path / "result.json"
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, SHARDS, str(out), loss,
                           method, "1", option], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["converged"] and result["coef_nnz"] > 0
    assert abs(result["objective"] - result["serial_objective"]) <= \
        1e-6 * abs(result["serial_objective"])
    return result


def lasso_cli_under_mpirun_and_serially(tmp_path, arguments):
    """``asyncopt-lasso`` with ``arguments`` under ``mpirun -n 3`` and on the serial
    backend, each saving its model: (mpirun's stdout, its model, the serial model, as
    ``np.load`` reads them); both exit 0 and mpirun's summary names its ranks."""
    mpi = subprocess.run([MPIRUN, "-n", "3", sys.executable, "-m", "asyncopt.cli.lasso",
                          *arguments, "--save-coef", str(tmp_path / "mpi.npz")],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert mpi.returncode == 0, mpi.stderr[-2000:]
    assert "mpi (1 server + 2 workers)" in mpi.stdout
    serial = subprocess.run([sys.executable, "-m", "asyncopt.cli.lasso", *arguments,
                             "--backend", "serial", "--save-coef",
                             str(tmp_path / "serial.npz")], env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert serial.returncode == 0, serial.stderr[-2000:]
    return mpi.stdout, np.load(tmp_path / "mpi.npz"), np.load(tmp_path / "serial.npz")


@pytest.mark.mpi
@pytest.mark.parametrize("method,loss", [("ddss", "squared"), ("working_set", "squared"),
                                         ("auto", "logistic")])
def test_dis_ddss_reaches_the_serial_positive_objective(tmp_path, method, loss):
    """mpirun -n 3 (1 server + 2 workers), the L1 penalty with coef >= 0: the serial
    run's objective to 1e-6, coef >= 0."""
    assert shards_result(tmp_path, loss, method, "positive")["coef_min"] >= 0.0


@pytest.mark.mpi
def test_the_command_line_under_mpirun_with_positive(tmp_path):
    """``mpirun -n 3 asyncopt-lasso DATA --positive``: the serial command line's model."""
    data = _write_libsvm(tmp_path / "d.svm", "squared")
    stdout, a, b = lasso_cli_under_mpirun_and_serially(
        tmp_path, [str(data), "--quiet", "--positive", "--tol", "1e-9", "--max-epochs",
                   "2000"])
    assert "coef >= 0" in stdout
    assert float(a["alpha"]) == pytest.approx(float(b["alpha"]), rel=1e-12)
    assert a["coef"].min() >= 0.0
    np.testing.assert_allclose(a["coef"], b["coef"], rtol=1e-4, atol=1e-6)
