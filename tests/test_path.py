"""The compiled path of the L1 squared loss (``solvers.path``, ``kernels.lasso_loop``):
scikit-learn's objectives along the path, true certificates, safe screening, and the
same solutions as the Driver's solves."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import ElasticNet as SkElasticNet

from asyncopt import lasso_path
from asyncopt.problem import Problem, rescaled_sample_weight
from asyncopt.penalties import L1
from asyncopt.solvers.path import compiled_path_applies


def correlated(n=50, p=120, seed=0):
    """n << p, correlated columns, a sparse truth and an offset (the path's hard case:
    supports of about n features at its end)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 6)) @ rng.standard_normal((6, p)) + \
        0.5 * rng.standard_normal((n, p))
    X *= rng.random((n, p)) < 0.4
    coef = np.zeros(p)
    coef[rng.choice(p, 5, replace=False)] = 3 * rng.standard_normal(5)
    return X, X @ coef + 0.3 * rng.standard_normal(n) + 1.0


def problem_at(X, y, alpha, l1_ratio, positive, fit_intercept, weights):
    """The Problem the path solves at ``alpha`` (independent of the path's code)."""
    return Problem(sp.csr_matrix(X), y, "squared",
                   L1(X.shape[1], positive=positive, l2=(1 - l1_ratio) / l1_ratio),
                   alpha * l1_ratio, fit_intercept,
                   sample_weight=rescaled_sample_weight(weights, X.shape[0]))


CASES = [dict(), dict(positive=True), dict(l1_ratio=0.5), dict(weights=True),
         dict(fit_intercept=False), dict(dense=True)]


@pytest.mark.parametrize("case", CASES)
def test_the_compiled_path_reaches_sklearns_objectives_with_true_certificates(case):
    """At every alpha of a 10-alpha path (tol 1e-10): scikit-learn's ElasticNet objective
    (tol 1e-14) to 1e-6 relative, the reported gap an upper bound on P - P*, and the
    certificate of the returned (coef, intercept), computed by Problem, within tol."""
    X, y = correlated(seed=1)
    case = dict(case)
    weights = np.random.default_rng(2).uniform(0.2, 3.0, X.shape[0]) \
        if case.pop("weights", False) else None
    data = X if case.pop("dense", False) else sp.csr_matrix(X)
    l1_ratio = case.pop("l1_ratio", 1.0)
    positive = case.pop("positive", False)
    fit_intercept = case.pop("fit_intercept", True)
    alphas, coefs, gaps, results = lasso_path(
        data, y, n_alphas=10, eps=1e-2, tol=1e-10, l1_ratio=l1_ratio, positive=positive,
        fit_intercept=fit_intercept, sample_weight=weights, max_epochs=1000,
        return_results=True)
    assert all(len(result.history) == 1 for result in results)     # the compiled route
    assert np.count_nonzero(coefs[:, -1]) > 5
    for k, alpha in enumerate(alphas):
        problem = problem_at(X, y, alpha, l1_ratio, positive, fit_intercept, weights)
        sk = SkElasticNet(alpha=alpha, l1_ratio=l1_ratio, positive=positive,
                          fit_intercept=fit_intercept, tol=1e-14, max_iter=1_000_000).fit(
            X, y, sample_weight=weights)
        theirs = problem.objective(sk.coef_, sk.intercept_)
        ours = problem.objective(coefs[:, k], results[k].intercept)
        assert abs(ours - theirs) <= 1e-6 * theirs, (k, ours, theirs)
        assert ours - theirs <= gaps[k] + 1e-12 * theirs
        assert results[k].primal == pytest.approx(ours, rel=1e-10)
        cert = problem.certificate(coefs[:, k], results[k].intercept)
        assert cert.gap <= 1e-10 * problem.null_objective() * (1 + 1e-3) + \
            1e-13 * cert.primal


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_paths_screening_is_safe(seed):
    """Every feature a solve's gap-safe test removed (outside ``active_features``) is 0
    in a solve at tol 1e-13 of the same alpha, along a path at the CV's tol 1e-4."""
    X, y = correlated(n=40, p=200, seed=seed)
    alphas, _, _, results = lasso_path(sp.csr_matrix(X), y, n_alphas=15, eps=1e-2,
                                       tol=1e-4, return_results=True)
    screened_any = False
    for alpha, result in zip(alphas, results):
        removed = np.setdiff1d(np.arange(X.shape[1]), result.active_features)
        screened_any |= removed.shape[0] > 0
        exact = lasso_path(sp.csr_matrix(X), y, alphas=[alpha], tol=1e-13,
                           max_epochs=5000)[1][:, 0]
        assert np.all(exact[removed] == 0.0), alpha
    assert screened_any


def test_the_compiled_and_the_drivers_solves_agree_within_their_gaps():
    """The compiled path and the Driver's solves (method "ddss") of the same grid reach
    objectives within the sum of their certified gaps, G <= tol P(0) each."""
    X, y = correlated(seed=3)
    kwargs = dict(n_alphas=12, eps=1e-3, tol=1e-6, return_results=True, random_state=0)
    alphas, coefs, gaps, results = lasso_path(X, y, **kwargs)
    _, coefs_d, gaps_d, results_d = lasso_path(X, y, method="ddss", **kwargs)
    assert all(len(result.history) > 1 or result.n_iter == 0 for result in results_d)
    for k, alpha in enumerate(alphas):
        problem = problem_at(X, y, alpha, 1.0, False, True, None)
        ours = problem.objective(coefs[:, k], results[k].intercept)
        driver = problem.objective(coefs_d[:, k], results_d[k].intercept)
        assert abs(ours - driver) <= gaps[k] + gaps_d[k] + 1e-12 * driver
        assert gaps[k] <= 1e-6 * problem.null_objective()


def test_the_compiled_route_is_taken_for_the_serial_l1_squared_loss_alone():
    X, y = correlated()
    squared = Problem(X, y, "squared")
    logistic = Problem(X, np.where(y > np.median(y), 1.0, -1.0), "logistic")
    assert compiled_path_applies(squared, "auto", "serial", 0)
    assert compiled_path_applies(squared, "working_set", "serial", 0)
    assert not compiled_path_applies(squared, "ddss", "serial", 0)
    assert not compiled_path_applies(squared, "auto", "threads", 0)
    assert not compiled_path_applies(squared, "auto", "serial", 1)
    assert not compiled_path_applies(logistic, "auto", "serial", 0)
