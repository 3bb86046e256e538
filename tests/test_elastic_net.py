"""The elastic net (issue 48): ``ElasticNet(alpha, l1_ratio)``, ``l1_ratio`` on
``SparseLogisticRegression``, ``lasso_path``, ``ElasticNetCV`` and ``--l1-ratio``.

The maths checked, against references that share none of the library's code: the prox
prox_l1(u, t) / (1 + t l2), the elastic-net dual (the correlation c = A^T rho - n mu x,
D = -(1/n) sum f*(-rho / s) - mu ||x||^2 / (2 s^2)) so that the gap is a true certificate,
alpha_max = lam_max / l1_ratio, the gap-safe test with the L2 rows (safe on 120 random
problems), and every front end: scikit-learn's ElasticNet, LogisticRegression and
ElasticNetCV objectives and choices, the threads backend on both kernels, the command
lines and mpirun. l1_ratio = 1 is the Lasso, bit for bit.
"""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet as SkElasticNet
from sklearn.linear_model import ElasticNetCV as SkElasticNetCV
from sklearn.linear_model import LogisticRegression, enet_path
from sklearn.model_selection import KFold
from sklearn.utils.estimator_checks import (check_sample_weight_equivalence_on_dense_data,
                                            check_sample_weight_equivalence_on_sparse_data,
                                            parametrize_with_checks)

from asyncopt import (ElasticNet, ElasticNetCV, GroupLasso, Lasso, LassoCV, Problem,
                      SparseLogisticRegression, lam_max, lasso_path)
from asyncopt.kernels import native
from asyncopt.kernels.svrg import svrg_epoch_l1_elastic_tracked, svrg_epoch_l1_tracked
from asyncopt.kernels.workspace import Clock
from asyncopt.penalties import L1, elastic_net_strengths, prox_elastic_net, prox_l1
from asyncopt.problem import rescaled_sample_weight
from asyncopt.screening import BestDual, screen_active_set
from asyncopt.solvers import solve_ddss

from test_positive import (_env, _epoch_arguments, _write_libsvm, dense,
                           lasso_cli_under_mpirun_and_serially, screened_run,
                           screening_points, shards_result, unsafe_check)
from test_positive import mixed_data as data
from test_sample_weight import data as weighted_data
from test_sample_weight import write_weights

L1_RATIOS = (0.1, 0.5, 0.9)
RATIOS = (0.3, 0.03, 0.001)          # alpha / alpha_max
METHODS = ("auto", "ddss", "working_set")


def enet_objective(X, y, alpha, l1_ratio, coef, intercept, loss="squared"):
    """scikit-learn's objective: the mean loss (squared: (1/2n) ||y - X w - b||^2) +
    alpha l1_ratio ||w||_1 + alpha (1 - l1_ratio) / 2 ||w||^2."""
    z = dense(X) @ coef + intercept
    data_fit = 0.5 * np.mean((y - z) ** 2) if loss == "squared" else \
        np.mean(np.logaddexp(0.0, -y * z))
    return float(data_fit + alpha * l1_ratio * np.sum(np.abs(coef)) +
                 0.5 * alpha * (1.0 - l1_ratio) * float(coef @ coef))


def alpha_max(X, y, l1_ratio, fit_intercept=True):
    """scikit-learn's alpha_max of the squared loss: max_j |X_j^T (y - ybar)| / (n
    l1_ratio)."""
    r = y - (y.mean() if fit_intercept else 0.0)
    return float(np.max(np.abs(dense(X).T @ r))) / (y.shape[0] * l1_ratio)


def independent_certificate(ref, X, y, loss, alpha, l1_ratio, fit_intercept, x,
                            weights=None, positive=False, sample_weight=None):
    """(P, D, intercept) at x from NumPy alone, the elastic net's dual (docs/design.md
    §1): lam = alpha l1_ratio, mu = alpha (1 - l1_ratio), the rows' weights c
    (``sample_weight`` as the problem holds them; 1 where None), b the c-weighted
    optimum, rho = -c f'(X x + b), c = X^T rho - n mu w x, s = max(1, max_j |c_j| / w_j /
    (n lam)) (max(c_j, 0) for |c_j| with ``positive``), D = -(1/n) sum_{c_i > 0} c_i
    f*(-rho_i / (s c_i)) - mu sum_j w_j x_j^2 / (2 s^2); P is +inf at a negative x_j
    with ``positive``."""
    A = dense(X)
    n, p = A.shape
    w = np.ones(p) if weights is None else weights
    rows = np.ones(n) if sample_weight is None else sample_weight
    lam, mu = alpha * l1_ratio, alpha * (1.0 - l1_ratio)
    z0 = A @ x
    b = ref.optimal_intercept(loss, z0, y, sample_weight) if fit_intercept else 0.0
    rho = -rows * ref.loss_derivatives(loss, z0 + b, y)
    c = A.T @ rho - n * mu * w * x
    magnitude = np.maximum(c, 0.0) if positive else np.abs(c)
    scale = max(1.0, float(np.max(magnitude / w)) / (n * lam))
    square = float(w @ (x * x))
    primal = np.inf if positive and np.any(x < 0) else \
        float(rows @ ref.loss_values(loss, z0 + b, y) / n + lam * w @ np.abs(x) +
              0.5 * mu * square)
    live = rows > 0
    dual = -float(rows[live] @ ref.loss_conjugates(loss, -rho[live] / (scale * rows[live]),
                                                   y[live])) / n
    return primal, dual - 0.5 * mu * square / scale ** 2, b


