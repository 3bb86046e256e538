"""The support Newton step (asyncopt/support_newton.py): its pieces against direct
computations, its path against the quadratic model, and what it does to DDSS on data with
nearly equal columns (a9a's degree-2 features), certified by the independent references
of conftest."""
import numpy as np
import pytest
import scipy.sparse as sp

from asyncopt.data.embedded import load_a9a
from asyncopt.penalties import L1, GroupL1
from asyncopt.problem import Problem
from asyncopt.solvers.ddss import solve_ddss
from asyncopt.support_newton import (DROP_MARGIN, MAX_SUPPORT, STALL_RATIO,
                                     SUPPORT_CHURN, TRIALS, StallWatch, settled_zeros,
                                     best_step, orthant_newton_target,
                                     support_hessian_sums, trial_loss_sums)


def _second_derivative(loss, z):
    if loss == "squared":
        return np.ones_like(z)
    e = np.exp(-np.abs(z))
    return e / (1.0 + e) ** 2


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("intercept", [True, False])
def test_support_hessian_sums_is_the_weighted_gram_of_the_support(loss, intercept, ref):
    rng = np.random.default_rng(3)
    X = sp.random(60, 25, density=0.3, random_state=3, format="csr")
    y = np.where(rng.random(60) < 0.5, -1.0, 1.0) if loss == "logistic" \
        else rng.standard_normal(60)
    z = rng.standard_normal(60)
    support = np.array([2, 5, 7, 11, 19, 24])
    position = np.full(25, -1, dtype=np.int64)
    position[support] = np.arange(support.shape[0])
    code = 0 if loss == "squared" else 1
    got = support_hessian_sums(X.indptr, X.indices, X.data, position, code, z, y,
                               support.shape[0], intercept)
    B = X[:, support].toarray()
    if intercept:
        B = np.column_stack([B, np.ones(60)])
    want = B.T @ (_second_derivative(loss, z)[:, None] * B)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_trial_loss_sums_are_the_losses_along_the_line(loss, ref):
    rng = np.random.default_rng(4)
    z, dz = rng.standard_normal(50), rng.standard_normal(50)
    y = np.where(rng.random(50) < 0.5, -1.0, 1.0) if loss == "logistic" \
        else rng.standard_normal(50)
    got = trial_loss_sums(0 if loss == "squared" else 1, z, dz, y, TRIALS)
    want = [np.sum(ref.loss_values(loss, z + t * dz, y)) for t in TRIALS]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert TRIALS[0] == 1.0 and TRIALS[-1] == 0.0


def _model(H, g, d):
    return g @ d + 0.5 * d @ H @ d


def test_orthant_newton_target_by_hand():
    # q = 2 d0 + |d|^2 / 2 from (1, 1): the Newton point (-1, 1) crosses zero at t = 1/2;
    # coordinate 0 stops at 0, and coordinate 1 is already at its minimum
    target, predicted, pieces = orthant_newton_target(np.eye(2), np.array([2.0, 0.0]),
                                                      np.array([1.0, 1.0]), 2)
    np.testing.assert_allclose(target, [0.0, 1.0], atol=1e-12)
    assert target[0] == 0.0
    assert predicted == pytest.approx(-1.5)
    # the same with the second entry free (an intercept): nothing stops it
    target, _, _ = orthant_newton_target(np.eye(2), np.array([0.5, 3.0]),
                                         np.array([1.0, 1.0]), 1)
    np.testing.assert_allclose(target, [0.5, -2.0], atol=1e-9)


def test_orthant_newton_target_descends_and_keeps_the_orthant():
    rng = np.random.default_rng(5)
    for trial in range(200):
        k = int(rng.integers(1, 12))
        M = rng.standard_normal((k + 3, k))
        if trial % 3 == 0:                # exactly equal columns: a singular H
            M[:, -1] = M[:, 0]
        H = M.T @ M
        g = rng.standard_normal(k)
        start = rng.standard_normal(k)
        n_penalized = k - 1 if trial % 2 else k
        target, predicted, _ = orthant_newton_target(H, g, start, n_penalized)
        change = target - start
        assert predicted == pytest.approx(_model(H, g, change), abs=1e-9)
        assert predicted <= 1e-12
        pen = slice(0, n_penalized)
        # a penalized coordinate keeps its sign or stops at exactly zero
        assert np.all((np.sign(target[pen]) == np.sign(start[pen])) | (target[pen] == 0.0))
        # where nothing stopped at zero and H is regular, the target is the Newton point
        if trial % 3 and np.all(target[pen] != 0.0):
            np.testing.assert_allclose(target, start - np.linalg.solve(H, g),
                                       rtol=1e-6, atol=1e-6)


