"""``fit(X, y, sample_weight=...)``: row weights c_i >= 0, rescaled to sum to n
(scikit-learn's convention), in P = (1/n) sum_i c_i f_i + lam Omega (issue 48).

The maths checked against references that do not share the library's code: scikit-learn's
Lasso and LogisticRegression with the same weights (the objective to 1e-6), the weighted
certificate recomputed in NumPy, integer weights against repeated rows and zero weights
against dropped rows (coefficients to 1e-8), the gap a true certificate of early-stopped
runs, the gap-safe test with weighted column norms safe on 100 random weighted problems
(and the unweighted norms unsafe), the CV estimators against scikit-learn's LassoCV, the
command lines' --sample-weight file, mpirun, and the validation of the weights.
"""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp
import scipy.special
from sklearn.linear_model import Lasso as SkLasso
from sklearn.linear_model import LassoCV as SkLassoCV
from sklearn.linear_model import LogisticRegression
from sklearn.utils.estimator_checks import (check_sample_weight_equivalence_on_dense_data,
                                            check_sample_weight_equivalence_on_sparse_data)

from asyncopt import (GroupLasso, Lasso, LassoCV, Problem, SparseLogisticRegression,
                      SparseLogisticRegressionCV, lam_max, lasso_path)
from asyncopt.kernels import native
from asyncopt.penalties import L1, GroupL1
from asyncopt.problem import rescaled_sample_weight
from asyncopt.screening import (BestDual, gap_safe_keep, gap_safe_radius,
                                screen_active_set)
from asyncopt.solvers import solve_ddss
from asyncopt.solvers.methods import solve_method

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
SPMD = os.path.join(os.path.dirname(__file__), "mpi", "weighted_spmd.py")
RATIOS = (0.5, 0.05, 0.005)          # alpha / lam_max (the weighted one)
METHODS = ("auto", "ddss", "working_set")
BACKENDS = ({}, {"backend": "threads", "n_jobs": 2, "kernel": "numba"},
            {"backend": "threads", "n_jobs": 2, "kernel": "native"})


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def data(seed, n=120, p=30, fmt="dense", loss="squared"):
    """(X, y, s): a sparse ground truth, y with an offset, and weights in [0, 3) of
    which a fifth are zero and a few large (up to 8)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    if fmt == "csr":
        X = X * (rng.random((n, p)) < 0.4)
    w = np.zeros(p)
    w[:6] = [2.0, -3.0, 1.5, -1.0, 0.7, -2.5]
    score = X @ w + 0.3 + 0.3 * rng.standard_normal(n)
    y = np.where(score > np.median(score), 1.0, -1.0) if loss == "logistic" else score
    s = rng.uniform(0.0, 3.0, n)
    s[rng.random(n) < 0.2] = 0.0
    s[rng.random(n) < 0.05] = 8.0
    return (sp.csr_matrix(X) if fmt == "csr" else X), y, s


def lasso_objective(X, y, s, alpha, coef, intercept):
    """scikit-learn's weighted Lasso objective: (1 / (2 sum s)) sum s r^2 + alpha |w|_1."""
    r = y - dense(X) @ coef - intercept
    return 0.5 * float(s @ (r * r)) / float(np.sum(s)) + alpha * float(np.abs(coef).sum())


def logistic_objective(X, y, s, alpha, coef, intercept):
    """(1 / sum s) sum s log(1 + exp(-y z)) + alpha |w|_1."""
    z = dense(X) @ np.ravel(coef) + float(np.ravel(intercept)[0])
    return float(s @ np.logaddexp(0.0, -y * z)) / float(np.sum(s)) + \
        alpha * float(np.abs(coef).sum())


def weighted_certificate(ref, X, y, loss, penalty, lam, fit_intercept, x, c):
    """(P, D, intercept) at x with the weights c (as given) from NumPy alone
    (docs/design.md §1): b the c-weighted optimum, rho = -c f'(X x + b),
    theta = rho / max(1, Omega^D(X^T rho) / (n lam)),
    D = -(1/n) sum_{c_i > 0} c_i f*(-theta_i / c_i)."""
    A = dense(X)
    n = A.shape[0]
    z0 = A @ x
    b = ref.optimal_intercept(loss, z0, y, c) if fit_intercept else 0.0
    rho = -c * ref.loss_derivatives(loss, z0 + b, y)
    scale = max(1.0, ref.omega_dual(penalty, A.T @ rho) / (n * lam))
    theta = rho / scale
    live = c > 0
    primal = float(c @ ref.loss_values(loss, z0 + b, y)) / n + lam * ref.omega(penalty, x)
    dual = -float(c[live] @ ref.loss_conjugates(loss, -theta[live] / c[live], y[live])) / n
    assert np.all(theta[~live] == 0.0)
    return primal, dual, b