# -- the prox, the penalty and the kernels ----------------------------------------------

@given(u=st.floats(-1e3, 1e3), t=st.floats(0.0, 1e2), l2=st.floats(0.0, 1e2),
       positive=st.booleans())
def test_the_prox_minimises_its_objective(u, t, l2, positive):
    """prox_elastic_net(u, t, positive, l2) = argmin_v (v - u)^2 / 2 + t |v| +
    t l2 v^2 / 2 (over v >= 0 with positive), checked on a grid around it; with l2 = 0
    it is prox_l1's value bit for bit."""
    v = prox_elastic_net(u, t, positive, l2)
    assert not positive or v >= 0.0
    grid = v + np.linspace(-1.0, 1.0, 401) * (1.0 + abs(v))
    if positive:
        grid = grid[grid >= 0.0]

    def objective(w):
        return 0.5 * (w - u) ** 2 + t * np.abs(w) + 0.5 * t * l2 * w ** 2
    assert objective(v) <= objective(grid).min() + 1e-9 * (1.0 + u * u)
    assert prox_elastic_net(u, t, positive, 0.0) == prox_l1(u, t, positive)


def test_the_penalty_value_prox_and_correlation():
    """L1(l2=...): the value w (|x| + l2 x^2 / 2) summed, its prox, the constraint's
    correlation c = A^T rho - n lam l2 w x and back, the strengths of (alpha,
    l1_ratio), and the restricted penalty keeps l2."""
    weights = np.array([1.0, 2.0, 0.5])
    pen = L1(3, weights, l2=3.0)
    x = np.array([1.0, -2.0, 0.5])
    assert pen.value(x) == pytest.approx(1.0 + 4.0 + 0.25 + 1.5 * (1.0 + 8.0 + 0.125))
    u, step = np.array([3.0, -3.0, 0.2]), 0.5
    expected = np.sign(u) * np.maximum(np.abs(u) - step * weights, 0.0) / \
        (1.0 + step * 3.0 * weights)
    np.testing.assert_allclose(pen.prox(u, step), expected, rtol=1e-15)
    corr = np.array([0.3, -0.1, 2.0])
    c = pen.constraint_correlation(corr, x, 10.0)
    np.testing.assert_allclose(c, corr - 30.0 * weights * x, rtol=1e-15)
    np.testing.assert_allclose(pen.loss_correlation(c, x, 10.0), corr, atol=1e-13)
    assert pen.restricted(np.array([0, 2])).l2 == 3.0
    plain = L1(3, weights)
    assert plain.constraint_correlation(corr, x, 10.0) is corr
    assert plain.value(x) == 1.0 + 4.0 + 0.25
    lam, l2 = elastic_net_strengths(0.2, 0.25)
    assert lam == pytest.approx(0.05) and l2 == pytest.approx(3.0)
    assert elastic_net_strengths(0.2, 1.0) == (0.2, 0.0)
    with pytest.raises(ValueError, match="l2"):
        L1(3, l2=-1.0)


def test_the_epoch_kernel_shrinks_and_the_native_one_is_bit_identical():
    """A prox-SVRG epoch with ``Blocks.l2`` on the penalty's kernel (the elastic one):
    each step's prox shrinks by 1 / (1 + t l2), so x ends smaller than without it; the
    elastic kernel at l2 = 0 is the L1 kernel bit for bit, the L1 kernel refuses l2 > 0,
    and the C kernel on one thread gives the numba kernel's x bit for bit, with and
    without l2."""
    ends = {}
    for l2 in (0.0, 50.0):
        rows, blocks, step, samples = _epoch_arguments(False, l2=l2)
        kernel = L1(20, l2=l2).svrg_kernel(tracked=True)
        assert (kernel is svrg_epoch_l1_tracked) == (l2 == 0.0)
        x, b = np.full(20, 0.01), np.zeros(1)
        kernel(rows, blocks, step, x, b, samples, Clock.fresh())
        ends[l2] = x
        if l2:
            with pytest.raises(ValueError, match="elastic kernel"):
                svrg_epoch_l1_tracked(rows, blocks, step, x.copy(), b.copy(), samples,
                                      Clock.fresh())
        else:
            x_e, b_e = np.full(20, 0.01), np.zeros(1)
            svrg_epoch_l1_elastic_tracked(rows, blocks, step, x_e, b_e, samples,
                                          Clock.fresh())
            np.testing.assert_array_equal(x_e, x)
        if native.available():
            x_c, b_c = np.full(20, 0.01), np.zeros(1)
            native.native_epoch_l1(rows, blocks, step, x_c, b_c, samples, Clock.fresh())
            np.testing.assert_array_equal(x_c, x)
            assert b_c[0] == b[0]
    assert np.linalg.norm(ends[50.0]) < 0.9 * np.linalg.norm(ends[0.0])


# -- the squared loss against scikit-learn ------------------------------------------------

