"""The compiled path solves of L1 problems (``solvers.path``, ``kernels.ws_loop``):
scikit-learn's objectives along the path, true certificates, safe screening, and the
same solutions as the Driver's solves."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import ElasticNet as SkElasticNet
from sklearn.linear_model import LogisticRegression

from asyncopt import lasso_path
from asyncopt.problem import Problem, rescaled_sample_weight
from asyncopt.penalties import L1, GroupL1
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


@pytest.mark.parametrize("case", [dict(), dict(positive=True), dict(weights=True)])
def test_the_compiled_logistic_path_reaches_sklearns_objectives(case):
    """L1 logistic regression along a 5-alpha path (tol 1e-10): scikit-learn's
    LogisticRegression (saga, unpenalized intercept, tol 1e-12) objective to 1e-6
    relative at each alpha, and the returned model's certificate, computed by Problem,
    within tol."""
    X, y = correlated(n=40, p=60, seed=4)
    y = np.where(y > np.median(y), 1.0, -1.0)
    weights = np.random.default_rng(5).uniform(0.2, 3.0, X.shape[0]) \
        if case.get("weights") else None
    positive = case.get("positive", False)
    alphas, coefs, gaps, results = lasso_path(
        sp.csr_matrix(X), y, loss="logistic", n_alphas=5, eps=0.1, tol=1e-10,
        positive=positive, sample_weight=weights, max_epochs=1000, return_results=True)
    assert all(len(result.history) == 1 for result in results)     # the compiled route
    assert np.count_nonzero(coefs[:, -1]) > 3
    c = None if weights is None else weights * X.shape[0] / weights.sum()
    for k, alpha in enumerate(alphas[1:], start=1):
        problem = Problem(sp.csr_matrix(X), y, "logistic",
                          L1(X.shape[1], positive=positive), alpha, True, sample_weight=c)
        ours = problem.objective(coefs[:, k], results[k].intercept)
        if not positive:        # scikit-learn has no positive logistic model
            sk = LogisticRegression(l1_ratio=1.0, C=1.0 / (X.shape[0] * alpha),
                                    solver="saga", tol=1e-12, max_iter=500_000).fit(
                X, y, sample_weight=c)
            theirs = problem.objective(sk.coef_.ravel(), sk.intercept_[0])
            assert abs(ours - theirs) <= 1e-6 * theirs, (k, ours, theirs)
            assert ours - theirs <= gaps[k] + 1e-12 * theirs
        cert = problem.certificate(coefs[:, k], results[k].intercept)
        assert cert.gap <= 1e-10 * problem.null_objective() * (1 + 1e-3) + \
            1e-13 * cert.primal
        if positive:
            assert np.all(coefs[:, k] >= 0.0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_compiled_paths_screening_is_safe(seed, loss):
    """Every feature a solve's gap-safe test removed (outside ``active_features``) is 0
    in a solve at tol 1e-13 of the same alpha (the Driver's: one alpha), along a path
    at the CV's tol 1e-4."""
    X, y = correlated(n=40, p=200, seed=seed)
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    alphas, _, _, results = lasso_path(sp.csr_matrix(X), y, n_alphas=15, eps=1e-2,
                                       tol=1e-4, loss=loss, return_results=True)
    screened_any = False
    for alpha, result in zip(alphas, results):
        removed = np.setdiff1d(np.arange(X.shape[1]), result.active_features)
        screened_any |= removed.shape[0] > 0
        exact = lasso_path(sp.csr_matrix(X), y, alphas=[alpha], tol=1e-13, loss=loss,
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


def test_the_compiled_route_is_taken_for_serial_l1_paths_alone():
    X, y = correlated()
    squared = Problem(X, y, "squared")
    logistic = Problem(X, np.where(y > np.median(y), 1.0, -1.0), "logistic")
    group = Problem(X, y, "squared",
                    GroupL1(X.shape[1], np.split(np.arange(X.shape[1]), 30)))
    assert compiled_path_applies(squared, "auto", "serial", 0)
    assert compiled_path_applies(squared, "working_set", "serial", 0)
    assert compiled_path_applies(logistic, "auto", "serial", 0)
    tall = Problem(X[:, :30], np.where(y > np.median(y), 1.0, -1.0), "logistic")
    assert not compiled_path_applies(tall, "auto", "serial", 0)
    assert not compiled_path_applies(squared, "ddss", "serial", 0)
    assert not compiled_path_applies(squared, "auto", "threads", 0)
    assert not compiled_path_applies(squared, "auto", "serial", 1)
    assert not compiled_path_applies(group, "auto", "serial", 0)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_the_compiled_logistic_elastic_net_path_is_certified(fit_intercept):
    """L1 logistic with an L2 part (l1_ratio 0.5), with and without intercept: each
    alpha's objective that of the Driver's solve of that alpha alone (tol 1e-12) to
    1e-8, and its certificate, computed by Problem, within tol 1e-10."""
    X, y = correlated(n=40, p=60, seed=4)
    y = np.where(y > np.median(y), 1.0, -1.0)
    data = sp.csr_matrix(X)
    kwargs = dict(loss="logistic", l1_ratio=0.5, fit_intercept=fit_intercept,
                  return_results=True)
    alphas, coefs, _, results = lasso_path(data, y, n_alphas=6, eps=0.05, tol=1e-10,
                                           max_epochs=1000, **kwargs)
    assert all(len(result.history) == 1 for result in results)     # the compiled route
    for k, alpha in enumerate(alphas):
        problem = Problem(data, y, "logistic", L1(X.shape[1], l2=1.0), 0.5 * alpha,
                          fit_intercept)
        _, alone, _, alone_results = lasso_path(data, y, alphas=[alpha], tol=1e-12,
                                                max_epochs=5000, **kwargs)
        theirs = problem.objective(alone[:, 0], alone_results[0].intercept)
        ours = problem.objective(coefs[:, k], results[k].intercept)
        assert abs(ours - theirs) <= 1e-8 * theirs, (k, ours, theirs)
        cert = problem.certificate(coefs[:, k], results[k].intercept)
        assert cert.gap <= 1e-10 * problem.null_objective() * (1 + 1e-3)