# -- the estimators against scikit-learn -----------------------------------------------

@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("ratio", RATIOS)
def test_lasso_reaches_sklearns_weighted_objective(fmt, fit_intercept, ratio):
    """Lasso(alpha).fit(X, y, s) on every method, serial and on two threads (numba and
    native kernels): scikit-learn's Lasso objective with the same sample_weight to
    1e-6, the fitted objective_ P(coef_) itself (its own certificate's P) and
    lam_max the alpha at which scikit-learn's solution turns zero."""
    X, y, s = data(3, fmt=fmt)
    top = lam_max(X, y, fit_intercept=fit_intercept, sample_weight=s)
    zero = SkLasso(alpha=top * (1 + 1e-9), fit_intercept=fit_intercept).fit(
        dense(X), y, sample_weight=s)
    assert not np.any(zero.coef_)
    alpha = ratio * top
    sk = SkLasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-14,
                 max_iter=1_000_000).fit(dense(X), y, sample_weight=s)
    best = lasso_objective(X, y, s, alpha, sk.coef_, sk.intercept_)
    for method in METHODS:
        for backend in BACKENDS:
            if backend.get("kernel") == "native" and not native.available():
                continue
            model = Lasso(alpha, fit_intercept=fit_intercept, tol=1e-12,
                          max_epochs=5000, method=method, random_state=0,
                          **backend).fit(X, y, sample_weight=s)
            value = lasso_objective(X, y, s, alpha, model.coef_, model.intercept_)
            assert abs(value - best) <= 1e-6 * best, (method, backend, value, best)
            assert model.objective_ == pytest.approx(value, rel=1e-10)
            assert model.dual_gap_ <= 1e-12 * model.history_[0]["primal"] + 1e-15


def lbfgs_logistic(X, y, s, alpha, fit_intercept):
    """min over (u, v >= 0, b) of (1 / sum s) sum s log(1 + exp(-y (X (u - v) + b)))
    + alpha sum (u + v): the weighted L1 logistic model, smooth on the orthant, by
    scipy's L-BFGS-B: the objective."""
    A = dense(X)
    n, p = A.shape
    total = float(np.sum(s))

    def fun(v):
        w = v[:p] - v[p:2 * p]
        b = v[2 * p] if fit_intercept else 0.0
        z = A @ w + b
        value = float(s @ np.logaddexp(0.0, -y * z)) / total + alpha * np.sum(v[:2 * p])
        g = -s * y * scipy.special.expit(-y * z) / total
        grad_w = A.T @ g
        grad = np.concatenate([grad_w + alpha, -grad_w + alpha])
        return value, (np.append(grad, np.sum(g)) if fit_intercept else grad)

    bounds = [(0.0, None)] * (2 * p) + ([(None, None)] if fit_intercept else [])
    res = scipy.optimize.minimize(fun, np.zeros(2 * p + int(fit_intercept)), jac=True,
                                  method="L-BFGS-B", bounds=bounds,
                                  options={"maxiter": 100_000, "ftol": 1e-16,
                                           "gtol": 1e-13, "maxcor": 50})
    return float(res.fun)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_reaches_the_weighted_reference_objective(fmt, fit_intercept):
    """SparseLogisticRegression(alpha).fit(X, y, s) on every method, serial and on two
    threads, at two alphas: the objective of an independent L-BFGS-B on the split
    variables to 1e-6; without intercept also scikit-learn's
    LogisticRegression(l1, liblinear, C = 1 / (alpha sum s)) with the same
    sample_weight to 1e-6 (liblinear penalizes an intercept, so it is the reference
    only without one); with one, scikit-learn's saga (its intercept free), which is
    slow to converge here, bounds ours from above."""
    X, y, s = data(4, n=150, p=20, fmt=fmt, loss="logistic")
    top = lam_max(X, y, loss="logistic", fit_intercept=fit_intercept, sample_weight=s)
    for ratio in (0.3, 0.03):
        alpha = ratio * top
        best = lbfgs_logistic(X, y, s, alpha, fit_intercept)
        C = 1.0 / (alpha * np.sum(s))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if fit_intercept:
                sk = LogisticRegression(l1_ratio=1.0, solver="saga", C=C, tol=1e-8,
                                        max_iter=2000).fit(dense(X), y, sample_weight=s)
            else:
                sk = LogisticRegression(l1_ratio=1.0, solver="liblinear", C=C,
                                        fit_intercept=False, tol=1e-12,
                                        max_iter=100_000).fit(X, y, sample_weight=s)
        theirs = logistic_objective(X, y, s, alpha, sk.coef_,
                                    sk.intercept_ if fit_intercept else [0.0])
        if not fit_intercept:
            assert theirs == pytest.approx(best, rel=1e-6)
        for method in METHODS:
            for backend in BACKENDS[:2]:
                model = SparseLogisticRegression(
                    alpha, fit_intercept=fit_intercept, tol=1e-12, max_epochs=5000,
                    method=method, random_state=0, **backend).fit(X, y, sample_weight=s)
                value = logistic_objective(X, y, s, alpha, model.coef_, model.intercept_)
                assert abs(value - best) <= 1e-6 * best, (ratio, method, backend)
                assert value <= theirs + 1e-6 * best
                assert model.objective_ == pytest.approx(value, rel=1e-10)