@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_elastic_net_reaches_sklearns_objective(fmt, fit_intercept):
    """Every method (auto, ddss, working_set), serial and on two threads, at l1_ratio
    0.1, 0.5, 0.9 and alpha = 0.3, 0.03, 0.001 alpha_max: scikit-learn's ElasticNet
    objective to 1e-6, with a converged certified gap."""
    X, y = data(1, fmt=fmt)
    for l1_ratio in L1_RATIOS:
        top = alpha_max(X, y, l1_ratio, fit_intercept)
        for ratio in RATIOS:
            alpha = ratio * top
            sk = SkElasticNet(alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept,
                              tol=1e-14, max_iter=1_000_000).fit(dense(X), y)
            best = enet_objective(X, y, alpha, l1_ratio, sk.coef_, sk.intercept_)
            for method in METHODS:
                for backend in ({}, dict(backend="threads", n_jobs=2)):
                    model = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, method=method,
                                       fit_intercept=fit_intercept, tol=1e-10,
                                       max_epochs=5000, random_state=0,
                                       **backend).fit(X, y)
                    where = f"{method} {backend} l1_ratio={l1_ratio} alpha={ratio}"
                    value = enet_objective(X, y, alpha, l1_ratio, model.coef_,
                                           model.intercept_)
                    assert abs(value - best) <= 1e-6 * best, where
                    assert model.dual_gap_ <= 1e-10 * model.history_[0]["primal"], where
                    assert model.objective_ == pytest.approx(value, rel=1e-9), where


def test_positive_elastic_net_reaches_sklearns_objective():
    """positive=True with l1_ratio < 1: the one-sided prox, then the shrink, and the
    one-sided dual constraint on c: scikit-learn's ElasticNet(positive=True) objective
    to 1e-6, coef >= 0, on every method."""
    X, y = data(4)
    for l1_ratio in (0.2, 0.8):
        alpha = 0.02 * alpha_max(X, y, l1_ratio)
        sk = SkElasticNet(alpha=alpha, l1_ratio=l1_ratio, positive=True, tol=1e-14,
                          max_iter=1_000_000).fit(X, y)
        best = enet_objective(X, y, alpha, l1_ratio, sk.coef_, sk.intercept_)
        for method in METHODS:
            model = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, positive=True,
                               method=method, tol=1e-10, max_epochs=5000,
                               random_state=0).fit(X, y)
            assert model.coef_.min() >= 0.0 and np.any(model.coef_)
            value = enet_objective(X, y, alpha, l1_ratio, model.coef_, model.intercept_)
            assert abs(value - best) <= 1e-6 * best, (method, l1_ratio)


@pytest.mark.parametrize("kernel", ["numba", "native"])
def test_two_threads_on_either_kernel_reach_sklearns_objective(kernel):
    if kernel == "native" and not native.available():
        pytest.skip(f"native kernel not built: {native.LOAD_ERROR}")
    X, y = data(2, n=300, p=30, fmt="csr")
    alpha = 0.01 * alpha_max(X, y, 0.5)
    sk = SkElasticNet(alpha=alpha, l1_ratio=0.5, tol=1e-14,
                      max_iter=1_000_000).fit(dense(X), y)
    best = enet_objective(X, y, alpha, 0.5, sk.coef_, sk.intercept_)
    for method in ("ddss", "auto"):
        model = ElasticNet(alpha=alpha, l1_ratio=0.5, backend="threads", n_jobs=2,
                           kernel=kernel, method=method, tol=1e-10, max_epochs=5000,
                           random_state=0).fit(X, y)
        value = enet_objective(X, y, alpha, 0.5, model.coef_, model.intercept_)
        assert abs(value - best) <= 1e-6 * best, method


@pytest.mark.parametrize("method", ["auto", "ddss", "working_set", "ddss_naive",
                                    "prox_asaga", "prox_asvrg", "pse_safe", "pse_strong"])
def test_l1_ratio_one_is_the_lasso_bit_for_bit(method):
    """ElasticNet(l1_ratio=1) and SparseLogisticRegression(l1_ratio=1) are the L1
    models: the same coef_, intercept_, gap and history, bit for bit, on every method
    (the baselines included: l1_ratio = 1 is no elastic net)."""
    X, y = data(3, n=80, p=30)
    kw = dict(alpha=0.02, method=method, tol=1e-8, max_epochs=60, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pairs = [(Lasso(**kw).fit(X, y), ElasticNet(l1_ratio=1.0, **kw).fit(X, y))]
        if method in METHODS:
            X2, y2 = data(3, n=80, p=30, loss="logistic")
            pairs.append((SparseLogisticRegression(**kw).fit(X2, y2),
                          SparseLogisticRegression(l1_ratio=1, **kw).fit(X2, y2)))
    for lasso, enet in pairs:
        np.testing.assert_array_equal(enet.coef_, lasso.coef_)
        np.testing.assert_array_equal(enet.intercept_, lasso.intercept_)
        assert enet.dual_gap_ == lasso.dual_gap_
        assert [r["primal"] for r in enet.history_] == [r["primal"] for r in lasso.history_]
        assert [r["dual"] for r in enet.history_] == [r["dual"] for r in lasso.history_]


# -- the logistic loss against scikit-learn ---------------------------------------------

@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_reaches_sklearns_elastic_net_objective(fmt, fit_intercept):
    """SparseLogisticRegression(l1_ratio) on every method at l1_ratio 0.1, 0.5, 0.9 and
    two alphas: the objective of scikit-learn's LogisticRegression (saga, the
    elastic-net penalty, C = 1 / (n alpha), tol 1e-12) to 1e-6."""
    X, y = data(5, n=150, p=20, fmt=fmt, loss="logistic")
    n = X.shape[0]
    for l1_ratio in L1_RATIOS:
        for alpha in (0.03, 0.003):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning,
                                                 UserWarning))
                sk = LogisticRegression(l1_ratio=l1_ratio, solver="saga",
                                        C=1.0 / (n * alpha), fit_intercept=fit_intercept,
                                        tol=1e-12, max_iter=1_000_000).fit(dense(X), y)
            best = enet_objective(X, y, alpha, l1_ratio, sk.coef_.ravel(),
                                  sk.intercept_[0] if fit_intercept else 0.0, "logistic")
            for method in METHODS:
                model = SparseLogisticRegression(alpha=alpha, l1_ratio=l1_ratio,
                                                 method=method,
                                                 fit_intercept=fit_intercept, tol=1e-10,
                                                 max_epochs=5000, random_state=0).fit(X, y)
                value = enet_objective(X, y, alpha, l1_ratio, model.coef_.ravel(),
                                       model.intercept_[0], "logistic")
                assert abs(value - best) <= 1e-6 * best, (method, l1_ratio, alpha)