def test_best_step_picks_the_lowest_exact_objective_and_never_a_rise():
    n, lam = 10, 0.5
    w = np.array([1.0, 2.0])
    start, target = np.array([1.0, -1.0]), np.array([0.0, -0.5])
    # penalties along the line: t = 1 gives lam * (0 + 2 * 0.5) = 0.5, x itself 1.5
    sums = np.array([30.0, 20.0, 22.0, 24.0, 26.0, 28.0, 29.0, 30.0])
    t, change = best_step(sums, n, lam, w, start, target)
    pen = [lam * w @ np.abs(start + s * (target - start)) for s in TRIALS]
    objective = sums / n + np.array(pen)
    assert t == TRIALS[np.argmin(objective[:-1])]
    assert change == pytest.approx(objective.min() - objective[-1])
    # when every trial is worse than x, no step
    t, change = best_step(np.array([90.0] * 7 + [1.0]), n, lam, w, start, target)
    assert t == 0.0 and change == 0.0


def test_stall_watch_tries_after_a_slow_epoch_on_a_settled_support():
    watch = StallWatch()
    assert not watch.should_try(0, 1.0, 10, None)          # no previous gap yet
    assert not watch.should_try(1, 0.1, 10, 0)             # a fast epoch
    assert not watch.should_try(2, 0.1 * STALL_RATIO * 1.01, 10, None)   # churn unknown
    assert not watch.should_try(3, 0.05 * 1.01, 1000, 1 + int(SUPPORT_CHURN * 1000))
    assert watch.should_try(4, 0.05, 1000, int(SUPPORT_CHURN * 1000))
    watch.tried(4, 0.05, 0.04)                             # it failed: wait 2 epochs
    assert not watch.should_try(5, 0.039, 10, 0)
    assert watch.should_try(6, 0.0389, 10, 0)
    watch.tried(6, 0.0389, 0.001)                          # it worked: no wait
    assert watch.should_try(7, 0.0009, 10, 0)
    assert not watch.should_try(8, 0.00089, MAX_SUPPORT + 1, 0)
    assert not watch.should_try(9, 0.00088, 0, 0)


def test_settled_zeros_are_the_non_zeros_far_below_the_threshold():
    corr = np.array([3.0, 0.4, 0.6, -2.0])
    weights = np.array([1.0, 1.0, 1.0, 2.0])
    # n lam w = [1, 1, 1, 2]: ratios [3, 0.4, 0.6, 1.0]
    drop = settled_zeros(corr, 2, 0.5, weights, intercept=True)
    np.testing.assert_array_equal(drop, [False, 0.4 < 1 - DROP_MARGIN,
                                         0.6 < 1 - DROP_MARGIN, False, False])


def test_orthant_newton_target_with_dropped_coordinates():
    # q = |d|^2 / 2 + g^T d, H = I: dropping coordinate 1 sets it to 0 and the others
    # go to their Newton values (no coupling)
    g = np.array([1.0, -0.5, 2.0])
    start = np.array([3.0, 1.0, 5.0])
    target, predicted, _ = orthant_newton_target(np.eye(3), g, start, 3,
                                                 np.array([False, True, False]))
    np.testing.assert_allclose(target, [2.0, 0.0, 3.0], atol=1e-9)
    assert predicted == pytest.approx(_model(np.eye(3), g, target - start))


def _a9a_degree_2(rows):
    X, y = load_a9a(degree=2)
    X, y = X[:rows], y[:rows]
    return X[:, np.flatnonzero(np.diff(X.tocsc().indptr))].tocsr(), y


@pytest.mark.parametrize("loss,fit_intercept", [("squared", True), ("logistic", False)])
def test_newton_step_ends_the_plateau_of_nearly_equal_columns(loss, fit_intercept, ref):
    """a9a degree 2 (3,000 rows): prox-SVRG epochs alone need more than 1,000 epochs to
    reach 1e-9 (the gap stays put while weight drifts between nearly equal columns); with
    the step DDSS needs at most 40, and the independent certificate at its solution
    confirms the gap."""
    X, y = _a9a_degree_2(3000)
    base = Problem(X, y, loss, L1(X.shape[1]), 1.0, fit_intercept)
    problem = base.with_lam(1e-2 * base.lam_max())
    plain = solve_ddss(problem, tol=1e-9, max_epochs=200, random_state=0,
                       support_newton=False)
    assert not plain.converged
    res = solve_ddss(problem, tol=1e-9, max_epochs=200, random_state=0)
    assert res.converged and res.n_iter <= 40
    assert any(h["newton_step"] > 0 for h in res.history)
    assert res.primal < plain.primal
    cert = ref.certificate(X, y, loss, problem.penalty, problem.lam, fit_intercept,
                           res.coef)
    p0 = problem.null_objective()
    assert cert.gap <= 1e-9 * p0
    assert abs(cert.primal - res.primal) <= 1e-12 * p0


def test_group_penalties_run_without_the_step():
    rng = np.random.default_rng(0)
    X = sp.random(200, 30, density=0.3, random_state=0, format="csr")
    y = X @ rng.standard_normal(30)
    base = Problem(X, y, "squared", GroupL1(30, 3), 1.0, True)
    res = solve_ddss(base.with_lam(0.1 * base.lam_max()), tol=1e-10, random_state=0,
                     max_epochs=2000)
    assert res.converged
    assert all(h["newton_step"] == 0.0 for h in res.history)