@pytest.mark.parametrize("method", ["ddss", "working_set", "prox_asaga", "prox_asvrg",
                                    "pse_safe", "pse_strong"])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_every_method_and_the_group_penalty_take_the_weights(method, loss):
    """The baselines and the group penalty (L1 and groups of 3) reach the objective of
    the same weighted problem solved by DDSS to 1e-6 (every solver's row loop carries
    the weights: SAGA's memory, the dense epoch, PSE's coordinate descent)."""
    X, y, s = data(5, n=100, p=24, loss=loss)
    c = rescaled_sample_weight(s, 100)
    for penalty in (L1(24), GroupL1(24, 3)):
        if method == "working_set" and loss == "logistic" and penalty.kernels != "l1":
            continue
        base = Problem(X, y, loss, penalty, 1.0, True, sample_weight=c)
        problem = base.with_lam(0.1 * base.lam_max())
        best = solve_ddss(problem, tol=1e-13, max_epochs=20000, random_state=0).primal
        result = solve_method(problem, method, tol=1e-9, max_epochs=20000,
                              random_state=0)
        value = problem.objective(result.coef, result.intercept)
        assert abs(value - best) <= 1e-6 * abs(best), (method, penalty)


# -- repetition, dropping, the certificate ---------------------------------------------

@pytest.mark.parametrize("estimator", ["lasso", "group", "logistic", "positive"])
@pytest.mark.parametrize("method", METHODS)
def test_integer_weights_are_repeated_rows_and_zero_weights_dropped_rows(estimator,
                                                                         method):
    """Integer weights k_i (zeros among them) give the coefficients of the unweighted
    fit on the rows repeated k_i times, to 1e-8 (the zero-weight rows dropped), dense and
    CSR."""
    rng = np.random.default_rng(11)
    n, p = 60, 12
    X = rng.standard_normal((n, p))
    y = X[:, :3] @ [1.0, -2.0, 0.5] + 0.3 * rng.standard_normal(n) + 1.0
    labels = np.where(y > np.median(y), 1, 0)
    k = rng.integers(0, 4, n)
    make = {"lasso": lambda a: Lasso(a, tol=1e-13, max_epochs=5000, method=method),
            "group": lambda a: GroupLasso(a, groups=3, tol=1e-13, max_epochs=5000,
                                          method=method),
            "logistic": lambda a: SparseLogisticRegression(a, tol=1e-13, max_epochs=5000,
                                                           method=method),
            "positive": lambda a: Lasso(a, positive=True, tol=1e-13, max_epochs=5000,
                                        method=method)}[estimator]
    target = labels if estimator == "logistic" else y
    penalty = GroupL1(p, 3) if estimator == "group" else \
        L1(p, positive=estimator == "positive")
    alpha = 0.05 * lam_max(X, target, loss="logistic" if estimator == "logistic" else
                           "squared", penalty=penalty, sample_weight=k)
    for fmt in ("dense", "csr"):
        A = sp.csr_matrix(X) if fmt == "csr" else X
        weighted = make(alpha).fit(A, target, sample_weight=k)
        repeated = make(alpha).fit(np.repeat(X, k, axis=0), np.repeat(target, k))
        np.testing.assert_allclose(np.ravel(weighted.coef_), np.ravel(repeated.coef_),
                                   rtol=0, atol=1e-8)
        assert float(np.ravel(weighted.intercept_)[0]) == pytest.approx(
            float(np.ravel(repeated.intercept_)[0]), abs=1e-8)
        assert np.any(np.ravel(weighted.coef_))
    # zero weights, non-integer others: the rows dropped
    s = rng.uniform(0.5, 2.0, n) * (rng.random(n) < 0.7)
    kept = s > 0
    weighted = make(alpha).fit(X, target, sample_weight=s)
    dropped = make(alpha).fit(X[kept], target[kept], sample_weight=s[kept])
    np.testing.assert_allclose(np.ravel(weighted.coef_), np.ravel(dropped.coef_), rtol=0,
                               atol=1e-8)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_weighted_gap_is_a_true_certificate(loss, ref):
    """Early-stopped weighted fits (1 to 4 outer iterations, every method): the reported
    gap bounds P(coef_) - P* (P from NumPy, P* from a high-accuracy solve), and the
    certificate at the returned point recomputed independently in NumPy gives the same
    P and a D no higher than the solver's P - gap allows."""
    X, y, s = data(6, n=100, p=40, loss=loss)
    c = rescaled_sample_weight(s, 100)
    base = Problem(X, y, loss, None, 1.0, True, sample_weight=c)
    problem = base.with_lam(0.05 * base.lam_max())
    star = solve_ddss(problem, tol=1e-14, max_epochs=20000, random_state=0).primal
    objective = lasso_objective if loss == "squared" else logistic_objective
    estimator = Lasso if loss == "squared" else SparseLogisticRegression
    checked = 0
    for method in ("ddss", "working_set", "prox_asvrg", "auto"):
        for epochs in (1, 2, 3, 4):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = estimator(problem.lam, tol=1e-14, max_epochs=epochs, method=method,
                                  random_state=0).fit(X, y, sample_weight=s)
            coef, b = np.ravel(model.coef_), float(np.ravel(model.intercept_)[0])
            value = objective(X, y, s, problem.lam, coef, b)
            assert value - star <= model.dual_gap_ * (1 + 1e-9) + 1e-14, (method, epochs)
            primal, dual, _ = weighted_certificate(ref, X, y, loss, problem.penalty,
                                                   problem.lam, True, coef, c)
            assert primal - dual >= star - dual >= -1e-12     # weak duality, independently
            checked += model.dual_gap_ > 1e-9
    assert checked >= 8          # not vacuous: most runs stopped with a sizeable gap