# -- the certificate and alpha_max --------------------------------------------------------

@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_gap_is_a_true_certificate(loss, ref):
    """Runs stopped early (a loose tol, a few outer iterations) on every method: every
    record's best dual D is at most P* (weak duality needs the elastic net's feasible
    dual point and its L2 term), and the reported gap bounds P(coef) - P*; P* from a
    solve certified at 1e-13 P(0) by the independent NumPy certificate."""
    X, y = data(6, n=120, p=30, loss=loss)
    l1_ratio = 0.3
    est = ElasticNet if loss == "squared" else SparseLogisticRegression
    lam, l2 = elastic_net_strengths(1.0, l1_ratio)
    problem = Problem(X, y, loss, L1(30, l2=l2), 1.0, True)
    alpha = 0.02 * problem.lam_max() / l1_ratio
    problem = problem.with_lam(alpha * l1_ratio)
    exact = solve_ddss(problem, tol=1e-13, max_epochs=20000, random_state=0)
    p_star, d_star, _ = independent_certificate(ref, X, y, loss, alpha, l1_ratio, True,
                                                exact.coef)
    p0 = problem.null_objective()
    assert p_star - d_star <= 1e-12 * p0
    assert exact.primal == pytest.approx(p_star, rel=1e-12)
    checked = 0
    for method in METHODS:
        for tol, max_epochs in ((1e-2, 100), (1e-4, 100), (1e-13, 1), (1e-13, 3)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model = est(alpha=alpha, l1_ratio=l1_ratio, method=method, tol=tol,
                            max_epochs=max_epochs, random_state=0).fit(X, y)
            coef = np.ravel(model.coef_)
            value = enet_objective(X, y, alpha, l1_ratio, coef,
                                   float(np.ravel(model.intercept_)[0]), loss)
            assert value - p_star <= model.dual_gap_ + 1e-12 * p0, (method, tol)
            assert all(r["dual"] <= p_star + 1e-12 * p0 for r in model.history_), method
            checked += model.dual_gap_ > 1e-9 * p0
            # the library's own D at x is the independent one
            _, d_x, _ = independent_certificate(ref, X, y, loss, alpha, l1_ratio, True,
                                                coef)
            assert model.history_[-1]["dual_at_x"] == pytest.approx(d_x, rel=1e-9,
                                                                     abs=1e-12 * p0)
    assert checked >= 3           # not vacuous: some runs stopped with a sizeable gap


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_solution_is_zero_from_alpha_max_on(loss):
    """alpha_max = lam_max / l1_ratio (the L2 term's gradient vanishes at 0): the
    solution is zero at alpha_max and 1.5 alpha_max, not at 0.99 alpha_max; lasso_path's
    default grid starts there, as scikit-learn's enet_path does."""
    X, y = data(7, loss=loss)
    est = ElasticNet if loss == "squared" else SparseLogisticRegression
    for l1_ratio in (0.2, 0.7):
        top = lam_max(X, y, loss=loss) / l1_ratio
        for factor in (1.0, 1.5):
            model = est(alpha=factor * top, l1_ratio=l1_ratio, tol=1e-10).fit(X, y)
            assert not np.any(model.coef_)
        model = est(alpha=0.99 * top, l1_ratio=l1_ratio, tol=1e-12,
                    max_epochs=5000).fit(X, y)
        assert np.any(model.coef_)
        alphas, _, _ = lasso_path(X, y, l1_ratio=l1_ratio, n_alphas=5, loss=loss)
        assert alphas[0] == pytest.approx(top, rel=1e-12)
        if loss == "squared":
            assert top == pytest.approx(alpha_max(X, y, l1_ratio), rel=1e-12)


def test_lasso_path_matches_sklearns_enet_path():
    """lasso_path(l1_ratio=0.4): scikit-learn's enet_path grid and coefficients (its
    path has no intercept: centred data)."""
    X, y = data(8, n=90, p=25)
    Xc, yc = X - X.mean(axis=0), y - y.mean()
    alphas, coefs, gaps = lasso_path(Xc, yc, l1_ratio=0.4, n_alphas=12, tol=1e-12,
                                     max_epochs=5000, fit_intercept=False)
    sk_alphas, sk_coefs, _ = enet_path(Xc, yc, l1_ratio=0.4, alphas=12, tol=1e-14,
                                       max_iter=1_000_000)
    np.testing.assert_allclose(alphas, sk_alphas, rtol=1e-12)
    np.testing.assert_allclose(coefs, sk_coefs, atol=1e-6)
    assert np.all(gaps >= 0.0)


# -- screening ------------------------------------------------------------------------

REF_TOL = 1e-12
SHAPES = [(60, 20), (40, 90), (80, 35), (30, 120), (50, 50)]
SCREENING_PROBLEMS = 60                  # per loss: 120 in all


@st.composite
def screening_problems(draw, loss, make_data):
    """A random elastic net: shape, format, intercept, l1_ratio in [0.02, 0.98], alpha /
    alpha_max in [0.05, 0.9], unit or random weights, with or without positive, with or
    without sample weights (a fifth of the rows at zero, a tenth heavy)."""
    seed = draw(st.integers(0, 2 ** 31 - 1))
    n, p = draw(st.sampled_from(SHAPES))
    fmt = draw(st.sampled_from(["dense", "csr", "csc"]))
    fit_intercept = draw(st.booleans())
    l1_ratio = draw(st.floats(0.02, 0.98))
    ratio = draw(st.floats(0.05, 0.9))
    positive = draw(st.booleans())
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.5, 2.0, p) if draw(st.booleans()) else np.ones(p)
    X, y = make_data.random_data(seed, n, p, loss, fmt=fmt, density=0.35,
                                 n_informative=int(rng.integers(2, 8)))
    rows = None
    if draw(st.booleans()):
        rows = rng.exponential(1.0, n) * (rng.random(n) < 0.8)
        rows[rng.random(n) < 0.1] = 30.0
        rows[0] = max(rows[0], 1.0)
        rows = rescaled_sample_weight(rows, n)
    _, l2 = elastic_net_strengths(1.0, l1_ratio)
    base = Problem(X, y, loss, L1(p, weights, positive=positive, l2=l2), 1.0,
                   fit_intercept, sample_weight=rows)
    top = base.lam_max() / l1_ratio
    assume(top > 0.0)         # positive: some feature correlates positively with rho(0)
    alpha = ratio * top
    desc = (f"seed={seed} loss={loss} shape={n}x{p} fmt={fmt} intercept={fit_intercept} "
            f"l1_ratio={l1_ratio:.3f} alpha/alpha_max={ratio:.3f} positive={positive} "
            f"sample_weight={rows is not None}")
    return base.with_lam(alpha * l1_ratio), X, y, alpha, l1_ratio, weights, seed, desc


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_gap_safe_test_is_safe(loss, ref, make_data):
    """Hypothesis draws 60 random elastic nets per loss (120 in all, penalty weights or
    not, positive or not, sample weights or not): every feature that the test removes, at x = 0, after 1 and 3
    epochs, at noisy versions of the reference, at the reference with its largest
    coordinate moved away from zero, each around its own and the best dual point so
    far, and inside full DDSS runs, is zero in a reference solution whose gap, computed
    independently, is at most 2e-12 P(0). Not vacuous: the runs remove most features
    that are zero at the optimum."""
    totals = {"problems": 0, "removed": 0, "zero": 0}

    @settings(max_examples=SCREENING_PROBLEMS)
    @given(made=screening_problems(loss, make_data))
    def safe(made):
        problem, X, y, alpha, l1_ratio, weights, seed, desc = made
        positive = problem.penalty.positive
        p0 = problem.null_objective()
        exact = solve_ddss(problem, screening=False, tol=REF_TOL, max_epochs=30000,
                           random_state=0)
        p_star, d_star, _ = independent_certificate(
            ref, X, y, loss, alpha, l1_ratio, problem.fit_intercept, exact.coef, weights,
            positive, problem.sample_weight)
        assert p_star - d_star <= 2 * REF_TOL * p0, desc
        x_ref = exact.coef
        nonzero = np.abs(x_ref) > 1e-6 * max(np.abs(x_ref).max(), 1e-300)
        active = problem.full_active_set()
        check = unsafe_check(problem, active, nonzero, desc)
        points = screening_points(problem, x_ref, np.random.default_rng(seed), seed)
        # the solution with its largest coordinate moved away from zero: there the
        # radius is tight along that coordinate's L2 row, and a test without the row in
        # the column norm removes it where n mu w_j > ||A_j||^2
        for factor in (1.1, 1.5):
            moved = x_ref.copy()
            moved[np.argmax(np.abs(x_ref))] *= factor
            points.append(moved)
        best = BestDual()
        for where, x in enumerate(points):
            x = np.maximum(x, 0.0) if positive else x
            cert = problem.certificate(x, 0.0)
            check(screen_active_set(active, cert), f"point {where}")
            check(screen_active_set(active, cert, best), f"point {where}, best dual")
            best.offer_certificate(cert)
        _, kept = screened_run(problem, nonzero, seed, desc)
        totals["problems"] += 1
        totals["removed"] += int(np.sum(~kept))
        totals["zero"] += int(np.sum(x_ref == 0))

    safe()
    # hypothesis may replay an example (its first run, a shrink): at least 50 distinct
    assert totals["problems"] >= 50, totals
    assert totals["removed"] >= 0.8 * totals["zero"], totals


# -- the refusals ---------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.5, np.nan, "x", None])
def test_a_bad_l1_ratio_is_a_clear_value_error(bad):
    X, y = data(9, n=40, p=10)
    with pytest.raises(ValueError, match="l1_ratio must be in"):
        ElasticNet(l1_ratio=bad).fit(X, y)
    with pytest.raises(ValueError, match="l1_ratio must be in"):
        lasso_path(X, y, l1_ratio=bad, n_alphas=2)
    with pytest.raises(ValueError, match="l1_ratio"):
        ElasticNetCV(l1_ratio=[0.5, bad], alphas=2, cv=2).fit(X, y)
    if bad in (0, 0.0):
        with pytest.raises(ValueError, match="ridge"):
            ElasticNet(l1_ratio=bad).fit(X, y)


@pytest.mark.parametrize("method", ["prox_asaga", "prox_asvrg", "pse_safe", "pse_strong"])
def test_the_baselines_refuse_the_elastic_net_and_name_themselves(method):
    """The baselines' kernels apply the L1 prox alone: l1_ratio < 1 is a ValueError
    naming the method, from the estimator and from the solvers themselves."""
    X, y = data(10, n=60, p=15)
    with pytest.raises(ValueError, match=f"method '{method}'.*no elastic net"):
        ElasticNet(alpha=0.05, l1_ratio=0.5, method=method).fit(X, y)
    problem = Problem(X, y, "squared", L1(15, l2=1.0), 0.025)
    with pytest.raises(ValueError, match="no elastic net"):
        if method.startswith("pse"):
            from asyncopt.solvers.pse import solve_pse
            solve_pse(problem, method[4:])
        else:
            solve_ddss(problem, screening=False, saga=method == "prox_asaga",
                       dense=method == "prox_asvrg")