def test_the_certificate_is_the_weighted_one(ref):
    """Problem.certificate with weights (zeros among them) at random points: the
    intercept, P and D of docs/design.md §1 recomputed in NumPy; the dual point is zero
    on the rows of weight zero."""
    for loss in ("squared", "logistic"):
        X, y, s = data(7, n=80, p=15, loss=loss)
        c = rescaled_sample_weight(s, 80)
        problem = Problem(X, y, loss, None, 0.01, True, sample_weight=c)
        rng = np.random.default_rng(1)
        for _ in range(3):
            x = rng.standard_normal(15) * (rng.random(15) < 0.5)
            cert = problem.certificate(x, 0.3)
            primal, dual, b = weighted_certificate(ref, X, y, loss, problem.penalty,
                                                   problem.lam, True, x, c)
            assert cert.intercept == pytest.approx(b, abs=1e-9)
            assert cert.primal == pytest.approx(primal, rel=1e-12)
            assert cert.dual == pytest.approx(dual, rel=1e-9, abs=1e-12)
            order = problem.full_active_set()
            assert np.all(cert.theta[order.sample_weight == 0] == 0.0)


# -- gap-safe screening with weights ---------------------------------------------------

SHAPES = [(60, 20), (40, 90), (80, 35), (30, 120), (50, 50)]
N_PER_CHUNK = 25        # 4 chunks (loss x penalty) -> 100 problems