def test_ddss_naive_runs_the_elastic_net_prox():
    """DDSS-Naive's plain stochastic steps take the prox-SVRG kernel's prox, shrink
    included: 400 epochs of its decaying steps close 99% of P(0) - P*, and its gap
    bounds P - P*."""
    X, y = data(10, n=60, p=15)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        naive = ElasticNet(alpha=0.05, l1_ratio=0.5, method="ddss_naive", tol=1e-12,
                           max_epochs=400, random_state=0).fit(X, y)
    sk = SkElasticNet(alpha=0.05, l1_ratio=0.5, tol=1e-14, max_iter=100_000).fit(X, y)
    best = enet_objective(X, y, 0.05, 0.5, sk.coef_, sk.intercept_)
    excess = enet_objective(X, y, 0.05, 0.5, naive.coef_, naive.intercept_) - best
    assert 0.0 <= excess <= 0.01 * (naive.history_[0]["primal"] - best)
    assert excess <= naive.dual_gap_ + 1e-12


def test_the_group_penalty_has_no_l2_part():
    X, y = data(11, n=60, p=16, loss="logistic")
    with pytest.raises(ValueError, match="group penalty"):
        SparseLogisticRegression(groups=4, l1_ratio=0.5).fit(X, y)
    with pytest.raises(ValueError, match="group penalty"):
        lasso_path(X, y, groups=4, l1_ratio=0.5, n_alphas=2)
    assert "l1_ratio" not in GroupLasso().get_params()
    assert SparseLogisticRegression(groups=4, l1_ratio=1.0).fit(X, y).coef_.shape == (1, 16)


def test_the_support_newton_step_is_not_taken():
    """The support Newton step models the loss alone: no Newton time or products in
    any record of an elastic-net fit, where the Lasso's stalls call it."""
    from asyncopt.data.embedded import load_a9a
    X, y = load_a9a(degree=2)
    X, y = X[:2000], y[:2000]
    kw = dict(alpha=1e-3, method="ddss", tol=1e-7, max_epochs=60, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        lasso = Lasso(**kw).fit(X, y)
        enet = ElasticNet(l1_ratio=0.9, **kw).fit(X, y)
    assert sum(r["newton_products"] + r["newton_s"] for r in lasso.history_) > 0
    assert sum(r["newton_products"] + r["newton_s"] for r in enet.history_) == 0


def test_a_checkpoint_resumes_only_its_own_l1_ratio(tmp_path):
    """A checkpoint records the L2 strength beside lam: the same fit resumes from it
    (no epoch run), and a fit at another l1_ratio with the same lam = alpha l1_ratio
    (another objective) refuses it in one line."""
    X, y = data(13, n=80, p=20)
    path = str(tmp_path / "fit.npz")
    first = ElasticNet(alpha=0.2, l1_ratio=0.5, tol=1e-8, checkpoint=path).fit(X, y)
    again = ElasticNet(alpha=0.2, l1_ratio=0.5, tol=1e-8, checkpoint=path).fit(X, y)
    assert again.n_iter_ == 0
    np.testing.assert_array_equal(again.coef_, first.coef_)
    with pytest.raises(ValueError, match=r"checkpoint of a run at l1_ratio = 0\.5, not "
                                         r"0\.25: remove it"):
        ElasticNet(alpha=0.4, l1_ratio=0.25, checkpoint=path).fit(X, y)
    with pytest.raises(ValueError, match=r"at alpha \* l1_ratio = 0\.1, not 0\.05"):
        ElasticNet(alpha=0.1, l1_ratio=0.5, checkpoint=path).fit(X, y)


# -- ElasticNetCV ---------------------------------------------------------------------

TIGHT = dict(tol=1e-10, max_epochs=5000, random_state=0)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_elastic_net_cv_matches_sklearn_on_the_same_folds(sparse, weighted):
    """The grids of every l1_ratio, the held-out MSE of every (l1_ratio, alpha, fold)
    to 1e-4, and the chosen pair (or one whose mean MSE is within 1% of the best), the
    refit's coefficients; with sample weights (a fifth zero, some heavy) split with the
    folds as scikit-learn's."""
    from sklearn.datasets import make_regression
    X, y = make_regression(n_samples=120, n_features=40, n_informative=8, noise=5.0,
                           random_state=0)
    s = weighted_data(15, n=120, p=6)[2] if weighted else None
    folds = list(KFold(4, shuffle=True, random_state=0).split(X))
    ratios = [0.1, 0.5, 0.9]
    ours = ElasticNetCV(l1_ratio=ratios, alphas=20, cv=folds, **TIGHT).fit(
        sp.csr_matrix(X) if sparse else X, y, sample_weight=s)
    sk = SkElasticNetCV(l1_ratio=ratios, alphas=20, cv=folds, tol=1e-12,
                        max_iter=100_000).fit(X, y, sample_weight=s)
    assert ours.alphas_.shape == sk.alphas_.shape == (3, 20)
    np.testing.assert_allclose(ours.alphas_, sk.alphas_, rtol=1e-10)
    assert ours.mse_path_.shape == sk.mse_path_.shape == (3, 20, 4)
    np.testing.assert_allclose(ours.mse_path_, sk.mse_path_, rtol=1e-4)
    mean = sk.mse_path_.mean(axis=2)
    r = ratios.index(ours.l1_ratio_)
    chosen = mean[r, np.flatnonzero(ours.alphas_[r] == ours.alpha_)[0]]
    assert (ours.alpha_ == pytest.approx(sk.alpha_, rel=1e-12) and
            ours.l1_ratio_ == sk.l1_ratio_) or chosen <= 1.01 * mean.min()
    refit = SkElasticNet(alpha=ours.alpha_, l1_ratio=ours.l1_ratio_, tol=1e-14,
                         max_iter=1_000_000).fit(X, y, sample_weight=s)
    np.testing.assert_allclose(ours.coef_, refit.coef_, atol=1e-6)
    assert ours.intercept_ == pytest.approx(refit.intercept_, abs=1e-6)
    assert isinstance(ours.best_estimator_, ElasticNet)
    assert ours.best_estimator_.l1_ratio == ours.l1_ratio_


def test_elastic_net_cv_of_one_l1_ratio_and_of_one():
    """A float l1_ratio squeezes alphas_ and mse_path_ to LassoCV's shapes; l1_ratio=1
    gives LassoCV's path and choice, bit for bit."""
    from sklearn.datasets import make_regression
    X, y = make_regression(n_samples=80, n_features=15, n_informative=5, noise=3.0,
                           random_state=1)
    one = ElasticNetCV(l1_ratio=0.7, alphas=6, cv=3, **TIGHT).fit(X, y)
    assert one.alphas_.shape == (6,) and one.mse_path_.shape == (6, 3)
    assert one.l1_ratio_ == 0.7
    lasso = LassoCV(alphas=6, cv=3, **TIGHT).fit(X, y)
    enet = ElasticNetCV(l1_ratio=1.0, alphas=6, cv=3, **TIGHT).fit(X, y)
    np.testing.assert_array_equal(enet.mse_path_, lasso.mse_path_)
    np.testing.assert_array_equal(enet.alphas_, lasso.alphas_)
    assert enet.alpha_ == lasso.alpha_
    np.testing.assert_array_equal(enet.coef_, lasso.coef_)


def test_elastic_net_cv_parallel_folds_agree_with_serial():
    from sklearn.datasets import make_regression
    X, y = make_regression(n_samples=80, n_features=15, n_informative=5, noise=3.0,
                           random_state=2)
    serial = ElasticNetCV(l1_ratio=[0.3, 0.8], alphas=5, cv=3, **TIGHT).fit(X, y)
    parallel = ElasticNetCV(l1_ratio=[0.3, 0.8], alphas=5, cv=3, n_jobs=2,
                            **TIGHT).fit(X, y)
    np.testing.assert_array_equal(parallel.mse_path_, serial.mse_path_)
    assert (parallel.alpha_, parallel.l1_ratio_) == (serial.alpha_, serial.l1_ratio_)


def _expected_failed_checks(estimator):
    # at the default tol=1e-4 the weighted fit and the fit on repeated rows are two
    # points within the tolerance of the same optimum, where the checks ask for equal
    # predictions to 1e-7: test_sample_weight_equivalence runs them at tol=1e-12
    reason = "the default tol=1e-4 (passes at tol=1e-12: test_sample_weight_equivalence)"
    return {"check_sample_weight_equivalence_on_dense_data": reason,
            "check_sample_weight_equivalence_on_sparse_data": reason}


@parametrize_with_checks([ElasticNet(alpha=0.1), ElasticNetCV(alphas=5, cv=3),
                          ElasticNetCV(l1_ratio=[0.2, 0.9], alphas=3, cv=3)],
                         expected_failed_checks=_expected_failed_checks)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_sample_weight_equivalence():
    """scikit-learn's checks at tol=1e-12: integer weights are repeated rows, zero
    weights dropped rows (through the folds for ElasticNetCV)."""
    for est in (ElasticNet(alpha=0.1, tol=1e-12, max_epochs=2000),
                ElasticNetCV(l1_ratio=[0.2, 0.9], alphas=3, cv=3, tol=1e-12,
                             max_epochs=2000)):
        check_sample_weight_equivalence_on_dense_data(type(est).__name__, est)
        check_sample_weight_equivalence_on_sparse_data(type(est).__name__, est)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_weighted_elastic_net_reaches_sklearns_objective(fmt, fit_intercept):
    """ElasticNet.fit(X, y, sample_weight=s) (a fifth of the weights zero, some heavy) on
    every method: scikit-learn's weighted ElasticNet objective,
    (1 / (2 sum s)) sum_i s_i (y_i - x_i^T w - b)^2 + its penalty, to 1e-6."""
    X, y, s = weighted_data(14, fmt=fmt)
    A = dense(X)
    for l1_ratio in (0.2, 0.7):
        r = y - (np.average(y, weights=s) if fit_intercept else 0.0)
        alpha = 0.05 * float(np.max(np.abs(A.T @ (s * r)))) / (np.sum(s) * l1_ratio)

        def objective(coef, intercept):
            return float(0.5 * s @ (y - A @ coef - intercept) ** 2 / np.sum(s) +
                         alpha * l1_ratio * np.abs(coef).sum() +
                         0.5 * alpha * (1.0 - l1_ratio) * coef @ coef)
        sk = SkElasticNet(alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept,
                          tol=1e-14, max_iter=1_000_000).fit(A, y, sample_weight=s)
        best = objective(sk.coef_, sk.intercept_)
        for method in METHODS:
            model = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, method=method,
                               fit_intercept=fit_intercept, tol=1e-10, max_epochs=5000,
                               random_state=0).fit(X, y, sample_weight=s)
            value = objective(model.coef_, model.intercept_)
            assert abs(value - best) <= 1e-6 * best, (method, l1_ratio)