def random_weighted_problem(make_data, seed, loss, kind):
    rng = np.random.default_rng(seed)
    n, p = SHAPES[seed % len(SHAPES)]
    fmt = ("dense", "csr", "csc")[(seed // len(SHAPES)) % 3]
    X, y = make_data.random_data(seed, n, p, loss, fmt=fmt, density=0.35,
                                 n_informative=int(rng.integers(2, 8)))
    s = rng.exponential(1.0, n) * (rng.random(n) < 0.8)
    heavy = rng.random(n) < 0.1
    s[heavy] = 30.0                                        # a few heavy rows
    if seed % 2:       # holding large entries: their weights matter in the norms
        X = sp.diags(np.where(heavy, 3.0, 1.0)) @ X if sp.issparse(X) else \
            X * np.where(heavy, 3.0, 1.0)[:, None]
        X = X.asformat(fmt) if sp.issparse(X) else X
    if not np.any(s > 0):
        s[0] = 1.0
    if kind == "l1":
        penalty = L1(p)
    else:
        penalty = GroupL1(p, make_data.random_groups(seed, p, int(rng.integers(2, 6))))
    base = Problem(X, y, loss, penalty, 1.0, bool(seed % 4 < 2),
                   sample_weight=rescaled_sample_weight(s, n))
    ratio = float(rng.uniform(0.05, 0.9))
    problem = base.with_lam(ratio * base.lam_max())
    return problem, X, y, f"seed={seed} loss={loss} kind={kind} {n}x{p} {fmt} {ratio:.3f}"


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("kind", ["l1", "group"])
def test_weighted_gap_safe_screening_is_safe(loss, kind, ref, make_data):
    """25 random weighted problems per (loss, penalty), weights with zeros and heavy
    rows: the gap-safe test (radius sqrt(2 n L_f G), weighted column norms
    sqrt(sum_i c_i a_ij^2)) at x = 0, after one and three epochs, at noisy versions of
    the reference (with the best dual point's sphere), and inside full DDSS runs never
    removes a block that is non-zero in a reference solution certified to 1e-12 P(0) by
    the independent weighted certificate."""
    chunk = {("squared", "l1"): 0, ("squared", "group"): 1,
             ("logistic", "l1"): 2, ("logistic", "group"): 3}[(loss, kind)]
    removed = {"zero": 0, "epochs": 0, "noisy": 0, "ddss": 0}
    zero_blocks = 0
    for k in range(N_PER_CHUNK):
        seed = 5000 + 1000 * chunk + k
        problem, X, y, desc = random_weighted_problem(make_data, seed, loss, kind)
        reference = solve_ddss(problem, screening=False, tol=1e-12, max_epochs=30000,
                               random_state=0)
        assert reference.converged, desc
        c = problem.sample_weight if problem.sample_weight is not None else \
            np.ones(problem.n_samples)
        primal, dual, _ = weighted_certificate(ref, X, y, loss, problem.penalty,
                                               problem.lam, problem.fit_intercept,
                                               reference.coef, c)
        p0 = problem.null_objective()
        assert primal - dual <= 2e-12 * p0, (desc, (primal - dual) / p0)
        ip, ids = problem.penalty.indptr, problem.penalty.ids
        norms = np.array([np.linalg.norm(reference.coef[ids[ip[g]:ip[g + 1]]])
                          for g in range(problem.penalty.n_blocks)])
        big = norms > 1e-6 * max(norms.max(), 1e-300)
        zero_blocks += int(np.sum(norms == 0))
        active = problem.full_active_set()

        def check(keep, where):
            wrong = np.flatnonzero(~keep & big[active.blocks])
            assert wrong.size == 0, f"UNSAFE at {where}: {wrong.tolist()} {desc}"
            return int(np.sum(~keep))

        removed["zero"] += check(screen_active_set(
            active, problem.certificate(np.zeros(problem.n_features))), "x = 0")
        for epochs in (1, 3):
            early = solve_ddss(problem, screening=False, tol=1e-30, max_epochs=epochs,
                               random_state=seed)
            removed["epochs"] += check(screen_active_set(
                active, problem.certificate(early.coef, early.intercept)), f"{epochs} ep")
        rng = np.random.default_rng(seed)
        best = BestDual()
        scale = np.abs(reference.coef).max()
        for sigma in (1e-7, 1e-4, 1e-2):
            x = reference.coef + sigma * scale * rng.standard_normal(problem.n_features)
            cert = problem.certificate(x, 0.0)
            removed["noisy"] += check(screen_active_set(active, cert), f"sigma {sigma}")
            check(screen_active_set(active, cert, best), f"sigma {sigma}, best point")
            best.offer_certificate(cert)
        run = solve_ddss(problem, screening=True, tol=1e-9, max_epochs=20000,
                         random_state=seed)
        assert run.converged, desc
        kept = np.zeros(problem.n_features, bool)
        kept[run.active_features] = True
        block_kept = np.zeros(problem.penalty.n_blocks, bool)
        block_kept[problem.penalty.feature_blocks()[kept]] = True
        assert not np.any(~block_kept & big), f"UNSAFE inside DDSS: {desc}"
        removed["ddss"] += int(np.sum(~block_kept))
    # not vacuous: the tests removed most of the blocks that are zero at the optimum
    assert removed["ddss"] >= 0.8 * zero_blocks, (removed, zero_blocks)
    assert removed["noisy"] >= zero_blocks and removed["zero"] > 0, (removed, zero_blocks)


def test_unweighted_column_norms_would_be_unsafe():
    """Why the gap-safe test reads the weighted column norms ||C^(1/2) a_j||: with the
    unweighted ||a_j|| in it (the same radius), problems whose heavy rows hold large
    entries lose features of the solution, where the weighted test keeps them all."""
    unsafe = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        for loss in ("squared", "logistic"):
            n, p = 80, 30
            X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.4)
            heavy = rng.random(n) < 0.1
            X[heavy] *= 3.0
            s = np.where(heavy, 30.0, rng.uniform(0.0, 1.0, n))
            y = X[:, :5] @ rng.standard_normal(5) + 0.1 * rng.standard_normal(n)
            if loss == "logistic":
                y = np.where(y > np.median(y), 1.0, -1.0)
            base = Problem(X, y, loss, None, 1.0, True,
                           sample_weight=rescaled_sample_weight(s, n))
            problem = base.with_lam(0.3 * base.lam_max())
            solution = solve_ddss(problem, screening=False, tol=1e-12, max_epochs=5000,
                                  random_state=0).coef
            active = problem.full_active_set()
            support = (np.abs(solution) > 1e-6 * np.abs(solution).max())[active.features]
            plain = np.sqrt((X ** 2).sum(axis=0))[active.features]
            for x in (np.zeros(p), solution * (1 + 0.3 * rng.standard_normal(p))):
                cert = problem.certificate(x)
                assert not np.any(support & ~screen_active_set(active, cert))
                radius = gap_safe_radius(n, problem.loss.lipschitz, cert.gap, cert.primal)
                wrong = gap_safe_keep(cert.block_correlation, cert.dual_scale, radius,
                                      plain, n, problem.lam, active.weights)
                unsafe += bool(np.any(support & ~wrong))
    assert unsafe >= 1


# -- paths and cross-validation --------------------------------------------------------

def test_lasso_cv_matches_sklearn_with_the_same_weights_folds_and_grid():
    """LassoCV.fit(X, y, s) and scikit-learn's LassoCV with the same weights, KFold(4)
    and grid: the same alpha_max (the weighted one), the same held-out MSE path (weighted
    by the test rows' weights) to 1e-5 and the same alpha_; the refit is the weighted
    Lasso at alpha_."""
    X, y, s = data(8, n=160, p=25)
    ours = LassoCV(alphas=12, cv=4, tol=1e-12, max_epochs=5000).fit(X, y, sample_weight=s)
    theirs = SkLassoCV(alphas=12, cv=4, tol=1e-12, max_iter=1_000_000).fit(
        X, y, sample_weight=s)
    np.testing.assert_allclose(ours.alphas_, theirs.alphas_, rtol=1e-10)
    np.testing.assert_allclose(ours.mse_path_, theirs.mse_path_, rtol=1e-5)
    assert ours.alpha_ == pytest.approx(theirs.alpha_, rel=1e-12)
    refit = Lasso(ours.alpha_, tol=1e-12).fit(X, y, sample_weight=s)
    np.testing.assert_allclose(ours.coef_, refit.coef_, atol=1e-8)


def test_logistic_cv_splits_the_weights_with_the_folds():
    """SparseLogisticRegressionCV.fit(X, y, s): integer weights are repeated rows also
    through the folds (scikit-learn's check with a group per fold, at tol=1e-12); a
    held-out score weighted by the test rows' weights (zero weights: rows ignored)."""
    for est in (SparseLogisticRegressionCV(alphas=5, cv=3, tol=1e-12, max_epochs=2000),
                LassoCV(alphas=5, cv=3, tol=1e-12, max_epochs=2000),
                Lasso(alpha=0.01, tol=1e-12, max_epochs=2000),
                SparseLogisticRegression(alpha=0.01, tol=1e-12, max_epochs=2000)):
        check_sample_weight_equivalence_on_dense_data(type(est).__name__, est)
        check_sample_weight_equivalence_on_sparse_data(type(est).__name__, est)
    X, y, s = data(9, n=150, p=12, loss="logistic")
    folds = [(np.arange(50, 150), np.arange(50)), (np.arange(100), np.arange(100, 150))]
    model = SparseLogisticRegressionCV(alphas=[0.05, 0.01], cv=folds, tol=1e-12,
                                       scoring="neg_log_loss").fit(X, y, sample_weight=s)
    for f, (train, test) in enumerate(folds):
        for a, alpha in enumerate(model.alphas_):
            fitted = SparseLogisticRegression(alpha, tol=1e-12).fit(
                X[train], y[train], sample_weight=s[train])
            p1 = fitted.predict_proba(X[test])[:, 1]
            t = (y[test] > 0).astype(float)
            loss = -np.average(t * np.log(p1) + (1 - t) * np.log(1 - p1), weights=s[test])
            assert model.scores_[a, f] == pytest.approx(-loss, rel=1e-8)


def test_lasso_path_takes_the_weights():
    """lasso_path(X, y, sample_weight=s): its default grid starts at the weighted
    lam_max (a zero solution there) and each solution is the weighted Lasso's."""
    X, y, s = data(10, n=90, p=20)
    alphas, coefs, _ = lasso_path(X, y, n_alphas=4, eps=0.01, tol=1e-12, sample_weight=s)
    assert alphas[0] == pytest.approx(lam_max(X, y, sample_weight=s), rel=1e-12)
    assert not np.any(coefs[:, 0])
    for k in (1, 3):
        model = Lasso(alphas[k], tol=1e-12).fit(X, y, sample_weight=s)
        np.testing.assert_allclose(coefs[:, k], model.coef_, atol=1e-8)


# -- validation ------------------------------------------------------------------------

@pytest.mark.parametrize("make", [Lasso, SparseLogisticRegression, GroupLasso, LassoCV,
                                  SparseLogisticRegressionCV])
@pytest.mark.parametrize("weights,message", [
    (np.ones(19), "sample_weight has 19 entries but X has 20 rows"),
    (np.ones((20, 2)), "1-dimensional"),
    (np.r_[np.ones(19), -1.0], "must be >= 0, got -1 at row 19"),
    (np.r_[np.ones(19), np.nan], "NaN or infinity"),
    (np.r_[np.ones(19), np.inf], "NaN or infinity"),
    (np.zeros(20), "zero for every row"),
    (np.array(["a"] * 20), "must hold numbers"),
])
def test_bad_sample_weight_is_a_clear_error(make, weights, message):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 4))
    y = np.r_[np.zeros(10), np.ones(10)]
    with pytest.raises(ValueError, match=message):
        make().fit(X, y, sample_weight=weights)