# -- the command lines ----------------------------------------------------------------

def _libsvm_file(path, loss):
    """test_positive's LIBSVM file (200 x 15, seed 12) and its (X, y), dense."""
    X, y = data(12, n=200, p=15, fmt="csr", loss=loss)
    return _write_libsvm(path, loss), X.toarray(), y


@pytest.mark.parametrize("prog", ["asyncopt-lasso", "asyncopt-logreg"])
def test_the_command_line_fits_the_elastic_net(prog, tmp_path):
    """``asyncopt-lasso DATA --l1-ratio 0.5 --alpha A`` (the installed script) reaches
    ElasticNet's objective at alpha A; --alpha-ratio is relative to alpha_max =
    lam_max / l1_ratio; the summary names the l1_ratio."""
    loss = "squared" if prog == "asyncopt-lasso" else "logistic"
    path, X, y = _libsvm_file(tmp_path / "d.svm", loss)
    script = os.path.join(os.path.dirname(sys.executable), prog)
    est = ElasticNet if loss == "squared" else SparseLogisticRegression
    alpha = 0.02
    model = tmp_path / "model.npz"
    proc = subprocess.run([script, str(path), "--quiet", "--backend", "serial",
                           "--l1-ratio", "0.5", "--alpha", str(alpha), "--tol", "1e-10",
                           "--max-epochs", "2000", "--save-coef", str(model)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "l1_ratio 0.5" in proc.stdout and "alpha_max" in proc.stdout
    assert "NOT reached" not in proc.stdout
    saved = np.load(model)
    ref = est(alpha=alpha, l1_ratio=0.5, tol=1e-12, max_epochs=5000).fit(X, y)
    value = enet_objective(X, y, alpha, 0.5, saved["coef"], float(saved["intercept"]),
                           loss)
    best = enet_objective(X, y, alpha, 0.5, np.ravel(ref.coef_),
                          float(np.ravel(ref.intercept_)[0]), loss)
    assert abs(value - best) <= 1e-6 * best
    proc = subprocess.run([script, str(path), "--quiet", "--backend", "serial",
                           "--l1-ratio", "0.25", "--alpha-ratio", "0.5"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    top = lam_max(X, y, loss=loss) / 0.25
    assert f"alpha_max = {top:.4e}" in proc.stdout
    assert f"{0.5 * top:.4e}  (alpha/alpha_max = 0.5" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["--l1-ratio", "0"], "must be in (0, 1], got '0' (0 is ridge"),
    (["--l1-ratio", "1.5"], "must be in (0, 1], got '1.5'"),
    (["--l1-ratio", "x"], "expected a number in (0, 1], got 'x'"),
    (["--l1-ratio", "nan"], "must be in (0, 1]"),
    (["--l1-ratio", "0.5", "--method", "prox_asaga"], "--method prox_asaga has no "
                                                       "elastic net"),
])
def test_a_bad_l1_ratio_on_the_command_line_is_a_one_line_usage_error(argv, message):
    proc = subprocess.run([sys.executable, "-m", "asyncopt.cli.lasso", "--quiet", *argv],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("asyncopt-lasso: error:")
    assert message in proc.stderr, proc.stderr


# -- mpirun ---------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("method,loss", [("ddss", "squared"), ("working_set", "squared"),
                                         ("auto", "logistic"), ("working_set", "logistic")])
def test_dis_ddss_reaches_the_serial_elastic_net_objective(tmp_path, method, loss):
    """mpirun -n 3 (1 server + 2 workers) at l1_ratio 0.5: the serial run's objective to
    1e-6 (``shards_result``); the server adds the L2 term to the workers' sums."""
    shards_result(tmp_path, loss, method, "enet")


@pytest.mark.mpi
@pytest.mark.parametrize("weighted", [False, True])
def test_the_command_line_under_mpirun_with_l1_ratio(tmp_path, weighted):
    """``mpirun -n 3 asyncopt-lasso DATA --l1-ratio 0.3`` (and ``--sample-weight FILE``,
    each worker keeping its rows' weights): the serial command line's alpha and
    model."""
    path, X, _ = _libsvm_file(tmp_path / "d.svm", "squared")
    extra = []
    if weighted:
        write_weights(tmp_path / "w.txt", weighted_data(16, n=X.shape[0], p=6)[2])
        extra = ["--sample-weight", str(tmp_path / "w.txt")]
    stdout, a, b = lasso_cli_under_mpirun_and_serially(
        tmp_path, [str(path), "--quiet", "--l1-ratio", "0.3", "--tol", "1e-9",
                   "--max-epochs", "2000", *extra])
    assert "l1_ratio 0.3" in stdout
    assert float(a["alpha"]) == pytest.approx(float(b["alpha"]), rel=1e-12)
    np.testing.assert_allclose(a["coef"], b["coef"], rtol=1e-4, atol=1e-6)