def test_equal_or_scalar_weights_are_the_unweighted_fit():
    """None, a number and equal weights: bit for bit the unweighted fit (the problem is
    built without weights, so none of the weights' work is done)."""
    X, y, _ = data(12, n=50, p=10)
    plain = Lasso(0.05, tol=1e-10, random_state=0).fit(X, y)
    for weights in (None, 3.0, np.full(50, 0.25)):
        model = Lasso(0.05, tol=1e-10, random_state=0).fit(X, y, sample_weight=weights)
        np.testing.assert_array_equal(model.coef_, plain.coef_)
        assert model.intercept_ == plain.intercept_
    assert rescaled_sample_weight(np.full(5, 2.0), 5) is None
    np.testing.assert_allclose(rescaled_sample_weight([1.0, 3.0], 2), [0.5, 1.5])


# -- the command lines -----------------------------------------------------------------

def write_libsvm(path, n=120, p=15, seed=0, logistic=False):
    """A small LIBSVM file (one-based indices); returns (X, y) as written."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.5)
    y = X[:, :3] @ [1.0, -2.0, 0.5] + 0.2 * rng.standard_normal(n) + 0.5
    if logistic:
        y = np.where(y > np.median(y), 1.0, -1.0)
    with open(path, "w") as f:            # every value written exactly (17 digits)
        for i in range(n):
            feats = " ".join(f"{j + 1}:{X[i, j]:.17g}" for j in np.flatnonzero(X[i]))
            f.write(f"{y[i]:.17g} {feats}".rstrip() + "\n")
    return X, y


def write_weights(path, s):
    path.write_text("".join(f"{v:.17g}\n" for v in s))


def cli(module, args, mpi_ranks=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore")
    prefix = [MPIRUN, "-n", str(mpi_ranks)] if mpi_ranks else []
    return subprocess.run(prefix + [sys.executable, "-m", module, *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module,logistic", [("asyncopt.cli.lasso", False),
                                             ("asyncopt.cli.logreg", True)])
def test_cli_sample_weight_file_is_the_estimators_fit(module, logistic, tmp_path):
    """asyncopt-lasso / -logreg --sample-weight FILE (one number per line, zeros among
    them): the coefficients of the estimator fitted with the same weights."""
    X, y = write_libsvm(tmp_path / "d.svm", logistic=logistic)
    s = np.random.default_rng(1).uniform(0.0, 3.0, X.shape[0])
    s[::7] = 0.0
    write_weights(tmp_path / "w.txt", s)
    alpha = 0.02
    proc = cli(module, [tmp_path / "d.svm", "--sample-weight", tmp_path / "w.txt",
                        "--alpha", alpha, "--tol", "1e-12", "--max-epochs", "3000",
                        "--backend", "serial", "--quiet", "--save-coef",
                        tmp_path / "c.npz"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sample weights" in proc.stdout and "w.txt" in proc.stdout
    estimator = SparseLogisticRegression if logistic else Lasso
    model = estimator(alpha, tol=1e-12, max_epochs=3000).fit(X, y, sample_weight=s)
    np.testing.assert_allclose(np.load(tmp_path / "c.npz")["coef"], np.ravel(model.coef_),
                               atol=1e-7)


@pytest.mark.parametrize("lines,message", [
    (["1", "2", "x"], "w.txt:3: bad weight 'x' (expected one number >= 0 per line)"),
    (["1", "", "2"], "w.txt:2: bad weight '' (expected one number >= 0 per line)"),
    (["1", "1 2", "3"], "w.txt:2: bad weight '1 2' (expected one number >= 0 per line)"),
    (["1", "-0.5", "2"], "w.txt:2: negative weight -0.5 (weights must be >= 0)"),
    (["nan", "1", "2"], "w.txt:1: weight nan is not finite"),
    (["1", "inf", "2"], "w.txt:2: weight inf is not finite"),
    (["1", "2"], "w.txt: 2 weights for the 3 rows of"),
    (["0", "0", "0"], "w.txt: every weight is zero: nothing to fit"),
])
def test_cli_bad_weight_is_one_line_naming_file_and_line(lines, message, tmp_path, capsys):
    from asyncopt.cli.lasso import main
    data = tmp_path / "d.svm"
    data.write_text("1 1:0.5\n2 2:1\n0.5 1:1 2:-1\n")
    (tmp_path / "w.txt").write_text("\n".join(lines) + "\n")
    status = main([str(data), "--sample-weight", str(tmp_path / "w.txt"), "--alpha", "0.1",
                   "--quiet"])
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and err.startswith("asyncopt-lasso: error: ")
    assert message in err and "Traceback" not in err
    missing = main([str(data), "--sample-weight", str(tmp_path / "none.txt"), "--quiet"])
    err = capsys.readouterr().err
    assert missing == 1 and err.count("\n") == 1 and "none.txt" in err


# -- mpirun ----------------------------------------------------------------------------

@pytest.mark.mpi
def test_weighted_fits_under_mpirun_reach_the_serial_objective(tmp_path):
    """mpirun -n 3 on tests/mpi/weighted_spmd.py: the weighted Lasso and L1 logistic
    model with backend="mpi" (ddss, working_set and auto; the shards hold their rows'
    weights) reach the serial weighted objective to 1e-6, and every rank holds the
    same coefficients."""
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, SPMD, str(out)], env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == 6
    for case in results:
        assert case["same"], case["name"]
        assert abs(case["objective"] - case["serial"]) <= 1e-6 * abs(case["serial"]), case


@pytest.mark.mpi
def test_cli_sample_weight_under_mpirun(tmp_path):
    """mpirun -n 3 asyncopt-lasso --sample-weight: the workers' byte ranges take their
    lines of the weights file (the coefficients of the serial run to 1e-6); a bad line
    is one error line for the whole job."""
    X, y = write_libsvm(tmp_path / "d.svm", n=200)
    s = np.random.default_rng(2).uniform(0.0, 3.0, 200)
    s[::9] = 0.0
    write_weights(tmp_path / "w.txt", s)
    common = [tmp_path / "d.svm", "--sample-weight", tmp_path / "w.txt", "--alpha", "0.02",
              "--tol", "1e-11", "--max-epochs", "3000", "--quiet"]
    proc = cli("asyncopt.cli.lasso", common + ["--save-coef", tmp_path / "m.npz"], 3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("asyncopt-lasso summary") == 1
    model = Lasso(0.02, tol=1e-12, max_epochs=3000).fit(X, y, sample_weight=s)
    np.testing.assert_allclose(np.load(tmp_path / "m.npz")["coef"], model.coef_,
                               atol=1e-6)
    bad = list(s)
    (tmp_path / "bad.txt").write_text("".join(f"{v}\n" for v in bad[:150]) + "-2\n" +
                                      "".join(f"{v}\n" for v in bad[151:]))
    proc = cli("asyncopt.cli.lasso", [tmp_path / "d.svm", "--sample-weight",
                                      tmp_path / "bad.txt", "--quiet"], 3)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"asyncopt-lasso: error: {tmp_path / 'bad.txt'}:151: negative weight "
                     "-2 (weights must be >= 0)"]
